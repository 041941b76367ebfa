use serde_json::json;

use super::super::decode::decode_all;
use super::super::ProviderKind;
use super::*;

const ORIGIN: &str = "https://generativelanguage.googleapis.com";

fn ctx() -> DecodeCtx {
    DecodeCtx {
        kind: ProviderKind::Gemini,
        origin: ORIGIN.into(),
        name: "Gemini".into(),
    }
}

fn extra(data: ExtraData) -> Option<ProviderExtra> {
    Some(ctx().extra(data))
}

fn sse(chunks: &[Value]) -> Vec<u8> {
    chunks
        .iter()
        .map(|c| format!("data: {c}\n\n"))
        .collect::<String>()
        .into_bytes()
}

fn decode(chunks: &[Value]) -> Vec<ProviderEvent> {
    decode_all(ProviderKind::Gemini, ORIGIN, "Gemini", &sse(chunks))
}

fn error_of(ev: &[ProviderEvent]) -> &ProviderError {
    match ev.last() {
        Some(ProviderEvent::Error(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn thoughts_text_parallel_calls_and_usage() {
    let ev = decode(&[
        json!({"responseId": "r-1", "candidates": [{"content": {"role": "model", "parts": [
            {"text": "Let me ", "thought": true}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "think.", "thought": true, "thoughtSignature": "dGhvdWdodA=="}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "Reading both."},
            {"functionCall": {"name": "read_file", "args": {"path": "a.rs"}}, "thoughtSignature": "Y2FsbA=="},
            {"functionCall": {"name": "read_file", "args": {"path": "b.rs"}}}]},
            "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20,
                "cachedContentTokenCount": 60, "thoughtsTokenCount": 7}}),
    ]);
    let turn = TurnBuilder::collect(&ev);
    assert_eq!(turn.reasoning(), "Let me think.");
    assert_eq!(turn.text(), "Reading both.");
    let calls = turn.tool_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].0, "gemini_call_r1_0");
    assert_eq!(calls[1].0, "gemini_call_r1_1");
    assert_eq!(calls[1].2, &json!({"path": "b.rs"}));
    assert_eq!(
        turn.parts()[0],
        AssistantPart::Reasoning {
            text: "Let me think.".into(),
            extra: extra(ExtraData::GeminiThought {
                signature: "dGhvdWdodA==".into()
            }),
        }
    );
    let AssistantPart::ToolCall { extra: e0, .. } = &turn.parts()[2] else {
        panic!("{:?}", turn.parts());
    };
    assert_eq!(
        e0,
        &extra(ExtraData::GeminiCall {
            signature: "Y2FsbA==".into()
        })
    );
    assert!(matches!(
        &turn.parts()[3],
        AssistantPart::ToolCall { extra: None, .. }
    ));
    assert_eq!(
        turn.usage,
        Some(Usage {
            input: 100,
            output: 27,
            cache_read: 60,
            cache_write: 0,
            reasoning: 7
        })
    );
    assert_eq!(turn.finish, Some(FinishReason::ToolCalls));
}

#[test]
fn finish_reasons_and_blocks_are_clear_errors() {
    for (reason, words) in [
        ("SAFETY", "safety filters"),
        ("RECITATION", "recited"),
        ("BLOCKLIST", "blocklist"),
        ("PROHIBITED_CONTENT", "prohibited"),
        ("SPII", "personal information"),
        ("MALFORMED_FUNCTION_CALL", "malformed function call"),
    ] {
        let ev = decode(&[
            json!({"candidates": [{"content": {"parts": [{"text": "Hi"}]},
            "finishReason": reason}]}),
        ]);
        assert_eq!(ev[0], ProviderEvent::TextDelta("Hi".into()));
        let e = error_of(&ev);
        assert!(e.message.contains(words), "{reason}: {e}");
        assert!(e.message.contains(reason), "{e}");
        assert_eq!(e.code.as_deref(), Some(reason));
        assert_eq!(e.retryable(), reason == "MALFORMED_FUNCTION_CALL");
    }
    let ev = decode(&[json!({"candidates": [{"finishReason": "MAX_TOKENS"}]})]);
    assert_eq!(
        ev.last(),
        Some(&ProviderEvent::Finished {
            reason: FinishReason::Length
        })
    );
    let ev = decode(&[json!({"promptFeedback": {"blockReason": "SAFETY"}})]);
    let e = error_of(&ev);
    assert_eq!(e.kind, ProviderErrorKind::InvalidRequest);
    assert_eq!(
        e.to_string(),
        "Gemini rejected the request: Gemini blocked the prompt (blockReason SAFETY)"
    );
}

#[test]
fn stream_errors_truncation_and_unknown_parts() {
    let ev = decode(&[
        json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "quota", "details": [{"retryDelay": "2s"}]}}),
    ]);
    let e = error_of(&ev);
    assert_eq!(e.message, "quota");
    assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(2)));
    let ev = decode(&[json!({"error": {"code": 503, "status": "UNAVAILABLE", "message": "busy"}})]);
    assert_eq!(error_of(&ev).kind, ProviderErrorKind::Overloaded);

    let ev = decode(&[json!({"candidates": [{"content": {"parts": [{"text": "partial"}]}}]})]);
    assert_eq!(error_of(&ev).kind, ProviderErrorKind::Network);

    let ev = decode(&[
        json!({"candidates": [{"content": {"parts": [{"executableCode": {"code": "1"}}]}}]}),
    ]);
    assert!(error_of(&ev).message.contains("executableCode"));

    let ev = decode(&[json!({"candidates": [{"content": {"parts": [
        {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}, "finishReason": "STOP"}]})]);
    assert!(matches!(&ev[0], ProviderEvent::TextDelta(t) if t.contains("image/png")));
}

#[test]
fn text_signatures_come_back_on_their_part() {
    let ev = decode(&[
        json!({"candidates": [{"content": {"parts": [{"text": "Hello", "thoughtSignature": "c2lnLWE="}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"text": " there"}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"text": "", "thoughtSignature": "c2lnLWI="}]},
            "finishReason": "STOP"}]}),
    ]);
    let turn = TurnBuilder::collect(&ev);
    assert_eq!(turn.text(), "Hello there");
    let mut req = ProviderRequest::default();
    req.messages.push(turn.message);
    let body = build_body(&req, &ctx());
    assert_eq!(
        body["contents"][0],
        json!({"role": "model", "parts": [
            {"text": "Hello", "thoughtSignature": "c2lnLWE="},
            {"text": " there"},
            {"text": "", "thoughtSignature": "c2lnLWI="},
        ]})
    );
}

