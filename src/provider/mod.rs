//! Provider clients: OpenAI Chat Completions (and compatibles), OpenAI Responses, Anthropic
//! Messages, behind one neutral interface. Knows nothing about Cursor or protobuf.
//!
//! ```text
//! ProviderClient::stream(ProviderRequest, CancellationToken) -> ProviderStream of ProviderEvent
//!     http.rs    request, retries (before any output), idle timeout, cancellation
//!     decode.rs  bytes -> sse.rs -> per-provider machine -> events   (pure, fixture-tested)
//! ```

pub mod anthropic;
pub mod decode;
pub mod error;
pub mod gemini;
mod http;
mod machine;
pub mod openai_chat;
pub mod openai_responses;
pub mod price;
pub mod schema;
pub mod sse;
pub mod types;

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::base::secret::Secret;
pub use decode::{decode_all, StreamDecoder};
pub use error::{ProviderError, ProviderErrorKind};
pub(crate) use machine::DecodeCtx;
pub use price::Price;
pub use types::*;

/// Which wire API a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProviderKind {
    /// `POST /chat/completions`; also DeepSeek, vLLM, Ollama, OpenRouter, Groq, Gemini, Azure.
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    #[serde(rename = "anthropic")]
    Anthropic,
    /// Gemini's native `streamGenerateContent`.
    #[serde(rename = "gemini")]
    Gemini,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAiChat => "openai-chat",
            ProviderKind::OpenAiResponses => "openai-responses",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
        }
    }

    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "https://api.anthropic.com",
            ProviderKind::Gemini => "https://generativelanguage.googleapis.com",
            _ => "https://api.openai.com/v1",
        }
    }

    /// `XApiKey` for Anthropic, `XGoogApiKey` for Gemini, `Bearer` otherwise.
    pub fn default_auth(self) -> AuthMode {
        match self {
            ProviderKind::Anthropic => AuthMode::XApiKey,
            ProviderKind::Gemini => AuthMode::XGoogApiKey,
            _ => AuthMode::Bearer,
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the API key goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMode {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// `api-key: <key>` (Azure OpenAI).
    ApiKey,
    /// `x-api-key: <key>` (Anthropic).
    XApiKey,
    /// `x-goog-api-key: <key>` (Gemini; never in the URL, where logs would keep it).
    XGoogApiKey,
}

/// Retry schedule: exponential backoff with jitter, before any output only.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First backoff; doubles each retry.
    pub base_delay: Duration,
    /// Backoff cap.
    pub max_delay: Duration,
    /// A provider asking to wait longer than this (`retry-after`) gets no retry: the error goes
    /// to the caller with the delay in it.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 2,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// Everything needed to talk to one provider endpoint.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    pub kind: ProviderKind,
    /// Display name for errors and logs; guessed from the host when `None`.
    pub name: Option<String>,
    /// API root: `https://api.openai.com/v1`, `https://api.deepseek.com`,
    /// `https://api.anthropic.com` (a trailing `/v1` is fine too). Empty means the kind's default.
    /// May carry a query (Azure's `?api-version=`); paths are inserted before it.
    pub base_url: String,
    /// Empty sends no auth header (local servers).
    pub api_key: Secret,
    /// `None` means the kind's default.
    pub auth: Option<AuthMode>,
    /// Sent on every request (e.g. `anthropic-beta`, OpenRouter's `HTTP-Referer`); values may
    /// be credentials, so they are secrets.
    pub extra_headers: Vec<(String, Secret)>,
    /// Replay identity stamped on extras; defaults to the base URL without query. Two settings
    /// with the same kind and identity may replay each other's reasoning.
    pub identity: Option<String>,
    pub(crate) anthropic_version: String,
    /// No bytes for this long (waiting for headers or while streaming) ends the call.
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    pub retry: RetryPolicy,
}

impl ProviderSettings {
    pub fn new(kind: ProviderKind, base_url: impl Into<String>, api_key: Secret) -> Self {
        ProviderSettings {
            kind,
            name: None,
            base_url: base_url.into(),
            api_key,
            auth: None,
            extra_headers: Vec::new(),
            identity: None,
            anthropic_version: "2023-06-01".into(),
            idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
        }
    }

    fn base(&self) -> &str {
        let b = self.base_url.trim();
        if b.is_empty() {
            self.kind.default_base_url()
        } else {
            b
        }
    }

    /// The replay identity (see [`ProviderExtra`]).
    pub fn identity(&self) -> String {
        if let Some(id) = &self.identity {
            return id.clone();
        }
        let base = self.base();
        let no_query = base.split(['?', '#']).next().unwrap_or(base);
        no_query.trim_end_matches('/').to_ascii_lowercase()
    }

    /// The provider's display name.
    pub fn display_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let host = reqwest::Url::parse(self.base())
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_default();
        let known = [
            ("api.openai.com", "OpenAI"),
            ("api.anthropic.com", "Anthropic"),
            ("api.deepseek.com", "DeepSeek"),
            ("openrouter.ai", "OpenRouter"),
            ("api.groq.com", "Groq"),
            ("generativelanguage.googleapis.com", "Gemini"),
            ("openai.azure.com", "Azure OpenAI"),
            ("api.x.ai", "xAI"),
            ("api.mistral.ai", "Mistral"),
        ];
        for (suffix, name) in known {
            if host == suffix || host.ends_with(&format!(".{suffix}")) {
                return name.to_string();
            }
        }
        match (host.is_empty(), self.kind) {
            (true, ProviderKind::Anthropic) => "Anthropic".into(),
            (true, ProviderKind::Gemini) => "Gemini".into(),
            (true, _) => "OpenAI".into(),
            (false, _) => host,
        }
    }

    /// The endpoint URL for this kind.
    fn endpoint(&self) -> Result<reqwest::Url, String> {
        let mut url = reqwest::Url::parse(self.base()).map_err(|e| format!("bad base URL: {e}"))?;
        if url.cannot_be_a_base() {
            return Err("bad base URL: not a hierarchical URL".into());
        }
        let ends_v1 = url.path().trim_end_matches('/').ends_with("/v1");
        let tail: &[&str] = match self.kind {
            ProviderKind::OpenAiChat => &["chat", "completions"],
            ProviderKind::OpenAiResponses => &["responses"],
            ProviderKind::Anthropic if ends_v1 => &["messages"],
            ProviderKind::Anthropic => &["v1", "messages"],
            // The model and method are added per call (see `Resolved::call_url`).
            ProviderKind::Gemini if ends_version(&url) => &["models"],
            ProviderKind::Gemini => &["v1beta", "models"],
        };
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty().extend(tail);
        }
        Ok(url)
    }
}

