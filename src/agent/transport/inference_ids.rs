//! The request ids that `RunInferenceSSE` / `RunInferencePoll` opened, so that their
//! `BidiAppend`s are read as `RunInferenceClientMessage`s (whose field 1 is not the
//! `AgentClientMessage`'s) and never as agent messages. Bounded in count and time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Request ids kept at most (the oldest goes first when full).
const MAX_IDS: usize = 4096;
/// An id not seen for this long is forgotten (a run attempt's appends come within it).
const IDLE: Duration = Duration::from_secs(30 * 60);

/// What is known of one inference request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InferenceVerdict {
    /// Not (yet) known to be ours: its appends are read one by one.
    Open,
    /// Refused, with the reason: every later append and stream on it is refused too.
    Refused(String),
}

#[derive(Default)]
pub struct InferenceIds {
    map: Mutex<HashMap<String, (InferenceVerdict, Instant)>>,
}

impl InferenceIds {
    /// Note `request_id` as an inference stream's; keeps a refusal already recorded.
    pub fn open(&self, request_id: &str) -> InferenceVerdict {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if !map.contains_key(request_id) {
            map.retain(|_, (_, seen)| now.duration_since(*seen) < IDLE);
            if map.len() >= MAX_IDS {
                let oldest = map
                    .iter()
                    .min_by_key(|(_, (_, seen))| *seen)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    map.remove(&k);
                }
            }
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
        map.get(request_id)
            .filter(|(_, seen)| seen.elapsed() < IDLE)
            .map(|(v, _)| v.clone())
    }

    /// Refuse `request_id` from now on.
    pub fn refuse(&self, request_id: &str, reason: &str) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(
            request_id.to_owned(),
            (InferenceVerdict::Refused(reason.to_owned()), Instant::now()),
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
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
}
