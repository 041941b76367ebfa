//! HTTP/1.1 "BidiSse": `RunSSE` (server stream) + `BidiAppend` (unary, one client message
//! each), paired by request id.
//!
//! Either side may arrive first, and only append 0 decides whose run it is: a RunSSE waits for
//! it as long as its client keeps the stream open (bounded), and is never relayed because it
//! came late. Appends are processed strictly in `append_seqno` order: out-of-order arrivals
//! wait in a bounded buffer, duplicates are ignored, and each append is answered as soon as its
//! message is accepted. The run's output goes through a backlog, so a RunSSE that reconnects
//! with the same request id continues where the last one stopped: a frame counts as taken only
//! when its reader asks for the next one, so the frame a dropped or replaced reader was handed
//! last goes out again. When no reader returns within [`READER_GRACE`], the run ends and its
//! output stops moving. How long that state lives, and its bounds, are in [`super::pairing`].
//!
//! Once our run on a request id has ended, a run request at append 0 that is not the first one
//! resent starts a new run on that id, and a RunSSE that finds nothing left to read waits
//! [`DECIDE_WAIT`] for such a run (Cursor's SDK reuses the parent run's id, RunSSE first, to
//! report a background task's end). A RunSSE that finds unread frames resumes the old run.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body as HttpBody, Frame};
use hyper::body::Incoming;
use prost::Message;
use tokio::sync::mpsc;
use tracing::{debug, Instrument};

use super::body::{
    client_error, encode_output, end_frame, error_response, read_bounded, replay, stream_error,
    FramePeek,
};
use super::caller::{parent_link, request_id, Caller, ClientMessage};
use super::deltas::burst;
use super::face::{unreadable, AgentTransports};
use super::pairing::{digest, Inbound, Pairings, RequestPairing};
use super::routing::{never_decided, with_pinned_model, Decision, DECIDE_WAIT, UNDECIDED_WAIT};
use crate::agent::{RunError, RunOutput};
use crate::capture::Capture;
use crate::connect::{self, Code, ConnectError, Encoding, EndStream, FrameEncoder};
use crate::http::{boxed, full, Body, BodyError, RequestContext};
use crate::proto::agent::v1 as pb;
use crate::proto::aiserver::v1 as aiserver;

/// Out-of-order appends held at most this far ahead of the next expected seqno.
const MAX_GAP: i64 = 256;
/// Frames the run may get ahead of the RunSSE reader before it waits (backpressure).
const MAX_UNREAD: usize = 256;

/// Deltas queued one behind the other merge into one text delta of at most about this many
/// bytes (one TLS record).
const MERGED_TEXT: usize = 16 * 1024;
/// How long a run survives without any RunSSE reader (the client may reconnect).
const READER_GRACE: Duration = Duration::from_secs(5);

/// The error for an append or reader that comes after its run ended and was forgotten.
fn run_ended(request_id: &str, what: &str) -> ConnectError {
    RunError::RunEnded(format!(
        "agent run {request_id} has already ended; {what} was not delivered"
    ))
    .to_connect()
}

/// `/agent.v1.AgentService/RunSSE`.
pub(super) async fn run_sse(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, mut body) = req.into_parts();
    let named = parts.headers.get("connect-content-encoding");
    let Ok(encoding) = Encoding::from_header(named.and_then(|v| v.to_str().ok())) else {
        let why = format!(
            "a RunSSE with connect-content-encoding `{}`, which this cursor-byok does not read",
            named
                .map(|v| String::from_utf8_lossy(v.as_bytes()))
                .unwrap_or_default()
        );
        return stream_error(RunError::BadClientMessage(why).to_connect());
    };
    let mut peek = FramePeek::new(encoding, t.inner.limits);
    // Without its request id, nothing says whose run a reader is for: refused, never passed on.
    let request_id = match reader_request_id(&mut peek, &mut body, &parts.headers).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            let why = "a RunSSE that names no request id (neither its body nor x-request-id)";
            return stream_error(RunError::BadClientMessage(why.into()).to_connect());
        }
        Err(e) => return stream_error(e),
    };
    let pinned = t.inner.routes.request(&request_id);
    let entry = match entry_for_reader(t, &request_id, &pinned) {
        Ok(e) => e,
        Err(e) => return stream_error(e),
    };
    if let Err(e) = super::owner::claim(&entry, &parts.headers) {
        return stream_error(e);
    }
    entry.touch();
    note_parent(t, &entry, &parent_link(&parts.headers));
    let decision = match reader_decision(&entry, pinned, &request_id).await {
        Ok(d) => d,
        Err(e) => return stream_error(e),
    };
    match decision {
        Decision::Relay => {
            let req = Request::from_parts(parts, replay(peek.consumed.freeze(), body));
            t.upstream().forward(&ctx, req).await
        }
        Decision::Ours { .. } => sse_response(SseBody::attach(entry, t.inner.bidi.clone())),
    }
}

