//! Bodies the transports answer with: a run's output as Connect frames, and a request body
//! replayed upstream after we peeked at its first frames.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::RunOutput;
use crate::connect::{Code, ConnectError, EndStream, FrameEncoder};
use crate::router::{boxed, Body, BodyError};

/// Encodes one run output as a Connect frame. Encoding only fails for an oversized message,
/// which becomes an error end frame instead.
pub(crate) fn encode_output(enc: &FrameEncoder, out: RunOutput) -> (Bytes, bool) {
    match out {
        RunOutput::Message(m) => match enc.message(&m.encode_to_vec()) {
            Ok(b) => (b, false),
            Err(e) => (
                end_frame(
                    enc,
                    &EndStream::from_error(ConnectError::new(e.code(), e.to_string())),
                ),
                true,
            ),
        },
        RunOutput::End(end) => (end_frame(enc, &end), true),
    }
}

pub(crate) fn end_frame(enc: &FrameEncoder, end: &EndStream) -> Bytes {
    // An end frame is small JSON: it always fits a frame.
    enc.end_stream(end)
        .unwrap_or_else(|_| Bytes::from_static(b"\x02\x00\x00\x00\x02{}"))
}

/// A run's output as a streaming body. Dropping it before the end (the client went away)
/// cancels the run.
pub(crate) struct RunBody {
    rx: mpsc::Receiver<RunOutput>,
    enc: FrameEncoder,
    cancel: CancellationToken,
    done: bool,
}

impl RunBody {
    pub(crate) fn new(
        rx: mpsc::Receiver<RunOutput>,
        enc: FrameEncoder,
        cancel: CancellationToken,
    ) -> Self {
        RunBody {
            rx,
            enc,
            cancel,
            done: false,
        }
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
            Poll::Ready(Some(out)) => {
                let (bytes, end) = encode_output(&self.enc, out);
                self.done = end;
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
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
            self.cancel.cancel();
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
