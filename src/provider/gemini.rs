//! Gemini native API (`POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse`).
//!
//! Function calls arrive whole (one part each, `args` an object) and carry no ids, so ids are
//! synthesised from the response id and the call's position. Thought signatures ride on the
//! part they came with (a thought, a text, or the first function call of a step) and are replayed
//! on the same kind of part, byte for byte: Gemini rejects a function-call turn without them.

use serde_json::{json, Map, Value};

use super::error::{ProviderError, ProviderErrorKind};
use super::machine::{DecodeCtx, Machine};
use super::sse::SseEvent;
use super::types::*;

/// Google's documented placeholder for function calls Gemini did not produce (history from
/// another provider): it tells the validator there is no signature to check.
const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

/// Request body. Tool schemas are already in Gemini's subset (see `schema.rs`).
///
/// Thinking: `thinking_budget` becomes `thinkingBudget` (Gemini 2.5), else `reasoning_effort`
/// becomes `thinkingLevel` (Gemini 3; `xhigh` is sent as `high`); either turns on
/// `includeThoughts` so thoughts stream back.
pub(crate) fn build_body(req: &ProviderRequest, ctx: &DecodeCtx) -> Value {
    let mut contents: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, parts: Vec<Value>| {
        if parts.is_empty() {
            return;
        }
        // Parallel function responses must share one turn; a following user text joins it.
        match contents.last_mut() {
            Some((r, existing)) if *r == role => existing.extend(parts),
            _ => contents.push((role, parts)),
        }
    };
    for m in &req.messages {
        match m {
            Message::User { parts } => push("user", parts.iter().filter_map(user_part).collect()),
            Message::Assistant { parts } => push("model", model_parts(parts, ctx)),
            Message::ToolResult {
                call_id,
                name,
                content,
                is_error,
            } => {
                let key = if *is_error { "error" } else { "output" };
                let mut response = json!({"name": name, "response": {key: content}});
                if let Some(id) = wire_call_id(call_id) {
                    response["id"] = json!(id);
                }
                push("user", vec![json!({"functionResponse": response})]);
            }
        }
    }
    let contents: Vec<Value> = contents
        .into_iter()
        .map(|(role, parts)| json!({"role": role, "parts": parts}))
        .collect();

    let mut body = Map::new();
    if !req.system.is_empty() {
        body.insert(
            "systemInstruction".into(),
            json!({"parts": [{"text": req.system}]}),
        );
    }
    body.insert("contents".into(), Value::Array(contents));
    if !req.tools.is_empty() {
        let decls: Vec<Value> = req.tools.iter().map(declaration).collect();
        body.insert("tools".into(), json!([{"functionDeclarations": decls}]));
        body.insert(
            "toolConfig".into(),
            json!({"functionCallingConfig": {"mode": "AUTO"}}),
        );
    }
    let config = generation_config(&req.options);
    if !config.is_empty() {
        body.insert("generationConfig".into(), Value::Object(config));
    }
    Value::Object(body)
}

/// A function declaration; Gemini refuses an object schema with no properties, so a tool
/// without parameters declares none.
fn declaration(t: &ToolSpec) -> Value {
    let mut d = json!({"name": t.name, "description": t.description});
    let empty = t
        .parameters
        .get("properties")
        .and_then(Value::as_object)
        .is_none_or(Map::is_empty);
    if !empty {
        d["parameters"] = t.parameters.clone();
    }
    d
}

fn generation_config(o: &RequestOptions) -> Map<String, Value> {
    let mut c = Map::new();
    if let Some(max) = o.max_output_tokens {
        c.insert("maxOutputTokens".into(), json!(max));
    }
    if let Some(t) = o.temperature {
        c.insert("temperature".into(), json!(t));
    }
    let thinking = match (o.thinking_budget, o.reasoning_effort.as_deref()) {
        (Some(budget), _) => Some(json!({"includeThoughts": true, "thinkingBudget": budget})),
        (None, Some(effort)) => {
            let level = if effort == "xhigh" { "high" } else { effort };
            Some(json!({"includeThoughts": true, "thinkingLevel": level}))
        }
        (None, None) => None,
    };
    if let Some(t) = thinking {
        c.insert("thinkingConfig".into(), t);
    }
    c
}