/// A Gemini base URL that already names the API version (`.../v1beta`, `.../v1`).
fn ends_version(url: &reqwest::Url) -> bool {
    let last = url
        .path()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    last == "v1" || last.starts_with("v1beta") || last.starts_with("v1alpha")
}

/// The resolved, immutable per-client state shared with stream tasks.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// Extra headers whose value names [`CONVERSATION_ID`]: filled in per conversation by
    /// [`ProviderClient::for_conversation`], never sent as written.
    pub templated: Vec<(HeaderName, Secret)>,
    pub kind: ProviderKind,
    pub name: String,
    pub url: reqwest::Url,
    pub headers: HeaderMap,
    pub ctx: DecodeCtx,
    pub api_key: Secret,
    pub idle_timeout: Duration,
    pub retry: RetryPolicy,
    /// api.openai.com wants `max_completion_tokens`.
    pub(crate) openai_host: bool,
    /// Tool schema and naming rules of this endpoint.
    pub dialect: schema::Dialect,
}

impl Resolved {
    /// The URL of one call: Gemini puts the model in the path
    /// (`models/{model}:streamGenerateContent?alt=sse`), the other kinds have one endpoint.
    pub(crate) fn call_url(&self, model: &str) -> reqwest::Url {
        let mut url = self.url.clone();
        if self.kind == ProviderKind::Gemini {
            let model = model.strip_prefix("models/").unwrap_or(model);
            if let Ok(mut segs) = url.path_segments_mut() {
                segs.pop_if_empty()
                    .push(&format!("{model}:streamGenerateContent"));
            }
            url.query_pairs_mut().append_pair("alt", "sse");
        }
        url
    }
}

