//! Whether the user has seen part of the turn: after that, a failure must not let Cursor's
//! client run the turn again by itself (see [`RunError::ending`](super::error::RunError::ending)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::agent::RunOutput;
use crate::proto::agent::v1 as pb;

/// Set once the run sent anything the user sees or that acts on their machine; shared by every
/// clone of the run's outbox.
#[derive(Debug, Clone, Default)]
pub(super) struct Shown(Arc<AtomicBool>);

impl Shown {
    /// Notes `o` as it goes out.
    pub(super) fn note(&self, o: &RunOutput) {
        if o.message().is_some_and(is_visible) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    pub(super) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Text, thinking, a tool call, a question to the user, or an exec on the user's machine
/// (asking for the request context is neither seen nor a side effect). Heartbeats, token
/// counts, step markers, blob writes and checkpoints are bookkeeping.
pub(super) fn is_visible(m: &pb::AgentServerMessage) -> bool {
    use pb::agent_server_message::Message as Server;
    use pb::exec_server_message::Message as Exec;
    use pb::interaction_update::Message as Update;
    match &m.message {
        Some(Server::InteractionUpdate(u)) => matches!(
            u.message,
            Some(
                Update::TextDelta(_)
                    | Update::ToolCallStarted(_)
                    | Update::ToolCallCompleted(_)
                    | Update::ThinkingDelta(_)
                    | Update::ThinkingCompleted(_)
                    | Update::PartialToolCall(_)
                    | Update::Summary(_)
                    | Update::SummaryStarted(_)
                    | Update::SummaryCompleted(_)
                    | Update::ShellOutputDelta(_)
                    | Update::ToolCallDelta(_)
            )
        ),
        Some(Server::ExecServerMessage(e)) => {
            !matches!(e.message, Some(Exec::RequestContextArgs(_)))
        }
        Some(Server::InteractionQuery(_)) => true,
        Some(
            Server::ConversationCheckpointUpdate(_)
            | Server::KvServerMessage(_)
            | Server::ExecServerControlMessage(_),
        )
        | None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::agent_server_message::Message as Server;
    use pb::interaction_update::Message as Update;

    fn update(u: Update) -> RunOutput {
        RunOutput::Message(Box::new(pb::AgentServerMessage {
            message: Some(Server::InteractionUpdate(pb::InteractionUpdate {
                message: Some(u),
                ..Default::default()
            })),
            ..Default::default()
        }))
    }

    fn exec(e: pb::exec_server_message::Message) -> RunOutput {
        RunOutput::Message(Box::new(pb::AgentServerMessage {
            message: Some(Server::ExecServerMessage(pb::ExecServerMessage {
                message: Some(e),
                ..Default::default()
            })),
            ..Default::default()
        }))
    }

    #[test]
    fn bookkeeping_is_not_shown_text_and_tools_are() {
        use pb::exec_server_message::Message as Exec;
        let shown = Shown::default();
        shown.note(&update(Update::Heartbeat(Default::default())));
        shown.note(&update(Update::TokenDelta(Default::default())));
        shown.note(&update(Update::StepStarted(Default::default())));
        shown.note(&exec(Exec::RequestContextArgs(Default::default())));
        assert!(!shown.get());
        let copy = shown.clone();
        copy.note(&update(Update::TextDelta(Default::default())));
        assert!(shown.get());

        let tool = Shown::default();
        tool.note(&exec(Exec::ReadArgs(Default::default())));
        assert!(tool.get());
    }
}
