//! Anthropic Messages (`POST {base}/v1/messages`).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::error::ProviderError;
use super::machine::{DecodeCtx, Machine};
use super::sse::SseEvent;
use super::types::*;

/// `max_tokens` is mandatory on this API.
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 8192;
/// Anthropic's minimum thinking budget.
const MIN_THINKING_BUDGET: u32 = 1024;

/// Request body.
///
/// Prompt caching: `cache_control: ephemeral` on the system prompt (which also caches the tools,
/// as they precede it) and on the last block of the last two user turns, so each agent step
/// reads the previous step's prefix from the cache and writes the new one (3 of the 4 allowed
/// breakpoints).
///
/// Thinking: `{type: enabled, budget_tokens}` when `thinking_budget` is set; the budget is raised
/// to 1024 if lower and `max_tokens` raised above it, and `temperature` is omitted (the API
/// rejects it with thinking).
pub(crate) fn build_body(req: &ProviderRequest, ctx: &DecodeCtx) -> Value {
    let messages = messages(req, ctx);
    let o = &req.options;
    let mut max_tokens = o.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    if let Some(budget) = o.thinking_budget {
        let budget = budget.max(MIN_THINKING_BUDGET);
        if max_tokens <= budget {
            max_tokens = budget + DEFAULT_MAX_TOKENS;
        }
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    } else if let Some(t) = o.temperature {
        body.insert("temperature".into(), json!(t));
    }
    body.insert("max_tokens".into(), json!(max_tokens));
    body.insert("stream".into(), json!(true));
    if !req.system.is_empty() {
        body.insert(
            "system".into(),
            json!([{"type": "text", "text": req.system, "cache_control": {"type": "ephemeral"}}]),
        );
    }
    body.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    Value::Object(body)
}

/// The conversation as alternating turns, the last two user turns marked for caching.
fn messages(req: &ProviderRequest, ctx: &DecodeCtx) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        // The API wants alternating roles: tool results and a following user message merge.
        match turns.last_mut() {
            Some((r, existing)) if *r == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    };
    for m in &req.messages {
        match m {
            Message::User { parts } => push("user", parts.iter().filter_map(user_block).collect()),
            Message::Assistant { parts } => push(
                "assistant",
                parts
                    .iter()
                    .filter_map(|p| assistant_block(p, ctx))
                    .collect(),
            ),
            Message::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => push("user", vec![tool_result_block(call_id, content, *is_error)]),
        }
    }
    for (_, blocks) in turns.iter_mut().filter(|(r, _)| *r == "user").rev().take(2) {
        if let Some(last) = blocks.last_mut() {
            last["cache_control"] = json!({"type": "ephemeral"});
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

fn tool_result_block(call_id: &str, content: &str, is_error: bool) -> Value {
    let mut block = json!({
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": if content.is_empty() { "(no output)" } else { content },
    });
    if is_error {
        block["is_error"] = json!(true);
    }
    block
}

fn user_block(p: &UserPart) -> Option<Value> {
    match p {
        UserPart::Text { text } if text.is_empty() => None, // the API rejects empty text blocks
        UserPart::Text { text } => Some(json!({"type": "text", "text": text})),
        UserPart::Image { mime_type, data } => Some(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": mime_type, "data": data},
        })),
    }
}

/// Thinking without our signature cannot be sent (the API verifies it), so reasoning from other
/// providers is dropped; tool input must be an object.
fn assistant_block(p: &AssistantPart, ctx: &DecodeCtx) -> Option<Value> {
    match p {
        AssistantPart::Text { text } if text.is_empty() => None,
        AssistantPart::Text { text } => Some(json!({"type": "text", "text": text})),
        AssistantPart::Reasoning { extra, .. } => {
            let extra = extra
                .as_ref()
                .filter(|e| e.replays_to(ctx.kind, &ctx.origin))?;
            match &extra.data {
                ExtraData::AnthropicThinking {
                    thinking,
                    signature,
                } => {
                    Some(json!({"type": "thinking", "thinking": thinking, "signature": signature}))
                }
                ExtraData::AnthropicRedactedThinking { data } => {
                    Some(json!({"type": "redacted_thinking", "data": data}))
                }
                _ => None,
            }
        }
        AssistantPart::ToolCall {
            id,
            name,
            arguments,
            ..
        } => Some(json!({
            "type": "tool_use",
            "id": id,
            "name": name,
            "input": if arguments.is_object() { arguments.clone() } else { json!({}) },
        })),
    }
}

#[derive(Debug)]
enum Block {
    Text,
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted {
        data: String,
    },
    Tool {
        id: String,
        name: String,
        args: String,
        input: Value,
    },
    /// Server tools and their results run at Anthropic; nothing for the agent to do.
    Ignored,
}

