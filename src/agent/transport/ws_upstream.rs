//! The upstream half of the agent WebSocket: one WebSocket to Cursor's server, opened through
//! the proxy's normal upstream path (`upstream.resolve`, `upstream.proxy`, its TLS roots) with
//! the client's upgrade headers. A thin driver: what goes up is decided by `ws_relay`, which
//! hands it frames as they came; every binary frame Cursor's server sends comes back as an
//! [`UpEvent::Frame`], unread. Pings are answered by the codec.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, Instrument};

use crate::http::{empty, RequestContext};
use crate::upstream::Upstream;

/// Frames waiting to go up. The session never waits on this queue (it would wait on the
/// upstream while the upstream waits on it): a full queue ends Cursor's runs instead. Each
/// frame is at most `limits.max_frame_bytes`.
pub(super) const UP_FRAMES: usize = 64;
/// Frames from Cursor's server waiting for the session.
const DOWN_FRAMES: usize = 64;
/// How long Cursor's server may take to answer the upgrade.
const UPGRADE_WAIT: Duration = Duration::from_secs(30);
/// How long a closing handshake may take once the client has gone.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What the upstream side reports.
#[derive(Debug)]
pub(super) enum UpEvent {
    /// A binary frame from Cursor's server, as it came.
    Frame(Bytes),
    /// Cursor's server answered the upgrade with this status instead of 101.
    Refused(StatusCode),
    /// The link ended, or never opened; why, naming the side.
    Ended(String),
}

/// One upstream WebSocket: frames go in `up`, events come out of `events`. Dropping it closes
/// the upstream socket.
pub(super) struct Link {
    pub(super) up: mpsc::Sender<Bytes>,
    pub(super) events: mpsc::Receiver<UpEvent>,
    _stop: DropGuard,
}

/// Where and how to open the upstream socket: the client's request, as it came.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) upstream: Upstream,
    pub(super) ctx: RequestContext,
    /// The client's upgrade request path (and query).
    pub(super) path: String,
    pub(super) headers: HeaderMap,
    pub(super) max_frame: usize,
}

/// Open the upstream socket in the background; frames sent to the link before it is open wait
/// in its queue.
pub(super) fn open(target: Target) -> Link {
    let (up, up_rx) = mpsc::channel(UP_FRAMES);
    let (events_tx, events) = mpsc::channel(DOWN_FRAMES);
    let stop = CancellationToken::new();
    let span = tracing::info_span!("agent_ws_upstream");
    tokio::spawn(drive(target, up_rx, events_tx, stop.clone()).instrument(span));
    Link {
        up,
        events,
        _stop: stop.drop_guard(),
    }
}

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Why the upstream socket did not open.
enum NotOpen {
    Refused(StatusCode),
    Failed(String),
}

async fn drive(
    target: Target,
    up_rx: mpsc::Receiver<Bytes>,
    events: mpsc::Sender<UpEvent>,
    stop: CancellationToken,
) {
    let opened = tokio::select! {
        _ = stop.cancelled() => return,
        opened = tokio::time::timeout(UPGRADE_WAIT, connect(&target)) => opened,
    };
    let end = match opened {
        Ok(Ok(ws)) => UpEvent::Ended(pump(ws, up_rx, &events, &stop).await),
        Ok(Err(NotOpen::Refused(status))) => UpEvent::Refused(status),
        Ok(Err(NotOpen::Failed(why))) => UpEvent::Ended(why),
        Err(_) => UpEvent::Ended(format!(
            "Cursor's server (upstream) did not answer the agent WebSocket upgrade within {} s",
            UPGRADE_WAIT.as_secs()
        )),
    };
    debug!(?end, "agent WebSocket upstream ended");
    emit(&events, &stop, end).await;
}

async fn emit(events: &mpsc::Sender<UpEvent>, stop: &CancellationToken, event: UpEvent) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        sent = events.send(event) => sent.is_ok(),
    }
}

/// The client's headers for the upstream upgrade: hop-by-hop headers go (the upstream path
/// strips them), and so do the handshake's own (`Sec-WebSocket-Key`/`-Accept`, and
/// `-Extensions`: no extension is spoken on this side); a fresh key is ours.
fn upgrade_headers(client: &HeaderMap, key: &str) -> Result<HeaderMap, NotOpen> {
    let mut headers = client.clone();
    for name in [
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_ACCEPT,
        header::SEC_WEBSOCKET_EXTENSIONS,
        header::SEC_WEBSOCKET_VERSION,
        header::CONTENT_LENGTH,
    ] {
        headers.remove(name);
    }
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    let key = HeaderValue::from_str(key)
        .map_err(|_| NotOpen::Failed("cursor-byok made an unusable WebSocket key".into()))?;
    headers.insert(header::SEC_WEBSOCKET_KEY, key);
    Ok(headers)
}

