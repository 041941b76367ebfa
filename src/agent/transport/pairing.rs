//! BidiSse pairing state: one [`RequestPairing`] per request id, shared by its `RunSSE`
//! readers and its `BidiAppend`s, and the [`Pairings`] that holds them.
//!
//! An entry lives exactly as long as it is needed:
//! - while its run lives, however long (a turn with a three-hour build is one run), unless the
//!   entry sees no traffic at all — no append, no frame read — for [`PairingLimits::run_idle`],
//!   in which case the run is ended as abandoned by the client;
//! - once its run ended: until every frame was read and the reader left, or at most
//!   [`PairingLimits::linger`] when nobody reads them;
//! - an entry whose run never started (undecided, relayed, or a prewarm) for
//!   [`PairingLimits::pending_idle`] without traffic.
//!
//! A request id whose run of ours ended may carry a new run: Cursor's SDK starts a background
//! task's completion as a new run on the parent run's request id. [`Pairings::for_new_run`]
//! then puts a fresh entry (a *successor*) in the ended one's place. The old entry's readers
//! keep their handle and finish reading it; frames nobody was reading are dropped, since the
//! client has moved on to the new run. A successor nothing decides never becomes a relay: its
//! reader and appends get "has already ended".
//!
//! The registry is bounded: a cap on entries (new request ids beyond it are refused with
//! `resource_exhausted`; entries already held are untouched) and on the bytes of appends held
//! out of order, per entry and in total. Expired entries are swept by a background task every
//! [`SWEEP_EVERY`] (and before refusing a new id at the cap), never on every call.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::body::end_frame;
use super::Decision;
use crate::agent::{RunError, RunFailer};
use crate::connect::{Code, ConnectError, Encoding, EndStream, FrameEncoder};
use crate::proto::agent::v1 as pb;

/// How often the background sweep looks for expired entries.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Bounds and lifetimes of the pairing state.
#[derive(Debug, Clone, Copy)]
pub(super) struct PairingLimits {
    /// Request ids held at once.
    pub(crate) max_entries: usize,
    /// Bytes of out-of-order appends held for one request id.
    pub(crate) max_held_per_entry: usize,
    /// Bytes of out-of-order appends held for all request ids together.
    pub(crate) max_held_total: usize,
    /// A live run's entry with no traffic at all for this long is abandoned.
    pub(crate) run_idle: Duration,
    /// An entry without a run (undecided, relayed, prewarm) is forgotten after this idle time.
    pub(crate) pending_idle: Duration,
    /// An ended run's frames wait this long for a reader.
    pub linger: Duration,
    /// A started run waits this long for its first RunSSE reader (append 0 may come first).
    pub(crate) reader_wait: Duration,
}

impl Default for PairingLimits {
    fn default() -> Self {
        PairingLimits {
            // Far above one developer's concurrent runs and subagents, yet bounded.
            max_entries: 4096,
            max_held_per_entry: 16 << 20,
            max_held_total: 64 << 20,
            // The client appends a heartbeat every 5 s and reads ours every 5 s: ten minutes of
            // silence on both is a client that is gone.
            run_idle: Duration::from_secs(600),
            pending_idle: Duration::from_secs(60),
            linger: Duration::from_secs(60),
            reader_wait: Duration::from_secs(30),
        }
    }
}

/// Request id → pairing state. Cheap to clone (one shared map).
#[derive(Clone)]
pub(super) struct Pairings {
    shared: Arc<Shared>,
}

struct Shared {
    map: Mutex<Map>,
    /// Bytes of out-of-order appends held by every entry.
    held: Arc<AtomicUsize>,
    limits: PairingLimits,
}

struct Map {
    entries: HashMap<String, Arc<RequestPairing>>,
    /// When the last sweep ran (bounds the sweeps a full registry does).
    last_sweep: Instant,
    sweeper: bool,
}

impl Default for Pairings {
    fn default() -> Self {
        Pairings::new(PairingLimits::default())
    }
}

