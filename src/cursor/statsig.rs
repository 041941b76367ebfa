//! `BootstrapStatsig`: upstream's Statsig bootstrap with the gates that pick the agent doors we
//! do not serve turned off.
//!
//! Cursor's client chooses two agent transports by client-evaluated Statsig gates, both off by
//! default in Cursor's own experiment registry (`../shared/protocol/agent-ws.md` §2, §11;
//! `inference.md` §8):
//! - `nal_websocket_client`: the agent run over a WebSocket (`/agent/v1/run`); off keeps the
//!   HTTP transports (Run, RunSSE + BidiAppend) that reach our agent;
//! - `agent_host_local_loop`: the agent host's local loop, whose model calls go to
//!   `aiserver.v1.InferenceService/RunInference`; off routes every turn to `connect` (the
//!   agent RPCs) with reason `gate-off`.
//!
//! The answer is protobuf: field 1 is the bootstrap JSON (a string), field 2 a timestamp. The
//! JSON holds `feature_gates`, `dynamic_configs`, `layer_configs`, `user`, `time` and
//! `hash_used`; `hash_used` says how each entry is keyed: `none` (the name), `djb2` (decimal
//! 32-bit djb2 over the name's UTF-16 code units) or `sha256` (base64 of the name's SHA-256).
//! We set each gate's entry to `value: false` (adding one where absent) and keep every other
//! byte of the message and every other JSON value as it came.
//!
//! Fail closed: a bootstrap we cannot read (no field 1, not JSON, an unknown `hash_used`) is
//! never passed on, since it might hold the gates on. [`local_bootstrap`] replaces it: the two
//! gates off and every other experiment at the client's default, which is how Cursor runs
//! when Statsig cannot be reached. Losing Cursor's experiments until the next fetch is the
//! price; a BYOK turn sent through a door we do not serve would be worse.

use base64::Engine;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::proto::wire::{self, WireType};

/// The gates turned off in every bootstrap we answer.
pub const GATES_OFF: [&str; 2] = ["nal_websocket_client", "agent_host_local_loop"];

/// The `rule_id` we give an entry we add or change, so the client's exposure logs say why.
const OUR_RULE: &str = "cursor-byok:door-not-served";

/// Why a bootstrap could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatsigError {
    #[error("the bootstrap answer does not scan as protobuf: {0}")]
    Wire(#[from] wire::WireError),
    #[error("the bootstrap answer has no config (field 1)")]
    NoConfig,
    #[error("the bootstrap config is not UTF-8")]
    NotUtf8,
    #[error("the bootstrap config is not a JSON object: {0}")]
    Json(String),
    #[error("the bootstrap config's hash_used {0:?} is not one we know")]
    UnknownHash(String),
    #[error("the bootstrap config's feature_gates is not an object")]
    GatesNotObject,
}

/// Statsig's djb2 key: `h = h * 31 + c` over UTF-16 code units, wrapping at 32 bits,
/// printed as an unsigned decimal.
pub fn djb2(name: &str) -> String {
    let hash = name
        .encode_utf16()
        .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(u32::from(c)));
    hash.to_string()
}

/// The key of gate `name` under `hash_used`.
fn gate_key(name: &str, hash_used: &str) -> Result<String, StatsigError> {
    match hash_used {
        "none" => Ok(name.to_owned()),
        "djb2" => Ok(djb2(name)),
        "sha256" => {
            let digest = Sha256::digest(name.as_bytes());
            Ok(base64::engine::general_purpose::STANDARD.encode(digest))
        }
        other => Err(StatsigError::UnknownHash(other.to_owned())),
    }
}

/// The bootstrap JSON with [`GATES_OFF`] off; every other value is kept.
pub(crate) fn rewrite_config(json: &str) -> Result<String, StatsigError> {
    let mut root: Map<String, Value> =
        serde_json::from_str(json).map_err(|e| StatsigError::Json(e.to_string()))?;
    // Statsig's default when the field is absent is `djb2`.
    let hash_used = match root.get("hash_used") {
        None => "djb2".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(StatsigError::UnknownHash(other.to_string())),
    };
    let gates = root
        .entry("feature_gates")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or(StatsigError::GatesNotObject)?;
    for name in GATES_OFF {
        let key = gate_key(name, &hash_used)?;
        match gates.get_mut(&key) {
            Some(Value::Object(entry)) => {
                entry.insert("value".into(), Value::Bool(false));
                entry.insert("rule_id".into(), Value::String(OUR_RULE.into()));
            }
            _ => {
                gates.insert(key.clone(), gate_off_entry(&key));
            }
        }
    }
    serde_json::to_string(&root).map_err(|e| StatsigError::Json(e.to_string()))
}

