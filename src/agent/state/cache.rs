//! A bounded, content-addressed blob cache on disk: `<data_dir>/blobs/ab/abcdef…` (lowercase
//! hex of the SHA-256 id, sharded by its first byte).
//!
//! It saves KV round trips to the client on the next turn, and is never authoritative: every
//! failure (unreadable directory, full disk, a corrupt file) only means "ask the client". Reads
//! verify the SHA-256 and delete files that fail it; writes go to a temporary file renamed into
//! place, so a reader never sees a partial blob. Files are 0600 and directories 0700 on Unix:
//! they hold conversation content.
//!
//! The total size is bounded: when a write takes it over `max_bytes`, the least recently used
//! blobs (by mtime; reads touch it) are deleted down to 90 % of the bound.
//!
//! The methods are synchronous `std::fs`; from async code use [`BlobCache::get_many`] and
//! [`BlobCache::put_many`], which run on tokio's blocking pool.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tracing::{debug, warn};

use super::blob::{self, Blob, BlobId};

/// Default bound of the cache.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Temporary files older than this are leftovers of a crash, removed during eviction.
const STALE_TEMP: Duration = Duration::from_secs(600);

/// Distinguishes temporary files of concurrent writes within the process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The on-disk blob cache. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub(crate) struct BlobCache {
    inner: Arc<BlobCacheShared>,
}

#[derive(Debug)]
struct BlobCacheShared {
    root: PathBuf,
    max_bytes: u64,
    /// Bytes on disk, once scanned (`None` until the first write). Also serialises eviction.
    size: Mutex<Option<u64>>,
}

impl BlobCache {
    /// A cache under `<data_dir>/blobs`, holding at most `max_bytes` (0 disables it). Touches
    /// nothing on disk until used.
    pub fn new(data_dir: &Path, max_bytes: u64) -> BlobCache {
        BlobCache {
            inner: Arc::new(BlobCacheShared {
                root: data_dir.join("blobs"),
                max_bytes,
                size: Mutex::new(None),
            }),
        }
    }

    fn path(&self, id: &BlobId) -> PathBuf {
        let hex = hex::encode(id);
        self.inner.root.join(&hex[..2]).join(hex)
    }

    /// The blob's bytes, if cached and intact.
    pub fn get(&self, id: &BlobId) -> Option<Bytes> {
        if self.inner.max_bytes == 0 {
            return None;
        }
        let path = self.path(id);
        let data = match fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                debug!(path = %path.display(), "blob cache read failed: {e}");
                return None;
            }
        };
        if !blob::verify(id, &data) {
            warn!(path = %path.display(), "corrupt blob in the cache; removing it");
            if fs::remove_file(&path).is_ok() {
                self.account(-(data.len() as i64));
            }
            return None;
        }
        touch(&path);
        Some(Bytes::from(data))
    }

    /// Store a blob (a no-op when already there, or larger than the whole cache).
    pub fn put(&self, blob: &Blob) -> io::Result<()> {
        let len = blob.data.len() as u64;
        if self.inner.max_bytes == 0 || len > self.inner.max_bytes {
            return Ok(());
        }
        let path = self.path(&blob.id);
        if fs::metadata(&path).is_ok_and(|m| m.len() == len) {
            touch(&path);
            return Ok(());
        }
        let dir = path.parent().unwrap_or(&self.inner.root);
        create_private_dir(dir)?;
        let tmp = dir.join(format!(
            ".tmp-{}-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed),
            blob.hex_id()
        ));
        let written = write_private(&tmp, &blob.data).and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.account(len as i64);
        self.evict_if_needed();
        Ok(())
    }

    /// Look up several blobs on the blocking pool; `None` for each one not cached.
    pub(crate) async fn get_many(&self, ids: Vec<BlobId>) -> Vec<(BlobId, Option<Bytes>)> {
        let cache = self.clone();
        let fallback: Vec<(BlobId, Option<Bytes>)> = ids.iter().map(|id| (*id, None)).collect();
        tokio::task::spawn_blocking(move || {
            ids.into_iter().map(|id| (id, cache.get(&id))).collect()
        })
        .await
        .unwrap_or(fallback)
    }

    /// Store several blobs on the blocking pool; failures are logged, never returned.
    pub(crate) async fn put_many(&self, blobs: Vec<Blob>) {
        let cache = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for b in &blobs {
                if let Err(e) = cache.put(b) {
                    debug!(blob = %b.hex_id(), "blob cache write failed: {e}");
                }
            }
        })
        .await;
    }

    /// Adjust the known size (when known).
    fn account(&self, delta: i64) {
        let mut size = self.inner.size.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = size.as_mut() {
            *s = s.saturating_add_signed(delta);
        }
    }

    fn evict_if_needed(&self) {
        let mut size = self.inner.size.lock().unwrap_or_else(|p| p.into_inner());
        let max = self.inner.max_bytes;
        if size.is_some_and(|s| s <= max) {
            return;
        }
        // First write since start (or over the bound): scan for the truth.
        let mut files = self.scan();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        if total > max {
            let target = max / 10 * 9;
            files.sort_by_key(|f| f.2);
            for (path, len, _) in &files {
                if total <= target {
                    break;
                }
                if fs::remove_file(path).is_ok() {
                    total -= len;
                }
            }
            debug!(bytes = total, "blob cache evicted down to its bound");
        }
        *size = Some(total);
    }

    /// Every cached blob: path, length, mtime. Removes stale temporary files on the way.
    fn scan(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let mut out = Vec::new();
        let Ok(shards) = fs::read_dir(&self.inner.root) else {
            return out;
        };
        let now = SystemTime::now();
        for shard in shards.flatten() {
            let Ok(entries) = fs::read_dir(shard.path()) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(meta) = e.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(".tmp-") {
                    if now.duration_since(mtime).unwrap_or_default() > STALE_TEMP {
                        let _ = fs::remove_file(e.path());
                    }
                    continue;
                }
                if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
                    out.push((e.path(), meta.len(), mtime));
                }
            }
        }
        out
    }
}

