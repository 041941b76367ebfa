//! HTTP/1.1 "BidiSse": `RunSSE` (server stream) + `BidiAppend` (unary, one client message
//! each), paired by request id.
//!
//! Either side may arrive first. Appends are processed strictly in `append_seqno` order:
//! out-of-order arrivals wait in a bounded buffer, duplicates are ignored, and each append is
//! answered as soon as its message is accepted. The run's output goes through a backlog, so a
//! RunSSE that reconnects with the same request id continues where the last one stopped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::{Body as HttpBody, Frame};
use hyper::body::Incoming;
use prost::Message;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, Instrument};

use super::body::{encode_output, end_frame, replay};
use super::{
    error_response, read_bounded, request_id, with_pinned_model, AgentTransports, Decision, Peek,
    DECIDE_WAIT,
};
use crate::connect::{self, Code, ConnectError, Encoding, EndStream, FrameEncoder};
use crate::proto::agent::v1 as pb;
use crate::proto::aiserver::v1 as aiserver;
use crate::router::{boxed, full, Body, BodyError, RequestContext};

/// Out-of-order appends held at most this far ahead of the next expected seqno.
const MAX_GAP: i64 = 256;
/// Frames the run may get ahead of the RunSSE reader before it waits (backpressure).
const MAX_UNREAD: usize = 256;
/// How long a run survives without any RunSSE reader (the client may reconnect).
const READER_GRACE: Duration = Duration::from_secs(5);
/// Entries idle this long are forgotten.
const ENTRY_TTL: Duration = Duration::from_secs(600);
/// How long an append waits for the decision made by append 0.
const APPEND_DECIDE_WAIT: Duration = Duration::from_secs(5);

/// Request id → pairing state.
#[derive(Default)]
pub(super) struct Registry {
    entries: Entries,
}

type Entries = Arc<Mutex<HashMap<String, Arc<Entry>>>>;

impl Registry {
    fn entry(&self, request_id: &str) -> Arc<Entry> {
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, e| !e.expired());
        map.entry(request_id.to_string())
            .or_insert_with(|| Arc::new(Entry::new(request_id.to_string())))
            .clone()
    }
}

/// Drop `entry` from the registry if it is done with (see [`Entry::expired`]), so a finished
/// run's state goes with its last reader instead of waiting for the next sweep.
fn forget_if_done(entries: &Entries, entry: &Arc<Entry>) {
    if !entry.expired() {
        return;
    }
    let mut map = entries.lock().unwrap_or_else(|p| p.into_inner());
    if map
        .get(&entry.request_id)
        .is_some_and(|e| Arc::ptr_eq(e, entry))
    {
        map.remove(&entry.request_id);
    }
}

struct Entry {
    request_id: String,
    created: Instant,
    decided: Notify,
    state: tokio::sync::Mutex<Inbound>,
    out: Arc<Mutex<Backlog>>,
}

/// The client→run side.
#[derive(Default)]
struct Inbound {
    decision: Option<Decision>,
    next_seqno: i64,
    /// Boxed: a message is large, and a map node holds room for eleven.
    waiting: BTreeMap<i64, Box<pb::AgentClientMessage>>,
    input: Option<mpsc::Sender<Box<pb::AgentClientMessage>>>,
    cancel: Option<CancellationToken>,
    failer: Option<crate::agent::RunFailer>,
}

impl Entry {
    fn new(request_id: String) -> Self {
        Entry {
            request_id,
            created: Instant::now(),
            decided: Notify::new(),
            state: tokio::sync::Mutex::new(Inbound::default()),
            out: Arc::new(Mutex::new(Backlog::default())),
        }
    }

    /// A run whose every frame was delivered is done with (its routing pin stays, so late
    /// appends are still recognised); anything else is kept until the TTL.
    fn expired(&self) -> bool {
        let b = self.out.lock().unwrap_or_else(|p| p.into_inner());
        (b.ended && b.delivered == b.total() && !b.reader_active)
            || self.created.elapsed() > ENTRY_TTL
    }

    async fn decision(&self) -> Option<Decision> {
        self.state.lock().await.decision.clone()
    }

