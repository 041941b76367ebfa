//! Header blocks (RFC 7541), sans-IO: every block is decoded (routing needs `:path`, and a
//! side's table must be followed to re-encode later), and forwarded as received while both
//! ends' tables stay in step, or re-encoded.

use std::collections::VecDeque;

use super::frame::{ConnError, Reason};

/// The dynamic table size every HTTP/2 peer starts with; we never advertise another.
pub(crate) const TABLE_SIZE: usize = 4096;
/// A decoded header list larger than this (names + values + 32 per field, RFC 9113 §6.5.2)
/// ends the connection: nothing legitimate in Cursor's traffic comes near it.
pub(crate) const MAX_LIST_SIZE: usize = 256 * 1024;

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// A decoded header list, in one buffer.
#[derive(Debug, Default, Clone)]
pub(crate) struct Headers {
    buf: Vec<u8>,
    /// (name start, value start, value end) in `buf`.
    fields: Vec<(u32, u32, u32)>,
    /// Indexes into `fields` of those sent "never indexed" (RFC 7541 §6.2.3): they stay so
    /// toward the other side and never enter a table of ours.
    never: Vec<u32>,
}

impl Headers {
    pub(crate) fn push(&mut self, name: &[u8], value: &[u8]) {
        let start = self.buf.len() as u32;
        self.buf.extend_from_slice(name);
        let mid = self.buf.len() as u32;
        self.buf.extend_from_slice(value);
        self.fields.push((start, mid, self.buf.len() as u32));
    }

    /// A field that must stay "never indexed".
    #[cfg(test)]
    pub(crate) fn push_never(&mut self, name: &[u8], value: &[u8]) {
        self.never.push(self.fields.len() as u32);
        self.push(name, value);
    }

    /// Fields with whether each is "never indexed".
    pub(crate) fn iter_flagged(&self) -> impl Iterator<Item = (&[u8], &[u8], bool)> + '_ {
        self.iter()
            .enumerate()
            .map(|(i, (n, v))| (n, v, self.never.contains(&(i as u32))))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.fields.iter().map(|&(a, b, c)| {
            (
                &self.buf[a as usize..b as usize],
                &self.buf[b as usize..c as usize],
            )
        })
    }

    pub(crate) fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    fn list_size(&self) -> usize {
        self.buf.len() + 32 * self.fields.len()
    }
}

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The dynamic table: newest entry first (index 62).
#[derive(Default)]
pub(crate) struct Table {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
}

impl Table {
    fn new(max: usize) -> Self {
        Table {
            max,
            ..Table::default()
        }
    }

    fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        match index {
            0 => None,
            1..=61 => STATIC
                .get(index - 1)
                .map(|(n, v)| (n.as_bytes(), v.as_bytes())),
            _ => self.entries.get(index - 62).map(|(n, v)| (&n[..], &v[..])),
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            // Larger than the table: it empties it (RFC 7541 §4.4).
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.size += size;
        self.entries.push_front((name.into(), value.into()));
        self.evict();
    }

    fn resize(&mut self, max: usize) {
        self.max = max;
        self.evict();
    }

    fn evict(&mut self) {
        while self.size > self.max {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => self.size = 0,
            }
        }
    }

    /// (index of a full match, index of a name match).
    fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let mut by_name = None;
        let statics = STATIC
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .enumerate()
            .map(|(i, e)| (i + 1, e));
        let dynamics = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, (n, v))| (i + 62, (&n[..], &v[..])));
        for (index, (n, v)) in statics.chain(dynamics) {
            if n == name {
                if v == value {
                    return (Some(index), by_name);
                }
                by_name.get_or_insert(index);
            }
        }
        (None, by_name)
    }
}

/// Reads HPACK primitives off a block.
struct Cursor<'a> {
    block: &'a [u8],
    pos: usize,
}

fn bad(what: &str) -> ConnError {
    ConnError::new(Reason::COMPRESSION_ERROR, format!("header block: {what}"))
}

