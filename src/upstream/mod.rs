//! Passthrough: the client to the real origin.
//!
//! A decrypted client connection's passthrough requests go over its own upstream connection
//! ([`Link`], same HTTP version: a bidi stream stays bidi). WebSocket upgrades, absolute-form
//! requests and the handlers that talk to Cursor themselves use two pools (HTTP/2 and
//! HTTP/1.1). Bodies stream both ways without buffering; hop-by-hop headers stop here;
//! everything else (authorization, x-cursor-*, connect-*, trailers) passes. Our dials honour
//! `upstream.resolve`, `upstream.proxy` and never reach our own listeners.

mod connector;
mod dial;
mod error;
pub(crate) mod headers;
mod link;
mod splice;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Scheme;
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;

use crate::config::UpstreamConfig;
use crate::http::{
    boxed, full, Body, RequestContext, H2_CONN_WINDOW, H2_KEEP_ALIVE, H2_STREAM_WINDOW,
};
use connector::Connector;
use dial::origin_root;

pub(crate) use connector::Stream;
pub use dial::Dialer;
pub use error::UpstreamError;
pub use link::Link;
pub use splice::{splice, SpliceEnd, SpliceLimits};

/// Idle pooled connections are closed after this long.
const POOL_IDLE: Duration = Duration::from_secs(90);

/// The passthrough client. Cheap to clone.
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<UpstreamShared>,
}

struct UpstreamShared {
    dialer: Arc<Dialer>,
    h1: Client<Connector, Body>,
    h2: Client<Connector, Body>,
    /// The same dialers, for per-connection links.
    h1_connector: Connector,
    h2_connector: Connector,
    /// Cancelled when the server closes for good: spliced upgrades end with it.
    closing: CancellationToken,
    /// Idle and half-close bounds on spliced upgrades.
    splice: SpliceLimits,
}

impl Upstream {
    /// `own_addrs` are our listeners' addresses (never dialled); `closing` ends spliced
    /// WebSocket connections when the server shuts down.
    pub fn new(
        config: &UpstreamConfig,
        own_addrs: Vec<SocketAddr>,
        closing: CancellationToken,
    ) -> Result<Self, UpstreamError> {
        Self::with_splice(config, own_addrs, closing, SpliceLimits::default())
    }

    /// As [`Upstream::new`], with `splice` bounding upgraded (WebSocket) connections.
    pub fn with_splice(
        config: &UpstreamConfig,
        own_addrs: Vec<SocketAddr>,
        closing: CancellationToken,
        splice: SpliceLimits,
    ) -> Result<Self, UpstreamError> {
        let dialer = Arc::new(Dialer::new(config, own_addrs)?);
        let roots = connector::root_store(config.extra_roots.as_deref())?;
        let h1_tls = connector::client_config(roots.clone(), b"http/1.1")?;
        let h2_tls = connector::client_config(roots, b"h2")?;
        let h1_connector = Connector::new(dialer.clone(), h1_tls);
        let h2_connector = Connector::new(dialer.clone(), h2_tls);
        let h1 = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(h1_connector.clone());
        let h2 = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .timer(TokioTimer::new())
            .http2_only(true)
            .http2_initial_stream_window_size(H2_STREAM_WINDOW)
            .http2_initial_connection_window_size(H2_CONN_WINDOW)
            .http2_keep_alive_interval(H2_KEEP_ALIVE)
            .build(h2_connector.clone());
        Ok(Upstream {
            inner: Arc::new(UpstreamShared {
                dialer,
                h1,
                h2,
                h1_connector,
                h2_connector,
                closing,
                splice,
            }),
        })
    }

    /// A TLS connection to the origin `ctx` names that agreed on HTTP/2, for the relay.
    pub(crate) async fn dial_h2(&self, ctx: &RequestContext) -> Result<Stream, UpstreamError> {
        let io = self
            .inner
            .h2_connector
            .clone()
            .connect(origin_root(ctx)?)
            .await?
            .into_inner();
        if !io.is_h2() {
            return Err(UpstreamError::Request {
                host: ctx.host.clone(),
                reason: "the origin does not speak HTTP/2".into(),
            });
        }
        Ok(io)
    }

    /// Our dialer, for raw tunnels.
    pub fn dialer(&self) -> &Dialer {
        &self.inner.dialer
    }

    /// Send `req` to the origin `ctx` names and return its response head with the body still
    /// streaming. For handlers that want to look at (or rewrite) an upstream answer.
    pub async fn send(
        &self,
        ctx: &RequestContext,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let websocket = wants_websocket(ctx, req.headers());
        self.send_prepared(ctx, req, websocket).await
    }

    /// Passthrough: the origin's answer streamed back, or a 502/504 saying why not.
    pub async fn forward(&self, ctx: &RequestContext, req: Request<Body>) -> Response<Body> {
        self.forward_via(None, ctx, req).await
    }

