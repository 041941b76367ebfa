//! What the proxy is doing, for the live status page: active and recent agent runs, provider
//! latency, totals since start.
//!
//! [`Status`] is a cheap-to-clone handle on one registry per server. A run registers itself with
//! [`Status::run_started`] and gets a [`RunTicket`]; the ticket records the run's end when
//! [`RunTicket::finish`] is called, or as `abandoned` when it is dropped without that (a panic,
//! a task killed at shutdown), so a run can never stay "active" for ever.
//!
//! Nothing secret is stored: model and provider names, token counts, outcome and error text
//! (which is scrubbed of anything shaped like a key before it is kept).
//!
//! ```
//! use cursor_byok::status::{RunStart, Status};
//! let status = Status::new();
//! let ticket = status.run_started(RunStart {
//!     request_id: "req-1".into(),
//!     model: "byok-gpt-5.1".into(),
//!     provider: "OpenAI".into(),
//!     transport: "RunSSE".into(),
//! });
//! ticket.tokens(1200, 0);
//! status.provider_latency("OpenAI", 420);
//! ticket.finish("ok", None, None);
//! assert_eq!(status.snapshot().totals.finished, 1);
//! ```

pub mod pac;
mod page;
mod record;
mod unknown;
pub mod usage;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::provider::Usage;

pub use page::{is_own_path, local_only_answer, respond, PAGE_PATH, PATH_PREFIX, SNAPSHOT_PATH};
pub use record::{run_id, ModelTotals, ProviderLatency, RunRecord, Totals};
pub use unknown::{client_version, UnknownItem, UnknownReport};

/// Finished runs kept for the page; older ones only count in the totals.
pub(crate) const RECENT_RUNS: usize = 100;
/// The charts' window and resolution: the last hour, by minute.
pub(crate) const CHART_MINUTES: usize = 60;
/// Finished runs remembered for the charts (older or beyond this, they only count in totals).
const CHART_POINTS: usize = 20_000;

/// Error text kept per run (the page is a summary; the log has the rest).
const MAX_ERROR_CHARS: usize = 600;

/// What a run says about itself when it starts. No secrets: these are shown on the page.
#[derive(Debug, Clone, Default)]
pub struct RunStart {
    /// Cursor's request id for the run.
    pub request_id: String,
    /// The model id Cursor sees (`byok-…`).
    pub model: String,
    /// The provider's display name.
    pub provider: String,
    /// `Run` (HTTP/2 bidi) or `RunSSE` (HTTP/1.1), or empty when unknown.
    pub transport: String,
}

/// The live registry. Cheap to clone; every clone sees the same runs.
#[derive(Clone)]
pub struct Status {
    inner: Arc<StatusShared>,
}

impl Default for Status {
    fn default() -> Self {
        Status::new()
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("Status")
            .field("active", &state.active.len())
            .field("recent", &state.recent.len())
            .finish_non_exhaustive()
    }
}

struct StatusShared {
    started: Instant,
    started_unix_ms: u64,
    next_id: AtomicU64,
    state: Mutex<Tallies>,
    /// `run --capture`: the traffic trace, when one is being recorded.
    capture: Option<crate::capture::Capture>,
    /// Where finished runs are persisted, once the server set it.
    usage_log: OnceLock<usage::UsageLog>,
    /// The PAC script served at [`pac::PAC_PATH`], once the server knows its address.
    pac: OnceLock<String>,
}

impl StatusShared {
    /// A poisoned lock only means a panic elsewhere mid-update; the counters stay usable.
    fn lock(&self) -> MutexGuard<'_, Tallies> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
struct Tallies {
    active: BTreeMap<u64, Active>,
    recent: VecDeque<RunRecord>,
    providers: HashMap<String, LatencyStats>,
    totals: Totals,
    models: BTreeMap<String, ModelTotals>,
    /// Finished runs of the last hour, oldest first, for the charts.
    chart: VecDeque<ChartPoint>,
    unknown: unknown::Unknowns,
}

/// One finished run, as the charts count it.
#[derive(Debug, Clone)]
struct ChartPoint {
    unix_ms: u64,
    model: String,
    tokens: u64,
    cost_usd: f64,
}

/// One model's last hour, minute by minute (oldest first, the current minute last).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ModelSeries {
    pub model: String,
    /// Tokens in + out of the runs that ended in each minute.
    pub tokens: Vec<u64>,
    /// Dollars of the runs that ended in each minute (priced runs only).
    pub cost_usd: Vec<f64>,
}

