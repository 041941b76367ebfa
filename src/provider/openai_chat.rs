//! OpenAI Chat Completions (`POST {base}/chat/completions`) and compatible servers (DeepSeek,
//! vLLM, Ollama, OpenRouter, Groq, Gemini's OpenAI endpoint, Azure).

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value};

use super::error::ProviderError;
use super::machine::{DecodeCtx, Machine};
use super::sse::SseEvent;
use super::types::*;

/// Request body. `max_completion_tokens` is sent to api.openai.com (its reasoning models reject
/// `max_tokens`), `max_tokens` everywhere else (most compatible servers only know that one).
pub(crate) fn build_body(req: &ProviderRequest, ctx: &DecodeCtx, openai_host: bool) -> Value {
    let mut messages = Vec::new();
    if !req.system.is_empty() {
        messages.push(json!({"role": "system", "content": req.system}));
    }
    for m in &req.messages {
        match m {
            Message::User { parts } => messages.push(user_message(parts)),
            Message::Assistant { parts } => {
                if let Some(msg) = assistant_message(parts, ctx) {
                    messages.push(msg);
                }
            }
            Message::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => messages.push(json!({
                "role": "tool",
                "tool_call_id": call_id,
                "content": tool_result_text(content, *is_error),
            })),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters,
                }})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    let o = &req.options;
    if let Some(max) = o.max_output_tokens {
        let field = if openai_host {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        body.insert(field.into(), json!(max));
    }
    if let Some(t) = o.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(effort) = &o.reasoning_effort {
        body.insert("reasoning_effort".into(), json!(effort));
    }
    Value::Object(body)
}

/// The OpenAI APIs have no error flag on tool results; say it in the content.
pub(crate) fn tool_result_text(content: &str, is_error: bool) -> String {
    if is_error {
        format!("Error: {content}")
    } else {
        content.to_string()
    }
}

pub(crate) fn data_url(mime: &str, data: &str) -> String {
    format!("data:{mime};base64,{data}")
}

/// Arguments as the OpenAI APIs want them: a JSON string (a raw string is sent as-is).
pub(crate) fn arguments_string(arguments: &Value) -> String {
    match arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

fn user_message(parts: &[UserPart]) -> Value {
    if let [UserPart::Text { text }] = parts {
        return json!({"role": "user", "content": text});
    }
    let content: Vec<Value> = parts
        .iter()
        .map(|p| match p {
            UserPart::Text { text } => json!({"type": "text", "text": text}),
            UserPart::Image { mime_type, data } => {
                json!({"type": "image_url", "image_url": {"url": data_url(mime_type, data)}})
            }
        })
        .collect();
    json!({"role": "user", "content": content})
}

fn assistant_message(parts: &[AssistantPart], ctx: &DecodeCtx) -> Option<Value> {
    let mut text = String::new();
    let mut reasoning: Option<(String, String)> = None; // (field, text)
    let mut calls = Vec::new();
    for p in parts {
        match p {
            AssistantPart::Text { text: t } => text.push_str(t),
            AssistantPart::Reasoning {
                text: t,
                extra: Some(extra),
            } if extra.replays_to(ctx.kind, &ctx.origin) => {
                if let ExtraData::ChatReasoning { field } = &extra.data {
                    let entry = reasoning.get_or_insert_with(|| (field.clone(), String::new()));
                    entry.1.push_str(t);
                }
            }
            AssistantPart::Reasoning { .. } => {}
            AssistantPart::ToolCall {
                id,
                name,
                arguments,
                extra,
            } => {
                let mut call = json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments_string(arguments)},
                });
                if let Some(extra) = extra
                    .as_ref()
                    .filter(|e| e.replays_to(ctx.kind, &ctx.origin))
                {
                    if let ExtraData::ChatToolCall { extra_content } = &extra.data {
                        call["extra_content"] = extra_content.clone();
                    }
                }
                calls.push(call);
            }
        }
    }
    if text.is_empty() && calls.is_empty() && reasoning.is_none() {
        return None;
    }
    let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    if let Some((field, t)) = reasoning {
        msg[field.as_str()] = json!(t);
    }
    Some(msg)
}

#[derive(Debug, Default)]
struct ToolAcc {
    id: Option<String>,
    name: String,
    args: String,
    extra_content: Option<Value>,
    started: bool,
}

/// Stream state: reasoning / text / tool-call fragments (accumulated by `index`), usage on its own
/// chunk or on the finish chunk, `finish_reason`, `[DONE]`.
#[derive(Debug)]
pub(crate) struct ChatMachine {
    ctx: DecodeCtx,
    /// Field the open reasoning block arrives in.
    reasoning_field: Option<String>,
    /// Calls in arrival order (slot), and the slot each wire `index` currently feeds.
    tools: BTreeMap<usize, ToolAcc>,
    slot_of: HashMap<usize, usize>,
    next_slot: usize,
    had_tool_calls: bool,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
}

