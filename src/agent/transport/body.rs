//! Bodies the transports read and answer with: a request's Connect frames peeked at (and
//! replayed upstream after), a bounded unary body, a run's output as Connect frames, and the
//! responses that carry them.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prost::Message;
use tokio::sync::mpsc;

use super::deltas::Deltas;
use crate::agent::{RunFailer, RunOutput};
use crate::capture::{Capture, Direction};
use crate::connect::{Code, ConnectError, Encoding, EndStream, FrameDecoder, FrameEncoder, Limits};
use crate::http::{boxed, full, Body, BodyError};
use http::{HeaderValue, Response};

/// Encodes one run output as a Connect frame. Encoding only fails for an oversized message,
/// which becomes an error end frame instead.
/// With a `capture`, the message (or the end's code) is recorded first.
pub(crate) fn encode_output(
    enc: &FrameEncoder,
    out: RunOutput,
    capture: Option<&Capture>,
) -> (Bytes, bool) {
    let wire = match out {
        RunOutput::Message(m) => Bytes::from(m.encode_to_vec()),
        RunOutput::Encoded(_, bytes) => bytes,
        RunOutput::End(end) => {
            if let Some(c) = capture {
                c.end_of_stream(end.error.as_ref().map(|e| e.code.as_str()));
            }
            return (end_frame(enc, &end), true);
        }
    };
    if let Some(c) = capture {
        c.message(
            Direction::ToClient,
            "agent run",
            "agent.v1.AgentServerMessage",
            &wire,
            None,
            None,
        );
    }
    let encoded = enc.message(&wire);
    match encoded {
        Ok(b) => (b, false),
        Err(e) => (
            end_frame(
                enc,
                &EndStream::from_error(ConnectError::new(e.code(), e.to_string())),
            ),
            true,
        ),
    }
}

pub(crate) fn end_frame(enc: &FrameEncoder, end: &EndStream) -> Bytes {
    // An end frame is small JSON: it always fits a frame.
    enc.end_stream(end)
        .unwrap_or_else(|_| Bytes::from_static(b"\x02\x00\x00\x00\x02{}"))
}

/// Queued frames are joined into one body chunk up to this size (a TLS record is 16 KiB).
const COALESCE_BYTES: usize = 16 * 1024;

/// A run's output as a streaming body. Dropping it before the end (the client went away)
/// ends the run, blaming the client side.
pub(crate) struct RunBody {
    rx: mpsc::Receiver<RunOutput>,
    enc: FrameEncoder,
    failer: RunFailer,
    done: bool,
    capture: Option<Capture>,
}

impl RunBody {
    /// `first` and the outputs already queued behind it as one body chunk (a delta and its
    /// token count come in pairs, a fast model in bursts): one HTTP/2 DATA frame or HTTP/1.1
    /// chunk, one TLS record and one write instead of one each per frame, with each run of
    /// text and token deltas merged into one of each ([`Deltas`]). Never waits: what is not
    /// queued yet goes in a later chunk, so the first delta of a burst leaves at once.
    fn chunk(&mut self, first: RunOutput) -> Bytes {
        let mut chunk = BytesMut::new();
        let mut deltas = Deltas::default();
        let mut next = Some(first);
        while let Some(out) = next.take() {
            if let Err(other) = deltas.take(out) {
                self.encode(deltas.drain(), &mut chunk);
                self.encode([other], &mut chunk);
            }
            if self.done || chunk.len() + deltas.text_len() >= COALESCE_BYTES {
                break;
            }
            next = self.rx.try_recv().ok();
        }
        self.encode(deltas.drain(), &mut chunk);
        chunk.freeze()
    }

    /// Append `outs` to `chunk` as frames, up to the end frame.
    fn encode(&mut self, outs: impl IntoIterator<Item = RunOutput>, chunk: &mut BytesMut) {
        for out in outs {
            if self.done {
                return;
            }
            let (bytes, end) = encode_output(&self.enc, out, self.capture.as_ref());
            chunk.extend_from_slice(&bytes);
            self.done = end;
        }
    }

