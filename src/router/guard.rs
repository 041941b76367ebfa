//! Only Cursor's clients drive the agent. With the CA trusted and the OS proxy (PAC) pointing
//! `*.cursor.sh` here, every browser tab can reach the agent doors too; a page can send a
//! "simple" POST (`sendBeacon`, a form, `fetch` with `no-cors`) without asking first. So an
//! agent request is refused when it carries what only browsers send (`Origin`, a
//! `Sec-Fetch-Site` other than `none`), and unless it is a `POST` with what Connect clients
//! always send: a Connect content type and `connect-protocol-version: 1`. Neither is something
//! a page may send without a CORS preflight, and no preflight is ever granted here (an
//! `OPTIONS` is refused like the rest). Cursor's agent clients (the desktop's agent host, the
//! CLI, the SDK: `connect-es` in Node) send both and neither browser header.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};

use crate::http::{full, Body};

/// The content types Connect clients send: streams (`Run`, `RunSSE`) and unary calls
/// (`BidiAppend`), binary or JSON.
const CONNECT_TYPES: [&str; 4] = [
    "application/connect+proto",
    "application/connect+json",
    "application/proto",
    "application/json",
];

/// Why an agent request is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("a {0} request; agent calls are POSTs")]
    Method(String),
    #[error("it comes from a web page (Origin: {0})")]
    Origin(String),
    #[error("it comes from a browser (Sec-Fetch-Site: {0})")]
    FetchSite(String),
    #[error("its content type `{0}` is not a Connect one")]
    ContentType(String),
    #[error("it does not say `connect-protocol-version: 1`")]
    ProtocolVersion,
}

/// The check on every agent request, before anything reads its body or starts a run.
pub(crate) fn agent_request(method: &Method, headers: &HeaderMap) -> Result<(), Refused> {
    if method != Method::POST {
        return Err(Refused::Method(method.to_string()));
    }
    browser_signals(headers)?;
    connect_content_type(headers)?;
    if headers
        .get("connect-protocol-version")
        .map(HeaderValue::as_bytes)
        != Some(b"1")
    {
        return Err(Refused::ProtocolVersion);
    }
    Ok(())
}

/// The check on the agent WebSocket's upgrade (a `GET`): a page may open a WebSocket to any
/// host without asking, so one that says it comes from a page or a browser is refused. Cursor's
/// agent host opens it from Node, which sends neither header.
pub(crate) fn agent_websocket(headers: &HeaderMap) -> Result<(), Refused> {
    browser_signals(headers)
}

/// The check on the calls served here on the user's model (titles, overviews, Cmd+K): refused
/// from a web page (an `http(s)` `Origin`), and unless a `POST` with a Connect content type,
/// which no page may send without a preflight. Cursor's workbench may send these from its own
/// window, whose origin is not a web one (`vscode-file://…`), so only web origins are refused.
pub(crate) fn model_call(method: &Method, headers: &HeaderMap) -> Result<(), Refused> {
    let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    if method != Method::POST {
        return Err(Refused::Method(method.to_string()));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let o = text(origin).to_ascii_lowercase();
        if o.starts_with("http://") || o.starts_with("https://") || o == "null" {
            return Err(Refused::Origin(text(origin)));
        }
    }
    connect_content_type(headers)
}

fn browser_signals(headers: &HeaderMap) -> Result<(), Refused> {
    let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    if let Some(origin) = headers.get(header::ORIGIN) {
        return Err(Refused::Origin(text(origin)));
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if !site.as_bytes().eq_ignore_ascii_case(b"none") {
            return Err(Refused::FetchSite(text(site)));
        }
    }
    Ok(())
}

fn connect_content_type(headers: &HeaderMap) -> Result<(), Refused> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if CONNECT_TYPES.contains(&essence.as_str()) {
        Ok(())
    } else {
        Err(Refused::ContentType(content_type))
    }
}

