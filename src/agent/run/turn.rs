//! One run's driver: it performs the steps of the run's course (the sans-IO [`Lifecycle`])
//! with the run's parts (its client, its model calls), each under the heartbeat, and feeds the
//! course how each went. A model turn opens (`opening`, `history`), runs its model rounds (the
//! `machine`, performed by the `driver`), and is stored (`store`).

use std::collections::VecDeque;

use super::action::{self, Begin, TurnInput};
use super::client::Client;
use super::driver::{self, Parts};
use super::error::RunError;
use super::history;
use super::lifecycle::{Lifecycle, RunStep, StepResult};
use super::machine::{Machine, RequestFor, RoundRules, TurnWork};
use super::model_calls::{request_options, ModelCalls};
use super::opening;
use super::outbox::{with_heartbeat, Heartbeat};
use super::pending::CancelResolutions;
use super::setup::{Run, RunSummary};
use super::store::{self, wire_at, PriorCheckpoint, Storing, CONVERSATION_STATE};
use super::tooling::{Call, ToolRound};
use crate::agent::messages as msg;
use crate::agent::state::{self, StepRecord};
use crate::agent::{context, prompt, tools, transcript};
use crate::proto::agent::v1 as pb;
use crate::provider::{Message, ProviderRequest};

/// One run while it executes: the prepared run, its exchanges with the client and its model
/// calls, composed by the turn.
pub(super) struct RunState {
    run: Run,
    client: Client,
    model: ModelCalls,
    /// What the client said about pending tool calls when it canceled.
    cancel_resolutions: CancelResolutions,
}

/// What the system prompt of each model call of a turn is built from.
struct PromptSource<'a> {
    req: &'a pb::AgentRunRequest,
    ctx: Option<&'a pb::RequestContext>,
    /// Subagents an earlier turn left in the background: the model may wait for them.
    background: &'a [(String, String)],
    globbed: Option<&'a context::rules::GlobbedRules<'a>>,
}

/// A model turn as it opens: the checkpoint it starts from, its context, and the summary
/// compaction made.
struct OpenedTurn {
    request_context: Option<pb::RequestContext>,
    prev_state: pb::ConversationStateStructure,
    prev_wire: bytes::Bytes,
    /// The checkpoint's todos with their blob ids.
    known_todos: Vec<(state::BlobId, pb::TodoItem)>,
    /// The summary compaction made, and the last turn it covers.
    summary: Option<(String, state::BlobId)>,
}

/// What a request carries from one step of its course to the next.
#[derive(Default)]
struct Carried {
    /// The model turn's input, until the turn opens (its plan id until the turn is stored).
    input: Option<TurnInput>,
    opened: Option<OpenedTurn>,
    /// The turn's work: what the model reads next and what the turn records.
    work: Option<TurnWork>,
    /// The turn's lines for Cursor's transcript, once it is stored.
    transcript: Option<String>,
    /// A command the user ran, and the client's exec id for it.
    shell: Option<(String, String)>,
    /// The subagent to stop.
    subagent: Option<String>,
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

    /// Carry out what the run request asks for: its course's steps (see [`Lifecycle`]), each
    /// under the heartbeat, until the course finishes.
    pub(super) async fn execute(
        mut self,
        req: Box<pb::AgentRunRequest>,
    ) -> Result<RunSummary, RunError> {
        let begin = match action::begin(&req) {
            Ok(begin) => begin,
            Err(e) => {
                self.clean_up().await;
                return Err(e);
            }
        };
        let (mut course, first) = Lifecycle::start(&begin);
        let mut carried = Carried::default();
        match begin {
            Begin::Turn(input) => carried.input = Some(*input),
            Begin::Shell { command, exec_id } => carried.shell = Some((command, exec_id)),
            Begin::CancelSubagent { id } => carried.subagent = Some(id),
            Begin::Summarize | Begin::BackgroundSubagent { .. } => {}
        }
        let out = self.client.out.clone();
        let heartbeat = Heartbeat::new(self.run.settings.heartbeat);
        let mut queue: VecDeque<RunStep> = first.into();
        while let Some(step) = queue.pop_front() {
            if let RunStep::Finish(result) = step {
                return result.map(|()| self.model.summary());
            }
            // Boxed: the step's future is large, and moved into the heartbeat's it would
            // otherwise take its room twice in the run's future for the run's whole life.
            let work = Box::pin(self.perform(&req, &mut carried, step));
            if let Some(event) = with_heartbeat(&out, heartbeat, work).await {
                queue.extend(course.handle(event));
            }
        }
        Err(RunError::Internal(
            "the run's course stopped without finishing".into(),
        ))
    }

