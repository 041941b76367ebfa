//! OpenAI Responses (`POST {base}/responses`), stateless (`store: false`).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::error::{ProviderError, ProviderErrorKind};
use super::machine::{DecodeCtx, Machine};
use super::openai_chat::{arguments_string, data_url, tool_result_text};
use super::sse::SseEvent;
use super::types::*;

/// Request body. History goes in `input` each time (`store: false`, nothing kept server-side);
/// reasoning items come back with their `encrypted_content`, so `include:
/// ["reasoning.encrypted_content"]` and `reasoning: {effort, summary: "auto"}` are sent when a
/// reasoning effort is set (non-reasoning models reject both).
pub(crate) fn build_body(req: &ProviderRequest, ctx: &DecodeCtx) -> Value {
    let mut input = Vec::new();
    for m in &req.messages {
        match m {
            Message::User { parts } => {
                let content: Vec<Value> = parts
                    .iter()
                    .map(|p| match p {
                        UserPart::Text { text } => json!({"type": "input_text", "text": text}),
                        UserPart::Image { mime_type, data } => json!({
                            "type": "input_image", "image_url": data_url(mime_type, data),
                        }),
                    })
                    .collect();
                input.push(json!({"type": "message", "role": "user", "content": content}));
            }
            Message::Assistant { parts } => assistant_items(parts, ctx, &mut input),
            Message::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => input.push(json!({
                "type": "function_call_output",
                "call_id": call_id,
                "output": tool_result_text(content, *is_error),
            })),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    if !req.system.is_empty() {
        body.insert("instructions".into(), json!(req.system));
    }
    body.insert("input".into(), Value::Array(input));
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.parameters})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("stream".into(), json!(true));
    body.insert("store".into(), json!(false));
    let o = &req.options;
    if let Some(max) = o.max_output_tokens {
        body.insert("max_output_tokens".into(), json!(max));
    }
    if let Some(t) = o.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(effort) = &o.reasoning_effort {
        body.insert(
            "reasoning".into(),
            json!({"effort": effort, "summary": "auto"}),
        );
        body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    }
    Value::Object(body)
}

/// Items in order; consecutive text parts form one assistant message item. Reasoning items are
/// replayed only with their encrypted content (with `store: false` an id alone is unknown).
fn assistant_items(parts: &[AssistantPart], ctx: &DecodeCtx, input: &mut Vec<Value>) {
    let mut text = String::new();
    let flush = |text: &mut String, input: &mut Vec<Value>| {
        if !text.is_empty() {
            input.push(json!({
                "type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": std::mem::take(text)}],
            }));
        }
    };
    for p in parts {
        match p {
            AssistantPart::Text { text: t } => text.push_str(t),
            AssistantPart::Reasoning { extra, .. } => {
                let Some(ExtraData::ResponsesReasoning {
                    id,
                    encrypted_content: Some(enc),
                    summary,
                }) = extra
                    .as_ref()
                    .filter(|e| e.replays_to(ctx.kind, &ctx.origin))
                    .map(|e| &e.data)
                else {
                    continue;
                };
                flush(&mut text, input);
                let summary: Vec<Value> = summary
                    .iter()
                    .map(|s| json!({"type": "summary_text", "text": s}))
                    .collect();
                input.push(json!({
                    "type": "reasoning", "id": id, "encrypted_content": enc, "summary": summary,
                }));
            }
            AssistantPart::ToolCall {
                id,
                name,
                arguments,
                ..
            } => {
                flush(&mut text, input);
                input.push(json!({
                    "type": "function_call", "call_id": id, "name": name,
                    "arguments": arguments_string(arguments),
                }));
            }
        }
    }
    flush(&mut text, input);
}

#[derive(Debug)]
enum Item {
    Call {
        call_id: String,
        name: String,
        args: String,
    },
    Reasoning {
        summary_index: Option<u64>,
    },
}

/// Stream state: output items by id; text, argument and reasoning-summary deltas;
/// completed / incomplete / failed; error events.
#[derive(Debug)]
pub(crate) struct ResponsesMachine {
    ctx: DecodeCtx,
    items: HashMap<String, Item>,
    had_tool_calls: bool,
}