impl Pairings {
    pub(super) fn new(limits: PairingLimits) -> Self {
        Pairings {
            shared: Arc::new(Shared {
                map: Mutex::new(Map {
                    entries: HashMap::new(),
                    last_sweep: Instant::now(),
                    sweeper: false,
                }),
                held: Arc::default(),
                limits,
            }),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, Map> {
        self.shared.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry of `request_id`, if one is held.
    pub(super) fn get(&self, request_id: &str) -> Option<Arc<RequestPairing>> {
        self.map().entries.get(request_id).cloned()
    }

    /// The entry of `request_id`, made if missing; refused when the registry is full.
    pub(super) fn get_or_create(
        &self,
        request_id: &str,
    ) -> Result<Arc<RequestPairing>, ConnectError> {
        self.entry_for(request_id, false)
    }

    /// The entry for a new run on `request_id`, whose earlier run of ours ended: the held entry
    /// unless its run ended (then a successor takes its place), else a new successor.
    pub(super) fn for_new_run(
        &self,
        request_id: &str,
    ) -> Result<Arc<RequestPairing>, ConnectError> {
        self.entry_for(request_id, true)
    }

    fn entry_for(
        &self,
        request_id: &str,
        new_run: bool,
    ) -> Result<Arc<RequestPairing>, ConnectError> {
        let mut map = self.map();
        if let Some(e) = map.entries.get(request_id) {
            if !(new_run && e.backlog().ended()) {
                return Ok(e.clone());
            }
            // Replacing an entry: the count does not grow, so no cap check.
            let entry = self.new_entry(request_id, true);
            map.entries.insert(request_id.to_string(), entry.clone());
            return Ok(entry);
        }
        let limits = self.shared.limits;
        if map.entries.len() >= limits.max_entries {
            // At the cap: one sweep per second at most, then refuse if still full.
            if map.last_sweep.elapsed() >= Duration::from_secs(1) {
                let abandoned = sweep_locked(&mut map, &limits);
                drop(map);
                end_abandoned(abandoned);
                map = self.map();
            }
            if map.entries.len() >= limits.max_entries {
                tracing::warn!(
                    held = map.entries.len(),
                    "BidiSse pairing registry full: refusing a new request id"
                );
                return Err(RunError::Limit(format!(
                    "too many agent runs at once ({} request ids held); try again when some \
                     have finished",
                    limits.max_entries
                ))
                .to_connect());
            }
        }
        let entry = self.new_entry(request_id, new_run);
        map.entries.insert(request_id.to_string(), entry.clone());
        if !map.sweeper {
            map.sweeper = self.start_sweeper();
        }
        Ok(entry)
    }

    fn new_entry(&self, request_id: &str, successor: bool) -> Arc<RequestPairing> {
        Arc::new(RequestPairing::new(
            request_id.to_string(),
            self.shared.held.clone(),
            self.shared.limits,
            successor,
        ))
    }

    /// A background task that sweeps every [`SWEEP_EVERY`] while the registry exists.
    fn start_sweeper(&self) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        rt.spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                Pairings { shared }.sweep();
            }
        });
        true
    }

    /// Forget every expired entry; runs abandoned by their client are ended.
    pub(super) fn sweep(&self) {
        let abandoned = sweep_locked(&mut self.map(), &self.shared.limits);
        end_abandoned(abandoned);
    }

    /// Drop `entry` now if it is done with (its run ended and every frame was read), so a
    /// finished run's state goes with its last reader instead of waiting for the sweep.
    pub(super) fn forget_if_done(&self, entry: &Arc<RequestPairing>) {
        if entry.fate(Instant::now(), &self.shared.limits) != PairingFate::Forget {
            return;
        }
        let mut map = self.map();
        if map
            .entries
            .get(&entry.request_id)
            .is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            map.entries.remove(&entry.request_id);
        }
    }

    /// Request ids held.
    pub(super) fn len(&self) -> usize {
        self.map().entries.len()
    }

    /// Bytes of out-of-order appends held.
    pub(super) fn held_bytes(&self) -> usize {
        self.shared.held.load(Ordering::Relaxed)
    }

    /// Bytes of run output held for readers, over every entry.
    pub(super) fn backlog_bytes(&self) -> usize {
        let entries: Vec<Arc<RequestPairing>> = self.map().entries.values().cloned().collect();
        entries
            .iter()
            .map(|e| e.backlog().frames.iter().map(Bytes::len).sum::<usize>())
            .sum()
    }
}