/// A client for one provider endpoint; cheap to clone (the HTTP pool is shared).
#[derive(Debug, Clone)]
pub struct ProviderClient {
    http: reqwest::Client,
    inner: Arc<Resolved>,
}

impl ProviderClient {
    /// A client with its own pooled HTTP client.
    pub fn new(settings: ProviderSettings) -> Result<Self, ProviderError> {
        let http = build_http_client(settings.connect_timeout).map_err(|e| {
            ProviderError::new(
                ProviderErrorKind::Config,
                &settings.display_name(),
                e.without_url().to_string(),
            )
        })?;
        Self::with_http_client(settings, http)
    }

    /// A client reusing `http` (see [`build_http_client`]); its connect timeout applies.
    pub(crate) fn with_http_client(
        settings: ProviderSettings,
        http: reqwest::Client,
    ) -> Result<Self, ProviderError> {
        let name = settings.display_name();
        let config_err = |m: String| ProviderError::new(ProviderErrorKind::Config, &name, m);
        let url = settings.endpoint().map_err(config_err)?;
        let headers = build_headers(&settings).map_err(config_err)?;
        let templated = templated_headers(&settings).map_err(config_err)?;
        let inner = Resolved {
            templated,
            kind: settings.kind,
            dialect: schema::Dialect::for_endpoint(settings.kind, settings.base()),
            openai_host: url.host_str() == Some("api.openai.com"),
            ctx: DecodeCtx {
                kind: settings.kind,
                origin: settings.identity(),
                name: name.clone(),
            },
            name,
            url,
            headers,
            api_key: settings.api_key,
            idle_timeout: settings.idle_timeout,
            retry: settings.retry,
        };
        Ok(ProviderClient {
            http,
            inner: Arc::new(inner),
        })
    }

    pub fn kind(&self) -> ProviderKind {
        self.inner.kind
    }

    /// This client with its templated extra headers filled in for `conversation` (an empty
    /// value without one): a team gateway's user or tag header per conversation. A value that
    /// is not a valid header after the fill is left out. Cheap when nothing is templated.
    pub fn for_conversation(&self, conversation: Option<&str>) -> ProviderClient {
        if self.inner.templated.is_empty() {
            return self.clone();
        }
        let mut inner = (*self.inner).clone();
        for (name, template) in &self.inner.templated {
            let value = template
                .expose()
                .replace(CONVERSATION_ID, conversation.unwrap_or_default());
            match HeaderValue::from_str(&value) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    inner.headers.insert(name.clone(), v);
                }
                Err(_) => {
                    tracing::warn!(header = %name, "templated header left out: invalid value")
                }
            }
        }
        ProviderClient {
            http: self.http.clone(),
            inner: Arc::new(inner),
        }
    }

    /// Display name used in errors.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Replay identity stamped on extras this client produces.
    pub fn identity(&self) -> &str {
        &self.inner.ctx.origin
    }

    /// The JSON body [`ProviderClient::stream`] would send.
    pub fn request_body(&self, req: &ProviderRequest) -> serde_json::Value {
        self.prepare(req.clone()).0
    }

    /// The body for `req` after its tools are normalised for this endpoint, and the tool names
    /// to map back.
    fn prepare(&self, mut req: ProviderRequest) -> (serde_json::Value, schema::ToolNames) {
        let names = schema::prepare_request(self.inner.dialect, &mut req);
        let ctx = &self.inner.ctx;
        let body = match self.inner.kind {
            ProviderKind::OpenAiChat => openai_chat::build_body(&req, ctx, self.inner.openai_host),
            ProviderKind::OpenAiResponses => openai_responses::build_body(&req, ctx),
            ProviderKind::Anthropic => anthropic::build_body(&req, ctx),
            ProviderKind::Gemini => gemini::build_body(&req, ctx),
        };
        (body, names)
    }

    /// Start a streamed call. Events arrive through a bounded channel (backpressure); the call
    /// stops promptly when `cancel` fires or the returned stream is dropped. The stream ends
    /// after `Finished` or `Error` (a cancelled call ends with a `Canceled` error).
    pub fn stream(&self, req: ProviderRequest, cancel: CancellationToken) -> ProviderStream {
        self.start(req, cancel, self.inner.retry.max_retries)
    }

    /// [`ProviderClient::stream`] without retries: a first failure is the stream's error at
    /// once, for a caller with somewhere else to send the request (a fallback chain), where a
    /// retry honouring `retry-after` would only delay the switch.
    pub fn stream_once(&self, req: ProviderRequest, cancel: CancellationToken) -> ProviderStream {
        self.start(req, cancel, 0)
    }

    fn start(
        &self,
        req: ProviderRequest,
        cancel: CancellationToken,
        max_retries: u32,
    ) -> ProviderStream {
        let (tx, rx) = mpsc::channel(64);
        let token = cancel.child_token();
        let url = self.inner.call_url(&req.model);
        let model = req.model.clone();
        let (body, names) = self.prepare(req);
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let span = tracing::info_span!(
            "provider",
            provider = %self.inner.name,
            kind = %self.inner.kind,
            model = %model,
        );
        tokio::spawn(tracing::Instrument::instrument(
            http::run(
                self.http.clone(),
                self.inner.clone(),
                http::Call {
                    url,
                    body: body.into(),
                    names,
                    max_retries,
                },
                tx,
                token.clone(),
            ),
            span,
        ));
        ProviderStream {
            rx,
            _guard: token.drop_guard(),
        }
    }
}

