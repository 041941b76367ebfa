//! The agent's HTTP face, [`AgentTransports`]: what every transport shares (the agent, the
//! upstream, the routing pins, the HTTP/1.1 pairing, the frame limits), the decision on a
//! run's first message, and the schema check on each client message. Below the transports.

use std::sync::Arc;

use super::inference_ids::InferenceIds;
use super::pairing::Pairings;
use super::pins::PinStore;
use super::routing::{Decision, RoutingTable};
use crate::agent::{model, Agent};
use crate::connect::{Code, ConnectError, Limits};
use crate::proto::agent::v1 as pb;
use crate::upstream::Upstream;

/// See [`AgentTransports::pairing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pairing {
    pub requests: usize,
    pub held_append_bytes: usize,
    pub backlog_bytes: usize,
}

/// The agent's HTTP face. Cheap to clone.
#[derive(Clone)]
pub struct AgentTransports {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    agent: Agent,
    upstream: Upstream,
    pub(super) routes: RoutingTable,
    /// Conversation pins that outlive the process (resumes name no model).
    pins: PinStore,
    pub(super) bidi: Pairings,
    pub(super) limits: Limits,
    /// Request ids of `RunInferenceSSE` / `RunInferencePoll` streams (their appends are not
    /// agent messages).
    pub(super) inference: InferenceIds,
}

impl AgentTransports {
    pub fn new(agent: Agent, upstream: Upstream) -> Self {
        let limits = Limits {
            max_frame_bytes: agent.config().limits.max_frame_bytes,
            max_decompressed_bytes: agent.config().limits.max_decompressed_bytes,
        };
        let pins = PinStore::open(&agent.config().data_dir());
        AgentTransports {
            inner: Arc::new(Inner {
                agent,
                upstream,
                routes: RoutingTable::default(),
                pins,
                bidi: Pairings::default(),
                limits,
                inference: InferenceIds::default(),
            }),
        }
    }

    pub fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    /// What the HTTP/1.1 transport holds right now: the request ids it pairs, the bytes of
    /// appends waiting for their turn and of run output waiting for a reader.
    pub fn pairing(&self) -> Pairing {
        let bidi = &self.inner.bidi;
        Pairing {
            requests: bidi.len(),
            held_append_bytes: bidi.held_bytes(),
            backlog_bytes: bidi.backlog_bytes(),
        }
    }

    /// Ours or Cursor's, for a run's first client message; pins the answer. A run naming one
    /// of our models is ours, whatever any pin says. One that names no model (a resume)
    /// follows its conversation's pin, kept across restarts; without one it is refused with an
    /// error that says why, never relayed on a guess.
    pub(super) fn decide(
        &self,
        request_id: &str,
        first: &pb::AgentClientMessage,
    ) -> Result<Decision, ConnectError> {
        use pb::agent_client_message::Message as In;
        let routes = &self.inner.routes;
        let (model_id, conversation, resume) = match &first.message {
            Some(In::RunRequest(r)) => (
                model::requested_model_id(r).map(str::to_string),
                r.conversation_id.clone().unwrap_or_default(),
                matches!(
                    r.action.as_ref().and_then(|a| a.action.as_ref()),
                    Some(pb::conversation_action::Action::ResumeAction(_))
                ),
            ),
            Some(In::PrewarmRequest(p)) => (
                model::prewarm_model_id(p).map(str::to_string),
                p.conversation_id.clone().unwrap_or_default(),
                false,
            ),
            _ => (None, String::new(), false),
        };
        let pinned = || {
            routes
                .conversation(&conversation)
                .or_else(|| self.inner.pins.get(&conversation))
        };
        let decision = match model_id {
            Some(id) if self.inner.agent.is_our_model(&id) => Decision::Ours { model_id: id },
            Some(_) if !resume => Decision::Relay,
            // A resume that names one of Cursor's models follows its pin, else it is Cursor's.
            Some(_) => pinned().unwrap_or(Decision::Relay),
            // No model at all: only the conversation's pin can say.
            None => match pinned() {
                Some(d) => d,
                None => {
                    tracing::warn!(
                        request_id,
                        conversation,
                        "agent run names no model and its conversation has no pin: refused"
                    );
                    return Err(undecidable(&conversation));
                }
            },
        };
        routes.pin_request(request_id, decision.clone());
        routes.pin_conversation(&conversation, decision.clone());
        self.inner.pins.pin(&conversation, &decision);
        tracing::debug!(request_id, ?decision, "agent run routed");
        Ok(decision)
    }

    pub(super) fn upstream(&self) -> &Upstream {
        &self.inner.upstream
    }

    /// The schema check on one client message of one of our runs (`wire`, an encoded
    /// `AgentClientMessage`): what this build does not know goes to the status registry (and
    /// the log, once per kind). Returns why the run must end when the message carries a branch
    /// the run cannot act on: a conversation action or an exec result it does not know would
    /// otherwise be dropped silently, or leave the run waiting for an answer that never comes.
    pub(super) fn inspect_client(
        &self,
        wire: &[u8],
        client_version: Option<&str>,
    ) -> Option<String> {
        let report = crate::proto::inspect::schema().check(AGENT_CLIENT_MESSAGE, wire);
        let status = self.agent().status();
        status.unknown_schema("agent run", client_version, &report);
        if let Some(capture) = status.capture() {
            capture.message(
                crate::capture::Direction::FromClient,
                "agent run",
                AGENT_CLIENT_MESSAGE,
                wire,
                client_version,
                Some(&report),
            );
        }
        let (what, u) = UNHANDLED
            .iter()
            .find_map(|(at, what)| report.branch_at(at).map(|u| (what, u)))?;
        Some(format!(
            "{what} this cursor-byok {} does not know ({}); update cursor-byok, and if the \
             newest release does not know it either, report it with a capture \
             (`cursor-byok run --capture FILE`)",
            env!("CARGO_PKG_VERSION"),
            u.key,
        ))
    }
}

const AGENT_CLIENT_MESSAGE: &str = "agent.v1.AgentClientMessage";

/// The error for a run nothing decides: neither its model nor a pin of its conversation says
/// whether it is the user's, so it goes nowhere.
fn undecidable(conversation: &str) -> ConnectError {
    use crate::proto::aiserver::v1 as aiserver;
    let what = if conversation.is_empty() {
        "this agent run names no model and no conversation".to_string()
    } else {
        format!(
            "this agent run resumes conversation {conversation} without naming a model, and              cursor-byok has no record of which model that conversation is on"
        )
    };
    let message = format!(
        "cursor-byok: {what}, so it was sent neither to your provider nor to Cursor. Choose the          model again in Cursor's model picker (or start a new conversation) and send the          message again."
    );
    let details = aiserver::ErrorDetails {
        error: aiserver::error_details::Error::CustomMessage as i32,
        details: Some(aiserver::CustomErrorDetails {
            title: "cursor-byok cannot tell whose run this is".to_string(),
            detail: message.clone(),
            is_retryable: Some(false),
            ..Default::default()
        }),
        is_expected: Some(true),
    };
    ConnectError::new(Code::FailedPrecondition, message)
        .with_detail(crate::connect::ErrorDetail::error_details(&details))
}

/// Where an unknown oneof branch ends the run, and what to call it.
const UNHANDLED: [(&str, &str); 3] = [
    (
        "AgentClientMessage.run_request.action",
        "a conversation action",
    ),
    (
        "AgentClientMessage.conversation_action",
        "a conversation action",
    ),
    ("AgentClientMessage.exec_client_message", "an exec result"),
];
