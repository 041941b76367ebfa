//! Whose run it is on the HTTP/1.1 transport: a run is bound to the client that opened its
//! request id first (its `RunSSE` or its first append), by a digest of the credential that
//! client showed Cursor (`authorization`). A `RunSSE` or an append on the same request id from
//! a client showing another credential is refused: it can neither take over the run's output
//! nor answer its execs. The request id alone is not a secret enough to guard a run (it is
//! logged by clients, and any local process can guess at live ones).
//!
//! The bindings live beside the pairing entries, keyed by entry, and go with them: an entry
//! forgotten by the pairing is no longer upgradable here and its binding is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use http::HeaderMap;
use sha2::{Digest, Sha256};

use super::pairing::Entry;
use crate::connect::{Code, ConnectError};

/// A digest of the credential a client showed; never the credential itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity([u8; 32]);

impl Identity {
    fn of(headers: &HeaderMap) -> Identity {
        let mut hash = Sha256::new();
        hash.update(b"cursor-byok run owner\0");
        for value in headers.get_all(http::header::AUTHORIZATION) {
            hash.update(value.as_bytes());
            hash.update(b"\0");
        }
        Identity(hash.finalize().into())
    }
}

struct Binding {
    entry: Weak<Entry>,
    owner: Identity,
}

/// Entry address → its owner. An address is reused only after its entry is gone, which the
/// `Weak` tells.
fn bindings() -> &'static Mutex<HashMap<usize, Binding>> {
    static BINDINGS: OnceLock<Mutex<HashMap<usize, Binding>>> = OnceLock::new();
    BINDINGS.get_or_init(Default::default)
}

/// Binds `entry`'s run to the client of `headers` when it is the first to come, or checks
/// that it is the same client. The error is what the other client is answered.
pub(super) fn claim(entry: &Arc<Entry>, headers: &HeaderMap) -> Result<(), ConnectError> {
    let who = Identity::of(headers);
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
    ConnectError::new(
        Code::PermissionDenied,
        format!(
            "cursor-byok: agent run {request_id} belongs to another client (it was started with \
             other credentials); its output and its messages stay with the client that \
             started it"
        ),
    )
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
