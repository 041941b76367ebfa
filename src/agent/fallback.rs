//! Fallback chains: a model's ordered targets (provider + model, with parameters of their own).
//!
//! A call goes to the first target that is not cooling down (the conversation's own target
//! first, while it works). A target that fails before any output, in one of the configured
//! ways, is cooled down and the call moves on; once a first event has arrived there is no
//! switch. Cool-downs and which target serves a conversation are shared by every run (in
//! [`Health`]), on tokio's clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::base::id_map::IdMap;
use crate::config::{FailoverOn, FallbackConfig};
use crate::provider::{
    Price, ProviderClient, ProviderError, ProviderErrorKind, ProviderEvent, ProviderRequest,
    ProviderStream, RequestOptions,
};
use crate::status::FallbackRoute;

/// Conversations remembered, and for how long after their last call.
const STICKY_MAX: usize = 4096;
const STICKY_TTL: Duration = Duration::from_secs(6 * 3600);
/// The longest `retry-after` waited for on a target before its own retries (the client's
/// `max_retry_after` default).
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// One place a model's requests may go.
#[derive(Debug, Clone)]
pub struct Target {
    /// `provider/model`, as the page and the log show it.
    pub label: String,
    pub client: ProviderClient,
    /// The provider's model name.
    pub model: String,
    /// Set fields replace the run's own options.
    pub options: RequestOptions,
    pub price: Option<Price>,
}

impl Target {
    fn apply(&self, req: &mut ProviderRequest) {
        req.model.clone_from(&self.model);
        let (o, mine) = (&mut req.options, &self.options);
        if mine.max_output_tokens.is_some() {
            o.max_output_tokens = mine.max_output_tokens;
        }
        if mine.temperature.is_some() {
            o.temperature = mine.temperature;
        }
        if mine.reasoning_effort.is_some() {
            o.reasoning_effort.clone_from(&mine.reasoning_effort);
        }
        if mine.thinking_budget.is_some() {
            o.thinking_budget = mine.thinking_budget;
        }
    }
}

/// When to move on, and how long a failed target is skipped.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub on: Vec<FailoverOn>,
    pub(crate) first_token_timeout: Duration,
    pub(crate) cooldown: Duration,
    pub(crate) max_cooldown: Duration,
}

impl Policy {
    pub fn from_config(c: &FallbackConfig) -> Policy {
        Policy {
            on: c.on.clone(),
            first_token_timeout: Duration::from_secs(c.first_token_timeout_secs.max(1)),
            cooldown: Duration::from_secs(c.cooldown_secs.max(1)),
            max_cooldown: Duration::from_secs(c.max_cooldown_secs.max(c.cooldown_secs).max(1)),
        }
    }

    /// Does this error, before any output, hand the call on?
    fn fails_over(&self, e: &ProviderError) -> bool {
        let class = match e.kind {
            ProviderErrorKind::Network => FailoverOn::Connect,
            ProviderErrorKind::RateLimited { .. } => FailoverOn::RateLimit,
            ProviderErrorKind::Server => FailoverOn::Server,
            ProviderErrorKind::Overloaded => FailoverOn::Overloaded,
            ProviderErrorKind::Timeout => FailoverOn::Timeout,
            _ => return false,
        };
        self.on.contains(&class)
    }

    /// The cool-down after the `failures`-th failure in a row: doubling, capped.
    fn cooldown_after(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.cooldown
            .checked_mul(factor)
            .unwrap_or(self.max_cooldown)
            .min(self.max_cooldown)
    }
}

#[derive(Debug)]
struct Cooldown {
    failures: u32,
    until: Instant,
    why: String,
}

struct HealthState {
    cooling: HashMap<String, Cooldown>,
    /// Conversation id → the target label of its last call.
    sticky: IdMap<String>,
}

impl Default for HealthState {
    fn default() -> Self {
        HealthState {
            cooling: HashMap::new(),
            sticky: IdMap::new(STICKY_MAX, STICKY_TTL),
        }
    }
}

impl std::fmt::Debug for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthState")
            .field("cooling", &self.cooling)
            .field("sticky", &self.sticky.len())
            .finish()
    }
}

/// Cool-downs and conversation targets, shared by every run of a server.
#[derive(Debug, Clone, Default)]
pub(crate) struct Health {
    inner: Arc<Mutex<HealthState>>,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long `label` is still skipped, and why; `None`: available.
    pub fn cooling(&self, label: &str) -> Option<(Duration, String)> {
        let now = Instant::now();
        let state = self.lock();
        let c = state.cooling.get(label)?;
        (c.until > now).then(|| (c.until - now, c.why.clone()))
    }

