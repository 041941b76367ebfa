//! Serving HTTP (h1 or h2, per ALPN) on a decrypted or direct connection, through the router.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::uri::Scheme;
use http::{Request, Response, StatusCode};
use hyper::body::{Body as _, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::state::ProxyState;
use super::watch::{Stalled, Watch, MIN_BODY_RATE};
use crate::base::conn_tasks::LocalExec;
use crate::http::{BodyRead, Door, RequestContext};
use crate::relay;
use crate::router::Route;
use crate::upstream::Link;

/// A client that has not finished its TLS handshake by then is dropped.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// Terminate TLS with `config`, then serve HTTP on it.
pub(crate) async fn serve_tls<IO>(
    state: Arc<ProxyState>,
    io: IO,
    config: Arc<ServerConfig>,
    base: RequestContext,
    watch: Arc<Watch>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tls =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(io)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "client TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("client TLS handshake timed out");
                return;
            }
        };
    serve_tls_stream(state, tls, base, watch).await;
}

/// Serve HTTP on an established TLS stream, speaking what ALPN picked.
pub(crate) async fn serve_tls_stream<IO>(
    state: Arc<ProxyState>,
    mut tls: TlsStream<IO>,
    base: RequestContext,
    watch: Arc<Watch>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Room for a whole turn of the relay's frames (or a bulk body chunk) in one write.
    tls.get_mut()
        .1
        .set_buffer_limit(Some(relay::TLS_SEND_BUFFER));
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    // HTTP/2 after CONNECT: the frame relay (passthrough streams never meet hyper). The direct
    // doors rewrite `:authority` to the origin's, so they keep the hyper path.
    if alpn.as_deref() == Some(b"h2")
        && state.h2_relay
        && base.door == Door::Connect
        && base.scheme == Scheme::HTTPS
    {
        return relay(state, tls, base, watch).await;
    }
    serve_http(state, TokioIo::new(tls), alpn.as_deref(), base, Some(watch)).await;
}

/// Run the HTTP/2 relay on a decrypted client connection: plain passthrough streams go to the
/// origin frame by frame; every other stream goes to [`serve_http`] (router, agent, Cursor
/// services) over an in-memory connection.
async fn relay<IO>(
    state: Arc<ProxyState>,
    tls: TlsStream<IO>,
    base: RequestContext,
    watch: Arc<Watch>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut ctx = base;
    ctx.client_version = http::Version::HTTP_2;
    let upstream = state.router.upstream().clone();
    let dial_ctx = ctx.clone();
    // Called again when the origin closed an idle connection.
    let dial: relay::Dialer = Box::new(move || {
        let upstream = upstream.clone();
        let dial_ctx = dial_ctx.clone();
        Box::pin(async move {
            let io = upstream.dial_h2(&dial_ctx).await?;
            Ok(Box::new(io) as relay::BoxIo)
        })
    });
    let graceful = state.shutdown.graceful_token();
    let stopping: relay::BoxFuture<()> = Box::pin(crate::base::cancel::cancelled(&graceful));
    let setup = relay::Setup {
        authority: ctx.authority(),
        port: ctx.port,
        host: ctx.host.clone(),
        dial,
        internal: Box::new({
            let state = state.clone();
            let ctx = ctx.clone();
            let watch = watch.clone();
            move |io| -> relay::BoxFuture<()> {
                Box::pin(serve_http(
                    state.clone(),
                    TokioIo::new(io),
                    Some(b"h2"),
                    ctx.clone(),
                    Some(watch.clone()),
                ))
            }
        }),
        // Unit tests narrow passthrough further; here it is the router's decision alone.
        #[cfg(test)]
        passthrough: |_| true,
        stopping,
    };
    relay::Relay::new(Box::new(tls), setup)
        .on_stream(Box::new(move || watch.got_head()))
        .await;
}

struct Shared {
    router: crate::router::Router,
    link: Link,
    base: RequestContext,
    /// On a direct door, what every request is checked against ([`super::guard`]).
    direct: Option<Arc<ProxyState>>,
    /// The client connection's time bounds.
    watch: Option<Arc<Watch>>,
}