/// Bucket `points` into [`CHART_MINUTES`] minutes ending at `now_ms`, one series per model.
fn series<'a>(points: impl Iterator<Item = &'a ChartPoint>, now_ms: u64) -> Vec<ModelSeries> {
    let mut by_model: BTreeMap<&str, ModelSeries> = BTreeMap::new();
    for p in points {
        let age = (now_ms.saturating_sub(p.unix_ms) / 60_000) as usize;
        if age >= CHART_MINUTES {
            continue;
        }
        let s = by_model.entry(&p.model).or_insert_with(|| ModelSeries {
            model: p.model.clone(),
            tokens: vec![0; CHART_MINUTES],
            cost_usd: vec![0.0; CHART_MINUTES],
        });
        let i = CHART_MINUTES - 1 - age;
        s.tokens[i] = s.tokens[i].saturating_add(p.tokens);
        s.cost_usd[i] += p.cost_usd;
    }
    by_model.into_values().collect()
}

struct Active {
    start: RunStart,
    started: Instant,
    started_unix_ms: u64,
    usage: Usage,
    cost_usd: Option<f64>,
    route: FallbackRoute,
}

impl Active {
    fn record(&self, now: Instant) -> RunRecord {
        RunRecord {
            run_id: record::run_id(&self.start.request_id),
            model: self.start.model.clone(),
            provider: self.start.provider.clone(),
            transport: self.start.transport.clone(),
            started_unix_ms: self.started_unix_ms,
            duration_ms: millis(now.saturating_duration_since(self.started)),
            input_tokens: self.usage.input,
            output_tokens: self.usage.output,
            cache_read_tokens: self.usage.cache_read,
            cache_write_tokens: self.usage.cache_write,
            cost_usd: self.cost_usd,
            target: self.route.target.clone(),
            skipped: self.route.skipped.clone(),
            outcome: None,
            error: None,
        }
    }
}

#[derive(Default)]
struct LatencyStats {
    last_ms: u64,
    min_ms: u64,
    max_ms: u64,
    total_ms: u64,
    samples: u64,
    last_unix_ms: u64,
}

/// Which target of a model's fallback chain served a run, and why earlier ones did not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallbackRoute {
    /// `provider/model` of the target that served the (last) call.
    pub target: Option<String>,
    /// `provider/model: reason` for each target passed over.
    pub skipped: Vec<String>,
}

/// Everything the page shows, as served at [`SNAPSHOT_PATH`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusSnapshot {
    /// Always `cursor-byok`: lets `doctor` tell our listener from another program's.
    pub service: String,
    pub version: String,
    pub now_unix_ms: u64,
    pub started_unix_ms: u64,
    pub uptime_secs: u64,
    /// Oldest first.
    pub active: Vec<RunRecord>,
    /// Newest first, at most [`RECENT_RUNS`].
    pub recent: Vec<RunRecord>,
    /// By provider name.
    pub providers: Vec<ProviderLatency>,
    pub totals: Totals,
    /// Per model, by model id.
    #[serde(default)]
    pub models: Vec<ModelTotals>,
    /// The charts: per model, the last hour by minute.
    #[serde(default)]
    pub(crate) last_hour: Vec<ModelSeries>,
    /// Tasks alive in the proxy's async runtime: flat over a long day, or something leaks.
    #[serde(default)]
    pub tasks: u64,
    /// What Cursor sent that this build does not know. Defaulted so `doctor` can read an
    /// older proxy's snapshot.
    #[serde(default)]
    pub unknown: UnknownReport,
}

impl Status {
    pub fn new() -> Status {
        Self::with_capture(None)
    }

    /// A registry whose holders also record the agent traffic into `capture`.
    pub fn with_capture(capture: Option<crate::capture::Capture>) -> Status {
        Status {
            inner: Arc::new(StatusShared {
                started: Instant::now(),
                started_unix_ms: unix_ms(),
                next_id: AtomicU64::new(1),
                state: Mutex::new(Tallies::default()),
                capture,
                usage_log: OnceLock::new(),
                pac: OnceLock::new(),
            }),
        }
    }