/// The request id a RunSSE is for: its body is one frame holding `BidiRequestId`, and the
/// header carries the same id. A frame the decoder refuses from its header (a length over the
/// limit, unknown flags) is refused at once: waiting for the rest of it could only end badly.
async fn reader_request_id(
    peek: &mut FramePeek,
    body: &mut Incoming,
    headers: &HeaderMap,
) -> Result<Option<String>, ConnectError> {
    let from_body = match peek.next(body, true).await {
        Ok(Some(frame)) => aiserver::BidiRequestId::decode(frame)
            .ok()
            .map(|r| r.request_id),
        Err(e) if e.code != Code::Canceled => {
            return Err(client_error(
                e.code,
                "Malformed request",
                format!(
                    "cursor-byok: this RunSSE request's frame is unusable: {}",
                    e.message
                ),
                false,
            ))
        }
        _ => None,
    };
    Ok(from_body
        .filter(|id| !id.is_empty())
        .or_else(|| request_id(headers)))
}

/// The entry a RunSSE reads from.
fn entry_for_reader(
    t: &AgentTransports,
    request_id: &str,
    pinned: &Option<Decision>,
) -> Result<Arc<RequestPairing>, ConnectError> {
    let held = t.inner.bidi.get(request_id);
    match (pinned, held) {
        (Some(Decision::Ours { .. }), Some(e)) if !e.read_out() => Ok(e),
        // Ours, and its run is over and read (or forgotten): the client reuses the id for a new
        // run (Cursor's SDK does, for a background task's completion), whose append 0 may come
        // before or after this reader.
        (Some(Decision::Ours { .. }), _) => t.inner.bidi.for_new_run(request_id),
        (_, Some(e)) => Ok(e),
        (_, None) => t.inner.bidi.get_or_create(request_id),
    }
}

/// Whose run a RunSSE reads: pinned already, or decided by an append 0 it waits for.
async fn reader_decision(
    entry: &RequestPairing,
    pinned: Option<Decision>,
    request_id: &str,
) -> Result<Decision, ConnectError> {
    match pinned {
        Some(Decision::Ours { .. }) => match entry.await_decision(DECIDE_WAIT).await {
            Some(d) => Ok(d),
            // No new run came: a late reconnect to the ended one. Say so, never wait forever.
            None => Err(run_ended(request_id, "this RunSSE stream")),
        },
        Some(d) => Ok(d),
        // Only append 0 decides: wait for it as long as the client keeps this stream open
        // (hyper drops this future when it closes), bounded. A late append 0 is never a
        // reason to send the run to Cursor.
        None => match entry.await_decision(UNDECIDED_WAIT).await {
            Some(d) => Ok(d),
            None => Err(never_decided("the run's first append did not come")),
        },
    }
}

