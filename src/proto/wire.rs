//! The protobuf wire format one level deep, without a schema: scan a message's top-level
//! fields (tag, wire type, extent) and splice messages field by field.
//!
//! Sans-IO and bounded: a scan never reads past its buffer, never allocates per field, and
//! nests only through groups (at most [`MAX_GROUP_DEPTH`]). Malformed input is an error,
//! never a panic.
//!
//! Why: prost drops fields it does not know. Where the proxy passes Cursor's data back (the
//! checkpoint, model lists, the server config) it starts from the bytes as received and
//! replaces only the fields it changes, so whatever a newer Cursor added survives.

use std::collections::BTreeSet;

use bytes::Bytes;

/// Groups (a proto2 relic) nest; this bounds how deep a scan follows them.
pub(crate) const MAX_GROUP_DEPTH: usize = 32;

/// How a field's value is laid out on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireType {
    Varint,
    Fixed64,
    Len,
    Group,
    Fixed32,
}

impl WireType {
    fn from_bits(bits: u64) -> Option<WireType> {
        Some(match bits {
            0 => WireType::Varint,
            1 => WireType::Fixed64,
            2 => WireType::Len,
            3 => WireType::Group,
            5 => WireType::Fixed32,
            _ => return None,
        })
    }
}

/// Why a buffer is not a protobuf message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("protobuf ends inside a field at byte {at}")]
    Truncated { at: usize },
    #[error("protobuf varint longer than 10 bytes at byte {at}")]
    BadVarint { at: usize },
    #[error("protobuf wire type {bits} (unknown) at byte {at}")]
    BadWireType { at: usize, bits: u64 },
    #[error("protobuf field number {number} (out of range) at byte {at}")]
    BadFieldNumber { at: usize, number: u64 },
    #[error("protobuf group nested deeper than {MAX_GROUP_DEPTH} at byte {at}")]
    TooDeep { at: usize },
    #[error("protobuf group end without a matching start at byte {at}")]
    UnmatchedGroupEnd { at: usize },
}

/// One top-level field as it sits in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u32,
    pub wire_type: WireType,
    /// The whole field: tag and value, exactly as received.
    pub raw: &'a [u8],
    /// The value: a length-delimited field's content, a varint's bytes, the fixed bytes, or a
    /// group's fields (without its end tag).
    pub value: &'a [u8],
}

impl Field<'_> {
    /// The value as an integer (varint or fixed); `None` for length-delimited fields and groups.
    pub fn as_u64(&self) -> Option<u64> {
        match self.wire_type {
            WireType::Varint => read_varint(self.value, 0).ok().map(|(v, _)| v),
            WireType::Fixed64 => Some(u64::from_le_bytes(self.value.try_into().ok()?)),
            WireType::Fixed32 => Some(u64::from(u32::from_le_bytes(self.value.try_into().ok()?))),
            WireType::Len | WireType::Group => None,
        }
    }
}

/// The top-level fields of `buf`, in order. After the first error the iterator ends.
pub fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf, pos: 0 }
}

pub struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let start = self.pos;
        let result = read_field(self.buf, start);
        match &result {
            Ok((_, end)) => self.pos = *end,
            Err(_) => self.pos = self.buf.len(),
        }
        Some(result.map(|(field, _)| field))
    }
}

/// Checks that `buf` scans as fields to its end.
pub fn validate(buf: &[u8]) -> Result<(), WireError> {
    fields(buf).try_for_each(|f| f.map(drop))
}

/// Reads the varint at `at`; returns it and the position after it.
pub(crate) fn read_varint(buf: &[u8], at: usize) -> Result<(u64, usize), WireError> {
    let mut value = 0u64;
    for i in 0..10 {
        let Some(&byte) = buf.get(at + i) else {
            return Err(WireError::Truncated { at: buf.len() });
        };
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, at + i + 1));
        }
    }
    Err(WireError::BadVarint { at })
}

/// Reads a tag at `at`: field number, wire type bits, position after it.
fn read_tag(buf: &[u8], at: usize) -> Result<(u32, u64, usize), WireError> {
    let (tag, next) = read_varint(buf, at)?;
    let number = tag >> 3;
    match u32::try_from(number) {
        Ok(n) if (1..=(1 << 29) - 1).contains(&n) => Ok((n, tag & 7, next)),
        _ => Err(WireError::BadFieldNumber { at, number }),
    }
}