fn sweep_locked(map: &mut Map, limits: &PairingLimits) -> Vec<(Arc<RequestPairing>, String)> {
    let now = Instant::now();
    map.last_sweep = now;
    let mut abandoned = Vec::new();
    map.entries.retain(|_, e| match e.fate(now, limits) {
        PairingFate::Keep => true,
        PairingFate::Forget => false,
        // Kept: the run's end frame waits for a reader that comes back, up to the linger.
        PairingFate::Abandoned(how) => {
            abandoned.push((e.clone(), how));
            true
        }
    });
    abandoned
}

/// End the runs of entries forgotten while their run still lived (outside the map's lock).
fn end_abandoned(entries: Vec<(Arc<RequestPairing>, String)>) {
    for (e, how) in entries {
        tracing::debug!(request_id = %e.request_id, "BidiSse entry abandoned: {how}");
        e.abandon(how);
    }
}

#[derive(Debug, PartialEq, Eq)]
enum PairingFate {
    Keep,
    Forget,
    /// Forget, and end the run that still lives (why, in words).
    Abandoned(String),
}

/// One request id's pairing state.
pub(super) struct RequestPairing {
    pub request_id: String,
    /// Fires when append 0 (or a timeout) decides whose run this is.
    pub decided: Notify,
    pub state: tokio::sync::Mutex<Inbound>,
    pub out: Arc<Mutex<Backlog>>,
    /// Ends our run from the transport; set when it starts.
    pub run: OnceLock<RunFailer>,
    /// Made for a new run on a request id whose run of ours ended: undecided, it ends as
    /// "has already ended", never as a relay.
    pub(crate) successor: bool,
    /// Fires when the client has left for good: whatever moves the run's output stops.
    pub gone: CancellationToken,
    /// Held while messages are handed to the run, in order; never with `state` held across
    /// an await, so readers and deciding appends are never stuck behind a busy run.
    pub deliver: tokio::sync::Mutex<()>,
    /// What the run's requests said of its parent so far (see [`ParentNote`]).
    pub parent: Mutex<ParentNote>,
    /// Bytes of this entry's appends in hand and waiting for their turn (see
    /// [`RequestPairing::wait_room`]), and the registry's total they also count in.
    in_hand: Arc<AtomicUsize>,
    held_total: Arc<AtomicUsize>,
    limits: PairingLimits,
}

/// An append's bytes, counted against the pairing bounds while it waits for its turn (for
/// append 0, for the appends before it, for room in the run's inbox); released on drop.
pub(super) struct InHand {
    here: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
    size: usize,
}

impl Drop for InHand {
    fn drop(&mut self) {
        self.here.fetch_sub(self.size, Ordering::Relaxed);
        self.total.fetch_sub(self.size, Ordering::Relaxed);
    }
}

/// The parent headers of a run's requests (its RunSSE readers, its appends), merged; once the
/// run has started, a parent named only then links the running run.
#[derive(Debug, Default)]
pub(super) struct ParentNote {
    pub link: crate::agent::subagents::ParentLink,
    /// The run started (and registered itself): a new name must link it late.
    pub started: bool,
}

impl RequestPairing {
    fn new(
        request_id: String,
        held: Arc<AtomicUsize>,
        limits: PairingLimits,
        successor: bool,
    ) -> Self {
        RequestPairing {
            request_id,
            successor,
            decided: Notify::new(),
            in_hand: Arc::default(),
            held_total: held.clone(),
            limits,
            state: tokio::sync::Mutex::new(Inbound {
                decision: None,
                next_seqno: 0,
                waiting: BTreeMap::new(),
                held_here: 0,
                held_total: held,
                limits,
                input: None,
                run_over: false,
                first_append: None,
            }),
            out: Arc::new(Mutex::new(Backlog::new())),
            run: OnceLock::new(),
            gone: CancellationToken::new(),
            deliver: tokio::sync::Mutex::new(()),
            parent: Mutex::new(ParentNote::default()),
        }
    }

