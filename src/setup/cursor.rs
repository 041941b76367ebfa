//! Wiring Cursor to the proxy through its user `settings.json` (JSONC).
//!
//! Every write is preceded by a timestamped backup next to the file
//! (`settings.json.cursor-byok-<UTC>.bak`, or `….absent` when there was no file), edits keep
//! comments and formatting (see [`super::jsonc`]), running it again changes nothing, and a file
//! that does not parse is refused untouched. [`undo`] puts the original back byte for byte.

use std::fs;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::diff;
use super::jsonc::{Document, ParseError};
use crate::config::ProxyAuth;

/// Marks our backups: `<file name>.cursor-byok-<timestamp>.bak` / `.absent`.
const BACKUP_TAG: &str = ".cursor-byok-";
const BAK: &str = ".bak";
const ABSENT: &str = ".absent";

/// Where Cursor keeps its user settings, per OS (for messages and docs).
pub const SETTINGS_LOCATIONS: [(&str, &str); 3] = [
    (
        "macOS",
        "~/Library/Application Support/Cursor/User/settings.json",
    ),
    ("Windows", "%APPDATA%\\Cursor\\User\\settings.json"),
    (
        "Linux",
        "~/.config/Cursor/User/settings.json ($XDG_CONFIG_HOME)",
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot write it: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not UTF-8 text; refusing to edit it (nothing was changed)")]
    NotUtf8 { path: PathBuf },
    #[error(
        "{path}: cannot parse it as JSON with comments ({error}); refusing to edit it, nothing \
         was changed. Fix the file (in Cursor: \"Preferences: Open User Settings (JSON)\") and \
         run this again"
    )]
    Parse { path: PathBuf, error: ParseError },
    #[error(
        "{dir} does not exist: start Cursor once so it creates its settings, or pass \
         --settings FILE"
    )]
    NoDir { dir: PathBuf },
    #[error("no cursor-byok backup of {path} to restore")]
    NoBackup { path: PathBuf },
    #[error("cannot tell where Cursor keeps its settings on this system: pass --settings FILE")]
    NoDefaultPath,
}

/// Cursor's user `settings.json` for this OS and user (`dirs::config_dir()` is
/// `~/Library/Application Support`, `%APPDATA%`, or `$XDG_CONFIG_HOME`/`~/.config`).
pub fn default_settings_path() -> Result<PathBuf, SetupError> {
    dirs::config_dir()
        .map(|d| d.join("Cursor").join("User").join("settings.json"))
        .ok_or(SetupError::NoDefaultPath)
}

/// The URL Cursor should use for the proxy listening on `listen` (a wildcard address is
/// reached through loopback).
pub fn proxy_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, listen.port()))
}

/// The `http.proxy` value for `listen` with the listener's credentials in it: Cursor sends
/// them as `Proxy-Authorization: Basic` on its CONNECTs.
pub fn wired_proxy_url(listen: SocketAddr, auth: Option<&ProxyAuth>) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let url = proxy_url(listen);
    let Some(auth) = auth else {
        return url;
    };
    const USERINFO: &percent_encoding::AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    let user = utf8_percent_encode(&auth.username, USERINFO);
    let password = utf8_percent_encode(auth.password.expose(), USERINFO);
    url.replacen("http://", &format!("http://{user}:{password}@"), 1)
}

/// `text` with the listener's password, and the password of any URL in it, replaced by
/// `<secret>`, for printing.
pub fn masked(text: &str, auth: Option<&ProxyAuth>) -> String {
    let text = mask_url_passwords(text);
    match auth.filter(|a| !a.password.is_empty()) {
        Some(auth) => text.replace(auth.password.expose(), "<secret>"),
        None => text,
    }
}

