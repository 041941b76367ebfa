//! The agent WebSocket (`GET /agent/v1/run`, upgraded): Cursor 3.20+ runs the agent over it
//! when its gate `nal_websocket_client` is on (`../shared/protocol/agent-ws.md`; the gate is
//! turned off by the `cursor` room's `BootstrapStatsig` rewrite, which Cursor reads at start).
//!
//! We answer the upgrade (and the client's `Hello`) ourselves and read the frames
//! (`ws_frames`). Each run's `RunStart` is held until its first `ClientMessage` (the model is
//! only there, §6), which is decided as for `Run` and `RunSSE`:
//! - a run on our model is served by the same run machinery, its output sent as
//!   `ServerMessage`s and its end as `RunEnd`; later `ClientMessage`s (exec results, KV
//!   answers, heartbeats) feed it; `CancelRun` cancels it; nothing of it goes upstream;
//! - Cursor's run goes to Cursor's server unchanged (`ws_relay`): its held `RunStart`, its
//!   messages, `HalfClose` and `CancelRun`, byte for byte, over one upstream socket per client
//!   socket, and the upstream's frames for it come back unchanged;
//! - a run nothing decides is refused with `RunRejected` saying why.
//!
//! Our `Hello` is sent at once rather than held for the first decision: the client may wait
//! for it before its first `RunStart`, and the upstream's `Hello` then has no one to go to.
//! A `ClientMessage` for a run id this socket does not know is a first message; an
//! undecodable first message is refused with `RunRejected`; `HalfClose` and `CancelRun` for
//! an unknown run id are dropped. A frame we cannot read ends our runs on the socket and
//! closes it (and the upstream socket with it).

use std::collections::HashMap;

use bytes::Bytes;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn, Instrument};

use super::caller::{parent_link, Caller, ClientMessage};
use super::face::AgentTransports;
use super::routing::{with_pinned_model, Decision};
use super::ws_frames::{self, ClientFrame, Identity};
use super::ws_relay::CursorRuns;
use super::ws_upstream::Target;
use crate::agent::{RunFailer, RunOutput, RunRequest};
use crate::connect::Code;
use crate::http::{empty, Body, RequestContext};
use crate::proto::agent::v1 as pb;

pub(crate) const WEBSOCKET_PATH: &str = "/agent/v1/run";

/// Runs (held or live) on one socket at most; more are rejected.
const MAX_RUNS: usize = 16;
/// Frames waiting for the socket writer.
const OUT_FRAMES: usize = 64;
/// How long the closing handshake with the client may take.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// `/agent/v1/run`: a WebSocket upgrade is accepted and served; anything else is a 404.
pub(super) async fn handle(
    t: &AgentTransports,
    ctx: RequestContext,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let Some(accept) = accept_key(&ctx, req.headers()) else {
        let mut resp = Response::new(empty());
        *resp.status_mut() = StatusCode::NOT_FOUND;
        return resp;
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let max = t.inner.limits.max_frame_bytes;
    let target = Target {
        upstream: t.upstream().clone(),
        path: req
            .uri()
            .path_and_query()
            .map_or(WEBSOCKET_PATH, |p| p.as_str())
            .to_string(),
        headers: req.headers().clone(),
        ctx,
        max_frame: max,
    };
    let session = Session {
        t: t.clone(),
        caller_headers: req.headers().clone(),
        runs: HashMap::new(),
        held: HashMap::new(),
        cursor: CursorRuns::new(target),
    };
    let span = tracing::info_span!("agent_ws");
    tokio::spawn(
        async move {
            match on_upgrade.await {
                Ok(upgraded) => {
                    let config = WebSocketConfig::default()
                        .max_message_size(Some(max))
                        .max_frame_size(Some(max));
                    let ws = WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        Role::Server,
                        Some(config),
                    )
                    .await;
                    session.serve(ws).await;
                }
                Err(e) => debug!(error = %e, "agent WebSocket upgrade failed"),
            }
        }
        .instrument(span),
    );
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

/// The `Sec-WebSocket-Accept` for an HTTP/1.1 WebSocket upgrade (RFC 6455 §4.2), or `None`
/// when the request is not one.
fn accept_key(ctx: &RequestContext, headers: &HeaderMap) -> Option<String> {
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    let upgrade = ctx.client_version == http::Version::HTTP_11
        && has(header::UPGRADE, "websocket")
        && has(header::CONNECTION, "upgrade")
        && headers
            .get(header::SEC_WEBSOCKET_VERSION)
            .is_some_and(|v| v == "13");
    let key = headers.get(header::SEC_WEBSOCKET_KEY)?;
    upgrade.then(|| tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()))
}

/// One of our runs on the socket.
struct LiveRun {
    input: mpsc::Sender<Box<pb::AgentClientMessage>>,
    failer: RunFailer,
    cancel: CancellationToken,
}