    /// Count `size` bytes of append `seqno` against the bounds on held appends (this entry's
    /// and all entries'), until the guard is dropped; refused when there is no room. An append
    /// in hand may wait long (a run that reads no input), so how many wait is bounded by their
    /// bytes, not only by the connections they came on.
    pub(super) fn wait_room(&self, seqno: i64, size: usize) -> Result<InHand, ConnectError> {
        let here = self.in_hand.fetch_add(size, Ordering::Relaxed) + size;
        let total = self.held_total.fetch_add(size, Ordering::Relaxed) + size;
        let guard = InHand {
            here: self.in_hand.clone(),
            total: self.held_total.clone(),
            size,
        };
        // One append alone always fits (it is within the frame limit, which may be larger).
        let fits_here = here == size || here <= self.limits.max_held_per_entry;
        let fits_total = total == size || total <= self.limits.max_held_total;
        if fits_here && fits_total {
            return Ok(guard);
        }
        drop(guard);
        Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "cursor-byok: append {seqno} ({size} bytes) must wait for the run, and there is \
                 no room to hold it ({} bytes of this run's appends wait already, {} of all \
                 runs'); send it again when the run has read its input",
                here - size,
                total - size
            ),
        ))
    }

    pub(super) fn parent_note(&self) -> std::sync::MutexGuard<'_, ParentNote> {
        self.parent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client left for good (`how`, in words): its run ends, and its output stops moving.
    /// Its stream ends with Cursor's cancel (`canceled`, `ERROR_USER_ABORTED_REQUEST`), so a
    /// reader that comes back after all reads an end, not silence.
    pub(super) fn abandon(&self, how: String) {
        let end = RunError::ClientLeft(how.clone()).to_connect();
        if let Some(run) = self.run.get() {
            run.client_left(how);
        }
        self.gone.cancel();
        let enc = FrameEncoder::new(Encoding::Identity);
        self.backlog()
            .push(end_frame(&enc, &EndStream::from_error(end)), true);
    }

    pub(super) fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Our run has started: from now on it must get a reader within the wait.
    pub(super) fn run_started(&self, failer: RunFailer) {
        // Set once: only append 0 starts a run, under the entry's lock.
        if self.run.set(failer).is_ok() {
            self.backlog().run_started = Some(Instant::now());
        }
    }

    /// Its run ended and every frame was handed out: a reader can get nothing more here.
    pub(super) fn read_out(&self) -> bool {
        let b = self.backlog();
        b.ended() && b.delivered == b.total()
    }

    /// Some traffic for this request id: it is not idle.
    pub(super) fn touch(&self) {
        self.backlog().last_seen = Instant::now();
    }

    fn fate(&self, now: Instant, limits: &PairingLimits) -> PairingFate {
        // The client left for good: its end frame waits for a reader like any ended run's.
        let b = self.backlog();
        let idle = now.saturating_duration_since(b.last_seen);
        if let Some(ended_at) = b.ended_at {
            let read_all = b.delivered == b.total() && !b.reader_active;
            return if read_all || now.saturating_duration_since(ended_at) >= limits.linger {
                PairingFate::Forget
            } else {
                PairingFate::Keep
            };
        }
        match (self.run.get(), b.run_started) {
            (Some(_), Some(started))
                if b.reader == 0
                    && now.saturating_duration_since(started) >= limits.reader_wait =>
            {
                PairingFate::Abandoned(format!(
                    "no RunSSE stream came for this run within {} s",
                    limits.reader_wait.as_secs()
                ))
            }
            (Some(_), _) if idle >= limits.run_idle => PairingFate::Abandoned(format!(
                "it sent and read nothing on this run for {} s",
                limits.run_idle.as_secs()
            )),
            (Some(_), _) => PairingFate::Keep,
            (None, _) if idle >= limits.pending_idle => PairingFate::Forget,
            (None, _) => PairingFate::Keep,
        }
    }

    pub(super) async fn decision(&self) -> Option<Decision> {
        self.state.lock().await.decision.clone()
    }

    /// Wait for append 0 to decide, up to `wait`. The waiter counts as traffic (it is a
    /// client request kept open), so the entry is not forgotten under it.
    pub(super) async fn await_decision(&self, wait: Duration) -> Option<Decision> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.decided.notified();
            if let Some(d) = self.decision().await {
                return Some(d);
            }
            self.touch();
            let tick = deadline.min(Instant::now() + SWEEP_EVERY / 2);
            if tokio::time::timeout_at(tick, notified).await.is_err() && tick >= deadline {
                return None;
            }
        }
    }
}

/// The client→run side.
pub(super) struct Inbound {
    pub decision: Option<Decision>,
    pub next_seqno: i64,
    /// Appends that arrived ahead of `next_seqno`, with their sizes. Boxed: a message is
    /// large, and a map node holds room for eleven.
    waiting: BTreeMap<i64, (usize, Box<pb::AgentClientMessage>)>,
    held_here: usize,
    held_total: Arc<AtomicUsize>,
    limits: PairingLimits,
    pub input: Option<mpsc::Sender<Box<pb::AgentClientMessage>>>,
    /// Our run has ended: nothing more can be delivered to it.
    pub(crate) run_over: bool,
    /// Digest of the append 0 that decided: a resent one is a duplicate, another is a new run.
    pub(crate) first_append: Option<u64>,
}

