//! MCP tools from `run_request.mcp_tools` and the request context's `tools` (where Cursor's SDK
//! puts them), offered as `mcp_<provider>_<tool>` and run through `mcp_args` with the arguments
//! as `google.protobuf.Value`s and the definition's server identifier.

use std::collections::{BTreeMap, HashMap, HashSet};

use prost_types::value::Kind;
use serde_json::{json, Map, Number, Value};

use super::args::{norm, Args};
use super::call::{wrap, Access, ExecArgs, ExecResult, Mode, ToolContext, ToolPlan};
use super::text::cap_head;
use crate::proto::agent::v1 as pb;
use crate::provider::ToolSpec;
use pb::mcp_tool_result::Result as M;
use pb::tool_call::Tool;

/// Providers accept tool names of 1–64 characters from `[a-zA-Z0-9_-]`.
const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 2000;
const MAX_TEXT_BYTES: usize = 50_000;

fn sanitize(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Only ASCII remains, so byte truncation is safe.
    out.truncate(MAX_NAME);
    out
}

fn tool_part(def: &pb::McpToolDefinition) -> &str {
    if def.tool_name.is_empty() {
        &def.name
    } else {
        &def.tool_name
    }
}

/// The MCP tools of a run: `run_request.mcp_tools` first, then the request context's `tools`
/// that name a (server, tool) pair not seen yet. Both lists describe the same servers when a
/// client fills both, so the first definition of a pair wins.
pub(crate) fn merge_definitions(lists: &[&[pb::McpToolDefinition]]) -> Vec<pb::McpToolDefinition> {
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut out = Vec::new();
    for def in lists.iter().flat_map(|l| l.iter()) {
        let key = (def.provider_identifier.clone(), tool_part(def).to_string());
        if seen.insert(key) {
            out.push(def.clone());
        }
    }
    out
}

/// Our name for an MCP tool before de-duplication.
pub(crate) fn base_name(provider: &str, tool: &str) -> String {
    let provider = if provider.is_empty() {
        "server"
    } else {
        provider
    };
    sanitize(&format!("mcp_{provider}_{tool}"))
}

/// Every MCP tool with its unique name, in definition order (later duplicates get `_2`, `_3`…).
pub(crate) fn named(defs: &[pb::McpToolDefinition]) -> Vec<(String, &pb::McpToolDefinition)> {
    let mut used: HashSet<String> = HashSet::new();
    defs.iter()
        .map(|def| {
            let base = base_name(&def.provider_identifier, tool_part(def));
            let mut name = base.clone();
            let mut n = 2;
            while used.contains(&name) {
                let suffix = format!("_{n}");
                let mut stem = base.clone();
                stem.truncate(MAX_NAME - suffix.len());
                name = format!("{stem}{suffix}");
                n += 1;
            }
            used.insert(name.clone());
            (name, def)
        })
        .collect()
}

/// Looser spellings: ours without case/`_`/`-` (which also covers Claude's `mcp__p__t`),
/// Cursor's own definition name, or the bare tool name when only one server has it.
pub(crate) fn find_loose<'a>(
    named: &[(String, &'a pb::McpToolDefinition)],
    name: &str,
) -> Option<(String, &'a pb::McpToolDefinition)> {
    let wanted = norm(name);
    if wanted.is_empty() {
        return None;
    }
    let unique = |hits: Vec<&(String, &'a pb::McpToolDefinition)>| match hits.as_slice() {
        [one] => Some((one.0.clone(), one.1)),
        _ => None,
    };
    unique(named.iter().filter(|(n, _)| norm(n) == wanted).collect())
        .or_else(|| {
            unique(
                named
                    .iter()
                    .filter(|(_, d)| !d.name.is_empty() && norm(&d.name) == wanted)
                    .collect(),
            )
        })
        .or_else(|| {
            unique(
                named
                    .iter()
                    .filter(|(_, d)| norm(tool_part(d)) == wanted)
                    .collect(),
            )
        })
}

/// Marked `readOnlyHint` in its MCP annotations: allowed in Ask and Plan modes.
pub(crate) fn read_only(def: &pb::McpToolDefinition) -> bool {
    def.annotations_json
        .as_deref()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .and_then(|v| v.get("readOnlyHint").and_then(Value::as_bool))
        .unwrap_or(false)
}

pub(crate) fn specs(ctx: &ToolContext) -> Vec<ToolSpec> {
    let agent = ctx.mode_kind() == Mode::Agent;
    named(&ctx.mcp_tools)
        .into_iter()
        .filter(|(_, def)| agent || read_only(def))
        .map(|(name, def)| ToolSpec {
            name,
            description: description(def),
            parameters: schema(def),
        })
        .collect()
}

fn description(def: &pb::McpToolDefinition) -> String {
    let provider = &def.provider_identifier;
    let text = def.description.trim();
    if text.is_empty() {
        return format!("Tool `{}` of the MCP server `{provider}`.", tool_part(def));
    }
    let (text, cut) = cap_head(text, MAX_DESCRIPTION);
    format!(
        "{}{} (MCP server `{provider}`)",
        text.trim_end(),
        if cut { "…" } else { "" }
    )
}

/// The JSON Schema from `input_schema`, else `input_schema_json`, made an object schema.
pub(crate) fn schema(def: &pb::McpToolDefinition) -> Value {
    let mut v = def
        .input_schema
        .as_ref()
        .map(to_json)
        .filter(Value::is_object)
        .or_else(|| {
            def.input_schema_json
                .as_deref()
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
                .filter(Value::is_object)
        })
        .unwrap_or_else(|| json!({}));
    if let Some(o) = v.as_object_mut() {
        o.entry("type").or_insert_with(|| json!("object"));
        o.entry("properties").or_insert_with(|| json!({}));
    }
    v
}

/// `google.protobuf.Value` → JSON. Integral numbers become JSON integers.
pub(crate) fn to_json(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::NumberValue(f)) => {
            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                Value::from(*f as i64)
            } else {
                Number::from_f64(*f).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(to_json).collect()),
        Some(Kind::StructValue(s)) => Value::Object(
            s.fields
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
    }
}

