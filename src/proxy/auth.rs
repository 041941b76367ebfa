//! `Proxy-Authorization: Basic` for the proxy listener, and the direct doors' credential check.

use base64::Engine;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use crate::config::{Config, ProxyAuth};
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

/// The header a direct-door client sends the door token in (`[direct] token`).
pub(crate) const DOOR_TOKEN: &str = "x-cursor-byok-token";

/// The direct doors' check: the door token in [`DOOR_TOKEN`], or `proxy_auth`'s credentials
/// as `Proxy-Authorization: Basic`.
pub(crate) struct DoorCheck {
    token: Option<Vec<u8>>,
    basic: Option<ProxyAuthCheck>,
}

impl DoorCheck {
    /// A check when the config asks for one: a door token is set, or a direct door listens
    /// beyond loopback (which the config allows only with `proxy_auth` or a token).
    pub(crate) fn from_config(config: &Config) -> Option<Self> {
        let token = config.direct.token.as_ref();
        if token.is_none() && !config.direct.exposed() {
            return None;
        }
        Some(DoorCheck {
            token: token.map(|t| t.expose().as_bytes().to_vec()),
            basic: config.proxy_auth.as_ref().map(ProxyAuthCheck::new),
        })
    }

    pub(crate) fn allows(&self, headers: &HeaderMap) -> bool {
        let token = match (&self.token, headers.get(DOOR_TOKEN)) {
            (Some(expected), Some(given)) => constant_time_eq(given.as_bytes(), expected),
            _ => false,
        };
        token || self.basic.as_ref().is_some_and(|b| b.allows(headers))
    }

    /// Take the credentials off a request before it goes on: they are ours, not Cursor's.
    pub(crate) fn strip(headers: &mut HeaderMap) {
        headers.remove(DOOR_TOKEN);
        headers.remove(header::PROXY_AUTHORIZATION);
    }
}

/// 401 for a direct-door request without the door's credential.
pub(crate) fn door_required() -> Response<Body> {
    let mut resp = Response::new(full(
        "cursor-byok: this door needs the door token in x-cursor-byok-token ([direct] token) \
         or the [proxy_auth] credentials as Proxy-Authorization\n",
    ));
    *resp.status_mut() = StatusCode::UNAUTHORIZED;
    resp
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 407 for a listener client without the credentials, saying how a client gets them.
pub(crate) fn required() -> Response<Body> {
    let mut resp = Response::new(full(
        "cursor-byok: proxy authentication required. This proxy serves only its own user's \
         clients: run `cursor-byok setup cursor` and restart Cursor (Cursor's \"http.proxy\" \
         then carries the credentials; the per-install secret is the file proxy-secret in \
         cursor-byok's data directory, user cursor-byok, unless [proxy_auth] names others). \
         For the OS proxy setting, which cannot carry credentials, set open_listener = true \
         in the config: every local user can then use the proxy.\n",
    ));
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
    use crate::base::secret::Secret;

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

    fn door(extra: &str) -> Option<DoorCheck> {
        let text = format!("[direct]\nhttp_listen = \"127.0.0.1:0\"\n{extra}");
        DoorCheck::from_config(&Config::from_toml(&text, "t").unwrap())
    }

    #[test]
    fn door_check_takes_the_token_or_basic() {
        assert!(door("").is_none(), "loopback without a token: no check");
        let check = door("token = \"door-token-0123456789\"\n").unwrap();
        let mut headers = HeaderMap::new();
        assert!(!check.allows(&headers));
        headers.insert(
            DOOR_TOKEN,
            HeaderValue::from_static("door-token-012345678X"),
        );
        assert!(!check.allows(&headers));
        headers.insert(
            DOOR_TOKEN,
            HeaderValue::from_static("door-token-0123456789"),
        );
        assert!(check.allows(&headers));
        DoorCheck::strip(&mut headers);
        assert!(headers.is_empty());

        let text = "[proxy_auth]\nusername = \"me\"\npassword = \"pw\"\n\
                    [direct]\nhttp_listen = \"0.0.0.0:0\"\n";
        let check = DoorCheck::from_config(&Config::from_toml(text, "t").unwrap()).unwrap();
        let mut headers = HeaderMap::new();
        assert!(!check.allows(&headers));
        headers.insert(DOOR_TOKEN, HeaderValue::from_static("anything-at-all-here"));
        assert!(!check.allows(&headers), "no token configured");
        headers.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic bWU6cHc="),
        );
        assert!(check.allows(&headers));
    }
}
