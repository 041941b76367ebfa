//! Protobuf decoding of `AgentClientMessage` (what Run frames and appends carry), then the
//! proxy's own reading of it (model id, routing fields) and a re-encode that must decode again.
//! First, decodable or not, the wire-level readers: the schema check, the shape for captures and
//! the field splicer (which must reproduce its input when it drops nothing).
#![no_main]

use cursor_byok::proto::agent::v1 as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let schema = cursor_byok::proto::inspect::schema();
    let _ = schema.check("agent.v1.AgentClientMessage", data);
    let _ = schema.shape("agent.v1.AgentClientMessage", data, 4);
    if let Ok(same) = cursor_byok::proto::wire::splice(data, |_| false, &[]) {
        assert_eq!(same, data, "a splice that drops nothing is the identity");
    }
    let Ok(msg) = pb::AgentClientMessage::decode(data) else {
        return;
    };
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &msg.message {
        let _ = cursor_byok::agent::model::requested_model_id(r);
    }
    let again = msg.encode_to_vec();
    pb::AgentClientMessage::decode(again.as_slice()).expect("what we encode decodes");
});