/// JSON → `google.protobuf.Value` (numbers become doubles, as protobuf has no integers there).
pub(crate) fn to_prost(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(to_prost).collect(),
        }),
        Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), to_prost(v)))
                .collect::<BTreeMap<_, _>>(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

pub(crate) fn to_prost_map(o: &Map<String, Value>) -> HashMap<String, prost_types::Value> {
    o.iter().map(|(k, v)| (k.clone(), to_prost(v))).collect()
}

pub(crate) fn args_for(
    def: &pb::McpToolDefinition,
    args: HashMap<String, prost_types::Value>,
    call_id: &str,
) -> pb::McpArgs {
    pb::McpArgs {
        name: def.name.clone(),
        args,
        tool_call_id: call_id.to_string(),
        provider_identifier: def.provider_identifier.clone(),
        tool_name: tool_part(def).to_string(),
        ..Default::default()
    }
}

pub(crate) fn plan(call_id: &str, def: &pb::McpToolDefinition, a: &Args) -> ToolPlan {
    let args = args_for(def, to_prost_map(a.map()), call_id);
    ToolPlan::Exec {
        exec: ExecArgs::McpArgs(args.clone()),
        tool_call: wrap(
            call_id,
            Tool::McpToolCall(pb::McpToolCall {
                args: Some(args),
                result: None,
                description: None,
            }),
        ),
        // An MCP tool can do anything: run it alone.
        access: Access::Exclusive,
    }
}

fn tool_error(error: String) -> M {
    M::Error(pb::McpToolError {
        error,
        read_tool_def_reminder: String::new(),
    })
}

pub(crate) fn finish(
    mut t: pb::McpToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::McpToolCall {
    use pb::mcp_result::Result as R;
    // `approved` only says the user allowed the call; the answer follows it.
    let found = results.iter().rev().find_map(|m| match m {
        ExecResult::McpResult(r) => r.result.as_ref().filter(|r| !matches!(r, R::Approved(_))),
        _ => None,
    });
    let result = match found {
        Some(R::Success(s)) => M::Success(s.clone()),
        Some(R::Error(e)) => {
            let auth = if e.needs_auth == Some(true) {
                " (the MCP server needs authentication: ask the user to sign in to it in Cursor)"
            } else {
                ""
            };
            tool_error(format!("{}{auth}", e.error))
        }
        Some(R::Rejected(r)) => M::Rejected(r.clone()),
        Some(R::PermissionDenied(p)) => M::PermissionDenied(p.clone()),
        Some(R::ToolNotFound(n)) => tool_error(format!(
            "MCP tool `{}` not found; the server offers: {}",
            n.name,
            n.available_tools.join(", ")
        )),
        Some(R::ServerNotFound(n)) => tool_error(format!(
            "MCP server `{}` not found; available servers: {}",
            n.name,
            n.available_servers.join(", ")
        )),
        Some(R::Approved(_)) | None => tool_error(match thrown {
            Some(e) => format!("the client failed: {e}"),
            None => "the client returned no result".into(),
        }),
    };
    t.result = Some(pb::McpToolResult {
        result: Some(result),
    });
    t
}

pub(crate) fn render(t: &pb::McpToolCall) -> (String, bool) {
    use pb::mcp_tool_result_content_item::Content;
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(M::Success(s)) => {
            let mut parts: Vec<String> = Vec::new();
            for item in &s.content {
                match &item.content {
                    Some(Content::Text(x)) => {
                        let mut text = x.text.clone();
                        if let Some(loc) = x
                            .output_location
                            .as_ref()
                            .filter(|l| !l.file_path.is_empty())
                        {
                            text.push_str(&format!("\n[Full output saved to {}.]", loc.file_path));
                        }
                        parts.push(text);
                    }
                    Some(Content::Image(i)) => {
                        parts.push(format!("[image: {}, {} bytes]", i.mime_type, i.data.len()))
                    }
                    None => {}
                }
            }
            if parts.is_empty() {
                if let Some(st) = &s.structured_content {
                    let v = Value::Object(
                        st.fields
                            .iter()
                            .map(|(k, v)| (k.clone(), to_json(v)))
                            .collect(),
                    );
                    parts.push(v.to_string());
                }
            }
            let text = if parts.is_empty() {
                "(no output)".to_string()
            } else {
                parts.join("\n")
            };
            let (text, cut) = cap_head(&text, MAX_TEXT_BYTES);
            (
                if cut {
                    format!("{text}\n[... output cut at {MAX_TEXT_BYTES} bytes]")
                } else {
                    text
                },
                s.is_error,
            )
        }
        Some(M::Error(e)) => (format!("MCP tool error: {}", e.error), true),
        Some(M::Rejected(r)) => {
            let reason = if r.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", r.reason)
            };
            (
                format!("The user rejected this MCP tool call{reason}"),
                true,
            )
        }
        Some(M::PermissionDenied(p)) => (
            format!("Permission denied for this MCP tool call: {}", p.error),
            true,
        ),
        None => ("The MCP tool call did not complete.".into(), true),
    }
}

