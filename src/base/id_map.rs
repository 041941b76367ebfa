//! Values by id (a request id, a conversation id), bounded in count and in idle time, so what a
//! long-running proxy remembers per id cannot grow without limit. Each write renews the id;
//! when full, the id written longest ago goes first. Not synchronised: owners keep it behind
//! their own lock.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

// Tokio's clock, so the lifetimes are tested over hours on the paused clock.
use tokio::time::Instant;

pub(crate) struct IdMap<V> {
    entries: HashMap<String, (V, Instant)>,
    /// Ids in the order they were written, with the write's time; an id written again has an
    /// older copy here that no longer matches its entry and is skipped.
    order: VecDeque<(String, Instant)>,
    max: usize,
    idle: Duration,
}

impl<V> IdMap<V> {
    /// At most `max` ids (at least one), each forgotten `idle` after it was last written.
    pub(crate) fn new(max: usize, idle: Duration) -> Self {
        IdMap {
            entries: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
            idle,
        }
    }

    /// Set `id` to `value` and renew it.
    pub(crate) fn insert(&mut self, id: &str, value: V) {
        let now = Instant::now();
        self.entries.insert(id.to_owned(), (value, now));
        self.written(id, now);
    }

    /// The value of `id`, unless it was forgotten.
    pub(crate) fn get(&self, id: &str) -> Option<&V> {
        let (value, at) = self.entries.get(id)?;
        (at.elapsed() < self.idle).then_some(value)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<V> {
        // Its copies in `order` no longer match an entry and are skipped.
        self.entries.remove(id).map(|(v, _)| v)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn written(&mut self, id: &str, now: Instant) {
        self.order.push_back((id.to_owned(), now));
        self.forget_idle(now);
        while self.entries.len() > self.max {
            if !self.pop_oldest() {
                break;
            }
        }
        // Stale copies of renewed ids are dropped once they outnumber the live ones.
        if self.order.len() > 2 * self.max {
            let entries = &self.entries;
            self.order
                .retain(|(id, at)| entries.get(id).is_some_and(|(_, seen)| seen == at));
        }
    }

    /// Forget the ids idle for too long (they sit at the front of `order`).
    fn forget_idle(&mut self, now: Instant) {
        while let Some((_, at)) = self.order.front() {
            if now.duration_since(*at) < self.idle {
                break;
            }
            self.pop_oldest();
        }
    }

    /// Drop the front of `order` and its entry when the entry was last written then; `false`
    /// when `order` is empty.
    fn pop_oldest(&mut self) -> bool {
        let Some((id, at)) = self.order.pop_front() else {
            return false;
        };
        if self.entries.get(&id).is_some_and(|(_, seen)| *seen == at) {
            self.entries.remove(&id);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_written_longest_ago_goes_first() {
        let mut m = IdMap::new(3, Duration::from_secs(60));
        m.insert("a", 1);
        m.insert("b", 2);
        m.insert("c", 3);
        m.insert("a", 10); // renewed: "b" is now the oldest
        m.insert("d", 4);
        assert_eq!(m.len(), 3);
        assert_eq!(m.get("b"), None);
        assert_eq!(m.get("a"), Some(&10));
        m.insert("e", 5);
        assert_eq!(m.get("a"), None);
        assert_eq!((m.get("c"), m.get("d"), m.get("e")), (Some(&3), Some(&4), Some(&5)));
    }

    #[test]
    fn renewing_one_id_for_ever_keeps_the_order_bounded() {
        let mut m = IdMap::new(4, Duration::from_secs(60));
        m.insert("other", 0);
        for i in 0..10_000 {
            m.insert("hot", i);
        }
        assert!(m.order.len() <= 2 * 4 + 1, "{}", m.order.len());
        assert_eq!((m.get("other"), m.get("hot")), (Some(&0), Some(&9_999)));
        assert_eq!(m.remove("hot"), Some(9_999));
        m.insert("x", 1);
        assert_eq!(m.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_lives_while_it_is_renewed_over_hours() {
        let idle = Duration::from_secs(30 * 60);
        let mut m = IdMap::new(100, idle);
        m.insert("once", ());
        for _ in 0..12 {
            m.insert("kept", ());
            tokio::time::advance(Duration::from_secs(20 * 60)).await;
            assert!(m.get("kept").is_some());
        }
        assert!(m.get("once").is_none());
        m.insert("new", ());
        assert_eq!(m.len(), 2, "the idle id is gone from the map too");
        tokio::time::advance(idle).await;
        assert!(m.get("new").is_none(), "forgotten exactly `idle` after its write");
    }
}