/// The field starting at `start` and the position after it.
fn read_field(buf: &[u8], start: usize) -> Result<(Field<'_>, usize), WireError> {
    let (number, bits, at) = read_tag(buf, start)?;
    if bits == 4 {
        return Err(WireError::UnmatchedGroupEnd { at: start });
    }
    let wire_type = WireType::from_bits(bits).ok_or(WireError::BadWireType { at: start, bits })?;
    let (value_start, value_end, end) = match wire_type {
        WireType::Varint => {
            let (_, end) = read_varint(buf, at)?;
            (at, end, end)
        }
        WireType::Fixed64 => (at, at + 8, at + 8),
        WireType::Fixed32 => (at, at + 4, at + 4),
        WireType::Len => {
            let (len, value_start) = read_varint(buf, at)?;
            let len = usize::try_from(len).map_err(|_| WireError::Truncated { at: buf.len() })?;
            let end = value_start
                .checked_add(len)
                .ok_or(WireError::Truncated { at: buf.len() })?;
            (value_start, end, end)
        }
        WireType::Group => {
            let (value_end, end) = skip_group(buf, at, number)?;
            (at, value_end, end)
        }
    };
    if end > buf.len() {
        return Err(WireError::Truncated { at: buf.len() });
    }
    let field = Field {
        number,
        wire_type,
        raw: &buf[start..end],
        value: &buf[value_start..value_end],
    };
    Ok((field, end))
}

/// Skips a group's fields from `at` to its end tag; returns where the end tag starts and the
/// position after it. Iterative, bounded by [`MAX_GROUP_DEPTH`].
fn skip_group(buf: &[u8], mut at: usize, number: u32) -> Result<(usize, usize), WireError> {
    let mut open = vec![number];
    loop {
        let tag_start = at;
        let (n, bits, next) = read_tag(buf, at)?;
        at = next;
        match bits {
            0 => at = read_varint(buf, at)?.1,
            1 => at += 8,
            5 => at += 4,
            2 => {
                let (len, next) = read_varint(buf, at)?;
                let len =
                    usize::try_from(len).map_err(|_| WireError::Truncated { at: buf.len() })?;
                at = next
                    .checked_add(len)
                    .ok_or(WireError::Truncated { at: buf.len() })?;
            }
            3 => {
                if open.len() >= MAX_GROUP_DEPTH {
                    return Err(WireError::TooDeep { at: tag_start });
                }
                open.push(n);
            }
            4 => {
                if open.pop() != Some(n) {
                    return Err(WireError::UnmatchedGroupEnd { at: tag_start });
                }
                if open.is_empty() {
                    return Ok((tag_start, at));
                }
            }
            bits => {
                return Err(WireError::BadWireType {
                    at: tag_start,
                    bits,
                })
            }
        }
        if at > buf.len() {
            return Err(WireError::Truncated { at: buf.len() });
        }
    }
}

/// `original` without the top-level fields `drop` selects, then `append`: every other field,
/// known or not, stays byte for byte and in its place. `append` must itself be encoded fields.
pub fn splice(
    original: &[u8],
    drop: impl Fn(u32) -> bool,
    append: &[u8],
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(original.len() + append.len());
    for field in fields(original) {
        let field = field?;
        if !drop(field.number) {
            out.extend_from_slice(field.raw);
        }
    }
    out.extend_from_slice(append);
    Ok(out)
}

/// `original` (the bytes `old` was decoded from) carrying the changes from `old` to `new` in
/// the fields `owned`: each owned top-level field whose encoding differs between `old` and
/// `new` is replaced by `new`'s; every other field of `original` — including those this build
/// does not know, and owned ones left as they were — is kept byte for byte.
///
/// Only `owned` fields are compared: prost encodes maps in hash order, so comparing every
/// field would see a map as changed when it is not.
pub fn update<M: prost::Message>(
    original: &[u8],
    old: &M,
    new: &M,
    owned: &[u32],
) -> Result<Vec<u8>, WireError> {
    let old = old.encode_to_vec();
    let new = new.encode_to_vec();
    let changed: BTreeSet<u32> = changed_numbers(&old, &new)?
        .into_iter()
        .filter(|n| owned.contains(n))
        .collect();
    let mut append = Vec::new();
    for field in fields(&new) {
        let field = field?;
        if changed.contains(&field.number) {
            append.extend_from_slice(field.raw);
        }
    }
    splice(original, |n| changed.contains(&n), &append)
}

