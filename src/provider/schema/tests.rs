use serde_json::json;

use super::*;
use crate::provider::types::ToolSpec;

#[test]
fn dialects_by_endpoint() {
    let d = Dialect::for_endpoint;
    assert_eq!(d(ProviderKind::Gemini, ""), Dialect::Gemini);
    assert_eq!(d(ProviderKind::Anthropic, ""), Dialect::Anthropic);
    assert_eq!(
        d(ProviderKind::OpenAiChat, "https://api.moonshot.ai/v1"),
        Dialect::Moonshot
    );
    assert_eq!(
        d(
            ProviderKind::OpenAiChat,
            "https://generativelanguage.googleapis.com/v1beta/openai"
        ),
        Dialect::GeminiOpenAi
    );
    assert_eq!(
        d(ProviderKind::OpenAiResponses, "https://api.openai.com/v1"),
        Dialect::OpenAi
    );
    assert_eq!(
        d(ProviderKind::OpenAiChat, "https://notmoonshot.ai"),
        Dialect::OpenAi
    );
}

#[test]
fn gemini_subset() {
    let schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$defs": {"Pos": {"type": "object", "properties": {"line": {"type": "integer", "format": "uint32"}}, "required": ["line", "ghost"]}},
        "additionalProperties": false,
        "properties": {
            "at": {"$ref": "#/$defs/Pos", "description": "Where"},
            "mode": {"const": "fast"},
            "level": {"enum": [1, 2, 3], "description": "How much"},
            "when": {"type": "string", "format": "date-time"},
            "email": {"type": "string", "format": "email"},
            "maybe": {"type": ["string", "null"]},
            "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "opt": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "both": {"allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}}]},
        },
        "required": ["at", "nope"],
    });
    let out = normalise(Dialect::Gemini, &schema);
    let p = &out["properties"];
    assert_eq!(out["type"], "object");
    assert_eq!(out["required"], json!(["at"]));
    assert!(out.get("$schema").is_none() && out.get("additionalProperties").is_none());
    assert_eq!(
        p["at"],
        json!({"type": "object", "description": "Where",
               "properties": {"line": {"type": "integer"}}, "required": ["line"]})
    );
    assert_eq!(p["mode"], json!({"type": "string", "enum": ["fast"]}));
    assert_eq!(
        p["level"],
        json!({"type": "integer", "description": "How much One of: 1, 2, 3."})
    );
    assert_eq!(p["when"]["format"], "date-time");
    assert_eq!(p["email"], json!({"type": "string"}));
    assert_eq!(p["maybe"], json!({"type": "string", "nullable": true}));
    assert_eq!(
        p["either"],
        json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})
    );
    assert_eq!(p["opt"], json!({"type": "number", "nullable": true}));
    assert_eq!(
        p["pair"],
        json!({"type": "array", "minItems": 2, "maxItems": 2,
               "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}})
    );
    assert_eq!(p["map"], json!({"type": "object"}));
    assert_eq!(
        p["both"],
        json!({"type": "object", "required": ["a"],
               "properties": {"a": {"type": "string"}, "b": {"type": "string"}}})
    );
}

#[test]
fn openai_keeps_json_schema_but_fixes_shape() {
    let schema = json!({
        "$schema": "x",
        "oneOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {}}}],
        "definitions": {"N": {"$ref": "#/definitions/N"}},
        "properties": {
            "t": {"items": [{"type": "string"}], "additionalItems": true},
            "loop": {"$ref": "#/definitions/N"},
            "free": {"type": "object"},
        },
    });
    let out = normalise(Dialect::OpenAi, &schema);
    assert_eq!(out["type"], "object");
    assert!(out.get("oneOf").is_none() && out.get("definitions").is_none());
    let p = &out["properties"];
    assert_eq!(p["a"], json!({"type": "string"}));
    assert_eq!(
        p["t"],
        json!({"type": "array", "items": {"type": "string"}})
    );
    assert_eq!(p["free"], json!({"type": "object", "properties": {}}));
    assert!(!p["loop"].to_string().contains("$ref"), "{}", p["loop"]);
    // A schema that is not an object at all becomes an empty parameters object.
    assert_eq!(
        normalise(Dialect::Anthropic, &json!({"type": "string"})),
        json!({"type": "object", "properties": {}})
    );
    assert_eq!(
        normalise(Dialect::Moonshot, &json!(true)),
        json!({"type": "object", "properties": {}})
    );
}

#[test]
fn names_are_made_valid_distinct_and_map_back() {
    let long = "x".repeat(80);
    let names = [
        "read_file",
        "srv.tool",
        "srv_tool",
        "9lives",
        "mcp/server:tool name",
        long.as_str(),
    ];
    let openai = ToolNames::new(Dialect::OpenAi, names);
    assert_eq!(openai.wire("read_file"), "read_file");
    assert_eq!(openai.wire("srv_tool"), "srv_tool");
    assert_eq!(openai.wire("srv.tool"), "srv_tool_2");
    assert_eq!(openai.wire("9lives"), "9lives");
    assert_eq!(openai.wire("mcp/server:tool name"), "mcp_server_tool_name");
    assert_eq!(openai.wire(&long).len(), MAX_TOOL_NAME);
    for n in names {
        assert!(Dialect::OpenAi.name_is_valid(&openai.wire(n)), "{n}");
        assert_eq!(openai.original(&openai.wire(n)), n);
    }
    let gemini = ToolNames::new(Dialect::Gemini, names);
    assert_eq!(gemini.wire("srv.tool"), "srv.tool");
    assert_eq!(gemini.wire("9lives"), "_9lives");
    assert_eq!(gemini.wire("mcp/server:tool name"), "mcp_server:tool_name");
    assert_eq!(gemini.original("_9lives"), "9lives");
    assert_eq!(gemini.original("unknown"), "unknown");
}

#[test]
fn prepare_request_renames_history_too() {
    let mut req = ProviderRequest {
        tools: vec![ToolSpec {
            name: "srv/t".into(),
            description: String::new(),
            parameters: json!({}),
        }],
        messages: vec![
            Message::Assistant {
                parts: vec![AssistantPart::ToolCall {
                    id: "1".into(),
                    name: "srv/t".into(),
                    arguments: json!({}),
                    extra: None,
                }],
            },
            Message::ToolResult {
                call_id: "1".into(),
                name: "srv/t".into(),
                content: String::new(),
                is_error: false,
            },
        ],
        ..Default::default()
    };
    let names = prepare_request(Dialect::Anthropic, &mut req);
    assert_eq!(req.tools[0].name, "srv_t");
    assert_eq!(
        req.tools[0].parameters,
        json!({"type": "object", "properties": {}})
    );
    assert!(
        matches!(&req.messages[0], Message::Assistant { parts } if matches!(&parts[0], AssistantPart::ToolCall { name, .. } if name == "srv_t"))
    );
    assert!(matches!(&req.messages[1], Message::ToolResult { name, .. } if name == "srv_t"));
    assert_eq!(names.original("srv_t"), "srv/t");
}