/// Idle connections kept per provider host. A burst of parallel runs opens as many connections
/// as it needs; afterwards only these stay warm (each holds buffers and TLS state).
const POOL_MAX_IDLE_PER_HOST: usize = 8;

/// The shared HTTP client: pooled, TCP_NODELAY (token streams are many tiny writes), no overall
/// timeout (streams are long; the idle timeout guards them instead).
pub(crate) fn build_http_client(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .build()
}

fn build_headers(s: &ProviderSettings) -> Result<HeaderMap, String> {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        reqwest::header::ACCEPT,
        HeaderValue::from_static("text/event-stream"),
    );
    if s.kind == ProviderKind::Anthropic {
        let v = HeaderValue::from_str(&s.anthropic_version)
            .map_err(|_| "anthropic_version is not a valid header value".to_string())?;
        h.insert("anthropic-version", v);
    }
    for (k, v) in &s.extra_headers {
        if v.expose().contains(CONVERSATION_ID) {
            continue; // filled in per conversation (`templated_headers`)
        }
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("extra header name {k:?} is invalid"))?;
        // Values may be credentials: never echo them.
        let mut value = HeaderValue::from_str(v.expose())
            .map_err(|_| format!("extra header {k:?} has an invalid value"))?;
        value.set_sensitive(true);
        h.insert(name, value);
    }
    let key = s.api_key.expose();
    if !key.is_empty() {
        let (name, raw) = match s.auth.unwrap_or(s.kind.default_auth()) {
            AuthMode::Bearer => (reqwest::header::AUTHORIZATION, format!("Bearer {key}")),
            AuthMode::ApiKey => (HeaderName::from_static("api-key"), key.to_string()),
            AuthMode::XApiKey => (HeaderName::from_static("x-api-key"), key.to_string()),
            AuthMode::XGoogApiKey => (HeaderName::from_static("x-goog-api-key"), key.to_string()),
        };
        let mut value = HeaderValue::from_str(&raw)
            .map_err(|_| "the API key contains characters not allowed in a header".to_string())?;
        value.set_sensitive(true);
        h.insert(name, value);
    }
    Ok(h)
}

/// What an extra header's value may name, filled in per request with the conversation's id
/// (Cursor's conversation for an agent run, the prompt bar's session for a Cmd+K).
pub(crate) const CONVERSATION_ID: &str = "{conversation_id}";

/// The extra headers whose value names [`CONVERSATION_ID`].
fn templated_headers(s: &ProviderSettings) -> Result<Vec<(HeaderName, Secret)>, String> {
    s.extra_headers
        .iter()
        .filter(|(_, v)| v.expose().contains(CONVERSATION_ID))
        .map(|(k, v)| {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("extra header name {k:?} is invalid"))?;
            Ok((name, v.clone()))
        })
        .collect()
}