    /// Carry out one step of the course; how it went, for a step that is answered.
    async fn perform(
        &mut self,
        req: &pb::AgentRunRequest,
        carried: &mut Carried,
        step: RunStep,
    ) -> Option<StepResult> {
        let done = |r: Result<(), RunError>| {
            Some(r.map_or_else(StepResult::Failed, |()| StepResult::Done))
        };
        match step {
            RunStep::OpenTurn => done(self.open_turn(req, carried).await),
            RunStep::RunRounds => Some(self.model_rounds(req, carried).await),
            RunStep::DeferSteering => {
                self.client.steering.defer_to_next_turn();
                None
            }
            RunStep::TakeCarried => done(self.take_carried(carried).await),
            RunStep::StoreTurn => done(self.store_turn(req, carried).await),
            RunStep::StoreCanceled { by_user } => Some(StepResult::Failed(
                self.store_canceled(req, carried, by_user).await,
            )),
            RunStep::AppendTranscript => {
                let folder = carried
                    .opened
                    .as_ref()
                    .and_then(|o| opening::transcripts_folder(o.request_context.as_ref()));
                let lines = carried.transcript.take().unwrap_or_default();
                store::append_transcript(&self.run, req, folder, lines).await;
                done(Ok(()))
            }
            RunStep::Summarize => done(self.summarize_now(req).await),
            RunStep::RunShell => {
                let (command, exec_id) = carried.shell.take().unwrap_or_default();
                done(self.shell_command(req, command, exec_id).await)
            }
            RunStep::CancelSubagent => {
                self.client
                    .cancel_subagent(&carried.subagent.take().unwrap_or_default());
                done(Ok(()))
            }
            RunStep::SendTurnEnded => done(self.turn_ended().await),
            RunStep::CleanUp => {
                self.clean_up().await;
                None
            }
            RunStep::Finish(_) => None,
        }
    }

    /// Stop what the client still runs for a run that failed.
    async fn clean_up(&mut self) {
        self.client.cancel_injections().await;
        self.client.abort_open_execs().await;
    }

