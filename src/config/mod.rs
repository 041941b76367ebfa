//! Configuration: the TOML model, defaults, validation and redacted secrets.
//!
//! Loading never echoes a secret: errors name the file, the key and the reason, and a reason
//! that would quote a value under a secret-looking key is redacted.

mod defaults;
mod error;
mod failover;
pub mod install_secret;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::base::secret::Secret;

pub use crate::provider::{AuthMode, Price, ProviderKind};

pub(crate) use defaults::{default_data_dir, EMBEDDED_DEFAULT};
pub use error::ConfigError;
pub use failover::FailoverOn;

/// Prefix of every model id Cursor sees for a configured model, so ours can never collide with
/// Cursor's own ids.
pub const MODEL_ID_PREFIX: &str = "byok-";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The proxy listener (HTTP CONNECT and absolute-form HTTP).
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// Where the CA and caches live; `None` means the OS data directory.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// Host patterns whose TLS is terminated (`*.cursor.sh` matches every subdomain).
    #[serde(default = "defaults::intercept")]
    pub intercept: Vec<String>,
    /// Optional password for the proxy listener (`Proxy-Authorization: Basic`). Unset, `run`
    /// fills it with the per-install secret ([`install_secret`]) unless `open_listener`.
    #[serde(default)]
    pub proxy_auth: Option<ProxyAuth>,
    /// Take clients on the listener without credentials (for the OS proxy setting, which
    /// cannot carry them): every local user may then use the proxy.
    #[serde(default)]
    pub open_listener: bool,
    /// Set by [`Config::use_install_secret`]: `proxy_auth` holds the per-install secret (the
    /// status page then asks for no credentials: it names no request id, and a browser
    /// would have to be given the secret by hand).
    #[serde(skip)]
    pub install_secret: bool,
    #[serde(default)]
    pub direct: DirectDoors,
    #[serde(default)]
    pub upstream: UpstreamConfig,
    #[serde(default)]
    pub cursor: CursorConfig,
    #[serde(default)]
    pub agent: AgentConfig,
    /// Cmd+K (inline edit in the editor, the prompt bar in the terminal).
    #[serde(default)]
    pub cmd_k: CmdKConfig,
    #[serde(default)]
    pub limits: Limits,
    /// When a model's request moves on to its next fallback target.
    #[serde(default)]
    pub fallback: FallbackConfig,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    #[serde(default)]
    pub models: Vec<ModelConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyAuth {
    pub username: String,
    pub password: Secret,
}

/// Listeners for clients that take a backend URL instead of a proxy (Cursor's CLI and SDK).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectDoors {
    /// TLS listener (ALPN h2 + http/1.1) presenting leaves from our CA.
    #[serde(default)]
    pub tls_listen: Option<SocketAddr>,
    /// Plain-HTTP listener.
    #[serde(default)]
    pub http_listen: Option<SocketAddr>,
    /// The Cursor origin requests on the direct doors are sent to.
    #[serde(default = "defaults::origin")]
    pub origin: String,
    /// A door token: when set, every direct-door request must carry it in
    /// `x-cursor-byok-token` (or `proxy_auth`'s credentials), and the doors may listen beyond
    /// loopback.
    #[serde(default)]
    pub token: Option<Secret>,
}

impl DirectDoors {
    /// Whether a direct door listens beyond loopback.
    pub fn exposed(&self) -> bool {
        [self.tls_listen, self.http_listen]
            .into_iter()
            .flatten()
            .any(|a| !a.ip().is_loopback())
    }
}

impl Default for DirectDoors {
    fn default() -> Self {
        DirectDoors {
            tls_listen: None,
            http_listen: None,
            origin: defaults::origin(),
            token: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Outbound HTTP proxy for our own dials (corporate networks), e.g. `http://proxy:3128`.
    /// A secret: its user info (`http://user:p%40ss@proxy:3128`, percent-encoded) is the
    /// proxy's credentials.
    #[serde(default)]
    pub proxy: Option<Secret>,
    /// Extra PEM roots trusted for upstream TLS, besides the OS store.
    #[serde(default)]
    pub extra_roots: Option<PathBuf>,
    /// Host → address overrides (tests put a local server behind `api2.cursor.sh`).
    #[serde(default)]
    pub resolve: BTreeMap<String, SocketAddr>,
    /// Seconds allowed for connecting upstream.
    #[serde(default)]
    pub connect_timeout_secs: Option<u64>,
    /// HTTP/2 passthrough through the frame relay (`false`: through hyper on both sides).
    #[serde(default = "defaults::yes")]
    pub h2_relay: bool,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            proxy: None,
            extra_roots: None,
            resolve: BTreeMap::new(),
            connect_timeout_secs: None,
            h2_relay: true,
        }
    }
}

