//! A sans-IO ClientHello reader: is this TLS, and which server name does it ask for?
//!
//! Feed it everything read so far; it re-parses from the start each time (a ClientHello is
//! small), so bytes split anywhere across reads or TLS records are handled alike.

/// Bytes we are willing to hold while waiting for a whole ClientHello.
pub(crate) const MAX_HELLO: usize = 16 * 1024;

const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Peek {
    /// Could be a ClientHello; more bytes needed.
    NeedMore,
    /// A complete ClientHello; `sni` is its host name, if it sent one.
    ClientHello { sni: Option<String> },
    /// Not a TLS ClientHello (another protocol, a malformed or oversized hello).
    NotClientHello,
}

pub(crate) fn peek(buf: &[u8]) -> Peek {
    match handshake_message(buf) {
        Err(Stop::NeedMore) => Peek::NeedMore,
        Err(Stop::Invalid) => Peek::NotClientHello,
        Ok(msg) => match server_name(msg) {
            Ok(sni) => Peek::ClientHello { sni },
            Err(_) => Peek::NotClientHello,
        },
    }
}

enum Stop {
    NeedMore,
    Invalid,
}

/// The ClientHello body, reassembled from as many handshake records as it spans.
fn handshake_message(buf: &[u8]) -> Result<Vec<u8>, Stop> {
    let mut payload = Vec::new();
    let mut rest = buf;
    loop {
        if rest.is_empty() {
            return Err(Stop::NeedMore);
        }
        if rest[0] != CONTENT_HANDSHAKE {
            return Err(Stop::Invalid);
        }
        if rest.len() >= 2 && rest[1] != 3 {
            return Err(Stop::Invalid); // record version major is always 3
        }
        if rest.len() < 5 {
            return Err(Stop::NeedMore);
        }
        let record_len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if record_len == 0 || record_len > MAX_HELLO {
            return Err(Stop::Invalid);
        }
        let available = (rest.len() - 5).min(record_len);
        payload.extend_from_slice(&rest[5..5 + available]);
        if let Some(done) = complete_message(&payload)? {
            return Ok(done);
        }
        if available < record_len {
            return Err(Stop::NeedMore);
        }
        rest = &rest[5 + record_len..];
    }
}

/// `Some(body)` once the handshake bytes hold the whole ClientHello.
fn complete_message(payload: &[u8]) -> Result<Option<Vec<u8>>, Stop> {
    if payload.is_empty() {
        return Ok(None);
    }
    if payload[0] != HANDSHAKE_CLIENT_HELLO {
        return Err(Stop::Invalid);
    }
    if payload.len() < 4 {
        return Ok(None);
    }
    let len =
        usize::from(payload[1]) << 16 | usize::from(payload[2]) << 8 | usize::from(payload[3]);
    if len > MAX_HELLO {
        return Err(Stop::Invalid);
    }
    Ok(payload.get(4..4 + len).map(<[u8]>::to_vec))
}

/// A cursor over a complete ClientHello body; any short read is malformed input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        if self.0.len() < n {
            return Err(Stop::Invalid);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Stop> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Stop> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn vec_u8(&mut self) -> Result<&'a [u8], Stop> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }

    fn vec_u16(&mut self) -> Result<&'a [u8], Stop> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
}

fn server_name(hello: Vec<u8>) -> Result<Option<String>, Stop> {
    let mut r = Reader(&hello);
    r.take(2 + 32)?; // legacy_version, random
    r.vec_u8()?; // session id
    r.vec_u16()?; // cipher suites
    r.vec_u8()?; // compression methods
    if r.0.is_empty() {
        return Ok(None); // no extensions at all
    }
    let mut exts = Reader(r.vec_u16()?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec_u16()?;
        if kind == EXT_SERVER_NAME {
            return host_name(data).map(Some);
        }
    }
    Ok(None)
}

fn host_name(ext: &[u8]) -> Result<String, Stop> {
    let mut list = Reader(Reader(ext).vec_u16()?);
    while !list.0.is_empty() {
        let kind = list.u8()?;
        let name = list.vec_u16()?;
        if kind == NAME_TYPE_HOST {
            // Host names are ASCII (IDNs arrive as punycode); anything else is not one.
            if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
                return Err(Stop::Invalid);
            }
            return Ok(String::from_utf8_lossy(name).to_ascii_lowercase());
        }
    }
    Err(Stop::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn client_hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    /// The same handshake bytes, re-cut into two records at `at`.
    fn two_records(hello: &[u8], at: usize) -> Vec<u8> {
        let payload = &hello[5..];
        let mut out = Vec::new();
        for part in [&payload[..at], &payload[at..]] {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    fn sni(name: &str) -> Peek {
        Peek::ClientHello {
            sni: Some(name.to_string()),
        }
    }

    #[test]
    fn reads_sni_at_every_split_point() {
        let hello = client_hello("api2.cursor.sh");
        assert_eq!(peek(&hello), sni("api2.cursor.sh"));
        for i in 0..hello.len() {
            assert_eq!(peek(&hello[..i]), Peek::NeedMore, "prefix of {i} bytes");
        }
        let mut trailing = hello.clone();
        trailing.extend_from_slice(b"more bytes after the hello");
        assert_eq!(peek(&trailing), sni("api2.cursor.sh"));
    }

    #[test]
    fn reassembles_a_hello_split_across_records() {
        let hello = client_hello("agent.api5.cursor.sh");
        let payload_len = hello.len() - 5;
        for at in 1..payload_len {
            let bytes = two_records(&hello, at);
            assert_eq!(peek(&bytes), sni("agent.api5.cursor.sh"), "cut at {at}");
        }
        // Every prefix, for cuts inside the handshake header, at its edge, and mid-body.
        for at in [1, 3, 4, 5, payload_len / 2, payload_len - 1] {
            let bytes = two_records(&hello, at);
            for i in 0..bytes.len() {
                assert_eq!(peek(&bytes[..i]), Peek::NeedMore, "cut {at}, prefix {i}");
            }
        }
    }

    #[test]
    fn ip_hello_has_no_sni() {
        let hello = client_hello("127.0.0.1");
        assert_eq!(peek(&hello), Peek::ClientHello { sni: None });
    }

    #[test]
    fn other_protocols_are_not_tls() {
        assert_eq!(peek(b"G"), Peek::NotClientHello);
        assert_eq!(peek(b"GET / HTTP/1.1\r\n\r\n"), Peek::NotClientHello);
        assert_eq!(peek(b"SSH-2.0-OpenSSH_9.6\r\n"), Peek::NotClientHello);
        assert_eq!(peek(&[22, 9]), Peek::NotClientHello);
        // A handshake record that is not a ClientHello (a ServerHello).
        assert_eq!(peek(&[22, 3, 3, 0, 4, 2, 0, 0, 0]), Peek::NotClientHello);
    }

    #[test]
    fn oversized_or_malformed_hellos_are_refused() {
        // Declared handshake length beyond the bound.
        assert_eq!(peek(&[22, 3, 1, 0, 4, 1, 0x01, 0, 0]), Peek::NotClientHello);
        // Record length zero.
        assert_eq!(peek(&[22, 3, 1, 0, 0]), Peek::NotClientHello);
        // A complete but truncated body.
        assert_eq!(
            peek(&[22, 3, 1, 0, 6, 1, 0, 0, 2, 3, 3]),
            Peek::NotClientHello
        );
    }
}