type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<Response<crate::http::Body>, Infallible>> + Send>>;

/// Serve HTTP/1.1 or HTTP/2 on `io`; each request goes to the router with `base` as context.
/// With `watch` (the client connection's), a request marks its head as arrived, HTTP/1.1 heads
/// are bounded by the head timeout, and a body read whole is bounded by the body timeout.
pub(crate) async fn serve_http<I>(
    state: Arc<ProxyState>,
    io: I,
    alpn: Option<&[u8]>,
    base: RequestContext,
    watch: Option<Arc<Watch>>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    // HTTP/2: the streams' futures and the upstream link run in this task (see `conn_tasks`).
    let (exec, tasks) = match alpn {
        Some(b"h2") => {
            let (exec, tasks) = crate::base::conn_tasks::new();
            (exec, Some(tasks))
        }
        _ => (LocalExec::runtime(), None),
    };
    // What every request on this connection shares, behind one `Arc`: the router, this
    // connection's own upstream connection (dialled on its first passthrough request) and
    // the context the CONNECT (or the listener) gave.
    let direct = matches!(base.door, Door::DirectTls | Door::DirectHttp);
    let shared = Arc::new(Shared {
        router: state.router.clone(),
        link: Link::new(exec.clone()),
        base,
        direct: direct.then(|| state.clone()),
        watch: watch.clone(),
    });
    let service = service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        // Boxed once here: the request's future is a few KiB and hyper would otherwise move it
        // by value into its dispatcher (HTTP/1.1) or a stream task (HTTP/2).
        let fut: ServiceFuture = Box::pin(async move {
            let mut req = req;
            if let Some(watch) = &shared.watch {
                watch.got_head();
            }
            if let Some(state) = &shared.direct {
                if let Some(refused) = super::guard::direct_door(state, &mut req) {
                    return Ok(refused);
                }
            }
            let mut ctx = shared.base.clone();
            ctx.client_version = req.version();
            let guard = shared.watch.as_deref().filter(|_| reads_body_whole(&req));
            let resp = match guard {
                // The hot path (passthrough, bodiless requests): no timer.
                None => {
                    let handled = shared.router.handle_linked(Some(&shared.link), ctx, req);
                    handled.await
                }
                Some(watch) => {
                    let read = watch_body(&mut req);
                    let handled = shared.router.handle_linked(Some(&shared.link), ctx, req);
                    guarded(Some(watch), &read, handled).await
                }
            };
            Ok::<_, Infallible>(resp)
        });
        fut
    });
    let mut builder = http_builder(alpn, exec);
    if watch.is_some() {
        limit_head(&mut builder, state.head_timeout);
    }
    let conn = builder
        .serve_connection_with_upgrades(io, service)
        .into_owned();
    let conn = state.shutdown.serve(conn);
    match tasks {
        Some(tasks) => crate::base::conn_tasks::run(conn, tasks).await,
        None => conn.await,
    }
}

/// A declared body up to this size is not held to the body timeout: it pins little even if
/// it stalls, and it usually arrives with its head, so a silent connection afterwards says
/// nothing about it (a RunSSE waiting for its append on another connection is silent).
const SMALL_BODY: u64 = 64 * 1024;

/// Is this request's body read whole before its handler answers (appends and adjusted Cursor
/// requests), and large or of unknown length? Those are held to the body timeout.
/// Passthrough streams its body on with the origin's backpressure; a `Run`'s body is the
/// client's half of a live run and a `RunSSE`'s one small frame, after which the handler waits
/// for the run, not for bytes: none of them keeps the timer.
pub(crate) fn reads_body_whole(req: &Request<Incoming>) -> bool {
    use crate::agent::transport::AgentRpc;
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let whole = !matches!(
        crate::router::route(req.uri().path()),
        Route::Upstream | Route::Agent(AgentRpc::Run | AgentRpc::RunSse)
    );
    whole && !req.body().is_end_stream() && declared.is_none_or(|n| n > SMALL_BODY)
}

