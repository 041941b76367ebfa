//! What the status page and the usage log say of runs: plain records, no state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One run as the page shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run's name on the page: [`run_id`] of Cursor's request id. The request id itself
    /// never leaves the process: with it, a RunSSE could ask for the run's output.
    pub run_id: String,
    pub model: String,
    pub provider: String,
    pub transport: String,
    pub started_unix_ms: u64,
    /// So far, for an active run.
    pub duration_ms: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Dollars; `None` when a price was unknown.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// The fallback-chain target that served the run (`provider/model`).
    #[serde(default)]
    pub target: Option<String>,
    /// Targets passed over, each with its reason.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// `None` while the run is active; then `ok`, `error`, `canceled`, `abandoned`, …
    pub outcome: Option<String>,
    pub error: Option<String>,
}

/// A short digest of `request_id` that names a run on the page and in `status.json` without
/// telling anyone the request id.
pub fn run_id(request_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(request_id.as_bytes());
    hex::encode(&digest[..6])
}

/// Latency of one provider, as reported by runs (time to the first streamed byte).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderLatency {
    pub provider: String,
    pub(crate) last_ms: u64,
    pub(crate) avg_ms: u64,
    pub(crate) min_ms: u64,
    pub(crate) max_ms: u64,
    pub samples: u64,
    pub(crate) last_unix_ms: u64,
}

/// Since the server started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub started: u64,
    pub finished: u64,
    pub ok: u64,
    /// Finished with any outcome other than `ok`.
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Dollars, over the runs whose price is known.
    #[serde(default)]
    pub cost_usd: f64,
    /// Finished runs per outcome.
    pub(crate) by_outcome: BTreeMap<String, u64>,
}

/// Finished runs of one model (the id Cursor sees), since the server started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelTotals {
    pub model: String,
    pub runs: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    /// `cache_read_tokens / input_tokens`, 0 without input.
    pub cache_read_share: f64,
    /// Dollars, over `priced_runs`.
    pub cost_usd: f64,
    /// Runs whose price is known (the others count tokens only).
    pub priced_runs: u64,
}

impl ModelTotals {
    /// Count one finished run.
    pub fn add(&mut self, input: u64, output: u64, cache_read: u64, cost_usd: Option<f64>) {
        self.runs += 1;
        self.input_tokens = self.input_tokens.saturating_add(input);
        self.output_tokens = self.output_tokens.saturating_add(output);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(cache_read);
        self.cache_read_share =
            crate::provider::price::cache_read_share(self.input_tokens, self.cache_read_tokens);
        if let Some(c) = cost_usd {
            self.cost_usd += c;
            self.priced_runs += 1;
        }
    }
}