    /// The traffic capture, when `run --capture` asked for one.
    pub fn capture(&self) -> Option<&crate::capture::Capture> {
        self.inner.capture.as_ref()
    }

    /// Persist every finished run from now on to `usage.jsonl` in `dir` (the first call wins).
    pub fn record_usage_in(&self, dir: &std::path::Path) {
        let _ = self.inner.usage_log.set(usage::UsageLog::new(dir));
    }

    /// Serve `script` at [`pac::PAC_PATH`] from now on (the first call wins).
    pub fn serve_pac(&self, script: String) {
        let _ = self.inner.pac.set(script);
    }

    /// The PAC script, once the server set it.
    pub fn pac(&self) -> Option<&str> {
        self.inner.pac.get().map(String::as_str)
    }

    /// Register a run; keep the ticket for its whole life.
    pub fn run_started(&self, start: RunStart) -> RunTicket {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut state = self.inner.lock();
        state.totals.started += 1;
        state.active.insert(
            id,
            Active {
                start,
                started: Instant::now(),
                started_unix_ms: unix_ms(),
                usage: Usage::default(),
                cost_usd: None,
                route: FallbackRoute::default(),
            },
        );
        RunTicket {
            status: self.clone(),
            id,
            done: false,
        }
    }

    /// A run that failed before it could start (unknown model, provider without a key): shown
    /// among the recent runs with its reason, without ever being active.
    pub fn run_refused(&self, start: RunStart, error: String) {
        self.run_started(start).finish("error", Some(error), None);
    }

    /// One latency sample for `provider` (e.g. time until its first streamed byte).
    pub fn provider_latency(&self, provider: &str, ms: u64) {
        let mut state = self.inner.lock();
        let s = state.providers.entry(provider.to_string()).or_default();
        s.min_ms = if s.samples == 0 { ms } else { s.min_ms.min(ms) };
        s.max_ms = s.max_ms.max(ms);
        s.last_ms = ms;
        s.total_ms = s.total_ms.saturating_add(ms);
        s.samples += 1;
        s.last_unix_ms = unix_ms();
    }

    pub fn snapshot(&self) -> StatusSnapshot {
        let now = Instant::now();
        let now_ms = unix_ms();
        let state = self.inner.lock();
        let mut providers: Vec<ProviderLatency> = state
            .providers
            .iter()
            .map(|(name, s)| ProviderLatency {
                provider: name.clone(),
                last_ms: s.last_ms,
                avg_ms: s.total_ms.checked_div(s.samples).unwrap_or(0),
                min_ms: s.min_ms,
                max_ms: s.max_ms,
                samples: s.samples,
                last_unix_ms: s.last_unix_ms,
            })
            .collect();
        providers.sort_by(|a, b| a.provider.cmp(&b.provider));
        StatusSnapshot {
            service: "cursor-byok".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            now_unix_ms: unix_ms(),
            started_unix_ms: self.inner.started_unix_ms,
            uptime_secs: now.saturating_duration_since(self.inner.started).as_secs(),
            active: state.active.values().map(|a| a.record(now)).collect(),
            recent: state.recent.iter().rev().cloned().collect(),
            providers,
            totals: state.totals.clone(),
            models: state.models.values().cloned().collect(),
            last_hour: series(state.chart.iter(), now_ms),
            tasks: tokio::runtime::Handle::try_current()
                .map_or(0, |rt| rt.metrics().num_alive_tasks() as u64),
            unknown: state.unknown.report(),
        }
    }

