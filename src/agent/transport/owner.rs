//! Whose run it is on the HTTP/1.1 transport: a run is bound to the client that opened its
//! request id first (its `RunSSE` or its first append), by a digest of who that client is to
//! Cursor: the account (`sub`) of its `authorization` bearer token when that is a JWT (Cursor's
//! access tokens are, and a token refreshed mid-run names the same account), else the whole
//! header. A `RunSSE` or an append on the same request id from a client that is someone else
//! is refused: it can neither take over the run's output nor answer its execs. The request id
//! alone is not secret enough to guard a run (clients log it, and it travels in headers).
//!
//! The bindings live beside the pairing entries, keyed by entry, and go with them: an entry
//! forgotten by the pairing is no longer upgradable here and its binding is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use http::HeaderMap;
use sha2::{Digest, Sha256};

use super::pairing::RequestPairing;
use crate::connect::{Code, ConnectError};

/// A digest of the credential a client showed; never the credential itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CredentialDigest([u8; 32]);

impl CredentialDigest {
    fn of(headers: &HeaderMap) -> CredentialDigest {
        let mut hash = Sha256::new();
        hash.update(b"cursor-byok run owner\0");
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        match (values.next(), values.next()) {
            (Some(one), None) => match account(one.as_bytes()) {
                Some(sub) => {
                    hash.update(b"sub\0");
                    hash.update(sub.as_bytes());
                }
                None => {
                    hash.update(b"header\0");
                    hash.update(one.as_bytes());
                }
            },
            (None, _) => hash.update(b"none"),
            (Some(one), Some(two)) => {
                hash.update(b"several\0");
                for value in [one, two].into_iter().chain(values) {
                    hash.update(value.as_bytes());
                    hash.update(b"\0");
                }
            }
        }
        CredentialDigest(hash.finalize().into())
    }
}

/// The `sub` claim of a `Bearer` JWT (its signature is not ours to check: the digest only
/// tells accounts apart).
fn account(value: &[u8]) -> Option<String> {
    use base64::Engine;
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut parts = token.trim().split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else {
        return None;
    };
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&json).ok()?;
    claims["sub"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

struct Binding {
    entry: Weak<RequestPairing>,
    owner: CredentialDigest,
}

/// Pairing address → its owner. An address is reused only after its entry is gone, which the
/// `Weak` tells.
fn bindings() -> &'static Mutex<HashMap<usize, Binding>> {
    static BINDINGS: OnceLock<Mutex<HashMap<usize, Binding>>> = OnceLock::new();
    BINDINGS.get_or_init(Default::default)
}

/// Binds `entry`'s run to the client of `headers` when it is the first to come, or checks
/// that it is the same client. The error is what the other client is answered.
pub(super) fn claim(entry: &Arc<RequestPairing>, headers: &HeaderMap) -> Result<(), ConnectError> {
    let who = CredentialDigest::of(headers);
    let key = Arc::as_ptr(entry) as usize;
    let mut map = bindings().lock().unwrap_or_else(|p| p.into_inner());
    match map.get(&key) {
        Some(b) if b.entry.upgrade().is_some_and(|e| Arc::ptr_eq(&e, entry)) => {
            if b.owner == who {
                return Ok(());
            }
            tracing::warn!(
                request_id = %entry.request_id,
                "a client other than the run's own asked for it: refused"
            );
            return Err(not_yours(&entry.request_id));
        }
        _ => {}
    }
    // Dead bindings go when a new one comes: the map stays as large as the live entries.
    map.retain(|_, b| b.entry.strong_count() > 0);
    map.insert(
        key,
        Binding {
            entry: Arc::downgrade(entry),
            owner: who,
        },
    );
    Ok(())
}

fn not_yours(request_id: &str) -> ConnectError {
    use crate::proto::aiserver::v1 as aiserver;
    let message = format!(
        "cursor-byok: agent run {request_id} belongs to another client (it was started with \
         other credentials); its output and its messages stay with the client that started it"
    );
    let details = aiserver::ErrorDetails {
        error: aiserver::error_details::Error::CustomMessage as i32,
        details: Some(aiserver::CustomErrorDetails {
            title: "This agent run is another client's".to_string(),
            detail: message.clone(),
            is_retryable: Some(false),
            ..Default::default()
        }),
        is_expected: Some(true),
    };
    ConnectError::new(Code::PermissionDenied, message)
        .with_detail(crate::connect::ErrorDetail::error_details(&details))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::transport::pairing::Pairings;
    use http::HeaderValue;

    fn with_auth(token: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, HeaderValue::from_static(token));
        h
    }

    #[test]
    fn the_first_client_owns_the_run_and_another_is_refused() {
        let pairings = Pairings::default();
        let entry = pairings.get_or_create("req-1").expect("entry");
        let owner = with_auth("Bearer owner-token");
        assert!(claim(&entry, &owner).is_ok());
        assert!(claim(&entry, &owner).is_ok(), "the owner again");
        let err = claim(&entry, &with_auth("Bearer someone-else")).expect_err("a taker");
        assert_eq!(err.code, Code::PermissionDenied);
        assert!(claim(&entry, &HeaderMap::new()).is_err(), "no credential");
        assert!(!err.message.contains("owner-token"));
    }

    fn jwt(sub: &str, iat: u64) -> String {
        use base64::Engine;
        let enc = |v: serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!(
            "Bearer {}.{}.c2ln",
            enc(serde_json::json!({"alg": "HS256"})),
            enc(serde_json::json!({"sub": sub, "iat": iat}))
        )
    }

    /// A token refreshed mid-run names the same account: still the owner. Another account is
    /// not.
    #[test]
    fn the_owner_is_the_account_of_a_jwt() {
        let pairings = Pairings::default();
        let entry = pairings.get_or_create("req-jwt").expect("entry");
        let headers = |token: String| {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::AUTHORIZATION,
                HeaderValue::from_str(&token).expect("value"),
            );
            h
        };
        assert!(claim(&entry, &headers(jwt("user_1", 1))).is_ok());
        assert!(
            claim(&entry, &headers(jwt("user_1", 2))).is_ok(),
            "refreshed"
        );
        assert!(claim(&entry, &headers(jwt("user_2", 1))).is_err());
        assert_eq!(account(b"Bearer not-a-jwt"), None);
        assert_eq!(account(jwt("u", 1).as_bytes()).as_deref(), Some("u"));
    }

    #[test]
    fn a_binding_goes_with_its_entry() {
        let one = Pairings::default();
        let first = one.get_or_create("req-2").expect("entry");
        assert!(claim(&first, &with_auth("Bearer a")).is_ok());
        let two = Pairings::default();
        let other = two.get_or_create("req-2").expect("entry");
        assert!(
            claim(&other, &with_auth("Bearer b")).is_ok(),
            "another entry"
        );
        drop((first, one));
        for _ in 0..8 {
            let again = Pairings::default();
            let fresh = again.get_or_create("req-2").expect("entry");
            assert!(
                claim(&fresh, &with_auth("Bearer c")).is_ok(),
                "a fresh entry"
            );
        }
    }
}
