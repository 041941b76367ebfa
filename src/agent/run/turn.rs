//! One user turn: rebuild the history from the checkpoint, call the model in rounds with
//! Cursor's tools, then write the turn back as blobs and a new checkpoint.

use tracing::{debug, warn};

use super::{RunError, RunState};
use crate::agent::messages as msg;
use crate::agent::state::{
    self, HistoryBuilder, HistoryOptions, RebuiltHistory, StepRecord, TurnRecord,
};
use crate::agent::{context, prompt, tools};
use crate::proto::agent::v1 as pb;
use crate::provider::{AssistantPart, Message, ProviderRequest};

/// The transcript handed to the model for a summary is cut to this many characters.
const SUMMARY_MAX_CHARS: usize = 400_000;

/// The user's turn as the run request gives it.
struct TurnInput {
    user: Option<pb::UserMessage>,
    request_context: Option<pb::RequestContext>,
}

fn turn_input(req: &pb::AgentRunRequest) -> TurnInput {
    use pb::conversation_action::Action;
    let (user, request_context) = match req.action.as_ref().and_then(|a| a.action.as_ref()) {
        Some(Action::UserMessageAction(a)) => (a.user_message.clone(), a.request_context.clone()),
        Some(Action::ResumeAction(a)) => (None, a.request_context.clone()),
        Some(Action::StartPlanAction(a)) => (a.user_message.clone(), a.request_context.clone()),
        _ => (None, None),
    };
    TurnInput {
        user,
        request_context,
    }
}

/// Where relative paths resolve: the first workspace, else the client's working directory.
fn workspace_root(ctx: Option<&pb::RequestContext>) -> Option<String> {
    let env = ctx?.env.as_ref()?;
    env.workspace_paths
        .first()
        .cloned()
        .or_else(|| env.process_working_directory.clone())
        .filter(|p| !p.is_empty())
}