fn history() -> ProviderRequest {
    ProviderRequest {
        model: "gemini-3-pro-preview".into(),
        system: "Be brief.".into(),
        messages: vec![
            Message::User {
                parts: vec![
                    UserPart::Text {
                        text: "Look".into(),
                    },
                    UserPart::Image {
                        mime_type: "image/png".into(),
                        data: "iVBORw0KGgo=".into(),
                    },
                ],
            },
            Message::Assistant {
                parts: vec![
                    AssistantPart::Reasoning {
                        text: "Plan.".into(),
                        extra: extra(ExtraData::GeminiThought {
                            signature: "dGg=".into(),
                        }),
                    },
                    AssistantPart::Reasoning {
                        text: "Someone else's".into(),
                        extra: Some(ProviderExtra {
                            kind: ProviderKind::Anthropic,
                            origin: "a".into(),
                            data: ExtraData::AnthropicThinking {
                                thinking: "x".into(),
                                signature: "y".into(),
                            },
                        }),
                    },
                    AssistantPart::ToolCall {
                        id: "gemini_call_r_0".into(),
                        name: "read_file".into(),
                        arguments: json!({"path": "a.rs"}),
                        extra: extra(ExtraData::GeminiCall {
                            signature: "EqUCCqIC/+=".into(),
                        }),
                    },
                    AssistantPart::ToolCall {
                        id: "gemini_id_abc".into(),
                        name: "read_file".into(),
                        arguments: json!({"path": "b.rs"}),
                        extra: None,
                    },
                ],
            },
            Message::ToolResult {
                call_id: "gemini_call_r_0".into(),
                name: "read_file".into(),
                content: "fn a() {}".into(),
                is_error: false,
            },
            Message::ToolResult {
                call_id: "gemini_id_abc".into(),
                name: "read_file".into(),
                content: "not found".into(),
                is_error: true,
            },
            Message::user_text("Fix it"),
        ],
        tools: vec![
            ToolSpec {
                name: "read_file".into(),
                description: "Read".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            },
            ToolSpec {
                name: "list_todos".into(),
                description: "List".into(),
                parameters: json!({"type": "object", "properties": {}}),
            },
        ],
        options: RequestOptions {
            max_output_tokens: Some(8000),
            temperature: Some(0.5),
            reasoning_effort: Some("xhigh".into()),
            thinking_budget: None,
        },
    }
}