    /// [`Upstream::forward`], over the client connection's own upstream connection when it
    /// has one (`link`).
    pub async fn forward_via(
        &self,
        link: Option<&Link>,
        ctx: &RequestContext,
        mut req: Request<Body>,
    ) -> Response<Body> {
        let connect_style = is_connect_request(req.headers());
        let websocket = wants_websocket(ctx, req.headers());
        let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
        let sent = match link {
            Some(link) if !websocket => self.send_linked(link, ctx, req).await,
            // Boxed: the pool's request future is large and this arm is rare (WebSocket,
            // absolute-form requests); the linked arm's future stays small.
            _ => Box::pin(self.send_prepared(ctx, req, websocket)).await,
        };
        match sent {
            Ok(mut resp) => {
                let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
                if let (true, Some(client_upgrade)) = (switching, client_upgrade) {
                    self.splice_upgrade(client_upgrade, hyper::upgrade::on(&mut resp));
                }
                headers::strip_hop_by_hop(resp.headers_mut(), switching && websocket);
                resp.map(boxed)
            }
            Err(err) => {
                tracing::warn!(side = %err.side(), error = %err, "upstream request failed");
                error_response(&err, connect_style)
            }
        }
    }

    async fn send_prepared(
        &self,
        ctx: &RequestContext,
        mut req: Request<Body>,
        websocket: bool,
    ) -> Result<Response<Incoming>, UpstreamError> {
        // HTTP/2 in, HTTP/2 out (TLS origins only: we never speak h2c upstream).
        let h2 = ctx.client_version == Version::HTTP_2 && ctx.scheme == Scheme::HTTPS;
        prepare(ctx, &mut req, h2, websocket)?;
        let client = if h2 { &self.inner.h2 } else { &self.inner.h1 };
        client
            .request(req)
            .await
            .map_err(|e| UpstreamError::from_client(&ctx.host, &e))
    }

    async fn send_linked(
        &self,
        link: &Link,
        ctx: &RequestContext,
        mut req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let h2 = ctx.client_version == Version::HTTP_2 && ctx.scheme == Scheme::HTTPS;
        headers::strip_hop_by_hop(req.headers_mut(), false);
        let dialers = link::Dialers {
            h1: &self.inner.h1_connector,
            h2: &self.inner.h2_connector,
        };
        link::send(link, dialers, ctx, req, h2).await
    }

    /// After a 101, join the client's and the origin's upgraded connections.
    fn splice_upgrade(&self, client: hyper::upgrade::OnUpgrade, server: hyper::upgrade::OnUpgrade) {
        let closing = self.inner.closing.clone();
        let limits = self.inner.splice;
        tokio::spawn(async move {
            let (client, server) = match tokio::try_join!(client, server) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade did not complete");
                    return;
                }
            };
            let copy = splice(TokioIo::new(client), TokioIo::new(server), limits);
            tokio::select! {
                end = copy => tracing::debug!(?end, "upgraded connection ended"),
                _ = closing.cancelled() => {}
            }
        });
    }
}

fn wants_websocket(ctx: &RequestContext, headers: &HeaderMap) -> bool {
    ctx.client_version != Version::HTTP_2 && headers::is_websocket_upgrade(headers)
}

/// Point `req` at the origin: absolute URI, version of the chosen pool, `Host` for HTTP/1.1
/// (HTTP/2 carries it as `:authority`), no hop-by-hop headers.
fn prepare(
    ctx: &RequestContext,
    req: &mut Request<Body>,
    h2: bool,
    websocket: bool,
) -> Result<(), UpstreamError> {
    let authority = ctx.authority();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let uri = Uri::builder()
        .scheme(ctx.scheme.clone())
        .authority(authority.as_str())
        .path_and_query(path)
        .build()
        .map_err(|e| UpstreamError::Request {
            host: ctx.host.clone(),
            reason: format!("cannot build the upstream URI: {e}"),
        })?;
    *req.uri_mut() = uri;
    *req.version_mut() = if h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    let headers = req.headers_mut();
    headers::strip_hop_by_hop(headers, websocket);
    if h2 {
        headers.remove(header::HOST);
    } else if let Ok(value) = HeaderValue::from_str(&authority) {
        headers.insert(header::HOST, value);
    }
    Ok(())
}

/// Does the client speak Connect (and so read `{"code","message"}` error bodies)?
fn is_connect_request(headers: &HeaderMap) -> bool {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    content_type.starts_with("application/connect+")
        || content_type.starts_with("application/proto")
        || headers.contains_key(CONNECT_PROTOCOL_VERSION)
}

/// A constant, so the lookup on every request never parses the name.
const CONNECT_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("connect-protocol-version");

/// 502 (504 for a timeout) with the reason: plain text, or Connect's JSON error for Connect
/// clients.
pub fn error_response(err: &UpstreamError, connect_style: bool) -> Response<Body> {
    let (status, content_type, body) = error_parts(err, connect_style);
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// [`error_response`]'s status, content type and body.
pub(crate) fn error_parts(
    err: &UpstreamError,
    connect_style: bool,
) -> (StatusCode, &'static str, String) {
    let status = match err {
        UpstreamError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    };
    let message = err.client_message();
    if connect_style {
        let json = serde_json::json!({ "code": "unavailable", "message": message });
        (status, "application/json", json.to_string())
    } else {
        (status, "text/plain; charset=utf-8", format!("{message}\n"))
    }
}
