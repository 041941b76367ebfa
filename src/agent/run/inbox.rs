//! The run's inbox: client messages after the first. A pump task answers heartbeats at once and
//! turns a cancel into cancellation; everything else reaches the run as a [`ClientEvent`].

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::action;
use super::outbox::Outbox;
use super::pending::CancelResolutions;
use crate::agent::messages as msg;
use crate::proto::agent::v1 as pb;

/// Client messages the run itself consumes (the inbox pump handles the rest).
#[derive(Debug)]
pub(super) enum ClientEvent {
    Exec(Box<pb::ExecClientMessage>),
    ExecControl(pb::ExecClientControlMessage),
    Kv(pb::KvClientMessage),
    Interaction(pb::InteractionResponse),
    /// Steering: context to add at the next model call of the running turn.
    Inject(Box<pb::InjectContextAction>),
    /// The user pressed "move to background" on a running command.
    BackgroundShell(pb::BackgroundShellAction),
    /// Background tasks finished: the model is told.
    Completion(Box<pb::BackgroundTaskCompletionAction>),
    /// The user stopped a subagent (by its id).
    CancelSubagent(String),
    /// The user moved a running subagent call (by its tool call id) to the background.
    BackgroundSubagent(String),
}

/// Answers client heartbeats, turns a cancel action into cancellation, forwards the rest.
pub(super) async fn pump_inbox(
    mut inbox: mpsc::Receiver<Box<pb::AgentClientMessage>>,
    events: mpsc::Sender<ClientEvent>,
    out: Outbox,
    cancel: CancellationToken,
    done: CancellationToken,
    resolutions: CancelResolutions,
) {
    use pb::agent_client_message::Message as In;
    loop {
        let m = tokio::select! {
            _ = done.cancelled() => return,
            m = inbox.recv() => m,
        };
        let Some(m) = m else {
            debug!("client finished sending");
            return;
        };
        let event = match m.message {
            Some(In::ClientHeartbeat(_)) => {
                let _ = out.send(msg::heartbeat()).await;
                continue;
            }
            Some(In::ConversationAction(a)) => {
                use pb::conversation_action::Action;
                match a.action {
                    Some(Action::CancelAction(c)) => {
                        debug!("cancel requested by the client");
                        resolutions.set(c.interrupted_pending_tool_call_resolutions);
                        cancel.cancel();
                        continue;
                    }
                    Some(Action::InjectContextAction(i)) => ClientEvent::Inject(Box::new(i)),
                    Some(Action::BackgroundShellAction(b)) => ClientEvent::BackgroundShell(b),
                    Some(Action::BackgroundTaskCompletionAction(c)) => {
                        ClientEvent::Completion(Box::new(c))
                    }
                    Some(Action::CancelSubagentAction(c)) => {
                        ClientEvent::CancelSubagent(c.subagent_id)
                    }
                    Some(Action::BackgroundSubagentAction(b)) => {
                        ClientEvent::BackgroundSubagent(b.tool_call_id)
                    }
                    Some(other) => {
                        // Only a cancel, steering, background work and subagent actions make
                        // sense on a running run.
                        warn!(
                            action = action::branch_name(&other),
                            "conversation action on a running run is not acted on"
                        );
                        continue;
                    }
                    None => continue,
                }
            }
            Some(In::ExecClientMessage(e)) => ClientEvent::Exec(Box::new(e)),
            Some(In::ExecClientControlMessage(c)) => ClientEvent::ExecControl(c),
            Some(In::KvClientMessage(k)) => ClientEvent::Kv(k),
            Some(In::InteractionResponse(r)) => ClientEvent::Interaction(r),
            Some(In::RunRequest(_)) | Some(In::PrewarmRequest(_)) => {
                debug!("ignoring a repeated run/prewarm request");
                continue;
            }
            None => {
                // A branch this build does not know (or an empty message): the transport's
                // schema check has reported it (status page, one warning per kind).
                debug!("client message with no branch this build knows: reported, not acted on");
                continue;
            }
        };
        tokio::select! {
            _ = done.cancelled() => return,
            sent = events.send(event) => if sent.is_err() { return },
        }
    }
}
