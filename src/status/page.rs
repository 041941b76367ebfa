//! The status page's HTTP face: `GET /__cursor-byok/status` (HTML) and
//! `GET /__cursor-byok/status.json` (the snapshot the page polls every second).
//!
//! Served only by the proxy listener itself, to origin-form requests from loopback that name a
//! loopback host (a DNS-rebinding page cannot read it); never forwarded upstream.

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};

use super::Status;
use crate::http::{full, Body};

/// Every path of ours starts with this; none of Cursor's does.
pub const PATH_PREFIX: &str = "/__cursor-byok/";
pub const PAGE_PATH: &str = "/__cursor-byok/status";
pub const SNAPSHOT_PATH: &str = "/__cursor-byok/status.json";

/// Self-contained: inline style and script, no external resource (the CSP forbids them).
const PAGE_HTML: &str = include_str!("page.html");
const SNAPSHOT_MARK: &str = "__INITIAL_SNAPSHOT__";
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// Is `path` one of the proxy's own paths (served locally, never forwarded)?
pub fn is_own_path(path: &str) -> bool {
    path.starts_with(PATH_PREFIX)
}

/// Answer a request for one of our paths. `peer` and `headers` are checked first: loopback
/// clients only, and a `Host` naming a loopback address or `localhost`.
pub fn respond(
    status: &Status,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Response<Body> {
    if !peer.ip().is_loopback() {
        return text(
            StatusCode::FORBIDDEN,
            "cursor-byok: the status page is only served to this machine",
        );
    }
    if !host_is_loopback(headers) {
        return text(
            StatusCode::FORBIDDEN,
            "cursor-byok: open the status page as http://127.0.0.1:<port>/__cursor-byok/status",
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut resp = text(StatusCode::METHOD_NOT_ALLOWED, "cursor-byok: GET only");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return resp;
    }
    match path {
        PAGE_PATH | "/__cursor-byok/" => page(status),
        SNAPSHOT_PATH => snapshot(status),
        super::pac::PAC_PATH => match status.pac() {
            Some(script) => pac(script),
            None => text(
                StatusCode::NOT_FOUND,
                "cursor-byok: no PAC script on this listener",
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "cursor-byok: unknown path; the status page is /__cursor-byok/status",
        ),
    }
}

/// For one of our paths arriving for a Cursor host (through CONNECT or a direct door): not
/// forwarded, and not served there either.
pub fn local_only_answer() -> Response<Body> {
    text(
        StatusCode::NOT_FOUND,
        "cursor-byok: this path is served only on the proxy listener: \
         http://127.0.0.1:<port>/__cursor-byok/status",
    )
}

fn page(status: &Status) -> Response<Body> {
    // The first snapshot rides along so the page paints at once; `<` is escaped so no string in
    // it can close the script element.
    let json = serde_json::to_string(&status.snapshot())
        .unwrap_or_else(|_| "null".into())
        .replace('<', "\\u003c");
    let html = PAGE_HTML.replacen(SNAPSHOT_MARK, &json, 1);
    let mut resp = Response::new(full(html));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    common_headers(h);
    resp
}

fn snapshot(status: &Status) -> Response<Body> {
    let json = serde_json::to_vec(&status.snapshot()).unwrap_or_else(|_| b"null".to_vec());
    let mut resp = Response::new(full(json));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    common_headers(h);
    resp
}

fn pac(script: &str) -> Response<Body> {
    let mut resp = Response::new(full(script.to_string()));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(super::pac::PAC_CONTENT_TYPE),
    );
    common_headers(h);
    resp
}

fn common_headers(h: &mut HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = Response::new(full(format!("{message}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    common_headers(resp.headers_mut());
    resp
}

/// `Host` is `localhost` or a loopback IP (with or without a port). A page on another origin
/// that rebinds its name to 127.0.0.1 still sends its own name here, and is refused.
fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Ok(authority) = host.trim().parse::<http::uri::Authority>() else {
        return false;
    };
    let name = crate::http::bare_host(authority.host());
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        h
    }

    #[test]
    fn only_loopback_hosts() {
        assert!(host_is_loopback(&headers("127.0.0.1:8787")));
        assert!(host_is_loopback(&headers("localhost:8787")));
        assert!(host_is_loopback(&headers("[::1]:8787")));
        assert!(host_is_loopback(&headers("127.0.0.1")));
        assert!(!host_is_loopback(&headers("evil.example:8787")));
        assert!(!host_is_loopback(&headers("10.0.0.1:8787")));
        assert!(!host_is_loopback(&HeaderMap::new()));
    }

    #[test]
    fn answers_and_refuses() {
        let status = Status::new();
        let lo: SocketAddr = ([127, 0, 0, 1], 5000).into();
        let far: SocketAddr = ([10, 0, 0, 2], 5000).into();
        let h = headers("127.0.0.1:8787");
        let get = |path, peer| respond(&status, &Method::GET, path, &h, peer).status();
        assert_eq!(get(PAGE_PATH, lo), StatusCode::OK);
        assert_eq!(get(SNAPSHOT_PATH, lo), StatusCode::OK);
        assert_eq!(get("/__cursor-byok/nope", lo), StatusCode::NOT_FOUND);
        assert_eq!(get(PAGE_PATH, far), StatusCode::FORBIDDEN);
        let post = respond(&status, &Method::POST, PAGE_PATH, &h, lo).status();
        assert_eq!(post, StatusCode::METHOD_NOT_ALLOWED);
        assert!(PAGE_HTML.contains(SNAPSHOT_MARK));
        assert!(!PAGE_HTML.contains("http://") && !PAGE_HTML.contains("https://"));
    }
}
