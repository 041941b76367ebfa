//! The "ours or Cursor's" decision for agent runs, pinned by request id so later frames
//! without a model follow the first one. Conversations are pinned in [`super::pins`] only.

use std::sync::Mutex;
use std::time::Duration;

use crate::agent::model;
use crate::agent::RunError;
use crate::base::id_map::IdMap;
use crate::connect::ConnectError;
use crate::proto::agent::v1 as pb;

/// Where a run goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Ours, on this configured model id (as Cursor names it, variant included).
    Ours { model_id: String },
    /// Cursor's: relayed upstream untouched.
    Relay,
}

/// Remembers decisions by request id. Bounded and expiring, so it cannot grow without limit on a
/// long-running proxy.
pub struct RoutingTable {
    decisions: Mutex<IdMap<Decision>>,
}

impl Default for RoutingTable {
    fn default() -> Self {
        RoutingTable::new(Duration::from_secs(24 * 3600), 10_000)
    }
}

impl RoutingTable {
    pub fn new(ttl: Duration, max: usize) -> Self {
        RoutingTable {
            decisions: Mutex::new(IdMap::new(max, ttl)),
        }
    }

    fn decisions(&self) -> std::sync::MutexGuard<'_, IdMap<Decision>> {
        self.decisions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn pin_request(&self, request_id: &str, d: Decision) {
        self.decisions().insert(request_id, d);
    }

    pub fn request(&self, request_id: &str) -> Option<Decision> {
        self.decisions().get(request_id).cloned()
    }
}

/// A run decided ours by its conversation's pin (a resume that names no model, or one of
/// Cursor's) runs on the model its conversation is pinned to.
pub(super) fn with_pinned_model(
    mut run: pb::AgentRunRequest,
    decision: &Decision,
) -> pb::AgentRunRequest {
    if let Decision::Ours { model_id } = decision {
        if model::requested_model_id(&run) != Some(model_id.as_str()) {
            run.requested_model
                .get_or_insert_with(Default::default)
                .model_id = model_id.clone();
        }
    }
    run
}

/// How long a RunSSE on a request id whose run of ours ended waits for a new run's append 0.
pub(super) const DECIDE_WAIT: Duration = Duration::from_secs(2);
/// How long a run waits for what decides whose it is (a `Run`'s first frame, a RunSSE's or an
/// append's append 0) while its client keeps the request open: the idle limit of a run. Never
/// a reason to relay: past it the request ends with an error.
pub(super) const UNDECIDED_WAIT: Duration = Duration::from_secs(600);

/// The error for a run whose deciding message never came.
pub(super) fn never_decided(what: &str) -> ConnectError {
    RunError::NeverDecided(format!(
        "{what} within {} s, so nothing says whether this run is on your own model or on \
         Cursor's",
        UNDECIDED_WAIT.as_secs()
    ))
    .to_connect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_bounded() {
        let t = RoutingTable::new(Duration::from_secs(60), 2);
        t.pin_request("a", Decision::Relay);
        t.pin_request(
            "c",
            Decision::Ours {
                model_id: "byok-x".into(),
            },
        );
        t.pin_request("b", Decision::Relay);
        assert_eq!(t.request("a"), None);
        assert_eq!(
            t.request("c"),
            Some(Decision::Ours {
                model_id: "byok-x".into()
            })
        );
        assert_eq!(t.request("b"), Some(Decision::Relay));
    }

    /// A pin lives its day, on tokio's clock: kept at 23 h 59 min, gone at 24 h.
    #[tokio::test(start_paused = true)]
    async fn pins_expire_after_their_lifetime() {
        let t = RoutingTable::default();
        t.pin_request("r", Decision::Relay);
        tokio::time::advance(Duration::from_secs(24 * 3600 - 60)).await;
        assert_eq!(t.request("r"), Some(Decision::Relay));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(t.request("r"), None);
    }
}
