//! Durable conversation pins: which conversations are ours (and on which model) and which are
//! Cursor's, kept in the data dir so a resume after a restart still goes where its conversation
//! went. A resume names no model; without this, a restart would leave it undecidable.
//!
//! The file holds conversation ids and model ids only, never a secret. It is append-only, one
//! JSON line per pin (the last line for an id wins), created 0600, and compacted (written whole
//! to a temporary file, then renamed over) when it holds more than twice the pins kept. At most
//! [`MAX_PINS`] conversations are remembered; the oldest pins go first.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::Decision;

/// The pin file's name in the data dir.
pub const PINS_FILE: &str = "conversation-pins.jsonl";
/// Conversations remembered.
pub const MAX_PINS: usize = 20_000;
/// Longer conversation ids are not pinned (Cursor's are UUIDs).
const MAX_ID_LEN: usize = 256;

#[derive(Serialize, Deserialize)]
struct Line {
    /// Conversation id.
    c: String,
    /// Our model id, when the conversation is ours; absent when it is Cursor's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m: Option<String>,
}

/// Conversation id → decision, in memory and in the data dir.
pub struct PinStore {
    path: Option<PathBuf>,
    max: usize,
    inner: Mutex<Pins>,
}

#[derive(Default)]
struct Pins {
    map: HashMap<String, Decision>,
    /// Insertion order, for eviction.
    order: VecDeque<String>,
    /// Lines in the file now (compaction bound).
    lines: usize,
    /// The file has a line that does not parse (a torn write): rewrite it at the next pin,
    /// rather than append after it.
    torn: bool,
}

impl PinStore {
    /// Pins kept in memory only (no data dir).
    pub fn in_memory() -> Self {
        PinStore {
            path: None,
            max: MAX_PINS,
            inner: Mutex::default(),
        }
    }

    /// The pins in `dir`, loaded now. A missing or unreadable file starts empty (logged): the
    /// conversations it knew then end with an error that says why, never as a relay.
    pub fn open(dir: &Path) -> Self {
        Self::open_bounded(dir, MAX_PINS)
    }

    fn open_bounded(dir: &Path, max: usize) -> Self {
        let path = dir.join(PINS_FILE);
        let mut pins = Pins::default();
        match std::fs::File::open(&path) {
            Ok(f) => {
                for line in std::io::BufReader::new(f).lines() {
                    let Ok(line) = line else { break };
                    pins.lines += 1;
                    // A torn last line (a crash mid-write) is skipped.
                    match serde_json::from_str::<Line>(&line) {
                        Ok(l) => pins.insert(l.c, decision_of(l.m), max),
                        Err(_) => pins.torn = true,
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                "conversation pins at {} unreadable ({e}); starting without them",
                path.display()
            ),
        }
        PinStore {
            path: Some(path),
            max,
            inner: Mutex::new(pins),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pins> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `conversation_id` was pinned, if it was.
    pub fn get(&self, conversation_id: &str) -> Option<Decision> {
        self.lock().map.get(conversation_id).cloned()
    }

    /// Pin `conversation_id` to `d`, durably when it changed. A write failure is logged: the
    /// pin still holds in memory for this process.
    pub fn pin(&self, conversation_id: &str, d: &Decision) {
        if conversation_id.is_empty() || conversation_id.len() > MAX_ID_LEN {
            return;
        }
        let mut pins = self.lock();
        if pins.map.get(conversation_id) == Some(d) {
            return;
        }
        pins.insert(conversation_id.to_string(), d.clone(), self.max);
        let Some(path) = &self.path else { return };
        let result = if pins.torn || pins.lines + 1 > self.max * 2 {
            compact(path, &pins).map(|()| {
                pins.lines = pins.map.len();
                pins.torn = false;
            })
        } else {
            append(path, conversation_id, d).map(|()| pins.lines += 1)
        };
        if let Err(e) = result {
            tracing::warn!(
                "conversation pin not saved to {}: {e}; a resume after a restart will not be \
                 recognised",
                path.display()
            );
        }
    }
}

impl Pins {
    fn insert(&mut self, id: String, d: Decision, max: usize) {
        if self.map.insert(id.clone(), d).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > max {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

fn decision_of(model: Option<String>) -> Decision {
    match model {
        Some(model_id) => Decision::Ours { model_id },
        None => Decision::Relay,
    }
}

fn line(conversation_id: &str, d: &Decision) -> Result<String, serde_json::Error> {
    let m = match d {
        Decision::Ours { model_id } => Some(model_id.clone()),
        Decision::Relay => None,
    };
    let mut s = serde_json::to_string(&Line {
        c: conversation_id.to_string(),
        m,
    })?;
    s.push('\n');
    Ok(s)
}

fn private_options() -> std::fs::OpenOptions {
    let mut o = std::fs::OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o
}

fn append(path: &Path, conversation_id: &str, d: &Decision) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = private_options().create(true).append(true).open(path)?;
    // One write per line: a crash leaves at most a torn last line, which loading skips.
    f.write_all(line(conversation_id, d)?.as_bytes())
}

fn compact(path: &Path, pins: &Pins) -> std::io::Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    {
        let mut f = private_options()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&tmp)?;
        let mut text = String::new();
        for id in &pins.order {
            if let Some(d) = pins.map.get(id) {
                text.push_str(&line(id, d)?);
            }
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(m: &str) -> Decision {
        Decision::Ours { model_id: m.into() }
    }

    #[test]
    fn pins_survive_a_reopen_and_the_last_word_wins() {
        let dir = tempfile::tempdir().unwrap();
        let s = PinStore::open(dir.path());
        s.pin("conv-a", &ours("byok-x"));
        s.pin("conv-b", &Decision::Relay);
        s.pin("conv-a", &ours("byok-y"));
        s.pin("", &ours("byok-x")); // no id: nothing to pin
        s.pin(&"x".repeat(MAX_ID_LEN + 1), &ours("byok-x"));
        let again = PinStore::open(dir.path());
        assert_eq!(again.get("conv-a"), Some(ours("byok-y")));
        assert_eq!(again.get("conv-b"), Some(Decision::Relay));
        assert_eq!(again.get("conv-c"), None);
        let text = std::fs::read_to_string(dir.path().join(PINS_FILE)).unwrap();
        assert_eq!(text.lines().count(), 3);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(PINS_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn the_file_is_bounded_and_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let s = PinStore::open_bounded(dir.path(), 10);
        for i in 0..100 {
            s.pin(&format!("conv-{i}"), &ours("byok-x"));
        }
        let text = std::fs::read_to_string(dir.path().join(PINS_FILE)).unwrap();
        assert!(text.lines().count() <= 20, "{} lines", text.lines().count());
        let again = PinStore::open_bounded(dir.path(), 10);
        assert_eq!(again.get("conv-99"), Some(ours("byok-x")));
        assert_eq!(again.get("conv-0"), None, "the oldest pins go first");
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(PINS_FILE),
            "{\"c\":\"conv-a\",\"m\":\"byok-x\"}\n{\"c\":\"conv-b\",\"m\":\"by",
        )
        .unwrap();
        let s = PinStore::open(dir.path());
        assert_eq!(s.get("conv-a"), Some(ours("byok-x")));
        assert_eq!(s.get("conv-b"), None);
        // The next pin rewrites the file instead of appending after the torn line.
        s.pin("conv-c", &Decision::Relay);
        let again = PinStore::open(dir.path());
        assert_eq!(again.get("conv-a"), Some(ours("byok-x")));
        assert_eq!(again.get("conv-c"), Some(Decision::Relay));
    }
}