#[test]
fn request_body_shape() {
    let body = build_body(&history(), &ctx());
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
    let contents = body["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 3);
    assert_eq!(
        contents[0],
        json!({"role": "user", "parts": [{"text": "Look"},
            {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]})
    );
    // Signatures exactly as received, on the part they came with; the unsigned second call of
    // the step gets none; foreign thinking is dropped.
    assert_eq!(
        contents[1],
        json!({"role": "model", "parts": [
            {"text": "Plan.", "thought": true, "thoughtSignature": "dGg="},
            {"functionCall": {"name": "read_file", "args": {"path": "a.rs"}}, "thoughtSignature": "EqUCCqIC/+="},
            {"functionCall": {"name": "read_file", "args": {"path": "b.rs"}, "id": "abc"}},
        ]})
    );
    // Both responses in one turn, the user's next message with them.
    assert_eq!(
        contents[2],
        json!({"role": "user", "parts": [
            {"functionResponse": {"name": "read_file", "response": {"output": "fn a() {}"}}},
            {"functionResponse": {"name": "read_file", "response": {"error": "not found"}, "id": "abc"}},
            {"text": "Fix it"},
        ]})
    );
    assert_eq!(
        body["tools"],
        json!([{"functionDeclarations": [
            {"name": "read_file", "description": "Read",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
            {"name": "list_todos", "description": "List"},
        ]}])
    );
    assert_eq!(body["toolConfig"]["functionCallingConfig"]["mode"], "AUTO");
    assert_eq!(
        body["generationConfig"],
        json!({"maxOutputTokens": 8000, "temperature": 0.5,
               "thinkingConfig": {"includeThoughts": true, "thinkingLevel": "high"}})
    );
}

#[test]
fn thinking_budget_wins_and_no_config_is_omitted() {
    let mut req = history();
    req.options.thinking_budget = Some(2048);
    let body = build_body(&req, &ctx());
    assert_eq!(
        body["generationConfig"]["thinkingConfig"],
        json!({"includeThoughts": true, "thinkingBudget": 2048})
    );
    let body = build_body(&ProviderRequest::default(), &ctx());
    assert!(body.get("generationConfig").is_none());
    assert!(body.get("tools").is_none());
    assert!(body.get("systemInstruction").is_none());
}

#[test]
fn calls_from_other_providers_get_the_skip_placeholder() {
    let req = ProviderRequest {
        messages: vec![Message::Assistant {
            parts: vec![
                AssistantPart::ToolCall {
                    id: "toolu_1".into(),
                    name: "f".into(),
                    arguments: json!({}),
                    extra: None,
                },
                AssistantPart::ToolCall {
                    id: "toolu_2".into(),
                    name: "f".into(),
                    arguments: json!("not an object"),
                    extra: None,
                },
            ],
        }],
        ..Default::default()
    };
    let body = build_body(&req, &ctx());
    let parts = &body["contents"][0]["parts"];
    assert_eq!(parts[0]["thoughtSignature"], SKIP_SIGNATURE);
    assert!(parts[1].get("thoughtSignature").is_none());
    assert_eq!(parts[1]["functionCall"]["args"], json!({}));
}

#[test]
fn endpoint_model_in_path_key_in_header() {
    use super::super::{ProviderClient, ProviderSettings};
    use crate::base::secret::Secret;
    let url = |base: &str, model: &str| {
        let s = ProviderSettings::new(ProviderKind::Gemini, base, Secret::new("AIza-secret"));
        let c = ProviderClient::new(s).unwrap();
        assert_eq!(c.inner.headers["x-goog-api-key"], "AIza-secret");
        c.inner.call_url(model).to_string()
    };
    assert_eq!(
        url("", "gemini-2.5-pro"),
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
    assert_eq!(
        url("https://gw.example/google/v1beta/", "models/gemini-3-pro-preview"),
        "https://gw.example/google/v1beta/models/gemini-3-pro-preview:streamGenerateContent?alt=sse"
    );
    assert!(!url("", "m").contains("AIza"));
}
