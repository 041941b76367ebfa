//! The request ids that `RunInferenceSSE` / `RunInferencePoll` opened, so that their
//! `BidiAppend`s are read as `RunInferenceClientMessage`s (whose field 1 is not the
//! `AgentClientMessage`'s) and never as agent messages. Bounded in count and time.

use std::sync::Mutex;
use std::time::Duration;

use crate::base::id_map::IdMap;

/// Request ids kept at most, of each kind (the oldest goes first when full).
const MAX_IDS: usize = 4096;
/// An open id not seen for this long is forgotten (a run attempt's appends come within it); a
/// refused one is kept until the count bound evicts it, so its late appends stay refused.
const IDLE: Duration = Duration::from_secs(30 * 60);
/// Longer than any proxy lives: refusals leave by the count bound only.
const FOR_EVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What is known of one inference request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InferenceVerdict {
    /// Not (yet) known to be ours: its appends are read one by one.
    Open,
    /// Refused, with the reason: every later append and stream on it is refused too.
    Refused(String),
}

/// Ids are open or refused; the two are bounded apart, so open ids coming and going never
/// push a refusal out.
struct Ids {
    open: IdMap<()>,
    refused: IdMap<String>,
}

pub(crate) struct InferenceIds {
    ids: Mutex<Ids>,
}

impl Default for InferenceIds {
    fn default() -> Self {
        InferenceIds {
            ids: Mutex::new(Ids {
                open: IdMap::new(MAX_IDS, IDLE),
                refused: IdMap::new(MAX_IDS, FOR_EVER),
            }),
        }
    }
}

impl InferenceIds {
    fn ids(&self) -> std::sync::MutexGuard<'_, Ids> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Note `request_id` as an inference stream's; keeps a refusal already recorded.
    pub fn open(&self, request_id: &str) -> InferenceVerdict {
        let mut ids = self.ids();
        if let Some(why) = ids.refused.get(request_id) {
            return InferenceVerdict::Refused(why.clone());
        }
        ids.open.insert(request_id, ());
        InferenceVerdict::Open
    }

    /// The verdict on `request_id`, if an inference stream opened it.
    pub fn get(&self, request_id: &str) -> Option<InferenceVerdict> {
        let ids = self.ids();
        if let Some(why) = ids.refused.get(request_id) {
            return Some(InferenceVerdict::Refused(why.clone()));
        }
        ids.open.get(request_id).map(|()| InferenceVerdict::Open)
    }

    /// Refuse `request_id` from now on.
    pub fn refuse(&self, request_id: &str, reason: &str) {
        let mut ids = self.ids();
        ids.open.remove(request_id);
        ids.refused.insert(request_id, reason.to_owned());
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let ids = self.ids();
        ids.open.len() + ids.refused.len()
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
