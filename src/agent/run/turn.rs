//! One user turn: rebuild the history from the checkpoint, call the model in rounds with
//! Cursor's tools, then write the turn back as blobs and a new checkpoint. [`RunState`] composes
//! the run's parts (its client, its model calls) and carries out what the first request asks
//! for: a model turn, a summary, or a command the user ran.

use tracing::{debug, warn};

use super::action::{self, Begin, TurnInput};
use super::client::Client;
use super::error::RunError;
use super::model_calls::{provider_error, request_options, ModelCalls};
use super::pending::{self, CancelResolutions};
use super::repeats::{RepeatCheck, RepeatDetector};
use super::setup::{Run, RunSummary};
use super::steer;
use super::tooling::{Call, ToolRound};
use crate::agent::messages as msg;
use crate::agent::state::{
    self, HistoryBuilder, HistoryOptions, RebuiltHistory, StepRecord, TurnRecord,
};
use crate::agent::{context, prompt, tools, transcript};
use crate::proto::agent::v1 as pb;
use crate::provider::{AssistantPart, Message, ProviderRequest};

/// What ends an answer the user canceled while it streamed, in the stored turn.
pub const INTERRUPTED_ANSWER: &str = "(Interrupted by the user before this answer was finished.)";

/// The transcript handed to the model for a summary is cut to this many characters.
const SUMMARY_MAX_CHARS: usize = 400_000;

/// Where relative paths resolve: the first workspace, else the client's working directory.
fn workspace_root(ctx: Option<&pb::RequestContext>) -> Option<String> {
    let env = ctx?.env.as_ref()?;
    env.workspace_paths
        .first()
        .cloned()
        .or_else(|| env.process_working_directory.clone())
        .filter(|p| !p.is_empty())
}

/// Where Cursor keeps its agent transcripts, when it said.
fn transcripts_folder(ctx: Option<&pb::RequestContext>) -> Option<String> {
    Some(ctx?.env.as_ref()?.agent_transcripts_folder.clone()).filter(|f| !f.is_empty())
}

/// The transcripts of the past chats the user attached, as far as they are on this machine.
async fn read_past_chats(
    home: &std::path::Path,
    folder: &str,
    user: &pb::UserMessage,
    blobs: &mut context::Blobs,
) {
    let chats = user
        .selected_context
        .as_ref()
        .map_or(&[][..], |s| s.past_chats.as_slice());
    // A few chats at most: each is capped, and the message has its own budget besides.
    for chat in chats.iter().take(4) {
        if let Some(text) = transcript::read(home, folder, &chat.agent_id).await {
            blobs.insert_past_chat(chat.agent_id.clone(), text);
        }
    }
}

/// Where the client writes background shells' output.
fn terminals_folder(ctx: Option<&pb::RequestContext>) -> Option<String> {
    Some(ctx?.env.as_ref()?.terminals_folder.clone()).filter(|f| !f.is_empty())
}

/// One run while it executes: the prepared run, its exchanges with the client and its model
/// calls, composed by the turn.
pub(super) struct RunState {
    run: Run,
    client: Client,
    model: ModelCalls,
    /// What the client said about pending tool calls when it canceled.
    cancel_resolutions: CancelResolutions,
}

/// A turn in progress: what the model reads next, and what the turn records.
struct TurnWork {
    user: pb::UserMessage,
    messages: Vec<Message>,
    steps: Vec<StepRecord>,
    todos: Vec<pb::TodoItem>,
    tool_ctx: tools::ToolContext,
}

/// What a turn stores: its record, the todos and mode it leaves, and what the checkpoint
/// registers besides.
struct TurnDone {
    user: pb::UserMessage,
    steps: Vec<StepRecord>,
    todos: Vec<pb::TodoItem>,
    mode: i32,
    /// A Build's plan (id, path).
    plan: Option<(String, String)>,
    /// The summary of the older turns, and the last turn it covers.
    summary: Option<(String, state::BlobId)>,
}

impl TurnWork {
    fn done(
        self,
        plan: Option<(String, String)>,
        summary: Option<(String, state::BlobId)>,
    ) -> TurnDone {
        TurnDone {
            user: self.user,
            steps: self.steps,
            todos: self.todos,
            mode: self.tool_ctx.mode,
            plan,
            summary,
        }
    }

    /// The round's results go to the model and into the record; the repeat detector watches
    /// them. Returns why to stop, when the model is stuck.
    fn record_results(
        &mut self,
        calls: Vec<Call>,
        results: Vec<tools::ToolOutcome>,
        repeats: &mut RepeatDetector,
    ) -> Option<String> {
        let mut stuck = None;
        for ((id, name, arguments, extra), mut outcome) in calls.into_iter().zip(results) {
            match repeats.observe(
                &name,
                &arguments.to_string(),
                &outcome.content,
                outcome.is_error,
            ) {
                RepeatCheck::Go => {}
                RepeatCheck::Warn(note) => outcome.content.push_str(&note),
                RepeatCheck::Stop(why) => stuck = stuck.or(Some(why)),
            }
            self.messages.push(Message::ToolResult {
                call_id: id.clone(),
                name: name.clone(),
                content: outcome.content.clone(),
                is_error: outcome.is_error,
            });
            self.steps.push(StepRecord::ToolCall {
                tool_call: outcome.tool_call,
                call_id: id,
                name,
                arguments,
                result: outcome.content,
                is_error: outcome.is_error,
                extra,
            });
        }
        stuck
    }
}

