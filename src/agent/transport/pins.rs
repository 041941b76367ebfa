//! The one store of conversation pins: which conversations are ours (and on which model) and
//! which are Cursor's, with a sticky mark on every conversation that ever had a turn on one of
//! our models. Kept in the data dir, so a resume after a restart (it names no model) still goes
//! where its conversation went, and the calls around a conversation (its title, its summary,
//! a fork) can ask whether it is the user's.
//!
//! The file holds conversation ids and model ids only, never a secret. It is append-only, one
//! JSON line per change (the last line for an id wins), created 0600, and compacted (written
//! whole to a temporary file, synced, then renamed over) when it holds more than twice the pins
//! kept, after a torn line, or when the writer fell behind. Every write happens on a writer
//! thread of its own: a pin changes memory at once and never waits for the disk. At most
//! [`MAX_PINS`] conversations are remembered; the least recently used goes first.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::Decision;

/// The pin file's name in the data dir.
pub const PINS_FILE: &str = "conversation-pins.jsonl";
/// Conversations remembered.
pub(crate) const MAX_PINS: usize = 20_000;
/// Longer conversation ids are not pinned (Cursor's are UUIDs).
const MAX_ID_LEN: usize = 256;

#[derive(Serialize, Deserialize)]
struct Line {
    /// Conversation id.
    c: String,
    /// Our model id, when the conversation is ours; absent when it is Cursor's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m: Option<String>,
    /// It had a turn on one of our models (sticky).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    b: bool,
    /// Ours, on no model known: a resume naming no model is refused, never relayed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    u: bool,
}

/// What the store knows of one conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pin {
    /// Where its runs go; `None` when it is ours on no model known.
    decision: Option<Decision>,
    /// It had a turn on one of our models, whatever it is pinned to now.
    had_byok: bool,
    /// Position in the use order (larger is more recent).
    used: u64,
}

/// Conversation id → where its runs go, in memory and in the data dir. Cheap to share.
pub struct PinStore {
    max: usize,
    pins: Arc<Mutex<StoredPins>>,
    /// Rings the writer thread; `None` when it could not start (the pins live in memory only).
    writer: Option<SyncSender<WriterJob>>,
}

#[derive(Default)]
struct StoredPins {
    map: HashMap<String, Pin>,
    /// Use order → id, for eviction.
    order: BTreeMap<u64, String>,
    clock: u64,
    /// Lines waiting for the writer.
    queued: Vec<String>,
    /// The file must be written whole at the next write: it has a line that does not parse
    /// or lacks its newline, a write failed, or the writer fell behind.
    rewrite: bool,
    /// Lines in the file now (compaction bound).
    lines: usize,
}

enum WriterJob {
    /// Write what is queued.
    Write,
    /// Write what is queued, then say so.
    Flush(std::sync::mpsc::Sender<()>),
}

impl PinStore {
    /// The pins in `dir`, loaded now. A missing or unreadable file starts empty (logged): the
    /// conversations it knew then end with an error that says why, never as a relay.
    pub fn open(dir: &Path) -> Self {
        Self::open_bounded(dir, MAX_PINS)
    }

