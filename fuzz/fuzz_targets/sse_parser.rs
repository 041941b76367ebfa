//! The provider SSE parser: any bytes, in any chunking, parse the same as in one piece and
//! never panic; the provider stream decoders (every kind) on top of it never panic either.
#![no_main]

use cursor_byok::provider::sse::SseParser;
use cursor_byok::provider::{ProviderKind, StreamDecoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, body)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(ctl) + 1;
    let mut whole = SseParser::new();
    let mut expected = whole.feed(body);
    expected.extend(whole.finish());
    let mut pieces = SseParser::new();
    let mut got = Vec::new();
    for piece in body.chunks(chunk) {
        got.extend(pieces.feed(piece));
    }
    got.extend(pieces.finish());
    assert_eq!(
        format!("{expected:?}"),
        format!("{got:?}"),
        "chunking changed the events"
    );

    for kind in [
        ProviderKind::OpenAiChat,
        ProviderKind::Anthropic,
        ProviderKind::OpenAiResponses,
        ProviderKind::Gemini,
    ] {
        let mut d = StreamDecoder::new(kind, "fuzz", "fuzz");
        for piece in body.chunks(chunk) {
            let _ = d.feed(piece);
        }
        let _ = d.finish();
    }
});