/// What the system prompt of each model call of a turn is built from.
struct PromptSource<'a> {
    req: &'a pb::AgentRunRequest,
    ctx: Option<&'a pb::RequestContext>,
    /// Subagents an earlier turn left in the background: the model may wait for them.
    background: &'a [(String, String)],
    globbed: Option<&'a context::rules::GlobbedRules<'a>>,
}

/// How a turn's model rounds ended.
enum Rounds {
    /// The model answered without tool calls, or the turn was stopped (stuck, round limit).
    Done,
    /// The user canceled; the turn's steps hold what it did, cut off.
    Canceled,
}

impl RunState {
    pub(super) fn new(
        run: Run,
        client: Client,
        model: ModelCalls,
        cancel_resolutions: CancelResolutions,
    ) -> RunState {
        RunState {
            run,
            client,
            model,
            cancel_resolutions,
        }
    }

    pub(super) async fn execute(
        mut self,
        req: Box<pb::AgentRunRequest>,
    ) -> Result<RunSummary, RunError> {
        let result = self.begin(req).await;
        if result.is_err() {
            self.client.cancel_injections().await;
            self.client.abort_open_execs().await;
        }
        result?;
        Ok(self.model.summary())
    }

    /// Carry out what the run request's action asks for.
    async fn begin(&mut self, req: Box<pb::AgentRunRequest>) -> Result<(), RunError> {
        match action::begin(&req)? {
            Begin::Turn(input) => {
                if let Some(pb::conversation_action::Action::BackgroundTaskCompletionAction(a)) =
                    req.action.as_ref().and_then(|a| a.action.as_ref())
                {
                    self.client.background.remember(a);
                }
                self.turn(req, *input).await
            }
            Begin::Summarize => {
                self.client.steering.defer_to_next_turn();
                self.summarize_now(&req).await
            }
            Begin::Shell { command, exec_id } => {
                self.client.steering.defer_to_next_turn();
                self.shell_command(&req, command, exec_id).await
            }
            Begin::CancelSubagent { id } => {
                self.client.steering.defer_to_next_turn();
                self.client.cancel_subagent(&id);
                self.turn_ended().await
            }
            Begin::BackgroundSubagent { call } => {
                self.client.steering.defer_to_next_turn();
                debug!(
                    call,
                    "no subagent call runs in the foreground of this run: nothing to move"
                );
                self.turn_ended().await
            }
        }
    }

    async fn turn_ended(&mut self) -> Result<(), RunError> {
        self.client
            .out
            .send(msg::turn_ended(&self.model.usage))
            .await
    }

    /// A model turn: the conversation rebuilt, model calls in rounds with Cursor's tools, then
    /// the turn stored and a new checkpoint sent.
    async fn turn(
        &mut self,
        req: Box<pb::AgentRunRequest>,
        mut input: TurnInput,
    ) -> Result<(), RunError> {
        // Steering from now on joins this turn's first (or next) model call.
        self.client.steering.open_turn();
        let (request_context, blobs) = self.turn_context(&req, &mut input).await?;
        let prev_state = req.conversation_state.clone().unwrap_or_default();
        let prev_wire = wire_at(&self.run.first_wire, &[CONVERSATION_STATE]);
        let mut history = self.rebuild_history(&prev_state).await?;
        let todos = self.opening_todos(&mut input, &history).await?;
        let mode = Some(input.user.mode)
            .filter(|m| *m != 0)
            .or(prev_state.mode)
            .unwrap_or(0);
        let tool_ctx = self.tool_context(&req, request_context.as_ref(), &input, mode);
        let images = self.run.model.config.supports_images;
        let mut messages = opening_messages(&mut history, &input, images, &blobs);
        let known_todos: Vec<(state::BlobId, pb::TodoItem)> = history
            .todo_ids
            .iter()
            .copied()
            .zip(history.todos.iter().cloned())
            .collect();
        let prev = Previous {
            state: &prev_state,
            wire: &prev_wire,
            todos: &known_todos,
        };
        let summary = self.compact_if_needed(&mut messages, &history).await?;
        let background = state::background_subagents(&prev_state);
        let globbed = request_context
            .as_ref()
            .map(context::rules::GlobbedRules::new);
        let source = PromptSource {
            req: &req,
            ctx: request_context.as_ref(),
            background: &background,
            globbed: globbed.as_ref(),
        };
        let mut work = TurnWork {
            user: input.user.clone(),
            messages,
            steps: Vec::new(),
            todos,
            tool_ctx,
        };
        if let Rounds::Canceled = self.model_rounds(&mut work, &source).await? {
            return Err(self.store_canceled(&req, prev, work.done(None, None)).await);
        }
        // Steers carried to the next turn, and our notes that came after the last model call.
        let mut carried = self.client.take_carried().await?;
        carried.extend(self.client.steering.take_late());
        for text in carried {
            work.steps.push(StepRecord::UserContext { text });
        }
        let transcript = transcript::turn_lines(&work.user.text, &work.steps);
        let done = work.done(input.plan_id.take(), summary);
        self.write_turn(&req, prev, done).await?;
        // The turn has ended and is stored: now, and only now, it joins Cursor's transcript.
        let transcripts = transcripts_folder(request_context.as_ref());
        let home = self.run.settings.transcripts_home.as_deref();
        if let (Some(home), Some(folder), Some(conversation), None) =
            (home, &transcripts, &req.conversation_id, &self.run.child)
        {
            if let Err(e) = transcript::append(home, folder, conversation, transcript).await {
                warn!("the turn was not added to Cursor's transcript: {e}");
            }
        }
        self.turn_ended().await
    }

