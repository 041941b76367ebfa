//! A scriptable fake model provider on 127.0.0.1:0 for integration tests.
//!
//! `FakeProvider::start(replies)` serves the scripted [`Reply`]s in order (one per request; a
//! 500 once they run out), records every request, and can stream bodies in small writes, stall,
//! trickle keep-alives, or cut the connection. [`wire_body`] frames a recorded fixture the way
//! the provider sends it (see `../shared/fixtures/providers/README.md`).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// What happens after the scripted body has been written.
#[derive(Debug, Clone, PartialEq)]
pub enum After {
    /// End the body normally.
    End,
    /// Keep the connection open and send nothing.
    Stall,
    /// Keep sending SSE comments (`: keep-alive`) at this interval (detects a client hang-up).
    Trickle(Duration),
    /// Abort the connection without finishing the body.
    Cut,
}

/// One scripted response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Write the body in pieces of this size (each its own write), or in one piece.
    pub chunk_size: Option<usize>,
    /// Pause between pieces.
    pub chunk_delay: Duration,
    pub after: After,
}

impl Reply {
    /// 200 `text/event-stream` with `body` as is.
    pub fn sse(body: impl Into<Vec<u8>>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: body.into(),
            chunk_size: None,
            chunk_delay: Duration::ZERO,
            after: After::End,
        }
    }

    /// A fixture file framed for the wire.
    pub fn fixture(path: &Path) -> Self {
        Self::sse(wire_body(path))
    }

    /// `status` with a JSON body (error replies).
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            ..Self::sse(body)
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn chunked(mut self, size: usize) -> Self {
        self.chunk_size = Some(size.max(1));
        self
    }

    pub fn delay(mut self, d: Duration) -> Self {
        self.chunk_delay = d;
        self
    }

    pub fn then(mut self, after: After) -> Self {
        self.after = after;
        self
    }
}

/// One request as the fake saw it. Header names are lower-case.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (panics when it is not JSON: test helper).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

/// Picks a reply from what was asked (see [`FakeProvider::respond_with`]).
type Responder = Arc<dyn Fn(&RecordedRequest) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct State {
    replies: VecDeque<Reply>,
    responder: Option<Responder>,
    requests: Vec<RecordedRequest>,
    /// Response bodies the client stopped reading (connection closed) before they ended.
    hangups: usize,
}