fn user_part(p: &UserPart) -> Option<Value> {
    match p {
        UserPart::Text { text } if text.is_empty() => None,
        UserPart::Text { text } => Some(json!({"text": text})),
        UserPart::Image { mime_type, data } => {
            Some(json!({"inlineData": {"mimeType": mime_type, "data": data}}))
        }
    }
}

/// Prefix of the ids we make up for calls that came without one.
const SYNTH_ID_PREFIX: &str = "gemini_call_";
/// Prefix of ids Gemini sent itself; they go back in `functionCall.id` / `functionResponse.id`.
const WIRE_ID_PREFIX: &str = "gemini_id_";

fn wire_call_id(call_id: &str) -> Option<&str> {
    call_id.strip_prefix(WIRE_ID_PREFIX)
}

/// The model turn: our parts back in order, each signature on the part it came with.
fn model_parts(parts: &[AssistantPart], ctx: &DecodeCtx) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut step_has_signature = false;
    for p in parts {
        let extra = |e: &Option<ProviderExtra>| {
            e.as_ref()
                .filter(|e| e.replays_to(ctx.kind, &ctx.origin))
                .map(|e| e.data.clone())
        };
        match p {
            AssistantPart::Text { text } if text.is_empty() => {}
            AssistantPart::Text { text } => out.push(json!({"text": text})),
            AssistantPart::Reasoning { text, extra: e } => match extra(e) {
                Some(ExtraData::GeminiThought { signature }) => {
                    step_has_signature = true;
                    out.push(json!({"text": text, "thought": true, "thoughtSignature": signature}));
                }
                Some(ExtraData::GeminiTextSignature {
                    signature,
                    empty_part,
                }) => {
                    step_has_signature = true;
                    let prev_text = out.last_mut().filter(|p| {
                        !empty_part
                            && p.get("text").is_some()
                            && p.get("thought").is_none()
                            && p.get("thoughtSignature").is_none()
                    });
                    match prev_text {
                        Some(prev) => prev["thoughtSignature"] = json!(signature),
                        None => out.push(json!({"text": "", "thoughtSignature": signature})),
                    }
                }
                // Thoughts of other providers (or unsigned ones) are not replayed.
                _ => {}
            },
            AssistantPart::ToolCall {
                id,
                name,
                arguments,
                extra: e,
            } => {
                let args = if arguments.is_object() {
                    arguments.clone()
                } else {
                    json!({})
                };
                let mut call = json!({"name": name, "args": args});
                if let Some(wire) = wire_call_id(id) {
                    call["id"] = json!(wire);
                }
                let mut part = json!({"functionCall": call});
                match extra(e) {
                    Some(ExtraData::GeminiCall { signature }) => {
                        part["thoughtSignature"] = json!(signature);
                        step_has_signature = true;
                    }
                    // The first call of a step must carry a signature; one that did not come
                    // from Gemini gets Google's placeholder.
                    _ if !step_has_signature => {
                        part["thoughtSignature"] = json!(SKIP_SIGNATURE);
                        step_has_signature = true;
                    }
                    _ => {}
                }
                out.push(part);
            }
        }
    }
    out
}

/// Gemini's counters (`candidatesTokenCount` excludes thoughts; `promptTokenCount` includes the
/// cached part). They are cumulative, so the last report wins.
fn usage_of(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let thoughts = n("thoughtsTokenCount");
    Usage {
        input: n("promptTokenCount") + n("toolUsePromptTokenCount"),
        output: n("candidatesTokenCount") + thoughts,
        cache_read: n("cachedContentTokenCount"),
        cache_write: 0,
        reasoning: thoughts,
    }
}