impl ChatMachine {
    pub(crate) fn new(ctx: DecodeCtx) -> Self {
        ChatMachine {
            ctx,
            reasoning_field: None,
            tools: BTreeMap::new(),
            slot_of: HashMap::new(),
            next_slot: 0,
            had_tool_calls: false,
            finish: None,
            usage: None,
        }
    }

    fn close_reasoning(&mut self, out: &mut Vec<ProviderEvent>) {
        if let Some(field) = self.reasoning_field.take() {
            out.push(ProviderEvent::ReasoningDone {
                extra: Some(self.ctx.extra(ExtraData::ChatReasoning { field })),
            });
        }
    }

    fn flush_tools(&mut self, out: &mut Vec<ProviderEvent>) {
        self.slot_of.clear();
        for (slot, mut acc) in std::mem::take(&mut self.tools) {
            let id = acc
                .id
                .take()
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("call_{slot}"));
            if !acc.started {
                out.push(ProviderEvent::ToolCallStarted {
                    id: id.clone(),
                    name: acc.name.clone(),
                });
                if !acc.args.is_empty() {
                    out.push(ProviderEvent::ToolCallArgsDelta {
                        id: id.clone(),
                        delta: acc.args.clone(),
                    });
                }
            }
            self.had_tool_calls = true;
            out.push(ProviderEvent::ToolCallFinished {
                arguments: parse_arguments(&acc.args),
                extra: acc
                    .extra_content
                    .map(|extra_content| self.ctx.extra(ExtraData::ChatToolCall { extra_content })),
                id,
                name: acc.name,
            });
        }
    }

    fn tool_fragment(&mut self, position: usize, tc: &Value, out: &mut Vec<ProviderEvent>) {
        let index = tc
            .get("index")
            .and_then(Value::as_u64)
            .map(|i| i as usize)
            .unwrap_or(position);
        let frag_id = tc
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let mut slot = *self.slot_of.entry(index).or_insert_with(|| {
            let s = self.next_slot;
            self.next_slot += 1;
            s
        });
        // A server that reuses an index for a new call (a different id) gets a fresh slot.
        if let (Some(fid), Some(acc)) = (frag_id, self.tools.get(&slot)) {
            if acc.id.as_deref().is_some_and(|id| id != fid) {
                slot = self.next_slot;
                self.next_slot += 1;
                self.slot_of.insert(index, slot);
            }
        }
        let acc = self.tools.entry(slot).or_default();
        if acc.id.is_none() {
            acc.id = frag_id.map(str::to_string);
        }
        let func = tc.get("function");
        if !acc.started {
            if let Some(n) = func.and_then(|f| f.get("name")).and_then(Value::as_str) {
                acc.name.push_str(n);
            }
        }
        if let Some(extra) = tc.get("extra_content").filter(|v| !v.is_null()) {
            acc.extra_content = Some(extra.clone());
        }
        let delta = func
            .and_then(|f| f.get("arguments"))
            .map(|a| match a {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(), // some servers send an object
            })
            .unwrap_or_default();
        acc.args.push_str(&delta);
        if !acc.started && !acc.name.is_empty() {
            acc.started = true;
            let id = match &acc.id {
                Some(id) => id.clone(),
                None => {
                    let id = format!("call_{slot}");
                    acc.id = Some(id.clone());
                    id
                }
            };
            out.push(ProviderEvent::ToolCallStarted {
                id: id.clone(),
                name: acc.name.clone(),
            });
            if !acc.args.is_empty() {
                out.push(ProviderEvent::ToolCallArgsDelta {
                    id,
                    delta: acc.args.clone(),
                });
            }
        } else if acc.started && !delta.is_empty() {
            out.push(ProviderEvent::ToolCallArgsDelta {
                id: acc.id.clone().unwrap_or_default(),
                delta,
            });
        }
    }

    fn complete(&mut self, out: &mut Vec<ProviderEvent>) {
        self.close_reasoning(out);
        self.flush_tools(out);
        if let Some(u) = self.usage {
            out.push(ProviderEvent::Usage(u));
        }
        let mut reason = self.finish.take().unwrap_or(FinishReason::Stop);
        if reason == FinishReason::Stop && self.had_tool_calls {
            reason = FinishReason::ToolCalls;
        }
        out.push(ProviderEvent::Finished { reason });
    }
}

pub(crate) fn usage_from(u: &Value) -> Usage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let details = u.get("prompt_tokens_details");
    let cached = details.and_then(|d| d.get("cached_tokens"));
    Usage {
        input: n(u.get("prompt_tokens")),
        output: n(u.get("completion_tokens")),
        // DeepSeek reports cache hits as `prompt_cache_hit_tokens`.
        cache_read: cached
            .and_then(Value::as_u64)
            .unwrap_or_else(|| n(u.get("prompt_cache_hit_tokens"))),
        // OpenRouter reports cache writes here.
        cache_write: n(details.and_then(|d| d.get("cache_write_tokens"))),
        reasoning: n(u
            .get("completion_tokens_details")
            .and_then(|d| d.get("reasoning_tokens"))),
    }
}