/// The running fake. Stops accepting connections when dropped.
pub struct FakeProvider {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    /// Rung at every recorded request and every hang-up.
    changed: Arc<Notify>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl FakeProvider {
    pub async fn start(replies: Vec<Reply>) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State {
            replies: replies.into(),
            ..Default::default()
        }));
        let changed = Arc::new(Notify::new());
        let (st, hu) = (state.clone(), changed.clone());
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (st, hu) = (st.clone(), hu.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(req, st.clone(), hu.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        FakeProvider {
            addr,
            state,
            changed,
            accept,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answer each request with what `f` makes of it, falling back to the scripted replies
    /// when it returns `None`. For runs that go side by side (a parent and its subagent), whose
    /// requests arrive in no fixed order.
    pub fn respond_with(
        &self,
        f: impl Fn(&RecordedRequest) -> Option<Reply> + Send + Sync + 'static,
    ) {
        self.state.lock().unwrap().responder = Some(Arc::new(f));
    }

    pub fn push(&self, reply: Reply) {
        self.state.lock().unwrap().replies.push_back(reply);
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.lock().unwrap().requests.clone()
    }

    /// How many response bodies were abandoned by the client mid-way.
    pub fn hangups(&self) -> usize {
        self.state.lock().unwrap().hangups
    }

    /// Wait until at least `n` hang-ups were seen; false on timeout.
    pub async fn wait_hangups(&self, n: usize, timeout: Duration) -> bool {
        self.wait_for(timeout, || self.hangups() >= n).await
    }

    /// Wait until at least `n` requests were recorded; false on timeout.
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> bool {
        self.wait_for(timeout, || self.state.lock().unwrap().requests.len() >= n)
            .await
    }

    /// Wait until `done` holds, looking again at each recorded request and hang-up.
    async fn wait_for(&self, timeout: Duration, done: impl Fn() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Made before the look, so a change between the two still wakes it.
            let notified = self.changed.notified();
            if done() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return done();
            }
        }
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => Vec::new(),
    };
    let reply = {
        let recorded = RecordedRequest {
            method,
            path,
            headers,
            body,
        };
        let responder = state.lock().unwrap().responder.clone();
        // Outside the lock: the responder may look at anything it likes.
        let made = responder.and_then(|f| f(&recorded));
        let mut st = state.lock().unwrap();
        st.requests.push(recorded);
        changed.notify_waiters();
        made.or_else(|| st.replies.pop_front())
    }
    .unwrap_or_else(|| {
        Reply::json(
            500,
            r#"{"error":{"message":"fake: no scripted reply left"}}"#,
        )
    });

    let (tx, mut rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let pieces: Vec<Bytes> = match reply.chunk_size {
        Some(n) => reply.body.chunks(n).map(Bytes::copy_from_slice).collect(),
        None if reply.body.is_empty() => Vec::new(),
        None => vec![Bytes::from(reply.body.clone())],
    };
    let (delay, after) = (reply.chunk_delay, reply.after.clone());
    tokio::spawn(async move {
        let hung_up = || {
            state.lock().unwrap().hangups += 1;
            changed.notify_waiters();
        };
        for p in pieces {
            if tx.send(Ok(Frame::data(p))).await.is_err() {
                return hung_up();
            }
            if delay.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(delay).await;
            }
        }
        match after {
            After::End => {}
            After::Stall => {
                tx.closed().await;
                hung_up();
            }
            After::Trickle(every) => loop {
                tokio::time::sleep(every).await;
                let ping = Frame::data(Bytes::from_static(b": keep-alive\n\n"));
                if tx.send(Ok(ping)).await.is_err() {
                    return hung_up();
                }
            },
            After::Cut => {
                let _ = tx.send(Err(std::io::Error::other("fake: cut"))).await;
            }
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    *resp.status_mut() = hyper::StatusCode::from_u16(reply.status).expect("status");
    for (k, v) in &reply.headers {
        resp.headers_mut().insert(
            hyper::header::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            hyper::header::HeaderValue::from_str(v).expect("header value"),
        );
    }
    Ok(resp)
}

/// How a fixture's events go on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `.sse`: the file is the body.
    Raw,
    /// Anthropic / Responses `.jsonl`: `event: <type>` + `data: <json>` + blank line.
    EventTyped,
    /// Chat Completions `.jsonl`: `data: <json>` + blank line, then `data: [DONE]`.
    ChatDone,
    /// Gemini `.jsonl`: `data: <json>` + blank line only.
    DataOnly,
}

/// The framing for a fixture, from its extension and folder (`anthropic/`, `openai-chat/`, ...).
pub fn framing_for(path: &Path) -> Framing {
    if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
        return Framing::Raw;
    }
    let dir = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    match dir {
        "anthropic" | "openai-responses" => Framing::EventTyped,
        "openai-chat" | "openai-compatible" => Framing::ChatDone,
        _ => Framing::DataOnly,
    }
}

/// Frame JSON lines (one `data:` payload per line) as an SSE body.
pub fn frame_jsonl(text: &str, framing: Framing) -> Vec<u8> {
    if framing == Framing::Raw {
        return text.as_bytes().to_vec();
    }
    let mut out = String::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if framing == Framing::EventTyped {
            let v: serde_json::Value = serde_json::from_str(line).expect("fixture line is JSON");
            let ty = v["type"].as_str().unwrap_or("message");
            out.push_str(&format!("event: {ty}\n"));
        }
        out.push_str(&format!("data: {line}\n\n"));
    }
    if framing == Framing::ChatDone {
        out.push_str("data: [DONE]\n\n");
    }
    out.into_bytes()
}

/// A fixture file as the provider would send it.
pub fn wire_body(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    match framing_for(path) {
        Framing::Raw => raw,
        f => frame_jsonl(&String::from_utf8(raw).expect("fixture is UTF-8"), f),
    }
}

/// An OpenAI Chat stream that calls `calls` (id, name, JSON arguments), then usage.
#[allow(dead_code)]
pub fn tool_sse(calls: &[(&str, &str, &str)]) -> String {
    let mut s = String::new();
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let start = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":i,"id":id,"type":"function","function":{"name":name,"arguments":""}}]}}]});
        let body = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":i,"function":{"arguments":args}}]}}]});
        s += &format!("data: {start}\n\ndata: {body}\n\n");
    }
    s += "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n";
    s += "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":10}}\n\ndata: [DONE]\n\n";
    s
}

/// An OpenAI Chat stream answering `text`, then usage.
#[allow(dead_code)]
pub fn text_sse(text: &str) -> String {
    let delta = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"content":text}}]});
    format!(
        "data: {delta}\n\ndata: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"prompt_tokens\":80,\"completion_tokens\":5}}}}\n\ndata: [DONE]\n\n"
    )
}

/// The tool results the provider received in its `n`-th request (Chat `tool` messages).
#[allow(dead_code)]
pub fn tool_results(provider: &FakeProvider, n: usize) -> Vec<String> {
    provider.requests()[n].json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}
