//! Transport adapters: HTTP/2 bidi `Run`, and HTTP/1.1 `RunSSE` + `BidiAppend`. They decode
//! Connect frames into `AgentClientMessage`s, decide whether a run is ours (by the model in its
//! first message), and either feed our run state machine or relay the request upstream with
//! every byte we peeked at replayed.

mod bidi;
mod body;
mod pairing;
mod pins;
mod routing;
mod run;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::agent::subagents::ParentLink;
use crate::agent::{model, Agent};
use crate::connect::{Code, ConnectError, Encoding, FrameDecoder, Limits};
use crate::http::{full, Body, RequestContext};
use crate::proto::agent::v1 as pb;
use crate::upstream::Upstream;

pub use pins::{PinStore, PINS_FILE};
pub use routing::{Decision, RoutingTable};

pub const RUN_PATH: &str = "/agent.v1.AgentService/Run";
pub const RUN_SSE_PATH: &str = "/agent.v1.AgentService/RunSSE";
pub const BIDI_APPEND_PATH: &str = "/aiserver.v1.BidiService/BidiAppend";

/// Which agent transport a request is for (the router's decision, from its path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentRpc {
    /// HTTP/2 bidi `Run`.
    Run,
    /// HTTP/1.1 `RunSSE`: the server half of a run.
    RunSse,
    /// HTTP/1.1 `BidiAppend`: the client half of a `RunSSE` run.
    BidiAppend,
}

/// The agent transport `path` is, if any (exact matches only).
pub fn classify(path: &str) -> Option<AgentRpc> {
    match path {
        RUN_PATH => Some(AgentRpc::Run),
        RUN_SSE_PATH => Some(AgentRpc::RunSse),
        BIDI_APPEND_PATH => Some(AgentRpc::BidiAppend),
        _ => None,
    }
}

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
    inner: Arc<Inner>,
}

struct Inner {
    agent: Agent,
    upstream: Upstream,
    routes: RoutingTable,
    /// Conversation pins that outlive the process (resumes name no model).
    pins: PinStore,
    bidi: pairing::Registry,
    limits: Limits,
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
                bidi: pairing::Registry::default(),
                limits,
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

    /// Serve one request for `rpc`, as the router classified it.
    pub async fn handle(
        &self,
        rpc: AgentRpc,
        ctx: RequestContext,
        req: Request<Incoming>,
    ) -> Response<Body> {
        match rpc {
            AgentRpc::Run => run::handle(self, ctx, req).await,
            AgentRpc::RunSse => bidi::run_sse(self, ctx, req).await,
            AgentRpc::BidiAppend => bidi::append(self, ctx, req).await,
        }
    }

    /// Ours or Cursor's, for a run's first client message; pins the answer. A run naming one
    /// of our models is ours, whatever any pin says. One that names no model (a resume)
    /// follows its conversation's pin, kept across restarts; without one it is refused with an
    /// error that says why, never relayed on a guess.
    fn decide(
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

    fn upstream(&self) -> &Upstream {
        &self.inner.upstream
    }

    /// The schema check on one client message of one of our runs (`wire`, an encoded
    /// `AgentClientMessage`): what this build does not know goes to the status registry (and
    /// the log, once per kind). Returns why the run must end when the message carries a branch
    /// the run cannot act on: a conversation action or an exec result it does not know would
    /// otherwise be dropped silently, or leave the run waiting for an answer that never comes.
    fn inspect_client(&self, wire: &[u8], client_version: Option<&str>) -> Option<String> {
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

/// A run that names no model (a resume) runs on the model its conversation is pinned to.
fn with_pinned_model(mut run: pb::AgentRunRequest, decision: &Decision) -> pb::AgentRunRequest {
    if let Decision::Ours { model_id } = decision {
        if model::requested_model_id(&run).is_none() {
            run.requested_model
                .get_or_insert_with(Default::default)
                .model_id = model_id.clone();
        }
    }
    run
}

/// `x-request-id`, the key that pairs RunSSE with its appends.
/// What a client request carries that must never show: its `authorization` bearer token (the
/// user's Cursor session), for the run's scrubber.
fn client_secrets(headers: &HeaderMap) -> Vec<crate::secret::Secret> {
    headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.split_once(' ').map_or(v, |(_, token)| token).trim())
        .map(crate::secret::Secret::new)
        .collect()
}

/// What the client's HTTP request says about the run it starts, beyond its message.
#[derive(Debug, Default)]
struct Caller {
    secrets: Vec<crate::secret::Secret>,
    parent: ParentLink,
}

impl Caller {
    fn of(headers: &HeaderMap) -> Caller {
        Caller {
            secrets: client_secrets(headers),
            parent: parent_link(headers),
        }
    }

    /// `r` as the run's first request, with what the headers said.
    fn run_request(self, r: crate::agent::RunRequest) -> crate::agent::RunRequest {
        crate::agent::RunRequest {
            client_secrets: self.secrets,
            parent: self.parent,
            ..r
        }
    }
}

/// `x-parent-request-id` and `x-parent-agent-tool-call-id`: the parent run and subagent call a
/// child run belongs to, as far as this request says (bounded: only compared, never stored
/// beyond the run).
fn parent_link(headers: &HeaderMap) -> ParentLink {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    ParentLink::new(
        value("x-parent-request-id"),
        value("x-parent-agent-tool-call-id"),
    )
}

fn request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// Reads a streaming request body until its first Connect frame, keeping every byte read so
/// the request can be replayed upstream unchanged.
struct Peek {
    decoder: FrameDecoder,
    consumed: BytesMut,
}

impl Peek {
    fn new(encoding: Encoding, limits: Limits) -> Self {
        Peek {
            decoder: FrameDecoder::new(crate::connect::StreamKind::Request, encoding, limits),
            consumed: BytesMut::new(),
        }
    }

    /// The next message frame; `Ok(None)` when the body ended first.
    async fn next(
        &mut self,
        body: &mut Incoming,
        keep: bool,
    ) -> Result<Option<Bytes>, ConnectError> {
        use crate::connect::Frame;
        loop {
            match self.decoder.next_frame() {
                Ok(Some(Frame::Message(m))) => return Ok(Some(m)),
                Ok(Some(Frame::End(_))) => {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "end-of-stream frame in a request",
                    ))
                }
                Ok(None) => {}
                Err(e) => return Err(ConnectError::new(e.code(), e.to_string())),
            }
            match body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("client request body failed: {e}"),
                    ))
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if keep {
                            self.consumed.extend_from_slice(&data);
                        }
                        self.decoder.feed(data);
                    }
                }
            }
        }
    }
}

