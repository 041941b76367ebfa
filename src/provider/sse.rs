//! Sans-IO Server-Sent Events parser (WHATWG HTML "event stream interpretation").
//!
//! Fed arbitrary byte chunks, it yields complete events. Handles `\n`, `\r\n` and `\r` line
//! endings (including a `\r\n` split across chunks), a leading BOM, comments, multi-line `data:`
//! (joined with `\n`), `id`, `retry`, UTF-8 split across chunks, and — unlike the spec, like the
//! official SDKs — a final event without a trailing blank line, flushed by [`SseParser::finish`].

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field; `"message"` when absent.
    pub event: String,
    pub data: String,
    /// Last event id seen so far (persists across events, per spec).
    pub id: Option<String>,
    /// `retry:` value in milliseconds, when this event carried one.
    pub retry: Option<u64>,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

#[derive(Debug)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Bytes of `buf` already scanned for a line end (avoids rescanning on every chunk).
    scanned: usize,
    /// The previous chunk ended in `\r`; a leading `\n` in the next chunk belongs to it.
    skip_lf: bool,
    /// Still at the start of the stream (a BOM may follow).
    at_start: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    retry: Option<u64>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    pub fn new() -> Self {
        SseParser {
            buf: Vec::new(),
            scanned: 0,
            skip_lf: false,
            at_start: true,
            event: None,
            data: String::new(),
            has_data: false,
            last_id: None,
            retry: None,
        }
    }

    /// Bytes held waiting for a line end plus the pending event's data; the HTTP layer caps it.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.buf.len() + self.data.len()
    }

    /// Feed a chunk; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let mut chunk = chunk;
        if self.skip_lf && !chunk.is_empty() {
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
            self.skip_lf = false;
        }
        self.buf.extend_from_slice(chunk);
        if self.at_start {
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                return out; // might still become a BOM
            }
            if self.buf.starts_with(BOM) {
                self.buf.drain(..BOM.len());
            }
            self.at_start = false;
        }
        let mut start = 0;
        let mut i = self.scanned;
        while i < self.buf.len() {
            match self.buf[i] {
                b'\n' => {
                    self.line(start, i, &mut out);
                    start = i + 1;
                }
                b'\r' => {
                    self.line(start, i, &mut out);
                    if i + 1 < self.buf.len() {
                        if self.buf[i + 1] == b'\n' {
                            i += 1;
                        }
                    } else {
                        self.skip_lf = true;
                    }
                    start = i + 1;
                }
                _ => {}
            }
            i += 1;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        out
    }

    /// End of stream: process a last unterminated line and dispatch a pending event.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.at_start && self.buf.starts_with(BOM) {
            self.buf.drain(..BOM.len());
        }
        self.at_start = false;
        if !self.buf.is_empty() {
            let end = self.buf.len();
            self.line(0, end, &mut out);
            self.buf.clear();
        }
        self.scanned = 0;
        self.dispatch(&mut out);
        out
    }

    fn line(&mut self, start: usize, end: usize, out: &mut Vec<SseEvent>) {
        if start == end {
            self.dispatch(out);
            return;
        }
        // A complete line never splits a UTF-8 sequence; invalid bytes become U+FFFD.
        let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
        if line.starts_with(':') {
            return; // comment
        }
        let (field, value) = match line.find(':') {
            Some(pos) => {
                let v = &line[pos + 1..];
                (&line[..pos], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.last_id = Some(value.to_string()),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        let retry = self.retry.take();
        if !self.has_data {
            return; // per spec: no data, no event
        }
        self.has_data = false;
        out.push(SseEvent {
            event: event
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "message".into()),
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
            retry,
        });
    }
}

/// Parse a whole body in one go.
#[cfg(test)]
fn parse_all(body: &[u8]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut out = p.feed(body);
    out.extend(p.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: None,
            retry: None,
        }
    }

    fn parse_split(body: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        let mut last = 0;
        for &c in cuts {
            out.extend(p.feed(&body[last..c]));
            last = c;
        }
        out.extend(p.feed(&body[last..]));
        out.extend(p.finish());
        out
    }

    const SAMPLE: &str = "\u{FEFF}: comment\r\nevent: a\r\ndata: {\"x\":\r\ndata:  1}\r\n\r\n\
        data: caf\u{e9} \u{1F600}\r\rid: 7\nretry: 100\ndata\ndata:\n\nevent: last\ndata: end";

    fn sample_expected() -> Vec<SseEvent> {
        vec![
            ev("a", "{\"x\":\n 1}"),
            ev("message", "caf\u{e9} \u{1F600}"),
            SseEvent {
                event: "message".into(),
                data: "\n".into(),
                id: Some("7".into()),
                retry: Some(100),
            },
            SseEvent {
                event: "last".into(),
                data: "end".into(),
                id: Some("7".into()),
                retry: None,
            },
        ]
    }

    #[test]
    fn whole_body() {
        assert_eq!(parse_all(SAMPLE.as_bytes()), sample_expected());
    }

    #[test]
    fn every_single_split_point() {
        let body = SAMPLE.as_bytes();
        for cut in 0..=body.len() {
            assert_eq!(parse_split(body, &[cut]), sample_expected(), "cut at {cut}");
        }
    }

    #[test]
    fn byte_by_byte() {
        let body = SAMPLE.as_bytes();
        let cuts: Vec<usize> = (1..body.len()).collect();
        assert_eq!(parse_split(body, &cuts), sample_expected());
    }

    #[test]
    fn crlf_split_between_cr_and_lf_is_one_line_end() {
        let mut p = SseParser::new();
        let mut out = p.feed(b"data: a\r");
        out.extend(p.feed(b"\n\r"));
        out.extend(p.feed(b"\ndata: b\n\n"));
        assert_eq!(out, vec![ev("message", "a"), ev("message", "b")]);
    }

    #[test]
    fn bom_only_at_start_and_split() {
        let mut p = SseParser::new();
        let mut out = p.feed(b"\xEF");
        out.extend(p.feed(b"\xBB"));
        out.extend(p.feed(b"\xBFdata: x\n\n"));
        assert_eq!(out, vec![ev("message", "x")]);
        // A BOM later is just data.
        let out = parse_all(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n");
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn no_data_means_no_event_and_event_type_resets() {
        let out = parse_all(b"event: ping\n\ndata: x\n\n");
        assert_eq!(out, vec![ev("message", "x")]);
    }

    #[test]
    fn final_event_without_blank_line_is_flushed() {
        assert_eq!(parse_all(b"data: x"), vec![ev("message", "x")]);
        assert_eq!(parse_all(b"data: x\n"), vec![ev("message", "x")]);
        assert_eq!(parse_all(b"data: x\r"), vec![ev("message", "x")]);
        assert!(parse_all(b"").is_empty());
        assert!(parse_all(b": just a comment").is_empty());
    }

    #[test]
    fn field_without_space_and_unknown_fields() {
        let out = parse_all(b"data:x\nfoo: bar\ndata:  y\n\n");
        assert_eq!(out, vec![ev("message", "x\n y")]);
    }

    #[test]
    fn invalid_utf8_is_replaced_not_panicking() {
        let out = parse_all(b"data: \xFF\xFE\n\n");
        assert_eq!(out[0].data, "\u{FFFD}\u{FFFD}");
    }

    proptest! {
        #[test]
        fn random_splits_give_the_same_events(mut cuts in proptest::collection::vec(0usize..200, 0..20)) {
            let body = SAMPLE.as_bytes();
            for c in cuts.iter_mut() { *c %= body.len() + 1; }
            cuts.sort_unstable();
            prop_assert_eq!(parse_split(body, &cuts), sample_expected());
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..300) {
            let cut = cut.min(body.len());
            let a = parse_split(&body, &[cut]);
            let b = parse_all(&body);
            prop_assert_eq!(a, b);
        }
    }
}
