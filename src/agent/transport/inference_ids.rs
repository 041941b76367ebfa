//! The request ids that `RunInferenceSSE` / `RunInferencePoll` opened, so that their
//! `BidiAppend`s are read as `RunInferenceClientMessage`s (whose field 1 is not the
//! `AgentClientMessage`'s) and never as agent messages. Bounded in count and time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

// Tokio's clock, so the lifetime is tested over hours on the paused clock.
use tokio::time::Instant;

/// Request ids kept at most (the oldest goes first when full).
const MAX_IDS: usize = 4096;
/// An open id not seen for this long is forgotten (a run attempt's appends come within it); a
/// refused one is kept until the count bound evicts it, so its late appends stay refused.
const IDLE: Duration = Duration::from_secs(30 * 60);

/// What is known of one inference request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InferenceVerdict {
    /// Not (yet) known to be ours: its appends are read one by one.
    Open,
    /// Refused, with the reason: every later append and stream on it is refused too.
    Refused(String),
}

#[derive(Default)]
pub(crate) struct InferenceIds {
    map: Mutex<HashMap<String, (InferenceVerdict, Instant)>>,
}

impl InferenceIds {
    /// Note `request_id` as an inference stream's; keeps a refusal already recorded.
    pub fn open(&self, request_id: &str) -> InferenceVerdict {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if !map.contains_key(request_id) {
            make_room(&mut map, now);
        }
        let entry = map
            .entry(request_id.to_owned())
            .or_insert((InferenceVerdict::Open, now));
        entry.1 = now;
        entry.0.clone()
    }

    /// The verdict on `request_id`, if an inference stream opened it.
    pub fn get(&self, request_id: &str) -> Option<InferenceVerdict> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        map.get(request_id)
            .filter(|(v, seen)| live(v, *seen, now))
            .map(|(v, _)| v.clone())
    }

    /// Refuse `request_id` from now on.
    pub fn refuse(&self, request_id: &str, reason: &str) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if !map.contains_key(request_id) {
            make_room(&mut map, now);
        }
        map.insert(
            request_id.to_owned(),
            (InferenceVerdict::Refused(reason.to_owned()), now),
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Whether an entry still counts: a refusal always, an open id until it has been idle too long.
fn live(v: &InferenceVerdict, seen: Instant, now: Instant) -> bool {
    matches!(v, InferenceVerdict::Refused(_)) || now.duration_since(seen) < IDLE
}

/// Drop what no longer counts and, when still full, the oldest entry (an open one first).
fn make_room(map: &mut HashMap<String, (InferenceVerdict, Instant)>, now: Instant) {
    map.retain(|_, (v, seen)| live(v, *seen, now));
    if map.len() < MAX_IDS {
        return;
    }
    let oldest = map
        .iter()
        .min_by_key(|(_, (v, seen))| (matches!(v, InferenceVerdict::Refused(_)), *seen))
        .map(|(k, _)| k.clone());
    if let Some(k) = oldest {
        map.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_and_refusals_stick() {
        let ids = InferenceIds::default();
        for i in 0..MAX_IDS + 10 {
            ids.open(&format!("r{i}"));
        }
        assert_eq!(ids.len(), MAX_IDS);
        assert_eq!(ids.get("r0"), None, "the oldest went first");
        ids.refuse("x", "ours");
        assert_eq!(
            ids.open("x"),
            InferenceVerdict::Refused("ours".into()),
            "a later stream keeps the refusal"
        );
        assert_eq!(
            ids.get(&format!("r{}", MAX_IDS + 9)),
            Some(InferenceVerdict::Open)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn open_ids_expire_and_refusals_last_over_hours() {
        let ids = InferenceIds::default();
        ids.open("open");
        ids.open("refused");
        ids.refuse("refused", "ours");
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        assert_eq!(ids.get("open"), Some(InferenceVerdict::Open));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(ids.get("open"), None, "an idle open id is forgotten");
        // Hours of other streams coming and going: the count stays bounded, and the refusal
        // holds for a late append.
        for hour in 0..6 {
            for i in 0..100 {
                ids.open(&format!("h{hour}-{i}"));
            }
            tokio::time::advance(Duration::from_secs(3600)).await;
            assert!(ids.len() <= 101, "{}", ids.len());
        }
        assert_eq!(
            ids.get("refused"),
            Some(InferenceVerdict::Refused("ours".into()))
        );
        assert_eq!(
            ids.open("refused"),
            InferenceVerdict::Refused("ours".into())
        );
    }
}
