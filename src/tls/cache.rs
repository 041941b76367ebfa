//! A bounded cache of ready server configs, one per host.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rustls::ServerConfig;

use super::leaf::{normalize_host, LeafMinter};
use super::{CertificateAuthority, TlsError};

/// Hosts kept before the oldest entry is evicted. Cursor talks to a handful of hosts; the bound
/// only stops a hostile client from growing memory with made-up names.
pub const DEFAULT_CAPACITY: usize = 1_000;

/// Mints leaves on demand and keeps the resulting `ServerConfig`s. Concurrent misses for the
/// same host may mint twice; the last one wins, both are valid.
#[derive(Debug)]
pub struct CertStore {
    minter: LeafMinter,
    capacity: usize,
    cache: Mutex<Cache>,
}

#[derive(Debug, Default)]
struct Cache {
    configs: HashMap<String, Arc<ServerConfig>>,
    order: VecDeque<String>,
}

impl CertStore {
    pub fn new(ca: Arc<CertificateAuthority>) -> Result<Self, TlsError> {
        Self::with_capacity(ca, DEFAULT_CAPACITY)
    }

    pub fn with_capacity(ca: Arc<CertificateAuthority>, capacity: usize) -> Result<Self, TlsError> {
        Ok(CertStore {
            minter: LeafMinter::new(ca)?,
            capacity: capacity.max(1),
            cache: Mutex::new(Cache::default()),
        })
    }

    pub fn minter(&self) -> &LeafMinter {
        &self.minter
    }

    /// The server config for `host`, minted on a miss.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        let host = normalize_host(host)?;
        if let Some(hit) = self.lock().configs.get(&host) {
            return Ok(hit.clone());
        }
        // Mint outside the lock: a signature is the slow part and other hosts need not wait.
        let config = self.minter.server_config(&host)?;
        let mut cache = self.lock();
        if cache.configs.insert(host.clone(), config.clone()).is_none() {
            cache.order.push_back(host);
        }
        while cache.configs.len() > self.capacity {
            match cache.order.pop_front() {
                Some(oldest) => {
                    cache.configs.remove(&oldest);
                }
                None => break,
            }
        }
        Ok(config)
    }

    pub fn len(&self) -> usize {
        self.lock().configs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding the lock leaves a consistent map (inserts are single calls).
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(capacity: usize) -> (tempfile::TempDir, CertStore) {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = CertificateAuthority::load_or_create(dir.path()).unwrap();
        let store = CertStore::with_capacity(Arc::new(ca), capacity).unwrap();
        (dir, store)
    }

    #[test]
    fn hit_returns_the_same_config() {
        let (_dir, store) = store(4);
        let a = store.server_config("api2.cursor.sh").unwrap();
        let b = store.server_config("API2.cursor.sh.").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn bounded_evicts_oldest() {
        let (_dir, store) = store(2);
        let first = store.server_config("a.cursor.sh").unwrap();
        store.server_config("b.cursor.sh").unwrap();
        store.server_config("c.cursor.sh").unwrap();
        assert_eq!(store.len(), 2);
        let again = store.server_config("a.cursor.sh").unwrap();
        assert!(!Arc::ptr_eq(&first, &again), "a was evicted and re-minted");
    }
}
