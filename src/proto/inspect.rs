//! What in a message this build does not know: field numbers, oneof branches and enum values
//! absent from the compiled schema. A walk over the wire format guided by a small index of the
//! descriptors ([`DESCRIPTOR_SET`](super::DESCRIPTOR_SET)), built once: no second decode, no
//! allocation for what is known.
//!
//! Also gives a message's shape (field names, numbers and sizes, never values) for the capture.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use prost::Message as _;
use prost_types::field_descriptor_proto::Type;

use super::wire::{self, WireType};

/// Nesting followed at most; deeper parts are not checked.
const MAX_DEPTH: usize = 48;
/// Unknowns kept per checked message (the first ones; the count goes on).
const MAX_REPORTED: usize = 32;

/// The descriptor index: field numbers per message, values per enum.
pub struct Schema {
    messages: Vec<MessageInfo>,
    by_name: HashMap<String, usize>,
    enums: Vec<EnumInfo>,
}

struct MessageInfo {
    /// Without the package: `ExecClientMessage`, `AvailableModelsResponse.AvailableModel`.
    name: String,
    fields: HashMap<u32, FieldInfo>,
    /// Number of real (not proto3-optional) oneofs.
    oneofs: usize,
}

struct FieldInfo {
    name: String,
    kind: Kind,
    /// Index of the real oneof this field belongs to.
    oneof: Option<usize>,
}

#[derive(Clone, Copy)]
enum Kind {
    Message(usize),
    Enum(usize),
    Other,
}

struct EnumInfo {
    name: String,
    values: HashSet<i32>,
}

/// The index of the compiled schema, built on first use.
pub fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| Schema::from_descriptor_set(super::DESCRIPTOR_SET))
}

fn short(full: &str) -> String {
    full.trim_start_matches('.')
        .trim_start_matches("agent.v1.")
        .trim_start_matches("aiserver.v1.")
        .to_string()
}

