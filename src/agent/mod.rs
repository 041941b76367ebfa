//! The local agent: runs Cursor Agent turns on the user's own providers.
//!
//! Transports (HTTP/2 `Run`, HTTP/1.1 `RunSSE` + `BidiAppend`) decode client frames and call
//! [`Agent::start_run`]; they get a [`RunHandle`] whose `input` takes further client messages
//! and whose `output` yields server messages and then exactly one end of stream. Nothing in
//! here touches HTTP.

mod blob_id;
pub mod cmdk;
pub mod context;
mod fallback;
pub mod messages;
pub mod model;
mod prompt;
mod run;
mod run_io;
pub mod side;
pub mod state;
pub mod subagents;
pub mod tools;
pub mod transcript;
pub mod transport;
pub mod user_files;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ProviderConfig};
use crate::connect::EndStream;
use crate::proto::agent::v1 as pb;
use crate::provider::{ProviderClient, ProviderError, ProviderSettings, RetryPolicy};
use crate::status::{RunStart, Status};

pub use model::ResolvedModel;
use run::TransportFailure;
pub(crate) use run::{RunError, RunSettings};
pub use run_io::{RunOutput, RunRequest};

/// Capacity of a run's channels: enough to absorb a burst of deltas, small enough that a slow
/// client slows the provider read instead of growing memory.
const CHANNEL_CAPACITY: usize = 64;

/// A started run, seen from its transport.
pub struct RunHandle {
    /// Client messages after the first (exec results, heartbeats, cancel…). Dropping it means
    /// the client will send nothing more.
    /// Boxed: the message type is several KiB, and a channel allocates room for 32 at once.
    pub input: mpsc::Sender<Box<pb::AgentClientMessage>>,
    /// Server messages, then exactly one `RunOutput::End`.
    pub output: mpsc::Receiver<RunOutput>,
    /// Cancel the run (the client went away for good): ends with `canceled`.
    pub cancel: CancellationToken,
    failure: TransportFailure,
}

impl RunHandle {
    /// A handle that can end the run because the client sent something unusable or left.
    pub fn failer(&self) -> RunFailer {
        RunFailer {
            cancel: self.cancel.clone(),
            failure: self.failure.clone(),
        }
    }
}

/// Ends a run from its transport, with the reason the run reports (and the side it names).
#[derive(Clone)]
pub struct RunFailer {
    cancel: CancellationToken,
    failure: TransportFailure,
}

impl RunFailer {
    /// A failer of its own for a run ended through `cancel` (tests of the transports).
    pub fn new(cancel: CancellationToken) -> Self {
        RunFailer {
            cancel,
            failure: TransportFailure::default(),
        }
    }

    /// The client sent a frame we cannot use: the stream ends with `invalid_argument`.
    pub fn fail(&self, reason: String) {
        self.end(RunError::BadClientMessage(reason));
    }

    /// The client left for good (`how`, in words): the run stops, blaming the client side.
    pub fn client_left(&self, how: impl Into<String>) {
        self.end(RunError::ClientLeft(how.into()));
    }

    fn end(&self, why: RunError) {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why);
        self.cancel.cancel();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("provider `{name}`: {source}")]
    Provider {
        name: String,
        #[source]
        source: ProviderError,
    },
}

/// Shared by every run: configuration and one pooled client per provider.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<AgentShared>,
}

struct AgentShared {
    config: Arc<Config>,
    providers: HashMap<String, ProviderClient>,
    cache: state::BlobCache,
    status: Status,
    /// Fallback targets' cool-downs and conversations' targets, across runs.
    health: fallback::Health,
    /// Subagent calls waiting for their child runs, across runs.
    subagents: subagents::SubagentCalls,
}

impl Agent {
    /// Build provider clients for every configured provider that has a key.
    pub fn new(config: Arc<Config>) -> Result<Agent, AgentError> {
        Self::with_status(config, Status::new())
    }

