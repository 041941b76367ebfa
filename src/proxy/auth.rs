//! `Proxy-Authorization: Basic` for the proxy listener.

use base64::Engine;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use crate::config::ProxyAuth;
use crate::http::{full, Body};

/// The expected `user:password`, compared without early exit.
pub(crate) struct ProxyAuthCheck {
    expected: Vec<u8>,
}

impl ProxyAuthCheck {
    pub(crate) fn new(auth: &ProxyAuth) -> Self {
        ProxyAuthCheck {
            expected: format!("{}:{}", auth.username, auth.password.expose()).into_bytes(),
        }
    }

    pub(crate) fn allows(&self, headers: &HeaderMap) -> bool {
        self.allows_in(headers, header::PROXY_AUTHORIZATION)
    }

    /// The same credentials as `Authorization: Basic` (the listener's own pages, in a browser).
    pub(crate) fn allows_origin(&self, headers: &HeaderMap) -> bool {
        self.allows_in(headers, header::AUTHORIZATION)
    }

    fn allows_in(&self, headers: &HeaderMap, name: header::HeaderName) -> bool {
        let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some((scheme, encoded)) = value.trim().split_once(' ') else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("basic") {
            return false;
        }
        match base64::engine::general_purpose::STANDARD.decode(encoded.trim()) {
            Ok(given) => constant_time_eq(&given, &self.expected),
            Err(_) => false,
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn required() -> Response<Body> {
    let mut resp = Response::new(full("cursor-byok: proxy authentication required\n"));
    *resp.status_mut() = StatusCode::PROXY_AUTHENTICATION_REQUIRED;
    resp.headers_mut().insert(
        header::PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"cursor-byok\""),
    );
    resp
}

/// 401 for the listener's own pages: browsers prompt for `Authorization: Basic`.
pub(crate) fn origin_required() -> Response<Body> {
    let mut resp = Response::new(full("cursor-byok: authentication required\n"));
    *resp.status_mut() = StatusCode::UNAUTHORIZED;
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"cursor-byok\""),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    #[test]
    fn checks_basic_credentials() {
        let check = ProxyAuthCheck::new(&ProxyAuth {
            username: "me".into(),
            password: Secret::new("pw"),
        });
        let mut headers = HeaderMap::new();
        assert!(!check.allows(&headers));
        headers.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic bWU6cHc="),
        );
        assert!(check.allows(&headers));
        headers.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("basic bWU6cHg="),
        );
        assert!(!check.allows(&headers));
        headers.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Bearer bWU6cHc="),
        );
        assert!(!check.allows(&headers));
    }
}
