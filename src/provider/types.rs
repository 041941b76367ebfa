//! Provider-neutral request, history and event types.
//!
//! The agent keeps its history in these types (they are serde-serializable so it can persist
//! them); each implementation translates them to its wire format. Provider-native data that must
//! go back verbatim (Anthropic thinking signatures, DeepSeek `reasoning_content`, Responses
//! encrypted reasoning, Gemini thought signatures) rides along as a [`ProviderExtra`] tagged
//! with where it came from, and is replayed only to that same provider.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ProviderError;
use super::ProviderKind;

/// One model call: everything a provider needs, nothing about Cursor.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ProviderRequest {
    pub model: String,
    /// System prompt; empty means none.
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub options: RequestOptions,
}

/// Generation options; `None` leaves the provider's default.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RequestOptions {
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    /// OpenAI-style effort (`minimal`, `low`, `medium`, `high`, ...): sent as `reasoning_effort`
    /// (Chat) or `reasoning.effort` (Responses). Ignored by Anthropic, which uses
    /// [`RequestOptions::thinking_budget`].
    pub reasoning_effort: Option<String>,
    /// Anthropic extended-thinking budget in tokens (minimum 1024 on the wire).
    pub thinking_budget: Option<u32>,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// One history entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    User {
        parts: Vec<UserPart>,
    },
    Assistant {
        parts: Vec<AssistantPart>,
    },
    /// The result of one tool call; `is_error` marks a failed call (Anthropic sends it as
    /// `is_error`, the OpenAI APIs have no flag so the content is prefixed with `Error: `).
    ToolResult {
        call_id: String,
        name: String,
        content: String,
        is_error: bool,
    },
}

impl Message {
    pub fn user_text(text: impl Into<String>) -> Self {
        Message::User {
            parts: vec![UserPart::Text { text: text.into() }],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum UserPart {
    Text {
        text: String,
    },
    /// An image; `data` is standard base64 (no `data:` prefix).
    Image {
        mime_type: String,
        data: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AssistantPart {
    Text {
        text: String,
    },
    /// Reasoning as shown to the user, plus what the provider needs to see it again.
    Reasoning {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        extra: Option<ProviderExtra>,
    },
    /// `arguments` is the parsed JSON object; when parsing failed it is the raw string.
    ToolCall {
        id: String,
        name: String,
        arguments: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        extra: Option<ProviderExtra>,
    },
}

/// Provider-native replay data, tagged with the provider that produced it.
///
/// Replayed only when both `kind` and `origin` match the client sending the history (see
/// `ProviderSettings::identity`): a DeepSeek `reasoning_content` must not reach OpenAI, an
/// Anthropic signature is meaningless elsewhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderExtra {
    pub kind: ProviderKind,
    /// Identity of the endpoint that produced it (by default its base URL).
    pub origin: String,
    pub data: ExtraData,
}

impl ProviderExtra {
    /// Whether this extra may be sent to the provider `kind` at `origin`.
    pub(crate) fn replays_to(&self, kind: ProviderKind, origin: &str) -> bool {
        self.kind == kind && self.origin == origin
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExtraData {
    /// Anthropic `thinking` block; the signature covers `thinking` byte for byte.
    AnthropicThinking { thinking: String, signature: String },
    /// Anthropic `redacted_thinking` block (opaque).
    AnthropicRedactedThinking { data: String },
    /// Chat Completions reasoning that arrived in `field` (`reasoning_content` or `reasoning`);
    /// the text is the reasoning part's text.
    ChatReasoning { field: String },
    /// Chat Completions tool-call `extra_content` (Gemini's thought signatures live there).
    ChatToolCall { extra_content: Value },
    /// Responses `reasoning` output item.
    ResponsesReasoning {
        id: String,
        encrypted_content: Option<String>,
        summary: Vec<String>,
    },
    /// Gemini thought parts (`thought: true`) and the `thoughtSignature` that came on them.
    GeminiThought { signature: String },
    /// Gemini `thoughtSignature` that came on a text part: replayed on the text part before it,
    /// or (`empty_part`) on an empty text part of its own, as it arrived.
    GeminiTextSignature { signature: String, empty_part: bool },
    /// Gemini `thoughtSignature` of a `functionCall` part (the first call of a step has one).
    GeminiCall { signature: String },
}

/// Token counts, normalised across providers:
///
/// - `input`: every prompt token of the call, *including* cache reads and cache writes (OpenAI's
///   `prompt_tokens` / `input_tokens` already are; Anthropic's `input_tokens` excludes cache
///   tokens, so its three counters are summed).
/// - `cache_read`, `cache_write`: the parts of `input` served from / written to the prompt cache.
/// - `output`: every generated token, *including* reasoning; `reasoning` is that subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reasoning: u64,
}

/// Why the model stopped. When tool calls were produced and the provider said a plain "stop"
/// (some OpenAI-compatible servers do), the reason is normalised to `ToolCalls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Refusal,
    Other(String),
}

/// Tool-call arguments that did not parse as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolArgsError {
    pub error: String,
    pub raw: String,
}

/// What a provider stream yields. The stream ends after `Finished` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderEvent {
    TextDelta(String),
    ReasoningDelta(String),
    /// A reasoning block ended; `extra` is what must be replayed with it (if anything).
    ReasoningDone {
        extra: Option<ProviderExtra>,
    },
    ToolCallStarted {
        id: String,
        name: String,
    },
    ToolCallArgsDelta {
        id: String,
        delta: String,
    },
    /// Arguments are parsed here; empty arguments count as `{}`.
    ToolCallFinished {
        id: String,
        name: String,
        arguments: Result<Value, ToolArgsError>,
        extra: Option<ProviderExtra>,
    },
    /// Final usage of the call, sent once just before `Finished` when the provider reported it.
    Usage(Usage),
    Finished {
        reason: FinishReason,
    },
    Error(ProviderError),
}

impl ProviderEvent {
    /// `Finished` and `Error` end the stream.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ProviderEvent::Finished { .. } | ProviderEvent::Error(_)
        )
    }
}