impl UpstreamConfig {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs.unwrap_or(10))
    }
}

/// How Cursor's own services are adjusted.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CursorConfig {
    /// Rewrite `GetServerConfig` so desktop clients use the HTTP/1.1 agent transport, which
    /// honours the proxy setting (their HTTP/2 agent client bypasses it).
    #[serde(default = "defaults::yes")]
    pub force_http1_agent: bool,
    /// Advertise the direct TLS door in `agent_url_config` instead.
    #[serde(default)]
    pub advertise_direct_door: bool,
}

impl Default for CursorConfig {
    fn default() -> Self {
        CursorConfig {
            force_http1_agent: true,
            advertise_direct_door: false,
        }
    }
}

/// Cmd+K on the user's models. A Cmd+K that names one of them is always served here; this
/// says what Cursor's default (`"default"`, sent unless the user picked a Cmd+K model) does.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CmdKConfig {
    /// The configured model (its `id`, or `byok-<id>`) that serves every Cmd+K asking for
    /// Cursor's default; unset: those go to Cursor unchanged.
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Tool rounds allowed in one turn before the turn ends with an explanation.
    #[serde(default = "defaults::max_tool_rounds")]
    pub max_tool_rounds: u32,
    /// Seconds of silence after which a heartbeat goes to the client.
    #[serde(default = "defaults::heartbeat_secs")]
    pub heartbeat_secs: u64,
    /// Seconds to wait for the client to acknowledge a blob.
    #[serde(default = "defaults::kv_timeout_secs")]
    pub kv_timeout_secs: u64,
    /// Seconds of provider silence mid-stream before the request is given up.
    #[serde(default = "defaults::provider_idle_secs")]
    pub provider_idle_timeout_secs: u64,
    /// Retries for a provider request that failed before streaming anything.
    #[serde(default = "defaults::provider_retries")]
    pub provider_max_retries: u32,
    /// Seconds a foreground shell command runs before it moves to the background (it keeps
    /// running there; the model is told where its output goes).
    #[serde(default = "defaults::shell_block_secs")]
    pub shell_block_secs: u64,
    /// Subagent calls of one model turn that run at the same time; the rest wait their turn.
    #[serde(default = "defaults::max_parallel_subagents")]
    pub max_parallel_subagents: u32,
    /// Notice a model repeating itself: warn it at the 3rd repeat, end the turn at the 5th.
    #[serde(default = "defaults::yes")]
    pub detect_loops: bool,
    /// The home whose `.cursor/projects/*/agent-transcripts` folders hold the transcripts a
    /// run appends to and reads past chats from; unset: this user's home.
    #[serde(default)]
    pub transcripts_home: Option<std::path::PathBuf>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            max_tool_rounds: defaults::max_tool_rounds(),
            heartbeat_secs: defaults::heartbeat_secs(),
            kv_timeout_secs: defaults::kv_timeout_secs(),
            provider_idle_timeout_secs: defaults::provider_idle_secs(),
            provider_max_retries: defaults::provider_retries(),
            shell_block_secs: defaults::shell_block_secs(),
            max_parallel_subagents: defaults::max_parallel_subagents(),
            detect_loops: true,
            transcripts_home: None,
        }
    }
}

/// How fallback chains behave (`[fallback]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackConfig {
    /// Which failures hand the request on; any other error goes to Cursor at once.
    #[serde(default = "defaults::failover_on")]
    pub on: Vec<FailoverOn>,
    /// Seconds to wait for a target's first event when another target could take over.
    #[serde(default = "defaults::first_token_timeout_secs")]
    pub first_token_timeout_secs: u64,
    /// A failed target is skipped this long, doubling with each further failure …
    #[serde(default = "defaults::cooldown_secs")]
    pub cooldown_secs: u64,
    /// … up to this.
    #[serde(default = "defaults::max_cooldown_secs")]
    pub max_cooldown_secs: u64,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        FallbackConfig {
            on: defaults::failover_on(),
            first_token_timeout_secs: defaults::first_token_timeout_secs(),
            cooldown_secs: defaults::cooldown_secs(),
            max_cooldown_secs: defaults::max_cooldown_secs(),
        }
    }
}