    /// Like [`Agent::new`], reporting runs to `status` (the status page).
    pub fn with_status(config: Arc<Config>, status: Status) -> Result<Agent, AgentError> {
        let mut providers = HashMap::new();
        for (name, p) in &config.providers {
            let Some(settings) = provider_settings(name, p, &config) else {
                continue;
            };
            let client = ProviderClient::new(settings).map_err(|source| AgentError::Provider {
                name: name.clone(),
                source,
            })?;
            providers.insert(name.clone(), client);
        }
        Ok(Agent {
            inner: Arc::new(AgentShared {
                cache: state::BlobCache::new(&config.data_dir(), state::DEFAULT_CACHE_MAX_BYTES),
                config,
                providers,
                status,
                health: fallback::Health::default(),
                subagents: subagents::SubagentCalls::default(),
            }),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn status(&self) -> &Status {
        &self.inner.status
    }

    /// Is `model_id` (as Cursor sends it, maybe with a `:variant`) one of ours?
    pub(crate) fn is_our_model(&self, model_id: &str) -> bool {
        model::is_ours(&self.inner.config, model_id)
    }

    /// Start a run for its first message. The caller has already decided the run is ours;
    /// a model that turns out not to be configured ends the stream with a clear error.
    pub fn start_run(&self, first: impl Into<RunRequest>, request_id: String) -> RunHandle {
        self.start_run_on(first, request_id, "")
    }

    /// [`Agent::start_run`], naming the transport (`Run`, `RunSSE`) for the status page.
    pub(crate) fn start_run_on(
        &self,
        first: impl Into<RunRequest>,
        request_id: String,
        transport: &str,
    ) -> RunHandle {
        let RunRequest {
            decoded: first,
            wire: first_wire,
            client_secrets,
            parent,
        } = first.into();
        // Before anything can fail: a provider may echo them in the run's first error.
        let secrets = crate::base::secret::register_while(
            client_secrets
                .iter()
                .map(|s| s.expose())
                .chain(model::credential_values(&first)),
        );
        let (in_tx, in_rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (out_tx, out_rx) = mpsc::channel(CHANNEL_CAPACITY);
        let cancel = CancellationToken::new();
        let failure = Arc::new(std::sync::Mutex::new(None));
        let handle = RunHandle {
            input: in_tx,
            output: out_rx,
            cancel: cancel.clone(),
            failure: failure.clone(),
        };
        match self.prepare(&first, request_id.clone(), &parent) {
            Ok(mut run) => {
                run.first_wire = first_wire;
                run.secrets = secrets;
                let ticket = self.inner.status.run_started(RunStart {
                    request_id,
                    model: run.model.config.cursor_id(),
                    provider: run.provider_name(),
                    transport: transport.to_string(),
                });
                run::spawn(run, first, in_rx, out_tx, cancel, failure, ticket)
            }
            Err(e) => {
                tracing::warn!("{e}");
                let model = model::requested_model_id(&first)
                    .unwrap_or_default()
                    .to_string();
                self.inner.status.run_refused(
                    RunStart {
                        request_id,
                        model,
                        ..Default::default()
                    },
                    e.to_string(),
                );
                // The channel is fresh and has room: this cannot fail for lack of capacity.
                let _ = out_tx.try_send(RunOutput::End(EndStream::from_error(e.to_connect())));
            }
        }
        handle
    }

    /// The model a subagent call of ours asked for, when a new run is its child (by the
    /// parent its requests name, or its user message); `None` when no call of ours waits for it.
    pub(crate) fn expected_child_model(
        &self,
        parent: &subagents::ParentLink,
        prompt: Option<&str>,
    ) -> Option<String> {
        self.inner.subagents.expected_model(parent, prompt)
    }

    /// The provider client and the provider's name of one of our models (`model_id` as Cursor
    /// names it), for the short calls answered on the user's model; `None` when it is not
    /// configured or its provider has no key.
    pub(crate) fn provider_of(&self, model_id: &str) -> Option<(ProviderClient, String)> {
        let (base, _) = model::split_variant(model_id);
        let m = self.inner.config.model_by_cursor_id(base)?;
        let client = self.inner.providers.get(&m.provider)?.clone();
        Some((client, m.model.clone()))
    }

    /// A request of the running run `request_id` named its parent only now (the desktop may send
    /// the parent headers on a later request than the one that started the run).
    pub(crate) fn link_parent(&self, request_id: &str, parent: &subagents::ParentLink) -> bool {
        !parent.is_empty() && self.inner.subagents.link_late(request_id, parent, None)
    }

    fn prepare(
        &self,
        first: &pb::AgentRunRequest,
        request_id: String,
        parent: &subagents::ParentLink,
    ) -> Result<run::Run, RunError> {
        let config = &self.inner.config;
        let id = model::requested_model_id(first).unwrap_or_default();
        let params = first
            .requested_model
            .as_ref()
            .map(|m| m.parameters.as_slice())
            .unwrap_or_default();
        let model = model::resolve(config, id, params).ok_or_else(|| {
            RunError::Internal(format!("model `{id}` is not configured in cursor-byok"))
        })?;
        let chain = self.chain(&model, first.conversation_id.clone())?;
        let child = self.child_of(first, id, parent);
        Ok(run::Run {
            request_id,
            model,
            chain,
            settings: RunSettings {
                heartbeat: Duration::from_secs(config.agent.heartbeat_secs.max(1)),
                client_timeout: Duration::from_secs(config.agent.kv_timeout_secs.max(1)),
                max_tool_rounds: config.agent.max_tool_rounds.max(1),
                max_history_bytes: config.limits.max_history_bytes,
                shell_block_ms: u32::try_from(config.agent.shell_block_secs.saturating_mul(1000))
                    .unwrap_or(u32::MAX),
                max_parallel_subagents: config.agent.max_parallel_subagents.max(1),
                detect_loops: config.agent.detect_loops,
                model_names: config
                    .usable_models()
                    .flat_map(|m| {
                        let id = m.cursor_id();
                        [m.display_name().to_string(), m.id.clone(), id.clone()]
                            .map(|name| (name, id.clone()))
                    })
                    .collect(),
                transcripts_home: config
                    .agent
                    .transcripts_home
                    .clone()
                    .or_else(dirs::home_dir),
            },
            cache: self.inner.cache.clone(),
            first_wire: bytes::Bytes::new(),
            secrets: Default::default(),
            subagents: self.inner.subagents.clone(),
            child,
        })
    }

    /// Is this run the child of a subagent call of ours? The client names the parent (`parent`,
    /// from its headers), or, where it names nothing, the run is a new conversation whose user
    /// message and model match an outstanding `subagent_args`; a run that only names its kind
    /// gets that kind's limits.
    fn child_of(
        &self,
        first: &pb::AgentRunRequest,
        model_id: &str,
        parent: &subagents::ParentLink,
    ) -> Option<subagents::Child> {
        use pb::conversation_action::Action;
        let prompt = match first.action.as_ref().and_then(|a| a.action.as_ref()) {
            Some(Action::UserMessageAction(a)) => a.user_message.as_ref().map(|u| u.text.as_str()),
            _ => None,
        };
        // A child starts a conversation of its own (or, resumed, continues its own): one
        // with turns already is the user's unless a call resumes it.
        let fresh = first
            .conversation_state
            .as_ref()
            .is_none_or(|s| s.turns.is_empty());
        let conversation = first.conversation_id.clone().unwrap_or_default();
        let registry = &self.inner.subagents;
        let continues = (!fresh).then_some(conversation.as_str());
        let claimed = registry
            .claim_linked(parent, prompt)
            .or_else(|| prompt.and_then(|p| registry.claim(p, model_id, continues)))
            .map(|c| subagents::Child {
                conversation_id: conversation.clone(),
                ..c
            });
        if let Some(c) = &claimed {
            tracing::info!(
                parent_call = %c.parent_tool_call_id,
                named_by_client = ?parent,
                kind = %c.kind,
                depth = c.depth,
                conversation = %conversation,
                "run is a subagent of an earlier call"
            );
        }
        claimed.or_else(|| {
            first
                .subagent_type_name
                .as_deref()
                .filter(|k| !k.is_empty())
                .map(|k| subagents::Child {
                    conversation_id: conversation,
                    ..subagents::Child::of_kind(k)
                })
        })
    }
}

impl Agent {
    /// The model's targets: its own provider and model, then its fallbacks. Targets whose
    /// provider has no key are left out, and named in every run's route.
    fn chain(
        &self,
        model: &ResolvedModel,
        conversation: Option<String>,
    ) -> Result<fallback::Chain, RunError> {
        let m = &model.config;
        let own = (&m.provider, &m.model, Default::default(), m.price());
        let others = m.fallback.iter().map(|t| {
            let options = crate::provider::RequestOptions {
                max_output_tokens: t.max_output_tokens,
                temperature: t.temperature,
                reasoning_effort: t.reasoning_effort.clone(),
                thinking_budget: t.thinking_budget,
            };
            (&t.provider, &t.model, options, t.price())
        });
        let mut targets = Vec::new();
        let mut unusable = Vec::new();
        for (provider, name, options, price) in std::iter::once(own).chain(others) {
            let label = format!("{provider}/{name}");
            match self.inner.providers.get(provider) {
                Some(client) => targets.push(fallback::Target {
                    label,
                    client: client.clone(),
                    model: name.clone(),
                    options,
                    price,
                }),
                None => unusable.push(format!("{label}: its provider has no API key")),
            }
        }
        if targets.is_empty() {
            return Err(RunError::Internal(format!(
                "provider `{}` for model `{}` has no API key (set its api_key_env variable)",
                m.provider,
                m.display_name()
            )));
        }
        Ok(fallback::Chain {
            targets,
            unusable,
            policy: fallback::Policy::from_config(&self.inner.config.fallback),
            health: self.inner.health.clone(),
            conversation: conversation.filter(|c| !c.is_empty()),
        })
    }
}

/// Provider settings from the config; `None` when the provider has no key.
fn provider_settings(name: &str, p: &ProviderConfig, config: &Config) -> Option<ProviderSettings> {
    let mut s = p.settings(display_provider(name, p), config.upstream.connect_timeout())?;
    s.idle_timeout = Duration::from_secs(config.agent.provider_idle_timeout_secs.max(1));
    s.retry = RetryPolicy {
        max_retries: config.agent.provider_max_retries,
        ..RetryPolicy::default()
    };
    Some(s)
}

/// "OpenAI", "Anthropic", or the config's own name for other endpoints.
fn display_provider(name: &str, p: &ProviderConfig) -> String {
    use crate::provider::ProviderKind;
    match (p.kind, p.base_url.is_none()) {
        (ProviderKind::Anthropic, true) => "Anthropic".into(),
        (ProviderKind::Gemini, true) => "Gemini".into(),
        (ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses, true) => "OpenAI".into(),
        _ => {
            let mut c = name.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect())
                .unwrap_or_default()
        }
    }
}