/// Every `scheme://user:password@` in `text` as `scheme://user:<secret>@`.
fn mask_url_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c == '"' || c == '\'' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rsplit_once('@') {
            Some((userinfo, host)) if userinfo.contains(':') => {
                let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
                out.push_str(&format!("{user}:<secret>@{host}"));
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// An `http.proxy` value without the credentials it may carry, for comparing and printing.
pub(crate) fn without_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/') {
            Some((authority, path)) => {
                let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                format!("{scheme}://{host}/{path}")
            }
            None => format!(
                "{scheme}://{}",
                rest.rsplit_once('@').map_or(rest, |(_, h)| h)
            ),
        },
        None => url.to_string(),
    }
}

/// The listener address an `http.proxy` value names (credentials, if any, left aside).
fn listen_of(url: &str) -> Option<SocketAddr> {
    let rest = url.strip_prefix("http://")?;
    let authority = rest.rsplit_once('@').map_or(rest, |(_, a)| a);
    authority.trim_end_matches('/').parse().ok()
}

/// The settings the proxy needs, without credentials in `http.proxy`.
pub(crate) fn desired_settings(listen: SocketAddr) -> Vec<(&'static str, Value)> {
    desired_settings_for(listen, None)
}

/// The settings the proxy needs, in the order they are added; `http.proxy` carries `auth`.
pub fn desired_settings_for(
    listen: SocketAddr,
    auth: Option<&ProxyAuth>,
) -> Vec<(&'static str, Value)> {
    vec![
        // Every request goes through us; we decrypt only *.cursor.sh and tunnel the rest.
        ("http.proxy", json!(wired_proxy_url(listen, auth))),
        // Extensions and Cursor's own services use the proxy too.
        ("http.proxySupport", json!("override")),
        // The desktop's HTTP/2 agent client ignores `http.proxy`; HTTP/1.1 honours it.
        ("cursor.general.disableHttp2", json!(true)),
        // Keep certificate checks on: our CA is trusted, nothing else changes.
        ("http.proxyStrictSSL", json!(true)),
        // Let Cursor's Node side trust certificates from the OS store (where our CA goes).
        ("http.systemCertificates", json!(true)),
        // A Remote-SSH window inherits `http.proxy`, whose loopback address means nothing on
        // the remote host; "always" keeps inference on the local client, where we are.
        (REMOTE_INFERENCE_ROUTE, json!("always")),
    ]
}

/// The setting that keeps a Remote-SSH window's inference on the local client (3.21.16+).
pub(crate) const REMOTE_INFERENCE_ROUTE: &str = "cursorAgentHost.remoteInferenceRoute";

/// Settings whose value the user chose stays: we only add them when absent.
pub(crate) const USER_KEEPS: &[&str] = &[REMOTE_INFERENCE_ROUTE];