    /// Count what a schema check found in Cursor's traffic (`source`: `agent run`,
    /// `AvailableModels`…); each kind seen for the first time is logged once, at `warn`, with
    /// the client version (the `x-cursor-client-version` header).
    pub fn unknown_schema(
        &self,
        source: &str,
        client_version: Option<&str>,
        report: &crate::proto::inspect::Report,
    ) {
        if report.unknown.is_empty() {
            return;
        }
        let new = self
            .inner
            .lock()
            .unknown
            .record(source, client_version, report, unix_ms());
        for item in &new {
            unknown::warn_new(item);
        }
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut Active)) {
        if let Some(active) = self.inner.lock().active.get_mut(&id) {
            f(active);
        }
    }

    fn finish(&self, id: u64, outcome: &str, error: Option<String>, usage: Option<Usage>) {
        let now = Instant::now();
        let mut guard = self.inner.lock();
        let state = &mut *guard;
        let Some(active) = state.active.remove(&id) else {
            return;
        };
        let mut record = active.record(now);
        if let Some(u) = usage {
            record.input_tokens = u.input;
            record.output_tokens = u.output;
            record.cache_read_tokens = u.cache_read;
            record.cache_write_tokens = u.cache_write;
        }
        record.outcome = Some(outcome.to_string());
        record.error = error.map(|e| scrub(&e));
        let t = &mut state.totals;
        t.finished += 1;
        if outcome == "ok" {
            t.ok += 1;
        } else {
            t.failed += 1;
        }
        t.input_tokens = t.input_tokens.saturating_add(record.input_tokens);
        t.output_tokens = t.output_tokens.saturating_add(record.output_tokens);
        t.cache_read_tokens = t.cache_read_tokens.saturating_add(record.cache_read_tokens);
        t.cost_usd += record.cost_usd.unwrap_or(0.0);
        state
            .models
            .entry(record.model.clone())
            .or_insert_with(|| ModelTotals {
                model: record.model.clone(),
                ..ModelTotals::default()
            })
            .add(
                record.input_tokens,
                record.output_tokens,
                record.cache_read_tokens,
                record.cost_usd,
            );
        *t.by_outcome.entry(outcome.to_string()).or_default() += 1;
        if state.recent.len() == RECENT_RUNS {
            state.recent.pop_front();
        }
        let line = usage::UsageLine::of(&record);
        let hour_ago = line.unix_ms.saturating_sub((CHART_MINUTES as u64) * 60_000);
        while state
            .chart
            .front()
            .is_some_and(|p| p.unix_ms < hour_ago || state.chart.len() >= CHART_POINTS)
        {
            state.chart.pop_front();
        }
        state.chart.push_back(ChartPoint {
            unix_ms: line.unix_ms,
            model: line.model.clone(),
            tokens: line.input_tokens.saturating_add(line.output_tokens),
            cost_usd: line.cost_usd.unwrap_or(0.0),
        });
        state.recent.push_back(record);
        drop(guard);
        if let Some(log) = self.inner.usage_log.get() {
            if let Err(e) = log.append(&line) {
                tracing::warn!("cannot record usage in {}: {e}", log.path().display());
            }
        }
    }
}

/// A registered run. Report token counts as they change; end with [`RunTicket::finish`].
/// Dropping it unfinished records the run as `abandoned`.
#[must_use = "dropping the ticket ends the run as `abandoned`"]
pub struct RunTicket {
    status: Status,
    id: u64,
    done: bool,
}

impl std::fmt::Debug for RunTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunTicket").field("id", &self.id).finish()
    }
}

impl RunTicket {
    /// The run's token counts so far (cumulative, not increments).
    pub fn tokens(&self, input: u64, output: u64) {
        self.progress().tokens(input, output);
    }

    /// A cloneable handle for the code that streams the run (tokens, provider latency), while
    /// the ticket itself stays with whoever reports the end.
    pub fn progress(&self) -> RunProgress {
        let provider = self
            .status
            .inner
            .lock()
            .active
            .get(&self.id)
            .map(|a| a.start.provider.clone())
            .unwrap_or_default();
        RunProgress {
            status: self.status.clone(),
            id: self.id,
            provider: provider.into(),
        }
    }

    /// Record the end: `outcome` is `ok`, `error`, `canceled`…; `error` is the user-facing
    /// reason; `usage`, when given, replaces the counts reported through [`RunTicket::tokens`].
    pub fn finish(mut self, outcome: &str, error: Option<String>, usage: Option<Usage>) {
        self.done = true;
        self.status.finish(self.id, outcome, error, usage);
    }
}

/// Progress reports for one run; cheap to clone. Reports after the run ended are ignored.
#[derive(Clone)]
pub struct RunProgress {
    status: Status,
    id: u64,
    provider: Arc<str>,
}

impl std::fmt::Debug for RunProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunProgress").field("id", &self.id).finish()
    }
}

impl RunProgress {
    /// The run's token counts so far (cumulative, not increments).
    pub fn tokens(&self, input: u64, output: u64) {
        self.status.update(self.id, |a| {
            a.usage.input = input;
            a.usage.output = output;
        });
    }