impl Schema {
    /// An index of `bytes` (an encoded `FileDescriptorSet`); an undecodable set gives an empty
    /// index, which knows nothing and so checks nothing.
    pub(crate) fn from_descriptor_set(bytes: &[u8]) -> Schema {
        let set = prost_types::FileDescriptorSet::decode(bytes).unwrap_or_default();
        let mut messages = Vec::new();
        let mut enums = Vec::new();
        for file in &set.file {
            let prefix = format!(".{}", file.package());
            for m in &file.message_type {
                collect(&prefix, m, &mut messages, &mut enums);
            }
            for e in &file.enum_type {
                enums.push((format!("{prefix}.{}", e.name()), e));
            }
        }
        let enum_index: HashMap<String, usize> = enums
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i))
            .collect();
        let by_full: HashMap<String, usize> = messages
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i))
            .collect();
        let index = FullNames {
            messages: &by_full,
            enums: &enum_index,
        };
        let infos = messages
            .iter()
            .map(|(name, m)| index.message_info(name, m))
            .collect();
        Schema {
            messages: infos,
            by_name: by_full
                .into_iter()
                .map(|(name, i)| (name.trim_start_matches('.').to_string(), i))
                .collect(),
            enums: enums
                .into_iter()
                .map(|(name, e)| EnumInfo {
                    name: short(&name),
                    values: e.value.iter().map(|v| v.number()).collect(),
                })
                .collect(),
        }
    }

    fn message(&self, full_name: &str) -> Option<usize> {
        self.by_name.get(full_name).copied()
    }

    /// What `buf`, an encoded `message_type` (fully qualified, e.g.
    /// `agent.v1.AgentClientMessage`), carries that this schema does not know.
    pub fn check(&self, message_type: &str, buf: &[u8]) -> Report {
        let mut report = Report::default();
        if let Some(m) = self.message(message_type) {
            let path = self.messages[m].name.clone();
            self.walk(m, buf, &path, 0, &mut report);
        }
        report
    }

    fn walk(&self, m: usize, buf: &[u8], path: &str, depth: usize, report: &mut Report) {
        let info = &self.messages[m];
        let mut unknown_here = Vec::new();
        let mut oneof_seen = false;
        for field in wire::fields(buf) {
            let field = match field {
                Ok(f) => f,
                Err(e) => {
                    report.error.get_or_insert(e);
                    return;
                }
            };
            let Some(f) = info.fields.get(&field.number) else {
                unknown_here.push(field.number);
                continue;
            };
            oneof_seen |= f.oneof.is_some();
            match (f.kind, field.wire_type) {
                (Kind::Message(inner), WireType::Len) if depth < MAX_DEPTH => {
                    let here = format!("{path}.{}", f.name);
                    self.walk(inner, field.value, &here, depth + 1, report);
                }
                (Kind::Enum(e), WireType::Varint) => {
                    self.check_enum(e, field.value, path, &f.name, report)
                }
                (Kind::Enum(e), WireType::Len) => {
                    // Packed repeated enum: a run of varints.
                    let mut at = 0;
                    while at < field.value.len() {
                        let Ok((_, next)) = wire::read_varint(field.value, at) else {
                            break;
                        };
                        self.check_enum(e, &field.value[at..next], path, &f.name, report);
                        at = next;
                    }
                }
                _ => {}
            }
        }
        // A oneof with no known member set, next to an unknown field: most likely a branch
        // this build does not know.
        let branch = info.oneofs > 0 && !oneof_seen;
        for number in unknown_here {
            report.push(Unknown {
                kind: if branch {
                    UnknownKind::Branch
                } else {
                    UnknownKind::Field
                },
                key: format!("{}.{number}", info.name),
                at: path.to_string(),
            });
        }
    }

    fn check_enum(&self, e: usize, varint: &[u8], path: &str, field: &str, report: &mut Report) {
        let Ok((v, _)) = wire::read_varint(varint, 0) else {
            return;
        };
        // Enums are int32 on the wire (negative values are sign-extended to 64 bits).
        let value = v as i32;
        let info = &self.enums[e];
        if !info.values.contains(&value) {
            report.push(Unknown {
                kind: UnknownKind::EnumValue,
                key: format!("{}={value}", info.name),
                at: format!("{path}.{field}"),
            });
        }
    }

    /// The shape of `buf` as `message_type`: per field its name (or number), wire size and
    /// count, nested messages down to `depth` levels. Values never appear.
    pub fn shape(&self, message_type: &str, buf: &[u8], depth: usize) -> serde_json::Value {
        match self.message(message_type) {
            Some(m) => self.shape_of(Some(m), buf, depth),
            None => self.shape_of(None, buf, 0),
        }
    }

    fn shape_of(&self, m: Option<usize>, buf: &[u8], depth: usize) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let mut out: Vec<(u32, Map<String, Value>)> = Vec::new();
        for field in wire::fields(buf) {
            let Ok(field) = field else {
                out.push((0, Map::from_iter([("error".into(), json!("malformed"))])));
                break;
            };
            let info = m.and_then(|m| self.messages[m].fields.get(&field.number));
            if let Some((_, entry)) = out.iter_mut().find(|(n, _)| *n == field.number) {
                let count = entry.get("count").and_then(Value::as_u64).unwrap_or(1) + 1;
                let bytes = entry.get("bytes").and_then(Value::as_u64).unwrap_or(0);
                entry.insert("count".into(), json!(count));
                entry.insert("bytes".into(), json!(bytes + field.raw.len() as u64));
                continue;
            }
            let mut entry = Map::new();
            entry.insert("n".into(), json!(field.number));
            entry.insert("name".into(), json!(info.map_or("?", |f| f.name.as_str())));
            entry.insert("bytes".into(), json!(field.raw.len()));
            if let (
                Some(FieldInfo {
                    kind: Kind::Message(inner),
                    ..
                }),
                WireType::Len,
                true,
            ) = (info, field.wire_type, depth > 0)
            {
                entry.insert(
                    "fields".into(),
                    self.shape_of(Some(*inner), field.value, depth - 1),
                );
            }
            out.push((field.number, entry));
        }
        Value::Array(out.into_iter().map(|(_, e)| Value::Object(e)).collect())
    }
}