    /// Wait for append 0 to decide, up to `wait`.
    async fn await_decision(&self, wait: Duration) -> Option<Decision> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.decided.notified();
            if let Some(d) = self.decision().await {
                return Some(d);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// The run→client side: encoded frames, kept until read (and a little after, for resumes).
#[derive(Default)]
struct Backlog {
    frames: VecDeque<Bytes>,
    /// Index of `frames[0]` in the whole stream.
    base: u64,
    /// Frames handed to the current reader.
    delivered: u64,
    ended: bool,
    /// Generation of the current reader; older readers stop.
    reader: u64,
    reader_active: bool,
    waker: Option<Waker>,
    space: Arc<Notify>,
}

impl Backlog {
    fn total(&self) -> u64 {
        self.base + self.frames.len() as u64
    }

    fn unread(&self) -> usize {
        usize::try_from(self.total() - self.delivered).unwrap_or(usize::MAX)
    }

    fn push(&mut self, frame: Bytes, end: bool) {
        self.frames.push_back(frame);
        self.ended |= end;
        // Keep only what a resuming reader can still need: frames from `delivered` on.
        while self.base < self.delivered && !self.frames.is_empty() {
            self.frames.pop_front();
            self.base += 1;
        }
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// `/agent.v1.AgentService/RunSSE`.
pub(super) async fn run_sse(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, mut body) = req.into_parts();
    let encoding = Encoding::from_header(
        parts
            .headers
            .get("connect-content-encoding")
            .and_then(|v| v.to_str().ok()),
    )
    .unwrap_or(Encoding::Identity);
    let mut peek = Peek::new(encoding, t.inner.limits);
    // The body is one frame holding `BidiRequestId`; the header carries the same id.
    let from_body = match peek.next(&mut body, true).await {
        Ok(Some(frame)) => aiserver::BidiRequestId::decode(frame)
            .ok()
            .map(|r| r.request_id),
        _ => None,
    };
    let Some(request_id) = from_body
        .filter(|id| !id.is_empty())
        .or_else(|| request_id(&parts.headers))
    else {
        let req = Request::from_parts(parts, replay(peek.consumed.freeze(), body));
        return t.upstream().forward(&ctx, req).await;
    };
    let entry = t.inner.bidi.entry(&request_id);
    let decision = match t.inner.routes.request(&request_id) {
        Some(d) => Some(d),
        None => entry.await_decision(DECIDE_WAIT).await,
    };
    let decision = match decision {
        Some(d) => d,
        None => {
            // No deciding append in time: Cursor's, from now on for this request id.
            let mut st = entry.state.lock().await;
            let d = st.decision.get_or_insert(Decision::Relay).clone();
            t.inner.routes.pin_request(&request_id, d.clone());
            entry.decided.notify_waiters();
            d
        }
    };
    match decision {
        Decision::Relay => {
            let req = Request::from_parts(parts, replay(peek.consumed.freeze(), body));
            t.upstream().forward(&ctx, req).await
        }
        Decision::Ours { .. } => {
            if entry.state.lock().await.decision.is_none() {
                // Pinned ours, but this entry never saw its run: the run finished and was
                // forgotten before this (late) reconnect. Say so instead of waiting forever.
                let end = EndStream::from_error(ConnectError::new(
                    Code::NotFound,
                    "cursor-byok: this agent run has already finished",
                ));
                let enc = FrameEncoder::new(Encoding::Identity);
                return super::run::streaming_response(full(end_frame(&enc, &end)));
            }
            let reader = SseBody::attach(entry, t.inner.bidi.entries.clone());
            let mut resp = Response::new(boxed(reader));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            resp.headers_mut().insert(
                http::header::CACHE_CONTROL,
                HeaderValue::from_static("no-cache"),
            );
            resp
        }
    }
}

/// `/aiserver.v1.BidiService/BidiAppend`.
pub(super) async fn append(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let raw = match read_bounded(body, t.inner.limits.max_frame_bytes).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let relay = |parts: http::request::Parts, raw: Bytes| async {
        t.upstream()
            .forward(&ctx, Request::from_parts(parts, full(raw)))
            .await
    };
    let encoding = parts
        .headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok());
    let Ok(payload) = connect::decode_unary(raw.clone(), encoding, t.inner.limits) else {
        return relay(parts, raw).await;
    };
    let Ok(append) = connect::decode_bidi_append_request(&payload) else {
        return relay(parts, raw).await;
    };
    let request_id = append
        .request_id
        .as_ref()
        .map(|r| r.request_id.clone())
        .unwrap_or_default();
    if request_id.is_empty() || t.inner.routes.request(&request_id) == Some(Decision::Relay) {
        return relay(parts, raw).await;
    }
    let Ok(wire) = connect::bidi_append_payload(&append) else {
        return relay(parts, raw).await;
    };
    let message = match pb::AgentClientMessage::decode(wire.clone()) {
        Ok(m) => m,
        // Other features reuse BidiAppend: not an agent message, not ours.
        Err(_) => return relay(parts, raw).await,
    };
    let seqno = append.append_seqno;
    let entry = t.inner.bidi.entry(&request_id);
    if seqno != 0
        && entry.decision().await.is_none()
        && matches!(
            t.inner.routes.request(&request_id),
            Some(Decision::Ours { .. })
        )
    {
        // A late append (e.g. a heartbeat) for one of our runs that has already finished.
        return ok_response();
    }
    let span = tracing::debug_span!("bidi_append", request_id = %request_id, seqno);
    match accept(t, &entry, seqno, (message, wire.clone()))
        .instrument(span)
        .await
    {
        Ok(Accepted::Ours) => {
            let version = crate::status::client_version(&parts.headers);
            if let Some(reason) = t.inspect_client(&wire, version.as_deref()) {
                if let Some(failer) = &entry.state.lock().await.failer {
                    failer.fail(reason);
                }
            }
            ok_response()
        }
        Ok(Accepted::Relay) => relay(parts, raw).await,
        Err(e) => error_response(&e),
    }
}

enum Accepted {
    Ours,
    Relay,
}

async fn accept(
    t: &AgentTransports,
    entry: &Arc<Entry>,
    seqno: i64,
    (message, wire): (pb::AgentClientMessage, Bytes),
) -> Result<Accepted, ConnectError> {
    // Anything but the first append waits for the first to decide.
    if seqno != 0 && entry.decision().await.is_none() {
        entry.await_decision(APPEND_DECIDE_WAIT).await;
    }
    let mut st = entry.state.lock().await;
    if st.decision.is_none() {
        if seqno != 0 {
            // Append 0 never came: nothing says this run is ours.
            st.decision = Some(Decision::Relay);
            t.inner
                .routes
                .pin_request(&entry.request_id, Decision::Relay);
            entry.decided.notify_waiters();
            return Ok(Accepted::Relay);
        }
        let decision = t.decide(&entry.request_id, &message);
        st.decision = Some(decision.clone());
        if let Decision::Ours { .. } = decision {
            start(t, entry, &mut st, (message, wire), &decision)?;
            st.next_seqno = 1;
            entry.decided.notify_waiters();
            return Ok(Accepted::Ours);
        }
        entry.decided.notify_waiters();
        return Ok(Accepted::Relay);
    }
    if st.decision == Some(Decision::Relay) {
        return Ok(Accepted::Relay);
    }
    if seqno < st.next_seqno || st.waiting.contains_key(&seqno) {
        debug!("duplicate append ignored");
        return Ok(Accepted::Ours);
    }
    if seqno - st.next_seqno > MAX_GAP {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "append {seqno} is too far ahead of {} (gap limit {MAX_GAP})",
                st.next_seqno
            ),
        ));
    }
    st.waiting.insert(seqno, Box::new(message));
    // Deliver every message that is now in order. Holding the lock keeps the order.
    loop {
        let next = st.next_seqno;
        let Some(m) = st.waiting.remove(&next) else {
            break;
        };
        st.next_seqno += 1;
        if let Some(input) = &st.input {
            if input.send(m).await.is_err() {
                st.input = None; // the run is over; later appends are answered and dropped
            }
        }
    }
    Ok(Accepted::Ours)
}

