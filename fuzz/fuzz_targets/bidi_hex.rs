//! BidiAppend bodies: the request, its hex (or binary) payload and the AgentClientMessage in
//! it. Also the hex decoder on its own, checked against the `hex` crate's answer.
#![no_main]

use cursor_byok::connect::{
    bidi_append_payload, decode_agent_client_message, decode_bidi_append_request, decode_hex,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode_bidi_append_request(data) {
        let _ = bidi_append_payload(&req);
        let _ = decode_agent_client_message(&req);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let ours = decode_hex(s).ok();
        let reference = hex_reference(s);
        assert_eq!(ours, reference, "hex of {s:?}");
    }
});

fn hex_reference(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 == 1 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some((digit(p[0])? << 4) | digit(p[1])?))
        .collect()
}
