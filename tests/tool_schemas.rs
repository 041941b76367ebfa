//! Every tool we offer, plus awkward MCP schemas and names, through each provider's request
//! builder; each tool on the wire is checked against that provider's documented rules (one
//! small checker per dialect below).
//!
//! Rules, from the providers' documentation:
//! - OpenAI (Chat, Responses): names `^[a-zA-Z0-9_-]{1,64}$`; parameters a JSON Schema object
//!   with `type: "object"` at the root and no `anyOf`/`oneOf`/`allOf`/`enum`/`not` there; `items`
//!   is a schema, never a list.
//! - Anthropic: names `^[a-zA-Z0-9_-]{1,64}$`; `input_schema` a JSON Schema (draft 2020-12: no
//!   list-form `items`) whose root is `type: "object"`.
//! - Kimi / Moonshot: the OpenAI rules, and every object node says `type: "object"`.
//! - Gemini: names start with a letter or `_`, then `[a-zA-Z0-9_.:-]`, at most 64; parameters
//!   in the OpenAPI 3 subset (only its keywords; one `type` name, `nullable` for null; string
//!   `format` only `enum`/`date-time`; string-only `enum`; object `properties` non-empty when
//!   present, and a declaration without parameters omits them).

use cursor_byok::agent::tools::{catalog, ToolContext};
use cursor_byok::base::secret::Secret;
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::provider::schema::{Dialect, ToolNames, GEMINI_KEYWORDS};
use cursor_byok::provider::*;
use serde_json::{json, Value};

/// Awkward but real-world MCP input schemas.
fn awkward_schemas() -> Vec<Value> {
    vec![
        json!({"properties": {"q": {"type": "string"}}, "required": ["q"]}),
        json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "additionalProperties": false,
            "$defs": {"Range": {"type": "object", "properties": {
                "start": {"type": "integer"}, "end": {"type": "integer"}}}},
            "properties": {"range": {"$ref": "#/$defs/Range"}, "ext": {"$ref": "https://x/y.json"}},
        }),
        json!({"oneOf": [
            {"type": "object", "properties": {"id": {"type": "string"}}},
            {"type": "object", "properties": {"name": {"type": "string"}, "kind": {"oneOf": [
                {"const": "a"}, {"const": "b"}]}}},
        ]}),
        json!({"type": "object", "properties": {
            "point": {"type": "array", "items": [{"type": "number"}, {"type": "number"}]},
            "rgb": {"type": "array", "items": [{"type": "integer"}, {"type": "integer"}, {"type": "integer"}]},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
        }}),
        json!({"type": "object", "properties": {
            "maybe": {"type": ["string", "null"]},
            "num_or_str": {"type": ["integer", "string"], "format": "int64"},
            "nothing": {"type": "null"},
        }}),
        json!({"type": "object", "properties": {
            "mode": {"const": 3},
            "level": {"enum": [1, 2, 3]},
            "url": {"type": "string", "format": "uri"},
            "mail": {"type": "string", "format": "email"},
            "when": {"type": "string", "format": "date-time"},
            "count": {"type": "integer", "format": "uint32", "exclusiveMinimum": 0},
        }}),
        json!({"type": "object", "definitions": {"Node": {"type": "object", "properties": {
            "value": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/definitions/Node"}}}}},
            "properties": {"tree": {"$ref": "#/definitions/Node"}}}),
        json!({"allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "boolean"}}},
        ]}),
        json!({}),
        json!({"type": "object", "properties": {
            "meta": {"type": "object", "additionalProperties": {"type": "string"}},
            "any": {},
            "deep": {"properties": {"x": {"items": {"properties": {"y": {"enum": ["p", "q"]}}}}}},
        }, "required": ["missing"]}),
        json!({"type": "string"}),
    ]
}

fn mcp_defs() -> Vec<pb::McpToolDefinition> {
    let servers = ["my.server/with spaces", "github", "ünïcode-srv", ""];
    awkward_schemas()
        .into_iter()
        .enumerate()
        .map(|(i, schema)| pb::McpToolDefinition {
            name: format!("tool-{i}"),
            description: format!("Awkward tool {i}"),
            provider_identifier: servers[i % servers.len()].into(),
            tool_name: match i {
                0 => "9starts-with-a-digit".into(),
                1 => "x".repeat(100),
                2 => "dots.and:colons".into(),
                _ => format!("tool {i}"),
            },
            input_schema_json: Some(schema.to_string()),
            ..Default::default()
        })
        .collect()
}