/// Field numbers whose occurrences (all of them, in order) differ between two encodings.
fn changed_numbers(a: &[u8], b: &[u8]) -> Result<BTreeSet<u32>, WireError> {
    let group = |buf| -> Result<std::collections::BTreeMap<u32, Vec<&[u8]>>, WireError> {
        let mut map = std::collections::BTreeMap::<u32, Vec<&[u8]>>::new();
        for f in fields(buf) {
            let f = f?;
            map.entry(f.number).or_default().push(f.raw);
        }
        Ok(map)
    };
    let (a, b) = (group(a)?, group(b)?);
    Ok(a.keys()
        .chain(b.keys())
        .filter(|n| a.get(n) != b.get(n))
        .copied()
        .collect())
}

/// The value of length-delimited field `number` of `buf`, as protobuf reads a singular
/// message field: several occurrences merge, which for encoded messages is concatenation.
/// `None` when the field is absent.
pub fn message_field(buf: &Bytes, number: u32) -> Result<Option<Bytes>, WireError> {
    let mut parts = Vec::new();
    for field in fields(buf) {
        let field = field?;
        if field.number == number && field.wire_type == WireType::Len {
            parts.push(field.value);
        }
    }
    Ok(match parts.as_slice() {
        [] => None,
        [one] => Some(buf.slice_ref(one)),
        many => Some(Bytes::from(many.concat())),
    })
}

