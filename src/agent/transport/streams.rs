//! The request ids of Cursor's own HTTP/1.1 server streams (`…SSE` / `…Poll` calls passed
//! upstream), so that a `BidiAppend` we cannot read is relayed only when it belongs to one of
//! them. An unreadable append on an id no stream has named may be the first message of a run
//! on the user's model whose stream is still on its way: it waits a little for that stream,
//! and is refused when none comes. Bounded in count and time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
// Tokio's clock, so the lifetime is tested over hours on the paused clock.
use tokio::time::Instant;

/// Request ids kept at most (the oldest goes first when full).
const MAX_IDS: usize = 4096;
/// An id not seen for this long is forgotten: a stream's appends come within it.
const IDLE: Duration = Duration::from_secs(30 * 60);

#[derive(Default)]
pub(super) struct CursorStreams {
    ids: Mutex<HashMap<String, Instant>>,
    /// Woken on each id noted, for an append that waits for its stream.
    noted: Notify,
}

impl CursorStreams {
    /// Note `request_id` as a stream of Cursor's own.
    pub(super) fn note(&self, request_id: &str) {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if !ids.contains_key(request_id) && ids.len() >= MAX_IDS {
            ids.retain(|_, seen| now.duration_since(*seen) < IDLE);
            if ids.len() >= MAX_IDS {
                let oldest = ids.iter().min_by_key(|(_, s)| **s).map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    ids.remove(&oldest);
                }
            }
        }
        ids.insert(request_id.to_owned(), now);
        drop(ids);
        self.noted.notify_waiters();
    }

    /// Whether a stream of Cursor's named `request_id` lately.
    pub(super) fn seen(&self, request_id: &str) -> bool {
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.get(request_id)
            .is_some_and(|seen| Instant::now().duration_since(*seen) < IDLE)
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
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).len()
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