/// Size limits on what clients and providers send us.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "defaults::max_frame_bytes")]
    pub max_frame_bytes: usize,
    #[serde(default = "defaults::max_decompressed_bytes")]
    pub max_decompressed_bytes: usize,
    /// Upper bound on the provider history rebuilt for one run.
    #[serde(default = "defaults::max_history_bytes")]
    pub max_history_bytes: usize,
    /// Open client connections per listener; beyond it new ones are closed at once.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Open byte tunnels (CONNECT to hosts we do not terminate); beyond it a CONNECT is a 503.
    #[serde(default = "defaults::max_tunnels")]
    pub max_tunnels: usize,
    /// Seconds a client connection (a tunnel, an intercepted session, a direct-door
    /// connection) may carry no byte either way before it closes.
    #[serde(default = "defaults::tunnel_idle_secs")]
    pub tunnel_idle_secs: u64,
    /// Seconds a tunnel may stay half closed (one side sent FIN) before both sides close.
    #[serde(default = "defaults::tunnel_half_close_secs")]
    pub tunnel_half_close_secs: u64,
    /// Seconds from accept (and from a CONNECT's upgrade) to a connection's first request
    /// head, and that an HTTP/1.1 request head may take on every door; an idle HTTP/1.1
    /// keep-alive connection closes after it too.
    #[serde(default = "defaults::head_timeout_secs")]
    pub head_timeout_secs: u64,
    /// Seconds a request body that is read whole (agent and adjusted Cursor requests) may go
    /// without a byte from its client before the request fails.
    #[serde(default = "defaults::body_timeout_secs")]
    pub body_timeout_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: defaults::max_frame_bytes(),
            max_decompressed_bytes: defaults::max_decompressed_bytes(),
            max_history_bytes: defaults::max_history_bytes(),
            max_connections: defaults::max_connections(),
            max_tunnels: defaults::max_tunnels(),
            tunnel_idle_secs: defaults::tunnel_idle_secs(),
            tunnel_half_close_secs: defaults::tunnel_half_close_secs(),
            head_timeout_secs: defaults::head_timeout_secs(),
            body_timeout_secs: defaults::body_timeout_secs(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    #[serde(default)]
    pub base_url: Option<String>,
    /// The key inline. Prefer `api_key_env`.
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// Name of an environment variable holding the key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub auth: Option<AuthMode>,
    /// Extra headers on every request (values may be secrets, so they never print).
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
}

impl ProviderConfig {
    pub fn base_url(&self) -> &str {
        self.base_url
            .as_deref()
            .unwrap_or_else(|| self.kind.default_base_url())
    }

    pub fn auth(&self) -> AuthMode {
        self.auth.unwrap_or(self.kind.default_auth())
    }

    /// The API key: inline, else from the named environment variable.
    pub fn resolve_api_key(&self) -> Option<Secret> {
        if let Some(key) = &self.api_key {
            return Some(key.clone());
        }
        let var = self.api_key_env.as_deref()?;
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .map(Secret::new)
    }

    /// The client settings this entry gives, shown as `name`; `None` without a key. Callers
    /// set their own idle timeout and retries on top.
    pub fn settings(
        &self,
        name: String,
        connect_timeout: Duration,
    ) -> Option<crate::provider::ProviderSettings> {
        let key = self.resolve_api_key()?;
        let base_url = self.base_url.clone().unwrap_or_default();
        let mut s = crate::provider::ProviderSettings::new(self.kind, base_url, key);
        s.name = Some(name);
        s.auth = self.auth;
        s.extra_headers = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        s.connect_timeout = connect_timeout;
        Some(s)
    }
}