fn finish_reason(s: &str) -> FinishReason {
    match s.to_ascii_lowercase().as_str() {
        "stop" | "end_turn" | "eos" => FinishReason::Stop,
        "length" | "max_tokens" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" | "safety" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_string()),
    }
}

impl Machine for ChatMachine {
    fn on_event(&mut self, ev: SseEvent, out: &mut Vec<ProviderEvent>) {
        let data = ev.data.trim();
        if data.is_empty() {
            return;
        }
        if data == "[DONE]" {
            self.complete(out);
            return;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                out.push(self.ctx.decode_error(&e, data));
                return;
            }
        };
        if ev.event == "error" || v.get("error").is_some_and(|e| !e.is_null()) {
            out.push(ProviderEvent::Error(ProviderError::from_stream_payload(
                &self.ctx.name,
                &v,
            )));
            return;
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage_from(u));
        }
        // n = 1: only the first choice matters.
        let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
            return;
        };
        if let Some(delta) = choice.get("delta") {
            let non_empty = |k: &str| {
                delta
                    .get(k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            };
            for field in ["reasoning_content", "reasoning"] {
                if let Some(r) = non_empty(field) {
                    if self.reasoning_field.is_none() {
                        self.reasoning_field = Some(field.to_string());
                    }
                    out.push(ProviderEvent::ReasoningDelta(r));
                    break;
                }
            }
            for field in ["content", "refusal"] {
                if let Some(t) = non_empty(field) {
                    self.close_reasoning(out);
                    out.push(ProviderEvent::TextDelta(t));
                }
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                self.close_reasoning(out);
                for (pos, tc) in calls.iter().enumerate() {
                    self.tool_fragment(pos, tc, out);
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.close_reasoning(out);
            self.flush_tools(out);
            self.finish = Some(finish_reason(reason));
        }
    }

    fn on_eof(&mut self, out: &mut Vec<ProviderEvent>) {
        // Some compatible servers omit `[DONE]`; a seen finish_reason is enough.
        if self.finish.is_some() {
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
    use super::super::decode::StreamDecoder;
    use super::super::error::ProviderErrorKind;
    use super::super::ProviderKind;
    use super::*;

    fn decode(body: &str) -> Vec<ProviderEvent> {
        let mut d = StreamDecoder::new(ProviderKind::OpenAiChat, "o", "Test");
        let mut out = d.feed(body.as_bytes());
        out.extend(d.finish());
        out
    }

    #[test]
    fn tool_call_in_one_chunk_without_index_or_id() {
        let body = "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},\"finish_reason\":\"stop\"}]}\n\n";
        let ev = decode(body);
        assert_eq!(
            ev[0],
            ProviderEvent::ToolCallStarted {
                id: "call_0".into(),
                name: "f".into()
            }
        );
        assert!(
            matches!(&ev[2], ProviderEvent::ToolCallFinished { arguments: Ok(a), .. } if a["a"] == 1)
        );
        assert_eq!(
            ev.last(),
            Some(&ProviderEvent::Finished {
                reason: FinishReason::ToolCalls
            })
        );
    }

    #[test]
    fn eof_without_finish_is_an_error_and_error_payload_is_typed() {
        let ev = decode("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n");
        assert!(matches!(&ev[1], ProviderEvent::Error(e) if e.kind == ProviderErrorKind::Network));
        let ev = decode("data: {\"error\":{\"message\":\"boom\",\"code\":\"server_error\"}}\n\n");
        assert!(
            matches!(&ev[0], ProviderEvent::Error(e) if e.kind == ProviderErrorKind::Server && e.message == "boom")
        );
        let ev = decode("data: {not json\n\n");
        assert!(matches!(&ev[0], ProviderEvent::Error(e) if e.kind == ProviderErrorKind::Decode));
    }

    #[test]
    fn reasoning_field_is_remembered_for_replay() {
        let ev = decode(concat!(
            "data: {\"choices\":[{\"delta\":{\"reasoning\":\"think\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        ));
        assert_eq!(ev[0], ProviderEvent::ReasoningDelta("think".into()));
        assert!(
            matches!(&ev[1], ProviderEvent::ReasoningDone { extra: Some(ProviderExtra { data: ExtraData::ChatReasoning { field }, .. }) } if field == "reasoning")
        );
        assert_eq!(ev[2], ProviderEvent::TextDelta("ok".into()));
        assert!(matches!(
            ev[3],
            ProviderEvent::Usage(Usage {
                input: 3,
                output: 2,
                ..
            })
        ));
    }
}
