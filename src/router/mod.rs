//! The one routing hook: every request for a Cursor host — decrypted at the CONNECT door, or
//! arriving at a direct door — goes through [`Router::handle`].
//!
//! [`route`] is the one routing decision: the relay calls it for each new HTTP/2 stream,
//! `Router::handle` for every request it is handed, and the agent transports get the RPC it
//! found. A new kind of request is a `Route` variant there and a matching arm in
//! `Router::handle`.

mod guard;

use http::{Request, Response};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::agent::side::{self, SideRpc};
use crate::agent::transport::{self, AgentRpc, AgentTransports, CmdKRpc};
use crate::cursor::{self, CursorRpc, CursorServices};
use crate::http::{boxed, Body, RequestContext};
use crate::upstream::{Link, Upstream};

/// What happens to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Stream it to the real origin and the answer back.
    Upstream,
    /// A Cursor service we adjust (model lists, server config, probes).
    Cursor(CursorRpc),
    /// An agent transport: ours or relayed, decided by the run's first message.
    Agent(AgentRpc),
    /// A call around a conversation that carries its content: answered here for ours, passed
    /// for Cursor's.
    Side(SideRpc),
    /// A Cmd+K call: ours or relayed, decided by the model its request names.
    CmdK(CmdKRpc),
    /// One of the proxy's own paths (`/__cursor-byok/…`): never forwarded; served only on the
    /// proxy listener, so here it gets a 404 saying where.
    Own,
}

/// Where a request goes, by its path alone (without the query): the request head is all
/// there is when the decision is made (the body is still unread), and the path is all of it
/// that matters. Every entry calls this, so the relay cannot disagree with the router.
pub fn route(path: &str) -> Route {
    if crate::status::is_own_path(path) {
        return Route::Own;
    }
    if let Some(rpc) = transport::classify(path) {
        return Route::Agent(rpc);
    }
    if let Some(rpc) = side::classify(path) {
        return Route::Side(rpc);
    }
    if let Some(rpc) = transport::classify_cmd_k(path) {
        return Route::CmdK(rpc);
    }
    match cursor::classify(path) {
        Some(rpc) => Route::Cursor(rpc),
        None => Route::Upstream,
    }
}

/// Every RPC path we know, each passed, served here or refused, with why: one line each,
/// `path`, `class`, the [`route`] decision (`Debug` form) and the reason. `tests/rpc_ledger.rs`
/// checks it against [`route`] and against Cursor's service list.
pub const LEDGER: &str = include_str!("ledger.tsv");

/// The handler stack behind every door. Cheap to clone.
#[derive(Clone)]
pub struct Router {
    upstream: Upstream,
    cursor: CursorServices,
    agent: AgentTransports,
}

impl Router {
    pub fn new(upstream: Upstream, cursor: CursorServices, agent: AgentTransports) -> Self {
        Router {
            upstream,
            cursor,
            agent,
        }
    }

    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Answer one request. Never fails: errors become responses that say what went wrong.
    pub async fn handle(&self, ctx: RequestContext, req: Request<Incoming>) -> Response<Body> {
        self.handle_linked(None, ctx, req).await
    }

    /// [`Router::handle`] for a request on a client connection that owns `link`, its own
    /// upstream connection for passthrough.
    pub async fn handle_linked(
        &self,
        link: Option<&Link>,
        ctx: RequestContext,
        req: Request<Incoming>,
    ) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let span = tracing::debug_span!(
            "request",
            method = %parts.method,
            host = %ctx.host,
            path = %parts.uri.path(),
            version = ?ctx.client_version,
            door = ?ctx.door,
        );
        match route(parts.uri.path()) {
            Route::Upstream if transport::is_append_stream(parts.uri.path()) => {
                let req = Request::from_parts(parts, body);
                Box::pin(self.agent.relay_cursor_stream(link, ctx, req))
                    .instrument(span)
                    .await
            }
            Route::Upstream => {
                let req = Request::from_parts(parts, boxed(body));
                let forward = self.upstream.forward_via(link, &ctx, req);
                // The hot path: without a subscriber for the span, no wrapper to move and poll.
                if span.is_disabled() {
                    forward.await
                } else {
                    forward.instrument(span).await
                }
            }
            Route::Cursor(rpc) => {
                // Streamed on to the origin: read whole once the origin has taken its end.
                let body = crate::http::BodyRead::marking(&parts.extensions, body);
                let req = Request::from_parts(parts, boxed(body));
                // Boxed, like the agent arm: every request's future is as large as its largest
                // arm, and hyper moves it on each request; passthrough stays small and hot.
                Box::pin(self.cursor.handle(rpc, &ctx, req, &self.upstream))
                    .instrument(span)
                    .await
            }
            Route::Agent(rpc) => {
                let checked = match rpc {
                    AgentRpc::WebSocket => guard::agent_websocket(&parts.headers),
                    _ => guard::agent_request(&parts.method, &parts.headers),
                };
                if let Err(refused) = checked {
                    tracing::warn!(peer = %ctx.peer, path = %parts.uri.path(), "{refused}: refused");
                    return guard::refused_response(&refused);
                }
                let req = Request::from_parts(parts, body);
                Box::pin(self.agent.handle(rpc, ctx, req))
                    .instrument(span)
                    .await
            }
            Route::Side(rpc) => {
                if let Err(refused) = guard::model_call(&parts.method, &parts.headers) {
                    tracing::warn!(peer = %ctx.peer, path = %parts.uri.path(), "{refused}: refused");
                    return guard::refused_response(&refused);
                }
                let req = Request::from_parts(parts, body);
                Box::pin(side::handle(&self.agent, rpc, ctx, req))
                    .instrument(span)
                    .await
            }
            Route::CmdK(rpc) => {
                if let Err(refused) = guard::model_call(&parts.method, &parts.headers) {
                    tracing::warn!(peer = %ctx.peer, path = %parts.uri.path(), "{refused}: refused");
                    return guard::refused_response(&refused);
                }
                let req = Request::from_parts(parts, body);
                Box::pin(self.agent.handle_cmd_k(rpc, ctx, req))
                    .instrument(span)
                    .await
            }
            Route::Own => crate::status::local_only_answer(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_decision_by_path_for_every_kind_of_request() {
        let cases = [
            ("/agent.v1.AgentService/Run", Route::Agent(AgentRpc::Run)),
            (
                "/agent.v1.AgentService/RunSSE",
                Route::Agent(AgentRpc::RunSse),
            ),
            (
                "/aiserver.v1.BidiService/BidiAppend",
                Route::Agent(AgentRpc::BidiAppend),
            ),
            (
                cursor::AVAILABLE_MODELS,
                Route::Cursor(CursorRpc::AvailableModels),
            ),
            (
                "/agent.v1.AgentService/NameAgent",
                Route::Side(SideRpc::NameAgent),
            ),
            ("/__cursor-byok/status", Route::Own),
            (
                "/aiserver.v1.CmdKService/StreamCmdK",
                Route::CmdK(CmdKRpc::StreamCmdK),
            ),
            (
                "/aiserver.v1.AiService/ReportCmdKFate",
                Route::CmdK(CmdKRpc::ReportFate),
            ),
            ("/aiserver.v1.AiService/StreamChat", Route::Upstream),
            // Exact paths only: a longer one is someone else's.
            ("/agent.v1.AgentService/RunX", Route::Upstream),
        ];
        for (path, want) in cases {
            assert_eq!(route(path), want, "{path}");
        }
    }
}
