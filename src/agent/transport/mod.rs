//! Transport adapters: HTTP/2 bidi `Run`, and HTTP/1.1 `RunSSE` + `BidiAppend`. They decode
//! Connect frames into `AgentClientMessage`s, decide whether a run is ours (by the model in its
//! first message), and either feed our run state machine or relay the request upstream with
//! every byte we peeked at replayed.
//!
//! The files use each other one way: `face` (what every transport shares), `caller`, `body`
//! and `routing` sit below the transports `run` (HTTP/2) and `bidi` (HTTP/1.1), and this
//! file dispatches to them.

mod bidi;
mod body;
mod caller;
mod face;
mod owner;
mod pairing;
mod pins;
mod routing;
mod run;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::http::{Body, RequestContext};

pub use face::{AgentTransports, Pairing};
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
        }
    }
}