/// Counters as Anthropic reports them (`input_tokens` excludes cache tokens).
#[derive(Debug, Default, Clone, Copy)]
struct RawUsage {
    input: u64,
    cache_write: u64,
    cache_read: u64,
    output: u64,
    thinking: u64,
    seen: bool,
}

impl RawUsage {
    /// Fields present in `u` supersede earlier ones (`message_delta` over `message_start`).
    fn merge(&mut self, u: &Value) {
        fn set(slot: &mut u64, seen: &mut bool, v: Option<&Value>) {
            if let Some(n) = v.and_then(Value::as_u64) {
                *slot = n;
                *seen = true;
            }
        }
        let seen = &mut self.seen;
        set(&mut self.input, seen, u.get("input_tokens"));
        set(
            &mut self.cache_write,
            seen,
            u.get("cache_creation_input_tokens"),
        );
        set(&mut self.cache_read, seen, u.get("cache_read_input_tokens"));
        set(&mut self.output, seen, u.get("output_tokens"));
        let thinking = u
            .get("output_tokens_details")
            .and_then(|d| d.get("thinking_tokens"));
        set(&mut self.thinking, seen, thinking);
    }

    fn normalised(&self) -> Usage {
        Usage {
            input: self.input + self.cache_write + self.cache_read,
            output: self.output,
            cache_read: self.cache_read,
            cache_write: self.cache_write,
            reasoning: self.thinking,
        }
    }
}

/// Stream state: content blocks by index, usage (message_delta supersedes message_start),
/// stop_reason, message_stop.
#[derive(Debug)]
pub(crate) struct AnthropicMachine {
    ctx: DecodeCtx,
    blocks: HashMap<u64, Block>,
    usage: RawUsage,
    stop_reason: Option<String>,
    had_tool_calls: bool,
}

impl AnthropicMachine {
    pub(crate) fn new(ctx: DecodeCtx) -> Self {
        AnthropicMachine {
            ctx,
            blocks: HashMap::new(),
            usage: RawUsage::default(),
            stop_reason: None,
            had_tool_calls: false,
        }
    }

    fn block_start(&mut self, index: u64, cb: &Value, out: &mut Vec<ProviderEvent>) {
        let s = |k: &str| cb.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let block = match cb.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => {
                let t = s("text");
                if !t.is_empty() {
                    out.push(ProviderEvent::TextDelta(t));
                }
                Block::Text
            }
            "thinking" => {
                let t = s("thinking");
                if !t.is_empty() {
                    out.push(ProviderEvent::ReasoningDelta(t.clone()));
                }
                Block::Thinking {
                    thinking: t,
                    signature: s("signature"),
                }
            }
            "redacted_thinking" => Block::Redacted { data: s("data") },
            "tool_use" => {
                let (id, name) = (s("id"), s("name"));
                out.push(ProviderEvent::ToolCallStarted {
                    id: id.clone(),
                    name: name.clone(),
                });
                Block::Tool {
                    id,
                    name,
                    args: String::new(),
                    input: cb.get("input").cloned().unwrap_or(Value::Null),
                }
            }
            other => {
                tracing::debug!(block = other, "ignoring Anthropic content block");
                Block::Ignored
            }
        };
        self.blocks.insert(index, block);
    }

    fn block_delta(&mut self, index: u64, delta: &Value, out: &mut Vec<ProviderEvent>) {
        let s = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or("");
        let Some(block) = self.blocks.get_mut(&index) else {
            return;
        };
        match (delta.get("type").and_then(Value::as_str), block) {
            (Some("text_delta"), Block::Text) => {
                let t = s("text");
                if !t.is_empty() {
                    out.push(ProviderEvent::TextDelta(t.to_string()));
                }
            }
            (Some("thinking_delta"), Block::Thinking { thinking, .. }) => {
                let t = s("thinking");
                if !t.is_empty() {
                    thinking.push_str(t);
                    out.push(ProviderEvent::ReasoningDelta(t.to_string()));
                }
            }
            (Some("signature_delta"), Block::Thinking { signature, .. }) => {
                signature.push_str(s("signature"))
            }
            (Some("input_json_delta"), Block::Tool { id, args, .. }) => {
                let t = s("partial_json");
                if !t.is_empty() {
                    args.push_str(t);
                    out.push(ProviderEvent::ToolCallArgsDelta {
                        id: id.clone(),
                        delta: t.to_string(),
                    });
                }
            }
            _ => {} // citations, server-tool input, unknown deltas
        }
    }

    fn block_stop(&mut self, index: u64, out: &mut Vec<ProviderEvent>) {
        match self.blocks.remove(&index) {
            Some(Block::Thinking {
                thinking,
                signature,
            }) => out.push(ProviderEvent::ReasoningDone {
                extra: Some(self.ctx.extra(ExtraData::AnthropicThinking {
                    thinking,
                    signature,
                })),
            }),
            Some(Block::Redacted { data }) => out.push(ProviderEvent::ReasoningDone {
                extra: Some(
                    self.ctx
                        .extra(ExtraData::AnthropicRedactedThinking { data }),
                ),
            }),
            Some(Block::Tool {
                id,
                name,
                args,
                input,
            }) => {
                self.had_tool_calls = true;
                // Without deltas, the input given at block start is the whole input.
                let arguments =
                    if args.is_empty() && input.as_object().is_some_and(|o| !o.is_empty()) {
                        Ok(input)
                    } else {
                        parse_arguments(&args)
                    };
                out.push(ProviderEvent::ToolCallFinished {
                    id,
                    name,
                    arguments,
                    extra: None,
                });
            }
            _ => {}
        }
    }

    fn complete(&mut self, out: &mut Vec<ProviderEvent>) {
        let mut indices: Vec<u64> = self.blocks.keys().copied().collect();
        indices.sort_unstable();
        for i in indices {
            self.block_stop(i, out);
        }
        if self.usage.seen {
            out.push(ProviderEvent::Usage(self.usage.normalised()));
        }
        let reason = match self.stop_reason.as_deref() {
            Some("end_turn" | "stop_sequence") | None => FinishReason::Stop,
            Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
            Some("tool_use") => FinishReason::ToolCalls,
            Some("refusal") => FinishReason::Refusal,
            Some(other) => FinishReason::Other(other.to_string()),
        };
        let reason = if reason == FinishReason::Stop && self.had_tool_calls {
            FinishReason::ToolCalls
        } else {
            reason
        };
        out.push(ProviderEvent::Finished { reason });
    }
}