    /// `label` failed: skip it for the next cool-down.
    pub fn failed(&self, label: &str, why: &str, policy: &Policy) -> Duration {
        let now = Instant::now();
        let mut state = self.lock();
        let c = state.cooling.entry(label.to_string()).or_insert(Cooldown {
            failures: 0,
            until: now,
            why: String::new(),
        });
        c.failures = c.failures.saturating_add(1);
        let wait = policy.cooldown_after(c.failures);
        c.until = now + wait;
        c.why = why.to_string();
        wait
    }

    /// `label` served a call: its backoff starts over.
    pub fn succeeded(&self, label: &str) {
        self.lock().cooling.remove(label);
    }

    /// The target that served `conversation` last, if that was recent.
    pub(crate) fn sticky(&self, conversation: &str) -> Option<String> {
        self.lock().sticky.get(conversation).cloned()
    }

    /// Remember that `label` serves `conversation`; the map stays bounded.
    pub(crate) fn stick(&self, conversation: &str, label: &str) {
        self.lock().sticky.insert(conversation, label.to_string());
    }

    #[cfg(test)]
    fn sticky_len(&self) -> usize {
        self.lock().sticky.len()
    }
}

/// A model's targets, for one run.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    pub targets: Vec<Target>,
    /// `label: reason` of configured targets that cannot be used (no API key).
    pub unusable: Vec<String>,
    pub policy: Policy,
    pub(crate) health: Health,
    pub conversation: Option<String>,
}

/// A call that is under way: its first event has arrived (it may be the error that ended it).
pub(crate) struct Opened {
    pub first: ProviderEvent,
    pub stream: ProviderStream,
    /// Index into [`Chain::targets`].
    pub target: usize,
    pub route: FallbackRoute,
}

impl Chain {
    /// The order to try: the conversation's target if available, then available targets in
    /// order, then cooling ones as a last resort (each with why it is cooling).
    fn order(&self) -> Vec<(usize, Option<String>)> {
        let sticky = self
            .conversation
            .as_deref()
            .and_then(|c| self.health.sticky(c));
        let mut ready = Vec::new();
        let mut cooling = Vec::new();
        for (i, t) in self.targets.iter().enumerate() {
            match self.health.cooling(&t.label) {
                Some((left, why)) => cooling.push((
                    i,
                    Some(format!(
                        "cooling down for {} s more after: {why}",
                        left.as_secs().max(1)
                    )),
                )),
                None if sticky.as_deref() == Some(t.label.as_str()) => ready.insert(0, (i, None)),
                None => ready.push((i, None)),
            }
        }
        ready.extend(cooling);
        ready
    }

    /// The stream's first event, within the first-token timeout when another target could
    /// take over (`Err` when it passed).
    async fn first_event(
        &self,
        target: &Target,
        stream: &mut ProviderStream,
        more: bool,
    ) -> Result<ProviderEvent, tokio::time::error::Elapsed> {
        let first = if more && self.policy.on.contains(&FailoverOn::Timeout) {
            tokio::time::timeout(self.policy.first_token_timeout, stream.recv()).await
        } else {
            Ok(stream.recv().await)
        };
        first.map(|ev| {
            ev.unwrap_or_else(|| {
                ProviderEvent::Error(ProviderError::truncated(target.client.name()))
            })
        })
    }

    /// Start `request` on the first target that produces a first event, in [`Chain::order`].
    /// The last target tried always answers, with its first event or its error.
    pub async fn open(&self, request: ProviderRequest, cancel: &CancellationToken) -> Opened {
        let order = self.order();
        let last = order.len().saturating_sub(1);
        let mut skipped = self.unusable.clone();
        let mut request = Some(request);
        let mut pos = 0;
        loop {
            let i = order.get(pos).map_or(0, |(i, _)| *i);
            let target = &self.targets[i];
            // Extra headers naming the conversation id get this conversation's.
            let client = target.client.for_conversation(self.conversation.as_deref());
            let more = pos < last;
            let mut req = match more {
                true => request.clone().unwrap_or_default(),
                false => request.take().unwrap_or_default(),
            };
            target.apply(&mut req);
            // With a target after this one, a failure hands over at once: the client's own
            // retries (which honour `retry-after`, up to a minute) would only delay the switch.
            let retry_here = more.then(|| req.clone());
            let mut stream = match more {
                true => client.stream_once(req, cancel.child_token()),
                false => client.stream(req, cancel.child_token()),
            };
            let mut first = self.first_event(target, &mut stream, more).await;
            if let (Ok(ProviderEvent::Error(e)), Some(req)) = (&first, retry_here) {
                if e.retryable() && !self.policy.fails_over(e) {
                    // A retryable failure this chain does not fail over on: the target's usual
                    // retries, as without a chain.
                    tracing::debug!(target = %target.label, error = %e, "retrying on the same target");
                    if let Some(wait) = e.retry_after() {
                        tokio::select! {
                            _ = cancel.cancelled() => {}
                            _ = tokio::time::sleep(wait.min(RETRY_AFTER_MAX)) => {}
                        }
                    }
                    stream = client.stream(req, cancel.child_token());
                    first = self.first_event(target, &mut stream, more).await;
                }
            }
            let why = match first {
                Err(_) => {
                    let why = format!(
                        "no first token within {} s",
                        self.policy.first_token_timeout.as_secs()
                    );
                    self.health.failed(&target.label, &why, &self.policy);
                    why
                }
                Ok(ProviderEvent::Error(e)) if self.policy.fails_over(&e) => {
                    let why = e.to_string();
                    self.health.failed(&target.label, &why, &self.policy);
                    if !more {
                        return self.served(i, ProviderEvent::Error(e), stream, skipped);
                    }
                    why
                }
                Ok(ev) => {
                    if !matches!(ev, ProviderEvent::Error(_)) {
                        self.health.succeeded(&target.label);
                        if let Some(c) = &self.conversation {
                            self.health.stick(c, &target.label);
                        }
                    }
                    // Cooling targets come last: those not reached were passed over for it.
                    skipped.extend(order[pos + 1..].iter().filter_map(|(j, note)| {
                        note.as_ref()
                            .map(|n| format!("{}: {n}", self.targets[*j].label))
                    }));
                    return self.served(i, ev, stream, skipped);
                }
            };
            tracing::warn!(
                target = %target.label,
                "provider target failed before any output, trying the next: {why}"
            );
            skipped.push(format!("{}: {why}", target.label));
            pos += 1;
        }
    }