/// Put a [`BodyRead`] on `req` for [`guarded`]: the handler marks it once it has the whole body.
pub(crate) fn watch_body(req: &mut Request<Incoming>) -> BodyRead {
    let read = BodyRead::default();
    req.extensions_mut().insert(read.clone());
    read
}

/// Run a handler; with `watch`, a client whose body is late (see [`Watch::body_stalled`])
/// before the handler has read it whole (`read`) gets a 408 and the handler (with the body it
/// held) is dropped. Once the body is read, the handler takes as long as its answer takes.
pub(crate) async fn guarded(
    watch: Option<&Watch>,
    read: &BodyRead,
    handled: impl Future<Output = Response<crate::http::Body>>,
) -> Response<crate::http::Body> {
    let Some(watch) = watch else {
        return handled.await;
    };
    let mut handled = std::pin::pin!(handled);
    let why = tokio::select! {
        resp = &mut handled => return resp,
        () = read.done() => return handled.await,
        why = watch.body_stalled() => why,
    };
    let secs = watch.bounds().body.as_secs();
    let detail = match why {
        Stalled::Gap => format!("no byte for {secs} s ([limits] body_timeout_secs)"),
        Stalled::Slow { bytes, secs } => format!(
            "{bytes} bytes in {secs} s, slower than {} KiB/s",
            MIN_BODY_RATE / 1024
        ),
    };
    tracing::info!(%detail, "request body late; answering 408");
    super::plain_error(
        StatusCode::REQUEST_TIMEOUT,
        &format!("cursor-byok: the request body came too slowly: {detail}; send it again"),
    )
}

/// hyper's server settings: HTTP/1.1 and HTTP/2, or only the one ALPN chose.
///
/// The client is on this machine (a dead peer shows as a reset), so no HTTP/2 pings toward it
/// (hyper's ping bookkeeping takes a lock on every frame); the connection's own bounds
/// (`watch`) close a silent or idle one. The HTTP/1.1 header-read timer is set by
/// [`limit_head`] on client connections (it also closes an idle keep-alive connection after
/// the head timeout, which clients reopen at need). The upstream side keeps its pings.
pub(crate) fn http_builder(alpn: Option<&[u8]>, exec: LocalExec) -> auto::Builder<LocalExec> {
    let mut builder = auto::Builder::new(exec);
    builder.http1().keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(crate::http::H2_STREAM_WINDOW)
        .initial_connection_window_size(crate::http::H2_CONN_WINDOW);
    match alpn {
        Some(b"h2") => builder.http2_only(),
        Some(b"http/1.1") => builder.http1_only(),
        _ => builder,
    }
}

/// Close an HTTP/1.1 connection whose request head is not complete within `timeout`.
pub(crate) fn limit_head(builder: &mut auto::Builder<LocalExec>, timeout: Duration) {
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
}

#[cfg(test)]
mod tests {
    use super::super::watch::Bounds;
    use super::*;
    use tokio::time::Instant;

    fn watch() -> Arc<Watch> {
        Watch::new(Bounds {
            head: Duration::from_secs(15),
            idle: Duration::from_secs(600),
            body: Duration::from_secs(30),
        })
    }

    /// A handler that takes 100 s to answer, having read its body whole first when `reads`.
    async fn slow_handler(read: BodyRead, reads: bool) -> Response<crate::http::Body> {
        if reads {
            let mut extensions = http::Extensions::new();
            extensions.insert(read);
            BodyRead::mark(&extensions);
        }
        tokio::time::sleep(Duration::from_secs(100)).await;
        Response::new(crate::http::empty())
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_read_whole_stops_the_timer() {
        let watch = watch();
        let read = BodyRead::default();
        let started = Instant::now();
        let resp = guarded(Some(&watch), &read, slow_handler(read.clone(), true)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(started.elapsed(), Duration::from_secs(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_never_read_is_answered_408_at_the_body_timeout() {
        let watch = watch();
        let read = BodyRead::default();
        let started = Instant::now();
        let resp = guarded(Some(&watch), &read, slow_handler(read.clone(), false)).await;
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert!(!read.is_done());
    }
}
