//! What a run starts with: the prepared run the agent hands over, its settings, and what it
//! reports when it ends.

use std::time::Duration;

use crate::agent::fallback::Chain;
use crate::agent::model::ResolvedModel;
use crate::agent::state::BlobCache;
use crate::agent::subagents::{Child, SubagentCalls};
use crate::provider::Usage;

/// Settings a run needs from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct RunSettings {
    pub heartbeat: Duration,
    /// How long the client may stay silent while we wait on it (exec result, blob ack).
    pub(crate) client_timeout: Duration,
    /// Tool rounds allowed in one turn.
    pub max_tool_rounds: u32,
    /// Bound on the history rebuilt from the checkpoint.
    pub max_history_bytes: usize,
    /// How long a foreground command blocks before it moves to the background (ms).
    pub(crate) shell_block_ms: u32,
    /// Subagent calls of one model turn that run at the same time.
    pub max_parallel_subagents: u32,
    /// Notice a model stuck repeating its calls (see `repeats`).
    pub detect_loops: bool,
    /// Our models by display name, short id and Cursor id, each with its Cursor id (a
    /// subagent definition may name its model any of these ways).
    pub model_names: Vec<(String, String)>,
    /// The home whose `.cursor/projects/*/agent-transcripts` transcripts are kept in; none:
    /// no transcripts are written or read.
    pub transcripts_home: Option<std::path::PathBuf>,
}

/// What a finished run reports for the summary line and the status page.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunSummary {
    pub usage: Usage,
    pub steps: u64,
    /// Dollars, when every call's price is known.
    pub cost_usd: Option<f64>,
}

/// A run as the agent prepared it: its model and where its calls go, its settings, and what it
/// shares with every run.
pub(crate) struct Run {
    pub request_id: String,
    pub model: ResolvedModel,
    /// Where the model's calls go: its provider, then its fallbacks.
    pub chain: Chain,
    pub settings: RunSettings,
    pub cache: BlobCache,
    /// The first `AgentRunRequest` as received (see [`RunRequest`](crate::agent::RunRequest)).
    pub(crate) first_wire: bytes::Bytes,
    /// The client's secrets in the scrubber, until the run's end frame is out.
    pub secrets: crate::base::secret::Registration,
    /// Subagent calls waiting for their child runs (shared by every run).
    pub subagents: SubagentCalls,
    /// When this run is a subagent: its kind and limits.
    pub child: Option<Child>,
}

impl Run {
    /// The display name of the model's first provider.
    pub fn provider_name(&self) -> String {
        self.chain
            .targets
            .first()
            .map(|t| t.client.name().to_string())
            .unwrap_or_default()
    }
}