/// Events of one call. Dropping it cancels the call.
pub struct ProviderStream {
    rx: mpsc::Receiver<ProviderEvent>,
    _guard: DropGuard,
}

impl ProviderStream {
    /// The next event; `None` after the terminal event.
    pub async fn recv(&mut self) -> Option<ProviderEvent> {
        self.rx.recv().await
    }

    /// The next event if one is already there; `None` when none is (or the stream ended).
    pub fn try_recv(&mut self) -> Option<ProviderEvent> {
        self.rx.try_recv().ok()
    }

    /// Drain into a [`Turn`].
    pub async fn collect_turn(mut self) -> Turn {
        let mut b = TurnBuilder::new();
        while let Some(e) = self.rx.recv().await {
            b.push(&e);
        }
        b.finish()
    }
}

impl futures_util::Stream for ProviderStream {
    type Item = ProviderEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ProviderEvent>> {
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let url = |kind, base: &str| {
            ProviderSettings::new(kind, base, Secret::default())
                .endpoint()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            url(ProviderKind::OpenAiChat, ""),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            url(ProviderKind::OpenAiChat, "https://api.deepseek.com/"),
            "https://api.deepseek.com/chat/completions"
        );
        assert_eq!(
            url(
                ProviderKind::OpenAiResponses,
                "https://x.openai.azure.com/openai/v1?api-version=preview"
            ),
            "https://x.openai.azure.com/openai/v1/responses?api-version=preview"
        );
        assert_eq!(
            url(ProviderKind::Anthropic, ""),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            url(ProviderKind::Anthropic, "https://gw.example/anthropic/v1/"),
            "https://gw.example/anthropic/v1/messages"
        );
    }

    #[test]
    fn names_and_identity() {
        let s = ProviderSettings::new(
            ProviderKind::OpenAiChat,
            "https://API.DeepSeek.com/v1/?x=1",
            Secret::default(),
        );
        assert_eq!(s.display_name(), "DeepSeek");
        assert_eq!(s.identity(), "https://api.deepseek.com/v1");
        let s = ProviderSettings::new(ProviderKind::Anthropic, "", Secret::default());
        assert_eq!(s.display_name(), "Anthropic");
        let s = ProviderSettings::new(
            ProviderKind::OpenAiChat,
            "http://127.0.0.1:11434/v1",
            Secret::default(),
        );
        assert_eq!(s.display_name(), "127.0.0.1");
    }

    #[test]
    fn kind_serde_names() {
        assert_eq!(
            serde_json::to_string(&ProviderKind::OpenAiResponses).unwrap(),
            "\"openai-responses\""
        );
        let k: ProviderKind = serde_json::from_str("\"openai-chat\"").unwrap();
        assert_eq!(k, ProviderKind::OpenAiChat);
        let a: AuthMode = serde_json::from_str("\"x-api-key\"").unwrap();
        assert_eq!(a, AuthMode::XApiKey);
    }

    #[test]
    fn headers_hide_the_key() {
        let mut s =
            ProviderSettings::new(ProviderKind::OpenAiChat, "", Secret::new("sk-very-secret"));
        s.auth = Some(AuthMode::ApiKey);
        s.extra_headers
            .push(("x-extra".into(), Secret::new("extra-secret")));
        let h = build_headers(&s).unwrap();
        assert_eq!(h["api-key"], "sk-very-secret");
        assert!(h.get("authorization").is_none());
        assert!(!format!("{h:?}").contains("sk-very-secret"));
        assert!(!format!("{s:?}").contains("extra-secret"));
        let client = ProviderClient::new(s).unwrap();
        assert!(!format!("{client:?}").contains("sk-very-secret"));
        let mut bad = ProviderSettings::new(ProviderKind::Anthropic, "", Secret::default());
        bad.extra_headers
            .push(("bad header".into(), Secret::new("v")));
        assert_eq!(
            ProviderClient::new(bad).unwrap_err().kind,
            ProviderErrorKind::Config
        );
    }
}