/// A RunSSE of ours: the run's output as server-sent events.
fn sse_response(reader: SseBody) -> Response<Body> {
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

/// A request whose body is one small message, read whole (bounded by the largest frame); an
/// unreadable one is answered here.
async fn read_small(
    t: &AgentTransports,
    req: Request<Incoming>,
) -> Result<(http::request::Parts, Bytes), Response<Body>> {
    let (parts, body) = req.into_parts();
    match read_bounded(body, t.inner.limits.max_frame_bytes).await {
        Ok(raw) => Ok((parts, raw)),
        Err(e) => Err(error_response(&unreadable(e))),
    }
}

/// One of Cursor's own `…SSE` / `…Poll` calls: its request id noted, then passed upstream
/// whole (its body is one small frame).
pub(super) async fn relay_cursor_stream(
    t: &AgentTransports,
    link: Option<&crate::upstream::Link>,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, raw) = match read_small(t, req).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let poll = parts.uri.path().ends_with("Poll");
    if let Some(id) =
        super::inference::stream_request_id(&parts.headers, &raw, poll, t.inner.limits)
    {
        t.inner.streams.note(&id);
    }
    let req = Request::from_parts(parts, full(raw));
    t.upstream().forward_via(link, &ctx, req).await
}

/// `/aiserver.v1.BidiService/BidiAppend`.
pub(super) async fn append(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, raw) = match read_small(t, req).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    // What follows (a run's inbox, the origin) is not the client's to hurry.
    crate::http::BodyRead::mark(&parts.extensions);
    let relay = |parts: http::request::Parts, raw: Bytes| async {
        t.upstream()
            .forward(&ctx, Request::from_parts(parts, full(raw)))
            .await
    };
    let encoding = parts
        .headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok());
    // A RunInferenceSSE stream's append is not an agent message: that door decides it.
    if let Some(resp) = super::inference::append(t, &ctx, &parts, encoding, &raw).await {
        return resp;
    }
    let Append {
        request_id,
        seqno,
        sent,
    } = match decode_append(t, encoding, &raw, &parts.headers) {
        Read::Agent(a) => *a,
        Read::NotOurs => return relay(parts, raw).await,
        Read::Unreadable { request_id, why } => {
            return match refuse_unreadable(t, &request_id, why).await {
                Some(e) => error_response(&e),
                None => relay(parts, raw).await,
            }
        }
    };
    if let Some(e) = relayed_id_names_ours(t, &request_id, seqno, &sent.message) {
        return error_response(&e);
    }
    let entry = match entry_for_append(t, &request_id, seqno, &sent).await {
        Ok(e) => e,
        Err(e) => return error_response(&e),
    };
    if let Err(e) = super::owner::claim(&entry, &parts.headers) {
        return error_response(&e);
    }
    entry.touch();
    // Counted from here until answered: it may wait long for its turn.
    let _in_hand = match entry.wait_room(seqno, raw.len()) {
        Ok(g) => g,
        Err(e) => {
            let title = "Too many messages waiting";
            return error_response(&client_error(e.code, title, e.message, true));
        }
    };
    let span = tracing::debug_span!("bidi_append", request_id = %request_id, seqno);
    let caller = Caller::of(&parts.headers);
    note_parent(t, &entry, &caller.parent);
    let wire = sent.wire.clone();
    match accept(t, &entry, seqno, sent, caller)
        .instrument(span)
        .await
    {
        Ok(Accepted::Ours) => {
            let version = crate::status::client_version(&parts.headers);
            if let Some(reason) = t.inspect_client(&wire, version.as_deref()) {
                if let Some(failer) = entry.run.get() {
                    failer.fail(reason);
                }
            }
            ok_response()
        }
        Ok(Accepted::Relay) => relay(parts, raw).await,
        Err(e) => error_response(&e),
    }
}

/// One append that may be ours.
struct Append {
    request_id: String,
    seqno: i64,
    sent: ClientMessage,
}

/// What one `BidiAppend` is, as far as it can be read.
enum Read {
    /// An agent message on a request id that is not Cursor's already (boxed: a message is
    /// several KiB).
    Agent(Box<Append>),
    /// Not ours to judge: no request id, a request id relayed already (and not a new run's
    /// first message), or another feature's append.
    NotOurs,
    /// It does not decode (why, in words); `request_id` from its body or its header.
    Unreadable { request_id: String, why: String },
}