    /// The run's parts that store a turn.
    fn storing(&mut self) -> Storing<'_> {
        Storing {
            run: &self.run,
            client: &mut self.client,
            model: &self.model,
        }
    }

    async fn turn_ended(&mut self) -> Result<(), RunError> {
        self.client
            .out
            .send(msg::turn_ended(&self.model.usage))
            .await
    }

    /// Steers carried to the next turn, and our notes that came after the last model call,
    /// join the turn's record.
    async fn take_carried(&mut self, carried: &mut Carried) -> Result<(), RunError> {
        let work = carried.work.as_mut().ok_or_else(out_of_order)?;
        let mut texts = self.client.take_carried().await?;
        texts.extend(self.client.steering.take_late());
        for text in texts {
            work.steps.push(StepRecord::UserContext { text });
        }
        Ok(())
    }

    /// Store the turn and send the new checkpoint; its transcript lines wait for the next step.
    async fn store_turn(
        &mut self,
        req: &pb::AgentRunRequest,
        carried: &mut Carried,
    ) -> Result<(), RunError> {
        let (Some(opened), Some(work)) = (carried.opened.as_ref(), carried.work.take()) else {
            return Err(out_of_order());
        };
        carried.transcript = Some(transcript::turn_lines(&work.user.text, &work.steps));
        let plan = carried.input.as_mut().and_then(|i| i.plan_id.take());
        let done = work.done(plan, opened.summary.clone());
        self.storing().write_turn(req, opened.prior(), done).await
    }

    /// A canceled turn: stored as far as it went when the user canceled it. The failure the
    /// run ends with.
    async fn store_canceled(
        &mut self,
        req: &pb::AgentRunRequest,
        carried: &mut Carried,
        by_user: bool,
    ) -> RunError {
        let (Some(opened), Some(work)) = (carried.opened.as_ref(), carried.work.take()) else {
            return out_of_order();
        };
        let done = work.done(None, None);
        self.storing()
            .canceled(by_user, req, opened.prior(), done)
            .await
    }

    /// The turn's opening: its context and blobs, the history rebuilt (and compacted when it
    /// would not fit), its todos, tools and first messages.
    async fn open_turn(
        &mut self,
        req: &pb::AgentRunRequest,
        carried: &mut Carried,
    ) -> Result<(), RunError> {
        let input = carried.input.as_mut().ok_or_else(out_of_order)?;
        if let Some(pb::conversation_action::Action::BackgroundTaskCompletionAction(a)) =
            req.action.as_ref().and_then(|a| a.action.as_ref())
        {
            self.client.background.remember(a);
        }
        // Steering from now on joins this turn's first (or next) model call.
        self.client.steering.open_turn();
        let (run, client) = (&self.run, &mut self.client);
        let (request_context, blobs) = opening::turn_context(run, client, req, input).await?;
        let prev_state = req.conversation_state.clone().unwrap_or_default();
        let prev_wire = wire_at(&run.first_wire, &[CONVERSATION_STATE]);
        let mut history = history::rebuild_history(run, client, &prev_state).await?;
        let todos = opening::opening_todos(client, input, &history).await?;
        let mode = Some(input.user.mode)
            .filter(|m| *m != 0)
            .or(prev_state.mode)
            .unwrap_or(0);
        let tool_ctx = opening::tool_context(run, req, request_context.as_ref(), input, mode);
        let images = run.model.config.supports_images;
        let mut messages = opening::opening_messages(&mut history, input, images, &blobs);
        let known_todos = history
            .todo_ids
            .iter()
            .copied()
            .zip(history.todos.iter().cloned())
            .collect();
        let model = &mut self.model;
        let summary =
            history::compact_if_needed(run, client, model, &mut messages, &history).await?;
        let work = TurnWork {
            user: input.user.clone(),
            messages,
            steps: Vec::new(),
            todos,
            tool_ctx,
        };
        let opened = OpenedTurn {
            request_context,
            prev_state,
            prev_wire,
            known_todos,
            summary,
        };
        carried.opened = Some(opened);
        carried.work = Some(work);
        Ok(())
    }

    /// The turn's model calls, in rounds (see [`Machine`]), driven to their end: how they
    /// ended. What the turn did stays in `carried`.
    async fn model_rounds(
        &mut self,
        req: &pb::AgentRunRequest,
        carried: &mut Carried,
    ) -> StepResult {
        let (Some(opened), Some(work)) = (carried.opened.as_ref(), carried.work.take()) else {
            return StepResult::Failed(out_of_order());
        };
        let background = state::background_subagents(&opened.prev_state);
        let ctx = opened.request_context.as_ref();
        let globbed = ctx.map(context::rules::GlobbedRules::new);
        let source = PromptSource {
            req,
            ctx,
            background: &background,
            globbed: globbed.as_ref(),
        };
        let run = &self.run;
        let request: RequestFor<'_> =
            Box::new(|messages: &[Message], tool_ctx: &tools::ToolContext| {
                model_request(run, &source, messages, tool_ctx)
            });
        let rules = RoundRules {
            max_tool_rounds: run.settings.max_tool_rounds,
            detect_loops: run.settings.detect_loops,
        };
        let name = run.model.config.display_name().to_string();
        let shown = self.client.out.shown.get();
        let mut machine = Machine::new(work, request, rules, name, self.model.step, shown);
        let parts = Parts {
            run,
            client: &mut self.client,
            model: &mut self.model,
            resolutions: &self.cancel_resolutions,
        };
        let end = driver::drive(parts, &mut machine).await;
        carried.work = Some(machine.into_work());
        StepResult::Rounds(end)
    }

    /// `/summarize`: the whole conversation so far, by the path automatic compaction takes; the
    /// checkpoint records it and no model turn follows.
    async fn summarize_now(&mut self, req: &pb::AgentRunRequest) -> Result<(), RunError> {
        let prev_state = req.conversation_state.clone().unwrap_or_default();
        let prev_wire = wire_at(&self.run.first_wire, &[CONVERSATION_STATE]);
        let history = history::rebuild_history(&self.run, &mut self.client, &prev_state).await?;
        let Some(through) = history.turn_through(history.messages.len()) else {
            self.client
                .out
                .send(msg::notice("There is nothing to summarise yet.".into()))
                .await?;
            return Ok(());
        };
        let text = history::summarize(
            &self.run,
            &mut self.client,
            &mut self.model,
            &history.messages,
        )
        .await?;
        let mut checkpoint = state::Checkpoint {
            state: prev_state.clone(),
            blobs: Vec::new(),
        };
        checkpoint.set_summary(&text, &through);
        self.storing()
            .publish(&prev_state, &prev_wire, checkpoint, Vec::new())
            .await
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
            workspace_root: opening::workspace_root(request_context.as_ref()),
            mcp_tools: Vec::new(),
            web_fetch: false,
            mode: prev_state.mode.unwrap_or(0),
            command_denylist: request_context
                .as_ref()
                .map(|c| c.admin_command_denylist.clone())
                .unwrap_or_default(),
            terminals_folder: opening::terminals_folder(request_context.as_ref()),
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
        let output = outcomes
            .first()
            .map(store::shell_output)
            .unwrap_or_default();
        let (turn_blobs, turn_id) = state::encode_shell_turn(&command, &output);
        let mut checkpoint = state::Checkpoint {
            state: prev_state.clone(),
            blobs: Vec::new(),
        };
        checkpoint
            .state
            .turns
            .push(bytes::Bytes::copy_from_slice(&turn_id));
        self.storing()
            .publish(&prev_state, &prev_wire, checkpoint, turn_blobs)
            .await
    }
}