    /// The turn's request context (the client asked for it when the action carries none) with
    /// the request's context parts merged in, and the blobs its context refers to, with the
    /// past chats the user attached.
    async fn turn_context(
        &mut self,
        req: &pb::AgentRunRequest,
        input: &mut TurnInput,
    ) -> Result<(Option<pb::RequestContext>, context::Blobs), RunError> {
        let request_context = match input.request_context.take() {
            Some(ctx) => Some(ctx),
            None => self.client.fetch_request_context().await?,
        };
        let parts = context::parts(req);
        let mut blobs = self.context_blobs(req, Some(&input.user)).await?;
        let request_context = context::merge_parts(request_context, parts, &blobs);
        let home = self.run.settings.transcripts_home.clone();
        if let (Some(home), Some(folder)) = (home, transcripts_folder(request_context.as_ref())) {
            read_past_chats(&home, &folder, &input.user, &mut blobs).await;
        }
        Ok((request_context, blobs))
    }

    /// The todos the turn starts with. A Build reads its plan first (when only its file is
    /// named) and seeds the todos from it; a goal continuation names the open ones.
    async fn opening_todos(
        &mut self,
        input: &mut TurnInput,
        history: &RebuiltHistory,
    ) -> Result<Vec<pb::TodoItem>, RunError> {
        let mut todos = history.todos.clone();
        if let Some(read) = input.plan_to_read.take() {
            let plan = self.client.read_plan(&read.path).await?;
            input.user.text = action::build_instruction(&plan);
        }
        let build =
            input.user.simulated_msg_reason == Some(pb::SimulatedMsgReason::PlanExecution as i32);
        if build {
            let seeded = build_todos(plan_text(&input.user.text), &history.messages);
            if !seeded.is_empty() {
                todos = seeded;
            }
        }
        if input.goal_continuation {
            input.user.text = goal_prompt(&input.user.text, &todos);
        }
        Ok(todos)
    }

    /// What the turn's tools may do and need to know.
    fn tool_context(
        &self,
        req: &pb::AgentRunRequest,
        ctx: Option<&pb::RequestContext>,
        input: &TurnInput,
        mode: i32,
    ) -> tools::ToolContext {
        let env = ctx.and_then(|c| c.env.as_ref());
        let child = self.run.child.as_ref();
        tools::ToolContext {
            workspace_root: workspace_root(ctx),
            mcp_tools: tools::merge_mcp_tools(&[
                req.mcp_tools
                    .as_ref()
                    .map_or(&[][..], |t| t.mcp_tools.as_slice()),
                ctx.map_or(&[][..], |c| c.tools.as_slice()),
            ]),
            web_fetch: ctx.and_then(|c| c.web_fetch_enabled).unwrap_or(false),
            mode,
            command_denylist: ctx
                .map(|c| c.admin_command_denylist.clone())
                .unwrap_or_default(),
            terminals_folder: terminals_folder(ctx),
            shell_block_ms: Some(self.run.settings.shell_block_ms),
            subagents: self.subagent_options(req, ctx, input.user.selected_context.clone()),
            readonly: child.is_some_and(|c| c.readonly),
            allowed_tools: child.map(|c| c.tools.clone()).filter(|t| !t.is_empty()),
            auto_review: env
                .is_some_and(|e| e.smart_mode_classifier_auto_mode_enabled == Some(true)),
            sandboxed: env.is_some_and(|e| e.sandbox_enabled),
        }
    }

    /// What the subagent tool needs: offered below the nesting bound.
    fn subagent_options(
        &self,
        req: &pb::AgentRunRequest,
        ctx: Option<&pb::RequestContext>,
        selected_context: Option<pb::SelectedContext>,
    ) -> tools::SubagentOptions {
        let depth = self.run.child.as_ref().map_or(0, |c| c.depth);
        tools::SubagentOptions {
            enabled: depth < crate::agent::subagents::MAX_DEPTH,
            custom: ctx.map(|c| c.custom_subagents.clone()).unwrap_or_default(),
            parent_model_id: crate::agent::model::requested_model_id(req)
                .unwrap_or_default()
                .to_string(),
            overrides: req.subagent_model_overrides.clone(),
            selected_models: req
                .selected_subagent_models
                .iter()
                .map(|m| m.model_id.clone())
                .filter(|m| !m.is_empty())
                .collect(),
            parent_conversation_id: req.conversation_id.clone().unwrap_or_default(),
            selected_context,
            model_names: self.run.settings.model_names.clone(),
        }
    }