    pub(crate) fn new(rx: mpsc::Receiver<RunOutput>, enc: FrameEncoder, failer: RunFailer) -> Self {
        RunBody {
            rx,
            enc,
            failer,
            done: false,
            capture: None,
        }
    }

    /// Record what the body sends into `capture` (`run --capture`).
    pub(crate) fn capturing(mut self, capture: Option<Capture>) -> Self {
        self.capture = capture;
        self
    }
}

impl HttpBody for RunBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(out)) => Poll::Ready(Some(Ok(Frame::data(self.chunk(out))))),
            Poll::Ready(None) => {
                // The run always sends an End; reaching here means it was lost: say so.
                self.done = true;
                let end = EndStream::from_error(ConnectError::new(
                    Code::Internal,
                    "cursor-byok: the agent run stopped without ending its stream",
                ));
                Poll::Ready(Some(Ok(Frame::data(end_frame(&self.enc, &end)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for RunBody {
    fn drop(&mut self) {
        if !self.done {
            self.failer
                .client_left("its Run stream closed before the run ended");
        }
    }
}

/// The bytes we already read from a request, followed by the rest of it.
pub(crate) fn replay(prefix: Bytes, rest: Incoming) -> Body {
    use futures_util::StreamExt;
    let head = futures_util::stream::iter(
        (!prefix.is_empty()).then(|| Ok::<_, BodyError>(Frame::data(prefix))),
    );
    let tail = http_body_util::BodyStream::new(rest.map_err(BodyError::from));
    boxed(http_body_util::StreamBody::new(head.chain(tail)))
}

/// Reads a streaming request body until its first Connect frame, keeping every byte read so
/// the request can be replayed upstream unchanged.
pub(crate) struct FramePeek {
    decoder: FrameDecoder,
    pub(crate) consumed: BytesMut,
}

impl FramePeek {
    pub(crate) fn new(encoding: Encoding, limits: Limits) -> Self {
        FramePeek {
            decoder: FrameDecoder::new(crate::connect::StreamKind::Request, encoding, limits),
            consumed: BytesMut::new(),
        }
    }

    /// The next message frame; `Ok(None)` when the body ended first.
    pub(crate) async fn next(
        &mut self,
        body: &mut Incoming,
        keep: bool,
    ) -> Result<Option<Bytes>, ConnectError> {
        use crate::connect::Frame;
        loop {
            match self.decoder.next_frame() {
                Ok(Some(Frame::Message(m))) => return Ok(Some(m)),
                Ok(Some(Frame::End(_))) => {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "end-of-stream frame in a request",
                    ))
                }
                Ok(None) => {}
                Err(e) => return Err(ConnectError::new(e.code(), e.to_string())),
            }
            match body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("client request body failed: {e}"),
                    ))
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if keep {
                            self.consumed.extend_from_slice(&data);
                        }
                        self.decoder.feed(data);
                    }
                }
            }
        }
    }
}