/// The digest [`Inbound::first_append`] keeps.
pub(super) fn digest(wire: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    wire.hash(&mut h);
    h.finish()
}

impl Inbound {
    pub(super) fn is_waiting(&self, seqno: i64) -> bool {
        self.waiting.contains_key(&seqno)
    }

    /// Hold an append that arrived out of order, within the byte bounds.
    pub(super) fn hold(
        &mut self,
        seqno: i64,
        size: usize,
        message: Box<pb::AgentClientMessage>,
    ) -> Result<(), ConnectError> {
        let total = self.held_total.load(Ordering::Relaxed);
        if self.held_here + size > self.limits.max_held_per_entry
            || total + size > self.limits.max_held_total
        {
            return Err(RunError::Limit(format!(
                "append {seqno} arrived ahead of {} and there is no room to hold it ({} bytes \
                 already waiting for this run, {total} for all runs)",
                self.next_seqno, self.held_here
            ))
            .to_connect());
        }
        self.held_here += size;
        self.held_total.fetch_add(size, Ordering::Relaxed);
        self.waiting.insert(seqno, (size, message));
        Ok(())
    }

    /// The next append in order, if it has arrived.
    pub(super) fn take_next(&mut self) -> Option<Box<pb::AgentClientMessage>> {
        let (size, m) = self.waiting.remove(&self.next_seqno)?;
        self.release(size);
        self.next_seqno += 1;
        Some(m)
    }

    fn release(&mut self, size: usize) {
        self.held_here -= size;
        self.held_total.fetch_sub(size, Ordering::Relaxed);
    }
}

impl Drop for Inbound {
    fn drop(&mut self) {
        // Whatever still waits out of order stops counting against the registry's bound.
        let held = std::mem::take(&mut self.held_here);
        self.held_total.fetch_sub(held, Ordering::Relaxed);
    }
}

/// The run→client side: encoded frames, kept until read (and a little after, for resumes),
/// and the traffic clock.
pub(super) struct Backlog {
    pub frames: VecDeque<Bytes>,
    /// Index of `frames[0]` in the whole stream.
    pub base: u64,
    /// Frames handed to the current reader.
    pub delivered: u64,
    /// Frames the reader is known to have taken: it asked for the next one after them. A
    /// reader that is replaced or leaves mid-stream gets the frames after this mark again.
    pub(crate) confirmed: u64,
    /// When the run's last frame (its end) was queued.
    pub(crate) ended_at: Option<Instant>,
    /// Generation of the current reader; older readers stop. 0: none came yet.
    pub reader: u64,
    pub(crate) reader_active: bool,
    pub waker: Option<Waker>,
    pub space: Arc<Notify>,
    /// The last append or frame read for this request id.
    pub(crate) last_seen: Instant,
    /// When our run started (it then waits for a first reader).
    pub run_started: Option<Instant>,
}

impl Backlog {
    fn new() -> Self {
        Backlog {
            frames: VecDeque::new(),
            base: 0,
            delivered: 0,
            confirmed: 0,
            ended_at: None,
            reader: 0,
            reader_active: false,
            waker: None,
            space: Arc::default(),
            last_seen: Instant::now(),
            run_started: None,
        }
    }

    pub(super) fn ended(&self) -> bool {
        self.ended_at.is_some()
    }

    pub(super) fn total(&self) -> u64 {
        self.base + self.frames.len() as u64
    }

    pub(super) fn unread(&self) -> usize {
        usize::try_from(self.total() - self.delivered).unwrap_or(usize::MAX)
    }