impl Cursor<'_> {
    /// An integer with an `prefix`-bit prefix (RFC 7541 §5.1).
    fn int(&mut self, prefix: u8) -> Result<usize, ConnError> {
        let mask = (1usize << prefix) - 1;
        let first = *self.block.get(self.pos).ok_or_else(|| bad("cut short"))?;
        self.pos += 1;
        let mut value = first as usize & mask;
        if value < mask {
            return Ok(value);
        }
        let mut shift = 0;
        loop {
            let byte = *self.block.get(self.pos).ok_or_else(|| bad("cut short"))?;
            self.pos += 1;
            // Four continuation bytes reach 2^28: more than any length or index here.
            if shift > 21 {
                return Err(bad("integer too large"));
            }
            value += ((byte & 0x7f) as usize) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
    }

    /// A string literal (RFC 7541 §5.2), appended to `out`.
    fn string(&mut self, out: &mut Vec<u8>) -> Result<(), ConnError> {
        let huffman = self.block.get(self.pos).is_some_and(|b| b & 0x80 != 0);
        let len = self.int(7)?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|end| *end <= self.block.len())
            .ok_or_else(|| bad("string longer than the block"))?;
        let bytes = &self.block[self.pos..end];
        self.pos = end;
        if huffman {
            httlib_huffman::decode(bytes, out, httlib_huffman::DecoderSpeed::FiveBits)
                .map_err(|_| bad("invalid Huffman string"))
        } else {
            out.extend_from_slice(bytes);
            Ok(())
        }
    }
}

/// Follows one peer's encoder.
pub(crate) struct Decoder {
    table: Table,
}

impl Decoder {
    pub(crate) fn new() -> Self {
        Decoder {
            table: Table::new(TABLE_SIZE),
        }
    }

    pub(crate) fn decode(&mut self, block: &[u8]) -> Result<Headers, ConnError> {
        let mut headers = Headers {
            buf: Vec::with_capacity(block.len() * 2),
            fields: Vec::with_capacity(16),
            never: Vec::new(),
        };
        let mut at = Cursor { block, pos: 0 };
        while at.pos < block.len() {
            let first = block[at.pos];
            if first & 0xe0 == 0x20 {
                // Dynamic table size update: only before the first field.
                let size = at.int(5)?;
                if !headers.fields.is_empty() || size > TABLE_SIZE {
                    return Err(bad("misplaced or oversized table size update"));
                }
                self.table.resize(size);
                continue;
            }
            let start = headers.buf.len();
            let (indexed, prefix, insert) = match first {
                b if b & 0x80 != 0 => (true, 7, false),
                b if b & 0xc0 == 0x40 => (false, 6, true),
                // Without indexing (0000) or never indexed (0001).
                _ => (false, 4, false),
            };
            let index = at.int(prefix)?;
            if indexed {
                let (name, value) = self.table.get(index).ok_or_else(|| bad("bad index"))?;
                headers.buf.extend_from_slice(name);
                let mid = headers.buf.len();
                headers.buf.extend_from_slice(value);
                headers
                    .fields
                    .push((start as u32, mid as u32, headers.buf.len() as u32));
            } else {
                if index == 0 {
                    at.string(&mut headers.buf)?;
                } else {
                    let (name, _) = self.table.get(index).ok_or_else(|| bad("bad index"))?;
                    headers.buf.extend_from_slice(name);
                }
                let mid = headers.buf.len();
                at.string(&mut headers.buf)?;
                let end = headers.buf.len();
                if first & 0xf0 == 0x10 {
                    headers.never.push(headers.fields.len() as u32);
                }
                headers.fields.push((start as u32, mid as u32, end as u32));
                if insert {
                    self.table
                        .insert(&headers.buf[start..mid], &headers.buf[mid..end]);
                }
            }
            if headers.list_size() > MAX_LIST_SIZE {
                return Err(ConnError::protocol(format!(
                    "a header list over {MAX_LIST_SIZE} bytes"
                )));
            }
        }
        Ok(headers)
    }
}

/// How blocks toward one peer are produced.
pub(crate) enum BlockEncoding {
    /// Blocks from the peer's counterpart pass as received: both tables are in step.
    Raw,
    /// Our own encoder; `fresh` until its first block, which resets the peer's table first.
    Own { table: Box<Table>, fresh: bool },
}

impl BlockEncoding {
    /// Our own encoder, for a peer whose table holds at most `size` bytes.
    pub(crate) fn own(size: usize) -> Self {
        BlockEncoding::Own {
            table: Box::new(Table::new(size.min(TABLE_SIZE))),
            fresh: true,
        }
    }

    pub(crate) fn is_raw(&self) -> bool {
        matches!(self, BlockEncoding::Raw)
    }

