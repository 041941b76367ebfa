//! A Connect client that plays Cursor's Agent through the proxy's doors: HTTP/2 `Run` (a
//! request body we push frames into), HTTP/1.1 `RunSSE` + `BidiAppend` (appends on a pool of
//! connections, several at once), and [`play`], which answers what the server asks the way the
//! SDK does (request context execs, blob writes and reads against a [`Store`]) and collects the
//! run's output until its end frame.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cursor_byok::connect::{
    encode_bidi_append, encode_frame, EndStream, Frame, FrameDecoder, Limits, StreamKind,
};
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proto::aiserver::v1 as ai;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use pb::agent_client_message::Message as In;
use pb::agent_server_message::Message as Server;
use pb::interaction_update::Message as Update;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::client::{self, Alpn, Sender};

pub const API: &str = "api2.cursor.sh";
pub const RUN: &str = "/agent.v1.AgentService/Run";
pub const RUN_SSE: &str = "/agent.v1.AgentService/RunSSE";
pub const BIDI_APPEND: &str = "/aiserver.v1.BidiService/BidiAppend";
/// The longest a test waits for any one thing from the proxy.
pub const STEP: Duration = Duration::from_secs(10);
/// What the client answers when asked for its request context (the provider sees it).
pub const EXEC_OS: &str = "darwin-from-exec";

/// How the client reaches the proxy.
#[derive(Clone)]
pub enum Door {
    /// `CONNECT api2.cursor.sh:443` on the proxy listener, then TLS trusting `roots`.
    Connect {
        proxy: SocketAddr,
        roots: rustls::RootCertStore,
    },
    /// [`Door::Connect`] with the listener's credentials (`Proxy-Authorization` value), as
    /// Cursor sends them once `setup cursor` put them in its `http.proxy`.
    ConnectAuth {
        proxy: SocketAddr,
        roots: rustls::RootCertStore,
        auth: String,
    },
    /// The direct TLS door, as `api2.cursor.sh`.
    DirectTls {
        addr: SocketAddr,
        roots: rustls::RootCertStore,
    },
    /// The direct plain-HTTP door (HTTP/1.1).
    DirectHttp { addr: SocketAddr },
}

impl Door {
    pub async fn connect(&self, alpn: Alpn) -> Sender {
        match self {
            Door::Connect { proxy, roots } => {
                client::via_proxy(*proxy, "api2.cursor.sh:443", API, roots.clone(), alpn).await
            }
            Door::ConnectAuth { proxy, roots, auth } => {
                client::via_proxy_auth(
                    *proxy,
                    "api2.cursor.sh:443",
                    API,
                    roots.clone(),
                    alpn,
                    Some(auth),
                )
                .await
            }
            Door::DirectTls { addr, roots } => {
                client::direct(*addr, API, roots.clone(), alpn).await
            }
            Door::DirectHttp { addr } => {
                assert_eq!(alpn, Alpn::H1, "the plain door is used with HTTP/1.1 here");
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                Sender::handshake(stream, Alpn::H1).await
            }
        }
    }

    /// The `Host` / `:authority` the client names.
    pub fn authority(&self) -> String {
        match self {
            Door::Connect { .. } | Door::ConnectAuth { .. } | Door::DirectTls { .. } => {
                API.to_string()
            }
            Door::DirectHttp { addr } => addr.to_string(),
        }
    }
}

/// One Connect envelope around `msg`.
pub fn frame(msg: &impl Message) -> Bytes {
    encode_frame(0, &msg.encode_to_vec()).unwrap()
}

/// A body sent with `Transfer-Encoding: chunked` over HTTP/1.1, as Cursor's BidiSse does.
pub fn chunked(bytes: Bytes) -> client::Body {
    let stream =
        futures_util::stream::iter([Ok::<_, client::BoxError>(hyper::body::Frame::data(bytes))]);
    StreamBody::new(stream).boxed_unsync()
}

