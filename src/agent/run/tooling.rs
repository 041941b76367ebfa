//! Carrying out one model turn's tool calls through the client: reads run concurrently,
//! writes and commands one at a time in the model's order, and every call ends with a result
//! for the model (an unknown tool or bad arguments is an error result, never the end of the run).

use serde_json::Value;

use super::client::{Client, Exec};
use super::error::RunError;
use super::exec::ExecOutcome;
use super::model_calls::{cursor_call_id, ModelCalls};
use super::review;
use super::setup::Run;
use crate::agent::messages as msg;
use crate::agent::subagents::Child;
use crate::agent::tools::{self, Access, ToolContext, ToolOutcome, ToolPlan};
use crate::proto::agent::v1 as pb;
use crate::provider::{Message, ProviderExtra, ProviderRequest, UserPart};

/// A model's tool call: its id, tool name, arguments, and what the provider needs back with it.
pub(super) type Call = (String, String, Value, Option<ProviderExtra>);

/// One model turn's tool calls, carried out: it borrows the run, its client and its model calls
/// for the round.
pub(super) struct ToolRound<'a> {
    pub(super) run: &'a Run,
    pub(super) client: &'a mut Client,
    pub(super) model: &'a mut ModelCalls,
    /// The step whose calls these are.
    pub(super) step: u64,
}

