//! Transport adapters: HTTP/2 bidi `Run`, HTTP/1.1 `RunSSE` + `BidiAppend`, and the agent
//! WebSocket (`websocket`); and the door of Cursor's local agent loop (`inference`), refused
//! for our models. They decode
//! Connect frames into `AgentClientMessage`s, decide whether a run is ours (by the model in its
//! first message), and either feed our run state machine or relay the request upstream with
//! every byte we peeked at replayed.
//!
//! Cmd+K's calls (`cmdk`) are served here too: their HTTP side, on `agent::cmdk`.
//!
//! The files use each other one way: `face` (what every transport shares), `caller`, `body`
//! (over `deltas`) and `routing` sit below the transports `run` (HTTP/2), `bidi` (HTTP/1.1) and
//! `cmdk`, and this file dispatches to them.

mod bidi;
mod body;
mod caller;
mod cmdk;
mod deltas;
mod face;
mod inference;
mod inference_ids;
mod owner;
mod pairing;
mod pins;
pub(crate) mod recent;
mod routing;
mod run;
mod streams;
mod websocket;
mod ws_frames;
mod ws_relay;
mod ws_upstream;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::http::{Body, RequestContext};
use crate::upstream::Link;

pub use cmdk::{classify as classify_cmd_k, CmdKRpc};
pub use face::{AgentTransports, Pairing};
pub(crate) use inference::{
    INFERENCE_STREAM_PATH, RUN_INFERENCE_PATH, RUN_INFERENCE_POLL_PATH, RUN_INFERENCE_SSE_PATH,
};
pub use pins::{PinStore, PINS_FILE};
pub use routing::{Decision, RoutingTable};
pub(crate) use websocket::WEBSOCKET_PATH;

pub(crate) const RUN_PATH: &str = "/agent.v1.AgentService/Run";
pub(crate) const RUN_SSE_PATH: &str = "/agent.v1.AgentService/RunSSE";
pub(crate) const BIDI_APPEND_PATH: &str = "/aiserver.v1.BidiService/BidiAppend";

/// Which agent transport a request is for (the router's decision, from its path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentRpc {
    /// HTTP/2 bidi `Run`.
    Run,
    /// HTTP/1.1 `RunSSE`: the server half of a run.
    RunSse,
    /// HTTP/1.1 `BidiAppend`: the client half of a `RunSSE` run (or of a `RunInferenceSSE`
    /// stream, by its request id).
    BidiAppend,
    /// `aiserver.v1.InferenceService/RunInference` (HTTP/2 bidi): Cursor's local agent loop;
    /// ours refused, Cursor's relayed.
    RunInference,
    /// `RunInferenceSSE`: the HTTP/1.1 server half of `RunInference`.
    RunInferenceSse,
    /// `RunInferencePoll`: its HTTP/1.1 polling half.
    RunInferencePoll,
    /// `aiserver.v1.InferenceService/Stream`: one model call of Cursor's local agent loop;
    /// ours refused, Cursor's relayed.
    InferenceStream,
    /// `GET /agent/v1/run`, upgraded: the agent WebSocket.
    WebSocket,
}

/// The agent transport `path` is, if any (exact matches only).
pub fn classify(path: &str) -> Option<AgentRpc> {
    match path {
        RUN_PATH => Some(AgentRpc::Run),
        RUN_SSE_PATH => Some(AgentRpc::RunSse),
        BIDI_APPEND_PATH => Some(AgentRpc::BidiAppend),
        RUN_INFERENCE_PATH => Some(AgentRpc::RunInference),
        RUN_INFERENCE_SSE_PATH => Some(AgentRpc::RunInferenceSse),
        RUN_INFERENCE_POLL_PATH => Some(AgentRpc::RunInferencePoll),
        INFERENCE_STREAM_PATH => Some(AgentRpc::InferenceStream),
        WEBSOCKET_PATH => Some(AgentRpc::WebSocket),
        _ => None,
    }
}

impl AgentTransports {
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
            AgentRpc::RunInference => inference::run_inference(self, ctx, req).await,
            AgentRpc::RunInferenceSse => inference::open_stream(self, ctx, req, false).await,
            AgentRpc::RunInferencePoll => inference::open_stream(self, ctx, req, true).await,
            AgentRpc::InferenceStream => inference::stream(self, ctx, req).await,
            AgentRpc::WebSocket => websocket::handle(self, ctx, req).await,
        }
    }

    /// Serve one Cmd+K request for `rpc`, as the router classified it.
    pub async fn handle_cmd_k(
        &self,
        rpc: CmdKRpc,
        ctx: RequestContext,
        req: Request<Incoming>,
    ) -> Response<Body> {
        cmdk::handle(self, rpc, ctx, req).await
    }

    /// Pass one of Cursor's own `…SSE` / `…Poll` calls upstream (over `link`, the client
    /// connection's own upstream connection, when it has one), its request id noted first so
    /// that the `BidiAppend`s on it are known to be Cursor's.
    pub async fn relay_cursor_stream(
        &self,
        link: Option<&Link>,
        ctx: RequestContext,
        req: Request<Incoming>,
    ) -> Response<Body> {
        bidi::relay_cursor_stream(self, link, ctx, req).await
    }
}

/// Whether `path` is an HTTP/1.1 server stream whose client half comes in `BidiAppend`s.
pub fn is_append_stream(path: &str) -> bool {
    path.ends_with("SSE") || path.ends_with("Poll")
}