/// What `raw` appends. A request id relayed already is read too: its append 0 is decided by
/// its model before the pin.
fn decode_append(
    t: &AgentTransports,
    encoding: Option<&str>,
    raw: &Bytes,
    headers: &HeaderMap,
) -> Read {
    let header_id = request_id(headers).unwrap_or_default();
    let garbled = |request_id: String, what: &str, e: &dyn std::fmt::Display| Read::Unreadable {
        request_id,
        why: format!("a BidiAppend whose {what} does not decode ({e})"),
    };
    let payload = match connect::decode_unary(raw.clone(), encoding, t.inner.limits) {
        Ok(p) => p,
        Err(e) => return garbled(header_id, "body", &e),
    };
    let append = match connect::decode_bidi_append_request(&payload) {
        Ok(a) => a,
        Err(e) => return garbled(header_id, "request", &e),
    };
    let request_id = append
        .request_id
        .as_ref()
        .map(|r| r.request_id.clone())
        .filter(|id| !id.is_empty())
        .unwrap_or(header_id);
    if request_id.is_empty() {
        return Read::NotOurs;
    }
    let relayed = t.inner.routes.request(&request_id) == Some(Decision::Relay);
    let wire = match connect::bidi_append_payload(&append) {
        Ok(w) => w,
        Err(_) if relayed => return Read::NotOurs,
        Err(e) => return garbled(request_id, "payload", &e),
    };
    match pb::AgentClientMessage::decode(wire.clone()) {
        Ok(message) => Read::Agent(Box::new(Append {
            request_id,
            seqno: append.append_seqno,
            sent: ClientMessage { message, wire },
        })),
        Err(_) if relayed => Read::NotOurs,
        Err(e) => garbled(request_id, "agent message", &e),
    }
}

/// How long an append we cannot read, on a request id nothing has named, waits for one of
/// Cursor's streams to name it (an append may come just ahead of its stream).
const STREAM_WAIT: Duration = Duration::from_secs(3);

/// An append that does not decode, on `request_id`: when the id is one of our runs or has a
/// live entry, it is refused (and ends that run, or its undecided reader), never relayed; on
/// an id nothing has named, it is relayed only once one of Cursor's own streams names it.
/// `None`: the id is Cursor's, so it is another feature's append.
async fn refuse_unreadable(
    t: &AgentTransports,
    request_id: &str,
    why: String,
) -> Option<ConnectError> {
    let pinned_ours = matches!(
        t.inner.routes.request(request_id),
        Some(Decision::Ours { .. })
    );
    let entry = t.inner.bidi.get(request_id);
    let decided = match &entry {
        Some(e) => e.decision().await,
        None => None,
    };
    if entry.is_none() && !pinned_ours {
        // No run of ours, but it may be the first message of one whose stream is on its way:
        // relayed only when one of Cursor's own streams names its id.
        if request_id.is_empty() || t.inner.streams.wait_for(request_id, STREAM_WAIT).await {
            return None;
        }
        tracing::warn!(
            request_id,
            "{why}, on a request id no stream has named: refused"
        );
        let e = RunError::BadClientMessage(format!(
            "{why}, on request id {request_id}, which no stream through cursor-byok has \
             opened: it may be a message of a run on your own model, so it is not sent to \
             Cursor"
        ))
        .to_connect();
        // A reader that comes for this id later gets the refusal as its end.
        if let Ok(entry) = t.inner.bidi.get_or_create(request_id) {
            let mut st = entry.state.lock().await;
            if st.decision.is_none() {
                refuse(&entry, &mut st, &e);
            }
        }
        return Some(e);
    }
    let live = entry.is_some() && decided != Some(Decision::Relay);
    if !pinned_ours && !live {
        return None;
    }
    tracing::warn!(request_id, "{why}: refused");
    let e = RunError::BadClientMessage(why.clone()).to_connect();
    if let Some(entry) = entry.filter(|_| live) {
        match entry.run.get() {
            Some(failer) => failer.fail(why),
            None => {
                let mut st = entry.state.lock().await;
                if st.decision.is_none() {
                    refuse(&entry, &mut st, &e);
                }
            }
        }
    }
    Some(e)
}