fn gate_off_entry(key: &str) -> Value {
    serde_json::json!({
        "name": key,
        "value": false,
        "rule_id": OUR_RULE,
        "id_type": "userID",
        "secondary_exposures": [],
    })
}

/// The bootstrap message (`BootstrapStatsigResponse`, raw protobuf) with its config rewritten
/// by [`rewrite_config`]. Every other field stays byte for byte; field 1 is replaced by one
/// occurrence carrying the rewritten JSON (for a string, the last occurrence is the value).
pub(crate) fn rewrite_message(message: &[u8]) -> Result<Vec<u8>, StatsigError> {
    let mut config = None;
    for field in wire::fields(message) {
        let field = field?;
        if field.number == 1 && field.wire_type == WireType::Len {
            config = Some(field.value);
        }
    }
    let config = config.ok_or(StatsigError::NoConfig)?;
    let json = std::str::from_utf8(config).map_err(|_| StatsigError::NotUtf8)?;
    let rewritten = rewrite_config(json)?;
    let ours = config_field(&rewritten);
    Ok(wire::splice(message, |n| n == 1, &ours)?)
}

/// Field 1 (`config`) holding `json`, encoded.
fn config_field(json: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + 6);
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(json.len() as u64, &mut out);
    out.extend_from_slice(json.as_bytes());
    out
}

/// The bootstrap JSON we answer when upstream's cannot be read: no experiment but the gates
/// in [`GATES_OFF`], off.
pub(crate) fn local_config(now_ms: u64) -> String {
    let gates: Map<String, Value> = GATES_OFF
        .iter()
        .map(|name| {
            let key = djb2(name);
            let entry = gate_off_entry(&key);
            (key, entry)
        })
        .collect();
    serde_json::json!({
        "feature_gates": gates,
        "dynamic_configs": {},
        "layer_configs": {},
        "has_updates": true,
        "hash_used": "djb2",
        "time": now_ms,
        "user": {},
    })
    .to_string()
}