    /// The turn's model calls, in rounds: each answer's tool calls run, and their results go
    /// to the next call, until the model answers without tools (and no steering waits), is
    /// stuck repeating itself, or the round limit is reached.
    async fn model_rounds(
        &mut self,
        work: &mut TurnWork,
        source: &PromptSource<'_>,
    ) -> Result<Rounds, RunError> {
        let mut rounds = 0u32;
        let mut repeats = RepeatDetector::new(
            self.run.settings.detect_loops,
            work.tool_ctx.terminals_folder.clone(),
        );
        loop {
            let next = self.model.step + 1;
            for text in self
                .client
                .deliver_injections(&mut work.messages, next)
                .await?
            {
                work.steps.push(StepRecord::UserContext { text });
            }
            let request = self.model_request(work, source);
            let call = match self
                .model
                .model_step(&self.run, &mut self.client, request, &work.tool_ctx)
                .await
            {
                Ok(call) => call,
                Err(RunError::Canceled) => {
                    // What the user saw of the answer stays, marked as cut off.
                    if let Some(partial) = self.model.partial.take() {
                        record_steps(&mut work.steps, &partial, 0);
                    }
                    work.steps.push(StepRecord::Assistant {
                        text: INTERRUPTED_ANSWER.into(),
                    });
                    return Ok(Rounds::Canceled);
                }
                Err(e) => return Err(e),
            };
            record_steps(&mut work.steps, &call.turn, call.thinking_ms);
            let calls = tool_calls(&call.turn);
            if !call.turn.parts().is_empty() {
                work.messages.push(call.turn.message);
            }
            if calls.is_empty() {
                // Steering that came in during this answer gets its own model call.
                self.client.drain_events().await?;
                if self.client.steering.has_queued() {
                    continue;
                }
                return Ok(Rounds::Done);
            }
            rounds += 1;
            let results = match self.tool_round(&calls, work).await {
                Ok(results) => results,
                Err(RunError::Canceled) => {
                    self.client.abort_open_execs().await;
                    record_interrupted(&mut work.steps, &calls, &self.cancel_resolutions.get());
                    return Ok(Rounds::Canceled);
                }
                Err(e) => return Err(e),
            };
            let note = match work.record_results(calls, results, &mut repeats) {
                Some(why) => format!("\n\n{why}"),
                None if rounds >= self.run.settings.max_tool_rounds => format!(
                    "\n\n(Stopped after {rounds} tool rounds, the limit set by `agent.max_tool_rounds`. Send a message to continue.)"
                ),
                None => continue,
            };
            self.client.out.send(msg::notice(note.clone())).await?;
            work.steps.push(StepRecord::Assistant { text: note });
            return Ok(Rounds::Done);
        }
    }

    /// The next model call of the turn.
    fn model_request(&self, work: &TurnWork, source: &PromptSource<'_>) -> ProviderRequest {
        let touched =
            context::touched_paths(&work.messages, work.tool_ctx.workspace_root.as_deref());
        let system = prompt::system_prompt(&prompt::PromptInputs {
            ctx: source.ctx,
            custom: source.req.custom_system_prompt.as_deref(),
            spec: source.req.system_prompt_spec.as_ref(),
            mode: work.tool_ctx.mode,
            touched: &touched,
            child: self.run.child.as_ref(),
            background: source.background,
            exclude_workspace: source.req.exclude_workspace_context == Some(true),
            globbed: source.globbed,
        });
        ProviderRequest {
            model: self.run.model.config.model.clone(),
            system,
            messages: work.messages.clone(),
            tools: tools::catalog(&work.tool_ctx),
            options: request_options(&self.run.model),
        }
    }

    /// Run the calls of the latest model call (step), with the turn's tools and todos.
    async fn tool_round(
        &mut self,
        calls: &[Call],
        work: &mut TurnWork,
    ) -> Result<Vec<tools::ToolOutcome>, RunError> {
        let step = self.model.step;
        ToolRound {
            run: &self.run,
            client: &mut self.client,
            model: &mut self.model,
            step,
        }
        .carry_out(calls, &mut work.tool_ctx, &mut work.todos)
        .await
    }

    /// Keep what a turn the user canceled did (its pending calls closed, its cut-off answer)
    /// so the next turn and a restart see it: best effort, within a short grace, since the user
    /// asked to stop. A cancel by the transport (a bad frame, the client gone) stores nothing:
    /// nobody is there to store it. Returns the cancel.
    async fn store_canceled(
        &mut self,
        req: &pb::AgentRunRequest,
        prev: Previous<'_>,
        done: TurnDone,
    ) -> RunError {
        self.client.cancel_injections().await;
        if !self.cancel_resolutions.by_user() {
            return RunError::Canceled;
        }
        self.client.winding_down = true;
        if let Err(e) = self.write_turn(req, prev, done).await {
            debug!("the canceled turn was not stored: {e}");
        }
        RunError::Canceled
    }