/// Append 0 of a new run on a request id relayed already, naming one of our models: it is
/// not sent to Cursor with the earlier run (the error says why).
fn relayed_id_names_ours(
    t: &AgentTransports,
    request_id: &str,
    seqno: i64,
    m: &pb::AgentClientMessage,
) -> Option<ConnectError> {
    if seqno != 0 || t.inner.routes.request(request_id) != Some(Decision::Relay) {
        return None;
    }
    names_ours(m).then(|| relayed_id_error(request_id))
}

/// Whether a run's first message names a model with our prefix (configured or not).
fn names_ours(m: &pb::AgentClientMessage) -> bool {
    use pb::agent_client_message::Message as In;
    let model = match &m.message {
        Some(In::RunRequest(r)) => crate::agent::model::requested_model_id(r),
        Some(In::PrewarmRequest(p)) => crate::agent::model::prewarm_model_id(p),
        _ => None,
    };
    model.is_some_and(crate::agent::model::has_our_prefix)
}

fn relayed_id_error(request_id: &str) -> ConnectError {
    RunError::Withheld(format!(
        "request id {request_id} carries a run on Cursor's model already, and this message \
         starts a run on one of your models"
    ))
    .to_connect()
}

/// The entry an append goes to.
async fn entry_for_append(
    t: &AgentTransports,
    request_id: &str,
    seqno: i64,
    sent: &ClientMessage,
) -> Result<Arc<RequestPairing>, ConnectError> {
    use pb::agent_client_message::Message as In;
    let pinned_ours = matches!(
        t.inner.routes.request(request_id),
        Some(Decision::Ours { .. })
    );
    let new_run = seqno == 0 && matches!(sent.message.message, Some(In::RunRequest(_)));
    let held = t.inner.bidi.get(request_id);
    match held {
        // A run request on an id whose run of ours ended is a new run on that id (Cursor's SDK
        // sends a background task's completion so), unless it is append 0 resent.
        Some(e)
            if pinned_ours && new_run && e.backlog().ended() && !resent(&e, &sent.wire).await =>
        {
            t.inner.bidi.for_new_run(request_id)
        }
        Some(e) => Ok(e),
        // Ours, run forgotten: a new run's append ahead of its append 0, or a late one of the
        // ended run. A successor waits for append 0 and says "has already ended" if none comes.
        None if pinned_ours => t.inner.bidi.for_new_run(request_id),
        None => t.inner.bidi.get_or_create(request_id),
    }
}

/// Merge what one request of `entry`'s run says of its parent. Desktop clients may name the
/// parent on any request of the child, even after its run started: then it is linked now.
fn note_parent(
    t: &AgentTransports,
    entry: &RequestPairing,
    link: &crate::agent::subagents::ParentLink,
) {
    if link.is_empty() {
        return;
    }
    let late = {
        let mut note = entry.parent_note();
        (note.link.merge(link) && note.started).then(|| note.link.clone())
    };
    if let Some(link) = late {
        t.agent().link_parent(&entry.request_id, &link);
    }
}

/// Whether `wire` is the append 0 that started `entry`'s run, sent again.
async fn resent(entry: &RequestPairing, wire: &[u8]) -> bool {
    entry.state.lock().await.first_append == Some(digest(wire))
}

enum Accepted {
    Ours,
    Relay,
}