/// A proxy URL's user info, as written, the password, and `user:password`, percent-decoded.
fn userinfo_secrets(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let Some((userinfo, _)) = rest.rsplit_once('@') else {
        return Vec::new();
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    vec![
        userinfo.to_string(),
        decode(password),
        format!("{}:{}", decode(user), decode(password)),
    ]
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Short id; Cursor sees it as `byok-<id>`.
    pub id: String,
    /// Name shown in Cursor's model picker.
    #[serde(default)]
    pub display_name: Option<String>,
    /// Key of an entry in `[providers]`.
    pub provider: String,
    /// The provider's own model name.
    pub model: String,
    #[serde(default = "defaults::context_window")]
    pub context_window: u32,
    #[serde(default = "defaults::max_output_tokens")]
    pub max_output_tokens: u32,
    /// `low` | `medium` | `high` for reasoning models (OpenAI), if any.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// Anthropic extended-thinking budget in tokens, if any.
    #[serde(default)]
    pub thinking_budget: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default = "defaults::yes")]
    pub supports_images: bool,
    /// Dollars per million tokens; without it, the list price of `model` if we know one.
    #[serde(default)]
    pub price: Option<Price>,
    /// Where requests go, in order, when the ones before fail before any output.
    #[serde(default)]
    pub fallback: Vec<TargetConfig>,
}

/// One fallback target: a provider and its model name, with parameters of its own (unset ones
/// are the model's).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Key of an entry in `[providers]`.
    pub provider: String,
    /// The provider's own model name.
    pub model: String,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    #[serde(default)]
    pub thinking_budget: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Without it, the list price of `model` if we know one.
    #[serde(default)]
    pub price: Option<Price>,
}

impl TargetConfig {
    pub fn price(&self) -> Option<Price> {
        self.price.or_else(|| Price::list(&self.model))
    }
}

impl ModelConfig {
    /// The id Cursor sees and sends back in `requested_model.model_id`.
    pub fn cursor_id(&self) -> String {
        format!("{MODEL_ID_PREFIX}{}", self.id)
    }

    pub fn display_name(&self) -> &str {
        self.display_name.as_deref().unwrap_or(&self.id)
    }

    pub fn thinks(&self) -> bool {
        self.thinking_budget.is_some() || self.reasoning_effort.is_some()
    }

    /// The configured price, else the list price of the provider's model; `None`: unknown.
    pub fn price(&self) -> Option<Price> {
        self.price.or_else(|| Price::list(&self.model))
    }
}

const REASONING_EFFORTS: &[&str] = &["minimal", "low", "medium", "high", "xhigh"];

impl Config {
    /// Every secret value the config holds, for the scrubber ([`crate::base::secret::register`]):
    /// provider keys and extra header values, the outbound proxy's URL and credentials (as
    /// written and percent-decoded), and the `proxy_auth` password.
    pub fn secret_values(&self) -> Vec<String> {
        let mut out = Vec::new();
        for provider in self.providers.values() {
            out.extend(provider.resolve_api_key().map(|k| k.expose().to_string()));
            out.extend(provider.headers.values().map(|v| v.expose().to_string()));
        }
        if let Some(url) = &self.upstream.proxy {
            out.push(url.expose().to_string());
            out.extend(userinfo_secrets(url.expose()));
        }
        out.extend(self.direct.token.iter().map(|t| t.expose().to_string()));
        if let Some(auth) = &self.proxy_auth {
            out.push(auth.password.expose().to_string());
            out.push(format!("{}:{}", auth.username, auth.password.expose()));
        }
        out
    }