/// After refusing an oversized body, at most this much more of it is read and dropped, for at
/// most [`DRAIN_TIME`]: an HTTP/1.1 client still sending it then reads our error instead of a
/// reset connection (closing with unread input makes the kernel answer with a reset).
const DRAIN_BYTES: usize = 8 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads a whole unary body, bounded. A body whose declared length is over `max` is refused
/// before any of it is read.
pub(crate) async fn read_bounded(mut body: Incoming, max: usize) -> Result<Bytes, ConnectError> {
    let too_large = |len: String| {
        client_error(
            Code::ResourceExhausted,
            "Request too large",
            format!("cursor-byok: the request body is larger than {max} bytes ({len})"),
            false,
        )
    };
    let declared = body.size_hint().lower();
    if declared > u64::try_from(max).unwrap_or(u64::MAX) {
        // Draining only helps a client that will finish soon; one declaring far more is cut off.
        if declared - u64::try_from(max).unwrap_or(u64::MAX) <= DRAIN_BYTES as u64 {
            drain(body).await;
        }
        return Err(too_large(format!("{declared} bytes declared")));
    }
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("request body unreadable: {e}"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing a unary Connect body carries
        };
        if buf.len() + data.len() > max {
            drain(body).await;
            return Err(too_large(format!(
                "{} bytes so far",
                buf.len() + data.len()
            )));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// A request refused for what the client sent: `code`, with the `aiserver.v1.ErrorDetails`
/// Cursor shows as "<title> <message>", naming the client's side; `retry` when sending the
/// same again later can work.
pub(crate) fn client_error(code: Code, title: &str, message: String, retry: bool) -> ConnectError {
    use crate::proto::aiserver::v1 as aiserver;
    let details = aiserver::ErrorDetails {
        error: aiserver::error_details::Error::CustomMessage as i32,
        details: Some(aiserver::CustomErrorDetails {
            title: title.to_string(),
            detail: message.clone(),
            is_retryable: Some(retry),
            additional_info: [("side".to_string(), crate::base::Side::Client.to_string())].into(),
            ..Default::default()
        }),
        is_expected: Some(true),
    };
    ConnectError::new(code, message)
        .with_detail(crate::connect::ErrorDetail::error_details(&details))
}

/// Read and drop the rest of `body`, bounded by [`DRAIN_BYTES`] and [`DRAIN_TIME`].
async fn drain(mut body: Incoming) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut dropped = 0;
        while dropped < DRAIN_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => dropped += frame.data_ref().map_or(0, Bytes::len),
                _ => break,
            }
        }
    })
    .await;
}

