//! Storing a turn: its blobs written through the client and acknowledged, then the checkpoint
//! that names them; a canceled turn kept as far as it went; a user command stored as a shell
//! turn.

use tracing::{debug, warn};

use super::client::Client;
use super::error::RunError;
use super::model_calls::ModelCalls;
use super::setup::Run;
use crate::agent::messages as msg;
use crate::agent::state::{self, StepRecord, TurnRecord};
use crate::agent::tools;
use crate::proto::agent::v1 as pb;

/// What a turn stores: its record, the todos and mode it leaves, and what the checkpoint
/// registers besides.
pub(super) struct TurnDone {
    pub(super) user: pb::UserMessage,
    pub(super) steps: Vec<StepRecord>,
    pub(super) todos: Vec<pb::TodoItem>,
    pub(super) mode: i32,
    /// A Build's plan (id, path).
    pub(super) plan: Option<(String, String)>,
    /// The summary of the older turns, and the last turn it covers.
    pub(super) summary: Option<(String, state::BlobId)>,
}

/// The checkpoint the turn started from, as decoded and as received, with its todos.
#[derive(Clone, Copy)]
pub(super) struct PriorCheckpoint<'a> {
    pub(super) state: &'a pb::ConversationStateStructure,
    pub(super) wire: &'a [u8],
    pub(super) todos: &'a [(state::BlobId, pb::TodoItem)],
}

/// `AgentRunRequest.conversation_state`.
pub(super) const CONVERSATION_STATE: u32 = 1;
/// `AgentRunRequest.action`, then `ConversationAction.user_message_action` /
/// `.start_plan_action`, then their `user_message`.
const USER_MESSAGE_PATHS: [[u32; 3]; 2] = [[2, 1, 1], [2, 6, 1]];

/// The message at `path` in `wire`; empty when absent or unreadable (then nothing of it is
/// kept beyond what we decoded).
pub(super) fn wire_at(wire: &bytes::Bytes, path: &[u32]) -> bytes::Bytes {
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

/// What storing a turn uses: the run, its client, and its model calls (the size of the
/// context now).
pub(super) struct Storing<'a> {
    pub(super) run: &'a Run,
    pub(super) client: &'a mut Client,
    pub(super) model: &'a ModelCalls,
}

impl Storing<'_> {
    /// Keep what a turn the user canceled did (its pending calls closed, its cut-off answer)
    /// so the next turn and a restart see it: best effort, within a short grace, since the user
    /// asked to stop. A cancel by the transport (a bad frame, the client gone) stores nothing:
    /// nobody is there to store it. Returns the cancel.
    pub(super) async fn canceled(
        &mut self,
        by_user: bool,
        req: &pb::AgentRunRequest,
        prev: PriorCheckpoint<'_>,
        done: TurnDone,
    ) -> RunError {
        self.client.cancel_injections().await;
        if !by_user {
            return RunError::Canceled;
        }
        self.client.winding_down = true;
        if let Err(e) = self.write_turn(req, prev, done).await {
            debug!("the canceled turn was not stored: {e}");
        }
        RunError::Canceled
    }

    /// Store `extra` and the checkpoint's blobs, then send the checkpoint.
    pub(super) async fn publish(
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
    pub(super) async fn write_turn(
        &mut self,
        req: &pb::AgentRunRequest,
        prev: PriorCheckpoint<'_>,
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
        let subagent_record = subagent_record(
            prev.state,
            &steps,
            self.client.background.completions(),
            now_ms(),
        );
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
}

/// The checkpoint's record of subagent runs after this turn: its subagent calls, and the
/// background completions the client reported.
fn subagent_record(
    prev: &pb::ConversationStateStructure,
    steps: &[StepRecord],
    completions: &[pb::BackgroundTaskCompletion],
    now_ms: u64,
) -> pb::ConversationStateStructure {
    let mut record = prev.clone();
    state::record_subagents(
        &mut record,
        steps.iter().filter_map(|s| match s {
            StepRecord::ToolCall { tool_call, .. } => Some(tool_call),
            _ => None,
        }),
        now_ms,
    );
    state::record_completions(&mut record, completions, now_ms);
    record
}

/// A user command's output, from its shell tool call.
pub(super) fn shell_output(outcome: &tools::ToolOutcome) -> pb::ShellOutput {
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

/// Milliseconds since the epoch, for the checkpoint's subagent records.
fn now_ms() -> u64 {
    u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp() * 1000).unwrap_or_default()
}

/// Add the stored turn to Cursor's transcript of the conversation, in `folder` (a subagent's
/// run keeps none). A failure is logged; the turn stands.
pub(super) async fn append_transcript(
    run: &Run,
    req: &pb::AgentRunRequest,
    folder: Option<String>,
    lines: String,
) {
    let home = run.settings.transcripts_home.as_deref();
    if let (Some(home), Some(folder), Some(conversation), None) =
        (home, &folder, &req.conversation_id, &run.child)
    {
        if let Err(e) = crate::agent::transcript::append(home, folder, conversation, lines).await {
            warn!("the turn was not added to Cursor's transcript: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn user(text: &str) -> pb::UserMessage {
        pb::UserMessage {
            text: text.into(),
            ..Default::default()
        }
    }

    fn request_with(u: &pb::UserMessage) -> bytes::Bytes {
        let req = pb::AgentRunRequest {
            action: Some(pb::ConversationAction {
                action: Some(pb::conversation_action::Action::UserMessageAction(
                    pb::UserMessageAction {
                        user_message: Some(u.clone()),
                        ..Default::default()
                    },
                )),
                ..Default::default()
            }),
            ..Default::default()
        };
        req.encode_to_vec().into()
    }

    #[test]
    fn the_users_message_keeps_its_wire_form_only_when_it_is_the_one_sent() {
        let sent = user("hello");
        let wire = request_with(&sent);
        assert_eq!(
            user_message_wire(&wire, &sent).as_deref(),
            Some(&sent.encode_to_vec()[..])
        );
        assert_eq!(user_message_wire(&wire, &user("a stand-in")), None);
        assert!(wire_at(&wire, &[CONVERSATION_STATE]).is_empty());
        assert!(wire_at(&bytes::Bytes::from_static(b"\xff\xff"), &[1]).is_empty());
    }

    #[test]
    fn a_users_command_output_comes_from_its_shell_call() {
        use pb::shell_result::Result as R;
        let call = |result: Option<R>| tools::ToolOutcome {
            content: "the tool failed".into(),
            is_error: result.is_none(),
            tool_call: pb::ToolCall {
                tool: Some(pb::tool_call::Tool::ShellToolCall(pb::ShellToolCall {
                    result: Some(pb::ShellResult {
                        result,
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            },
        };
        let ok = shell_output(&call(Some(R::Success(pb::ShellSuccess {
            stdout: "out".into(),
            exit_code: 0,
            ..Default::default()
        }))));
        assert_eq!((ok.stdout.as_str(), ok.exit_code), ("out", 0));
        let none = shell_output(&call(None));
        assert_eq!(
            (none.stderr.as_str(), none.exit_code),
            ("the tool failed", -1)
        );
    }

    #[test]
    fn the_subagent_record_starts_from_the_previous_checkpoint() {
        let prev = pb::ConversationStateStructure {
            mode: Some(2),
            ..Default::default()
        };
        let record = subagent_record(&prev, &[], &[], 1_000);
        assert_eq!(record.mode, Some(2));
        assert!(record.subagent_states.is_empty());
        assert!(now_ms() > 1_600_000_000_000, "milliseconds since the epoch");
    }
}