    /// Parse and validate TOML text; `origin` names the file in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let de =
            toml::Deserializer::parse(text).map_err(|e| ConfigError::syntax(origin, text, &e))?;
        let config: Config = serde_path_to_error::deserialize(de)
            .map_err(|e| ConfigError::from_path_error(origin, text, e))?;
        config.validate(origin)?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            file: origin.clone(),
            reason: e.to_string(),
        })?;
        Config::from_toml(&text, &origin)
    }

    /// The embedded default, with models derived from `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`.
    pub fn embedded_default() -> Config {
        // The embedded text is covered by a unit test, so it always parses and validates.
        Config::from_toml(EMBEDDED_DEFAULT, "<embedded default>")
            .expect("embedded default config is valid (tested)")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }

    /// Without `proxy_auth` and `open_listener`, the listener's credentials are the
    /// per-install secret in `data_dir` (made on first use). Whether they are now.
    pub fn use_install_secret(
        &mut self,
        data_dir: &std::path::Path,
    ) -> Result<bool, install_secret::SecretError> {
        if self.proxy_auth.is_some() || self.open_listener {
            return Ok(false);
        }
        self.proxy_auth = Some(ProxyAuth {
            username: install_secret::USERNAME.to_string(),
            password: install_secret::load_or_create(data_dir)?,
        });
        self.install_secret = true;
        Ok(true)
    }

    pub fn model_by_cursor_id(&self, cursor_id: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.cursor_id() == cursor_id)
    }

    /// The model `[cmd_k] model` names, as Cursor sees it (`byok-<id>`); `None` when unset.
    pub fn cmd_k_model(&self) -> Option<&ModelConfig> {
        let name = self.cmd_k.model.as_deref()?;
        self.models
            .iter()
            .find(|m| m.id == name || m.cursor_id() == name)
    }

    /// Models whose provider has a usable API key.
    pub fn usable_models(&self) -> impl Iterator<Item = &ModelConfig> {
        self.models.iter().filter(|m| {
            self.providers
                .get(&m.provider)
                .is_some_and(|p| p.resolve_api_key().is_some())
        })
    }

    /// Checks the sections in a fixed order and reports the first problem found.
    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |key: String, reason: String| ConfigError::Invalid {
            file: file.to_string(),
            key,
            line: None,
            reason,
        };
        self.validate_intercept(&invalid)?;
        self.validate_upstream(&invalid)?;
        self.validate_direct(&invalid)?;
        self.validate_providers(&invalid)?;
        self.validate_models(&invalid)?;
        self.validate_cmd_k(&invalid)?;
        self.validate_fallback(&invalid)
    }

    fn validate_cmd_k(&self, invalid: &impl Invalid) -> Result<(), ConfigError> {
        match &self.cmd_k.model {
            Some(name) if self.cmd_k_model().is_none() => Err(invalid(
                "cmd_k.model".into(),
                format!("no model `{name}` in [[models]] (use its `id`)"),
            )),
            _ => Ok(()),
        }
    }

    fn validate_intercept(&self, invalid: &impl Invalid) -> Result<(), ConfigError> {
        if self.intercept.is_empty() {
            return Err(invalid(
                "intercept".into(),
                "at least one host pattern is needed".into(),
            ));
        }
        for (i, p) in self.intercept.iter().enumerate() {
            let rest = p.strip_prefix("*.").unwrap_or(p);
            if rest.is_empty() || rest.contains('*') || rest.contains('/') {
                return Err(invalid(
                    format!("intercept[{i}]"),
                    format!("`{p}` is not a host name or `*.domain` pattern"),
                ));
            }
        }
        Ok(())
    }

    fn validate_upstream(&self, invalid: &impl Invalid) -> Result<(), ConfigError> {
        if let Some(url) = &self.upstream.proxy {
            let url = url.expose();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(
                    "upstream.proxy".into(),
                    "must be an http:// or https:// URL".into(),
                ));
            }
        }
        Ok(())
    }

    fn validate_direct(&self, invalid: &impl Invalid) -> Result<(), ConfigError> {
        // A direct door spends the user's provider key for whoever reaches it: beyond loopback
        // only with a credential it checks (a door token, or `proxy_auth`'s).
        let guarded = self.direct.token.is_some() || self.proxy_auth.is_some();
        for (key, addr) in [
            ("direct.tls_listen", self.direct.tls_listen),
            ("direct.http_listen", self.direct.http_listen),
        ] {
            if let Some(addr) = addr.filter(|a| !a.ip().is_loopback() && !guarded) {
                return Err(invalid(
                    key.into(),
                    format!(
                        "{addr} is not a loopback address and neither [direct] token nor \
                         [proxy_auth] is set, so anyone who reaches it spends your provider \
                         key; bind it to 127.0.0.1 or set a door token"
                    ),
                ));
            }
        }
        if self
            .direct
            .token
            .as_ref()
            .is_some_and(|t| t.expose().len() < 16)
        {
            return Err(invalid(
                "direct.token".into(),
                "must be at least 16 characters".into(),
            ));
        }
        if !self.direct.origin.starts_with("https://") && !self.direct.origin.starts_with("http://")
        {
            return Err(invalid(
                "direct.origin".into(),
                "must be an http(s):// URL".into(),
            ));
        }
        Ok(())
    }

    fn validate_providers(&self, invalid: &impl Invalid) -> Result<(), ConfigError> {
        for (name, p) in &self.providers {
            if let Some(url) = &p.base_url {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid(
                        format!("providers.{name}.base_url"),
                        "must be an http:// or https:// URL".into(),
                    ));
                }
            }
            if p.api_key.is_none() && p.api_key_env.is_none() {
                return Err(invalid(
                    format!("providers.{name}"),
                    "needs `api_key_env` (preferred) or `api_key`".into(),
                ));
            }
        }
        Ok(())
    }

    fn validate_models(&self, invalid: &impl Invalid) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        for (i, m) in self.models.iter().enumerate() {
            let key = |field: &str| format!("models[{i}].{field}");
            if m.id.is_empty()
                || !m
                    .id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(invalid(
                    key("id"),
                    "use letters, digits, `-`, `_` or `.` (a `:` would read as a variant)".into(),
                ));
            }
            if !seen.insert(&m.id) {
                return Err(invalid(
                    key("id"),
                    format!("`{}` is configured twice", m.id),
                ));
            }
            if !self.providers.contains_key(&m.provider) {
                return Err(invalid(
                    key("provider"),
                    format!("no provider named `{}` in [providers]", m.provider),
                ));
            }
            if m.context_window == 0 || m.max_output_tokens == 0 {
                return Err(invalid(
                    key("context_window"),
                    "token limits must be positive".into(),
                ));
            }
            if m.price.is_some_and(|p| !p.is_valid()) {
                return Err(invalid(
                    key("price"),
                    "prices must be finite and not negative".into(),
                ));
            }
            check_effort(m.reasoning_effort.as_deref())
                .map_err(|reason| invalid(key("reasoning_effort"), reason))?;
            self.validate_model_fallback(i, m, invalid)?;
        }
        Ok(())
    }

    /// The fallback targets of `models[i]`.
    fn validate_model_fallback(
        &self,
        i: usize,
        m: &ModelConfig,
        invalid: &impl Invalid,
    ) -> Result<(), ConfigError> {
        for (j, t) in m.fallback.iter().enumerate() {
            let key = |field: &str| format!("models[{i}].fallback[{j}].{field}");
            if !self.providers.contains_key(&t.provider) {
                return Err(invalid(
                    key("provider"),
                    format!("no provider named `{}` in [providers]", t.provider),
                ));
            }
            if t.price.is_some_and(|p| !p.is_valid()) || t.max_output_tokens == Some(0) {
                return Err(invalid(
                    key("price"),
                    "prices must be finite and not negative, token limits positive".into(),
                ));
            }
            check_effort(t.reasoning_effort.as_deref())
                .map_err(|reason| invalid(key("reasoning_effort"), reason))?;
        }
        Ok(())
    }

    fn validate_fallback(&self, invalid: &impl Invalid) -> Result<(), ConfigError> {
        if self.fallback.first_token_timeout_secs == 0 || self.fallback.cooldown_secs == 0 {
            return Err(invalid(
                "fallback.first_token_timeout_secs".into(),
                "timeouts and cool-downs must be at least one second".into(),
            ));
        }
        Ok(())
    }
}

/// Builds the error for a broken rule from its key and reason; `validate` binds the file name.
trait Invalid: Fn(String, String) -> ConfigError {}
impl<F: Fn(String, String) -> ConfigError> Invalid for F {}

fn check_effort(effort: Option<&str>) -> Result<(), String> {
    match effort {
        Some(e) if !REASONING_EFFORTS.contains(&e) => Err(format!(
            "`{e}` is not one of {}",
            REASONING_EFFORTS.join(", ")
        )),
        _ => Ok(()),
    }
}

/// Does `host` match one of the intercept patterns? (`*.cursor.sh` matches `api2.cursor.sh`
/// and `a.b.cursor.sh`, not `cursor.sh` itself nor `evilcursor.sh`.)
pub fn host_matches(patterns: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    patterns.iter().any(|p| {
        let p = p.to_ascii_lowercase();
        match p.strip_prefix("*.") {
            Some(domain) => {
                host.len() > domain.len() + 1
                    && host.ends_with(domain)
                    && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
            }
            None => host == p,
        }
    })
}

#[cfg(test)]
mod tests;