    fn open_bounded(dir: &Path, max: usize) -> Self {
        let path = dir.join(PINS_FILE);
        let pins = Arc::new(Mutex::new(load(&path, max)));
        let writer = start_writer(path, pins.clone(), max);
        PinStore { max, pins, writer }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoredPins> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the runs of `conversation_id` go, if it is pinned to a decision (a use: it is
    /// kept over less recently used ones).
    pub fn get(&self, conversation_id: &str) -> Option<Decision> {
        let mut pins = self.lock();
        pins.touch(conversation_id);
        pins.map.get(conversation_id)?.decision.clone()
    }

    /// Whether `conversation_id` is known at all (pinned, or marked ours on no model).
    pub fn knows(&self, conversation_id: &str) -> bool {
        self.lock().map.contains_key(conversation_id)
    }

    /// Whether `conversation_id` ever had a turn on one of our models.
    pub fn had_byok_turn(&self, conversation_id: &str) -> bool {
        self.lock()
            .map
            .get(conversation_id)
            .is_some_and(|p| p.had_byok)
    }

    /// Pin `conversation_id` to `d` (durably, when it changed). A pin to one of our models also
    /// marks the conversation as having had a turn on it, for good.
    pub fn pin(&self, conversation_id: &str, d: &Decision) {
        let had_byok = matches!(d, Decision::Ours { .. });
        self.set(conversation_id, |old| Pin {
            decision: Some(d.clone()),
            had_byok: had_byok || old.is_some_and(|p| p.had_byok),
            used: 0,
        });
    }

    /// Mark `conversation_id` as the user's: on `model_id` when it is known, else on no model
    /// (a resume of it that names no model is then refused, never relayed). For a conversation
    /// made from one of ours, e.g. a fork, before any run of it.
    pub(crate) fn mark_byok(&self, conversation_id: &str, model_id: Option<&str>) {
        let decision = |old: Option<&Pin>| match (model_id, old.and_then(|p| p.decision.clone())) {
            (Some(m), _) => Some(Decision::Ours {
                model_id: m.to_string(),
            }),
            (None, Some(ours @ Decision::Ours { .. })) => Some(ours),
            (None, _) => None,
        };
        self.set(conversation_id, |old| Pin {
            decision: decision(old),
            had_byok: true,
            used: 0,
        });
    }

    /// Wait until every change made so far is in the file (for shutdown and tests; it blocks).
    pub fn flush(&self) {
        let Some(writer) = &self.writer else { return };
        let (tx, rx) = std::sync::mpsc::channel();
        if writer.send(WriterJob::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    fn set(&self, conversation_id: &str, new: impl FnOnce(Option<&Pin>) -> Pin) {
        if conversation_id.is_empty() || conversation_id.len() > MAX_ID_LEN {
            return;
        }
        let mut pins = self.lock();
        let old = pins.map.get(conversation_id).cloned();
        let pin = new(old.as_ref());
        let changed = old.is_none_or(|o| o.decision != pin.decision || o.had_byok != pin.had_byok);
        pins.insert(conversation_id.to_string(), pin.clone(), self.max);
        let Some(writer) = &self.writer else { return };
        if !changed {
            return;
        }
        match line(conversation_id, &pin) {
            Ok(l) if pins.queued.len() < self.max => pins.queued.push(l),
            // The writer fell behind (or a line failed to encode): write it all next time.
            _ => {
                pins.queued.clear();
                pins.rewrite = true;
            }
        }
        drop(pins);
        // Full: a write is already due, and it takes everything queued.
        if let Err(TrySendError::Disconnected(_)) = writer.try_send(WriterJob::Write) {
            tracing::warn!("conversation pin writer stopped; pins hold in memory only");
        }
    }
}

impl StoredPins {
    fn touch(&mut self, id: &str) {
        self.clock += 1;
        let now = self.clock;
        if let Some(p) = self.map.get_mut(id) {
            self.order.remove(&p.used);
            p.used = now;
            self.order.insert(now, id.to_string());
        }
    }

    fn insert(&mut self, id: String, mut pin: Pin, max: usize) {
        self.clock += 1;
        pin.used = self.clock;
        if let Some(old) = self.map.insert(id.clone(), pin) {
            self.order.remove(&old.used);
        }
        self.order.insert(self.clock, id);
        while self.map.len() > max {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.map.remove(&oldest);
        }
    }

    /// Every pin as file lines, least recently used first.
    fn all_lines(&self) -> String {
        let mut text = String::new();
        for id in self.order.values() {
            if let Some(l) = self.map.get(id).and_then(|p| line(id, p).ok()) {
                text.push_str(&l);
            }
        }
        text
    }
}

/// The pins of the file at `path`. Lines that are torn or not UTF-8 are skipped (the rest
/// still loads), and make the next write rewrite the file.
fn load(path: &Path, max: usize) -> StoredPins {
    let mut pins = StoredPins::default();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return pins,
        Err(e) => {
            tracing::warn!(
                "conversation pins at {} unreadable ({e}); starting without them",
                path.display()
            );
            return pins;
        }
    };
    // A last line without its newline would have the next one glued onto it.
    pins.rewrite = !bytes.is_empty() && !bytes.ends_with(b"\n");
    for raw in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        pins.lines += 1;
        let parsed = std::str::from_utf8(raw)
            .ok()
            .and_then(|l| serde_json::from_str::<Line>(l).ok());
        let Some(l) = parsed else {
            pins.rewrite = true;
            continue;
        };
        let decision = match (l.m, l.u) {
            (_, true) => None,
            (Some(model_id), false) => Some(Decision::Ours { model_id }),
            (None, false) => Some(Decision::Relay),
        };
        let had_byok = l.b || matches!(decision, Some(Decision::Ours { .. }) | None);
        let pin = Pin {
            decision,
            had_byok,
            used: 0,
        };
        pins.insert(l.c, pin, max);
    }
    pins
}

fn line(conversation_id: &str, pin: &Pin) -> Result<String, serde_json::Error> {
    let (m, u) = match &pin.decision {
        Some(Decision::Ours { model_id }) => (Some(model_id.clone()), false),
        Some(Decision::Relay) => (None, false),
        None => (None, true),
    };
    let mut s = serde_json::to_string(&Line {
        c: conversation_id.to_string(),
        m,
        b: pin.had_byok,
        u,
    })?;
    s.push('\n');
    Ok(s)
}

/// The writer thread: it owns every write to the file.
fn start_writer(
    path: PathBuf,
    pins: Arc<Mutex<StoredPins>>,
    max: usize,
) -> Option<SyncSender<WriterJob>> {
    let (tx, rx) = sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("cursor-byok-pins".into())
        .spawn(move || write_loop(&path, &pins, max, &rx));
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!("conversation pins will not be saved: no writer thread ({e})");
            None
        }
    }
}

