//! A client connection's own upstream connection.
//!
//! Passthrough requests arriving on one decrypted client connection travel over one upstream
//! connection of the same HTTP version, dialled on the first request and closed with the
//! client's connection. That mirrors what Cursor does without us (one connection in, one out,
//! HTTP/2 streams multiplexed the same way) and keeps the shared pool's checkout, locking and
//! per-request bookkeeping task off the hot path. WebSocket upgrades and requests for another
//! origin use the pool. The upstream connection's future runs on the client connection's
//! executor: in that connection's own task on HTTP/2 (`conn_tasks`).

use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::TokioTimer;
use tokio::sync::Mutex;

use super::connector::Connector;
use super::dial::origin_root;
use super::error::{cause_chain, UpstreamError};
use crate::base::conn_tasks::LocalExec;
use crate::http::{Body, RequestContext};
use crate::http::{H2_CONN_WINDOW, H2_KEEP_ALIVE, H2_STREAM_WINDOW};

/// One client connection's upstream connection, dialled on first use. Dropping it (with the
/// client connection) lets the upstream connection close once its last response is read.
pub struct Link {
    /// The client connection's executor: the upstream connection runs in its task.
    exec: LocalExec,
    /// Held across `ready` + send on HTTP/1.1 (requests there are sequential anyway); on
    /// HTTP/2 only long enough to clone the sender.
    conn: Mutex<Option<Conn>>,
}

enum Conn {
    H1(http1::SendRequest<Body>),
    H2(http2::SendRequest<Body>),
}

impl Conn {
    fn is_h2(&self) -> bool {
        matches!(self, Conn::H2(_))
    }

    fn is_closed(&self) -> bool {
        match self {
            Conn::H1(s) => s.is_closed(),
            Conn::H2(s) => s.is_closed(),
        }
    }
}

impl Link {
    pub(crate) fn new(exec: LocalExec) -> Self {
        Link {
            exec,
            conn: Mutex::new(None),
        }
    }
}

/// What `send` needs from the pooled client: the dialers for each HTTP version.
pub(super) struct Dialers<'a> {
    pub h1: &'a Connector,
    pub h2: &'a Connector,
}

/// Send `req` (already stripped of hop-by-hop headers) over `link`, dialling or redialling as
/// needed. A request the connection never took (it closed in between: an idle timeout upstream)
/// is sent once more on a fresh connection; anything else is the origin's answer or failure.
pub(super) async fn send(
    link: &Link,
    dialers: Dialers<'_>,
    ctx: &RequestContext,
    mut req: Request<Body>,
    h2: bool,
) -> Result<Response<Incoming>, UpstreamError> {
    point_at_origin(ctx, &mut req, h2)?;
    let mut fresh = false;
    loop {
        let mut slot = link.conn.lock().await;
        let usable = slot
            .as_ref()
            .is_some_and(|c| c.is_h2() == h2 && !c.is_closed());
        if !usable {
            *slot = None;
            let connector = if h2 { dialers.h2 } else { dialers.h1 };
            // Boxed: dialling happens once per connection; the per-request future stays small.
            *slot = Some(Box::pin(dial(&link.exec, connector, ctx, h2)).await?);
            fresh = true;
        }
        let outcome = match slot.as_mut() {
            // HTTP/2: a clone of the sender, so other requests need not wait for this one.
            Some(Conn::H2(sender)) => {
                let mut conn = Conn::H2(sender.clone());
                drop(slot);
                conn.attempt(req).await
            }
            Some(conn) => conn.attempt(req).await,
            // Filled just above when it was not usable.
            None => unreachable!("upstream link slot empty after dialling"),
        };
        let error = match outcome {
            Outcome::Done(resp) => return Ok(resp),
            Outcome::Unsent(back, error) if !fresh => {
                tracing::debug!(%error, "upstream connection closed; redialling");
                link.conn.lock().await.take();
                req = back;
                continue;
            }
            Outcome::Unsent(_, error) | Outcome::Failed(error) => error,
        };
        return Err(UpstreamError::Request {
            host: ctx.host.clone(),
            reason: cause_chain(&error),
        });
    }
}

enum Outcome {
    Done(Response<Incoming>),
    /// The connection never took the request: it is handed back.
    Unsent(Request<Body>, hyper::Error),
    Failed(hyper::Error),
}

impl Conn {
    /// Wait until the connection takes a request, then send `req` on it.
    async fn attempt(&mut self, req: Request<Body>) -> Outcome {
        let ready = match self {
            Conn::H1(s) => s.ready().await,
            Conn::H2(s) => s.ready().await,
        };
        if let Err(e) = ready {
            return Outcome::Unsent(req, e);
        }
        let sent = match self {
            Conn::H1(s) => s.try_send_request(req).await,
            Conn::H2(s) => s.try_send_request(req).await,
        };
        match sent {
            Ok(resp) => Outcome::Done(resp),
            Err(mut e) => match e.take_message() {
                Some(req) => Outcome::Unsent(req, e.into_error()),
                None => Outcome::Failed(e.into_error()),
            },
        }
    }
}

/// Dial the origin and run the HTTP handshake; the connection's future (run on `exec`) ends
/// when the link and the last response body are gone, or the origin closes.
async fn dial(
    exec: &LocalExec,
    connector: &Connector,
    ctx: &RequestContext,
    h2: bool,
) -> Result<Conn, UpstreamError> {
    let io = connector.clone().connect(origin_root(ctx)?).await?;
    let failed = |e: hyper::Error| UpstreamError::Request {
        host: ctx.host.clone(),
        reason: cause_chain(&e),
    };
    if h2 {
        let (sender, conn) = http2::Builder::new(exec.clone())
            .timer(TokioTimer::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONN_WINDOW)
            .keep_alive_interval(H2_KEEP_ALIVE)
            .handshake(io)
            .await
            .map_err(failed)?;
        exec.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream h2 connection ended");
            }
        });
        Ok(Conn::H2(sender))
    } else {
        let (sender, conn) = http1::Builder::new().handshake(io).await.map_err(failed)?;
        exec.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream h1 connection ended");
            }
        });
        Ok(Conn::H1(sender))
    }
}

/// HTTP/1.1: origin-form target and a `Host` header; HTTP/2: absolute URI (it becomes
/// `:scheme` and `:authority`) and no `Host`.
fn point_at_origin(
    ctx: &RequestContext,
    req: &mut Request<Body>,
    h2: bool,
) -> Result<(), UpstreamError> {
    let bad = |e: http::Error| UpstreamError::Request {
        host: ctx.host.clone(),
        reason: format!("cannot build the upstream URI: {e}"),
    };
    let authority = ctx.authority();
    if h2 {
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let scheme: Scheme = ctx.scheme.clone();
        *req.uri_mut() = Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query(path)
            .build()
            .map_err(bad)?;
        *req.version_mut() = Version::HTTP_2;
        req.headers_mut().remove(header::HOST);
    } else {
        if req.uri().scheme().is_some() || req.uri().path_and_query().is_none() {
            let path = req
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/"));
            *req.uri_mut() = Uri::from(path);
        }
        *req.version_mut() = Version::HTTP_11;
        if let Ok(value) = HeaderValue::from_str(&authority) {
            req.headers_mut().insert(header::HOST, value);
        }
    }
    Ok(())
}