impl ResponsesMachine {
    pub(crate) fn new(ctx: DecodeCtx) -> Self {
        ResponsesMachine {
            ctx,
            items: HashMap::new(),
            had_tool_calls: false,
        }
    }

    fn item_added(&mut self, item: &Value, out: &mut Vec<ProviderEvent>) {
        let s = |k: &str| {
            item.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let id = s("id");
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let call_id = Some(s("call_id"))
                    .filter(|c| !c.is_empty())
                    .unwrap_or(id.clone());
                out.push(ProviderEvent::ToolCallStarted {
                    id: call_id.clone(),
                    name: s("name"),
                });
                self.items.insert(
                    id,
                    Item::Call {
                        call_id,
                        name: s("name"),
                        args: String::new(),
                    },
                );
            }
            Some("reasoning") => {
                self.items.insert(
                    id,
                    Item::Reasoning {
                        summary_index: None,
                    },
                );
            }
            _ => {}
        }
    }

    fn item_done(&mut self, item: &Value, out: &mut Vec<ProviderEvent>) {
        let s = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_string);
        let id = s("id").unwrap_or_default();
        let known = self.items.remove(&id);
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let (call_id, name, acc) = match known {
                    Some(Item::Call {
                        call_id,
                        name,
                        args,
                    }) => (call_id, name, args),
                    _ => {
                        let call_id = s("call_id").unwrap_or(id);
                        let name = s("name").unwrap_or_default();
                        out.push(ProviderEvent::ToolCallStarted {
                            id: call_id.clone(),
                            name: name.clone(),
                        });
                        (call_id, name, String::new())
                    }
                };
                let args = s("arguments").unwrap_or(acc);
                self.had_tool_calls = true;
                out.push(ProviderEvent::ToolCallFinished {
                    id: call_id,
                    name,
                    arguments: parse_arguments(&args),
                    extra: None,
                });
            }
            Some("reasoning") => {
                let summary = item
                    .get("summary")
                    .and_then(Value::as_array)
                    .map(|parts| {
                        parts
                            .iter()
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(ProviderEvent::ReasoningDone {
                    extra: Some(self.ctx.extra(ExtraData::ResponsesReasoning {
                        id,
                        encrypted_content: s("encrypted_content"),
                        summary,
                    })),
                });
            }
            _ => {}
        }
    }

    fn summary_delta(&mut self, v: &Value, out: &mut Vec<ProviderEvent>) {
        let delta = v.get("delta").and_then(Value::as_str).unwrap_or("");
        let index = v.get("summary_index").and_then(Value::as_u64);
        let item_id = v.get("item_id").and_then(Value::as_str).unwrap_or("");
        if let Some(Item::Reasoning { summary_index }) = self.items.get_mut(item_id) {
            // Summary parts are separate paragraphs.
            if summary_index.is_some() && *summary_index != index {
                out.push(ProviderEvent::ReasoningDelta("\n\n".into()));
            }
            *summary_index = index;
        }
        if !delta.is_empty() {
            out.push(ProviderEvent::ReasoningDelta(delta.to_string()));
        }
    }

    fn finish(
        &mut self,
        response: Option<&Value>,
        reason: FinishReason,
        out: &mut Vec<ProviderEvent>,
    ) {
        if let Some(u) = response
            .and_then(|r| r.get("usage"))
            .filter(|u| u.is_object())
        {
            out.push(ProviderEvent::Usage(usage_from(u)));
        }
        let reason = if reason == FinishReason::Stop && self.had_tool_calls {
            FinishReason::ToolCalls
        } else {
            reason
        };
        out.push(ProviderEvent::Finished { reason });
    }

    /// More arguments for the function call `item_id`.
    fn args_delta(&mut self, item_id: String, d: String, out: &mut Vec<ProviderEvent>) {
        if let Some(Item::Call { call_id, args, .. }) = self.items.get_mut(&item_id) {
            if !d.is_empty() {
                args.push_str(&d);
                out.push(ProviderEvent::ToolCallArgsDelta {
                    id: call_id.clone(),
                    delta: d,
                });
            }
        }
    }

    /// `response.incomplete`: finished, for the reason its details give.
    fn incomplete(&mut self, response: Option<&Value>, out: &mut Vec<ProviderEvent>) {
        let why = response
            .and_then(|r| r.get("incomplete_details"))
            .and_then(|d| d.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or("incomplete");
        let reason = match why {
            "max_output_tokens" => FinishReason::Length,
            "content_filter" => FinishReason::ContentFilter,
            other => FinishReason::Other(other.to_string()),
        };
        self.finish(response, reason, out);
    }

    /// `response.failed`: the error the response carries, or a generic one.
    fn failure(&self, response: Option<&Value>) -> ProviderError {
        response
            .and_then(|r| r.get("error"))
            .filter(|e| !e.is_null())
            .map(|e| ProviderError::from_stream_payload(&self.ctx.name, e))
            .unwrap_or_else(|| {
                ProviderError::new(
                    ProviderErrorKind::StreamError,
                    &self.ctx.name,
                    "the response failed",
                )
            })
    }
}