/// After refusing an oversized body, at most this much more of it is read and dropped, for at
/// most [`DRAIN_TIME`]: an HTTP/1.1 client still sending it then reads our error instead of a
/// reset connection (closing with unread input makes the kernel answer with a reset).
const DRAIN_BYTES: usize = 8 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads a whole unary body, bounded.
async fn read_bounded(mut body: Incoming, max: usize) -> Result<Bytes, ConnectError> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("request body unreadable: {e}"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing a unary Connect body carries
        };
        if buf.len() + data.len() > max {
            drain(body).await;
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("request body larger than {max} bytes"),
            ));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// Read and drop the rest of `body`, bounded by [`DRAIN_BYTES`] and [`DRAIN_TIME`].
async fn drain(mut body: Incoming) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut dropped = 0;
        while dropped < DRAIN_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => dropped += frame.data_ref().map_or(0, Bytes::len),
                _ => break,
            }
        }
    })
    .await;
}

/// A Connect error as an HTTP response (for unary calls and for failures before streaming).
fn error_response(err: &ConnectError) -> Response<Body> {
    let mut resp = Response::new(full(err.to_unary_json()));
    *resp.status_mut() = http::StatusCode::from_u16(err.http_status())
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// How long a RunSSE on a request id whose run of ours ended waits for a new run's append 0.
const DECIDE_WAIT: Duration = Duration::from_secs(2);
/// How long a run waits for what decides whose it is (a `Run`'s first frame, a RunSSE's or an
/// append's append 0) while its client keeps the request open: the idle limit of a run. Never
/// a reason to relay: past it the request ends with an error.
const UNDECIDED_WAIT: Duration = Duration::from_secs(600);

/// The error for a run whose deciding message never came.
fn never_decided(what: &str) -> ConnectError {
    ConnectError::new(
        Code::DeadlineExceeded,
        format!(
            "cursor-byok: {what} within {} s, so nothing says whether this run is on your own              model or on Cursor's; it was sent nowhere. Send the message again.",
            UNDECIDED_WAIT.as_secs()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the headers say about a run: the bearer token for the scrubber (never the
    /// scheme), and the parent call a child names — blank or oversized values are ignored.
    #[test]
    fn the_caller_is_read_from_the_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer tok-123".parse().unwrap(),
        );
        h.insert(
            "x-parent-agent-tool-call-id",
            " call_t#s1 ".parse().unwrap(),
        );
        let c = Caller::of(&h);
        assert_eq!(c.parent.tool_call_id.as_deref(), Some("call_t#s1"));
        assert_eq!(c.secrets.len(), 1);
        assert_eq!(c.secrets[0].expose(), "tok-123");
        let r = c.run_request(crate::agent::RunRequest::default());
        assert_eq!(r.parent.tool_call_id.as_deref(), Some("call_t#s1"));
        h.insert("x-parent-agent-tool-call-id", " ".parse().unwrap());
        assert_eq!(Caller::of(&h).parent.tool_call_id, None);
        let long = "x".repeat(513);
        h.insert("x-parent-agent-tool-call-id", long.parse().unwrap());
        assert_eq!(Caller::of(&h).parent.tool_call_id, None);
    }

    /// The two parent headers may come on different requests of one child run: merged, the
    /// first value of each kept.
    #[test]
    fn parent_headers_from_different_requests_are_merged() {
        let mut sse = HeaderMap::new();
        sse.insert("x-parent-request-id", "req-parent".parse().unwrap());
        let mut append = HeaderMap::new();
        append.insert("x-parent-agent-tool-call-id", "call_t".parse().unwrap());
        append.insert("x-parent-request-id", "req-other".parse().unwrap());
        let mut link = parent_link(&sse);
        assert_eq!(link.tool_call_id, None);
        assert!(link.merge(&parent_link(&append)), "the call id is new");
        assert_eq!(link.request_id.as_deref(), Some("req-parent"));
        assert_eq!(link.tool_call_id.as_deref(), Some("call_t"));
        assert!(
            !link.merge(&parent_link(&append)),
            "nothing new the second time"
        );
    }
}