    /// The blobs the turn's context refers to (request context parts, the user's content given
    /// by blob id): pre-fetched ones, the local cache, then the client.
    async fn context_blobs(
        &mut self,
        req: &pb::AgentRunRequest,
        user: Option<&pb::UserMessage>,
    ) -> Result<context::Blobs, RunError> {
        let mut blobs = context::Blobs::pre_fetched(req);
        let wanted: Vec<state::BlobId> = context::wanted_blobs(context::parts(req), user)
            .into_iter()
            .filter(|id| !blobs.has(id))
            .collect();
        if wanted.is_empty() {
            return Ok(blobs);
        }
        let mut ask = Vec::new();
        for (id, data) in self.run.cache.get_many(wanted).await {
            match data {
                Some(d) => blobs.insert(id, d),
                None => ask.push(id),
            }
        }
        if !ask.is_empty() {
            debug!(blobs = ask.len(), "asking the client for context blobs");
            let mut fresh = Vec::new();
            for (id, data) in self.client.fetch_blobs(&ask).await? {
                match data {
                    Some(d) => {
                        blobs.insert(id, d.clone());
                        fresh.push(state::Blob { id, data: d });
                    }
                    None => warn!("the client does not have a context blob; going on without it"),
                }
            }
            // Later turns replay this message from the cache.
            self.run.cache.put_many(fresh).await;
        }
        Ok(blobs)
    }

    /// The conversation so far, from the checkpoint's turn blobs: the local cache first, the
    /// client for the rest.
    async fn rebuild_history(
        &mut self,
        prev: &pb::ConversationStateStructure,
    ) -> Result<RebuiltHistory, RunError> {
        let opts = HistoryOptions {
            max_bytes: self.run.settings.max_history_bytes,
            images_allowed: self.run.model.config.supports_images,
        };
        let mut builder = HistoryBuilder::new(prev, opts);
        loop {
            let missing = builder.missing();
            if missing.is_empty() {
                break;
            }
            let mut ask = Vec::new();
            for (id, data) in self.run.cache.get_many(missing).await {
                let supplied = data.is_some_and(|d| builder.supply(id, d).is_ok());
                if !supplied {
                    ask.push(id);
                }
            }
            if ask.is_empty() {
                continue;
            }
            debug!(
                blobs = ask.len(),
                "asking the client for conversation blobs"
            );
            let mut fresh = Vec::new();
            for (id, data) in self.client.fetch_blobs(&ask).await? {
                match data {
                    Some(d) if builder.supply(id, d.clone()).is_ok() => {
                        fresh.push(state::Blob { id, data: d })
                    }
                    _ => builder.mark_unavailable(id),
                }
            }
            self.run.cache.put_many(fresh).await;
        }
        builder
            .finish(&tools::history_from_tool_call)
            .map_err(|e| RunError::Internal(format!("cannot rebuild the conversation: {e}")))
    }

    /// When the history would not fit the model's context window, summarise the older part
    /// with the model itself. Returns the summary and the last turn it covers.
    async fn compact_if_needed(
        &mut self,
        messages: &mut Vec<Message>,
        history: &RebuiltHistory,
    ) -> Result<Option<(String, state::BlobId)>, RunError> {
        let cfg = &self.run.model.config;
        // Room for the system prompt, tool definitions and the answer.
        let reserve = cfg.max_output_tokens.saturating_add(8_000);
        let Some(plan) = state::plan_compaction(messages, cfg.context_window, reserve) else {
            return Ok(None);
        };
        let Some(through) = history.turn_through(plan.split) else {
            return Ok(None);
        };
        let text = self.summarize(&plan.older).await?;
        let mut compacted = vec![state::summary_message(&text)];
        compacted.extend(plan.keep);
        *messages = compacted;
        Ok(Some((text, through)))
    }

    /// Summarise `older` with the model, telling Cursor as it goes.
    async fn summarize(&mut self, older: &[Message]) -> Result<String, RunError> {
        let cfg = &self.run.model.config;
        let out = &self.client.out;
        out.send(msg::summary_started()).await?;
        let request = ProviderRequest {
            model: cfg.model.clone(),
            system: "You summarise coding-agent conversations so the work can continue. Keep file paths, decisions, open tasks, errors and the user's requests; be concise.".into(),
            messages: state::summary_prompt(older, SUMMARY_MAX_CHARS),
            tools: Vec::new(),
            options: crate::provider::RequestOptions {
                max_output_tokens: Some(4_000.min(cfg.max_output_tokens)),
                ..Default::default()
            },
        };
        let opened = self.model.open(&self.run.chain, request).await?;
        let price = self.run.chain.targets[opened.target].price;
        let mut builder = crate::provider::TurnBuilder::new();
        builder.push(&opened.first);
        let mut stream = opened.stream;
        if !opened.first.is_terminal() {
            while let Some(e) = stream.recv().await {
                builder.push(&e);
            }
        }
        let turn = builder.finish();
        if let Some(u) = &turn.usage {
            self.model.record_call(u, price);
        }
        if let Some(e) = turn.error {
            warn!("summary failed: {e}");
            out.send(msg::summary_completed(true)).await?;
            return Err(provider_error(&self.run.model, e));
        }
        let text = turn.text();
        out.send(msg::summary(text.clone())).await?;
        out.send(msg::summary_completed(false)).await?;
        // The stored summary also names the files touched so far (their globbed rules stay).
        Ok(text + &context::touched_note(older))
    }