impl RunState {
    pub(super) async fn turn(&mut self, req: Box<pb::AgentRunRequest>) -> Result<(), RunError> {
        let input = turn_input(&req);
        let request_context = match input.request_context {
            Some(ctx) => Some(ctx),
            None => self.fetch_request_context().await?,
        };
        let parts = context::parts(&req);
        let blobs = self.context_blobs(&req, input.user.as_ref()).await?;
        let request_context = context::merge_parts(request_context, parts, &blobs);
        let prev_state = req.conversation_state.clone().unwrap_or_default();
        let prev_wire = wire_at(&self.run.first_wire, &[CONVERSATION_STATE]);
        let mut history = self.rebuild_history(&prev_state).await?;
        let mode = input
            .user
            .as_ref()
            .map(|u| u.mode)
            .filter(|m| *m != 0)
            .or(prev_state.mode)
            .unwrap_or(0);
        let mut tool_ctx = tools::ToolContext {
            workspace_root: workspace_root(request_context.as_ref()),
            mcp_tools: tools::merge_mcp_tools(&[
                req.mcp_tools
                    .as_ref()
                    .map_or(&[][..], |t| t.mcp_tools.as_slice()),
                request_context
                    .as_ref()
                    .map_or(&[][..], |c| c.tools.as_slice()),
            ]),
            web_fetch: request_context
                .as_ref()
                .and_then(|c| c.web_fetch_enabled)
                .unwrap_or(false),
            mode,
            command_denylist: request_context
                .as_ref()
                .map(|c| c.admin_command_denylist.clone())
                .unwrap_or_default(),
        };
        let images = self.run.model.config.supports_images;
        let user = input.user.clone().unwrap_or_else(|| pb::UserMessage {
            text: "Continue where you left off.".into(),
            ..Default::default()
        });
        let mut messages = std::mem::take(&mut history.messages);
        messages.push(prompt::user_message_with(&user, images, &blobs));

        let mut todos = history.todos.clone();
        let known_todos: Vec<(state::BlobId, pb::TodoItem)> = history
            .todo_ids
            .iter()
            .copied()
            .zip(history.todos.iter().cloned())
            .collect();
        let summary = self.compact_if_needed(&mut messages, &history).await?;
        let mut steps: Vec<StepRecord> = Vec::new();
        let mut rounds = 0u32;
        loop {
            let touched = context::touched_paths(&messages, tool_ctx.workspace_root.as_deref());
            let system = prompt::system_prompt(&prompt::PromptInputs {
                ctx: request_context.as_ref(),
                custom: req.custom_system_prompt.as_deref(),
                spec: req.system_prompt_spec.as_ref(),
                mode: tool_ctx.mode,
                touched: &touched,
            });
            let request = ProviderRequest {
                model: self.run.model.config.model.clone(),
                system,
                messages: messages.clone(),
                tools: tools::catalog(&tool_ctx),
                options: self.options(),
            };
            let call = self.model_step(request, &tool_ctx).await?;
            let step = self.step;
            let assistant = call.turn.message.clone();
            record_steps(&mut steps, &call.turn, call.thinking_ms);
            let calls: Vec<(
                String,
                String,
                serde_json::Value,
                Option<crate::provider::ProviderExtra>,
            )> = call
                .turn
                .parts()
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
                .collect();
            if !call.turn.parts().is_empty() {
                messages.push(assistant);
            }
            if calls.is_empty() {
                break;
            }
            rounds += 1;
            let results = self
                .run_tool_round(step, &calls, &mut tool_ctx, &mut todos)
                .await?;
            for ((id, name, arguments, extra), outcome) in calls.into_iter().zip(results) {
                messages.push(Message::ToolResult {
                    call_id: id.clone(),
                    name: name.clone(),
                    content: outcome.content.clone(),
                    is_error: outcome.is_error,
                });
                steps.push(StepRecord::ToolCall {
                    tool_call: outcome.tool_call,
                    call_id: id,
                    name,
                    arguments,
                    result: outcome.content,
                    is_error: outcome.is_error,
                    extra,
                });
            }
            if rounds >= self.run.settings.max_tool_rounds {
                let note = format!(
                    "\n\n(Stopped after {rounds} tool rounds, the limit set by `agent.max_tool_rounds`. Send a message to continue.)"
                );
                self.out.send(msg::notice(note.clone())).await?;
                steps.push(StepRecord::Assistant { text: note });
                break;
            }
        }
        self.write_turn(
            &req,
            Previous {
                state: &prev_state,
                wire: &prev_wire,
                todos: &known_todos,
            },
            user,
            steps,
            &todos,
            tool_ctx.mode,
            summary,
        )
        .await?;
        self.out.send(msg::turn_ended(&self.usage)).await
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
            for (id, data) in self.fetch_blobs(&ask).await? {
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
            for (id, data) in self.fetch_blobs(&ask).await? {
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
        self.out.send(msg::summary_started()).await?;
        let request = ProviderRequest {
            model: cfg.model.clone(),
            system: "You summarise coding-agent conversations so the work can continue. Keep file paths, decisions, open tasks, errors and the user's requests; be concise.".into(),
            messages: state::summary_prompt(&plan.older, SUMMARY_MAX_CHARS),
            tools: Vec::new(),
            options: crate::provider::RequestOptions {
                max_output_tokens: Some(4_000.min(cfg.max_output_tokens)),
                ..Default::default()
            },
        };
        let opened = self.open(request).await?;
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
            self.record_call(u, price);
        }
        if let Some(e) = turn.error {
            warn!("summary failed: {e}");
            self.out.send(msg::summary_completed(true)).await?;
            return Err(self.provider_error(e));
        }
        let text = turn.text();
        self.out.send(msg::summary(text.clone())).await?;
        self.out.send(msg::summary_completed(false)).await?;
        let mut compacted = vec![state::summary_message(&text)];
        compacted.extend(plan.keep);
        *messages = compacted;
        Ok(Some((text, through)))
    }

    /// Store the turn's blobs, wait for every ack, then publish the checkpoint.
    #[allow(clippy::too_many_arguments)]
    async fn write_turn(
        &mut self,
        req: &pb::AgentRunRequest,
        prev: Previous<'_>,
        user: pb::UserMessage,
        steps: Vec<StepRecord>,
        todos: &[pb::TodoItem],
        mode: i32,
        summary: Option<(String, state::BlobId)>,
    ) -> Result<(), RunError> {
        let user_wire = user_message_wire(&self.run.first_wire, &user);
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
        let used = self.last_call.input.saturating_add(self.last_call.output);
        let mut checkpoint = state::build_checkpoint(
            prev.state,
            &encoded.turn_id,
            todos,
            u32::try_from(used).unwrap_or(u32::MAX),
            self.run.model.config.context_window,
            (mode != 0).then_some(mode),
        );
        checkpoint.keep_unchanged_todos(todos, prev.todos);
        if let Some((text, through)) = summary {
            checkpoint.set_summary(&text, &through);
        }
        let mut blobs = encoded.blobs;
        blobs.extend(checkpoint.blobs.iter().cloned());
        self.store_blobs(&blobs).await?;
        self.run.cache.put_many(blobs).await;
        let wire = checkpoint.encode_over(prev.state, prev.wire);
        self.out
            .send_output(msg::checkpoint_encoded(checkpoint.state, &wire))
            .await
    }
}

/// The checkpoint the turn started from, as decoded and as received, with its todos.
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