/// Why a stop is an error, in words; `None` for reasons that are not errors.
fn blocked_reason(reason: &str) -> Option<&'static str> {
    Some(match reason {
        "SAFETY" | "IMAGE_SAFETY" => "the response was blocked by Gemini's safety filters",
        "RECITATION" | "IMAGE_RECITATION" => {
            "the response was stopped because it recited training data"
        }
        "BLOCKLIST" => "the response contained a term from a blocklist",
        "PROHIBITED_CONTENT" | "IMAGE_PROHIBITED_CONTENT" => {
            "the response was blocked for prohibited content"
        }
        "SPII" => "the response was blocked for containing sensitive personal information",
        "LANGUAGE" => "the response was in a language Gemini does not support",
        "MALFORMED_FUNCTION_CALL" => "the model produced a malformed function call",
        "UNEXPECTED_TOOL_CALL" => "the model called a tool that was not offered",
        _ => return None,
    })
}

/// Stream state: the open thought block (with its signature), calls so far, last usage, the
/// finish reason (the stream then ends at EOF).
#[derive(Debug)]
pub(crate) struct GeminiMachine {
    ctx: DecodeCtx,
    /// An open thought block and the signature that came on it.
    thought: Option<Option<String>>,
    calls: usize,
    response_id: String,
    usage: Option<Usage>,
    finish: Option<String>,
}

impl GeminiMachine {
    pub(crate) fn new(ctx: DecodeCtx) -> Self {
        GeminiMachine {
            ctx,
            thought: None,
            calls: 0,
            response_id: String::new(),
            usage: None,
            finish: None,
        }
    }

    fn error(&self, kind: ProviderErrorKind, code: &str, message: String) -> ProviderEvent {
        ProviderEvent::Error(
            ProviderError::new(kind, &self.ctx.name, message).with_code(Some(code.to_string())),
        )
    }

    fn close_thought(&mut self, out: &mut Vec<ProviderEvent>) {
        if let Some(signature) = self.thought.take() {
            let extra =
                signature.map(|signature| self.ctx.extra(ExtraData::GeminiThought { signature }));
            out.push(ProviderEvent::ReasoningDone { extra });
        }
    }

    fn on_part(&mut self, part: &Value, out: &mut Vec<ProviderEvent>) {
        let signature = part
            .get("thoughtSignature")
            .and_then(Value::as_str)
            .map(str::to_string);
        let text = part.get("text").and_then(Value::as_str);
        let thought = part.get("thought").and_then(Value::as_bool) == Some(true);
        if let (true, Some(t)) = (thought, text) {
            // A second signed thought starts a new block, so each signature keeps its part.
            if matches!(self.thought, Some(Some(_))) {
                self.close_thought(out);
            }
            let open = self.thought.get_or_insert(None);
            if signature.is_some() {
                *open = signature;
            }
            if !t.is_empty() {
                out.push(ProviderEvent::ReasoningDelta(t.to_string()));
            }
            return;
        }
        self.close_thought(out);
        if let Some(t) = text {
            if !t.is_empty() {
                out.push(ProviderEvent::TextDelta(t.to_string()));
            }
            if let Some(signature) = signature {
                out.push(ProviderEvent::ReasoningDone {
                    extra: Some(self.ctx.extra(ExtraData::GeminiTextSignature {
                        signature,
                        empty_part: t.is_empty(),
                    })),
                });
            }
        } else if let Some(call) = part.get("functionCall") {
            self.on_call(call, signature, out);
        } else if let Some(data) = part.get("inlineData") {
            // No image event exists downstream; say so rather than drop it.
            let mime = data.get("mimeType").and_then(Value::as_str).unwrap_or("?");
            out.push(ProviderEvent::TextDelta(format!(
                "\n[Gemini returned an inline {mime} file, which cannot be shown here]\n"
            )));
        } else if let Some(signature) = signature {
            // A part with nothing but a signature: keep it like an empty text part.
            out.push(ProviderEvent::ReasoningDone {
                extra: Some(self.ctx.extra(ExtraData::GeminiTextSignature {
                    signature,
                    empty_part: true,
                })),
            });
        } else if part.as_object().is_some_and(|o| !o.is_empty()) {
            let keys: Vec<&str> = part
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            out.push(self.error(
                ProviderErrorKind::Decode,
                "UNKNOWN_PART",
                format!("unsupported response part ({})", keys.join(", ")),
            ));
        }
    }