    /// Queue `frame` (the stream's last when `end`). Nothing goes after the end.
    pub(super) fn push(&mut self, frame: Bytes, end: bool) {
        if self.ended() {
            return;
        }
        self.frames.push_back(frame);
        if end && self.ended_at.is_none() {
            self.ended_at = Some(Instant::now());
        }
        // Keep only what a resuming reader can still need: frames from `confirmed` on.
        while self.base < self.confirmed && !self.frames.is_empty() {
            self.frames.pop_front();
            self.base += 1;
        }
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// The reader asked for more: what it was handed before is taken.
    pub(super) fn confirm(&mut self) {
        self.confirmed = self.delivered;
    }

    /// The reader is gone or replaced: what it was handed but never confirmed goes out again.
    pub(super) fn rewind(&mut self) {
        self.delivered = self.confirmed;
    }

    /// The next unread frame for the current reader.
    pub(super) fn next_unread(&mut self) -> Option<Bytes> {
        if self.delivered >= self.total() {
            return None;
        }
        let pos = usize::try_from(self.delivered - self.base).ok()?;
        let frame = self.frames.get(pos).cloned()?;
        self.delivered += 1;
        self.last_seen = Instant::now();
        self.space.notify_one();
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::Code;

    fn limits() -> PairingLimits {
        PairingLimits {
            max_entries: 8,
            max_held_per_entry: 1000,
            max_held_total: 1500,
            ..PairingLimits::default()
        }
    }

    fn message() -> Box<pb::AgentClientMessage> {
        Box::default()
    }

    fn start_run(e: &RequestPairing) -> CancelProbe {
        let cancel = tokio_util::sync::CancellationToken::new();
        e.run_started(RunFailer::new(cancel.clone()));
        e.backlog().reader = 1; // a reader came
        CancelProbe(cancel)
    }

    struct CancelProbe(tokio_util::sync::CancellationToken);

    /// The abandoned run's entry holds Cursor's cancel as its end for a reader that comes
    /// back, then goes after the linger.
    fn assert_ends_canceled(r: &Pairings) {
        let e = r.get("run").expect("kept for a returning reader");
        let end = e.backlog().frames.back().cloned().expect("an end frame");
        let mut dec = crate::connect::FrameDecoder::new(
            crate::connect::StreamKind::Response,
            Encoding::Identity,
            crate::connect::Limits::default(),
        );
        dec.feed(end);
        let Ok(Some(crate::connect::Frame::End(end))) = dec.next_frame() else {
            panic!("not an end frame");
        };
        let err = end.error.expect("an error end");
        assert_eq!(err.code, Code::Canceled);
        let details = err.decode_error_details().unwrap().expect("ErrorDetails");
        assert_eq!(
            details.error,
            crate::proto::aiserver::v1::error_details::Error::UserAbortedRequest as i32
        );
        assert!(e.backlog().ended());
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_run_with_traffic_is_kept_for_hours() {
        let r = Pairings::new(limits());
        let e = r.get_or_create("run").unwrap();
        let probe = start_run(&e);
        // Three hours of a client that appends a heartbeat every 5 s.
        for _ in 0..(3 * 3600 / 5) {
            tokio::time::sleep(Duration::from_secs(5)).await;
            r.get("run").expect("the entry of a live run").touch();
        }
        r.sweep();
        assert!(r.get("run").is_some());
        assert!(!probe.0.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_run_is_ended_as_abandoned_by_its_client() {
        let r = Pairings::new(limits());
        let e = r.get_or_create("run").unwrap();
        let probe = start_run(&e);
        tokio::time::sleep(limits().run_idle - Duration::from_secs(1)).await;
        r.sweep();
        assert!(!probe.0.is_cancelled(), "not idle long enough yet");
        tokio::time::sleep(Duration::from_secs(2)).await;
        r.sweep();
        assert!(probe.0.is_cancelled());
        assert_ends_canceled(&r);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_whose_reader_never_comes_is_ended_by_the_sweep() {
        let r = Pairings::new(limits());
        let e = r.get_or_create("run").unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        e.run_started(RunFailer::new(cancel.clone()));
        tokio::time::sleep(limits().reader_wait / 2).await;
        e.touch(); // appends keep coming, but nobody reads
        r.sweep();
        assert!(!cancel.is_cancelled());
        tokio::time::sleep(limits().reader_wait).await;
        r.sweep();
        assert!(cancel.is_cancelled());
        assert_ends_canceled(&r);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_run_goes_when_read_or_after_the_linger() {
        let r = Pairings::new(limits());
        // Read to the end, reader gone: forgotten at once.
        let read = r.get_or_create("read").unwrap();
        start_run(&read);
        read.backlog().push(Bytes::from_static(b"end"), true);
        assert!(read.backlog().next_unread().is_some());
        r.forget_if_done(&read);
        assert!(r.get("read").is_none());
        // Never read: kept for a reader to come, then forgotten.
        let unread = r.get_or_create("unread").unwrap();
        start_run(&unread);
        unread.backlog().push(Bytes::from_static(b"end"), true);
        r.forget_if_done(&unread);
        tokio::time::sleep(limits().linger / 2).await;
        r.sweep();
        assert!(r.get("unread").is_some());
        tokio::time::sleep(limits().linger).await;
        r.sweep();
        assert!(r.get("unread").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn ten_thousand_abandoned_ids_leave_nothing_behind() {
        let r = Pairings::new(PairingLimits {
            max_entries: 20_000,
            ..PairingLimits::default()
        });
        for i in 0..10_000 {
            let e = r.get_or_create(&format!("id-{i}")).unwrap();
            // Half of them hold an out-of-order append that never gets its predecessor.
            if i % 2 == 0 {
                e.state.lock().await.hold(5, 100, message()).unwrap();
            }
        }
        assert_eq!(r.len(), 10_000);
        assert_eq!(r.held_bytes(), 5_000 * 100);
        // The background sweep, not another request, clears them.
        tokio::time::sleep(PairingLimits::default().pending_idle + SWEEP_EVERY * 2).await;
        assert_eq!(r.len(), 0);
        assert_eq!(r.held_bytes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_registry_refuses_new_ids_and_keeps_the_others() {
        let r = Pairings::new(limits());
        for i in 0..8 {
            start_run(&r.get_or_create(&format!("run-{i}")).unwrap());
        }
        let err = r.get_or_create("one-more").err().expect("refused");
        assert_eq!(err.code, Code::ResourceExhausted);
        for i in 0..8 {
            assert!(r.get_or_create(&format!("run-{i}")).is_ok());
        }
        // Once runs end and are read, room comes back.
        let e = r.get("run-0").unwrap();
        e.backlog().push(Bytes::new(), true);
        e.backlog().next_unread();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(r.get_or_create("one-more").is_ok());
    }

    #[tokio::test]
    async fn held_bytes_are_bounded_per_entry_and_in_total() {
        let r = Pairings::new(limits());
        let a = r.get_or_create("a").unwrap();
        let b = r.get_or_create("b").unwrap();
        let mut sa = a.state.lock().await;
        sa.hold(2, 900, message()).unwrap();
        let err = sa.hold(3, 200, message()).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
        let mut sb = b.state.lock().await;
        sb.hold(2, 500, message()).unwrap();
        assert!(sb.hold(3, 200, message()).is_err(), "over the total bound");
        assert_eq!(r.held_bytes(), 1400);
        // Delivered in order: the bytes are released.
        sa.next_seqno = 2;
        assert!(sa.take_next().is_some());
        assert_eq!(r.held_bytes(), 500);
        drop(sb);
        drop(b);
        drop(sa);
        drop(a);
        r.get("b").unwrap();
        // Forgetting an entry releases what it held.
        r.shared.map.lock().unwrap().entries.clear();
        assert_eq!(r.held_bytes(), 0);
    }

    /// Appends in hand (waiting for append 0, their turn or room in the run's inbox) count
    /// against the held bounds, per entry and in total, until they are answered.
    #[test]
    fn appends_in_hand_are_counted_and_bounded() {
        let r = Pairings::new(limits());
        let a = r.get_or_create("a").unwrap();
        let b = r.get_or_create("b").unwrap();
        let first = a.wait_room(1, 600).unwrap();
        let second = a.wait_room(2, 400).unwrap();
        assert_eq!(r.held_bytes(), 1000);
        let err = a.wait_room(3, 1).err().expect("over the entry's bound");
        assert_eq!(err.code, Code::ResourceExhausted);
        assert!(
            err.message.contains("1000 bytes of this run's appends"),
            "{}",
            err.message
        );
        assert_eq!(r.held_bytes(), 1000, "a refused append holds nothing");
        let other = b.wait_room(1, 500).unwrap();
        assert!(b.wait_room(2, 1).is_err(), "over the total bound");
        drop((first, second));
        assert_eq!(r.held_bytes(), 500);
        // One append alone always fits, even over the entry's bound.
        let big = a.wait_room(4, 1000).unwrap();
        assert_eq!(r.held_bytes(), 1500);
        drop((big, other));
        assert_eq!(r.held_bytes(), 0);
    }
}
