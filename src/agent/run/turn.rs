//! One run's work: what the first request asks for (a model turn, a summary, a command the
//! user ran), carried out by [`RunState`] with the run's parts (its client, its model calls).
//! A model turn opens (`opening`, `history`), runs its model rounds (the `machine`, performed by
//! the `driver`), and is stored (`store`).

use tracing::debug;

use super::action::{self, Begin, TurnInput};
use super::client::Client;
use super::driver::{self, Parts};
use super::error::RunError;
use super::history;
use super::machine::{Machine, RequestFor, RoundRules, RoundsEnd, TurnWork};
use super::model_calls::{request_options, ModelCalls};
use super::opening;
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

    /// A model turn: the conversation rebuilt, model calls in rounds with Cursor's tools, then
    /// the turn stored and a new checkpoint sent.
    async fn turn(
        &mut self,
        req: Box<pb::AgentRunRequest>,
        mut input: TurnInput,
    ) -> Result<(), RunError> {
        // Steering from now on joins this turn's first (or next) model call.
        self.client.steering.open_turn();
        let (opened, work) = self.open_turn(&req, &mut input).await?;
        let prev = PriorCheckpoint {
            state: &opened.prev_state,
            wire: &opened.prev_wire,
            todos: &opened.known_todos,
        };
        let (end, mut work) = self.model_rounds(&req, &opened, work).await;
        match end {
            RoundsEnd::Done => {}
            RoundsEnd::Canceled { store } => {
                let done = work.done(None, None);
                let mut storing = self.storing();
                return Err(storing.canceled(store, &req, prev, done).await);
            }
            RoundsEnd::Failed { error, ending } => {
                debug!(
                    retriable = ending.retry,
                    "the turn's model rounds failed: {error}"
                );
                return Err(error);
            }
        }
        // Steers carried to the next turn, and our notes that came after the last model call.
        let mut carried = self.client.take_carried().await?;
        carried.extend(self.client.steering.take_late());
        for text in carried {
            work.steps.push(StepRecord::UserContext { text });
        }
        let transcript = transcript::turn_lines(&work.user.text, &work.steps);
        let done = work.done(input.plan_id.take(), opened.summary.clone());
        self.storing().write_turn(&req, prev, done).await?;
        // The turn has ended and is stored: now, and only now, it joins Cursor's transcript.
        let folder = opening::transcripts_folder(opened.request_context.as_ref());
        store::append_transcript(&self.run, &req, folder, transcript).await;
        self.turn_ended().await
    }

    /// The turn's opening: its context and blobs, the history rebuilt (and compacted when it
    /// would not fit), its todos, tools and first messages.
    async fn open_turn(
        &mut self,
        req: &pb::AgentRunRequest,
        input: &mut TurnInput,
    ) -> Result<(OpenedTurn, TurnWork), RunError> {
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
        Ok((opened, work))
    }

    /// The turn's model calls, in rounds (see [`Machine`]), driven to their end. Returns how
    /// they ended and what the turn did.
    async fn model_rounds(
        &mut self,
        req: &pb::AgentRunRequest,
        opened: &OpenedTurn,
        work: TurnWork,
    ) -> (RoundsEnd, TurnWork) {
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
        (end, machine.into_work())
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
            return self.turn_ended().await;
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
            .await?;
        self.turn_ended().await
    }
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