impl Machine for AnthropicMachine {
    fn on_event(&mut self, ev: SseEvent, out: &mut Vec<ProviderEvent>) {
        let data = ev.data.trim();
        if data.is_empty() {
            return;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                out.push(self.ctx.decode_error(&e, data));
                return;
            }
        };
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(ev.event.as_str());
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match ty {
            "message_start" => {
                if let Some(u) = v.get("message").and_then(|m| m.get("usage")) {
                    self.usage.merge(u);
                }
            }
            "content_block_start" => {
                if let Some(cb) = v.get("content_block") {
                    self.block_start(index, cb, out);
                }
            }
            "content_block_delta" => {
                if let Some(d) = v.get("delta") {
                    self.block_delta(index, d, out);
                }
            }
            "content_block_stop" => self.block_stop(index, out),
            "message_delta" => {
                if let Some(r) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(r.to_string());
                }
                if let Some(u) = v.get("usage") {
                    self.usage.merge(u);
                }
            }
            "message_stop" => self.complete(out),
            "error" => out.push(ProviderEvent::Error(ProviderError::from_stream_payload(
                &self.ctx.name,
                &v,
            ))),
            _ => {} // ping and future event types
        }
    }

    fn on_eof(&mut self, out: &mut Vec<ProviderEvent>) {
        if self.stop_reason.is_some() {
            self.complete(out);
        } else {
            out.push(ProviderEvent::Error(ProviderError::truncated(
                &self.ctx.name,
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::decode_all;
    use super::super::error::ProviderErrorKind;
    use super::super::ProviderKind;
    use super::*;

    #[test]
    fn redacted_thinking_and_in_stream_overload() {
        let body = concat!(
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"redacted_thinking\",\"data\":\"opaque\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        );
        let ev = decode_all(ProviderKind::Anthropic, "o", "Anthropic", body.as_bytes());
        assert!(matches!(
            &ev[0],
            ProviderEvent::ReasoningDone { extra: Some(ProviderExtra { data: ExtraData::AnthropicRedactedThinking { data }, .. }) } if data == "opaque"
        ));
        assert!(
            matches!(&ev[1], ProviderEvent::Error(e) if e.kind == ProviderErrorKind::Overloaded)
        );
        assert_eq!(ev.len(), 2);
    }

    #[test]
    fn tool_input_without_deltas() {
        let body = concat!(
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{\"a\":1}}}\n\n",
            "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":3}}\n\n",
        );
        let ev = decode_all(ProviderKind::Anthropic, "o", "Anthropic", body.as_bytes());
        assert!(
            matches!(&ev[1], ProviderEvent::ToolCallFinished { arguments: Ok(a), .. } if a["a"] == 1)
        );
        // EOF after message_delta without message_stop still finishes.
        assert_eq!(
            ev.last(),
            Some(&ProviderEvent::Finished {
                reason: FinishReason::ToolCalls
            })
        );
    }
}