fn usage_from(u: &Value) -> Usage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input: n(u.get("input_tokens")),
        output: n(u.get("output_tokens")),
        cache_read: n(u
            .get("input_tokens_details")
            .and_then(|d| d.get("cached_tokens"))),
        cache_write: 0,
        reasoning: n(u
            .get("output_tokens_details")
            .and_then(|d| d.get("reasoning_tokens"))),
    }
}

impl Machine for ResponsesMachine {
    fn on_event(&mut self, ev: SseEvent, out: &mut Vec<ProviderEvent>) {
        let data = ev.data.trim();
        if data.is_empty() || data == "[DONE]" {
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
            .unwrap_or(ev.event.as_str())
            .to_string();
        let str_field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        match ty.as_str() {
            "response.output_item.added" => {
                if let Some(item) = v.get("item") {
                    self.item_added(item, out);
                }
            }
            "response.output_item.done" => {
                if let Some(item) = v.get("item") {
                    self.item_done(item, out);
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let d = str_field("delta");
                if !d.is_empty() {
                    out.push(ProviderEvent::TextDelta(d));
                }
            }
            "response.reasoning_summary_text.delta" => self.summary_delta(&v, out),
            "response.reasoning_text.delta" => {
                let d = str_field("delta");
                if !d.is_empty() {
                    out.push(ProviderEvent::ReasoningDelta(d));
                }
            }
            "response.function_call_arguments.delta" => {
                self.args_delta(str_field("item_id"), str_field("delta"), out)
            }
            "response.completed" => self.finish(v.get("response"), FinishReason::Stop, out),
            "response.incomplete" => self.incomplete(v.get("response"), out),
            "response.failed" => {
                let err = self.failure(v.get("response"));
                out.push(ProviderEvent::Error(err));
            }
            "error" => out.push(ProviderEvent::Error(ProviderError::from_stream_payload(
                &self.ctx.name,
                &v,
            ))),
            _ => {}
        }
    }

    fn on_eof(&mut self, out: &mut Vec<ProviderEvent>) {
        out.push(ProviderEvent::Error(ProviderError::truncated(
            &self.ctx.name,
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::decode_all;
    use super::super::ProviderKind;
    use super::*;

    #[test]
    fn incomplete_maps_to_length_with_usage() {
        let body = concat!(
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"usage\":{\"input_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":2},\"output_tokens\":7,\"output_tokens_details\":{\"reasoning_tokens\":4}}}}\n\n",
        );
        let ev = decode_all(
            ProviderKind::OpenAiResponses,
            "o",
            "OpenAI",
            body.as_bytes(),
        );
        assert_eq!(
            ev,
            vec![
                ProviderEvent::TextDelta("Hi".into()),
                ProviderEvent::Usage(Usage {
                    input: 5,
                    output: 7,
                    cache_read: 2,
                    cache_write: 0,
                    reasoning: 4
                }),
                ProviderEvent::Finished {
                    reason: FinishReason::Length
                },
            ]
        );
    }

    #[test]
    fn failed_without_error_event_is_a_stream_error() {
        let body = "data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"server_error\",\"message\":\"oops\"}}}\n\n";
        let ev = decode_all(
            ProviderKind::OpenAiResponses,
            "o",
            "OpenAI",
            body.as_bytes(),
        );
        assert!(
            matches!(&ev[0], ProviderEvent::Error(e) if e.kind == ProviderErrorKind::Server && e.message == "oops")
        );
    }
}