    fn on_call(&mut self, call: &Value, signature: Option<String>, out: &mut Vec<ProviderEvent>) {
        let name = call
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let id = match call.get("id").and_then(Value::as_str) {
            Some(wire) if !wire.is_empty() => format!("{WIRE_ID_PREFIX}{wire}"),
            _ => format!("{SYNTH_ID_PREFIX}{}_{}", self.response_id, self.calls),
        };
        self.calls += 1;
        let args = match call.get("args") {
            None | Some(Value::Null) => json!({}),
            Some(a) => a.clone(),
        };
        out.push(ProviderEvent::ToolCallStarted {
            id: id.clone(),
            name: name.clone(),
        });
        out.push(ProviderEvent::ToolCallArgsDelta {
            id: id.clone(),
            delta: args.to_string(),
        });
        let arguments = if args.is_object() {
            Ok(args)
        } else {
            Err(ToolArgsError {
                error: "function call arguments are not an object".into(),
                raw: args.to_string(),
            })
        };
        out.push(ProviderEvent::ToolCallFinished {
            id,
            name,
            arguments,
            extra: signature.map(|signature| self.ctx.extra(ExtraData::GeminiCall { signature })),
        });
    }

    fn on_chunk(&mut self, v: &Value, out: &mut Vec<ProviderEvent>) {
        if let Some(e) = v.get("error") {
            let payload = json!({ "error": e });
            out.push(ProviderEvent::Error(ProviderError::from_stream_payload(
                &self.ctx.name,
                &payload,
            )));
            return;
        }
        if let Some(id) = v.get("responseId").and_then(Value::as_str) {
            if self.response_id.is_empty() {
                self.response_id = id.chars().filter(char::is_ascii_alphanumeric).collect();
            }
        }
        if let Some(u) = v.get("usageMetadata") {
            self.usage = Some(usage_of(u));
        }
        let candidate = v
            .get("candidates")
            .and_then(Value::as_array)
            .and_then(|c| c.first());
        let Some(candidate) = candidate else {
            if let Some(block) = v
                .get("promptFeedback")
                .and_then(|f| f.get("blockReason"))
                .and_then(Value::as_str)
            {
                out.push(self.error(
                    ProviderErrorKind::InvalidRequest,
                    block,
                    format!("Gemini blocked the prompt (blockReason {block})"),
                ));
            }
            return;
        };
        let parts = candidate
            .get("content")
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array);
        for part in parts.into_iter().flatten() {
            self.on_part(part, out);
        }
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
            if let Some(why) = blocked_reason(reason) {
                let retry = reason == "MALFORMED_FUNCTION_CALL";
                let ev = self.error(
                    ProviderErrorKind::StreamError,
                    reason,
                    format!("{why} (finishReason {reason})"),
                );
                out.push(match ev {
                    ProviderEvent::Error(e) => ProviderEvent::Error(e.with_retryable(retry)),
                    other => other,
                });
                return;
            }
            self.finish = Some(reason.to_string());
        }
    }

    fn complete(&mut self, out: &mut Vec<ProviderEvent>) {
        self.close_thought(out);
        if let Some(u) = self.usage {
            out.push(ProviderEvent::Usage(u));
        }
        let reason = match self.finish.as_deref() {
            Some("STOP") if self.calls > 0 => FinishReason::ToolCalls,
            Some("STOP") => FinishReason::Stop,
            Some("MAX_TOKENS") => FinishReason::Length,
            Some(other) => FinishReason::Other(other.to_string()),
            None => FinishReason::Stop,
        };
        out.push(ProviderEvent::Finished { reason });
    }
}

impl Machine for GeminiMachine {
    fn on_event(&mut self, ev: SseEvent, out: &mut Vec<ProviderEvent>) {
        let data = ev.data.trim();
        if data.is_empty() {
            return;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(v) => self.on_chunk(&v, out),
            Err(e) => out.push(self.ctx.decode_error(&e, data)),
        }
    }

    /// Gemini ends the body after the chunk with `finishReason`; without one it was cut off.
    fn on_eof(&mut self, out: &mut Vec<ProviderEvent>) {
        match self.finish {
            Some(_) => self.complete(out),
            None => out.push(ProviderEvent::Error(ProviderError::truncated(
                &self.ctx.name,
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
