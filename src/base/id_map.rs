//! Values by id (a request id, a conversation id), bounded in count and in idle time, so what a
//! long-running proxy remembers per id cannot grow without limit. Each write renews the id;
//! when full, the id written longest ago goes first. Not synchronised: owners keep it behind
//! their own lock.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

// Tokio's clock, so the lifetimes are tested over hours on the paused clock.
use tokio::time::Instant;

pub(crate) struct IdMap<V> {
    entries: HashMap<String, Entry<V>>,
    /// Ids in the order they were written, with the write's number; an id written again has
    /// an older copy here that no longer matches its entry and is skipped.
    order: VecDeque<(String, u64)>,
    /// Numbers the writes (times may be equal).
    writes: u64,
    max: usize,
    idle: Duration,
}

struct Entry<V> {
    value: V,
    at: Instant,
    write: u64,
}

impl<V> IdMap<V> {
    /// At most `max` ids (at least one), each forgotten `idle` after it was last written.
    pub(crate) fn new(max: usize, idle: Duration) -> Self {
        IdMap {
            entries: HashMap::new(),
            order: VecDeque::new(),
            writes: 0,
            max: max.max(1),
            idle,
        }
    }

    /// Set `id` to `value` and renew it.
    pub(crate) fn insert(&mut self, id: &str, value: V) {
        let now = Instant::now();
        self.writes += 1;
        let write = self.writes;
        self.entries.insert(
            id.to_owned(),
            Entry {
                value,
                at: now,
                write,
            },
        );
        self.order.push_back((id.to_owned(), write));
        self.forget_idle(now);
        while self.entries.len() > self.max && self.pop_oldest().is_some() {}
        // Stale copies of renewed ids are dropped once they outnumber the live ones.
        if self.order.len() > 2 * self.max {
            let entries = &self.entries;
            self.order
                .retain(|(id, w)| entries.get(id).is_some_and(|e| e.write == *w));
        }
    }

    /// The value of `id`, unless it was forgotten.
    pub(crate) fn get(&self, id: &str) -> Option<&V> {
        let e = self.entries.get(id)?;
        (e.at.elapsed() < self.idle).then_some(&e.value)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<V> {
        // Its copies in `order` no longer match an entry and are skipped.
        self.entries.remove(id).map(|e| e.value)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Forget the ids idle for too long (the oldest writes come first in `order`).
    fn forget_idle(&mut self, now: Instant) {
        while let Some((id, write)) = self.order.front() {
            match self.entries.get(id) {
                Some(e) if e.write == *write && now.duration_since(e.at) < self.idle => break,
                _ => {
                    self.pop_oldest();
                }
            }
        }
    }

    /// Drop the front of `order`, and its entry when that write was the entry's last; `None`
    /// when `order` is empty.
    fn pop_oldest(&mut self) -> Option<()> {
        let (id, write) = self.order.pop_front()?;
        if self.entries.get(&id).is_some_and(|e| e.write == write) {
            self.entries.remove(&id);
        }
        Some(())
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
        assert_eq!(m.get("c"), None);
        assert_eq!(
            (m.get("a"), m.get("d"), m.get("e")),
            (Some(&10), Some(&4), Some(&5))
        );
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
        assert!(
            m.get("new").is_none(),
            "forgotten exactly `idle` after its write"
        );
    }
}