    /// The run's usage and cost so far (cumulative); `None`: a price is unknown.
    pub fn usage(&self, usage: Usage, cost_usd: Option<f64>) {
        self.status.update(self.id, |a| {
            a.usage = usage;
            a.cost_usd = cost_usd;
        });
    }

    /// Which fallback target serves the run, and why earlier ones were passed over.
    pub fn route(&self, route: FallbackRoute) {
        self.status.update(self.id, |a| a.route = route);
    }

    /// One latency sample for the run's provider (e.g. time to the first streamed event).
    pub fn provider_latency(&self, latency: Duration) {
        self.status
            .provider_latency(&self.provider, millis(latency));
    }
}

impl Drop for RunTicket {
    fn drop(&mut self) {
        if !self.done {
            self.status.finish(
                self.id,
                "abandoned",
                Some("the run ended without reporting an outcome".into()),
                None,
            );
        }
    }
}

fn unix_ms() -> u64 {
    millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Error text as kept for the page: bounded, one line, and with anything shaped like a
/// credential masked (a provider may echo a key back in its message).
fn scrub(text: &str) -> String {
    let text = crate::base::secret::scrub(text);
    let mut out = Vec::new();
    let mut mask_next = false;
    for word in text.split_whitespace() {
        let bare = word.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        let keyish = bare.len() >= 12
            && ["sk-", "sk_", "sk-ant-", "xai-", "gsk_", "AIza", "key-"]
                .iter()
                .any(|p| bare.starts_with(p));
        if mask_next || keyish {
            out.push("[redacted]".to_string());
        } else {
            out.push(word.to_string());
        }
        mask_next = word.eq_ignore_ascii_case("bearer");
    }
    let joined = out.join(" ");
    crate::base::text::cut_chars(&joined, MAX_ERROR_CHARS, "…")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(id: &str) -> RunStart {
        RunStart {
            request_id: id.into(),
            model: "byok-m".into(),
            provider: "P".into(),
            transport: "Run".into(),
        }
    }

    /// Another local user reads `status.json`: it must not hand them a live run's request id,
    /// with which a RunSSE would ask for the run's output.
    #[test]
    fn request_ids_never_leave_in_the_snapshot() {
        let status = Status::new();
        let live = "3f2a9c4e-5b1d-4e0a-9f7c-live-request";
        let _ticket = status.run_started(start(live));
        status
            .run_started(start("8d1e-ended-request"))
            .finish("ok", None, None);
        let json = serde_json::to_string(&status.snapshot()).expect("json");
        assert!(!json.contains(live), "{json}");
        assert!(!json.contains("8d1e-ended-request"), "{json}");
        assert!(json.contains(&run_id(live)), "{json}");
    }

    #[test]
    fn runs_move_from_active_to_recent() {
        let status = Status::new();
        let a = status.run_started(start("a"));
        let b = status.run_started(start("b"));
        let progress = a.progress();
        progress.tokens(10, 2);
        progress.provider_latency(Duration::from_millis(40));
        status.run_refused(start("c"), "model `x` is not configured".into());
        let snap = status.snapshot();
        assert_eq!(snap.active.len(), 2);
        assert_eq!(snap.active[0].run_id, run_id("a"));
        assert_eq!(snap.active[0].input_tokens, 10);
        assert_eq!(snap.active[0].outcome, None);

        a.finish(
            "ok",
            None,
            Some(Usage {
                input: 100,
                output: 7,
                ..Usage::default()
            }),
        );
        drop(b);
        let snap = status.snapshot();
        assert!(snap.active.is_empty());
        progress.tokens(99, 99); // after the end: ignored
        assert_eq!(snap.providers[0].provider, "P");
        assert_eq!(snap.providers[0].last_ms, 40);
        assert_eq!(snap.recent[0].run_id, run_id("b"));
        assert_eq!(snap.recent[0].outcome.as_deref(), Some("abandoned"));
        assert_eq!(snap.recent[1].input_tokens, 100);
        assert_eq!(snap.recent[2].run_id, run_id("c"));
        assert_eq!(snap.totals.started, 3);
        assert_eq!(snap.totals.ok, 1);
        assert_eq!(snap.totals.failed, 2);
        assert_eq!(snap.totals.input_tokens, 100);
        assert_eq!(snap.totals.by_outcome["abandoned"], 1);
    }

    #[test]
    fn keeps_a_bounded_history_and_latency() {
        let status = Status::new();
        for i in 0..(RECENT_RUNS + 5) {
            status
                .run_started(start(&i.to_string()))
                .finish("error", Some("boom".into()), None);
        }
        status.provider_latency("P", 30);
        status.provider_latency("P", 10);
        let snap = status.snapshot();
        assert_eq!(snap.recent.len(), RECENT_RUNS);
        assert_eq!(
            snap.recent[0].run_id,
            run_id(&(RECENT_RUNS + 4).to_string())
        );
        assert_eq!(snap.totals.finished, (RECENT_RUNS + 5) as u64);
        let p = &snap.providers[0];
        assert_eq!((p.last_ms, p.avg_ms, p.min_ms, p.max_ms), (10, 20, 10, 30));
    }

    #[test]
    fn the_charts_bucket_the_last_hour_by_minute_per_model() {
        let now = 10 * 3_600_000;
        let point = |mins_ago: u64, model: &str, tokens, cost_usd| ChartPoint {
            unix_ms: now - mins_ago * 60_000 - 5,
            model: model.into(),
            tokens,
            cost_usd,
        };
        let points = [
            point(0, "a", 10, 0.5),
            point(0, "a", 5, 0.25),
            point(59, "a", 7, 0.0),
            point(60, "a", 1_000, 9.0),
            point(3, "b", 3, 0.125),
        ];
        let s = series(points.iter(), now);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].model.as_str(), s[0].tokens.len()),
            ("a", CHART_MINUTES)
        );
        assert_eq!(s[0].tokens[CHART_MINUTES - 1], 15);
        assert_eq!(s[0].cost_usd[CHART_MINUTES - 1], 0.75);
        assert_eq!(s[0].tokens[0], 7);
        assert_eq!(
            s[0].tokens.iter().sum::<u64>(),
            22,
            "an hour old is out of the window"
        );
        assert_eq!(s[1].tokens[CHART_MINUTES - 4], 3);
    }

    #[test]
    fn per_model_totals_and_cost_in_the_snapshot() {
        let status = Status::new();
        for (model, cost) in [
            ("byok-a", Some(0.5)),
            ("byok-a", None),
            ("byok-b", Some(0.25)),
        ] {
            let mut s = start("r");
            s.model = model.into();
            let t = status.run_started(s);
            let u = Usage {
                input: 100,
                output: 10,
                cache_read: 40,
                ..Usage::default()
            };
            t.progress().usage(u, cost);
            t.progress().route(FallbackRoute {
                target: Some("p/m".into()),
                skipped: vec!["q/m: HTTP 429".into()],
            });
            t.finish("ok", None, Some(u));
        }
        let snap = status.snapshot();
        assert_eq!(snap.recent[0].target.as_deref(), Some("p/m"));
        assert_eq!(snap.recent[0].skipped, ["q/m: HTTP 429"]);
        assert_eq!(snap.models.len(), 2);
        let a = &snap.models[0];
        assert_eq!(
            (a.runs, a.priced_runs, a.input_tokens, a.cache_read_tokens),
            (2, 1, 200, 80)
        );
        assert!((a.cache_read_share - 0.4).abs() < 1e-12);
        assert_eq!(a.cost_usd, 0.5);
        assert_eq!(snap.totals.cost_usd, 0.75);
        assert_eq!(snap.totals.cache_read_tokens, 120);
        assert_eq!(snap.last_hour.len(), 2);
        assert_eq!(snap.last_hour[0].tokens[CHART_MINUTES - 1], 220);
        let json = serde_json::to_value(&snap).unwrap();
        for key in ["models", "last_hour"] {
            assert!(json[key].is_array(), "{key}");
        }
        assert!(json["recent"][0]["cost_usd"].is_number());
        assert!(json["models"][0]["cache_read_share"].is_number());
        assert!(json["totals"]["cost_usd"].is_number());
    }

    #[test]
    fn error_text_is_scrubbed_and_bounded() {
        let s = scrub("Incorrect API key provided: sk-proj-abcdef123456789. Header Bearer abc.def");
        assert!(!s.contains("abcdef123456789"), "{s}");
        assert!(!s.contains("abc.def"), "{s}");
        assert!(s.contains("Incorrect API key provided"));
        let long = "x ".repeat(2000);
        assert!(scrub(&long).chars().count() <= MAX_ERROR_CHARS + 1);
    }
}