/// Parse accumulated tool-call arguments; empty or blank means `{}`.
pub(crate) fn parse_arguments(raw: &str) -> Result<Value, ToolArgsError> {
    if raw.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(raw).map_err(|e| ToolArgsError {
        error: e.to_string(),
        raw: raw.to_string(),
    })
}

/// The outcome of one streamed call, assembled from its events: the assistant message to append
/// to the history (extras attached), plus usage, finish reason and error.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Always a `Message::Assistant`.
    pub message: Message,
    pub usage: Option<Usage>,
    pub finish: Option<FinishReason>,
    pub error: Option<ProviderError>,
}

impl Turn {
    pub fn parts(&self) -> &[AssistantPart] {
        match &self.message {
            Message::Assistant { parts } => parts,
            _ => &[],
        }
    }

    /// All text parts concatenated.
    pub fn text(&self) -> String {
        self.parts()
            .iter()
            .filter_map(|p| match p {
                AssistantPart::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// All reasoning text concatenated.
    pub fn reasoning(&self) -> String {
        self.parts()
            .iter()
            .filter_map(|p| match p {
                AssistantPart::Reasoning { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// `(id, name, arguments, extra)` of every tool call, in order.
    pub fn tool_calls(&self) -> Vec<(&str, &str, &Value, Option<&ProviderExtra>)> {
        self.parts()
            .iter()
            .filter_map(|p| match p {
                AssistantPart::ToolCall {
                    id,
                    name,
                    arguments,
                    extra,
                } => Some((id.as_str(), name.as_str(), arguments, extra.as_ref())),
                _ => None,
            })
            .collect()
    }
}

/// Folds [`ProviderEvent`]s into a [`Turn`].
#[derive(Debug, Default)]
pub struct TurnBuilder {
    parts: Vec<AssistantPart>,
    /// Index in `parts` of the reasoning block still receiving deltas.
    open_reasoning: Option<usize>,
    usage: Option<Usage>,
    finish: Option<FinishReason>,
    error: Option<ProviderError>,
}

impl TurnBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, event: &ProviderEvent) {
        match event {
            ProviderEvent::TextDelta(t) => {
                if let Some(AssistantPart::Text { text }) = self.parts.last_mut() {
                    text.push_str(t);
                } else {
                    self.parts.push(AssistantPart::Text { text: t.clone() });
                }
            }
            ProviderEvent::ReasoningDelta(t) => match self.open_reasoning {
                Some(i) => {
                    if let Some(AssistantPart::Reasoning { text, .. }) = self.parts.get_mut(i) {
                        text.push_str(t);
                    }
                }
                None => {
                    self.open_reasoning = Some(self.parts.len());
                    self.parts.push(AssistantPart::Reasoning {
                        text: t.clone(),
                        extra: None,
                    });
                }
            },
            ProviderEvent::ReasoningDone { extra } => match self.open_reasoning.take() {
                Some(i) => {
                    if let Some(AssistantPart::Reasoning { extra: slot, .. }) =
                        self.parts.get_mut(i)
                    {
                        *slot = extra.clone();
                    }
                }
                None => self.parts.push(AssistantPart::Reasoning {
                    text: String::new(),
                    extra: extra.clone(),
                }),
            },
            ProviderEvent::ToolCallStarted { .. } | ProviderEvent::ToolCallArgsDelta { .. } => {}
            ProviderEvent::ToolCallFinished {
                id,
                name,
                arguments,
                extra,
            } => self.parts.push(AssistantPart::ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: match arguments {
                    Ok(v) => v.clone(),
                    Err(e) => Value::String(e.raw.clone()),
                },
                extra: extra.clone(),
            }),
            ProviderEvent::Usage(u) => self.usage = Some(*u),
            ProviderEvent::Finished { reason } => self.finish = Some(reason.clone()),
            ProviderEvent::Error(e) => self.error = Some(e.clone()),
        }
    }

    pub fn finish(self) -> Turn {
        Turn {
            message: Message::Assistant { parts: self.parts },
            usage: self.usage,
            finish: self.finish,
            error: self.error,
        }
    }

    /// Convenience: fold a whole event list.
    pub fn collect<'a>(events: impl IntoIterator<Item = &'a ProviderEvent>) -> Turn {
        let mut b = TurnBuilder::new();
        for e in events {
            b.push(e);
        }
        b.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_arguments_are_an_empty_object() {
        assert_eq!(parse_arguments("").unwrap(), json!({}));
        assert_eq!(parse_arguments(" \n").unwrap(), json!({}));
        assert_eq!(parse_arguments("{\"a\":1}").unwrap(), json!({"a":1}));
        let err = parse_arguments("{\"a\":").unwrap_err();
        assert_eq!(err.raw, "{\"a\":");
    }

    #[test]
    fn history_round_trips_through_serde() {
        let extra = ProviderExtra {
            kind: ProviderKind::Anthropic,
            origin: "https://api.anthropic.com".into(),
            data: ExtraData::AnthropicThinking {
                thinking: "hmm".into(),
                signature: "sig".into(),
            },
        };
        let msgs = vec![
            Message::User {
                parts: vec![
                    UserPart::Text { text: "hi".into() },
                    UserPart::Image {
                        mime_type: "image/png".into(),
                        data: "AAAA".into(),
                    },
                ],
            },
            Message::Assistant {
                parts: vec![
                    AssistantPart::Reasoning {
                        text: "hmm".into(),
                        extra: Some(extra),
                    },
                    AssistantPart::ToolCall {
                        id: "c1".into(),
                        name: "f".into(),
                        arguments: json!({"x": 1}),
                        extra: None,
                    },
                ],
            },
            Message::ToolResult {
                call_id: "c1".into(),
                name: "f".into(),
                content: "ok".into(),
                is_error: false,
            },
        ];
        let s = serde_json::to_string(&msgs).unwrap();
        let back: Vec<Message> = serde_json::from_str(&s).unwrap();
        assert_eq!(back, msgs);
    }

    #[test]
    fn turn_builder_attaches_extras_in_order() {
        let extra = ProviderExtra {
            kind: ProviderKind::OpenAiChat,
            origin: "o".into(),
            data: ExtraData::ChatReasoning {
                field: "reasoning_content".into(),
            },
        };
        let events = vec![
            ProviderEvent::ReasoningDelta("a".into()),
            ProviderEvent::ReasoningDelta("b".into()),
            ProviderEvent::ReasoningDone {
                extra: Some(extra.clone()),
            },
            ProviderEvent::TextDelta("x".into()),
            ProviderEvent::TextDelta("y".into()),
            ProviderEvent::ToolCallStarted {
                id: "1".into(),
                name: "f".into(),
            },
            ProviderEvent::ToolCallFinished {
                id: "1".into(),
                name: "f".into(),
                arguments: Ok(json!({})),
                extra: None,
            },
            ProviderEvent::Finished {
                reason: FinishReason::ToolCalls,
            },
        ];
        let turn = TurnBuilder::collect(&events);
        assert_eq!(turn.reasoning(), "ab");
        assert_eq!(turn.text(), "xy");
        assert_eq!(turn.tool_calls().len(), 1);
        assert_eq!(
            turn.parts()[0],
            AssistantPart::Reasoning {
                text: "ab".into(),
                extra: Some(extra)
            }
        );
        assert_eq!(turn.finish, Some(FinishReason::ToolCalls));
    }
}