/// Mark a blob as recently used (eviction goes by mtime).
fn touch(path: &Path) {
    if let Ok(f) = fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
}

fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut o = fs::File::options();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o.open(path)?;
    f.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(n: usize, fill: u8) -> Blob {
        Blob::new(vec![fill; n])
    }

    #[test]
    fn put_then_get() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlobCache::new(dir.path(), DEFAULT_MAX_BYTES);
        let b = blob(100, 1);
        assert_eq!(cache.get(&b.id), None);
        cache.put(&b).unwrap();
        cache.put(&b).unwrap(); // idempotent
        assert_eq!(cache.get(&b.id), Some(b.data.clone()));
        let hex = b.hex_id();
        let path = dir.path().join("blobs").join(&hex[..2]).join(&hex);
        assert!(path.is_file());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
            let shard = path.parent().unwrap();
            assert_eq!(
                fs::metadata(shard).unwrap().permissions().mode() & 0o777,
                0o700
            );
        }
        // No temporary files left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn corrupt_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlobCache::new(dir.path(), DEFAULT_MAX_BYTES);
        let b = blob(10, 2);
        cache.put(&b).unwrap();
        let hex = b.hex_id();
        let path = dir.path().join("blobs").join(&hex[..2]).join(&hex);
        fs::write(&path, b"tampered").unwrap();
        assert_eq!(cache.get(&b.id), None);
        assert!(!path.exists());
        cache.put(&b).unwrap();
        assert_eq!(cache.get(&b.id), Some(b.data));
    }

    #[test]
    fn evicts_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlobCache::new(dir.path(), 1000);
        let old = blob(400, 1);
        let used = blob(400, 2);
        cache.put(&old).unwrap();
        cache.put(&used).unwrap();
        // Make `old` clearly older, then read `used` (which touches it).
        let hex = old.hex_id();
        let old_path = dir.path().join("blobs").join(&hex[..2]).join(&hex);
        fs::File::options()
            .append(true)
            .open(&old_path)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
        assert!(cache.get(&used.id).is_some());
        let new = blob(400, 3);
        cache.put(&new).unwrap();
        assert_eq!(cache.get(&old.id), None);
        assert!(cache.get(&used.id).is_some());
        assert!(cache.get(&new.id).is_some());
        // Too big for the whole cache: silently not stored.
        let huge = blob(2000, 4);
        cache.put(&huge).unwrap();
        assert_eq!(cache.get(&huge.id), None);
    }

    #[test]
    fn an_unusable_directory_is_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        fs::write(&file, b"x").unwrap();
        let cache = BlobCache::new(&file, DEFAULT_MAX_BYTES);
        let b = blob(10, 5);
        assert!(cache.put(&b).is_err());
        assert_eq!(cache.get(&b.id), None);
        let disabled = BlobCache::new(dir.path(), 0);
        disabled.put(&b).unwrap();
        assert_eq!(disabled.get(&b.id), None);
    }

    #[tokio::test]
    async fn async_wrappers() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlobCache::new(dir.path(), DEFAULT_MAX_BYTES);
        let a = blob(5, 1);
        let b = blob(5, 2);
        cache.put_many(vec![a.clone()]).await;
        let got = cache.get_many(vec![a.id, b.id]).await;
        assert_eq!(got, vec![(a.id, Some(a.data)), (b.id, None)]);
    }
}
