//! The agent WebSocket (`GET /agent/v1/run`, upgraded): Cursor 3.20+ runs the agent over it
//! when its gate `nal_websocket_client` is on (`../shared/protocol/agent-ws.md`; the gate is
//! turned off by the `cursor` room's `BootstrapStatsig` rewrite, which Cursor reads at start).
//!
//! We answer the upgrade ourselves and read the frames (`ws_frames`). Each run is decided by
//! its first `ClientMessage` (the model is only there, §6) with the same decision as `Run` and
//! `RunSSE`: a run on our model is served by the same run machinery, its output sent as
//! `ServerMessage`s and its end as `RunEnd`; later `ClientMessage`s (exec results, KV answers,
//! heartbeats) feed it; `CancelRun` cancels it. Any other run is refused with `RunRejected`
//! saying why: Cursor's own runs are not relayed on this socket (its frames never go
//! upstream), so nothing read here reaches Cursor. A frame we cannot read ends our runs on the
//! socket and closes it.

use std::collections::HashMap;

use bytes::Bytes;
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
use crate::agent::{RunFailer, RunOutput, RunRequest};
use crate::connect::Code;
use crate::http::{empty, Body, RequestContext};
use crate::proto::agent::v1 as pb;

pub const WEBSOCKET_PATH: &str = "/agent/v1/run";

/// Runs (held or live) on one socket at most; more are rejected.
const MAX_RUNS: usize = 16;
/// Frames waiting for the socket writer.
const OUT_FRAMES: usize = 64;

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
    let session = Session {
        t: t.clone(),
        caller_headers: req.headers().clone(),
        runs: HashMap::new(),
        held: HashMap::new(),
    };
    let max = t.inner.limits.max_frame_bytes;
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
    /// `RunStart`s whose first message has not come.
    held: HashMap<String, Identity>,
}

impl Session {
    async fn serve<S>(mut self, mut ws: WebSocketStream<S>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (out, mut out_rx) = mpsc::channel::<Vec<u8>>(OUT_FRAMES);
        loop {
            tokio::select! {
                incoming = ws.next() => match incoming {
                    Some(Ok(Message::Binary(bytes))) => {
                        if let Err(why) = self.on_frame(&bytes, &out).await {
                            warn!(reason = %why, "agent WebSocket: unreadable frame; closing");
                            self.fail_all(&why);
                            break;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    // Pings are answered by the codec; text frames carry nothing of a run.
                    Some(Ok(_)) => {}
                },
                Some(frame) = out_rx.recv() => {
                    if ws.send(Message::Binary(Bytes::from(frame))).await.is_err() {
                        break;
                    }
                }
            }
        }
        // The client went away: our runs on this socket end (`canceled`).
        for run in self.runs.values() {
            run.cancel.cancel();
        }
        let _ = ws.close(None).await;
    }

    fn fail_all(&self, why: &str) {
        for run in self.runs.values() {
            run.failer.fail(why.to_string());
        }
    }

    async fn on_frame(&mut self, bytes: &[u8], out: &mpsc::Sender<Vec<u8>>) -> Result<(), String> {
        let frame = ws_frames::decode_client(bytes)
            .map_err(|e| format!("an agent WebSocket frame cursor-byok cannot read: {e}"))?;
        match frame {
            ClientFrame::Hello => send(out, ws_frames::server_hello()).await,
            ClientFrame::RunStart(id) => {
                // Ended runs dropped their input: they no longer count.
                self.runs.retain(|_, run| !run.input.is_closed());
                if self.runs.len() + self.held.len() >= MAX_RUNS {
                    let why = format!("cursor-byok: more than {MAX_RUNS} runs on one socket");
                    send(
                        out,
                        ws_frames::run_rejected(&id, Code::ResourceExhausted, &why),
                    )
                    .await;
                } else {
                    self.held.insert(id.run_id.clone(), id);
                }
            }
            ClientFrame::Message {
                run_id, message, ..
            } => {
                let decoded = pb::AgentClientMessage::decode(message.clone())
                    .map_err(|e| format!("an AgentClientMessage cursor-byok cannot read: {e}"))?;
                let sent = ClientMessage {
                    message: decoded,
                    wire: message,
                };
                match self.runs.get(&run_id) {
                    Some(run) => self.feed(run, sent).await,
                    None => self.first(run_id, sent, out).await,
                }
            }
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

    async fn feed(&self, run: &LiveRun, sent: ClientMessage) {
        let version = crate::status::client_version(&self.caller_headers);
        if let Some(reason) = self.t.inspect_client(&sent.wire, version.as_deref()) {
            return run.failer.fail(reason);
        }
        let _ = run.input.send(Box::new(sent.message)).await;
    }

    /// A run's first message: ours is started, anything else rejected.
    async fn first(&mut self, run_id: String, sent: ClientMessage, out: &mpsc::Sender<Vec<u8>>) {
        use pb::agent_client_message::Message as In;
        let id = self.held.remove(&run_id).unwrap_or_else(|| Identity {
            request_id: run_id.clone(),
            run_id: run_id.clone(),
        });
        let request_id = if id.request_id.is_empty() {
            id.run_id.clone()
        } else {
            id.request_id.clone()
        };
        let decision = match self.t.decide(
            &request_id,
            &sent.message,
            &parent_link(&self.caller_headers),
        ) {
            Ok(d @ Decision::Ours { .. }) => d,
            Ok(Decision::Relay) => {
                let why = "cursor-byok does not relay Cursor's runs over the agent WebSocket; \
                           quit Cursor fully and start it again (cursor-byok turns this transport \
                           off at Cursor's start), or choose one of your own models";
                debug!(run_id, "Cursor's run on the agent WebSocket rejected");
                return send(
                    out,
                    ws_frames::run_rejected(&id, Code::FailedPrecondition, why),
                )
                .await;
            }
            Err(e) => {
                return send(out, ws_frames::run_rejected(&id, e.code, &e.message)).await;
            }
        };
        let run_request = match sent.message.message {
            Some(In::RunRequest(r)) => Caller::of(&self.caller_headers).run_request(
                RunRequest::from_client_message(with_pinned_model(r, &decision), &sent.wire),
            ),
            _ => {
                // A prewarm for one of our models: nothing to warm.
                send(out, ws_frames::run_accepted(&id)).await;
                return send(out, ws_frames::run_end(&id, None)).await;
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
        send(out, ws_frames::run_accepted(&id)).await;
        self.runs.insert(
            run_id,
            LiveRun {
                input: handle.input.clone(),
                failer: handle.failer(),
                cancel: handle.cancel.clone(),
            },
        );
        tokio::spawn(pump(id, handle.output, handle.cancel.clone(), out.clone()).in_current_span());
    }
}

async fn send(out: &mpsc::Sender<Vec<u8>>, frame: Vec<u8>) {
    let _ = out.send(frame).await;
}

/// A run's output as `ServerMessage`s (sequence from 0), then its `RunEnd`.
async fn pump(
    id: Identity,
    mut output: mpsc::Receiver<RunOutput>,
    cancel: CancellationToken,
    out: mpsc::Sender<Vec<u8>>,
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
                let _ = out.send(ws_frames::run_end(&id, error)).await;
                return;
            }
        };
        sequence += 1;
        if out.send(frame).await.is_err() {
            cancel.cancel();
            return;
        }
    }
}