    /// `/summarize`: the whole conversation so far, by the path automatic compaction takes; the
    /// checkpoint records it and no model turn follows.
    async fn summarize_now(&mut self, req: &pb::AgentRunRequest) -> Result<(), RunError> {
        let prev_state = req.conversation_state.clone().unwrap_or_default();
        let prev_wire = wire_at(&self.run.first_wire, &[CONVERSATION_STATE]);
        let history = self.rebuild_history(&prev_state).await?;
        let Some(through) = history.turn_through(history.messages.len()) else {
            self.client
                .out
                .send(msg::notice("There is nothing to summarise yet.".into()))
                .await?;
            return self.turn_ended().await;
        };
        let text = self.summarize(&history.messages).await?;
        let mut checkpoint = state::Checkpoint {
            state: prev_state.clone(),
            blobs: Vec::new(),
        };
        checkpoint.set_summary(&text, &through);
        self.publish(&prev_state, &prev_wire, checkpoint, Vec::new())
            .await?;
        self.turn_ended().await
    }

    /// A command the user ran from the chat: run through the client like the model's shell
    /// calls (its output streams to the UI), then stored as a shell turn the next model turn
    /// reads. No model call.
    async fn shell_command(
        &mut self,
        req: &pb::AgentRunRequest,
        command: String,
        exec_id: String,
    ) -> Result<(), RunError> {
        let request_context = self.client.fetch_request_context().await?;
        self.client.exec.adopt_next(exec_id);
        let prev_state = req.conversation_state.clone().unwrap_or_default();
        let prev_wire = wire_at(&self.run.first_wire, &[CONVERSATION_STATE]);
        let mut ctx = tools::ToolContext {
            workspace_root: workspace_root(request_context.as_ref()),
            mcp_tools: Vec::new(),
            web_fetch: false,
            mode: prev_state.mode.unwrap_or(0),
            command_denylist: request_context
                .as_ref()
                .map(|c| c.admin_command_denylist.clone())
                .unwrap_or_default(),
            terminals_folder: terminals_folder(request_context.as_ref()),
            shell_block_ms: Some(self.run.settings.shell_block_ms),
            ..Default::default()
        };
        let call: Call = (
            "user_shell".into(),
            "run_terminal_cmd".into(),
            serde_json::json!({ "command": command }),
            None,
        );
        let mut todos = Vec::new();
        let step = self.model.step;
        let outcomes = ToolRound {
            run: &self.run,
            client: &mut self.client,
            model: &mut self.model,
            step,
        }
        .carry_out(&[call], &mut ctx, &mut todos)
        .await?;
        let output = outcomes.first().map(shell_output).unwrap_or_default();
        let (turn_blobs, turn_id) = state::encode_shell_turn(&command, &output);
        let mut checkpoint = state::Checkpoint {
            state: prev_state.clone(),
            blobs: Vec::new(),
        };
        checkpoint
            .state
            .turns
            .push(bytes::Bytes::copy_from_slice(&turn_id));
        self.publish(&prev_state, &prev_wire, checkpoint, turn_blobs)
            .await?;
        self.turn_ended().await
    }

    /// Store `extra` and the checkpoint's blobs, then send the checkpoint.
    async fn publish(
        &mut self,
        prev: &pb::ConversationStateStructure,
        prev_wire: &[u8],
        checkpoint: state::Checkpoint,
        mut extra: Vec<state::Blob>,
    ) -> Result<(), RunError> {
        extra.extend(checkpoint.blobs.iter().cloned());
        self.client.store_blobs(&extra).await?;
        self.run.cache.put_many(extra).await;
        let wire = checkpoint.encode_over(prev, prev_wire);
        self.client
            .out
            .send_output(msg::checkpoint_encoded(checkpoint.state, &wire))
            .await
    }

    /// Store the turn's blobs, wait for every ack, then publish the checkpoint.
    async fn write_turn(
        &mut self,
        req: &pb::AgentRunRequest,
        prev: Previous<'_>,
        done: TurnDone,
    ) -> Result<(), RunError> {
        let TurnDone {
            user,
            steps,
            todos,
            mode,
            plan,
            summary,
        } = done;
        let user_wire = user_message_wire(&self.run.first_wire, &user);
        let subagent_record = self.subagent_record(prev.state, &steps);
        let record = TurnRecord {
            user,
            user_wire,
            steps,
            request_id: req
                .run_id
                .clone()
                .unwrap_or_else(|| self.run.request_id.clone()),
        };
        let encoded = state::encode_turn(&record);
        let used = self
            .model
            .last_call
            .input
            .saturating_add(self.model.last_call.output);
        let mut checkpoint = state::build_checkpoint(
            prev.state,
            &encoded.turn_id,
            &todos,
            u32::try_from(used).unwrap_or(u32::MAX),
            self.run.model.config.context_window,
            (mode != 0).then_some(mode),
        );
        checkpoint.keep_unchanged_todos(&todos, prev.todos);
        checkpoint.state.subagent_runs_by_parent_tool_call_id =
            subagent_record.subagent_runs_by_parent_tool_call_id;
        checkpoint.state.subagent_states = subagent_record.subagent_states;
        if let Some((text, through)) = summary {
            checkpoint.set_summary(&text, &through);
        }
        if let Some((id, path)) = plan {
            checkpoint
                .state
                .plans
                .insert(id.clone(), pb::PlanRegistryEntry { id, path });
        }
        self.publish(prev.state, prev.wire, checkpoint, encoded.blobs)
            .await
    }

