//! When Cursor updates: what a newer Cursor adds to the messages it sends must survive a BYOK
//! turn byte for byte (the checkpoint, the user message blob), and must not go unnoticed.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::fake_cursor::FakeCursor;
use common::fake_provider::{FakeProvider, Reply};
use cursor_byok::agent::{Agent, RunHandle, RunOutput, RunRequest};
use cursor_byok::config::Config;
use cursor_byok::connect::EndStream;
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proto::wire;
use cursor_byok::proto::DESCRIPTOR_SET;
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, Kind, MapKey, Value};

const TEXT_SSE: &str = concat!(
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n",
    "data: [DONE]\n\n",
);

/// `ConversationStateStructure` fields a BYOK turn writes (todos, token_details, summary,
/// turns, mode); everything else is Cursor's.
const OWNED: [u32; 5] = [3, 5, 6, 8, 10];

fn config(base_url: &str) -> Arc<Config> {
    let dir = tempfile::tempdir().unwrap().keep();
    let text = format!(
        "data_dir = \"{}\"\n[agent]\nheartbeat_secs = 5\nkv_timeout_secs = 5\nprovider_max_retries = 0\n\
         [providers.fake]\nkind = \"openai-chat\"\nbase_url = \"{base_url}\"\napi_key = \"sk-test-schema-drift\"\n\
         [[models]]\nid = \"fake-model\"\ndisplay_name = \"Fake Model\"\nprovider = \"fake\"\nmodel = \"gpt-fake\"\n",
        dir.display()
    );
    Arc::new(Config::from_toml(&text, "test").unwrap())
}

fn key(number: u32, wire_type: prost::encoding::WireType, out: &mut Vec<u8>) {
    prost::encoding::encode_key(number, wire_type, out);
}

/// A length-delimited field `number` holding `data`.
fn len_field(number: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    key(number, prost::encoding::WireType::LengthDelimited, &mut v);
    prost::encoding::encode_varint(data.len() as u64, &mut v);
    v.extend_from_slice(data);
    v
}

fn varint_field(number: u32, value: u64) -> Vec<u8> {
    let mut v = Vec::new();
    key(number, prost::encoding::WireType::Varint, &mut v);
    prost::encoding::encode_varint(value, &mut v);
    v
}

/// A non-default value for every kind of field, so each one is on the wire.
fn sample_value(kind: &Kind) -> Value {
    match kind {
        Kind::Double => Value::F64(1.5),
        Kind::Float => Value::F32(2.5),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(-3),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(-4),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(5),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(6),
        Kind::Bool => Value::Bool(true),
        Kind::String => Value::String("kept".into()),
        Kind::Bytes => Value::Bytes(Bytes::from_static(b"kept-bytes")),
        Kind::Message(m) => Value::Message(DynamicMessage::new(m.clone())),
        Kind::Enum(e) => Value::EnumNumber(e.values().last().map_or(0, |v| v.number())),
    }
}

/// A previous checkpoint with every known field the proxy does not own set, an unknown mode
/// (99), and two fields this build does not know: 200 (bytes) and 201 (a nested message).
fn foreign_checkpoint() -> Vec<u8> {
    let pool = DescriptorPool::decode(DESCRIPTOR_SET).unwrap();
    let desc = pool
        .get_message_by_name("agent.v1.ConversationStateStructure")
        .unwrap();
    let mut state = DynamicMessage::new(desc.clone());
    for field in desc.fields() {
        if OWNED.contains(&field.number()) {
            continue;
        }
        let value = if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                unreachable!()
            };
            let k = match sample_value(&entry.map_entry_key_field().kind()) {
                Value::String(s) => MapKey::String(s),
                other => panic!("map key {other:?}"),
            };
            let v = sample_value(&entry.map_entry_value_field().kind());
            Value::Map([(k, v)].into())
        } else if field.is_list() {
            Value::List(vec![sample_value(&field.kind())])
        } else {
            sample_value(&field.kind())
        };
        state.set_field(&field, value);
    }
    let mut bytes = state.encode_to_vec();
    bytes.extend(varint_field(10, 99));
    bytes.extend(len_field(200, b"\x00opaque\xff"));
    bytes.extend(len_field(
        201,
        &[len_field(1, b"nested"), varint_field(2, 7)].concat(),
    ));
    bytes
}

/// The raw occurrences of each top-level field.
fn raw_fields(buf: &[u8]) -> BTreeMap<u32, Vec<Vec<u8>>> {
    let mut map = BTreeMap::<u32, Vec<Vec<u8>>>::new();
    for f in wire::fields(buf) {
        let f = f.unwrap();
        map.entry(f.number).or_default().push(f.raw.to_vec());
    }
    map
}