async fn accept(
    t: &AgentTransports,
    entry: &Arc<RequestPairing>,
    seqno: i64,
    sent: ClientMessage,
    caller: Caller,
) -> Result<Accepted, ConnectError> {
    // Anything but the first append waits for the first to decide. A successor waits briefly:
    // its id's run ended, and an append with no new run behind it is a late one.
    if seqno != 0 && entry.decision().await.is_none() {
        let wait = if entry.successor {
            DECIDE_WAIT
        } else {
            UNDECIDED_WAIT
        };
        entry.await_decision(wait).await;
    }
    // Messages go to the run in seqno order under this lock; `state` is only held while no
    // await can block, so a reader or append 0 never waits behind a busy run.
    let _in_order = entry.deliver.lock().await;
    let (ready, input) = {
        let mut st = entry.state.lock().await;
        if st.decision.is_none() {
            return decide_first(t, entry, &mut st, seqno, sent, caller);
        }
        if st.decision == Some(Decision::Relay) {
            if seqno == 0 && names_ours(&sent.message) {
                return Err(relayed_id_error(&entry.request_id));
            }
            return Ok(Accepted::Relay);
        }
        if seqno < st.next_seqno || st.is_waiting(seqno) {
            debug!("duplicate append ignored");
            return Ok(Accepted::Ours);
        }
        let ready = in_order(entry, &mut st, seqno, sent.message)?;
        (ready, st.input.clone())
    };
    deliver(entry, input, ready, seqno).await
}

/// The first append to arrive on an undecided entry: append 0 decides whose run it is (and
/// starts ours); any other has come without it.
fn decide_first(
    t: &AgentTransports,
    entry: &Arc<RequestPairing>,
    st: &mut Inbound,
    seqno: i64,
    sent: ClientMessage,
    caller: Caller,
) -> Result<Accepted, ConnectError> {
    if seqno != 0 {
        if entry.successor {
            // The id's run of ours ended and no new run came: a late append.
            return Err(run_ended(&entry.request_id, &format!("append {seqno}")));
        }
        // Append 0 never came: nothing says whose run this is, so it goes nowhere.
        return Err(never_decided(&format!(
            "append 0 of this run did not come before append {seqno}"
        )));
    }
    let mut parent = entry.parent_note().link.clone();
    parent.merge(&caller.parent);
    let was_ours = match t.inner.routes.request(&entry.request_id) {
        Some(d @ Decision::Ours { .. }) => Some(d),
        _ => None,
    };
    let decided = t.decide(&entry.request_id, &sent.message, &parent);
    let decided = match (decided, was_ours) {
        // A request id of ours never carries a run to Cursor.
        (Ok(Decision::Relay), Some(ours)) => {
            t.inner.routes.pin_request(&entry.request_id, ours);
            Err(RunError::Withheld(format!(
                "request id {} carried a run on one of your models, and this message starts a \
                 run on Cursor's model",
                entry.request_id
            ))
            .to_connect())
        }
        (d, _) => d,
    };
    let decision = match decided {
        Ok(d) => d,
        Err(e) => {
            refuse(entry, st, &e);
            return Err(e);
        }
    };
    st.decision = Some(decision.clone());
    st.first_append = Some(digest(&sent.wire));
    if let Decision::Ours { .. } = decision {
        start(t, entry, st, sent, &decision, caller)?;
        st.next_seqno = 1;
        entry.decided.notify_waiters();
        return Ok(Accepted::Ours);
    }
    entry.decided.notify_waiters();
    Ok(Accepted::Relay)
}

/// The messages now ready for the run, in seqno order, with `message` (append `seqno`) held
/// when it came ahead of its turn.
fn in_order(
    entry: &RequestPairing,
    st: &mut Inbound,
    seqno: i64,
    message: pb::AgentClientMessage,
) -> Result<Vec<Box<pb::AgentClientMessage>>, ConnectError> {
    if st.run_over || entry.backlog().ended() {
        st.run_over = true;
        if end_on_its_way(entry) {
            return Ok(Vec::new());
        }
        return Err(run_ended(&entry.request_id, &format!("append {seqno}")));
    }
    if seqno - st.next_seqno > MAX_GAP {
        return Err(RunError::Limit(format!(
            "append {seqno} is too far ahead of {} (gap limit {MAX_GAP})",
            st.next_seqno
        ))
        .to_connect());
    }
    // Only appends that arrive ahead of their turn are held (and count against the
    // bounds); the one that is next goes straight to the run.
    let mut ready = Vec::new();
    if seqno == st.next_seqno {
        st.next_seqno += 1;
        ready.push(Box::new(message));
    } else {
        st.hold(seqno, message.encoded_len(), Box::new(message))?;
    }
    // Every message that is now in order (bounded by the gap limit).
    while let Some(m) = st.take_next() {
        ready.push(m);
    }
    Ok(ready)
}