    /// Encode `headers` with our own encoder (`Own`), or statelessly (`Raw`: the peer's table
    /// belongs to the other side's encoder and must not change).
    pub(crate) fn encode(&mut self, headers: &Headers) -> Vec<u8> {
        let mut out = Vec::with_capacity(headers.buf.len() + 4 * headers.fields.len() + 8);
        match self {
            BlockEncoding::Raw => encode_stateless(headers, &mut out),
            BlockEncoding::Own { table, fresh } => {
                if std::mem::take(fresh) {
                    // Size updates to 0 (drops entries the other side's encoder put in the
                    // peer's table) and back to the size we use.
                    put_int(&mut out, 0, 5, 0x20);
                    put_int(&mut out, table.max, 5, 0x20);
                }
                for (name, value, never) in headers.iter_flagged() {
                    encode_field(table, name, value, never, &mut out);
                }
            }
        }
        out
    }
}

fn encode_field(table: &mut Table, name: &[u8], value: &[u8], never: bool, out: &mut Vec<u8>) {
    let (full, by_name) = table.find(name, value);
    if let Some(index) = full.filter(|_| !never) {
        put_int(out, index, 7, 0x80);
        return;
    }
    // Whatever fits is indexed, as the client's encoder did for any field it sends us as an
    // index: a large entry sent as a literal each time would amplify what the client sent.
    let index_it = !never && name.len() + value.len() + 32 <= table.max;
    let (prefix, leading) = match (index_it, never) {
        (true, _) => (6, 0x40),
        (false, true) => (4, 0x10),
        (false, false) => (4, 0x00),
    };
    put_int(out, by_name.unwrap_or(0), prefix, leading);
    if by_name.is_none() {
        put_string(out, name);
    }
    put_string(out, value);
    if index_it {
        table.insert(name, value);
    }
}

/// Literal fields without indexing (static names by index): valid against any state of the
/// peer's table, and leave it untouched.
pub(crate) fn encode_stateless(headers: &Headers, out: &mut Vec<u8>) {
    for (name, value, never) in headers.iter_flagged() {
        let leading = if never { 0x10 } else { 0x00 };
        match STATIC.iter().position(|(n, _)| n.as_bytes() == name) {
            Some(i) => put_int(out, i + 1, 4, leading),
            None => {
                out.push(leading);
                put_string(out, name);
            }
        }
        put_string(out, value);
    }
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, s.len(), 7, 0x00);
    out.extend_from_slice(s);
}