/// Every message of `m`'s tree and every enum in it, by fully qualified name.
/// Fully qualified names (`.package.Message`) to their place in the index, for resolving the
/// type names fields refer to.
struct FullNames<'a> {
    messages: &'a HashMap<String, usize>,
    enums: &'a HashMap<String, usize>,
}

impl FullNames<'_> {
    fn message_info(&self, name: &str, m: &prost_types::DescriptorProto) -> MessageInfo {
        let real_oneof: Vec<bool> = (0..m.oneof_decl.len())
            .map(|i| {
                m.field.iter().any(|f| {
                    f.oneof_index == Some(i32::try_from(i).unwrap_or(-1)) && !f.proto3_optional()
                })
            })
            .collect();
        let fields = m
            .field
            .iter()
            .map(|f| {
                let oneof = f
                    .oneof_index
                    .and_then(|i| usize::try_from(i).ok())
                    .filter(|&i| real_oneof.get(i).copied().unwrap_or(false));
                let number = u32::try_from(f.number()).unwrap_or(0);
                (
                    number,
                    FieldInfo {
                        name: f.name().to_string(),
                        kind: self.kind(f),
                        oneof,
                    },
                )
            })
            .collect();
        MessageInfo {
            name: short(name),
            fields,
            oneofs: real_oneof.iter().filter(|r| **r).count(),
        }
    }

    fn kind(&self, f: &prost_types::FieldDescriptorProto) -> Kind {
        match f.r#type() {
            Type::Message => self
                .messages
                .get(f.type_name())
                .map_or(Kind::Other, |&i| Kind::Message(i)),
            Type::Enum => self
                .enums
                .get(f.type_name())
                .map_or(Kind::Other, |&i| Kind::Enum(i)),
            _ => Kind::Other,
        }
    }
}

fn collect<'a>(
    prefix: &str,
    m: &'a prost_types::DescriptorProto,
    messages: &mut Vec<(String, &'a prost_types::DescriptorProto)>,
    enums: &mut Vec<(String, &'a prost_types::EnumDescriptorProto)>,
) {
    let name = format!("{prefix}.{}", m.name());
    for e in &m.enum_type {
        enums.push((format!("{name}.{}", e.name()), e));
    }
    for nested in &m.nested_type {
        collect(&name, nested, messages, enums);
    }
    messages.push((name, m));
}

/// How something unknown showed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnknownKind {
    /// A field number the message does not have.
    Field,
    /// A field number where the message's oneof has no known member: a new branch.
    Branch,
    /// A value the enum does not have.
    EnumValue,
}

impl UnknownKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownKind::Field => "field",
            UnknownKind::Branch => "oneof branch",
            UnknownKind::EnumValue => "enum value",
        }
    }
}

/// One thing this build does not know.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Unknown {
    pub kind: UnknownKind,
    /// `ExecClientMessage.58`, `ConversationAction.20`, `AgentMode=99`.
    pub key: String,
    /// Where it was found, by field names from the checked message:
    /// `AgentClientMessage.run_request.action`.
    pub at: String,
}

/// What one check found.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// The first [`MAX_REPORTED`] unknowns, each kind once.
    pub unknown: Vec<Unknown>,
    /// All unknowns seen, repeats included.
    pub total: usize,
    /// The message did not scan to its end (it did decode, so this is unusual).
    pub error: Option<wire::WireError>,
}

impl Report {
    fn push(&mut self, u: Unknown) {
        self.total += 1;
        if self.unknown.len() < MAX_REPORTED && !self.unknown.contains(&u) {
            self.unknown.push(u);
        }
    }