/// Everything we offer in Agent mode with the awkward MCP tools, plus tools with names only a
/// custom client could produce (straight into the provider layer).
fn all_tools() -> Vec<ToolSpec> {
    let ctx = ToolContext {
        workspace_root: Some("/w".into()),
        mcp_tools: mcp_defs(),
        web_fetch: true,
        mode: pb::AgentMode::Agent as i32,
        command_denylist: Vec::new(),
        subagents: cursor_byok::agent::tools::SubagentOptions {
            enabled: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut tools = catalog(&ctx);
    assert!(tools.len() > 15, "catalogue too small: {}", tools.len());
    let odd = ["9lives", "a.b:c", "with space", "ünï", "", &"y".repeat(90)];
    for (i, name) in odd.into_iter().enumerate() {
        tools.push(ToolSpec {
            name: name.to_string(),
            description: "odd".into(),
            parameters: awkward_schemas()[i % 11].clone(),
        });
    }
    tools
}

// ---------- the checkers ----------

fn children(node: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    if let Some(p) = node.get("properties").and_then(Value::as_object) {
        out.extend(p.values());
    }
    for k in ["items", "additionalProperties", "not", "contains"] {
        if let Some(v) = node.get(k).filter(|v| v.is_object()) {
            out.push(v);
        }
    }
    for k in ["anyOf", "oneOf", "allOf"] {
        if let Some(l) = node.get(k).and_then(Value::as_array) {
            out.extend(l);
        }
    }
    out
}

fn walk<'a>(node: &'a Value, path: &str, f: &mut dyn FnMut(&'a Value, &str)) {
    f(node, path);
    for (i, c) in children(node).into_iter().enumerate() {
        walk(c, &format!("{path}/{i}"), f);
    }
}

fn check_required(node: &Value, at: &str) {
    if let Some(req) = node.get("required").and_then(Value::as_array) {
        let props = node.get("properties").and_then(Value::as_object);
        for r in req {
            let r = r.as_str().unwrap_or_else(|| panic!("{at}: required {r}"));
            assert!(
                props.is_some_and(|p| p.contains_key(r)),
                "{at}: required `{r}` is not a property"
            );
        }
    }
}

fn check_json_schema(tool: &str, params: &Value, every_object_typed: bool) {
    assert_eq!(params["type"], "object", "{tool}: root type");
    assert!(params["properties"].is_object(), "{tool}: root properties");
    for k in ["anyOf", "oneOf", "allOf", "enum", "not"] {
        assert!(params.get(k).is_none(), "{tool}: `{k}` at the root");
    }
    walk(params, tool, &mut |node, at| {
        let o = node
            .as_object()
            .unwrap_or_else(|| panic!("{at}: not an object"));
        for k in ["$schema", "$ref", "$defs", "definitions", "prefixItems"] {
            assert!(!o.contains_key(k), "{at}: `{k}`");
        }
        assert!(!o.get("items").is_some_and(Value::is_array), "{at}: tuple");
        if o.get("type") == Some(&json!("object")) {
            assert!(
                o["properties"].is_object(),
                "{at}: object without properties"
            );
        }
        if every_object_typed && o.contains_key("properties") {
            assert_eq!(
                o.get("type"),
                Some(&json!("object")),
                "{at}: untyped object"
            );
        }
        check_required(node, at);
    });
}

fn openai_name_ok(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn check_openai(name: &str, params: &Value) {
    assert!(openai_name_ok(name), "bad OpenAI name {name:?}");
    check_json_schema(name, params, false);
}

fn check_anthropic(name: &str, params: &Value) {
    assert!(openai_name_ok(name), "bad Anthropic name {name:?}");
    check_json_schema(name, params, false);
}

fn check_moonshot(name: &str, params: &Value) {
    assert!(openai_name_ok(name), "bad Kimi name {name:?}");
    check_json_schema(name, params, true);
}

fn check_gemini(name: &str, params: Option<&Value>) {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    assert!(
        first_ok
            && name.len() <= 64
            && chars.all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c)),
        "bad Gemini name {name:?}"
    );
    let Some(params) = params else { return };
    assert_eq!(params["type"], "object", "{name}: root type");
    walk(params, name, &mut |node, at| {
        let o = node
            .as_object()
            .unwrap_or_else(|| panic!("{at}: not an object"));
        for k in o.keys() {
            assert!(GEMINI_KEYWORDS.contains(&k.as_str()), "{at}: keyword `{k}`");
        }
        let ty = o.get("type").map(|t| {
            t.as_str()
                .unwrap_or_else(|| panic!("{at}: type {t} is not one name"))
        });
        if let Some(t) = ty {
            assert!(
                ["string", "number", "integer", "boolean", "array", "object"].contains(&t),
                "{at}: type {t}"
            );
        }
        if let Some(f) = o.get("format").and_then(Value::as_str) {
            let ok = match ty {
                Some("string") => ["enum", "date-time"].contains(&f),
                Some("number") => ["float", "double"].contains(&f),
                Some("integer") => ["int32", "int64"].contains(&f),
                _ => false,
            };
            assert!(ok, "{at}: format {f} on {ty:?}");
        }
        if let Some(e) = o.get("enum") {
            assert_eq!(ty, Some("string"), "{at}: enum on {ty:?}");
            assert!(e.as_array().unwrap().iter().all(Value::is_string), "{at}");
        }
        assert!(o.get("items").is_none_or(Value::is_object), "{at}: tuple");
        if let Some(p) = o.get("properties") {
            assert!(!p.as_object().unwrap().is_empty(), "{at}: empty properties");
        }
        check_required(node, at);
    });
}

// ---------- the test ----------

/// `(name, parameters)` of each tool in a request body of `kind`.
fn wire_tools(kind: ProviderKind, body: &Value) -> Vec<(String, Option<Value>)> {
    let list = match kind {
        ProviderKind::Gemini => &body["tools"][0]["functionDeclarations"],
        _ => &body["tools"],
    };
    list.as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let (name, params) = match kind {
                ProviderKind::OpenAiChat => {
                    (&t["function"]["name"], t["function"].get("parameters"))
                }
                ProviderKind::Anthropic => (&t["name"], t.get("input_schema")),
                _ => (&t["name"], t.get("parameters")),
            };
            (name.as_str().unwrap().to_string(), params.cloned())
        })
        .collect()
}