async fn connect(target: &Target) -> Result<Socket, NotOpen> {
    let key = generate_key();
    let mut req = Request::get(target.path.as_str())
        .body(empty())
        .map_err(|e| NotOpen::Failed(format!("cursor-byok cannot build the upgrade: {e}")))?;
    *req.headers_mut() = upgrade_headers(&target.headers, &key)?;
    let mut resp = target
        .upstream
        .send(&target.ctx, req)
        .await
        .map_err(|e| NotOpen::Failed(e.client_message()))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(NotOpen::Refused(resp.status()));
    }
    let accept = derive_accept_key(key.as_bytes());
    if resp
        .headers()
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .map(|v| v.as_bytes())
        != Some(accept.as_bytes())
    {
        return Err(NotOpen::Failed(
            "Cursor's server (upstream) answered the agent WebSocket upgrade without the right \
             Sec-WebSocket-Accept"
                .into(),
        ));
    }
    let upgraded = hyper::upgrade::on(&mut resp).await.map_err(|e| {
        NotOpen::Failed(format!(
            "the agent WebSocket upgrade to Cursor's server (upstream) did not complete: {e}"
        ))
    })?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(target.max_frame))
        .max_frame_size(Some(target.max_frame));
    Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(config)).await)
}

/// Frames both ways until either side ends; returns why the link ended.
async fn pump(
    mut ws: Socket,
    mut up_rx: mpsc::Receiver<Bytes>,
    events: &mpsc::Sender<UpEvent>,
    stop: &CancellationToken,
) -> String {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return close(ws).await,
            frame = up_rx.recv() => {
                let Some(frame) = frame else { return close(ws).await };
                let sent = tokio::select! {
                    _ = stop.cancelled() => return close(ws).await,
                    sent = ws.send(Message::Binary(frame)) => sent,
                };
                if let Err(e) = sent {
                    return format!("writing to Cursor's server (upstream) failed: {e}");
                }
            }
            incoming = ws.next() => match incoming {
                Some(Ok(Message::Binary(bytes))) => {
                    if !emit(events, stop, UpEvent::Frame(bytes)).await {
                        return close(ws).await;
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    let code = frame.map(|f| u16::from(f.code)).unwrap_or(1005);
                    return format!(
                        "Cursor's server (upstream) closed the agent WebSocket (close code {code})"
                    );
                }
                // Pings are answered by the codec; text frames carry nothing of a run.
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return format!("the agent WebSocket to Cursor's server (upstream) failed: {e}")
                }
                None => {
                    return "Cursor's server (upstream) closed the agent WebSocket connection"
                        .into()
                }
            },
        }
    }
}

/// The client has gone: say goodbye to Cursor's server, briefly.
async fn close(mut ws: Socket) -> String {
    let _ = tokio::time::timeout(CLOSE_WAIT, ws.close(None)).await;
    "the client closed the agent WebSocket".into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamConfig;
    use crate::http::Door;

    /// A server that accepts the connection and never answers the upgrade.
    #[tokio::test(start_paused = true)]
    async fn an_upgrade_cursors_server_never_answers_ends_after_the_wait() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(conn);
        });
        let mut config = UpstreamConfig::default();
        config.resolve.insert("api2.cursor.test".into(), addr);
        let upstream = Upstream::new(&config, Vec::new(), CancellationToken::new()).unwrap();
        let target = Target {
            upstream,
            ctx: RequestContext {
                scheme: http::uri::Scheme::HTTP,
                host: "api2.cursor.test".into(),
                port: 80,
                client_version: http::Version::HTTP_11,
                door: Door::DirectHttp,
                peer: "127.0.0.1:1".parse().unwrap(),
            },
            path: "/agent/v1/run".into(),
            headers: HeaderMap::new(),
            max_frame: 1 << 20,
        };
        // Small steps of the paused clock, so the loopback dial is never overtaken by a timer.
        let metronome = tokio::spawn(async {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                tick.tick().await;
            }
        });
        let started = tokio::time::Instant::now();
        let mut link = open(target);
        let event = link.events.recv().await;
        let waited = started.elapsed();
        metronome.abort();
        held.abort();
        match event {
            Some(UpEvent::Ended(why)) => {
                assert!(why.contains("did not answer"), "{why}");
                assert!(why.contains("Cursor's server (upstream)"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert!(waited >= UPGRADE_WAIT, "{waited:?}");
        assert!(waited < UPGRADE_WAIT + Duration::from_secs(1), "{waited:?}");
    }
}