/// [`local_config`] as a `BootstrapStatsigResponse` (config 1, timestamp 2).
pub(crate) fn local_bootstrap(now_ms: u64) -> Vec<u8> {
    let mut out = config_field(&local_config(now_ms));
    prost::encoding::uint64::encode(2, &now_ms, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bootstrap shaped as peers record Cursor's (djb2 keys, gate entries with rule ids and
    /// exposures, a dynamic config, a layer), with both gates on.
    fn upstream_config() -> String {
        serde_json::json!({
            "feature_gates": {
                "579159465": {"name": "579159465", "value": true, "rule_id": "5yQbTbG3",
                               "id_type": "userID", "secondary_exposures": []},
                "1967931573": {"name": "1967931573", "value": true, "rule_id": "3MgjZ8Ce",
                                "id_type": "userID", "secondary_exposures": [
                                    {"gate": "x", "gateValue": "true", "ruleID": "r"}]},
                "12345": {"name": "12345", "value": true, "rule_id": "keep"}
            },
            "dynamic_configs": {
                "2362453234": {"name": "2362453234", "value": {"maxConnections": 2},
                                "rule_id": "pool"}
            },
            "layer_configs": {"99": {"name": "99", "value": {"a": 1}}},
            "user": {"userID": "u1", "custom": {"plan": "pro"}},
            "time": 1_790_000_000_000u64,
            "has_updates": true,
            "hash_used": "djb2"
        })
        .to_string()
    }

    fn gate(root: &Value, key: &str) -> Value {
        root["feature_gates"][key].clone()
    }

    #[test]
    fn djb2_matches_the_published_keys() {
        // agent-ws.md §11 (a peer's test) and inference.md §8.
        assert_eq!(djb2("nal_websocket_client"), "579159465");
        assert_eq!(djb2("nal_websocket_client_pool"), "2362453234");
        assert_eq!(djb2("agent_host_local_loop"), "1967931573");
    }

    #[test]
    fn gates_go_off_and_everything_else_stays() {
        let before: Value = serde_json::from_str(&upstream_config()).unwrap();
        let after: Value = serde_json::from_str(&rewrite_config(&upstream_config()).unwrap())
            .expect("rewrite is JSON");
        for key in ["579159465", "1967931573"] {
            assert_eq!(gate(&after, key)["value"], Value::Bool(false), "{key}");
            assert_eq!(gate(&after, key)["rule_id"], OUR_RULE);
            assert_eq!(
                gate(&after, key)["secondary_exposures"],
                gate(&before, key)["secondary_exposures"]
            );
        }
        let mut expect = before.clone();
        for key in ["579159465", "1967931573"] {
            expect["feature_gates"][key]["value"] = Value::Bool(false);
            expect["feature_gates"][key]["rule_id"] = OUR_RULE.into();
        }
        assert_eq!(after, expect, "nothing else changes");
    }

    #[test]
    fn absent_gates_are_added_off_under_each_hash() {
        for (hash, keys) in [
            (
                "none",
                [
                    "nal_websocket_client".to_owned(),
                    "agent_host_local_loop".into(),
                ],
            ),
            ("djb2", ["579159465".into(), "1967931573".into()]),
            (
                "sha256",
                GATES_OFF.map(|n| gate_key(n, "sha256").expect("known hash")),
            ),
        ] {
            let json = format!(r#"{{"feature_gates":{{}},"hash_used":"{hash}"}}"#);
            let after: Value = serde_json::from_str(&rewrite_config(&json).unwrap()).unwrap();
            for key in &keys {
                assert_eq!(
                    gate(&after, key)["value"],
                    Value::Bool(false),
                    "{hash} {key}"
                );
            }
        }
        // sha256 keys are base64 of the digest (44 characters).
        assert_eq!(gate_key("a", "sha256").unwrap().len(), 44);
        let none: Value = serde_json::from_str(&rewrite_config(r#"{"user":{}}"#).unwrap()).unwrap();
        assert_eq!(gate(&none, "579159465")["value"], Value::Bool(false));
    }

    #[test]
    fn unreadable_configs_are_errors() {
        for bad in [
            "not json",
            "[]",
            r#"{"hash_used":"md5"}"#,
            r#"{"hash_used":7}"#,
            r#"{"feature_gates":[]}"#,
        ] {
            assert!(rewrite_config(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_message_keeps_its_other_fields_byte_for_byte() {
        let mut message = config_field(&upstream_config());
        prost::encoding::uint64::encode(2, &1_790_000_000_000u64, &mut message);
        // A field this build does not know.
        prost::encoding::string::encode(9, &"future".to_owned(), &mut message);
        let out = rewrite_message(&message).expect("rewrites");
        let fields: Vec<_> = wire::fields(&out).map(|f| f.unwrap()).collect();
        let others = |fs: &[wire::Field<'_>]| {
            fs.iter()
                .filter(|f| f.number != 1)
                .map(|f| f.raw.to_vec())
                .collect::<Vec<_>>()
        };
        let before: Vec<_> = wire::fields(&message).map(|f| f.unwrap()).collect();
        assert_eq!(others(&fields), others(&before));
        let configs: Vec<_> = fields.iter().filter(|f| f.number == 1).collect();
        assert_eq!(configs.len(), 1);
        let json: Value = serde_json::from_slice(configs[0].value).unwrap();
        assert_eq!(gate(&json, "1967931573")["value"], Value::Bool(false));
    }

    #[test]
    fn unreadable_messages_are_errors() {
        assert!(matches!(
            rewrite_message(b"\x10\x01"),
            Err(StatsigError::NoConfig)
        ));
        assert!(matches!(
            rewrite_message(b"\x0a\x05ab"),
            Err(StatsigError::Wire(_))
        ));
        assert!(matches!(
            rewrite_message(b"\x0a\x02\xff\xfe"),
            Err(StatsigError::NotUtf8)
        ));
    }

    #[test]
    fn the_local_bootstrap_has_the_gates_off_and_nothing_else() {
        let message = local_bootstrap(42);
        let config = wire::fields(&message)
            .map(|f| f.unwrap())
            .find(|f| f.number == 1)
            .expect("config");
        let json: Value = serde_json::from_slice(config.value).unwrap();
        assert_eq!(json["hash_used"], "djb2");
        assert_eq!(json["feature_gates"].as_object().unwrap().len(), 2);
        assert_eq!(gate(&json, "579159465")["value"], Value::Bool(false));
        assert_eq!(gate(&json, "1967931573")["value"], Value::Bool(false));
        // Rewriting our own answer changes nothing but the rule we already set.
        let again = rewrite_message(&message).unwrap();
        let json2: Value = serde_json::from_slice(
            wire::fields(&again)
                .map(|f| f.unwrap())
                .find(|f| f.number == 1)
                .unwrap()
                .value,
        )
        .unwrap();
        assert_eq!(json, json2);
    }
}