/// Whether a run that ended has a reader on its stream now, which gets the run's end (or has
/// it queued): an append that crossed that end (a heartbeat, a last result) is then accepted and
/// dropped, since the stream tells the client how the run ended; an error here would make the
/// client report the append's failure instead of the run's own end. With no reader, it is
/// refused with a reason.
fn end_on_its_way(entry: &RequestPairing) -> bool {
    entry.backlog().reader_active
}

/// Hand `ready` to the run's inbox, in order.
async fn deliver(
    entry: &RequestPairing,
    input: Option<mpsc::Sender<Box<pb::AgentClientMessage>>>,
    ready: Vec<Box<pb::AgentClientMessage>>,
    seqno: i64,
) -> Result<Accepted, ConnectError> {
    for m in ready {
        // The run's inbox ends with the run, and the run's every wait gives way to its cancel:
        // this send cannot outlive the run.
        let delivered = match &input {
            Some(input) => input.send(m).await.is_ok(),
            None => false,
        };
        if !delivered {
            let mut st = entry.state.lock().await;
            st.input = None;
            st.run_over = true;
            if end_on_its_way(entry) {
                return Ok(Accepted::Ours);
            }
            return Err(run_ended(&entry.request_id, &format!("append {seqno}")));
        }
    }
    Ok(Accepted::Ours)
}

/// Append 0 could not be routed: the request id is answered by us with `e` (its reader gets
/// it as the stream's end), and sent nowhere.
fn refuse(entry: &RequestPairing, st: &mut Inbound, e: &ConnectError) {
    let enc = FrameEncoder::new(Encoding::Identity);
    st.decision = Some(Decision::Ours {
        model_id: String::new(),
    });
    st.run_over = true;
    entry
        .backlog()
        .push(end_frame(&enc, &EndStream::from_error(e.clone())), true);
    entry.decided.notify_waiters();
}

/// Start our run for append 0 and pump its output into the backlog.
fn start(
    t: &AgentTransports,
    entry: &Arc<RequestPairing>,
    st: &mut Inbound,
    first: ClientMessage,
    decision: &Decision,
    caller: Caller,
) -> Result<(), ConnectError> {
    use pb::agent_client_message::Message as In;
    let enc = FrameEncoder::new(Encoding::Identity);
    // Held until the run has registered itself, so a parent named meanwhile is either in the
    // run's request or links it late, never lost in between (no await while held).
    let mut note = entry.parent_note();
    note.link.merge(&caller.parent);
    let caller = caller.with_parent(note.link.clone());
    let run_request = match first.message.message {
        Some(In::RunRequest(r)) => {
            caller.run_request(crate::agent::RunRequest::from_client_message(
                with_pinned_model(r, decision),
                &first.wire,
            ))
        }
        _ => {
            // A prewarm for our model: answered locally with an empty, successful stream.
            st.run_over = true;
            entry
                .backlog()
                .push(end_frame(&enc, &EndStream::ok()), true);
            return Ok(());
        }
    };
    let handle = t
        .agent()
        .start_run_on(run_request, entry.request_id.clone(), "RunSSE");
    note.started = true;
    drop(note);
    st.input = Some(handle.input.clone());
    entry.run_started(handle.failer());
    let capture = t.agent().status().capture().cloned();
    tokio::spawn(pump(entry, handle.output, enc, capture).in_current_span());
    Ok(())
}

/// Moves the run's output into the backlog, at most [`MAX_UNREAD`] frames ahead of the reader.
/// It ends with the run's end, or when the client has left for good: then the run's output has
/// nowhere to go, and dropping `output` ends every send of the run at once.
fn pump(
    entry: &RequestPairing,
    mut output: mpsc::Receiver<RunOutput>,
    enc: FrameEncoder,
    capture: Option<Capture>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let out = entry.out.clone();
    let gone = entry.gone.clone();
    async move {
        loop {
            let o = tokio::select! {
                _ = gone.cancelled() => return,
                o = output.recv() => o,
            };
            let Some(o) = o else { return };
            // What is already queued behind it goes too, its deltas merged.
            for o in burst(o, &mut output, MERGED_TEXT) {
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
                        tokio::select! {
                            _ = gone.cancelled() => return,
                            _ = notified => {}
                        }
                    }
                }
            }
        }
    }
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
/// run is ended (the client left).
struct SseBody {
    entry: Arc<RequestPairing>,
    registry: Pairings,
    generation: u64,
    finished: bool,
}

