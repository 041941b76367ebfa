//! What every provider's stream machine shares: who is speaking, and the machine interface the
//! decoder drives. Below the machines and the decoder that picks one, so neither imports the
//! other.

use super::error::{ProviderError, ProviderErrorKind};
use super::sse::SseEvent;
use super::types::{ExtraData, ProviderEvent, ProviderExtra};
use super::ProviderKind;

/// Who is speaking: tags extras and names the provider in errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeCtx {
    pub kind: ProviderKind,
    /// Replay identity (see `ProviderSettings::identity`).
    pub origin: String,
    /// Display name for errors.
    pub name: String,
}

impl DecodeCtx {
    pub(crate) fn extra(&self, data: ExtraData) -> ProviderExtra {
        ProviderExtra {
            kind: self.kind,
            origin: self.origin.clone(),
            data,
        }
    }

    pub(crate) fn decode_error(&self, err: &serde_json::Error, data: &str) -> ProviderEvent {
        let snippet = crate::base::text::cut_chars(data, 120, "…");
        ProviderEvent::Error(ProviderError::new(
            ProviderErrorKind::Decode,
            &self.name,
            format!("bad event JSON ({err}): {snippet}"),
        ))
    }
}

/// One provider's event-stream state machine.
pub(crate) trait Machine: Send {
    fn on_event(&mut self, ev: SseEvent, out: &mut Vec<ProviderEvent>);
    /// The body ended; finish or report a truncated stream.
    fn on_eof(&mut self, out: &mut Vec<ProviderEvent>);
}