fn write_loop(path: &Path, pins: &Mutex<StoredPins>, max: usize, jobs: &Receiver<WriterJob>) {
    // Ends when the store is dropped.
    while let Ok(job) = jobs.recv() {
        write_queued(path, pins, max);
        if let WriterJob::Flush(done) = job {
            let _ = done.send(());
        }
    }
}

/// Write what is queued: appended, or the whole file when it is due for a rewrite. The lock
/// is only held to take the work, never during IO.
fn write_queued(path: &Path, pins: &Mutex<StoredPins>, max: usize) {
    enum Work {
        Append(String),
        Rewrite(String),
    }
    let work = {
        let mut p = pins.lock().unwrap_or_else(|p| p.into_inner());
        if p.queued.is_empty() && !p.rewrite {
            return;
        }
        if p.rewrite || p.lines + p.queued.len() > max * 2 {
            p.queued.clear();
            p.rewrite = false;
            p.lines = p.map.len();
            Work::Rewrite(p.all_lines())
        } else {
            let lines = std::mem::take(&mut p.queued);
            p.lines += lines.len();
            Work::Append(lines.concat())
        }
    };
    let result = match &work {
        Work::Append(text) => append(path, text),
        Work::Rewrite(text) => rewrite(path, text),
    };
    if let Err(e) = result {
        tracing::warn!(
            "conversation pins not saved to {}: {e}; a resume after a restart may not be \
             recognised",
            path.display()
        );
        pins.lock().unwrap_or_else(|p| p.into_inner()).rewrite = true;
    }
}

fn private_options() -> std::fs::OpenOptions {
    // Only Unix sets a mode here.
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut o = std::fs::OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o
}

fn append(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = private_options().create(true).append(true).open(path)?;
    // One write: a crash leaves at most a torn last line, which loading skips.
    f.write_all(text.as_bytes())
}