impl SseBody {
    fn attach(entry: Arc<RequestPairing>, registry: Pairings) -> Self {
        let generation = {
            let mut b = entry.backlog();
            b.reader += 1;
            b.reader_active = true;
            // Frames handed to the reader this one replaces may have died with its connection.
            b.rewind();
            if let Some(w) = b.waker.take() {
                w.wake(); // the previous reader sees it has been replaced
            }
            b.reader
        };
        SseBody {
            entry,
            registry,
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
        let entry = self.entry.clone();
        let mut b = entry.backlog();
        if b.reader != self.generation {
            self.finished = true;
            return Poll::Ready(None);
        }
        // Asked again: hyper took what it was handed before.
        b.confirm();
        if let Some(frame) = b.next_unread() {
            return Poll::Ready(Some(Ok(Frame::data(frame))));
        }
        if b.ended() {
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
        let (ended, current) = {
            let mut b = self.entry.backlog();
            let current = b.reader == self.generation;
            if current {
                b.reader_active = false;
                if !self.finished {
                    // Dropped mid-stream: what it was handed last may never have been written.
                    b.rewind();
                }
            }
            (b.ended(), current)
        };
        if ended {
            self.registry.forget_if_done(&self.entry);
            return;
        }
        if !current {
            return;
        }
        // The client went away mid-run: give it a moment to reconnect, then end the run.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let entry = self.entry.clone();
        let generation = self.generation;
        rt.spawn(async move {
            tokio::time::sleep(READER_GRACE).await;
            let abandoned = {
                let b = entry.backlog();
                b.reader == generation && !b.reader_active && !b.ended()
            };
            if abandoned {
                debug!(request_id = %entry.request_id, "RunSSE reader gone: ending the run");
                entry.abandon(format!(
                    "its RunSSE stream closed and no new one came within {} s",
                    READER_GRACE.as_secs()
                ));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::pairing::PairingLimits;
    use super::*;
    use http_body_util::BodyExt;

    async fn next(body: &mut SseBody) -> Option<u8> {
        let frame = body.frame().await?.ok()?;
        Some(frame.into_data().ok()?[0])
    }

    /// A frame is only taken once the reader asks for the next one: frames handed to a reader
    /// that is dropped (its connection died) or replaced go to the next reader again.
    #[tokio::test(start_paused = true)]
    async fn frames_a_reader_never_confirmed_go_to_the_next_one() {
        let registry = Pairings::new(PairingLimits::default());
        let entry = registry.get_or_create("run").unwrap();
        for i in 0..3u8 {
            entry.backlog().push(Bytes::from(vec![i]), false);
        }
        let mut first = SseBody::attach(entry.clone(), registry.clone());
        assert_eq!(next(&mut first).await, Some(0));
        assert_eq!(next(&mut first).await, Some(1)); // 0 is taken; 1 is only handed
        drop(first);
        let mut second = SseBody::attach(entry.clone(), registry.clone());
        assert_eq!(next(&mut second).await, Some(1));
        assert_eq!(next(&mut second).await, Some(2));
        // A newer reader replaces it: 2 was never confirmed.
        let mut third = SseBody::attach(entry.clone(), registry.clone());
        assert_eq!(next(&mut second).await, None, "the replaced reader stops");
        assert_eq!(next(&mut third).await, Some(2));
        entry.backlog().push(Bytes::from_static(&[9]), true);
        assert_eq!(next(&mut third).await, Some(9));
        assert_eq!(next(&mut third).await, None);
        assert!(entry.read_out());
    }
}