/// [`message_field`] along a path of field numbers.
pub fn message_path(buf: &Bytes, path: &[u32]) -> Result<Option<Bytes>, WireError> {
    let mut cur = buf.clone();
    for &number in path {
        match message_field(&cur, number)? {
            Some(next) => cur = next,
            None => return Ok(None),
        }
    }
    Ok(Some(cur))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::agent::v1 as pb;
    use proptest::prelude::*;
    use prost::Message as _;

    fn tag(number: u32, wire: u8) -> Vec<u8> {
        let mut v = Vec::new();
        prost::encoding::encode_varint(u64::from(number) << 3 | u64::from(wire), &mut v);
        v
    }

    fn len_field(number: u32, data: &[u8]) -> Vec<u8> {
        let mut v = tag(number, 2);
        prost::encoding::encode_varint(data.len() as u64, &mut v);
        v.extend_from_slice(data);
        v
    }

    /// Every kind of field, a group with a nested group among them.
    fn sample() -> Vec<u8> {
        let mut b = tag(1, 0);
        b.extend_from_slice(&[0x96, 0x01]);
        b.extend(tag(2, 1));
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend(len_field(3, b"hello"));
        b.extend(tag(4, 5));
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend(tag(5, 3));
        b.extend(tag(6, 3));
        b.extend(len_field(1, b"x"));
        b.extend(tag(6, 4));
        b.extend(tag(5, 4));
        b.extend(len_field(200, b"unknown bytes"));
        b
    }

    #[test]
    fn scans_every_wire_type() {
        let buf = sample();
        let f: Vec<Field> = fields(&buf).collect::<Result<_, _>>().unwrap();
        let numbers: Vec<u32> = f.iter().map(|f| f.number).collect();
        assert_eq!(numbers, [1, 2, 3, 4, 5, 200]);
        assert_eq!(f[0].as_u64(), Some(150));
        assert_eq!(f[1].as_u64(), Some(7));
        assert_eq!(f[2].value, b"hello");
        assert_eq!(f[3].as_u64(), Some(9));
        assert_eq!(f[4].wire_type, WireType::Group);
        assert_eq!(f[5].value, b"unknown bytes");
        assert_eq!(f.iter().map(|f| f.raw.len()).sum::<usize>(), buf.len());
    }

    #[test]
    fn every_truncation_is_an_error_or_a_shorter_prefix() {
        let buf = sample();
        let ends: Vec<usize> = {
            let mut at = 0;
            fields(&buf)
                .map(|f| {
                    at += f.unwrap().raw.len();
                    at
                })
                .collect()
        };
        for cut in 0..buf.len() {
            let r = validate(&buf[..cut]);
            if cut == 0 || ends.contains(&cut) {
                assert_eq!(r, Ok(()), "cut {cut}");
            } else {
                assert!(r.is_err(), "cut {cut} must fail");
            }
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            validate(&[0x0f]),
            Err(WireError::BadWireType { .. })
        ));
        assert!(matches!(
            validate(&[0x00, 0x00]),
            Err(WireError::BadFieldNumber { .. })
        ));
        assert!(matches!(
            validate(&[0x0c]),
            Err(WireError::UnmatchedGroupEnd { .. })
        ));
        let mut long = vec![0x08];
        long.extend_from_slice(&[0xff; 11]);
        assert!(matches!(validate(&long), Err(WireError::BadVarint { .. })));
        let mut huge = tag(1, 2);
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(matches!(validate(&huge), Err(WireError::Truncated { .. })));
        let mut deep = Vec::new();
        for _ in 0..=MAX_GROUP_DEPTH {
            deep.extend(tag(1, 3));
        }
        assert!(matches!(validate(&deep), Err(WireError::TooDeep { .. })));
        let mut wrong = tag(1, 3);
        wrong.extend(tag(2, 4));
        assert!(matches!(
            validate(&wrong),
            Err(WireError::UnmatchedGroupEnd { .. })
        ));
    }

    #[test]
    fn splice_keeps_unknown_fields_and_replaces_ours() {
        let buf = sample();
        let out = splice(&buf, |n| n == 3, &len_field(3, b"bye")).unwrap();
        let f: Vec<Field> = fields(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            f.iter().map(|f| f.number).collect::<Vec<_>>(),
            [1, 2, 4, 5, 200, 3]
        );
        assert_eq!(f[4].value, b"unknown bytes");
        assert_eq!(f[5].value, b"bye");
    }

    #[test]
    fn update_replaces_only_changed_fields() {
        let old = pb::TodoItem {
            id: "1".into(),
            content: "do it".into(),
            status: pb::TodoStatus::Pending as i32,
            ..Default::default()
        };
        let mut original = old.encode_to_vec();
        original.extend(len_field(201, &len_field(1, b"nested")));
        let mut new = old.clone();
        new.status = pb::TodoStatus::Completed as i32;
        let out = update(&original, &old, &new, &[1, 2, 3]).unwrap();
        assert_eq!(pb::TodoItem::decode(out.as_slice()).unwrap(), new);
        assert!(fields(&out)
            .any(|f| f.unwrap().raw == len_field(201, &len_field(1, b"nested")).as_slice()));
        // Nothing changed: the original, unchanged.
        assert_eq!(update(&original, &old, &old, &[1, 2, 3]).unwrap(), original);
        // A change outside the owned fields is not applied.
        assert_eq!(update(&original, &old, &new, &[1]).unwrap(), original);
    }

    #[test]
    fn message_fields_merge_like_protobuf() {
        let mut buf = len_field(1, &len_field(2, b"a"));
        buf.extend(len_field(1, &len_field(3, b"b")));
        let buf = Bytes::from(buf);
        let merged = message_field(&buf, 1).unwrap().unwrap();
        assert_eq!(
            merged.as_ref(),
            [len_field(2, b"a"), len_field(3, b"b")].concat()
        );
        assert_eq!(message_field(&buf, 9).unwrap(), None);
        let one = Bytes::from(len_field(1, &len_field(2, &len_field(7, b"deep"))));
        assert_eq!(
            message_path(&one, &[1, 2, 7]).unwrap().unwrap().as_ref(),
            b"deep"
        );
    }

    proptest! {
        #[test]
        fn never_panics_and_splices_losslessly(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let valid = validate(&data).is_ok();
            let out = splice(&data, |_| false, &[]);
            prop_assert_eq!(out.is_ok(), valid);
            if let Ok(out) = out {
                prop_assert_eq!(out, data.clone());
            }
            let _ = message_field(&Bytes::from(data), 1);
        }

        #[test]
        fn scanned_fields_cover_the_buffer(numbers in proptest::collection::vec(1u32..300, 0..20)) {
            let mut buf = Vec::new();
            for n in &numbers {
                buf.extend(len_field(*n, &n.to_le_bytes()));
            }
            let got: Vec<u32> = fields(&buf).map(|f| f.unwrap().number).collect();
            prop_assert_eq!(got, numbers);
        }
    }
}
