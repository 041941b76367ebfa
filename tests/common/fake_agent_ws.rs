//! A fake of Cursor's agent WebSocket server (`wss://api2.cursor.sh/agent/v1/run`): TLS on
//! 127.0.0.1:0 with its own test CA, recording every upgrade's headers and every frame it gets,
//! byte for byte, and answering a scripted run:
//! - on the upgrade: its `Hello` (`protocol_version` 2, so a test can tell it from the proxy's)
//!   and a ping;
//! - a run's first `ClientMessage`: `RunAccepted`, then a `ServerMessage` carrying
//!   [`CURSOR_ANSWER`], then a `ServerMessage` for the run id [`GHOST_RUN`] (a run Cursor's
//!   server has no business talking about), unless the script drops the connection there;
//! - `HalfClose`: `RunEnd` without error; `CancelRun`: `RunEnd` with `canceled`.
//!
//! Or it stalls: it never reads after the first `ClientMessage`.
//!
//! Every frame it sends is recorded too, so a test can check the client got them unchanged.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, StatusCode};
use prost::encoding::{encode_key, encode_varint, string, uint64, WireType};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::Message;

use crate::common::cursor_upstream::TestCa;

/// What a run's `ServerMessage` carries from Cursor's server: field 999, which no schema of
/// ours knows, so a re-encoding would lose it.
pub const CURSOR_ANSWER: &[u8] = b"\xba\x3e\x10from-cursor-only";
/// The run id of the stray frame the fake sends after each accepted run.
pub const GHOST_RUN: &str = "ours-1";
/// The text the stray frame carries.
pub const GHOST_TEXT: &str = "GHOST-FROM-CURSOR";

/// How the fake answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// The scripted run.
    Serve,
    /// As `Serve`, then the TCP connection drops right after the first `ServerMessage`.
    DropAfterAnswer,
    /// The upgrade is answered with this status.
    Refuse(u16),
    /// After the first `ClientMessage`, it never reads again (the connection stays open).
    Stall,
}

#[derive(Debug, Default, Clone)]
pub struct Record {
    pub upgrades: Vec<HeaderMap>,
    pub paths: Vec<String>,
    /// Binary frames received, as they came.
    pub got: Vec<Vec<u8>>,
    /// Binary frames sent.
    pub sent: Vec<Vec<u8>>,
    pub pongs: usize,
}

pub struct FakeAgentWs {
    pub addr: SocketAddr,
    pub ca_pem_path: PathBuf,
    record: Arc<Mutex<Record>>,
    changed: Arc<Notify>,
    _dir: tempfile::TempDir,
    _task: JoinSet<()>,
}

impl FakeAgentWs {
    /// Serves as `host` (the name its certificate carries).
    pub async fn start(host: &str, script: Script) -> Self {
        let ca = TestCa::new();
        let dir = tempfile::tempdir().unwrap();
        let ca_pem_path = dir.path().join("agent-ws-ca.pem");
        std::fs::write(&ca_pem_path, &ca.cert_pem).unwrap();
        let (cert, key) = ca.leaf(&[host]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let record = Arc::new(Mutex::new(Record::default()));
        let changed = Arc::new(Notify::new());
        let mut task = JoinSet::new();
        let (r, c) = (record.clone(), changed.clone());
        task.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (tls, r, c) = (tls.clone(), r.clone(), c.clone());
                tokio::spawn(async move {
                    if let Ok(stream) = tls.accept(tcp).await {
                        serve(stream, script, r, c).await;
                    }
                });
            }
        });
        FakeAgentWs {
            addr,
            ca_pem_path,
            record,
            changed,
            _dir: dir,
            _task: task,
        }
    }

    pub fn record(&self) -> Record {
        self.record.lock().unwrap().clone()
    }

    /// Wait (at most `timeout`) until `cond` holds of the record.
    pub async fn wait(&self, timeout: Duration, cond: impl Fn(&Record) -> bool) -> Record {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.changed.notified();
            let now = self.record();
            if cond(&now) {
                return now;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return now;
            }
        }
    }
}

fn note(record: &Mutex<Record>, changed: &Notify, f: impl FnOnce(&mut Record)) {
    f(&mut record.lock().unwrap());
    changed.notify_waiters();
}

type Tls = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

