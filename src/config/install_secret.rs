//! The per-install secret that makes the proxy one user's: generated at first start into the
//! data directory (a `0600` file), it is the password of the listener's default
//! `Proxy-Authorization: Basic` credentials (user [`USERNAME`]) when `proxy_auth` is unset.
//! `setup cursor` writes it into Cursor's `http.proxy` URL, whose credentials Cursor sends on
//! its CONNECTs; another local user, who cannot read the file, gets a 407.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::base::secret::Secret;

/// The user name of the default credentials.
pub const USERNAME: &str = "cursor-byok";
/// The file in the data directory that holds the secret.
pub const FILE: &str = "proxy-secret";
/// Random bytes in a secret (hex-encoded in the file and the URL).
const BYTES: usize = 24;

/// Why the secret could not be read or made.
#[derive(Debug, thiserror::Error)]
#[error("the proxy's secret {path}: {source}")]
pub struct SecretError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The secret in `data_dir`, made (`0600`, its folder `0700` when new) when there is none.
pub fn load_or_create(data_dir: &Path) -> Result<Secret, SecretError> {
    let path = data_dir.join(FILE);
    let err = |source| SecretError {
        path: path.clone(),
        source,
    };
    match read(&path) {
        Ok(Some(secret)) => return Ok(secret),
        Ok(None) => {}
        Err(e) => return Err(err(e)),
    }
    create_dir(data_dir).map_err(err)?;
    let value = hex::encode(rand::random::<[u8; BYTES]>());
    match create(&path, &value) {
        Ok(()) => Ok(Secret::new(value)),
        // Another process made it first: theirs is the one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read(&path) {
            Ok(Some(secret)) => Ok(secret),
            Ok(None) => Err(err(std::io::Error::other("the file is empty"))),
            Err(e) => Err(err(e)),
        },
        Err(e) => Err(err(e)),
    }
}

/// The secret in `path`; `None` when there is no file (or an empty one from a torn write).
fn read(path: &Path) -> std::io::Result<Option<Secret>> {
    let mut text = String::new();
    match std::fs::File::open(path) {
        Ok(f) => f.take(1024).read_to_string(&mut text)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let value = text.trim();
    Ok((!value.is_empty()).then(|| Secret::new(value)))
}

fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Writes a new file only (never one that is there), readable by this user alone.
fn create(path: &Path, value: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = match options.open(path) {
        Ok(f) => f,
        // A torn earlier write left an empty file: make it again.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && is_empty(path) => {
            std::fs::remove_file(path)?;
            options.open(path)?
        }
        Err(e) => return Err(e),
    };
    file.write_all(format!("{value}\n").as_bytes())?;
    file.sync_all()
}

fn is_empty(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_then_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let first = load_or_create(&data).expect("made");
        assert_eq!(first.expose().len(), BYTES * 2);
        let again = load_or_create(&data).expect("read");
        assert_eq!(first.expose(), again.expose());
        let other = tempfile::tempdir().expect("tempdir");
        let theirs = load_or_create(other.path()).expect("made");
        assert_ne!(first.expose(), theirs.expose(), "one per install");
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        load_or_create(dir.path()).expect("made");
        let meta = std::fs::metadata(dir.path().join(FILE)).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn an_empty_file_is_made_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), "").expect("write");
        let secret = load_or_create(dir.path()).expect("made");
        assert!(!secret.is_empty());
    }
}
