//! The context items Cmd+K acknowledged, so the client may send them again as hashes.
//!
//! The client sends an item as its hash only after the server acknowledged that hash
//! (`ContextItemStatus.context_item_hash`). Only items held here are acknowledged; a hash that
//! is not held (never acknowledged, or evicted since) is asked for again with
//! `missing_context_items`. Items are kept per client session (the caller's credential, hashed:
//! two logins never see each other's items), bounded in sessions, items and bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use prost::Message;

use crate::proto::aiserver::v1 as pb;

/// How much the cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    pub sessions: usize,
    pub(crate) items_per_session: usize,
    pub(crate) bytes_per_session: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        // The client keeps at most 1,000 items per intent and re-sends what was evicted.
        CacheLimits {
            sessions: 8,
            items_per_session: 2_000,
            bytes_per_session: 16 * 1024 * 1024,
        }
    }
}

/// A request's items with every hash resolved, and the acknowledgements to send.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    Items {
        items: Vec<pb::ContextItem>,
        statuses: Vec<pb::ContextItemStatus>,
    },
    /// Hashes this cache does not hold: the client must send those items in full.
    Missing(Vec<String>),
}

/// See the module documentation. Shared by every Cmd+K of the process.
#[derive(Debug, Default)]
pub(crate) struct ContextCache {
    inner: Mutex<Sessions>,
    limits: CacheLimits,
}

#[derive(Debug, Default)]
struct Sessions {
    map: HashMap<String, CachedSession>,
    /// Least recently used first.
    order: VecDeque<String>,
}

#[derive(Debug, Default)]
struct CachedSession {
    items: HashMap<String, pb::ContextItem>,
    order: VecDeque<(String, usize)>,
    bytes: usize,
}

/// The hash Cmd+K acknowledges an item under: SHA-256 of its encoding, in hex.
pub fn item_hash(item: &pb::ContextItem) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(item.encode_to_vec());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl ContextCache {
    pub fn new(limits: CacheLimits) -> Self {
        ContextCache {
            inner: Mutex::default(),
            limits,
        }
    }

    /// Resolve `items` for `session`: full items are kept (and acknowledged when kept),
    /// hashes are looked up. Any hash not held makes the answer [`Resolved::Missing`].
    pub fn resolve(&self, session: &str, items: &[pb::PotentiallyCachedContextItem]) -> Resolved {
        use pb::potentially_cached_context_item::Item;
        let mut sessions = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let held = sessions.session(session, self.limits.sessions);
        let mut out = Vec::with_capacity(items.len());
        let mut statuses = Vec::new();
        let mut missing = Vec::new();
        for item in items {
            match &item.item {
                Some(Item::ContextItem(full)) => {
                    let hash = item_hash(full);
                    if held.keep(&hash, full, self.limits) {
                        statuses.push(acknowledged(hash));
                    }
                    out.push(full.clone());
                }
                Some(Item::ContextItemHash(hash)) => match held.get(hash) {
                    Some(full) => {
                        statuses.push(acknowledged(hash.clone()));
                        out.push(full);
                    }
                    None => missing.push(hash.clone()),
                },
                None => {}
            }
        }
        if missing.is_empty() {
            Resolved::Items {
                items: out,
                statuses,
            }
        } else {
            Resolved::Missing(missing)
        }
    }

    /// Items and bytes held for `session`.
    #[cfg(test)]
    pub fn held(&self, session: &str) -> (usize, usize) {
        let sessions = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .map
            .get(session)
            .map_or((0, 0), |s| (s.items.len(), s.bytes))
    }
}

fn acknowledged(hash: String) -> pb::ContextItemStatus {
    pb::ContextItemStatus {
        context_item_hash: hash,
        shown_to_the_model: true,
        score: 1.0,
        ..Default::default()
    }
}

impl Sessions {
    /// `key`'s session, made the most recently used; the least recently used goes past `max`.
    fn session(&mut self, key: &str, max: usize) -> &mut CachedSession {
        if let Some(pos) = self.order.iter().position(|k| k == key) {
            self.order.remove(pos);
        }
        self.order.push_back(key.to_string());
        while self.order.len() > max.max(1) {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        self.map.entry(key.to_string()).or_default()
    }
}

impl CachedSession {
    /// Keep `item` under `hash`, evicting the oldest items past the limits. An item larger
    /// than a whole session is not kept (and so never acknowledged).
    fn keep(&mut self, hash: &str, item: &pb::ContextItem, limits: CacheLimits) -> bool {
        if self.items.contains_key(hash) {
            return true;
        }
        let size = item.encoded_len();
        if size > limits.bytes_per_session {
            return false;
        }
        while !self.order.is_empty()
            && (self.items.len() >= limits.items_per_session
                || self.bytes + size > limits.bytes_per_session)
        {
            if let Some((old, old_size)) = self.order.pop_front() {
                self.items.remove(&old);
                self.bytes -= old_size;
            }
        }
        self.items.insert(hash.to_string(), item.clone());
        self.order.push_back((hash.to_string(), size));
        self.bytes += size;
        true
    }

    fn get(&self, hash: &str) -> Option<pb::ContextItem> {
        self.items.get(hash).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::potentially_cached_context_item::Item;

    fn query(text: &str) -> pb::ContextItem {
        pb::ContextItem {
            item: Some(pb::context_item::Item::CmdKQuery(
                pb::context_item::CmdKQuery { query: text.into() },
            )),
            ..Default::default()
        }
    }

    fn full(item: pb::ContextItem) -> pb::PotentiallyCachedContextItem {
        pb::PotentiallyCachedContextItem {
            item: Some(Item::ContextItem(item)),
        }
    }

    fn hashed(hash: &str) -> pb::PotentiallyCachedContextItem {
        pb::PotentiallyCachedContextItem {
            item: Some(Item::ContextItemHash(hash.into())),
        }
    }

    #[test]
    fn acknowledged_items_resolve_by_hash_in_their_session_only() {
        let cache = ContextCache::default();
        let item = query("rename x");
        let h = item_hash(&item);
        let Resolved::Items { statuses, .. } = cache.resolve("s1", &[full(item.clone())]) else {
            panic!("a full item resolves");
        };
        assert_eq!(statuses[0].context_item_hash, h);
        assert_eq!(
            cache.resolve("s1", &[hashed(&h)]),
            Resolved::Items {
                items: vec![item],
                statuses: vec![acknowledged(h.clone())],
            }
        );
        assert_eq!(
            cache.resolve("s2", &[hashed(&h), hashed("nope")]),
            Resolved::Missing(vec![h, "nope".into()])
        );
    }

    #[test]
    fn sessions_items_and_bytes_are_bounded() {
        let limits = CacheLimits {
            sessions: 2,
            items_per_session: 3,
            bytes_per_session: 64,
        };
        let cache = ContextCache::new(limits);
        for i in 0..5 {
            let _ = cache.resolve("s", &[full(query(&format!("q{i}")))]);
        }
        assert_eq!(cache.held("s").0, 3);
        // Over the byte bound: used for this call, never kept nor acknowledged.
        let big = query(&"x".repeat(100));
        let Resolved::Items { items, statuses } = cache.resolve("s", &[full(big)]) else {
            panic!()
        };
        assert_eq!((items.len(), statuses.len()), (1, 0));
        assert!(cache.held("s").1 <= 64);
        let _ = cache.resolve("a", &[]);
        let _ = cache.resolve("b", &[]);
        assert_eq!(
            cache.held("s"),
            (0, 0),
            "the least recently used session went"
        );
    }
}
