//! The HTTP/2 relay's sans-IO parts: frames split the same in any chunking, header blocks
//! never panic the decoder and survive our encoders unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cursor_byok::relay::fuzz_frames_and_headers(data);
});