    /// The checkpoint's record of subagent runs after this turn: its subagent calls, and the
    /// background completions the client reported.
    fn subagent_record(
        &self,
        prev: &pb::ConversationStateStructure,
        steps: &[StepRecord],
    ) -> pb::ConversationStateStructure {
        let now_ms = u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp() * 1000)
            .unwrap_or_default();
        let mut record = prev.clone();
        state::record_subagents(
            &mut record,
            steps.iter().filter_map(|s| match s {
                StepRecord::ToolCall { tool_call, .. } => Some(tool_call),
                _ => None,
            }),
            now_ms,
        );
        state::record_completions(&mut record, self.client.background.completions(), now_ms);
        record
    }
}

/// The conversation the turn's first model call reads: the rebuilt history (or the one the
/// client supplies), an asked question's answer delivered, pending calls closed, then the
/// turn's own messages.
fn opening_messages(
    history: &mut RebuiltHistory,
    input: &TurnInput,
    images: bool,
    blobs: &context::Blobs,
) -> Vec<Message> {
    let mut messages = std::mem::take(&mut history.messages);
    if let Some(h) = &input.history {
        messages = client_history(h, images);
        history.turn_starts.clear();
    }
    if let Some((call_id, answer)) = &input.answer {
        deliver_answer(&mut messages, call_id, answer);
    }
    pending::close_pending(&mut messages, &input.resolutions);
    steer::drop_carried_copies(&mut messages, &input.user.text);
    for m in &input.prepend {
        messages.push(prompt::user_message_with(m, images, blobs));
    }
    messages.push(prompt::user_message_with(&input.user, images, blobs));
    messages
}

/// The tool calls of a model call, in its order.
fn tool_calls(turn: &crate::provider::Turn) -> Vec<Call> {
    turn.parts()
        .iter()
        .filter_map(|p| match p {
            AssistantPart::ToolCall {
                id,
                name,
                arguments,
                extra,
            } => Some((id.clone(), name.clone(), arguments.clone(), extra.clone())),
            _ => None,
        })
        .collect()
}

/// The checkpoint the turn started from, as decoded and as received, with its todos.
#[derive(Clone, Copy)]
struct Previous<'a> {
    state: &'a pb::ConversationStateStructure,
    wire: &'a [u8],
    todos: &'a [(state::BlobId, pb::TodoItem)],
}

/// `AgentRunRequest.conversation_state`.
const CONVERSATION_STATE: u32 = 1;
/// `AgentRunRequest.action`, then `ConversationAction.user_message_action` /
/// `.start_plan_action`, then their `user_message`.
const USER_MESSAGE_PATHS: [[u32; 3]; 2] = [[2, 1, 1], [2, 6, 1]];

