//! The request ids of Cursor's own HTTP/1.1 server streams (`…SSE` / `…Poll` calls passed
//! upstream), so that a `BidiAppend` we cannot read is relayed only when it belongs to one of
//! them. An unreadable append on an id no stream has named may be the first message of a run
//! on the user's model whose stream is still on its way: it waits a little for that stream,
//! and is refused when none comes. Bounded in count and time.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::base::id_map::IdMap;

/// Request ids kept at most (the oldest goes first when full).
const MAX_IDS: usize = 4096;
/// An id not seen for this long is forgotten: a stream's appends come within it.
const IDLE: Duration = Duration::from_secs(30 * 60);

pub(super) struct CursorStreams {
    ids: Mutex<IdMap<()>>,
    /// Woken on each id noted, for an append that waits for its stream.
    noted: Notify,
}

impl Default for CursorStreams {
    fn default() -> Self {
        CursorStreams {
            ids: Mutex::new(IdMap::new(MAX_IDS, IDLE)),
            noted: Notify::new(),
        }
    }
}

impl CursorStreams {
    fn ids(&self) -> std::sync::MutexGuard<'_, IdMap<()>> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Note `request_id` as a stream of Cursor's own.
    pub(super) fn note(&self, request_id: &str) {
        self.ids().insert(request_id, ());
        self.noted.notify_waiters();
    }

    /// Whether a stream of Cursor's named `request_id` lately.
    pub(super) fn seen(&self, request_id: &str) -> bool {
        self.ids().get(request_id).is_some()
    }

    /// Whether a stream of Cursor's names `request_id` within `wait` (at once when one has).
    pub(super) async fn wait_for(&self, request_id: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            // Registered before the check, so a note between the check and the wait wakes us.
            let noted = self.noted.notified();
            if self.seen(request_id) {
                return true;
            }
            if tokio::time::timeout_at(deadline, noted).await.is_err() {
                return self.seen(request_id);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.ids().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded() {
        let s = CursorStreams::default();
        for i in 0..MAX_IDS + 10 {
            s.note(&format!("id-{i}"));
        }
        assert_eq!(s.len(), MAX_IDS);
        assert!(s.seen(&format!("id-{}", MAX_IDS + 9)));
    }

    #[tokio::test(start_paused = true)]
    async fn ids_expire_after_half_an_hour_idle() {
        let s = CursorStreams::default();
        s.note("a");
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        assert!(s.seen("a"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!s.seen("a"));
        // Over hours: a noted id lives as long as it keeps being noted.
        for _ in 0..12 {
            s.note("b");
            tokio::time::advance(Duration::from_secs(20 * 60)).await;
            assert!(s.seen("b"));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_append_wakes_when_its_stream_is_noted() {
        let s = std::sync::Arc::new(CursorStreams::default());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait_for("late", Duration::from_secs(3)).await }
        });
        tokio::task::yield_now().await;
        s.note("late");
        assert!(waiter.await.unwrap());
        assert!(!s.wait_for("never", Duration::from_secs(3)).await);
    }
}