/// A Connect request as the desktop sends it.
pub fn connect_request(
    path: &str,
    content_type: &str,
    request_id: &str,
    body: client::Body,
) -> Request<client::Body> {
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("content-type", content_type)
        .header("connect-protocol-version", "1")
        .header("x-request-id", request_id)
        .header("authorization", "Bearer cursor-session-token")
        .header("x-cursor-client-version", "2.0.0-test")
        .header("user-agent", "connect-es/1.6.1")
        .body(body)
        .unwrap()
}

/// A decoded server frame.
#[derive(Debug)]
pub enum Received {
    Message(Box<pb::AgentServerMessage>),
    End(EndStream),
}

/// A streaming Connect response read frame by frame as it arrives.
pub struct ServerStream {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Incoming,
    decoder: FrameDecoder,
    /// The connection, kept open while the body is read.
    _conn: Option<Sender>,
}

impl ServerStream {
    pub fn new(resp: Response<Incoming>, conn: Option<Sender>) -> Self {
        let (parts, body) = resp.into_parts();
        ServerStream {
            status: parts.status,
            headers: parts.headers,
            body,
            decoder: FrameDecoder::new(
                StreamKind::Response,
                cursor_byok::connect::Encoding::Identity,
                Limits::default(),
            ),
            _conn: conn,
        }
    }

    /// The next frame; `None` when the body ended (or broke) without one.
    pub async fn next(&mut self) -> Option<Received> {
        loop {
            match self.decoder.next_frame().expect("valid Connect frames") {
                Some(Frame::Message(b)) => {
                    let m = pb::AgentServerMessage::decode(b).expect("an AgentServerMessage");
                    return Some(Received::Message(Box::new(m)));
                }
                Some(Frame::End(end)) => return Some(Received::End(end)),
                None => {}
            }
            let frame = tokio::time::timeout(STEP, self.body.frame())
                .await
                .expect("a frame within the step timeout");
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.feed(data);
                    }
                }
                None | Some(Err(_)) => return None,
            }
        }
    }

    /// Every remaining byte, undecoded.
    pub async fn raw_to_end(self) -> Bytes {
        tokio::time::timeout(STEP, self.body.collect())
            .await
            .expect("the body ends within the step timeout")
            .expect("the body completes")
            .to_bytes()
    }
}

/// An HTTP/2 `Run`: frames go in through `tx` while the answer streams out.
pub struct H2Run {
    pub tx: mpsc::Sender<Bytes>,
    pub stream: ServerStream,
}

impl H2Run {
    /// Open a `Run` whose request body starts with `first` (raw frame bytes).
    pub async fn open_raw(door: &Door, request_id: &str, first: Bytes) -> H2Run {
        let conn = door.connect(Alpn::H2).await;
        Self::open_on(conn, door, request_id, &[], first).await
    }

