//! Connect streaming envelopes: any bytes, fed in arbitrary chunks, for both stream kinds and
//! both encodings, must decode or fail cleanly, within the limits.
#![no_main]

use bytes::Bytes;
use cursor_byok::connect::{Encoding, Frame, FrameDecoder, Limits, StreamKind};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_frame_bytes: 1 << 20,
    max_decompressed_bytes: 4 << 20,
};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let kind = if ctl & 1 == 0 {
        StreamKind::Request
    } else {
        StreamKind::Response
    };
    let encoding = if ctl & 2 == 0 {
        Encoding::Identity
    } else {
        Encoding::Gzip
    };
    let chunk = usize::from(ctl >> 2) + 1;
    let mut decoder = FrameDecoder::new(kind, encoding, LIMITS);
    let mut total = 0usize;
    for piece in rest.chunks(chunk) {
        decoder.feed(Bytes::copy_from_slice(piece));
        loop {
            match decoder.next_frame() {
                Ok(Some(Frame::Message(m))) => {
                    assert!(m.len() <= LIMITS.max_decompressed_bytes);
                    total += m.len();
                }
                Ok(Some(Frame::End(_))) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    let _ = decoder.finish();
    let _ = total;
});
