//! The one routing hook: every request for a Cursor host — decrypted at the CONNECT door, or
//! arriving at a direct door — goes through [`Router::handle`].
//!
//! [`route`] decides by path (and context) where a request goes. Today everything passes
//! upstream; later issues add `Route` variants (agent runs, model lists, probes) there and a
//! matching arm in `Router::handle`.

use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::agent::transport::AgentTransports;
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
    Agent,
    /// One of the proxy's own paths (`/__cursor-byok/…`): never forwarded; served only on the
    /// proxy listener, so here it gets a 404 saying where.
    Own,
}

/// The routing decision, from the request head only (the body is still unread).
pub fn route(_ctx: &RequestContext, parts: &Parts) -> Route {
    route_path(parts.uri.path())
}

/// [`route`] by path alone (without the query), which is all it looks at.
pub fn route_path(path: &str) -> Route {
    if crate::status::is_own_path(path) {
        return Route::Own;
    }
    if AgentTransports::handles(path) {
        return Route::Agent;
    }
    match cursor::classify(path) {
        Some(rpc) => Route::Cursor(rpc),
        None => Route::Upstream,
    }
}

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
        match route(&ctx, &parts) {
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
                let req = Request::from_parts(parts, boxed(body));
                // Boxed, like the agent arm: every request's future is as large as its largest
                // arm, and hyper moves it on each request; passthrough stays small and hot.
                Box::pin(self.cursor.handle(rpc, &ctx, req, &self.upstream))
                    .instrument(span)
                    .await
            }
            Route::Agent => {
                let req = Request::from_parts(parts, body);
                Box::pin(self.agent.handle(ctx, req)).instrument(span).await
            }
            Route::Own => crate::status::local_only_answer(),
        }
    }
}