/// A run request whose conversation state is `state` (raw bytes), with the user message
/// carrying an unknown field 300.
fn request_over(state: &[u8]) -> RunRequest {
    let user = pb::UserMessage {
        text: "continue".into(),
        message_id: "m2".into(),
        ..Default::default()
    };
    let user_wire = [user.encode_to_vec(), len_field(300, b"new user field")].concat();
    let context = pb::RequestContext {
        env: Some(pb::RequestContextEnv {
            workspace_paths: vec!["/tmp/ws".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let action = [
        len_field(1, &user_wire),
        len_field(2, &context.encode_to_vec()),
    ]
    .concat();
    let model = pb::RequestedModel {
        model_id: "byok-fake-model".into(),
        ..Default::default()
    };
    let request = [
        len_field(1, state),
        len_field(2, &len_field(1, &action)),
        len_field(9, &model.encode_to_vec()),
    ]
    .concat();
    let message = Bytes::from(len_field(1, &request));
    let decoded = pb::AgentClientMessage::decode(message.clone()).unwrap();
    let Some(pb::agent_client_message::Message::RunRequest(r)) = decoded.message else {
        panic!("a run request")
    };
    RunRequest::from_client_message(r, &message)
}

/// Plays the client to the end; returns the messages, the exact bytes of encoded outputs, and
/// the end.
async fn drive(
    handle: &mut RunHandle,
    client: &mut FakeCursor,
) -> (Vec<pb::AgentServerMessage>, Vec<Bytes>, EndStream) {
    let (mut messages, mut encoded) = (Vec::new(), Vec::new());
    loop {
        let out = tokio::time::timeout(Duration::from_secs(20), handle.output.recv())
            .await
            .expect("the run must not hang")
            .expect("the run must end with an End");
        if let RunOutput::Encoded(_, bytes) = &out {
            encoded.push(bytes.clone());
        }
        let Some(m) = out.message().cloned() else {
            let RunOutput::End(end) = out else {
                unreachable!()
            };
            return (messages, encoded, end);
        };
        for answer in client.respond(&m) {
            let _ = handle.input.send(Box::new(answer)).await;
        }
        messages.push(m);
    }
}

#[tokio::test]
async fn a_byok_turn_keeps_every_field_it_does_not_own_byte_for_byte() {
    let provider = FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
    let agent = Agent::new(config(&provider.base_url())).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let prev = foreign_checkpoint();
    let mut run = agent.start_run(request_over(&prev), "req-drift-1".into());
    let (messages, encoded, end) = drive(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);

    // The checkpoint went out as exact bytes: AgentServerMessage.conversation_checkpoint_update.
    let [checkpoint] = encoded.as_slice() else {
        panic!("one encoded checkpoint, got {}", encoded.len())
    };
    let state = wire::message_field(checkpoint, 3).unwrap().unwrap();
    let (before, after) = (raw_fields(&prev), raw_fields(&state));
    for (number, raw) in &before {
        if OWNED.contains(number) && *number != 10 {
            continue;
        }
        assert_eq!(after.get(number), Some(raw), "field {number} changed");
    }
    assert!(before.len() > 25, "only {} fields set", before.len());
    // Ours changed as they should: one new turn, fresh token figures.
    let decoded = pb::ConversationStateStructure::decode(state.clone()).unwrap();
    assert_eq!(decoded.turns.len(), 1);
    assert_eq!(decoded.mode, Some(99));
    assert!(decoded.token_details.is_some());
    // What the client saw decoded is the same checkpoint.
    assert_eq!(client.checkpoint.as_ref(), Some(&decoded));

    // The user message blob is Cursor's bytes, unknown field 300 included.
    let user_blob = client
        .blobs
        .values()
        .find(|b| b.windows(14).any(|w| w == b"new user field"))
        .expect("the user message blob keeps Cursor's field 300");
    assert_eq!(
        pb::UserMessage::decode(user_blob.clone()).unwrap().text,
        "continue"
    );

    // turn_ended carries the turn's end time.
    let ended = messages
        .iter()
        .find_map(|m| match &m.message {
            Some(pb::agent_server_message::Message::InteractionUpdate(u)) => match &u.message {
                Some(pb::interaction_update::Message::TurnEnded(t)) => Some(*t),
                _ => None,
            },
            _ => None,
        })
        .expect("turn_ended");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let at = ended.ended_at_ms.expect("ended_at_ms");
    assert!(at <= now && now - at < 60_000, "{at} vs {now}");
}