    /// Open a `Run` on `conn` (HTTP/2), with extra / replaced headers.
    pub async fn open_on(
        mut conn: Sender,
        door: &Door,
        request_id: &str,
        headers: &[(&str, &str)],
        first: Bytes,
    ) -> H2Run {
        let (tx, body) = client::channel_body();
        tx.send(first).await.unwrap();
        let mut req = connect_request(RUN, "application/connect+proto", request_id, body);
        for (k, v) in headers {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        let resp = tokio::time::timeout(STEP, conn.send(&door.authority(), req))
            .await
            .expect("the Run answer's head within the step timeout")
            .expect("the Run request is answered");
        H2Run {
            tx,
            stream: ServerStream::new(resp, Some(conn)),
        }
    }

    pub async fn open(door: &Door, request_id: &str, first: &pb::AgentClientMessage) -> H2Run {
        Self::open_raw(door, request_id, frame(first)).await
    }

    pub async fn send(&self, msg: &pb::AgentClientMessage) {
        self.tx
            .send(frame(msg))
            .await
            .expect("the request stream is open");
    }
}

/// The HTTP/1.1 transport for one request id: RunSSE readers and appends on pooled
/// connections (one request at a time each, so concurrent appends use several).
#[derive(Clone)]
pub struct Bidi {
    pub door: Door,
    pub request_id: String,
    idle: Arc<Mutex<Vec<Sender>>>,
    next_seqno: Arc<AtomicI64>,
    /// Extra headers on its RunSSE requests and on its appends.
    sse_headers: Vec<(&'static str, String)>,
    append_headers: Vec<(&'static str, String)>,
}

/// An append's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Bidi {
    pub fn new(door: &Door, request_id: &str) -> Bidi {
        Bidi {
            door: door.clone(),
            request_id: request_id.to_string(),
            idle: Arc::default(),
            next_seqno: Arc::new(AtomicI64::new(0)),
            sse_headers: Vec::new(),
            append_headers: Vec::new(),
        }
    }

    /// The same client, adding `name: value` to its RunSSE requests.
    pub fn sse_header(mut self, name: &'static str, value: &str) -> Bidi {
        self.sse_headers.push((name, value.to_string()));
        self
    }

    /// The same client, adding `name: value` to its appends.
    pub fn append_header(mut self, name: &'static str, value: &str) -> Bidi {
        self.append_headers.push((name, value.to_string()));
        self
    }

    fn add_headers<B>(req: &mut Request<B>, headers: &[(&'static str, String)]) {
        for (name, value) in headers {
            req.headers_mut()
                .insert(*name, value.parse().expect("a valid header value"));
        }
    }

    /// Take the next append sequence number (0 first).
    pub fn seqno(&self) -> i64 {
        self.next_seqno.fetch_add(1, Ordering::SeqCst)
    }

    async fn conn(&self) -> Sender {
        loop {
            let idle = self.idle.lock().unwrap().pop();
            match idle {
                Some(Sender::H1(s)) if !s.is_closed() => return Sender::H1(s),
                Some(_) => continue,
                None => return self.door.connect(Alpn::H1).await,
            }
        }
    }

    /// `POST RunSSE` with `body` on a fresh connection; the answer's head.
    pub async fn sse_request(&self, body: Bytes) -> (Response<Incoming>, Sender) {
        let mut conn = self.door.connect(Alpn::H1).await;
        let mut req = connect_request(
            RUN_SSE,
            "application/connect+proto",
            &self.request_id,
            chunked(body),
        );
        Self::add_headers(&mut req, &self.sse_headers);
        let resp = conn
            .send(&self.door.authority(), req)
            .await
            .expect("RunSSE is answered");
        (resp, conn)
    }

    /// Open a RunSSE reader for this request id.
    pub async fn open_sse(&self) -> ServerStream {
        let body = frame(&ai::BidiRequestId {
            request_id: self.request_id.clone(),
        });
        let (resp, conn) = tokio::time::timeout(STEP, self.sse_request(body))
            .await
            .expect("the RunSSE answer's head within the step timeout");
        ServerStream::new(resp, Some(conn))
    }

    /// Open a RunSSE reader in a task; the receiver fires once the proxy has begun reading the
    /// request (its `100 Continue`, asked for with `Expect: 100-continue`, which hyper sends
    /// when the handler first reads the body), so whatever the test sends next comes after it.
    pub fn spawn_sse_announced(
        &self,
    ) -> (
        tokio::task::JoinHandle<ServerStream>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = Mutex::new(Some(tx));
        let b = self.clone();
        let task = tokio::spawn(async move {
            let body = frame(&ai::BidiRequestId {
                request_id: b.request_id.clone(),
            });
            let mut conn = b.door.connect(Alpn::H1).await;
            let mut req = connect_request(
                RUN_SSE,
                "application/connect+proto",
                &b.request_id,
                chunked(body),
            );
            Self::add_headers(&mut req, &b.sse_headers);
            req.headers_mut().insert(
                http::header::EXPECT,
                http::HeaderValue::from_static("100-continue"),
            );
            hyper::ext::on_informational(&mut req, move |res| {
                if res.status() == StatusCode::CONTINUE {
                    if let Some(tx) = tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                }
            });
            let authority = b.door.authority();
            let resp = tokio::time::timeout(STEP, conn.send(&authority, req))
                .await
                .expect("the RunSSE answer's head within the step timeout")
                .expect("RunSSE is answered");
            ServerStream::new(resp, Some(conn))
        });
        (task, rx)
    }

    /// `POST BidiAppend` with a raw unary body.
    pub async fn append_body(&self, body: Bytes) -> Answer {
        self.append_body_announced(body, None).await
    }

    /// [`Bidi::append_body`]; with `reading`, asks for `100 Continue` and fires `reading` when it
    /// comes (the proxy has begun reading the append).
    pub async fn append_body_announced(
        &self,
        body: Bytes,
        reading: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Answer {
        let mut conn = self.conn().await;
        let mut req = connect_request(
            BIDI_APPEND,
            "application/proto",
            &self.request_id,
            chunked(body),
        );
        Self::add_headers(&mut req, &self.append_headers);
        if let Some(tx) = reading {
            req.headers_mut().insert(
                http::header::EXPECT,
                http::HeaderValue::from_static("100-continue"),
            );
            let tx = Mutex::new(Some(tx));
            hyper::ext::on_informational(&mut req, move |res| {
                if res.status() == StatusCode::CONTINUE {
                    if let Some(tx) = tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                }
            });
        }
        let resp = tokio::time::timeout(STEP, conn.send(&self.door.authority(), req))
            .await
            .expect("the append is answered within the step timeout")
            .expect("the append is answered");
        let (parts, incoming) = resp.into_parts();
        let body = tokio::time::timeout(STEP, incoming.collect())
            .await
            .expect("the append's body within the step timeout")
            .expect("the append's body")
            .to_bytes();
        self.idle.lock().unwrap().push(conn);
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// The body Cursor sends for `msg` at `seqno` (hex `data`).
    pub fn append_bytes(&self, seqno: i64, msg: &pb::AgentClientMessage) -> Bytes {
        encode_bidi_append(msg, &self.request_id, seqno)
            .encode_to_vec()
            .into()
    }

    /// Append `msg` at `seqno`; the proxy must accept it.
    pub async fn append(&self, seqno: i64, msg: &pb::AgentClientMessage) {
        let answer = self.append_body(self.append_bytes(seqno, msg)).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "append {seqno}: {:?}",
            answer.body
        );
    }

    /// The same, on its own task (and connection).
    pub fn spawn_append(
        &self,
        seqno: i64,
        msg: pb::AgentClientMessage,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move { this.append(seqno, &msg).await })
    }

    /// [`Bidi::spawn_append`], and a receiver that fires once the proxy has begun reading the
    /// append (see [`Bidi::spawn_sse_announced`]): it is in flight, not just sent.
    pub fn spawn_append_announced(
        &self,
        seqno: i64,
        msg: pb::AgentClientMessage,
    ) -> (
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let this = self.clone();
        let task = tokio::spawn(async move {
            let answer = this
                .append_body_announced(this.append_bytes(seqno, &msg), Some(tx))
                .await;
            assert_eq!(
                answer.status,
                StatusCode::OK,
                "append {seqno}: {:?}",
                answer.body
            );
        });
        (task, rx)
    }

    /// Append `msg` at the next sequence number.
    pub async fn send(&self, msg: &pb::AgentClientMessage) {
        let seqno = self.seqno();
        self.append(seqno, msg).await;
    }
}

/// Where the client's messages go.
#[derive(Clone, Copy)]
pub enum Sink<'a> {
    H2(&'a mpsc::Sender<Bytes>),
    Bidi(&'a Bidi),
}

impl Sink<'_> {
    pub async fn send(&self, msg: &pb::AgentClientMessage) {
        match self {
            Sink::H2(tx) => tx.send(frame(msg)).await.expect("request stream open"),
            Sink::Bidi(b) => b.send(msg).await,
        }
    }

    /// An exec's result then its `stream_close`. Over BidiSse the close (the later seqno) is
    /// appended first and must be answered while the result is still missing: the proxy may
    /// not wait on a gap to answer, yet must hand the run the result before the close.
    async fn answer_exec(&self, result: pb::AgentClientMessage, close: pb::AgentClientMessage) {
        match self {
            Sink::H2(_) => {
                self.send(&result).await;
                self.send(&close).await;
            }
            Sink::Bidi(b) => {
                let (r, c) = (b.seqno(), b.seqno());
                b.append(c, &close).await;
                b.append(r, &result).await;
            }
        }
    }
}

/// What a run sent, up to its end frame (or up to where the test stopped reading).
#[derive(Debug, Default)]
pub struct Transcript {
    pub messages: Vec<pb::AgentServerMessage>,
    /// `None` when reading stopped before the end, or the stream ended without an end frame.
    pub end: Option<EndStream>,
    /// The last `conversation_checkpoint_update`.
    pub checkpoint: Option<pb::ConversationStateStructure>,
}

impl Transcript {
    pub fn updates(&self) -> Vec<&Update> {
        updates(&self.messages)
    }

    pub fn text(&self) -> String {
        text_of(&self.messages)
    }

    pub fn thinking(&self) -> String {
        self.updates()
            .into_iter()
            .filter_map(|u| match u {
                Update::ThinkingDelta(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn turn_ended(&self) -> Option<&pb::TurnEndedUpdate> {
        self.updates().into_iter().find_map(|u| match u {
            Update::TurnEnded(t) => Some(t),
            _ => None,
        })
    }

    /// Update kinds in order, heartbeats left out.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.updates()
            .into_iter()
            .filter_map(|u| {
                Some(match u {
                    Update::StepStarted(_) => "step_started",
                    Update::ThinkingDelta(_) => "thinking",
                    Update::ThinkingCompleted(_) => "thinking_completed",
                    Update::TextDelta(_) => "text",
                    Update::TokenDelta(_) => "token",
                    Update::StepCompleted(_) => "step_completed",
                    Update::TurnEnded(_) => "turn_ended",
                    Update::Heartbeat(_) => return None,
                    _ => "other",
                })
            })
            .collect()
    }

    /// The end frame, which must be there.
    pub fn end(&self) -> &EndStream {
        self.end
            .as_ref()
            .expect("the stream ended with an end frame")
    }

    /// Asks for the request context were seen.
    pub fn request_context_asks(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| {
                matches!(&m.message, Some(Server::ExecServerMessage(e))
                    if matches!(e.message, Some(pb::exec_server_message::Message::RequestContextArgs(_))))
            })
            .count()
    }
}

pub fn updates(messages: &[pb::AgentServerMessage]) -> Vec<&Update> {
    messages
        .iter()
        .filter_map(|m| match &m.message {
            Some(Server::InteractionUpdate(u)) => u.message.as_ref(),
            _ => None,
        })
        .collect()
}

pub fn text_of(messages: &[pb::AgentServerMessage]) -> String {
    updates(messages)
        .into_iter()
        .filter_map(|u| match u {
            Update::TextDelta(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// The client's blob store (Cursor keeps one per workspace) and the last checkpoint it got.
#[derive(Clone, Default)]
pub struct Store {
    blobs: Arc<Mutex<HashMap<Bytes, Bytes>>>,
    checkpoint: Arc<Mutex<Option<pb::ConversationStateStructure>>>,
}

impl Store {
    pub fn len(&self) -> usize {
        self.blobs.lock().unwrap().len()
    }

    pub fn get(&self, id: &[u8]) -> Option<Bytes> {
        self.blobs.lock().unwrap().get(id).cloned()
    }

    /// Hold a blob, as if an earlier turn had stored it.
    pub fn put(&self, id: &[u8], data: Bytes) {
        self.blobs
            .lock()
            .unwrap()
            .insert(Bytes::copy_from_slice(id), data);
    }

    /// The conversation state to send with the next run request (`{}` before the first).
    pub fn conversation_state(&self) -> pb::ConversationStateStructure {
        self.checkpoint.lock().unwrap().clone().unwrap_or_default()
    }

    /// The answer to one KV request: store and ack, or hand a blob back (none when unknown,
    /// as Cursor's client does).
    pub fn answer(&self, kv: &pb::KvServerMessage) -> Option<pb::AgentClientMessage> {
        use pb::kv_client_message::Message as KvIn;
        use pb::kv_server_message::Message as KvOut;
        let message = match kv.message.as_ref()? {
            KvOut::SetBlobArgs(set) => {
                assert_eq!(
                    &Sha256::digest(&set.blob_data)[..],
                    &set.blob_id[..],
                    "blob ids are the SHA-256 of their data"
                );
                self.blobs
                    .lock()
                    .unwrap()
                    .insert(set.blob_id.clone(), set.blob_data.clone());
                KvIn::SetBlobResult(pb::SetBlobResult { error: None })
            }
            KvOut::GetBlobArgs(get) => KvIn::GetBlobResult(pb::GetBlobResult {
                blob_data: self.get(&get.blob_id),
                error: None,
            }),
        };
        Some(pb::AgentClientMessage {
            message: Some(In::KvClientMessage(pb::KvClientMessage {
                id: kv.id,
                message: Some(message),
            })),
        })
    }
}

/// Play Cursor until the end frame: answer `request_context_args` with a
/// `request_context_result` and `stream_close`, store and serve blobs, keep checkpoints, and
/// collect everything.
pub async fn play(stream: &mut ServerStream, sink: Sink<'_>, store: &Store) -> Transcript {
    play_until(stream, sink, store, |_| false).await
}

/// The same, stopping (without an end) after the first message `stop` accepts.
pub async fn play_until(
    stream: &mut ServerStream,
    sink: Sink<'_>,
    store: &Store,
    mut stop: impl FnMut(&pb::AgentServerMessage) -> bool,
) -> Transcript {
    let mut t = Transcript::default();
    loop {
        match stream.next().await {
            None => return t,
            Some(Received::End(end)) => {
                t.end = Some(end);
                return t;
            }
            Some(Received::Message(m)) => {
                match &m.message {
                    Some(Server::ExecServerMessage(e)) => {
                        if let Some(pb::exec_server_message::Message::RequestContextArgs(_)) =
                            e.message
                        {
                            let (result, close) = request_context_answer(e.id, &e.exec_id);
                            sink.answer_exec(result, close).await;
                        }
                    }
                    Some(Server::KvServerMessage(kv)) => {
                        if let Some(answer) = store.answer(kv) {
                            sink.send(&answer).await;
                        }
                    }
                    Some(Server::ConversationCheckpointUpdate(state)) => {
                        t.checkpoint = Some(state.clone());
                        *store.checkpoint.lock().unwrap() = Some(state.clone());
                    }
                    _ => {}
                }
                let done = stop(&m);
                t.messages.push(*m);
                if done {
                    return t;
                }
            }
        }
    }
}

/// The SDK's answer to `request_context_args`: the result, and the close.
pub fn request_context_answer(
    id: u32,
    exec_id: &str,
) -> (pb::AgentClientMessage, pb::AgentClientMessage) {
    let ctx = pb::RequestContext {
        env: Some(pb::RequestContextEnv {
            os_version: EXEC_OS.into(),
            shell: "zsh".into(),
            workspace_paths: vec!["/tmp/exec-ws".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let result = pb::ExecClientMessage {
        id,
        exec_id: exec_id.into(),
        message: Some(pb::exec_client_message::Message::RequestContextResult(
            pb::RequestContextResult {
                result: Some(pb::request_context_result::Result::Success(
                    pb::RequestContextSuccess {
                        request_context: Some(ctx),
                        served_from_disk_cache: None,
                    },
                )),
            },
        )),
        ..Default::default()
    };
    let close = pb::ExecClientControlMessage {
        message: Some(pb::exec_client_control_message::Message::StreamClose(
            pb::ExecClientStreamClose { id },
        )),
    };
    (
        pb::AgentClientMessage {
            message: Some(In::ExecClientMessage(result)),
        },
        pb::AgentClientMessage {
            message: Some(In::ExecClientControlMessage(close)),
        },
    )
}

/// A run request for `model` on `conversation`; with `with_context`, the request context is
/// inline (the desktop), else the server has to ask for it (the SDK / CLI).
pub fn run_request(
    model: &str,
    conversation: &str,
    text: &str,
    with_context: bool,
) -> pb::AgentClientMessage {
    let request_context = with_context.then(|| pb::RequestContext {
        env: Some(pb::RequestContextEnv {
            os_version: "linux-inline".into(),
            shell: "bash".into(),
            workspace_paths: vec!["/tmp/inline-ws".into()],
            ..Default::default()
        }),
        ..Default::default()
    });
    let run = pb::AgentRunRequest {
        conversation_id: Some(conversation.into()),
        requested_model: Some(pb::RequestedModel {
            model_id: model.into(),
            ..Default::default()
        }),
        action: Some(pb::ConversationAction {
            action: Some(pb::conversation_action::Action::UserMessageAction(
                pb::UserMessageAction {
                    user_message: Some(pb::UserMessage {
                        text: text.into(),
                        message_id: format!("msg-{conversation}"),
                        ..Default::default()
                    }),
                    request_context,
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        conversation_state: Some(Default::default()),
        ..Default::default()
    };
    pb::AgentClientMessage {
        message: Some(In::RunRequest(run)),
    }
}

/// A resume of `conversation`: no model, no request context.
pub fn resume_request(
    conversation: &str,
    state: pb::ConversationStateStructure,
) -> pb::AgentClientMessage {
    let run = pb::AgentRunRequest {
        conversation_id: Some(conversation.into()),
        conversation_state: Some(state),
        action: Some(pb::ConversationAction {
            action: Some(pb::conversation_action::Action::ResumeAction(
                Default::default(),
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    pb::AgentClientMessage {
        message: Some(In::RunRequest(run)),
    }
}

pub fn prewarm_request(model: &str, conversation: &str) -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(In::PrewarmRequest(pb::PrewarmRequest {
            conversation_id: Some(conversation.into()),
            requested_model: Some(pb::RequestedModel {
                model_id: model.into(),
                ..Default::default()
            }),
            ..Default::default()
        })),
    }
}

pub fn cancel() -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(In::ConversationAction(pb::ConversationAction {
            action: Some(pb::conversation_action::Action::CancelAction(
                pb::CancelAction::default(),
            )),
            ..Default::default()
        })),
    }
}

pub fn client_heartbeat() -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(In::ClientHeartbeat(pb::ClientHeartbeat {})),
    }
}

/// A background shell's completion, as Cursor's SDK reports one.
pub fn shell_completion() -> pb::BackgroundTaskCompletionAction {
    pb::BackgroundTaskCompletionAction {
        completions: vec![pb::BackgroundTaskCompletion {
            task_id: "1000".into(),
            kind: pb::BackgroundTaskKind::Shell as i32,
            status: pb::BackgroundTaskStatus::Success as i32,
            title: "npm test".into(),
            detail: Some("exit code 0".into()),
            output_path: Some("/t/1000.txt".into()),
            ..Default::default()
        }],
        system_reminder: None,
    }
}

/// A `BidiAppend` body for `request_id` at `seqno` whose `data` is `payload` in hex, whatever
/// it holds.
pub fn raw_append(request_id: &str, seqno: i64, payload: &[u8]) -> Bytes {
    ai::BidiAppendRequest {
        data: payload.iter().map(|b| format!("{b:02x}")).collect(),
        request_id: Some(ai::BidiRequestId {
            request_id: request_id.into(),
        }),
        append_seqno: seqno,
        ..Default::default()
    }
    .encode_to_vec()
    .into()
}
