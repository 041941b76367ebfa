//! Our replay data, carried inside Cursor's own blobs.
//!
//! Cursor's `ConversationStep` records what the UI shows; replaying a turn to a model needs more
//! (the provider's call id, the exact arguments and result text, thinking signatures…). We keep
//! it in the same blob as one extra length-delimited field, number [`REPLAY_FIELD`], that the
//! schema does not use: protobuf decoders skip unknown fields, so Cursor's clients and servers
//! still read a valid `ConversationStep`, and since the client stores blob bytes opaquely the
//! field survives a proxy restart. The payload is JSON (versioned by serde tags), so it can grow
//! without a schema of its own.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::provider::ProviderExtra;

/// Field number of our extension. Far above anything `agent.v1` uses (< 100) and below the
/// reserved 19000–19999 range.
pub(crate) const REPLAY_FIELD: u32 = 4242;

/// Protobuf wire type of length-delimited fields.
const WIRE_LEN: u64 = 2;

/// What a `ConversationStep` blob carries for the model, beyond what Cursor's UI needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum StepReplay {
    /// Assistant text: the text itself is in the step; this only marks the step as ours.
    Text {},
    /// A user-side message that joined the turn between model calls (steering).
    UserContext { text: String },
    Thinking {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        extra: Option<ProviderExtra>,
    },
    /// The exact model-facing record of one tool call.
    ToolCall {
        call_id: String,
        name: String,
        arguments: Value,
        result: String,
        is_error: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        extra: Option<ProviderExtra>,
    },
}

/// What a `ConversationSummary` blob we wrote carries: which turns the summary replaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SummaryReplay {
    /// Hex id of the last turn the summary covers (it and every earlier turn are replaced).
    pub(crate) through_turn: String,
}

/// Append `payload` to an encoded message as field `field` (length-delimited).
pub(crate) fn append_field(buf: &mut Vec<u8>, field: u32, payload: &[u8]) {
    put_varint(buf, (u64::from(field) << 3) | WIRE_LEN);
    put_varint(buf, payload.len() as u64);
    buf.extend_from_slice(payload);
}

/// Append a JSON-encoded value as our replay field.
pub(crate) fn append_json(buf: &mut Vec<u8>, value: &impl Serialize) {
    // Serialising our own plain data types cannot fail; if it ever did, the blob is simply
    // written without replay data and the fallback path is used on the next turn.
    if let Ok(json) = serde_json::to_vec(value) {
        append_field(buf, REPLAY_FIELD, &json);
    }
}

/// Read our replay field back; `None` when absent, malformed or not our JSON.
pub(crate) fn extract_json<T: for<'de> Deserialize<'de>>(data: &[u8]) -> Option<T> {
    serde_json::from_slice(find_field(data, REPLAY_FIELD)?).ok()
}

/// The payload of the last top-level length-delimited field `field` of an encoded message
/// (protobuf semantics: the last occurrence wins). Any malformation — truncated varints or
/// lengths, groups, reserved wire types — yields `None`; this never panics on any input.
pub(crate) fn find_field(data: &[u8], field: u32) -> Option<&[u8]> {
    let mut rest = data;
    let mut found = None;
    while !rest.is_empty() {
        let key = take_varint(&mut rest)?;
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return None;
        }
        match key & 7 {
            0 => {
                take_varint(&mut rest)?;
            }
            1 => rest = rest.get(8..)?,
            2 => {
                let len = usize::try_from(take_varint(&mut rest)?).ok()?;
                let payload = rest.get(..len)?;
                if number == u64::from(field) {
                    found = Some(payload);
                }
                rest = rest.get(len..)?;
            }
            5 => rest = rest.get(4..)?,
            // 3/4 are (deprecated) groups, which nothing here uses; 6/7 do not exist.
            _ => return None,
        }
    }
    found
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Read one varint (at most 10 bytes) from the front of `rest`.
fn take_varint(rest: &mut &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let (&b, tail) = rest.split_first()?;
        *rest = tail;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_the_field_among_others() {
        // field 1 varint 150, field 2 "ab", field 5 fixed32, field 3 fixed64
        let mut buf = vec![
            0x08, 0x96, 0x01, 0x12, 0x02, b'a', b'b', 0x2d, 1, 2, 3, 4, 0x19,
        ];
        buf.extend_from_slice(&[0; 8]);
        append_field(&mut buf, REPLAY_FIELD, b"first");
        append_field(&mut buf, REPLAY_FIELD, b"second");
        assert_eq!(find_field(&buf, REPLAY_FIELD), Some(&b"second"[..]));
        assert_eq!(find_field(&buf, 2), Some(&b"ab"[..]));
        assert_eq!(find_field(&buf, 7), None);
    }

    #[test]
    fn malformed_input_is_no_data() {
        let mut buf = Vec::new();
        append_field(&mut buf, REPLAY_FIELD, b"payload");
        for cut in 0..buf.len() {
            assert_eq!(find_field(&buf[..cut], REPLAY_FIELD), None, "cut at {cut}");
        }
        assert_eq!(find_field(&[0x00], 1), None); // field 0
        assert_eq!(find_field(&[0x0b], 1), None); // group
        assert_eq!(find_field(&[0xff; 11], 1), None); // overlong varint
        assert_eq!(extract_json::<StepReplay>(b"\x92\x89\x02\x03abc"), None);
    }

    proptest! {
        #[test]
        fn scanner_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256), field in 0u32..5000) {
            let _ = find_field(&data, field);
            let _ = extract_json::<StepReplay>(&data);
        }

        #[test]
        fn appended_field_is_found_after_any_valid_prefix(prefix in proptest::collection::vec(any::<u8>(), 0..64), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            // A valid message: `prefix` as field 1 bytes.
            let mut buf = Vec::new();
            append_field(&mut buf, 1, &prefix);
            append_field(&mut buf, REPLAY_FIELD, &payload);
            prop_assert_eq!(find_field(&buf, REPLAY_FIELD), Some(&payload[..]));
        }
    }
}