// The handshake callback's error type is tungstenite's (an HTTP response), large or not.
#[allow(clippy::result_large_err)]
async fn serve(stream: Tls, script: Script, record: Arc<Mutex<Record>>, changed: Arc<Notify>) {
    let (rec, ch) = (record.clone(), changed.clone());
    let callback = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        note(&rec, &ch, |r| {
            r.upgrades.push(req.headers().clone());
            r.paths.push(req.uri().to_string());
        });
        match script {
            Script::Refuse(status) => {
                let mut refusal = ErrorResponse::new(Some("no".into()));
                *refusal.status_mut() = StatusCode::from_u16(status).unwrap();
                Err(refusal)
            }
            _ => Ok(resp),
        }
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
        return;
    };
    let hello = frame(1, b"\x08\x02");
    note(&record, &changed, |r| r.sent.push(hello.clone()));
    if ws.send(Message::Binary(Bytes::from(hello))).await.is_err() {
        return;
    }
    let _ = ws
        .send(Message::Ping(Bytes::from_static(b"are you there")))
        .await;
    while let Some(Ok(msg)) = ws.next().await {
        let bytes = match msg {
            Message::Binary(b) => b.to_vec(),
            Message::Pong(_) => {
                note(&record, &changed, |r| r.pongs += 1);
                continue;
            }
            Message::Close(_) => return,
            _ => continue,
        };
        note(&record, &changed, |r| r.got.push(bytes.clone()));
        if script == Script::Stall && top(&bytes).0 == 3 {
            std::future::pending::<()>().await;
        }
        let (answer, drop_after) = answer(&bytes, script);
        for bytes in answer {
            note(&record, &changed, |r| r.sent.push(bytes.clone()));
            if ws.send(Message::Binary(Bytes::from(bytes))).await.is_err() {
                return;
            }
        }
        if drop_after {
            // An abrupt end: no close frame, the connection just goes.
            return;
        }
    }
}

/// The fake's answer to one client frame, and whether it drops the connection after.
fn answer(bytes: &[u8], script: Script) -> (Vec<Vec<u8>>, bool) {
    let (kind, body) = top(bytes);
    let run_id = || String::from_utf8(field(&body, 1).unwrap_or_default()).unwrap();
    match kind {
        3 => {
            let run = run_id();
            let mut frames = vec![run_accepted(&run), server_message(&run, 0, CURSOR_ANSWER)];
            if script == Script::DropAfterAnswer {
                return (frames, true);
            }
            frames.push(server_message(GHOST_RUN, 0, &ghost_message()));
            (frames, false)
        }
        4 => (vec![run_end(&run_id(), None)], false),
        5 => (
            vec![run_end(&run_id(), Some((1, "canceled by the client")))],
            false,
        ),
        _ => (Vec::new(), false),
    }
}

/// An `AgentServerMessage` with a text delta saying [`GHOST_TEXT`].
fn ghost_message() -> Vec<u8> {
    use cursor_byok::proto::agent::v1 as pb;
    use prost::Message as _;
    let update = pb::InteractionUpdate {
        message: Some(pb::interaction_update::Message::TextDelta(
            pb::TextDeltaUpdate {
                text: GHOST_TEXT.into(),
                is_server_notice: false,
            },
        )),
        ..Default::default()
    };
    pb::AgentServerMessage {
        message: Some(pb::agent_server_message::Message::InteractionUpdate(update)),
        ..Default::default()
    }
    .encode_to_vec()
}

pub fn len_field(number: u32, value: &[u8], out: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

pub fn frame(number: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    len_field(number, body, &mut out);
    out
}

fn identity(run_id: &str) -> Vec<u8> {
    let mut id = Vec::new();
    string::encode(1, &run_id.to_owned(), &mut id);
    string::encode(2, &run_id.to_owned(), &mut id);
    let mut body = Vec::new();
    len_field(1, &id, &mut body);
    body
}

fn run_accepted(run_id: &str) -> Vec<u8> {
    frame(2, &identity(run_id))
}

fn server_message(run_id: &str, sequence: u64, message: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    string::encode(1, &run_id.to_owned(), &mut body);
    uint64::encode(2, &sequence, &mut body);
    len_field(3, message, &mut body);
    frame(3, &body)
}

fn run_end(run_id: &str, error: Option<(u64, &str)>) -> Vec<u8> {
    let mut body = identity(run_id);
    if let Some((code, message)) = error {
        let mut e = Vec::new();
        uint64::encode(1, &code, &mut e);
        string::encode(2, &message.to_owned(), &mut e);
        len_field(3, &e, &mut body);
    }
    frame(4, &body)
}

/// A frame's type and body.
pub fn top(bytes: &[u8]) -> (u32, Vec<u8>) {
    let mut buf = bytes;
    let (number, _) = prost::encoding::decode_key(&mut buf).expect("a frame key");
    let len = prost::encoding::decode_varint(&mut buf).expect("a length") as usize;
    (number, buf[..len].to_vec())
}

/// Field `number` (length-delimited, last) of `buf`.
pub fn field(buf: &[u8], number: u32) -> Option<Vec<u8>> {
    let mut buf = buf;
    let mut found = None;
    while !buf.is_empty() {
        let (n, wire) = prost::encoding::decode_key(&mut buf).ok()?;
        if wire == WireType::LengthDelimited {
            let len = prost::encoding::decode_varint(&mut buf).ok()? as usize;
            if n == number {
                found = Some(buf[..len].to_vec());
            }
            buf = &buf[len..];
        } else {
            prost::encoding::skip_field(wire, n, &mut buf, Default::default()).ok()?;
        }
    }
    found
}