/// One socket's runs.
struct Session {
    t: AgentTransports,
    caller_headers: HeaderMap,
    runs: HashMap<String, LiveRun>,
    /// `RunStart`s whose first message has not come, with their frames as they came.
    held: HashMap<String, (Identity, Bytes)>,
    /// Cursor's runs, relayed to Cursor's server.
    cursor: CursorRuns,
}

/// Frames for the client.
type Out = mpsc::Sender<Bytes>;

impl Session {
    async fn serve<S>(mut self, ws: WebSocketStream<S>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sink, mut incoming) = ws.split();
        let (out, out_rx) = mpsc::channel::<Bytes>(OUT_FRAMES);
        let done = CancellationToken::new();
        let writer = tokio::spawn(write(sink, out_rx, done.clone()).in_current_span());
        loop {
            tokio::select! {
                frame = incoming.next() => match frame {
                    Some(Ok(Message::Binary(bytes))) => {
                        if let Err(why) = self.on_frame(bytes, &out).await {
                            warn!(reason = %why, "agent WebSocket: unreadable frame; closing");
                            self.fail_all(&why);
                            break;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    // Pings are answered by the codec; text frames carry nothing of a run.
                    Some(Ok(_)) => {}
                },
                event = self.cursor.next_event() => {
                    for frame in self.cursor.on_event(event) {
                        send(&out, frame).await;
                    }
                }
                _ = writer_gone(&out) => break,
            }
        }
        // The client went away: our runs on this socket end (`canceled`), and the upstream
        // socket of Cursor's runs closes with `self`.
        for run in self.runs.values() {
            run.cancel.cancel();
        }
        done.cancel();
        let _ = writer.await;
    }

    fn fail_all(&self, why: &str) {
        for run in self.runs.values() {
            run.failer.fail(why.to_string());
        }
    }

    async fn on_frame(&mut self, bytes: Bytes, out: &Out) -> Result<(), String> {
        let frame = ws_frames::decode_client(&bytes)
            .map_err(|e| format!("an agent WebSocket frame cursor-byok cannot read: {e}"))?;
        match frame {
            ClientFrame::Hello => {
                self.cursor.hello(bytes);
                send(out, ws_frames::server_hello().into()).await
            }
            ClientFrame::RunStart(id) => self.on_run_start(id, bytes, out).await,
            ClientFrame::Message { run_id, .. } if self.cursor.has(&run_id) => {
                self.relay(bytes, out).await
            }
            ClientFrame::Message {
                run_id, message, ..
            } => match self.runs.get(&run_id) {
                Some(run) => {
                    let decoded = pb::AgentClientMessage::decode(message.clone()).map_err(|e| {
                        format!("an AgentClientMessage cursor-byok cannot read: {e}")
                    })?;
                    let sent = ClientMessage {
                        message: decoded,
                        wire: message,
                    };
                    self.feed(run, sent).await
                }
                None => self.first(run_id, message, bytes, out).await,
            },
            ClientFrame::HalfClose(run_id) | ClientFrame::CancelRun(run_id)
                if self.cursor.has(&run_id) =>
            {
                self.relay(bytes, out).await
            }
            // Ours keep streaming after a half close (the answer is still to come).
            ClientFrame::HalfClose(_) => {}
            ClientFrame::CancelRun(run_id) => {
                self.held.remove(&run_id);
                if let Some(run) = self.runs.remove(&run_id) {
                    run.cancel.cancel();
                }
            }
        }
        Ok(())
    }

    /// A frame of one of Cursor's runs, up as it came.
    async fn relay(&mut self, bytes: Bytes, out: &Out) {
        for frame in self.cursor.forward(bytes) {
            send(out, frame).await;
        }
    }

    async fn on_run_start(&mut self, id: Identity, bytes: Bytes, out: &Out) {
        // Ended runs dropped their input: they no longer count.
        self.runs.retain(|_, run| !run.input.is_closed());
        let known = self.runs.contains_key(&id.run_id) || self.cursor.has(&id.run_id);
        if known {
            let why = "cursor-byok: a RunStart for a run already running on this socket";
            return send(
                out,
                ws_frames::run_rejected(&id, Code::AlreadyExists, why).into(),
            )
            .await;
        }
        if self.runs.len() + self.held.len() + self.cursor.len() >= MAX_RUNS {
            let why = format!("cursor-byok: more than {MAX_RUNS} runs on one socket");
            let rejected = ws_frames::run_rejected(&id, Code::ResourceExhausted, &why);
            send(out, rejected.into()).await;
        } else {
            self.held.insert(id.run_id.clone(), (id, bytes));
        }
    }

    async fn feed(&self, run: &LiveRun, sent: ClientMessage) {
        let version = crate::status::client_version(&self.caller_headers);
        if let Some(reason) = self.t.inspect_client(&sent.wire, version.as_deref()) {
            return run.failer.fail(reason);
        }
        let _ = run.input.send(Box::new(sent.message)).await;
    }

    /// A run's first message (`message`, in the frame `raw`): ours is started here, Cursor's
    /// goes to Cursor's server with its held `RunStart`, anything else is rejected. Nothing of
    /// a run that is not decided Cursor's goes up.
    async fn first(&mut self, run_id: String, message: Bytes, raw: Bytes, out: &Out) {
        let (id, start) = match self.held.remove(&run_id) {
            Some((id, start)) => (id, Some(start)),
            None => (
                Identity {
                    request_id: run_id.clone(),
                    run_id: run_id.clone(),
                },
                None,
            ),
        };
        let decoded = match pb::AgentClientMessage::decode(message.clone()) {
            Ok(decoded) => decoded,
            Err(e) => {
                let why = format!(
                    "cursor-byok cannot read this run's first AgentClientMessage ({e}); it was \
                     not sent to Cursor"
                );
                let rejected = ws_frames::run_rejected(&id, Code::InvalidArgument, &why);
                return send(out, rejected.into()).await;
            }
        };
        let sent = ClientMessage {
            message: decoded,
            wire: message,
        };
        let request_id = if id.request_id.is_empty() {
            id.run_id.clone()
        } else {
            id.request_id.clone()
        };
        match self.t.decide(
            &request_id,
            &sent.message,
            &parent_link(&self.caller_headers),
        ) {
            Ok(Decision::Ours { model_id }) => {
                let decision = Decision::Ours { model_id };
                self.start_ours(id, request_id, sent, &decision, out).await
            }
            Ok(Decision::Relay) => {
                debug!(run_id, "Cursor's run on the agent WebSocket relayed");
                for frame in self.cursor.start(id, start, raw) {
                    send(out, frame).await;
                }
            }
            Err(e) => {
                send(out, ws_frames::run_rejected(&id, e.code, &e.message).into()).await;
            }
        }
    }

    async fn start_ours(
        &mut self,
        id: Identity,
        request_id: String,
        sent: ClientMessage,
        decision: &Decision,
        out: &Out,
    ) {
        use pb::agent_client_message::Message as In;
        let run_request = match sent.message.message {
            Some(In::RunRequest(r)) => Caller::of(&self.caller_headers).run_request(
                RunRequest::from_client_message(with_pinned_model(r, decision), &sent.wire),
            ),
            _ => {
                // A prewarm for one of our models: nothing to warm.
                send(out, ws_frames::run_accepted(&id).into()).await;
                return send(out, ws_frames::run_end(&id, None).into()).await;
            }
        };
        let handle = self
            .t
            .agent()
            .start_run_on(run_request, request_id, "WebSocket");
        let version = crate::status::client_version(&self.caller_headers);
        if let Some(reason) = self.t.inspect_client(&sent.wire, version.as_deref()) {
            handle.failer().fail(reason);
        }
        send(out, ws_frames::run_accepted(&id).into()).await;
        self.runs.insert(
            id.run_id.clone(),
            LiveRun {
                input: handle.input.clone(),
                failer: handle.failer(),
                cancel: handle.cancel.clone(),
            },
        );
        tokio::spawn(pump(id, handle.output, handle.cancel.clone(), out.clone()).in_current_span());
    }
}

/// Resolves once the writer has stopped (the client's side failed).
async fn writer_gone(out: &Out) {
    out.closed().await
}

/// The socket's writer: frames for the client, in order, until the session ends.
async fn write<S>(
    mut sink: SplitSink<WebSocketStream<S>, Message>,
    mut frames: mpsc::Receiver<Bytes>,
    done: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let frame = tokio::select! {
            _ = done.cancelled() => break,
            frame = frames.recv() => frame,
        };
        let Some(frame) = frame else { break };
        let sent = tokio::select! {
            _ = done.cancelled() => break,
            sent = sink.send(Message::Binary(frame)) => sent,
        };
        if sent.is_err() {
            return;
        }
    }
    let _ = tokio::time::timeout(CLOSE_WAIT, sink.close()).await;
}

async fn send(out: &Out, frame: Bytes) {
    let _ = out.send(frame).await;
}

/// A run's output as `ServerMessage`s (sequence from 0), then its `RunEnd`.
async fn pump(
    id: Identity,
    mut output: mpsc::Receiver<RunOutput>,
    cancel: CancellationToken,
    out: Out,
) {
    let mut sequence = 0u64;
    while let Some(item) = output.recv().await {
        let frame = match item {
            RunOutput::Message(m) => {
                ws_frames::server_message(&id.run_id, sequence, &m.encode_to_vec())
            }
            RunOutput::Encoded(_, wire) => ws_frames::server_message(&id.run_id, sequence, &wire),
            RunOutput::End(end) => {
                let error = end.error.as_ref().map(|e| (e.code, e.message.as_str()));
                let _ = out.send(ws_frames::run_end(&id, error).into()).await;
                return;
            }
        };
        sequence += 1;
        if out.send(frame.into()).await.is_err() {
            cancel.cancel();
            return;
        }
    }
}
