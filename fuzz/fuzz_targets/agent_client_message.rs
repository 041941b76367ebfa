//! Protobuf decoding of `AgentClientMessage` (what Run frames and appends carry), then the
//! proxy's own reading of it (model id, routing fields) and a re-encode that must decode again.
#![no_main]

use cursor_byok::proto::agent::v1 as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = pb::AgentClientMessage::decode(data) else {
        return;
    };
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &msg.message {
        let _ = cursor_byok::agent::model::requested_model_id(r);
    }
    let again = msg.encode_to_vec();
    pb::AgentClientMessage::decode(again.as_slice()).expect("what we encode decodes");
});
