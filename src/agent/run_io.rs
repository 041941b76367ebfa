//! What goes into a run and what comes out of it, shared by the agent's entry point, the run and
//! the message builders.

use crate::connect::EndStream;
use crate::proto::agent::v1 as pb;

use super::subagents;

/// What a run emits: server messages, then one `End`.
#[derive(Debug)]
pub enum RunOutput {
    /// Boxed: server messages are large, and most of a run's output is small deltas.
    Message(Box<pb::AgentServerMessage>),
    /// A message and its exact encoding, which carries fields this build does not know (a
    /// checkpoint built over Cursor's): the transports send the bytes.
    Encoded(Box<pb::AgentServerMessage>, bytes::Bytes),
    End(EndStream),
}

impl RunOutput {
    /// The server message, if this is one.
    pub fn message(&self) -> Option<&pb::AgentServerMessage> {
        match self {
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => Some(m),
            RunOutput::End(_) => None,
        }
    }
}

/// A run's first request as it arrived: decoded, and the bytes it was decoded from, so what the
/// run hands back to Cursor (the checkpoint, the user message blob) keeps the fields this build
/// does not know.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub decoded: pb::AgentRunRequest,
    /// The `AgentRunRequest` exactly as received.
    pub wire: bytes::Bytes,
    /// What the client's request carried that must never show (its bearer token): scrubbed
    /// from every text that leaves the process while the run lives.
    pub client_secrets: Vec<crate::base::secret::Secret>,
    /// The parent run and subagent call this run is the child of, as far as the client's
    /// requests said so by the time it started.
    pub parent: subagents::ParentLink,
}

impl RunRequest {
    /// The run request inside `message_wire` (an encoded `AgentClientMessage`), whose decoded
    /// form is `decoded`. Bytes that do not scan fall back to our own encoding.
    pub fn from_client_message(decoded: pb::AgentRunRequest, message_wire: &bytes::Bytes) -> Self {
        /// `AgentClientMessage.run_request`.
        const RUN_REQUEST: u32 = 1;
        match crate::proto::wire::message_field(message_wire, RUN_REQUEST) {
            Ok(Some(wire)) => RunRequest {
                decoded,
                wire,
                client_secrets: Vec::new(),
                parent: Default::default(),
            },
            _ => decoded.into(),
        }
    }
}

impl From<pb::AgentRunRequest> for RunRequest {
    fn from(decoded: pb::AgentRunRequest) -> Self {
        use prost::Message as _;
        let wire = decoded.encode_to_vec().into();
        RunRequest {
            decoded,
            wire,
            client_secrets: Vec::new(),
            parent: Default::default(),
        }
    }
}