/// Start our run for append 0 and pump its output into the backlog.
fn start(
    t: &AgentTransports,
    entry: &Arc<Entry>,
    st: &mut Inbound,
    (first, first_wire): (pb::AgentClientMessage, Bytes),
    decision: &Decision,
) -> Result<(), ConnectError> {
    use pb::agent_client_message::Message as In;
    let enc = FrameEncoder::new(Encoding::Identity);
    let run_request = match first.message {
        Some(In::RunRequest(r)) => crate::agent::RunRequest::from_client_message(
            with_pinned_model(r, decision),
            &first_wire,
        ),
        _ => {
            // A prewarm for our model: answered locally with an empty, successful stream.
            let mut b = entry.out.lock().unwrap_or_else(|p| p.into_inner());
            b.push(end_frame(&enc, &EndStream::ok()), true);
            return Ok(());
        }
    };
    let handle = t
        .agent()
        .start_run_on(run_request, entry.request_id.clone(), "RunSSE");
    st.failer = Some(handle.failer());
    st.input = Some(handle.input);
    st.cancel = Some(handle.cancel);
    let out = entry.out.clone();
    let mut output = handle.output;
    let capture = t.agent().status().capture().cloned();
    tokio::spawn(
        async move {
            while let Some(o) = output.recv().await {
                let (frame, end) = encode_output(&enc, o, capture.as_ref());
                let space = {
                    let mut b = out.lock().unwrap_or_else(|p| p.into_inner());
                    b.push(frame, end);
                    if end {
                        return;
                    }
                    (b.unread() >= MAX_UNREAD).then(|| b.space.clone())
                };
                // Backpressure: wait for the reader before taking more from the run.
                if let Some(space) = space {
                    loop {
                        let notified = space.notified();
                        if out.lock().unwrap_or_else(|p| p.into_inner()).unread() < MAX_UNREAD {
                            break;
                        }
                        notified.await;
                    }
                }
            }
        }
        .in_current_span(),
    );
    Ok(())
}

