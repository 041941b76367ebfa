//! The generated schema against the wire tables (`tests/fixtures/protocol`, gzipped copies of
//! `../shared/protocol/*.tsv`, Cmd+K's `cmdk.tsv` among them) and real captures.
//!
//! Two captures (`yelixir-*`) state no licence, so the repository keeps no copy: the tests on
//! them read `../shared/protocol/captures` (beside the checkout in CI) and report `SKIPPED` where
//! it is absent. Everything else runs everywhere.

#[path = "common/skip.rs"]
mod skip;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use cursor_byok::proto::{agent::v1 as agent, aiserver::v1 as aiserver, DESCRIPTOR_SET};
use prost::Message;
use prost_reflect::{Cardinality, DescriptorPool, Kind, MessageDescriptor};

/// The wire tables kept in the repository (see the README there for their source).
fn tables() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/protocol")
}

/// A capture only `../shared` holds, or `None` after reporting `test` as skipped.
fn shared_capture(test: &str, file: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/protocol/captures")
        .join(file);
    if path.is_file() {
        Some(path)
    } else {
        skip::skipped(
            test,
            &format!(
                "{} not found (no licence to keep a copy in the repository; CI has ../shared)",
                path.display()
            ),
        );
        None
    }
}

fn pool() -> DescriptorPool {
    DescriptorPool::decode(DESCRIPTOR_SET).expect("descriptor set decodes")
}

/// A table's rows as column → value; `.gz` files are gunzipped first.
fn tsv(path: PathBuf) -> Vec<BTreeMap<String, String>> {
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text
    } else {
        String::from_utf8(bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    // `cmdk.tsv` opens with `#` comment lines before its header.
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            header
                .iter()
                .zip(l.split('\t').chain(std::iter::repeat("")))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// The table's spelling of a field's type.
fn type_name(kind: &Kind) -> String {
    match kind {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => m.full_name().into(),
        Kind::Enum(e) => e.full_name().into(),
    }
}

/// One field as the tables describe it: (number, type, label, oneof).
type FieldRow = (String, String, String, String);

fn describe_field(field: &prost_reflect::FieldDescriptor) -> FieldRow {
    let (ty, label) = if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("map fields are messages")
        };
        let key = type_name(&entry.map_entry_key_field().kind());
        let value = type_name(&entry.map_entry_value_field().kind());
        (value.clone(), format!("map<{key},{value}>"))
    } else {
        let label = match field.cardinality() {
            Cardinality::Repeated => "repeated",
            _ if field.field_descriptor_proto().proto3_optional() => "optional",
            _ => "singular",
        };
        (type_name(&field.kind()), label.to_string())
    };
    let oneof = field
        .containing_oneof()
        .filter(|o| !o.is_synthetic())
        .map(|o| o.name().to_string())
        .unwrap_or_default();
    (field.number().to_string(), ty, label, oneof)
}

