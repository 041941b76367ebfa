//! The one body type every handler answers with.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Errors a body can end with (hyper's, a provider's, a codec's).
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming body: frames flow as they are produced, never buffered whole. `Send` but not
/// `Sync`, so channel- or stream-backed bodies fit without wrappers.
pub type Body = UnsyncBoxBody<Bytes, BodyError>;

/// Box any body whose error converts into [`BodyError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BodyError>,
{
    body.map_err(Into::into).boxed_unsync()
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    boxed(Full::new(bytes.into()))
}

pub fn empty() -> Body {
    boxed(Empty::<Bytes>::new())
}