pub(crate) fn history(t: &pb::McpToolCall) -> (String, Value) {
    let a = t.args.clone().unwrap_or_default();
    let tool = if a.tool_name.is_empty() {
        a.name.as_str()
    } else {
        a.tool_name.as_str()
    };
    let args: Map<String, Value> = a
        .args
        .iter()
        .map(|(k, v)| (k.clone(), to_json(v)))
        .collect();
    (base_name(&a.provider_identifier, tool), Value::Object(args))
}

pub(crate) fn with_error(mut t: pb::McpToolCall, message: &str) -> pb::McpToolCall {
    t.result = Some(pb::McpToolResult {
        result: Some(tool_error(message.to_string())),
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(provider: &str, tool: &str) -> pb::McpToolDefinition {
        pb::McpToolDefinition {
            name: format!("{provider}-{tool}"),
            provider_identifier: provider.into(),
            tool_name: tool.into(),
            ..Default::default()
        }
    }

    #[test]
    fn both_lists_are_offered_once() {
        let run = vec![def("github", "create_issue")];
        let ctx = vec![
            def("github", "create_issue"),
            pb::McpToolDefinition {
                name: "tools-lookup_secret_word".into(),
                provider_identifier: "tools".into(),
                tool_name: "lookup_secret_word".into(),
                ..Default::default()
            },
        ];
        let merged = merge_definitions(&[&run, &ctx]);
        let names: Vec<String> = named(&merged).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["mcp_github_create_issue", "mcp_tools_lookup_secret_word"]
        );
        let args = args_for(&merged[1], HashMap::new(), "c1");
        assert_eq!(args.provider_identifier, "tools");
        assert_eq!(args.tool_name, "lookup_secret_word");
        assert_eq!(args.name, "tools-lookup_secret_word");
    }

    #[test]
    fn names_are_sanitised_unique_and_short() {
        let long = "x".repeat(80);
        let defs = vec![
            def("my server", "do.it"),
            def("my_server", "do_it"),
            def("p", &long),
        ];
        let n: Vec<String> = named(&defs).into_iter().map(|(n, _)| n).collect();
        assert_eq!(n[0], "mcp_my_server_do_it");
        assert_eq!(n[1], "mcp_my_server_do_it_2");
        assert_eq!(n[2].len(), 64);
        assert!(n.iter().all(|s| s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')));
    }

    #[test]
    fn loose_names_find_the_tool() {
        let defs = vec![
            def("github", "create_issue"),
            def("linear", "create_issue"),
            def("fs", "stat"),
        ];
        let n = named(&defs);
        assert_eq!(
            find_loose(&n, "mcp__github__create_issue").map(|x| x.0),
            Some("mcp_github_create_issue".into())
        );
        assert_eq!(
            find_loose(&n, "linear-create_issue").map(|x| x.0),
            Some("mcp_linear_create_issue".into())
        );
        assert_eq!(
            find_loose(&n, "stat").map(|x| x.0),
            Some("mcp_fs_stat".into())
        );
        // Ambiguous bare names match nothing.
        assert!(find_loose(&n, "create_issue").is_none());
    }

    #[test]
    fn schemas_come_from_either_field() {
        let mut d = def("p", "t");
        d.input_schema_json =
            Some(r#"{"properties":{"q":{"type":"string"}},"required":["q"]}"#.into());
        assert_eq!(
            schema(&d),
            json!({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})
        );
        d.input_schema = Some(to_prost(
            &json!({"type":"object","properties":{"n":{"type":"integer","minimum":1}}}),
        ));
        assert_eq!(schema(&d)["properties"]["n"]["minimum"], json!(1));
        assert_eq!(
            schema(&def("p", "t")),
            json!({"type":"object","properties":{}})
        );
    }

    #[test]
    fn json_and_protobuf_values_round_trip() {
        let v = json!({"s": "x", "n": 3, "f": 1.5, "b": true, "z": null, "l": [1, "a"], "o": {"k": [false]}});
        assert_eq!(to_json(&to_prost(&v)), v);
        assert_eq!(to_prost(&json!(2)).kind, Some(Kind::NumberValue(2.0)));
    }
}