fn ok_response() -> Response<Body> {
    // An empty `BidiAppendResponse`.
    let mut resp = Response::new(full(Bytes::new()));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/proto"),
    );
    resp
}

/// One RunSSE connection reading the backlog. A newer connection for the same request id
/// takes over; when the last reader goes away and none returns within a grace period, the
/// run is canceled.
struct SseBody {
    entry: Arc<Entry>,
    entries: Entries,
    generation: u64,
    finished: bool,
}

impl SseBody {
    fn attach(entry: Arc<Entry>, entries: Entries) -> Self {
        let generation = {
            let mut b = entry.out.lock().unwrap_or_else(|p| p.into_inner());
            b.reader += 1;
            b.reader_active = true;
            if let Some(w) = b.waker.take() {
                w.wake(); // the previous reader sees it has been replaced
            }
            b.reader
        };
        SseBody {
            entry,
            entries,
            generation,
            finished: false,
        }
    }
}

impl HttpBody for SseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let out = self.entry.out.clone();
        let mut b = out.lock().unwrap_or_else(|p| p.into_inner());
        if b.reader != self.generation {
            self.finished = true;
            return Poll::Ready(None);
        }
        let index = b.delivered;
        if index < b.total() {
            let pos = usize::try_from(index - b.base).unwrap_or(0);
            let frame = b.frames.get(pos).cloned().unwrap_or_default();
            b.delivered += 1;
            b.space.notify_one();
            return Poll::Ready(Some(Ok(Frame::data(frame))));
        }
        if b.ended {
            // Everything delivered: the frames are no longer needed for a resume.
            b.base = b.total();
            b.frames.clear();
            self.finished = true;
            return Poll::Ready(None);
        }
        b.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        let ended = {
            let mut b = self.entry.out.lock().unwrap_or_else(|p| p.into_inner());
            if b.reader == self.generation {
                b.reader_active = false;
            }
            b.ended
        };
        if ended {
            forget_if_done(&self.entries, &self.entry);
            return;
        }
        if !self
            .entry
            .out
            .lock()
            .is_ok_and(|b| b.reader == self.generation)
        {
            return;
        }
        // The client went away mid-run: give it a moment to reconnect, then cancel.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let entry = self.entry.clone();
        let generation = self.generation;
        rt.spawn(async move {
            tokio::time::sleep(READER_GRACE).await;
            let abandoned = {
                let b = entry.out.lock().unwrap_or_else(|p| p.into_inner());
                b.reader == generation && !b.reader_active && !b.ended
            };
            if abandoned {
                debug!(request_id = %entry.request_id, "RunSSE reader gone: canceling the run");
                if let Some(c) = &entry.state.lock().await.cancel {
                    c.cancel();
                }
            }
        });
    }
}