fn rewrite(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("jsonl.tmp");
    {
        let mut f = private_options()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&tmp)?;
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
        s.flush();
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

    /// The mark of a BYOK turn stays when the conversation moves to Cursor's model, survives a
    /// restart, and a conversation marked ours on no model is never pinned to a relay.
    #[test]
    fn a_byok_turn_is_remembered_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let s = PinStore::open(dir.path());
        s.pin("conv-a", &ours("byok-x"));
        s.pin("conv-a", &Decision::Relay);
        s.mark_byok("fork", None);
        s.mark_byok("fork-on", Some("byok-y"));
        s.pin("cursors", &Decision::Relay);
        s.flush();
        let again = PinStore::open(dir.path());
        assert!(again.had_byok_turn("conv-a"));
        assert_eq!(again.get("conv-a"), Some(Decision::Relay));
        assert!(again.had_byok_turn("fork"));
        assert_eq!(again.get("fork"), None, "ours, on no model known");
        assert!(again.knows("fork"));
        assert_eq!(again.get("fork-on"), Some(ours("byok-y")));
        assert!(!again.had_byok_turn("cursors"));
        assert!(!again.had_byok_turn("unknown"));
    }

    #[test]
    fn the_file_is_bounded_and_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let s = PinStore::open_bounded(dir.path(), 10);
        for i in 0..100 {
            s.pin(&format!("conv-{i}"), &ours("byok-x"));
            if i % 7 == 0 {
                s.flush();
            }
        }
        s.flush();
        let text = std::fs::read_to_string(dir.path().join(PINS_FILE)).unwrap();
        assert!(text.lines().count() <= 20, "{} lines", text.lines().count());
        let again = PinStore::open_bounded(dir.path(), 10);
        assert_eq!(again.get("conv-99"), Some(ours("byok-x")));
        assert_eq!(again.get("conv-0"), None, "the oldest pins go first");
    }

    /// Eviction takes the least recently used pin: a pin read since is kept.
    #[test]
    fn a_used_pin_outlives_newer_unused_ones() {
        let s = PinStore::open_bounded(tempfile::tempdir().unwrap().path(), 3);
        s.pin("a", &ours("byok-x"));
        s.pin("b", &ours("byok-x"));
        s.pin("c", &ours("byok-x"));
        assert!(s.get("a").is_some());
        s.pin("d", &ours("byok-x"));
        assert!(s.get("a").is_some(), "used: kept");
        assert!(s.get("b").is_none(), "least recently used: gone");
    }

    /// Torn and non-UTF-8 lines are skipped wherever they are, the rest still loads, and the
    /// next pin is not glued onto a torn last line.
    #[test]
    fn torn_and_garbled_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = b"{\"c\":\"conv-a\",\"m\":\"byok-x\"}\n\xff\xfe{\"c\"\n".to_vec();
        text.extend_from_slice(b"{\"c\":\"conv-d\"}\n{\"c\":\"conv-b\",\"m\":\"by");
        std::fs::write(dir.path().join(PINS_FILE), text).unwrap();
        let s = PinStore::open(dir.path());
        assert_eq!(s.get("conv-a"), Some(ours("byok-x")));
        assert_eq!(
            s.get("conv-d"),
            Some(Decision::Relay),
            "after the garbled line"
        );
        assert_eq!(s.get("conv-b"), None);
        s.pin("conv-c", &Decision::Relay);
        s.flush();
        let again = PinStore::open(dir.path());
        assert_eq!(again.get("conv-a"), Some(ours("byok-x")));
        assert_eq!(again.get("conv-c"), Some(Decision::Relay));
        let text = std::fs::read_to_string(dir.path().join(PINS_FILE)).unwrap();
        assert!(text
            .lines()
            .all(|l| serde_json::from_str::<Line>(l).is_ok()));
    }

    /// A pin changes memory at once, whatever the disk does: the write is the writer's.
    #[test]
    fn a_pin_never_waits_for_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        // The data dir is a file: every write fails, the pins still hold.
        let blocked = dir.path().join("not-a-dir");
        std::fs::write(&blocked, b"").unwrap();
        let s = PinStore::open(&blocked);
        for i in 0..1000 {
            s.pin(&format!("conv-{i}"), &ours("byok-x"));
        }
        s.flush();
        assert_eq!(s.get("conv-999"), Some(ours("byok-x")));
    }
}
