//! Hop-by-hop headers: they describe one connection and never cross the proxy.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Names that only mean something on one connection (RFC 9110 §7.6.1), plus `te`, which
/// survives only as `te: trailers`. Constants, so a lookup never parses a name.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
];

/// Is this an HTTP/1.1 WebSocket upgrade request?
pub(crate) fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let upgrade = headers
        .get_all(header::UPGRADE)
        .iter()
        .any(|v| has_token(v, "websocket"));
    let connection = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| has_token(v, "upgrade"));
    upgrade && connection
}

/// Remove hop-by-hop headers, including any the `Connection` header names. `te` survives only as
/// `te: trailers` (the one value HTTP/2 allows). With `keep_upgrade` the `Upgrade` header and
/// `Connection: upgrade` stay, for a WebSocket handshake.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most requests carry none of them: one pass over the names, no hashing or removal.
    if !keep_upgrade && !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(keep_upgrade && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    let te_trailers = headers
        .get_all(header::TE)
        .iter()
        .any(|v| has_token(v, "trailers"));
    for name in &HOP_BY_HOP {
        if keep_upgrade && (name == header::UPGRADE || name == header::CONNECTION) {
            continue;
        }
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn strips_hop_by_hop_and_named() {
        let mut h = map(&[
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "1"),
            ("proxy-authorization", "Basic abc"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers, deflate"),
            ("authorization", "Bearer t"),
            ("x-cursor-checksum", "c"),
            ("connect-protocol-version", "1"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "authorization",
                "connect-protocol-version",
                "te",
                "x-cursor-checksum"
            ]
        );
        assert_eq!(h["te"], "trailers");
    }

    #[test]
    fn keeps_websocket_upgrade() {
        let mut h = map(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(is_websocket_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["sec-websocket-key"], "k");
    }
}
