//! The proxy listener: HTTP/1.1 proxy protocol — `CONNECT host:port` and absolute-form requests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::uri::Scheme;
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::instrument;

use super::connect::Session;
use super::state::ProxyState;
use super::watch::{Watch, Watched};
use super::{auth, connect, plain_error, serve};
use crate::base::conn_tasks::LocalExec;
use crate::config::host_matches;
use crate::http::{boxed, Body, Door, RequestContext};

/// Serve proxy-protocol requests on one client connection.
#[instrument(skip_all, name = "proxy_conn", fields(%peer))]
pub(crate) async fn serve(
    state: Arc<ProxyState>,
    stream: Watched<TcpStream>,
    peer: SocketAddr,
    watch: Arc<Watch>,
) {
    let st = state.clone();
    let session: Session = Arc::default();
    let slot = session.clone();
    let service = service_fn(move |req: Request<Incoming>| {
        let state = st.clone();
        let watch = watch.clone();
        let slot = slot.clone();
        async move { Ok::<_, Infallible>(handle(state, peer, req, watch, slot).await) }
    });
    let mut builder = serve::http_builder(Some(b"http/1.1"), LocalExec::runtime());
    serve::limit_head(&mut builder, state.head_timeout);
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .into_owned();
    state.shutdown.serve(conn).await;
    // A poisoned lock only means a panic in another request of this connection.
    let next = session.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(next) = next {
        next.await;
    }
}

async fn handle(
    state: Arc<ProxyState>,
    peer: SocketAddr,
    req: Request<Incoming>,
    watch: Arc<Watch>,
    session: Session,
) -> Response<Body> {
    watch.got_head();
    // The proxy's own pages (status): origin-form requests to this listener, never forwarded.
    // Before the proxy-auth check, because a browser sends `Authorization`, not the proxy kind.
    if req.uri().scheme().is_none() && crate::status::is_own_path(req.uri().path()) {
        return own_page(&state, peer, &req);
    }
    if let Some(check) = &state.auth {
        if !check.allows(req.headers()) {
            return auth::required();
        }
    }
    if req.method() == Method::CONNECT {
        return connect::handle(state, peer, req, watch, &session).await;
    }
    match absolute_target(&req) {
        Some(ctx_parts) => forward_absolute(state, peer, req, ctx_parts, &watch).await,
        None => plain_error(
            StatusCode::BAD_REQUEST,
            "cursor-byok: this is a proxy; send CONNECT or an absolute-form request",
        ),
    }
}

/// The status page, for loopback clients; with `proxy_auth` set, the same credentials are
/// asked for (as `Authorization: Basic`, which browsers prompt for). With the per-install
/// secret they are not: the page is read-only and names no request id.
fn own_page(state: &ProxyState, peer: SocketAddr, req: &Request<Incoming>) -> Response<Body> {
    // The PAC script holds no secret, and the OS fetches it without credentials.
    let pac = req.uri().path() == crate::status::pac::PAC_PATH;
    if let Some(check) = state.auth.as_ref().filter(|_| !pac && !state.pages_open) {
        if !check.allows(req.headers()) && !check.allows_origin(req.headers()) {
            return auth::origin_required();
        }
    }
    crate::status::respond(
        &state.status,
        req.method(),
        req.uri().path(),
        req.headers(),
        peer,
    )
}

/// `(scheme, host, port)` of an absolute-form request.
fn absolute_target(req: &Request<Incoming>) -> Option<(Scheme, String, u16)> {
    let uri = req.uri();
    let scheme = uri.scheme()?.clone();
    let authority = uri.authority()?;
    let default = if scheme == Scheme::HTTPS { 443 } else { 80 };
    let host = crate::http::host_of(authority);
    Some((scheme, host, authority.port_u16().unwrap_or(default)))
}

/// Plain HTTP through the proxy: Cursor hosts go through the router, others straight through.
async fn forward_absolute(
    state: Arc<ProxyState>,
    peer: SocketAddr,
    req: Request<Incoming>,
    (scheme, host, port): (Scheme, String, u16),
    watch: &Watch,
) -> Response<Body> {
    let ctx = RequestContext {
        scheme,
        host,
        port,
        client_version: Version::HTTP_11,
        door: Door::PlainProxy,
        peer,
    };
    if host_matches(&state.intercept, &ctx.host) {
        let mut req = req;
        let guard = serve::reads_body_whole(&req).then_some(watch);
        let read = serve::watch_body(&mut req);
        serve::guarded(guard, &read, state.router.handle(ctx, req)).await
    } else {
        state.router.upstream().forward(&ctx, req.map(boxed)).await
    }
}