/// The message at `path` in `wire`; empty when absent or unreadable (then nothing of it is
/// kept beyond what we decoded).
fn wire_at(wire: &bytes::Bytes, path: &[u32]) -> bytes::Bytes {
    crate::proto::wire::message_path(wire, path)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The user message as Cursor sent it, when `user` is that message (not our stand-in for a
/// resume): its blob then keeps the fields this build does not know.
fn user_message_wire(request_wire: &bytes::Bytes, user: &pb::UserMessage) -> Option<bytes::Bytes> {
    use prost::Message as _;
    USER_MESSAGE_PATHS
        .iter()
        .map(|path| wire_at(request_wire, path))
        .find(|w| !w.is_empty() && pb::UserMessage::decode(w.clone()).is_ok_and(|u| &u == user))
}

/// The steps of one model call, in the order Cursor shows them: thinking, text; the tool calls
/// are recorded once they have run.
fn record_steps(steps: &mut Vec<StepRecord>, turn: &crate::provider::Turn, thinking_ms: u32) {
    for part in turn.parts() {
        match part {
            AssistantPart::Reasoning { text, extra } => steps.push(StepRecord::Thinking {
                text: text.clone(),
                duration_ms: thinking_ms,
                extra: extra.clone(),
            }),
            AssistantPart::Text { text } if !text.is_empty() => {
                steps.push(StepRecord::Assistant { text: text.clone() })
            }
            _ => {}
        }
    }
}

/// A Build instruction's plan (the part inside `<plan>`), or the whole text.
fn plan_text(instruction: &str) -> &str {
    instruction
        .split_once("<plan>\n")
        .and_then(|(_, rest)| rest.rsplit_once("\n</plan>"))
        .map_or(instruction, |(plan, _)| plan)
}

/// The todos a Build starts with: the plan's front matter lists them (Cursor's `.plan.md`), else
/// the `create_plan` call that wrote this plan carried them (`CreatePlanArgs.todos`; the
/// action's `ConversationPlan` holds only the text). The latest such call whose plan is this
/// one wins.
fn build_todos(plan: &str, history: &[Message]) -> Vec<pb::TodoItem> {
    let listed = tools::plan_todos(plan);
    if !listed.is_empty() {
        return listed;
    }
    let plan = plan.trim();
    let same = |created: &str| {
        let created = created.trim();
        !created.is_empty() && (plan.contains(created) || created.contains(plan))
    };
    history
        .iter()
        .rev()
        .filter_map(|m| match m {
            Message::Assistant { parts } => Some(parts),
            _ => None,
        })
        .flat_map(|parts| parts.iter().rev())
        .find_map(|p| match p {
            AssistantPart::ToolCall {
                name, arguments, ..
            } if name == "create_plan" => {
                let created = ["plan", "content", "markdown", "body", "text"]
                    .iter()
                    .find_map(|k| arguments.get(*k).and_then(|v| v.as_str()))?;
                same(created).then(|| tools::created_plan_todos(arguments))
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// The goal-continuation prompt: `base`, then the todos still open.
fn goal_prompt(base: &str, todos: &[pb::TodoItem]) -> String {
    use pb::TodoStatus;
    let open: Vec<String> = todos
        .iter()
        .filter(|t| {
            !matches!(
                TodoStatus::try_from(t.status),
                Ok(TodoStatus::Completed | TodoStatus::Cancelled)
            )
        })
        .map(|t| format!("- {}", t.content))
        .collect();
    if open.is_empty() {
        format!("{base} The todo list has no open items: check the work is complete and say what remains, if anything.")
    } else {
        format!("{base} Open todos:\n{}", open.join("\n"))
    }
}

/// A history the client supplies (`conversation_history`), in the provider's form.
fn client_history(h: &pb::ConversationHistory, images: bool) -> Vec<Message> {
    use pb::conversation_history_assistant_content::Content as A;
    use pb::conversation_history_message::Message as M;
    use pb::conversation_history_tool_result_content::Content as R;
    use pb::conversation_history_user_content::Content as U;
    let mut out = Vec::new();
    for m in &h.messages {
        match &m.message {
            Some(M::User(u)) => {
                let text = joined(&u.content, |c| match &c.content {
                    Some(U::Text(t)) => Some(t.text.as_str()),
                    _ => None,
                });
                let user = pb::UserMessage {
                    text,
                    ..Default::default()
                };
                out.push(prompt::user_message_with(
                    &user,
                    images,
                    &context::Blobs::default(),
                ));
            }
            Some(M::Assistant(a)) => {
                let parts: Vec<AssistantPart> = a
                    .content
                    .iter()
                    .filter_map(|c| match &c.content {
                        Some(A::Text(t)) => Some(AssistantPart::Text {
                            text: t.text.clone(),
                        }),
                        Some(A::ToolCall(t)) => Some(AssistantPart::ToolCall {
                            id: t.tool_call_id.clone(),
                            name: t.tool_name.clone(),
                            arguments: serde_json::from_str(&t.args_json)
                                .unwrap_or_else(|_| serde_json::Value::String(t.args_json.clone())),
                            extra: None,
                        }),
                        // Reasoning without the provider's signature cannot be replayed.
                        _ => None,
                    })
                    .collect();
                if !parts.is_empty() {
                    out.push(Message::Assistant { parts });
                }
            }
            Some(M::Tool(t)) => {
                let content = joined(&t.content, |c| match &c.content {
                    Some(R::Text(t)) => Some(t.text.as_str()),
                    _ => None,
                });
                out.push(Message::ToolResult {
                    call_id: t.tool_call_id.clone(),
                    name: t.tool_name.clone(),
                    content,
                    is_error: t.is_error.unwrap_or(false),
                });
            }
            None => {}
        }
    }
    out
}

/// The text parts of client-history content, one per line.
fn joined<'a, T>(items: &'a [T], text: impl Fn(&'a T) -> Option<&'a str>) -> String {
    items.iter().filter_map(text).collect::<Vec<_>>().join("\n")
}

/// An asynchronous question's answer becomes the result of the call that asked it.
fn deliver_answer(messages: &mut [Message], cursor_call_id: &str, answer: &str) {
    for m in messages.iter_mut() {
        if let Message::ToolResult {
            call_id, content, ..
        } = m
        {
            let ours = cursor_call_id == call_id.as_str()
                || cursor_call_id
                    .strip_prefix(call_id.as_str())
                    .is_some_and(|r| r.starts_with("#s"));
            if ours {
                *content = answer.to_string();
            }
        }
    }
}

/// The calls of a round a cancel interrupted, closed with the client's resolution.
fn record_interrupted(
    steps: &mut Vec<StepRecord>,
    calls: &[Call],
    resolutions: &[pb::InterruptedPendingToolCallResolution],
) {
    for (id, name, arguments, extra) in calls {
        let (result, is_error) = pending::resolution_for(id, resolutions);
        steps.push(StepRecord::ToolCall {
            tool_call: pb::ToolCall {
                tool_call_id: Some(id.clone()),
                ..Default::default()
            },
            call_id: id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
            result,
            is_error,
            extra: extra.clone(),
        });
    }
}

/// A user command's output, from its shell tool call.
fn shell_output(outcome: &tools::ToolOutcome) -> pb::ShellOutput {
    use pb::shell_result::Result as R;
    let result = match &outcome.tool_call.tool {
        Some(pb::tool_call::Tool::ShellToolCall(t)) => {
            t.result.as_ref().and_then(|r| r.result.as_ref())
        }
        _ => None,
    };
    match result {
        Some(R::Success(s)) => pb::ShellOutput {
            stdout: s.stdout.clone(),
            stderr: s.stderr.clone(),
            exit_code: s.exit_code,
        },
        Some(R::Failure(f)) => pb::ShellOutput {
            stdout: f.stdout.clone(),
            stderr: f.stderr.clone(),
            exit_code: f.exit_code,
        },
        _ => pb::ShellOutput {
            stderr: outcome.content.clone(),
            exit_code: -1,
            ..Default::default()
        },
    }
}