/// `desired` without the keys in [`USER_KEEPS`] that `doc` already sets.
fn for_document(
    doc: &Document<'_>,
    desired: &[(&'static str, Value)],
) -> Vec<(&'static str, Value)> {
    desired
        .iter()
        .filter(|(k, _)| !(USER_KEEPS.contains(k) && doc.get(k).is_some()))
        .cloned()
        .collect()
}

/// A setting that does not hold the value the proxy needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mismatch {
    pub key: String,
    pub have: Option<Value>,
    pub want: Value,
}

/// What in `text` differs from `desired`.
pub(crate) fn mismatches(
    text: &str,
    desired: &[(&'static str, Value)],
) -> Result<Vec<Mismatch>, ParseError> {
    let doc = Document::parse(text)?;
    Ok(for_document(&doc, desired)
        .iter()
        .filter(|(k, v)| doc.get(k) != Some(v))
        .map(|(k, v)| Mismatch {
            key: k.to_string(),
            have: doc.get(k).cloned(),
            want: v.clone(),
        })
        .collect())
}

/// What wiring would do to one file.
#[derive(Debug, Clone)]
pub struct WirePlan {
    pub path: PathBuf,
    /// The current text; `None` when the file does not exist.
    pub before: Option<String>,
    pub after: String,
}

impl WirePlan {
    pub fn changes(&self) -> bool {
        self.before.as_deref() != Some(self.after.as_str())
    }

    pub fn diff(&self) -> String {
        let name = self.path.display().to_string();
        match &self.before {
            Some(before) => diff::unified(before, &self.after, &name, &format!("{name} (wired)")),
            None => diff::unified("", &self.after, "(no file)", &name),
        }
    }
}

/// Read `path` and work out the wired text. Nothing is written.
pub fn plan(path: &Path, desired: &[(&'static str, Value)]) -> Result<WirePlan, SetupError> {
    let before = read_settings(path)?;
    let doc = match &before {
        Some(text) => parse(path, text)?,
        None => Document::parse("").map_err(|error| parse_err(path, error))?,
    };
    let desired = &for_document(&doc, desired)[..];
    let after = doc.with_values(desired);
    // Defence in depth: never write what we could not read back with the values set.
    match mismatches(&after, desired) {
        Ok(m) if m.is_empty() => {}
        Ok(m) => {
            return Err(parse_err(
                path,
                ParseError {
                    line: 1,
                    column: 1,
                    reason: format!("internal: `{}` did not take its value", m[0].key),
                },
            ))
        }
        Err(error) => return Err(parse_err(path, error)),
    }
    Ok(WirePlan {
        path: path.to_path_buf(),
        before,
        after,
    })
}

/// Back up the file, then write the plan. Returns the backup, or `None` when there was nothing
/// to change.
pub fn apply(plan: &WirePlan) -> Result<Option<PathBuf>, SetupError> {
    if !plan.changes() {
        return Ok(None);
    }
    let backup = write_backup(&plan.path, plan.before.as_deref())?;
    write(&plan.path, plan.after.as_bytes())?;
    Ok(Some(backup))
}

/// What [`undo`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Undo {
    /// The file is byte for byte the backup again (or gone again, when there was none).
    Restored { backup: PathBuf },
    /// The file was edited after wiring: only our settings were put back as the backup had
    /// them; the file as it was first went to `safety`.
    RestoredSettings { backup: PathBuf, safety: PathBuf },
    /// It already matches the backup.
    Nothing { backup: PathBuf },
}

/// Put back the settings as they were before cursor-byok wired them.
///
/// The backup used is the newest one that is not itself wired (so wiring twice, e.g. for a new
/// port, still undoes to the original). When the file is exactly what wiring that backup
/// produces, the backup's bytes are restored; when the user changed it since, only the settings
/// we set are restored (or removed), and their other edits stay.
pub fn undo(path: &Path) -> Result<Undo, SetupError> {
    let backups = backups(path)?;
    let mut chosen = None;
    for b in backups.iter().rev() {
        let content = read_backup(b)?;
        if !looks_wired(content.as_deref()) {
            chosen = Some((b.clone(), content));
            break;
        }
    }
    let (backup, original) = match chosen {
        Some(c) => c,
        None => match backups.first() {
            Some(b) => (b.clone(), read_backup(b)?),
            None => {
                return Err(SetupError::NoBackup {
                    path: path.to_path_buf(),
                })
            }
        },
    };
    let current = read_settings(path)?;
    if current == original {
        return Ok(Undo::Nothing { backup });
    }
    let Some(current) = current else {
        // Deleted since: recreate the original.
        if let Some(text) = &original {
            write(path, text.as_bytes())?;
        }
        return Ok(Undo::Restored { backup });
    };
    if wired_from(&current, original.as_deref()) {
        match &original {
            Some(text) => write(path, text.as_bytes())?,
            None => fs::remove_file(path).map_err(|source| SetupError::Write {
                path: path.to_path_buf(),
                source,
            })?,
        }
        return Ok(Undo::Restored { backup });
    }
    // Edited after wiring: restore only our keys.
    let keys: Vec<&str> = desired_settings(SocketAddr::from(([127, 0, 0, 1], 0)))
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let original_doc = match &original {
        Some(text) => Some(parse(&backup, text)?),
        None => None,
    };
    let restore: Vec<(&str, String)> = keys
        .iter()
        .filter_map(|k| {
            let raw = original_doc.as_ref()?.raw(k)?;
            Some((*k, raw.to_string()))
        })
        .collect();
    let remove: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| !restore.iter().any(|(r, _)| r == k))
        .collect();
    let step = parse(path, &current)?.with_raw(&restore);
    let result = parse(path, &step)?.without(&remove);
    parse(path, &result)?;
    let safety = write_backup(path, Some(&current))?;
    write(path, result.as_bytes())?;
    Ok(Undo::RestoredSettings { backup, safety })
}

/// Our backups of `path`, oldest first.
pub fn backups(path: &Path) -> Result<Vec<PathBuf>, SetupError> {
    let (dir, name) = split(path);
    let prefix = format!("{name}{BACKUP_TAG}");
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(SetupError::Read { path: dir, source }),
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && (n.ends_with(BAK) || n.ends_with(ABSENT))
        })
        .map(|e| e.path())
        .collect();
    // The timestamp has a fixed width, so names sort by time.
    found.sort();
    Ok(found)
}

/// Was `current` produced by wiring `original` (for whatever port it names)?
fn wired_from(current: &str, original: Option<&str>) -> bool {
    let Ok(doc) = Document::parse(current) else {
        return false;
    };
    let Some(proxy) = doc.get("http.proxy").and_then(Value::as_str) else {
        return false;
    };
    let Some(listen) = listen_of(proxy) else {
        return false;
    };
    // The URL as it is (with whatever credentials it carries), the rest as wiring sets it.
    let mut desired = desired_settings(listen);
    desired[0].1 = json!(proxy);
    let rewired = match Document::parse(original.unwrap_or("")) {
        Ok(d) => d.with_values(&for_document(&d, &desired)),
        Err(_) => return false,
    };
    rewired == current
}

/// Does this text already carry our wiring (a loopback proxy, HTTP/2 off)?
fn looks_wired(text: Option<&str>) -> bool {
    let Some(Ok(doc)) = text.map(Document::parse) else {
        return false;
    };
    let loopback = doc
        .get("http.proxy")
        .and_then(Value::as_str)
        .and_then(listen_of)
        .is_some_and(|a| a.ip().is_loopback());
    loopback
        && doc.get("http.proxySupport") == Some(&json!("override"))
        && doc.get("cursor.general.disableHttp2") == Some(&json!(true))
}

fn split(path: &Path) -> (PathBuf, String) {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let name = path.file_name().map_or_else(
        || "settings.json".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    (dir, name)
}

fn parse<'a>(path: &Path, text: &'a str) -> Result<Document<'a>, SetupError> {
    Document::parse(text).map_err(|error| parse_err(path, error))
}