/// 403 with a Connect error body (`permission_denied`), and no CORS header: a page learns
/// nothing, and Cursor's clients read a clear error.
pub(crate) fn refused_response(refused: &Refused) -> Response<Body> {
    let message = format!(
        "cursor-byok: agent request refused: {refused}. Only Cursor's own clients may start or \
         join an agent run through cursor-byok; nothing was started"
    );
    let body = serde_json::json!({ "code": "permission_denied", "message": message });
    let mut resp = Response::new(full(body.to_string()));
    *resp.status_mut() = StatusCode::FORBIDDEN;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn cursors_requests_pass() {
        for ct in [
            "application/connect+proto",
            "application/proto",
            "Application/Proto; charset=binary",
            "application/connect+json",
        ] {
            let mut h = headers(&[("connect-protocol-version", "1")]);
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(ct).expect("value"),
            );
            assert_eq!(agent_request(&Method::POST, &h), Ok(()), "{ct}");
        }
        let h = headers(&[
            ("content-type", "application/proto"),
            ("connect-protocol-version", "1"),
            ("sec-fetch-site", "none"),
        ]);
        assert_eq!(agent_request(&Method::POST, &h), Ok(()));
        let h = headers(&[("content-type", "application/proto")]);
        assert_eq!(
            agent_request(&Method::POST, &h),
            Err(Refused::ProtocolVersion),
            "what every Connect client sends"
        );
    }

    /// What a page can send without a preflight, and what a browser adds to anything it sends.
    #[test]
    fn browser_shaped_requests_are_refused() {
        let cases: [(&[(&'static str, &'static str)], &str); 8] = [
            (
                &[("content-type", "text/plain;charset=UTF-8")],
                "sendBeacon",
            ),
            (
                &[("content-type", "application/octet-stream")],
                "octet-stream",
            ),
            (&[], "typeless"),
            (
                &[("content-type", "application/x-www-form-urlencoded")],
                "form",
            ),
            (
                &[("content-type", "multipart/form-data; boundary=x")],
                "multipart",
            ),
            (
                &[
                    ("content-type", "application/proto"),
                    ("origin", "https://evil.example"),
                ],
                "origin",
            ),
            (
                &[("content-type", "application/proto"), ("origin", "null")],
                "opaque origin",
            ),
            (
                &[
                    ("content-type", "application/connect+proto"),
                    ("sec-fetch-site", "cross-site"),
                ],
                "cross-site",
            ),
        ];
        for (pairs, what) in cases {
            assert!(
                agent_request(&Method::POST, &headers(pairs)).is_err(),
                "{what}"
            );
        }
        let h = headers(&[("content-type", "application/proto")]);
        assert!(agent_request(&Method::OPTIONS, &h).is_err(), "no preflight");
        assert!(agent_request(&Method::GET, &h).is_err());
    }

    #[test]
    fn the_refusal_is_a_connect_error_without_cors() {
        let resp = refused_response(&Refused::Origin("https://evil.example".into()));
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(resp
            .headers()
            .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .is_none());
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn the_websocket_and_model_calls_refuse_pages() {
        assert!(agent_websocket(&headers(&[])).is_ok());
        assert!(agent_websocket(&headers(&[("origin", "https://evil.example")])).is_err());
        assert!(agent_websocket(&headers(&[("sec-fetch-site", "cross-site")])).is_err());
        let call = |pairs: &[(&'static str, &'static str)]| {
            let mut h = headers(pairs);
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/proto"),
            );
            model_call(&Method::POST, &h)
        };
        assert!(call(&[]).is_ok());
        assert!(call(&[("origin", "vscode-file://vscode-app")]).is_ok());
        assert!(call(&[("origin", "https://evil.example")]).is_err());
        assert!(call(&[("origin", "null")]).is_err());
        assert!(
            model_call(&Method::POST, &headers(&[])).is_err(),
            "no content type"
        );
        let beacon = headers(&[("content-type", "text/plain;charset=UTF-8")]);
        assert!(model_call(&Method::POST, &beacon).is_err());
    }
}