impl ToolRound<'_> {
    /// Run every call of the model turn; outcomes come back in the calls' order.
    pub(super) async fn carry_out(
        &mut self,
        calls: &[Call],
        ctx: &mut ToolContext,
        todos: &mut Vec<pb::TodoItem>,
    ) -> Result<Vec<ToolOutcome>, RunError> {
        let mut outcomes: Vec<Option<ToolOutcome>> = vec![None; calls.len()];
        let mut planned: Vec<(usize, ToolPlan)> = Vec::new();
        for (i, (id, name, args, _)) in calls.iter().enumerate() {
            match self.plan(ctx, id, name, args).await? {
                Ok(plan) => planned.push((i, plan)),
                Err(outcome) => outcomes[i] = Some(outcome),
            }
        }
        // Consecutive reads form one concurrent batch; anything else runs alone, in order.
        let mut k = 0;
        while k < planned.len() {
            let end = if planned[k].1.access() == Access::Read {
                let limit = self.run.settings.max_parallel_subagents as usize;
                read_batch_end(&planned, k, limit)
            } else {
                k + 1
            };
            let batch: Vec<(usize, ToolPlan)> = planned[k..end].to_vec();
            for (i, outcome) in self.run_batch(calls, batch, ctx, todos).await? {
                outcomes[i] = Some(outcome);
            }
            k = end;
        }
        Ok(outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    tools::error_outcome(pb::ToolCall::default(), "the tool did not run".into())
                })
            })
            .collect())
    }

    /// Plan one call (Auto-review may refuse a web fetch first). A call that cannot run is
    /// shown as started and completed at once, and its error outcome comes back instead.
    async fn plan(
        &mut self,
        ctx: &ToolContext,
        id: &str,
        name: &str,
        args: &Value,
    ) -> Result<Result<ToolPlan, ToolOutcome>, RunError> {
        let call_id = cursor_call_id(self.step, id);
        let plan = match tools::plan(ctx, &call_id, name, args) {
            Ok(plan) if ctx.auto_review => match self.review_before(&plan, ctx).await? {
                None => Ok(plan),
                Some(refusal) => Err(refusal),
            },
            Ok(plan) => Ok(plan),
            Err(e) => Err(e.to_string()),
        };
        let e = match plan {
            Ok(plan) => return Ok(Ok(plan)),
            Err(e) => e,
        };
        let tc = tools::placeholder(ctx, &call_id, name).unwrap_or_else(|| pb::ToolCall {
            tool_call_id: Some(call_id.clone()),
            ..Default::default()
        });
        let outcome = tools::error_outcome(tc, e);
        let out = &self.client.out;
        out.send(msg::tool_call_started(
            call_id.clone(),
            id.to_string(),
            outcome.tool_call.clone(),
        ))
        .await?;
        out.send(msg::tool_call_completed(
            call_id,
            id.to_string(),
            outcome.tool_call.clone(),
        ))
        .await?;
        Ok(Err(outcome))
    }

    /// Run one batch: every call shown as started, every exec sent, all waited for together,
    /// then each call finished in order.
    async fn run_batch(
        &mut self,
        calls: &[Call],
        batch: Vec<(usize, ToolPlan)>,
        ctx: &mut ToolContext,
        todos: &mut Vec<pb::TodoItem>,
    ) -> Result<Vec<(usize, ToolOutcome)>, RunError> {
        let step = self.step;
        let ids = |i: usize| (cursor_call_id(step, &calls[i].0), calls[i].0.clone());
        for (i, plan) in &batch {
            let (call_id, model_id) = ids(*i);
            self.client
                .out
                .send(msg::tool_call_started(
                    call_id,
                    model_id,
                    plan.tool_call().clone(),
                ))
                .await?;
        }
        // Send every exec of the batch, then wait for all of them together.
        let (mut execs, spans) = batch_execs(&batch, |i| ids(i).0);
        if ctx.auto_review {
            self.review_execs(&mut execs, ctx).await?;
        }
        let children = self.register_subagents(&execs, ctx);
        let mut results = if execs.is_empty() {
            Vec::new()
        } else {
            self.client.run_execs(execs, "a tool call").await?
        };
        for call in children {
            self.run.subagents.forget(&call);
        }
        let mut out = Vec::with_capacity(batch.len());
        for ((i, plan), span) in batch.into_iter().zip(spans) {
            let ran = results.get_mut(span).unwrap_or_default();
            let outcome = self.finish(&plan, ran, ctx, todos).await?;
            let (call_id, model_id) = ids(i);
            self.client
                .out
                .send(msg::tool_call_completed(
                    call_id,
                    model_id,
                    outcome.tool_call.clone(),
                ))
                .await?;
            out.push((i, outcome));
        }
        Ok(out)
    }

    /// One call's outcome: from its execs' results (`ran`), or by running what is left of it.
    async fn finish(
        &mut self,
        plan: &ToolPlan,
        ran: &mut [ExecOutcome],
        ctx: &mut ToolContext,
        todos: &mut Vec<pb::TodoItem>,
    ) -> Result<ToolOutcome, RunError> {
        Ok(match plan {
            ToolPlan::Exec { .. } | ToolPlan::ExecEach { .. } => {
                let mut all = Vec::new();
                let mut thrown = None;
                let mut hooks = Vec::new();
                for o in ran {
                    all.append(&mut o.results);
                    thrown = thrown.or(o.thrown.take());
                    hooks.append(&mut o.hooks);
                }
                // What a hook added after the tool reaches the model as a note at its
                // next call (and is recorded with the turn, so replays read the same).
                let note = crate::agent::prompt::hook_contexts(&hooks);
                if !note.is_empty() {
                    self.client
                        .steering
                        .note(Message::user_text(note.trim_start()));
                }
                tools::finish_exec(ctx, plan, &all, thrown.as_deref())
            }
            ToolPlan::Edit { .. } => self.run_edit(plan).await?,
            ToolPlan::Todos { .. } => {
                let now = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
                let (list, outcome) = tools::apply_todos(plan, todos, now);
                *todos = list;
                outcome
            }
            ToolPlan::Interaction { query, .. } => {
                self.run_interaction(plan, query.clone(), ctx).await?
            }
        })
    }

    /// Auto-review: each shell and MCP call of the batch gets its decision (see `review`).
    async fn review_execs(
        &mut self,
        execs: &mut [Exec],
        ctx: &ToolContext,
    ) -> Result<(), RunError> {
        for (n, (exec, _)) in execs.iter_mut().enumerate() {
            let decision = match review::plan(exec, ctx.sandboxed, &ctx.command_denylist) {
                review::Plan::Leave => continue,
                review::Plan::Ask(reason) => review::Approval::Ask(reason),
                // The user's and project's allow lists win over the model's verdict.
                review::Plan::Judge(description) => {
                    if self.allowlisted(exec).await? {
                        review::Approval::Allow
                    } else {
                        self.verdict(&description).await?
                    }
                }
            };
            let request_id = format!("{}-review-{}-{n}", self.run.request_id, self.step);
            review::apply(exec, decision, &request_id);
        }
        Ok(())
    }

    /// Auto-review of what cannot carry an approval card: a web fetch (see
    /// [`Self::review_fetch`]) and text typed into a background shell, which runs only on a
    /// clear "allow" (the model is told why not, and that a shell command would ask the user).
    /// Returns why the call does not run.
    async fn review_before(
        &mut self,
        plan: &ToolPlan,
        ctx: &ToolContext,
    ) -> Result<Option<String>, RunError> {
        let ToolPlan::Exec { exec, .. } = plan else {
            return Ok(None);
        };
        match exec {
            pb::exec_server_message::Message::FetchArgs(_) => self.review_fetch(plan).await,
            pb::exec_server_message::Message::WriteShellStdinArgs(_) => {
                let decision = match review::plan(exec, ctx.sandboxed, &ctx.command_denylist) {
                    review::Plan::Leave => review::Approval::Allow,
                    review::Plan::Ask(reason) => review::Approval::Ask(reason),
                    review::Plan::Judge(action) => self.verdict(&action).await?,
                };
                Ok(match decision {
                    review::Approval::Allow => None,
                    review::Approval::Ask(reason) => Some(review::stdin_refusal(&reason)),
                })
            }
            _ => Ok(None),
        }
    }

    /// Auto-review of a web fetch, before it runs: the client is asked with
    /// `web_fetch_request_query`, approved at once when the URL is on the user's allow list or
    /// the model judges it safe, else on the client's card with the verdict's reason. Returns
    /// why not to fetch, when the user did not approve.
    async fn review_fetch(&mut self, plan: &ToolPlan) -> Result<Option<String>, RunError> {
        let ToolPlan::Exec {
            exec: pb::exec_server_message::Message::FetchArgs(f),
            ..
        } = plan
        else {
            return Ok(None);
        };
        let exec = pb::exec_server_message::Message::FetchArgs(f.clone());
        let decision = if self.allowlisted(&exec).await? {
            review::Approval::Allow
        } else {
            match review::describe_fetch(f) {
                Some(action) => self.verdict(&action).await?,
                None => review::Approval::Ask("Auto-review cannot judge a URL this long".into()),
            }
        };
        let request_id = format!(
            "{}-review-{}-{}",
            self.run.request_id, self.step, f.tool_call_id
        );
        let response = self
            .client
            .ask(review::fetch_query(f, decision, &request_id))
            .await?;
        Ok(review::fetch_refusal(&response))
    }

    /// Whether the client says `exec` is on the user's or project's allow lists (see
    /// [`review::precheck`]). A client that does not answer within
    /// [`review::PRECHECK_TIMEOUT`] says no; the run goes on.
    async fn allowlisted(
        &mut self,
        exec: &pb::exec_server_message::Message,
    ) -> Result<bool, RunError> {
        let Some(args) = review::precheck(exec) else {
            return Ok(false);
        };
        let answered = self
            .client
            .run_exec_within(args, review::PRECHECK_TIMEOUT, "an allowlist precheck")
            .await?;
        let Some(outcome) = answered else {
            tracing::info!("the client did not answer the allowlist precheck in time");
            return Ok(false);
        };
        Ok(review::allowlisted(&outcome.results))
    }

    /// The run's model judges one call, within [`review::VERDICT_TIMEOUT`]; anything but a
    /// clear verdict asks the user. Its tokens count in the run's usage.
    async fn verdict(&mut self, description: &str) -> Result<review::Approval, RunError> {
        let cfg = &self.run.model.config;
        let (system, user) = review::prompt(description);
        let request = ProviderRequest {
            model: cfg.model.clone(),
            system,
            messages: vec![Message::User {
                parts: vec![UserPart::Text { text: user }],
            }],
            tools: Vec::new(),
            options: review::verdict_options(cfg),
        };
        let ask = |why: &str| review::Approval::Ask(format!("Auto-review {why}; please decide"));
        let judged = self.model.complete(self.run, request);
        Ok(
            match tokio::time::timeout(review::VERDICT_TIMEOUT, judged).await {
                Err(_) => ask("did not answer in time"),
                Ok(Err(RunError::Canceled)) => return Err(RunError::Canceled),
                Ok(Err(e)) => {
                    tracing::warn!("the Auto-review verdict failed: {e}");
                    ask("could not reach the model")
                }
                Ok(Ok(text)) => {
                    review::parse(&text).unwrap_or_else(|| ask("gave no clear verdict"))
                }
            },
        )
    }

    /// Announce the batch's subagent calls, so their child runs are recognised when the
    /// client starts them. Returns their call ids.
    fn register_subagents(&self, execs: &[Exec], ctx: &ToolContext) -> Vec<String> {
        let depth = self.run.child.as_ref().map_or(0, |c| c.depth);
        execs
            .iter()
            .filter_map(|(e, _)| match e {
                pb::exec_server_message::Message::SubagentArgs(a) => {
                    let mut child = Child::for_call(a, &ctx.subagents.custom, depth);
                    child.parent_run = self.run.request_id.clone();
                    self.run.subagents.register(a, child);
                    Some(a.tool_call_id.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// Search-and-replace: read through the client, apply, write the whole text back.
    async fn run_edit(&mut self, plan: &ToolPlan) -> Result<ToolOutcome, RunError> {
        let Some(read) = plan.read_exec() else {
            return Ok(tools::error_outcome(
                plan.tool_call().clone(),
                "internal error: not an edit".into(),
            ));
        };
        let read = self
            .client
            .run_exec(read, None, "reading a file to edit")
            .await?;
        let write = match tools::apply_edit(plan, &read.results, read.thrown.as_deref()) {
            Ok(w) => w,
            Err(outcome) => return Ok(outcome),
        };
        let done = self
            .client
            .run_exec(write.exec.clone(), None, "writing an edited file")
            .await?;
        Ok(tools::finish_edit(
            plan,
            &write,
            &done.results,
            done.thrown.as_deref(),
        ))
    }

    /// Ask the user (question, mode switch, plan) and wait for the answer.
    async fn run_interaction(
        &mut self,
        plan: &ToolPlan,
        query: pb::interaction_query::Query,
        ctx: &mut ToolContext,
    ) -> Result<ToolOutcome, RunError> {
        let response = self.client.ask(query).await?;
        if let Some(mode) = tools::approved_mode(plan, &response) {
            ctx.mode = mode;
        }
        Ok(tools::finish_interaction(ctx, plan, &response))
    }
}

/// The execs of a batch, each shell's output streaming to its call (`call_id`), and which of
/// them each call of the batch sent.
fn batch_execs(
    batch: &[(usize, ToolPlan)],
    call_id: impl Fn(usize) -> String,
) -> (Vec<Exec>, Vec<std::ops::Range<usize>>) {
    let mut execs = Vec::new();
    let mut spans = Vec::new();
    for (i, plan) in batch {
        let start = execs.len();
        let stream_to = is_shell(plan).then(|| call_id(*i));
        match plan {
            ToolPlan::Exec { exec, .. } => execs.push((exec.clone(), stream_to)),
            ToolPlan::ExecEach { execs: each, .. } => {
                execs.extend(each.iter().cloned().map(|e| (e, None)));
            }
            _ => {}
        }
        spans.push(start..execs.len());
    }
    (execs, spans)
}

/// Where the concurrent batch of reads starting at `k` ends: at the first call that is not a
/// read, or before the subagent call past `limit`.
fn read_batch_end(planned: &[(usize, ToolPlan)], k: usize, limit: usize) -> usize {
    let mut subagents = 0;
    for (n, (_, p)) in planned.iter().enumerate().skip(k) {
        if p.access() != Access::Read {
            return n;
        }
        if is_subagent(p) {
            subagents += 1;
            if subagents > limit.max(1) {
                return n;
            }
        }
    }
    planned.len()
}

fn is_subagent(plan: &ToolPlan) -> bool {
    matches!(
        plan,
        ToolPlan::Exec {
            exec: pb::exec_server_message::Message::SubagentArgs(_),
            ..
        }
    )
}

fn is_shell(plan: &ToolPlan) -> bool {
    matches!(
        plan,
        ToolPlan::Exec {
            exec: pb::exec_server_message::Message::ShellStreamArgs(_),
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::exec_server_message::Message as ExecArgs;

    fn exec(args: ExecArgs, access: Access) -> ToolPlan {
        ToolPlan::Exec {
            exec: args,
            tool_call: pb::ToolCall::default(),
            access,
        }
    }

    fn read() -> ToolPlan {
        exec(ExecArgs::ReadArgs(pb::ReadArgs::default()), Access::Read)
    }

    fn subagent() -> ToolPlan {
        exec(
            ExecArgs::SubagentArgs(pb::SubagentArgs::default()),
            Access::Read,
        )
    }

    fn shell() -> ToolPlan {
        exec(
            ExecArgs::ShellStreamArgs(pb::ShellArgs::default()),
            Access::Exclusive,
        )
    }

    fn planned(plans: Vec<ToolPlan>) -> Vec<(usize, ToolPlan)> {
        plans.into_iter().enumerate().collect()
    }

    #[test]
    fn reads_batch_until_a_write_or_the_subagent_limit() {
        let p = planned(vec![read(), read(), shell(), read()]);
        assert_eq!(read_batch_end(&p, 0, 4), 2, "the shell runs alone");
        assert_eq!(read_batch_end(&p, 3, 4), 4);

        let p = planned(vec![subagent(), read(), subagent(), subagent()]);
        assert_eq!(read_batch_end(&p, 0, 2), 3, "the third subagent waits");
        assert_eq!(read_batch_end(&p, 0, 0), 2, "a limit of 0 still runs one");
        assert_eq!(read_batch_end(&p, 0, 8), 4);
    }

    #[test]
    fn a_batch_names_each_calls_execs_and_streams_shell_output_to_its_call() {
        let each = ToolPlan::ExecEach {
            execs: vec![
                ExecArgs::ReadArgs(pb::ReadArgs::default()),
                ExecArgs::ReadArgs(pb::ReadArgs::default()),
            ],
            tool_call: pb::ToolCall::default(),
        };
        let todos = ToolPlan::Todos {
            merge: false,
            items: Vec::new(),
            tool_call: pb::ToolCall::default(),
        };
        let batch = vec![(0, read()), (1, each), (2, todos), (5, shell())];
        let (execs, spans) = batch_execs(&batch, |i| format!("call-{i}"));
        assert_eq!(spans, [0..1, 1..3, 3..3, 3..4]);
        assert_eq!(execs.len(), 4);
        let streams: Vec<_> = execs.iter().map(|(_, to)| to.clone()).collect();
        assert_eq!(streams, [None, None, None, Some("call-5".to_string())]);
    }
}
