//! Pure stream decoding: bytes → SSE events → [`ProviderEvent`]s, no IO.
//!
//! The HTTP layer feeds network chunks in; tests feed fixtures split anywhere and must get the
//! same events.

use super::anthropic::AnthropicMachine;
use super::gemini::GeminiMachine;
use super::machine::{DecodeCtx, Machine};
use super::openai_chat::ChatMachine;
use super::openai_responses::ResponsesMachine;
use super::schema::ToolNames;
use super::sse::{SseEvent, SseParser};
use super::types::ProviderEvent;
use super::ProviderKind;

/// Decodes one response body of a given provider kind into [`ProviderEvent`]s.
///
/// Output ends with exactly one terminal event (`Finished` or `Error`) once the stream is
/// complete; anything the provider sends after it is ignored.
pub struct StreamDecoder {
    sse: SseParser,
    machine: Box<dyn Machine>,
    /// Tool names as sent, mapped back to ours in the events.
    names: ToolNames,
    done: bool,
}

impl StreamDecoder {
    /// `origin` is the replay identity stamped on extras; `provider_name` appears in errors.
    pub fn new(kind: ProviderKind, origin: &str, provider_name: &str) -> Self {
        let ctx = DecodeCtx {
            kind,
            origin: origin.to_string(),
            name: provider_name.to_string(),
        };
        let machine: Box<dyn Machine> = match kind {
            ProviderKind::OpenAiChat => Box::new(ChatMachine::new(ctx)),
            ProviderKind::OpenAiResponses => Box::new(ResponsesMachine::new(ctx)),
            ProviderKind::Anthropic => Box::new(AnthropicMachine::new(ctx)),
            ProviderKind::Gemini => Box::new(GeminiMachine::new(ctx)),
        };
        StreamDecoder {
            sse: SseParser::new(),
            machine,
            names: ToolNames::default(),
            done: false,
        }
    }

    /// Map the tool names of the request (see `schema::prepare_request`) back in tool-call events.
    pub(crate) fn set_tool_names(&mut self, names: ToolNames) {
        self.names = names;
    }

    /// Whether a terminal event was produced.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Bytes buffered for an incomplete event.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.sse.pending_bytes()
    }

    pub fn feed(&mut self, chunk: &[u8]) -> Vec<ProviderEvent> {
        if self.done {
            return Vec::new();
        }
        let events = self.sse.feed(chunk);
        self.run(events, false)
    }

    /// End of body.
    pub fn finish(&mut self) -> Vec<ProviderEvent> {
        if self.done {
            return Vec::new();
        }
        let events = self.sse.finish();
        self.run(events, true)
    }

    fn run(&mut self, events: Vec<SseEvent>, eof: bool) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        for ev in events {
            self.machine.on_event(ev, &mut out);
            if self.cut_at_terminal(&mut out) {
                self.restore_names(&mut out);
                return out;
            }
        }
        if eof {
            self.machine.on_eof(&mut out);
            self.cut_at_terminal(&mut out);
        }
        self.restore_names(&mut out);
        out
    }

    fn restore_names(&self, out: &mut [ProviderEvent]) {
        if self.names.is_identity() {
            return;
        }
        for ev in out {
            if let ProviderEvent::ToolCallStarted { name, .. }
            | ProviderEvent::ToolCallFinished { name, .. } = ev
            {
                let original = self.names.original(name);
                if original != name {
                    *name = original.to_string();
                }
            }
        }
    }

    fn cut_at_terminal(&mut self, out: &mut Vec<ProviderEvent>) -> bool {
        if let Some(pos) = out.iter().position(ProviderEvent::is_terminal) {
            out.truncate(pos + 1);
            self.done = true;
        }
        self.done
    }
}

/// Decode a whole body at once.
pub fn decode_all(
    kind: ProviderKind,
    origin: &str,
    provider_name: &str,
    body: &[u8],
) -> Vec<ProviderEvent> {
    let mut d = StreamDecoder::new(kind, origin, provider_name);
    let mut out = d.feed(body);
    out.extend(d.finish());
    out
}