    fn served(
        &self,
        i: usize,
        first: ProviderEvent,
        stream: ProviderStream,
        skipped: Vec<String>,
    ) -> Opened {
        Opened {
            first,
            stream,
            target: i,
            route: FallbackRoute {
                target: Some(self.targets[i].label.clone()),
                skipped,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(on: &[FailoverOn]) -> Policy {
        Policy {
            on: on.to_vec(),
            first_token_timeout: Duration::from_secs(60),
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(900),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn cooldowns_double_to_their_cap_over_hours_and_reset_after_a_success() {
        let p = policy(&[FailoverOn::Server]);
        let h = Health::default();
        assert!(h.cooling("a/m").is_none());
        let mut waits = Vec::new();
        for _ in 0..8 {
            let wait = h.failed("a/m", "HTTP 503", &p);
            let (left, why) = h.cooling("a/m").unwrap();
            assert_eq!((left, why.as_str()), (wait, "HTTP 503"));
            tokio::time::advance(wait - Duration::from_secs(1)).await;
            assert!(
                h.cooling("a/m").is_some(),
                "still cooling 1 s before the end"
            );
            tokio::time::advance(Duration::from_secs(1)).await;
            assert!(h.cooling("a/m").is_none());
            waits.push(wait.as_secs());
            // An hour of quiet does not reset the backoff: only a success does.
            tokio::time::advance(Duration::from_secs(3600)).await;
        }
        assert_eq!(waits, [30, 60, 120, 240, 480, 900, 900, 900]);
        assert!(h.cooling("b/m").is_none(), "targets cool down one by one");
        h.succeeded("a/m");
        assert_eq!(h.failed("a/m", "HTTP 429", &p), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn conversations_stick_for_a_while_in_a_bounded_map() {
        let h = Health::default();
        h.stick("conv-1", "backup/m");
        assert_eq!(h.sticky("conv-1").as_deref(), Some("backup/m"));
        tokio::time::advance(STICKY_TTL - Duration::from_secs(1)).await;
        assert_eq!(h.sticky("conv-1").as_deref(), Some("backup/m"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(h.sticky("conv-1"), None, "expired");
        for i in 0..STICKY_MAX + 10 {
            h.stick(&format!("c{i}"), "a/m");
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert_eq!(h.sticky_len(), STICKY_MAX);
        assert_eq!(h.sticky("c0"), None, "the oldest went first");
        assert!(h.sticky(&format!("c{}", STICKY_MAX + 9)).is_some());
    }

    #[test]
    fn only_the_configured_failures_fail_over() {
        let err = |kind| ProviderError::new(kind, "P", "x");
        let p = policy(&[FailoverOn::RateLimit, FailoverOn::Connect]);
        assert!(p.fails_over(&err(ProviderErrorKind::RateLimited { retry_after: None })));
        assert!(p.fails_over(&err(ProviderErrorKind::Network)));
        assert!(!p.fails_over(&err(ProviderErrorKind::Server)));
        assert!(!p.fails_over(&err(ProviderErrorKind::Auth)));
        assert!(!p.fails_over(&err(ProviderErrorKind::Canceled)));
        let all = Policy::from_config(&FallbackConfig::default());
        assert!(all.fails_over(&err(ProviderErrorKind::Overloaded)));
        assert!(all.fails_over(&err(ProviderErrorKind::Timeout)));
        assert!(!all.fails_over(&err(ProviderErrorKind::InvalidRequest)));
    }
}