#[test]
fn descriptors_match_the_high_confidence_tables() {
    let dir = tables();
    let pool = pool();

    let mut want: BTreeMap<String, BTreeMap<String, FieldRow>> = BTreeMap::new();
    // The shared tables plus the project's local additions: fields newer Cursor releases have
    // (`TurnEndedUpdate.ended_at_ms`, `McpArgs` field 10 from desktop 3.23.12 / CLI 2026.10.01)
    // that the read-only shared tables do not list yet. The generator reads the same file.
    let local = tsv(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/schema-local.tsv"));
    assert_eq!(local.len(), 2, "local additions: {local:?}");
    let shared = tsv(dir.join("schema.tsv.gz"));
    for row in &local {
        assert!(
            !shared.iter().any(|r| r["message"] == row["message"]
                && r["field_number"] == row["field_number"]),
            "{}.{} is in the shared tables now: drop it from tools/schema-local.tsv",
            row["message"],
            row["field_number"]
        );
    }
    // Cmd+K's table: its enum values are rows too (checked with the enums).
    let cmdk = tsv(dir.join("cmdk.tsv.gz"))
        .into_iter()
        .filter(|r| r["type"] != "(enum value)");
    for row in shared
        .into_iter()
        .chain(local)
        .chain(cmdk)
        .filter(|r| r["confidence"] == "high")
    {
        let fields = want.entry(row["message"].clone()).or_default();
        if row["label"] != "(empty message)" {
            fields.insert(
                row["field_name"].clone(),
                (
                    row["field_number"].clone(),
                    row["type"].clone(),
                    row["label"].clone(),
                    row["oneof_group"].clone(),
                ),
            );
        }
    }

    let mut got: BTreeMap<String, BTreeMap<String, FieldRow>> = BTreeMap::new();
    for msg in pool.all_messages() {
        if msg.is_map_entry() || msg.package_name().starts_with("google.") {
            continue;
        }
        got.insert(
            msg.full_name().to_string(),
            msg.fields()
                .map(|f| (f.name().to_string(), describe_field(&f)))
                .collect(),
        );
    }

    let mut diffs = Vec::new();
    for name in want
        .keys()
        .collect::<BTreeSet<_>>()
        .union(&got.keys().collect())
    {
        match (want.get(*name), got.get(*name)) {
            (Some(_), None) => diffs.push(format!("message {name}: in the tables, not generated")),
            (None, Some(_)) => diffs.push(format!("message {name}: generated, not in the tables")),
            (Some(w), Some(g)) => {
                for field in w.keys().collect::<BTreeSet<_>>().union(&g.keys().collect()) {
                    if w.get(*field) != g.get(*field) {
                        diffs.push(format!(
                            "{name}.{field}: tables {:?}, generated {:?}",
                            w.get(*field),
                            g.get(*field)
                        ));
                    }
                }
            }
            (None, None) => unreachable!(),
        }
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    assert_eq!(want.len(), got.len());
    eprintln!(
        "{} messages and {} fields match",
        got.len(),
        got.values().map(|f| f.len()).sum::<usize>()
    );
}

#[test]
fn enums_match_the_high_confidence_tables() {
    let dir = tables();
    let pool = pool();
    let mut want: BTreeMap<String, BTreeSet<(String, i32)>> = BTreeMap::new();
    let cmdk = tsv(dir.join("cmdk.tsv.gz"))
        .into_iter()
        .filter(|r| r["type"] == "(enum value)")
        .map(|r| {
            BTreeMap::from([
                ("enum".to_string(), r["message"].clone()),
                ("value_name".to_string(), r["field_name"].clone()),
                ("number".to_string(), r["field_number"].clone()),
                ("confidence".to_string(), r["confidence"].clone()),
            ])
        });
    for row in tsv(dir.join("enums.tsv.gz"))
        .into_iter()
        .chain(cmdk)
        .filter(|r| r["confidence"] == "high")
    {
        want.entry(row["enum"].clone())
            .or_default()
            .insert((row["value_name"].clone(), row["number"].parse().unwrap()));
    }
    let got: BTreeMap<String, BTreeSet<(String, i32)>> = pool
        .all_enums()
        .filter(|e| !e.package_name().starts_with("google."))
        .map(|e| {
            let values = e
                .values()
                .map(|v| (v.name().to_string(), v.number()))
                .collect();
            (e.full_name().to_string(), values)
        })
        .collect();
    let names: BTreeSet<_> = want.keys().chain(got.keys()).collect();
    let diffs: Vec<String> = names
        .into_iter()
        .filter(|n| want.get(*n) != got.get(*n))
        .map(|n| format!("{n}: tables {:?}, generated {:?}", want.get(n), got.get(n)))
        .collect();
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

#[test]
fn available_models_capture_round_trips_byte_identically() {
    let Some(path) = shared_capture(
        "available_models_capture_round_trips_byte_identically",
        "yelixir-native-cli-20260825-models.gzip.b64",
    ) else {
        return;
    };
    let b64 = std::fs::read_to_string(path).unwrap();
    let gz = base64::engine::general_purpose::STANDARD
        .decode(b64.split_whitespace().collect::<String>())
        .unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .unwrap();
    assert_eq!(raw.len(), 51_161);

    let models = aiserver::AvailableModelsResponse::decode(&raw[..]).unwrap();
    assert!(models.models.len() > 5, "{} models", models.models.len());
    assert!(models.models.iter().any(|m| m.name == "composer-2.5"));
    assert_eq!(
        models.encode_to_vec(),
        raw,
        "re-encoding differs from the capture"
    );

    // No field went unrecognised: a dynamic decode with the same schema reports none unknown.
    let desc = pool()
        .get_message_by_name("aiserver.v1.AvailableModelsResponse")
        .unwrap();
    let dynamic = prost_reflect::DynamicMessage::decode(desc, &raw[..]).unwrap();
    assert_eq!(count_unknown(&dynamic), 0);
}

fn count_unknown(msg: &prost_reflect::DynamicMessage) -> usize {
    use prost_reflect::Value;
    fn walk(v: &Value) -> usize {
        match v {
            Value::Message(m) => count_unknown(m),
            Value::List(items) => items.iter().map(walk).sum(),
            Value::Map(map) => map.values().map(walk).sum(),
            _ => 0,
        }
    }
    msg.unknown_fields().count() + msg.fields().map(|(_, v)| walk(v)).sum::<usize>()
}

/// Walks protobuf-es JSON (`{"case": …, "value": …}` for oneofs) against a message descriptor,
/// collecting every key that names nothing on the generated message.
fn unknown_json_names(
    desc: &MessageDescriptor,
    json: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    let Some(obj) = json.as_object() else { return };
    if desc.full_name().starts_with("google.protobuf.") {
        return; // Struct / Value hold free-form JSON.
    }
    for (key, value) in obj {
        let here = format!("{path}.{key}");
        if let Some(field) = desc
            .fields()
            .find(|f| f.json_name() == key || f.name() == key)
        {
            check_field_value(&field, value, &here, out);
        } else if let Some(oneof) = desc
            .oneofs()
            .find(|o| camel(o.name()) == *key || o.name() == key)
        {
            let case = value.get("case").and_then(|c| c.as_str());
            match case.and_then(|c| oneof.fields().find(|f| f.json_name() == c || f.name() == c)) {
                Some(field) => {
                    if let Some(v) = value.get("value") {
                        check_field_value(
                            &field,
                            v,
                            &format!("{here}.{}", case.unwrap_or("")),
                            out,
                        );
                    }
                }
                None if case.is_none() => {} // an unset oneof
                None => out.push(format!("{here} (oneof case {case:?})")),
            }
        } else {
            out.push(here);
        }
    }
}

fn check_field_value(
    field: &prost_reflect::FieldDescriptor,
    value: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    let Kind::Message(msg) = field.kind() else {
        return;
    };
    if field.is_map() {
        if let (Some(obj), Kind::Message(inner)) =
            (value.as_object(), msg.map_entry_value_field().kind())
        {
            for (k, v) in obj {
                unknown_json_names(&inner, v, &format!("{path}[{k}]"), out);
            }
        }
    } else if let Some(items) = value.as_array() {
        for (i, v) in items.iter().enumerate() {
            unknown_json_names(&msg, v, &format!("{path}[{i}]"), out);
        }
    } else {
        unknown_json_names(&msg, value, path, out);
    }
}

fn camel(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn run_request_capture_field_names_exist() {
    let desc = pool()
        .get_message_by_name("agent.v1.AgentClientMessage")
        .unwrap();
    let mut frames = 0;
    for file in [
        "yelixir-native-cli-20260825-chat.ndjson",
        "yelixir-native-tool-parallel-run-request.ndjson",
    ] {
        let Some(path) = shared_capture("run_request_capture_field_names_exist", file) else {
            return;
        };
        let text = std::fs::read_to_string(path).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let fields = &record["decoded_fields"];
            assert!(fields.is_object(), "{file}: no decoded_fields");
            let mut unknown = Vec::new();
            unknown_json_names(&desc, fields, "AgentClientMessage", &mut unknown);
            assert!(
                unknown.is_empty(),
                "{file}: names not on the generated messages: {unknown:#?}"
            );
            frames += 1;
        }
    }
    assert_eq!(frames, 3);
}

// Self-contained checks.

#[test]
fn core_agent_messages_round_trip() {
    let msg = agent::AgentClientMessage {
        message: Some(agent::agent_client_message::Message::RunRequest(
            agent::AgentRunRequest {
                conversation_id: Some("c1".into()),
                requested_model: Some(agent::RequestedModel {
                    model_id: "byok-test".into(),
                    parameters: vec![agent::requested_model::ModelParameterValue {
                        id: "effort".into(),
                        value: "high".into(),
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        )),
    };
    let bytes = msg.encode_to_vec();
    assert_eq!(agent::AgentClientMessage::decode(&bytes[..]).unwrap(), msg);
}

#[test]
fn cross_package_references_resolve() {
    let pool = pool();
    for name in [
        "agent.v1.AgentClientMessage",
        "agent.v1.AgentServerMessage",
        "agent.v1.ConversationStateStructure",
        "aiserver.v1.BidiAppendRequest",
        "aiserver.v1.AvailableModelsResponse",
        "aiserver.v1.GetServerConfigResponse",
        "aiserver.v1.ErrorDetails",
    ] {
        assert!(pool.get_message_by_name(name).is_some(), "{name} missing");
    }
    let field = pool
        .get_message_by_name("aiserver.v1.GetServerConfigResponse")
        .unwrap()
        .get_field(7)
        .unwrap();
    assert_eq!(field.name(), "http2_config");
}

#[test]
fn blob_id_is_sha256() {
    let id = cursor_byok::proto::blob_id(b"abc");
    assert_eq!(
        hex::encode(id),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}