/// A Connect error as an HTTP response (for unary calls and for failures before streaming).
pub(crate) fn error_response(err: &ConnectError) -> Response<Body> {
    let mut resp = Response::new(full(err.to_unary_json()));
    *resp.status_mut() = http::StatusCode::from_u16(err.http_status())
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// A `Run` (or RunSSE) answered with nothing but an error end frame.
pub(crate) fn stream_error(e: ConnectError) -> Response<Body> {
    let enc = FrameEncoder::new(Encoding::Identity);
    streaming_response(full(end_frame(&enc, &EndStream::from_error(e))))
}

pub(crate) fn streaming_response(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+proto"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::{Encoding, Frame as ConnectFrame, FrameDecoder, Limits, StreamKind};
    use futures_util::FutureExt;
    use tokio_util::sync::CancellationToken;

    fn decode_all(chunk: &Bytes) -> Vec<ConnectFrame> {
        let mut dec =
            FrameDecoder::new(StreamKind::Response, Encoding::Identity, Limits::default());
        dec.feed(chunk.clone());
        std::iter::from_fn(|| dec.next_frame().unwrap()).collect()
    }

    fn message() -> RunOutput {
        RunOutput::Message(Box::default())
    }

    async fn next_chunk(body: &mut RunBody) -> Bytes {
        body.frame().await.unwrap().unwrap().into_data().unwrap()
    }

    #[tokio::test]
    async fn queued_frames_go_out_as_one_chunk_and_none_waits() {
        let (tx, rx) = mpsc::channel(16);
        let mut body = RunBody::new(
            rx,
            FrameEncoder::new(Encoding::Identity),
            RunFailer::new(CancellationToken::new()),
        );
        for _ in 0..3 {
            tx.send(message()).await.unwrap();
        }
        assert_eq!(decode_all(&next_chunk(&mut body).await).len(), 3);
        assert!(
            body.frame().now_or_never().is_none(),
            "nothing queued: the body waits for the run"
        );

        tx.send(message()).await.unwrap();
        tx.send(RunOutput::End(EndStream::ok())).await.unwrap();
        tx.send(message()).await.unwrap(); // after the end: never sent
        let frames = decode_all(&next_chunk(&mut body).await);
        assert_eq!(frames.len(), 2);
        assert!(matches!(frames[1], ConnectFrame::End(_)));
        assert!(body.frame().await.is_none());
    }

    fn text(t: &str) -> RunOutput {
        RunOutput::Message(Box::new(crate::agent::messages::text_delta(t.into())))
    }

    fn tokens(n: u32) -> RunOutput {
        RunOutput::Message(Box::new(crate::agent::messages::token_delta(n)))
    }

    /// What each frame of `chunk` is: "text:<text>", "tokens:<n>", "other" or "end".
    fn kinds(chunk: &Bytes) -> Vec<String> {
        use crate::proto::agent::v1 as pb;
        use pb::agent_server_message::Message as Server;
        use pb::interaction_update::Message as Update;
        decode_all(chunk)
            .into_iter()
            .map(|f| match f {
                ConnectFrame::End(_) => "end".to_string(),
                ConnectFrame::Message(m) => {
                    let m = pb::AgentServerMessage::decode(m).unwrap();
                    match m.message {
                        Some(Server::InteractionUpdate(pb::InteractionUpdate {
                            message: Some(Update::TextDelta(t)),
                            ..
                        })) => format!("text:{}", t.text),
                        Some(Server::InteractionUpdate(pb::InteractionUpdate {
                            message: Some(Update::TokenDelta(t)),
                            ..
                        })) => format!("tokens:{}", t.tokens),
                        _ => "other".to_string(),
                    }
                }
            })
            .collect()
    }

    fn body(rx: mpsc::Receiver<RunOutput>) -> RunBody {
        RunBody::new(
            rx,
            FrameEncoder::new(Encoding::Identity),
            RunFailer::new(CancellationToken::new()),
        )
    }

    #[tokio::test]
    async fn queued_deltas_merge_and_the_first_is_never_held_back() {
        let (tx, rx) = mpsc::channel(16);
        let mut body = body(rx);
        // Alone, the first delta goes out at once, as it is.
        tx.send(text("a")).await.unwrap();
        assert_eq!(kinds(&next_chunk(&mut body).await), ["text:a"]);
        tx.send(tokens(1)).await.unwrap();
        for (t, n) in [("b", 2), ("c", 3)] {
            tx.send(text(t)).await.unwrap();
            tx.send(tokens(n)).await.unwrap();
        }
        assert_eq!(kinds(&next_chunk(&mut body).await), ["text:bc", "tokens:6"]);
        assert!(body.frame().now_or_never().is_none());
    }

    #[tokio::test]
    async fn a_message_between_deltas_keeps_its_place() {
        let (tx, rx) = mpsc::channel(16);
        let mut body = body(rx);
        tx.send(text("a")).await.unwrap();
        tx.send(tokens(1)).await.unwrap();
        tx.send(message()).await.unwrap();
        tx.send(RunOutput::Message(Box::new(
            crate::agent::messages::notice("n".into()),
        )))
        .await
        .unwrap();
        tx.send(text("b")).await.unwrap();
        tx.send(text("c")).await.unwrap();
        tx.send(RunOutput::End(EndStream::ok())).await.unwrap();
        tx.send(text("after the end")).await.unwrap();
        assert_eq!(
            kinds(&next_chunk(&mut body).await),
            ["text:a", "tokens:1", "other", "text:n", "text:bc", "end"]
        );
        assert!(body.frame().await.is_none());
    }

    /// A burst larger than a chunk leaves in chunks of about [`COALESCE_BYTES`], all of its
    /// text in order.
    #[tokio::test]
    async fn merged_text_is_bounded_by_the_chunk_size() {
        let (tx, rx) = mpsc::channel(4096);
        let mut body = body(rx);
        let piece = "x".repeat(100);
        let pieces = 3 * COALESCE_BYTES / piece.len();
        for _ in 0..pieces {
            tx.send(text(&piece)).await.unwrap();
        }
        let mut texts = Vec::new();
        while texts.iter().map(String::len).sum::<usize>() < pieces * piece.len() {
            let chunk = next_chunk(&mut body).await;
            assert!(chunk.len() <= COALESCE_BYTES + piece.len() + 64);
            let k = kinds(&chunk);
            assert_eq!(k.len(), 1, "one merged delta per chunk");
            texts.push(k[0].trim_start_matches("text:").to_string());
        }
        assert!(texts.len() >= 3);
        assert_eq!(texts.concat(), piece.repeat(pieces));
    }
}