#[test]
fn every_tool_meets_every_providers_rules() {
    let tools = all_tools();
    let endpoints = [
        (ProviderKind::OpenAiChat, "https://api.openai.com/v1"),
        (ProviderKind::OpenAiResponses, "https://api.openai.com/v1"),
        (ProviderKind::Anthropic, "https://api.anthropic.com"),
        (ProviderKind::OpenAiChat, "https://api.moonshot.ai/v1"),
        (
            ProviderKind::Gemini,
            "https://generativelanguage.googleapis.com",
        ),
    ];
    for (kind, base) in endpoints {
        let client =
            ProviderClient::new(ProviderSettings::new(kind, base, Secret::new("k"))).unwrap();
        let req = ProviderRequest {
            model: "m".into(),
            messages: vec![Message::user_text("hi")],
            tools: tools.clone(),
            ..Default::default()
        };
        let wire = wire_tools(kind, &client.request_body(&req));
        assert_eq!(wire.len(), tools.len(), "{base}: every tool is offered");
        let mut seen = std::collections::HashSet::new();
        for (name, params) in &wire {
            assert!(seen.insert(name.clone()), "{base}: duplicate name {name}");
            let params = params.as_ref();
            match Dialect::for_endpoint(kind, base) {
                Dialect::OpenAi => check_openai(name, params.unwrap()),
                Dialect::Anthropic => check_anthropic(name, params.unwrap()),
                Dialect::Moonshot => check_moonshot(name, params.unwrap()),
                Dialect::Gemini => check_gemini(name, params),
                Dialect::GeminiOpenAi => unreachable!("not in this list"),
            }
        }
        // Every wire name maps back to the tool's own name.
        let dialect = Dialect::for_endpoint(kind, base);
        let names = ToolNames::new(dialect, tools.iter().map(|t| t.name.as_str()));
        for (t, (w, _)) in tools.iter().zip(&wire) {
            assert_eq!(&names.wire(&t.name), w, "{base}");
            assert_eq!(names.original(w), t.name, "{base}");
        }
    }
}

/// The Gemini OpenAI-compatible endpoint gets Gemini's schema subset in OpenAI's tool format.
#[test]
fn gemini_openai_endpoint_gets_gemini_schemas() {
    let base = "https://generativelanguage.googleapis.com/v1beta/openai";
    assert_eq!(
        Dialect::for_endpoint(ProviderKind::OpenAiChat, base),
        Dialect::GeminiOpenAi
    );
    let client = ProviderClient::new(ProviderSettings::new(
        ProviderKind::OpenAiChat,
        base,
        Secret::new("k"),
    ))
    .unwrap();
    let req = ProviderRequest {
        tools: all_tools(),
        ..Default::default()
    };
    for (name, params) in wire_tools(ProviderKind::OpenAiChat, &client.request_body(&req)) {
        assert!(openai_name_ok(&name), "{name}");
        let params = params.unwrap();
        // OpenAI's format always sends parameters; Gemini's subset inside them.
        let mut inner = params.clone();
        if inner["properties"]
            .as_object()
            .is_some_and(|p| p.is_empty())
        {
            inner.as_object_mut().unwrap().remove("properties");
        }
        check_gemini(&name, Some(&inner));
    }
}

/// The checkers are not vacuous: most raw awkward schemas break the rules somewhere.
#[test]
fn checkers_reject_the_raw_schemas() {
    let fails = |f: &dyn Fn()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err();
    let raw = awkward_schemas();
    let rejected_by_gemini = raw
        .iter()
        .filter(|s| fails(&|| check_gemini("ok", Some(s))))
        .count();
    let rejected_by_openai = raw
        .iter()
        .filter(|s| fails(&|| check_openai("ok", s)))
        .count();
    assert!(rejected_by_gemini >= 9, "{rejected_by_gemini}");
    assert!(rejected_by_openai >= 7, "{rejected_by_openai}");
    assert!(fails(&|| check_moonshot(
        "ok",
        &json!({"type": "object", "properties": {"o": {"properties": {}}}})
    )));
    for bad in ["a.b", "a b", "", &"x".repeat(65)] {
        assert!(
            fails(&|| check_openai(bad, &json!({"type": "object", "properties": {}}))),
            "{bad}"
        );
    }
    for bad in ["9lives", "a b", "ü"] {
        assert!(fails(&|| check_gemini(bad, None)), "{bad}");
    }
}
