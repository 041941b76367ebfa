//! The compression codecs Connect peers negotiate (identity and gzip), with bounded inflation.

use std::io::{Read, Write};

use bytes::Bytes;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use super::error::CodecError;

/// A message codec, as named by `content-encoding` (unary) or `connect-content-encoding`
/// (streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    #[default]
    Identity,
    Gzip,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
        }
    }

    /// Parses a `content-encoding` / `connect-content-encoding` header value; absent or empty
    /// means identity. Codings are case-insensitive in HTTP.
    pub fn from_header(value: Option<&str>) -> Result<Encoding, CodecError> {
        let v = value.map(str::trim).unwrap_or("");
        if v.is_empty() || v.eq_ignore_ascii_case("identity") {
            Ok(Encoding::Identity)
        } else if v.eq_ignore_ascii_case("gzip") {
            Ok(Encoding::Gzip)
        } else {
            Err(CodecError::UnsupportedEncoding(v.to_owned()))
        }
    }
}

/// Appends the gzip of `data` to `out` (so callers can reserve a frame header in front of it
/// and avoid a second copy).
pub(crate) fn gzip_into(out: Vec<u8>, data: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut enc = GzEncoder::new(out, flate2::Compression::default());
    enc.write_all(data).map_err(CodecError::Compress)?;
    enc.finish().map_err(CodecError::Compress)
}

/// Output every payload may inflate to whatever its ratio; past it, the ratio bound applies.
const RATIO_FLOOR: usize = 1 << 20;
/// Past the floor, more output than this many times the input read so far is a bomb. Deflate
/// tops out near 1032x (long runs of one byte); real messages stay far below 100x.
const MAX_RATIO: usize = 200;
/// How much output one inflation step asks for.
const STEP: usize = 64 * 1024;

/// Inflates `data`, refusing (without inflating further) as soon as the output would exceed
/// `max` bytes, or exceeds [`MAX_RATIO`] times the input read so far once past
/// [`RATIO_FLOOR`], so a gzip bomb costs at most `max + 1` bytes of memory and a few MiB of
/// work. Concatenated gzip members are accepted, as Go's and Node's readers do. An empty input
/// is an empty message (connect-go treats a zero-length compressed payload that way).
pub(crate) fn gunzip_bounded(data: &[u8], max: usize) -> Result<Bytes, CodecError> {
    inflate(data, max, &mut 0)
}

/// [`gunzip_bounded`], counting the bytes inflated in `inflated` (what the tests bound).
fn inflate(data: &[u8], max: usize, inflated: &mut usize) -> Result<Bytes, CodecError> {
    if data.is_empty() {
        return Ok(Bytes::new());
    }
    let mut dec = MultiGzDecoder::new(Counted { data, read: 0 });
    // A cheap first guess at the output size; grown a step at a time, up to the limit.
    let mut out = Vec::with_capacity(data.len().saturating_mul(4).min(max));
    loop {
        let len = out.len();
        // One byte past the limit at most: enough to know the limit was exceeded.
        let want = STEP.min(max.saturating_add(1) - len);
        out.resize(len + want, 0);
        let n = dec.read(&mut out[len..]).map_err(CodecError::BadGzip)?;
        out.truncate(len + n);
        *inflated = out.len();
        if n == 0 {
            return Ok(Bytes::from(out));
        }
        if out.len() > max {
            return Err(CodecError::DecompressedTooLarge {
                max: u64::try_from(max).unwrap_or(u64::MAX),
            });
        }
        if out.len() > RATIO_FLOOR && out.len() / MAX_RATIO > dec.get_ref().read {
            return Err(CodecError::InflationRatio {
                ratio: MAX_RATIO as u64,
            });
        }
    }
}

/// The compressed input, counting what the decoder has read of it.
struct Counted<'a> {
    data: &'a [u8],
    read: usize,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.data.read(buf)?;
        self.read += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values() {
        assert_eq!(Encoding::from_header(None).ok(), Some(Encoding::Identity));
        assert_eq!(
            Encoding::from_header(Some("")).ok(),
            Some(Encoding::Identity)
        );
        assert_eq!(
            Encoding::from_header(Some("identity")).ok(),
            Some(Encoding::Identity)
        );
        assert_eq!(
            Encoding::from_header(Some(" GZIP ")).ok(),
            Some(Encoding::Gzip)
        );
        assert!(matches!(
            Encoding::from_header(Some("br")),
            Err(CodecError::UnsupportedEncoding(e)) if e == "br"
        ));
    }

    #[test]
    fn bombs_are_refused_while_inflating() {
        let bomb = test_support::gzip_bomb_1gib();
        // Under the default 64 MiB cap: the ratio trips after a few MiB.
        let mut inflated = 0;
        let err = inflate(bomb, 64 << 20, &mut inflated).unwrap_err();
        assert!(
            matches!(err, CodecError::InflationRatio { ratio: 200 }),
            "{err}"
        );
        // The decoder reads its input 32 KiB at a time: at most ~200 x 32 KiB, not 64 MiB.
        assert!(inflated <= 8 << 20, "inflated {inflated} bytes");
        // Under a cap below the floor: the same error as ever, after max + 1 bytes.
        let max = 1 << 19;
        let err = inflate(bomb, max, &mut inflated).unwrap_err();
        assert!(matches!(err, CodecError::DecompressedTooLarge { max: m } if m == max as u64));
        assert_eq!(inflated, max + 1);
    }

    #[test]
    fn gzip_round_trip_and_bounds() {
        let data = b"hello hello hello hello".repeat(10);
        let z = gzip_into(Vec::new(), &data).expect("in-memory gzip");
        assert_eq!(
            gunzip_bounded(&z, data.len()).expect("fits").as_ref(),
            &data[..]
        );
        assert!(matches!(
            gunzip_bounded(&z, data.len() - 1),
            Err(CodecError::DecompressedTooLarge { .. })
        ));
        assert!(matches!(
            gunzip_bounded(b"not gzip", 100),
            Err(CodecError::BadGzip(_))
        ));
        assert!(matches!(
            gunzip_bounded(&z[..z.len() - 3], 1000),
            Err(CodecError::BadGzip(_))
        ));
        // Highly repetitive but real output under the floor is never a bomb.
        let runs = vec![b'a'; RATIO_FLOOR];
        let z_runs = gzip_into(Vec::new(), &runs).expect("in-memory gzip");
        assert_eq!(
            gunzip_bounded(&z_runs, RATIO_FLOOR).expect("fits").len(),
            RATIO_FLOOR
        );
        // Two members decode as their concatenation.
        let two = [z.clone(), z].concat();
        assert_eq!(
            gunzip_bounded(&two, 10_000).expect("fits").len(),
            data.len() * 2
        );
    }
}

/// Test helpers shared by the codec's unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::io::Write;
    use std::sync::OnceLock;

    use flate2::write::GzEncoder;

    /// A gzip bomb: 1 GiB of zeros in about 1 MiB, built streaming (zeros written in 1 MiB
    /// chunks, so building it never holds the inflated data) and cached across tests.
    pub(crate) fn gzip_bomb_1gib() -> &'static [u8] {
        static BOMB: OnceLock<Vec<u8>> = OnceLock::new();
        BOMB.get_or_init(|| {
            let zeros = vec![0u8; 1 << 20];
            let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::best());
            for _ in 0..1024 {
                enc.write_all(&zeros).expect("writing to a Vec cannot fail");
            }
            enc.finish().expect("writing to a Vec cannot fail")
        })
    }
}