fn parse_err(path: &Path, error: ParseError) -> SetupError {
    SetupError::Parse {
        path: path.to_path_buf(),
        error,
    }
}

/// The file's text, `None` when it does not exist; an error when its folder does not either.
fn read_settings(path: &Path) -> Result<Option<String>, SetupError> {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| SetupError::NotUtf8 {
                path: path.to_path_buf(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (dir, _) = split(path);
            if dir.is_dir() {
                Ok(None)
            } else {
                Err(SetupError::NoDir { dir })
            }
        }
        Err(source) => Err(SetupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A backup's content; `None` for an "absent" marker.
fn read_backup(path: &Path) -> Result<Option<String>, SetupError> {
    if path.to_string_lossy().ends_with(ABSENT) {
        return Ok(None);
    }
    let bytes = fs::read(path).map_err(|source| SetupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| SetupError::NotUtf8 {
            path: path.to_path_buf(),
        })
}

/// Write `content` (or an "absent" marker) to a new, never-overwritten backup file.
fn write_backup(path: &Path, content: Option<&str>) -> Result<PathBuf, SetupError> {
    let (dir, name) = split(path);
    let ext = if content.is_some() { BAK } else { ABSENT };
    let mut last_err = None;
    // Timestamps are to the millisecond; a clash (two runs in one millisecond) waits a tick.
    for _ in 0..100 {
        let backup = dir.join(format!("{name}{BACKUP_TAG}{}{ext}", timestamp()));
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create_new(true);
        // An earlier wiring's credentials may be in it.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        match opts.open(&backup) {
            Ok(mut f) => {
                let written = f
                    .write_all(content.unwrap_or("").as_bytes())
                    .and_then(|()| f.sync_all());
                return match written {
                    Ok(()) => Ok(backup),
                    Err(source) => Err(SetupError::Write {
                        path: backup,
                        source,
                    }),
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last_err = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(source) => {
                return Err(SetupError::Write {
                    path: backup,
                    source,
                })
            }
        }
    }
    Err(SetupError::Write {
        path: dir,
        source: last_err.unwrap_or_else(|| std::io::Error::other("no free backup name")),
    })
}

/// Written in place (not renamed over), so a symlinked settings file stays a symlink. The
/// file holds the proxy's credentials: readable by this user alone.
fn write(path: &Path, bytes: &[u8]) -> Result<(), SetupError> {
    let err = |source| SetupError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(err)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(err)?;
    }
    file.write_all(bytes).map_err(err)
}

/// `20260130T142501.123Z`: UTC, fixed width so names sort by time.
fn timestamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen() -> SocketAddr {
        "127.0.0.1:8787".parse().unwrap()
    }

    #[test]
    fn proxy_urls() {
        assert_eq!(proxy_url(listen()), "http://127.0.0.1:8787");
        assert_eq!(
            proxy_url("0.0.0.0:9000".parse().unwrap()),
            "http://127.0.0.1:9000"
        );
        assert_eq!(proxy_url("[::]:9000".parse().unwrap()), "http://[::1]:9000");
    }

    fn auth() -> ProxyAuth {
        ProxyAuth {
            username: "cursor-byok".into(),
            password: crate::base::secret::Secret::new("s3cr/t+0"),
        }
    }

    #[test]
    fn the_wired_url_carries_the_credentials_and_prints_masked() {
        let url = wired_proxy_url(listen(), Some(&auth()));
        assert_eq!(url, "http://cursor-byok:s3cr%2Ft%2B0@127.0.0.1:8787");
        assert_eq!(listen_of(&url), Some(listen()));
        assert_eq!(listen_of("http://127.0.0.1:8787"), Some(listen()));
        assert_eq!(without_credentials(&url), "http://127.0.0.1:8787");
        assert_eq!(
            without_credentials("http://u:p@corp:3128/x"),
            "http://corp:3128/x"
        );
        let shown = masked(&format!("set {url} and s3cr/t+0"), Some(&auth()));
        assert!(!shown.contains("s3cr"), "{shown}");
        assert!(
            shown.contains("cursor-byok:<secret>@127.0.0.1:8787"),
            "{shown}"
        );
        let other = masked("is \"http://u:0ther@127.0.0.1:1\", needs x", None);
        assert_eq!(other, "is \"http://u:<secret>@127.0.0.1:1\", needs x");
    }

    #[cfg(unix)]
    #[test]
    fn wired_settings_with_a_secret_are_0600_and_undo_still_works() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let original = "{\n  \"editor.fontSize\": 13\n}\n";
        fs::write(&path, original).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let desired = desired_settings_for(listen(), Some(&auth()));
        apply(&plan(&path, &desired).unwrap()).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let wired = fs::read_to_string(&path).unwrap();
        assert!(wired.contains("cursor-byok:s3cr%2Ft%2B0@127.0.0.1:8787"));
        assert!(looks_wired(Some(&wired)));
        assert!(matches!(undo(&path).unwrap(), Undo::Restored { .. }));
        assert_eq!(fs::read_to_string(&path).unwrap(), original);
    }

    #[test]
    fn wire_twice_then_undo_to_the_original() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let original = "{\n  // mine\n  \"editor.fontSize\": 13,\n}\n";
        fs::write(&path, original).unwrap();
        apply(&plan(&path, &desired_settings(listen())).unwrap()).unwrap();
        let other: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        apply(&plan(&path, &desired_settings(other)).unwrap()).unwrap();
        assert_eq!(backups(&path).unwrap().len(), 2);
        assert!(matches!(undo(&path).unwrap(), Undo::Restored { .. }));
        assert_eq!(fs::read_to_string(&path).unwrap(), original);
        assert!(matches!(undo(&path).unwrap(), Undo::Nothing { .. }));
    }

    #[test]
    fn undo_after_user_edits_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let original = "{\n    \"http.proxy\": \"http://corp:3128\",\n    \"a\": 1\n}\n";
        fs::write(&path, original).unwrap();
        apply(&plan(&path, &desired_settings(listen())).unwrap()).unwrap();
        let wired = fs::read_to_string(&path).unwrap();
        fs::write(&path, wired.replace("\"a\": 1", "\"a\": 2")).unwrap();
        assert!(matches!(
            undo(&path).unwrap(),
            Undo::RestoredSettings { .. }
        ));
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "{\n    \"http.proxy\": \"http://corp:3128\",\n    \"a\": 2\n}\n"
        );
    }

    #[test]
    fn remote_ssh_route_is_added_keeping_the_users_own_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        fs::write(&path, "{\n  \"editor.fontSize\": 13\n}\n").unwrap();
        apply(&plan(&path, &desired_settings(listen())).unwrap()).unwrap();
        let wired = fs::read_to_string(&path).unwrap();
        let doc = Document::parse(&wired).unwrap();
        assert_eq!(doc.get(REMOTE_INFERENCE_ROUTE), Some(&json!("always")));
        assert!(matches!(undo(&path).unwrap(), Undo::Restored { .. }));
        assert!(!fs::read_to_string(&path)
            .unwrap()
            .contains(REMOTE_INFERENCE_ROUTE));

        // The user's own value stays, through wiring and undo.
        let mine = "{\n  \"cursorAgentHost.remoteInferenceRoute\": \"auto\"\n}\n";
        fs::write(&path, mine).unwrap();
        let p = plan(&path, &desired_settings(listen())).unwrap();
        assert!(!p.diff().contains("always"), "{}", p.diff());
        apply(&p).unwrap();
        let wired = fs::read_to_string(&path).unwrap();
        let doc = Document::parse(&wired).unwrap();
        assert_eq!(doc.get(REMOTE_INFERENCE_ROUTE), Some(&json!("auto")));
        assert!(mismatches(&wired, &desired_settings(listen()))
            .unwrap()
            .is_empty());
        assert!(matches!(undo(&path).unwrap(), Undo::Restored { .. }));
        assert_eq!(fs::read_to_string(&path).unwrap(), mine);
    }

    #[test]
    fn a_missing_file_is_created_and_undone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let p = plan(&path, &desired_settings(listen())).unwrap();
        assert!(p
            .diff()
            .contains("+    \"http.proxy\": \"http://127.0.0.1:8787\""));
        apply(&p).unwrap();
        assert!(path.exists());
        assert!(matches!(undo(&path).unwrap(), Undo::Restored { .. }));
        assert!(!path.exists());
        let nowhere = dir.path().join("no/such/dir/settings.json");
        assert!(matches!(
            plan(&nowhere, &desired_settings(listen())),
            Err(SetupError::NoDir { .. })
        ));
    }
}