impl OpenedTurn {
    /// The checkpoint the turn starts from, as storing reads it.
    fn prior(&self) -> PriorCheckpoint<'_> {
        PriorCheckpoint {
            state: &self.prev_state,
            wire: &self.prev_wire,
            todos: &self.known_todos,
        }
    }
}

/// A step that found the turn's parts missing: the course asked for steps out of order.
fn out_of_order() -> RunError {
    RunError::Internal("a step of the turn ran before the step that prepares it".into())
}

/// The next model call of the turn: the system prompt for the conversation so far, the
/// conversation, and the turn's tools.
fn model_request(
    run: &Run,
    source: &PromptSource<'_>,
    messages: &[Message],
    tool_ctx: &tools::ToolContext,
) -> ProviderRequest {
    let touched = context::touched_paths(messages, tool_ctx.workspace_root.as_deref());
    let system = prompt::system_prompt(&prompt::PromptInputs {
        ctx: source.ctx,
        custom: source.req.custom_system_prompt.as_deref(),
        spec: source.req.system_prompt_spec.as_ref(),
        mode: tool_ctx.mode,
        touched: &touched,
        child: run.child.as_ref(),
        background: source.background,
        exclude_workspace: source.req.exclude_workspace_context == Some(true),
        globbed: source.globbed,
    });
    ProviderRequest {
        model: run.model.config.model.clone(),
        system,
        messages: messages.to_vec(),
        tools: tools::catalog(tool_ctx),
        options: request_options(&run.model),
    }
}