fn put_int(out: &mut Vec<u8>, value: usize, prefix: u8, leading: u8) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.push(leading | value as u8);
        return;
    }
    out.push(leading | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(pairs: &[(&str, &str)]) -> Headers {
        let mut h = Headers::default();
        for (n, v) in pairs {
            h.push(n.as_bytes(), v.as_bytes());
        }
        h
    }

    fn pairs(h: &Headers) -> Vec<(Vec<u8>, Vec<u8>)> {
        h.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
    }

    #[test]
    fn rfc_7541_examples_decode() {
        // C.4.1 – C.4.2: requests with Huffman strings, the second indexing the first.
        let mut d = Decoder::new();
        let first = hex::decode("828684418cf1e3c2e5f23a6ba0ab90f4ff").unwrap();
        let h = d.decode(&first).unwrap();
        assert_eq!(
            pairs(&h),
            pairs(&list(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ]))
        );
        let second = hex::decode("828684be5886a8eb10649cbf").unwrap();
        let h = d.decode(&second).unwrap();
        assert_eq!(h.get(b":authority"), Some(&b"www.example.com"[..]));
        assert_eq!(h.get(b"cache-control"), Some(&b"no-cache"[..]));
    }

    #[test]
    fn static_table_matches_another_implementation() {
        // loona-hpack's encoder indexes full static matches; our decoder must read them back.
        let mut theirs = loona_hpack::Encoder::new();
        for (name, value) in STATIC {
            let block = theirs.encode([(name.as_bytes(), value.as_bytes())]);
            let h = Decoder::new().decode(&block).unwrap();
            assert_eq!(pairs(&h), pairs(&list(&[(name, value)])), "{name}");
        }
    }

    #[test]
    fn own_encoder_round_trips_and_compresses() {
        let a = list(&[
            (":method", "POST"),
            (":path", "/aiserver.v1.AiService/StreamCpp"),
            ("authorization", &"x".repeat(700)),
            ("x-cursor-client-version", "1.2.3"),
        ]);
        let mut own = BlockEncoding::own(TABLE_SIZE);
        let mut peer = Decoder::new();
        let first = own.encode(&a);
        assert_eq!(pairs(&peer.decode(&first).unwrap()), pairs(&a));
        let again = own.encode(&a);
        assert!(again.len() < 10, "indexed the second time: {}", again.len());
        assert_eq!(pairs(&peer.decode(&again).unwrap()), pairs(&a));
        // loona's decoder agrees.
        let mut theirs = loona_hpack::Decoder::new();
        let mut own = BlockEncoding::own(TABLE_SIZE);
        for _ in 0..3 {
            let got = theirs.decode(&own.encode(&a)).unwrap();
            assert_eq!(got, pairs(&a));
        }
    }

    #[test]
    fn stateless_blocks_decode_against_any_table_and_leave_it_alone() {
        let first = list(&[("x-cursor-path", "/a"), ("x-cursor-id", "1")]);
        let second = list(&[(":path", "/b"), ("x-cursor-id", "2")]);
        // A peer whose table the other side's encoder filled.
        let mut theirs = BlockEncoding::own(TABLE_SIZE);
        let mut decoder = Decoder::new();
        assert_eq!(
            pairs(&decoder.decode(&theirs.encode(&first)).unwrap()),
            pairs(&first)
        );
        // Our stateless block in between...
        let ours = BlockEncoding::Raw.encode(&second);
        assert_eq!(pairs(&decoder.decode(&ours).unwrap()), pairs(&second));
        // ...and the other side's next block (indexed from its table) still decodes.
        let block = theirs.encode(&first);
        assert!(block.len() < 4, "indexed: {block:?}");
        assert_eq!(pairs(&decoder.decode(&block).unwrap()), pairs(&first));
    }

    #[test]
    fn own_encoder_takes_over_a_table_filled_by_someone_else() {
        let a = list(&[("x-a", "1"), ("x-b", "2")]);
        let b = list(&[("x-c", "3"), ("x-a", "1")]);
        let mut theirs = BlockEncoding::own(TABLE_SIZE);
        let mut decoder = Decoder::new();
        decoder.decode(&theirs.encode(&a)).unwrap();
        let mut own = BlockEncoding::own(TABLE_SIZE);
        for _ in 0..3 {
            assert_eq!(pairs(&decoder.decode(&own.encode(&b)).unwrap()), pairs(&b));
            assert_eq!(pairs(&decoder.decode(&own.encode(&a)).unwrap()), pairs(&a));
        }
    }

    #[test]
    fn never_indexed_fields_stay_so_through_every_encoder() {
        let mut h = list(&[(":path", "/a")]);
        h.push_never(b"authorization", b"Bearer secret");
        for mut encoding in [BlockEncoding::own(TABLE_SIZE), BlockEncoding::Raw] {
            let mut peer = Decoder::new();
            for _ in 0..2 {
                let block = encoding.encode(&h);
                let got = peer.decode(&block).unwrap();
                let flags: Vec<bool> = got.iter_flagged().map(|(_, _, never)| never).collect();
                assert_eq!(flags, [false, true]);
                assert!(
                    block.windows(13).any(|w| w == b"Bearer secret"),
                    "a literal"
                );
            }
        }
    }

    #[test]
    fn eviction_keeps_encoder_and_decoder_in_step() {
        let mut own = BlockEncoding::own(200);
        let mut peer = Decoder::new();
        for i in 0..50 {
            let h = list(&[("x-n", &format!("{i}")), (&format!("x-{}", i % 7), "v")]);
            assert_eq!(pairs(&peer.decode(&own.encode(&h)).unwrap()), pairs(&h));
        }
    }

    #[test]
    fn bad_blocks_and_huge_lists_are_errors() {
        let mut decoder = Decoder::new();
        for bad in [
            &[0xff, 0xff, 0xff][..],
            &[0x80],
            &[0xbf],
            &[0x40, 0x05, b'a'],
            &[0x82, 0x3f, 0xe1, 0x1f],
        ] {
            assert_eq!(
                decoder.decode(bad).unwrap_err().reason,
                Reason::COMPRESSION_ERROR,
                "{bad:?}"
            );
        }
        let big = "v".repeat(100_000);
        let huge = list(&[("a", &big), ("b", &big), ("c", &big)]);
        let mut out = Vec::new();
        encode_stateless(&huge, &mut out);
        assert_eq!(
            Decoder::new().decode(&out).unwrap_err().reason,
            Reason::PROTOCOL_ERROR
        );
    }

    #[test]
    fn arbitrary_blocks_never_panic() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..200))| {
            let mut decoder = Decoder::new();
            let _ = decoder.decode(&bytes);
            let _ = decoder.decode(&bytes);
        });
    }
}