    /// An unknown branch at `at`, if any: what a run cannot act on.
    pub fn branch_at(&self, at: &str) -> Option<&Unknown> {
        self.unknown
            .iter()
            .find(|u| u.kind == UnknownKind::Branch && u.at == at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::agent::v1 as pb;

    fn field(number: u32, wire: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        prost::encoding::encode_varint(u64::from(number) << 3 | u64::from(wire), &mut v);
        if wire == 2 {
            prost::encoding::encode_varint(payload.len() as u64, &mut v);
        }
        v.extend_from_slice(payload);
        v
    }

    fn client(message: pb::agent_client_message::Message) -> Vec<u8> {
        pb::AgentClientMessage {
            message: Some(message),
        }
        .encode_to_vec()
    }

    #[test]
    fn known_messages_report_nothing() {
        let buf = client(pb::agent_client_message::Message::RunRequest(
            pb::AgentRunRequest {
                conversation_state: Some(pb::ConversationStateStructure {
                    mode: Some(pb::AgentMode::Plan as i32),
                    ..Default::default()
                }),
                conversation_id: Some("c".into()),
                ..Default::default()
            },
        ));
        let r = schema().check("agent.v1.AgentClientMessage", &buf);
        assert_eq!(r, Report::default());
    }

    #[test]
    fn finds_unknown_fields_branches_and_enum_values() {
        // An exec result with an unknown branch 58, a run request with an unknown field 200,
        // an unknown mode and an unknown conversation action 20.
        let exec = [field(1, 0, &[7]), field(58, 2, b"new result")].concat();
        let r = schema().check("agent.v1.AgentClientMessage", &field(2, 2, &exec));
        assert_eq!(
            r.unknown,
            [Unknown {
                kind: UnknownKind::Branch,
                key: "ExecClientMessage.58".into(),
                at: "AgentClientMessage.exec_client_message".into(),
            }]
        );
        assert!(r
            .branch_at("AgentClientMessage.exec_client_message")
            .is_some());

        let state = field(10, 0, &[99]);
        let action = field(20, 2, b"");
        let run = [
            field(1, 2, &state),
            field(2, 2, &action),
            field(200, 2, b"x"),
        ]
        .concat();
        let r = schema().check("agent.v1.AgentClientMessage", &field(1, 2, &run));
        let keys: Vec<(&str, &str, &str)> = r
            .unknown
            .iter()
            .map(|u| (u.kind.as_str(), u.key.as_str(), u.at.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                (
                    "enum value",
                    "AgentMode=99",
                    "AgentClientMessage.run_request.conversation_state.mode"
                ),
                (
                    "oneof branch",
                    "ConversationAction.20",
                    "AgentClientMessage.run_request.action"
                ),
                (
                    "field",
                    "AgentRunRequest.200",
                    "AgentClientMessage.run_request"
                ),
            ]
        );
        // A new top-level client message.
        let r = schema().check("agent.v1.AgentClientMessage", &field(9, 2, b""));
        assert_eq!(r.unknown[0].key, "AgentClientMessage.9");
        assert_eq!(r.unknown[0].kind, UnknownKind::Branch);
    }

    #[test]
    fn malformed_input_is_reported_not_a_panic() {
        for cut in 0..20 {
            let buf = client(pb::agent_client_message::Message::ClientHeartbeat(
                pb::ClientHeartbeat::default(),
            ));
            let mut b = [buf, field(1, 2, b"0123456789")].concat();
            b.truncate(cut);
            let _ = schema().check("agent.v1.AgentClientMessage", &b);
            let _ = schema().shape("agent.v1.AgentClientMessage", &b, 3);
        }
        let r = schema().check("agent.v1.AgentClientMessage", &[0x0a, 0x05]);
        assert!(r.error.is_some());
    }

    #[test]
    fn shape_names_fields_and_sizes_only() {
        let buf = client(pb::agent_client_message::Message::RunRequest(
            pb::AgentRunRequest {
                conversation_id: Some("secret-conversation".into()),
                ..Default::default()
            },
        ));
        let shape = schema().shape("agent.v1.AgentClientMessage", &buf, 3);
        let text = shape.to_string();
        assert!(
            text.contains("run_request") && text.contains("conversation_id"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }
}
