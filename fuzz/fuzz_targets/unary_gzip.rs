//! Unary bodies, identity or gzip: never more than the decompressed limit, never a panic.
#![no_main]

use bytes::Bytes;
use cursor_byok::connect::{decode_unary, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_frame_bytes: 1 << 20,
    max_decompressed_bytes: 4 << 20,
};

fuzz_target!(|data: &[u8]| {
    let body = Bytes::copy_from_slice(data);
    for encoding in [None, Some("gzip"), Some("identity"), Some("br")] {
        if let Ok(out) = decode_unary(body.clone(), encoding, LIMITS) {
            assert!(out.len() <= LIMITS.max_decompressed_bytes);
        }
    }
});
