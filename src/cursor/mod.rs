//! Cursor's own services, adjusted: the model lists get the configured models appended,
//! `GetServerConfig` steers the desktop's Agent to a transport that reaches us,
//! `BootstrapStatsig` turns off the gates of the agent doors we do not serve (`statsig.rs`),
//! and the WebSocket reachability probe is refused. Everything else passes upstream untouched (that
//! decision is the router's; [`classify`] names what is handled here).
//!
//! Flow for the unary RPCs: the request goes upstream unchanged (streamed); a binary-protobuf
//! success answer is read (bounded), decoded with the full schema, adjusted and re-encoded
//! uncompressed. A model list we cannot merge passes through as it came (without our models).
//! A server config or Statsig bootstrap we cannot adjust never does: it would steer the Agent
//! where we cannot guard it, so our local answer replaces it. When upstream cannot answer, the
//! model lists are answered with the configured models alone; `GetServerConfig` is answered
//! locally only when upstream is unreachable or its answer unusable (an upstream error passes
//! through: we do not invent a server config). JSON clients (`application/json`) are never
//! rewritten, except the Statsig bootstrap's `config`.

mod models;
mod server_config;
mod statsig;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use prost::Message;

use crate::config::Config;
use crate::connect::{decode_unary, CodecError, Limits};
use crate::http::{boxed, empty, full, Body, RequestContext};
use crate::proto::agent::v1 as ag;
use crate::proto::aiserver::v1 as ai;
use crate::status::Status;
use crate::upstream::{error_response, Upstream, UpstreamError};

pub use models::{
    available_model, available_models_additions, local_available_models,
    local_default_model_for_cli, local_usable_models, merge_available_models, merge_usable_models,
    model_details, parse_variant_string, usable_models_additions, EFFORT_PARAM, THINKING_PARAM,
    UNSET_PICKER_FIELDS,
};
pub(crate) use server_config::{local_server_config, rewrite_server_config};
pub use statsig::{djb2, GATES_OFF};

pub const AVAILABLE_MODELS: &str = "/aiserver.v1.AiService/AvailableModels";
pub(crate) const GET_USABLE_MODELS: [&str; 2] = [
    "/agent.v1.AgentService/GetUsableModels",
    "/aiserver.v1.AiService/GetUsableModels",
];
pub(crate) const GET_DEFAULT_MODEL_FOR_CLI: [&str; 2] = [
    "/agent.v1.AgentService/GetDefaultModelForCli",
    "/aiserver.v1.AiService/GetDefaultModelForCli",
];
pub const GET_SERVER_CONFIG: &str = "/aiserver.v1.ServerConfigService/GetServerConfig";
pub(crate) const BOOTSTRAP_STATSIG: &str = "/aiserver.v1.AnalyticsService/BootstrapStatsig";
/// The WebSocket reachability probe; a 404. (The agent WebSocket itself, `/agent/v1/run`, is
/// the agent's: `agent::transport`.)
pub(crate) const WS_PROBES: [&str; 1] = ["/ws-reachability-probe"];

/// `GetServerConfigResponse` fields we may change: `http2_config` (7), `agent_url_config` (27).
const SERVER_CONFIG_OWNED: &[u32] = &[7, 27];

/// Largest upstream answer we read to rewrite (the real model list is ~50 KB).
const MAX_ANSWER_WIRE: usize = 16 << 20;
const MAX_ANSWER_DECODED: usize = 64 << 20;
/// Upstream's answer must arrive within this once its head is in.
const ANSWER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A Cursor RPC handled here rather than passed through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorRpc {
    /// `/aiserver.v1.AiService/AvailableModels`: the desktop picker.
    AvailableModels,
    /// `GetUsableModels` on `agent.v1.AgentService` or `aiserver.v1.AiService`.
    GetUsableModels,
    /// `GetDefaultModelForCli` on either service: passed through when upstream answers; the
    /// first configured model when it cannot.
    GetDefaultModelForCli,
    /// `/aiserver.v1.ServerConfigService/GetServerConfig`.
    GetServerConfig,
    /// `/ws-reachability-probe`, any method: 404, never forwarded.
    WsProbe,
    /// `/aiserver.v1.AnalyticsService/BootstrapStatsig`: the gates of the agent doors we do
    /// not serve turned off (see `statsig.rs`).
    BootstrapStatsig,
}

impl CursorRpc {
    fn is_model_list(self) -> bool {
        matches!(
            self,
            CursorRpc::AvailableModels
                | CursorRpc::GetUsableModels
                | CursorRpc::GetDefaultModelForCli
        )
    }
}

/// Which of Cursor's RPCs `path` (the URI path, no query) is, if it is one handled here.
/// Exact matches only: anything else passes upstream.
pub fn classify(path: &str) -> Option<CursorRpc> {
    match path {
        AVAILABLE_MODELS => Some(CursorRpc::AvailableModels),
        GET_SERVER_CONFIG => Some(CursorRpc::GetServerConfig),
        BOOTSTRAP_STATSIG => Some(CursorRpc::BootstrapStatsig),
        p if GET_USABLE_MODELS.contains(&p) => Some(CursorRpc::GetUsableModels),
        p if GET_DEFAULT_MODEL_FOR_CLI.contains(&p) => Some(CursorRpc::GetDefaultModelForCli),
        p if WS_PROBES.contains(&p) => Some(CursorRpc::WsProbe),
        _ => None,
    }
}

/// Internal failures while adjusting an upstream answer. None reaches the client: the handler
/// logs them and answers with upstream's bytes or a local answer instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CursorError {
    #[error("reading upstream's answer failed: {0}")]
    Read(String),
    #[error("upstream's answer exceeds {max} bytes")]
    TooLarge { max: usize },
    #[error("upstream's answer did not arrive within {secs}s")]
    Timeout { secs: u64 },
    #[error("upstream's answer body: {0}")]
    Codec(#[from] CodecError),
    #[error("upstream's {message} does not scan as protobuf: {source}")]
    Wire {
        message: &'static str,
        #[source]
        source: crate::proto::wire::WireError,
    },
    #[error("upstream's answer is not a valid {message}: {source}")]
    Decode {
        message: &'static str,
        #[source]
        source: prost::DecodeError,
    },
}

/// Handlers for the RPCs [`classify`] names. Cheap to clone.
#[derive(Clone)]
pub struct CursorServices {
    config: Arc<Config>,
    status: Status,
}

impl CursorServices {
    pub fn new(config: Arc<Config>) -> Self {
        CursorServices {
            config,
            status: Status::new(),
        }
    }

    /// Report what upstream's answers carry that this build does not know to `status`.
    pub fn with_status(mut self, status: Status) -> Self {
        self.status = status;
        self
    }

    /// Answer one classified request. Never fails: upstream trouble and our own become the
    /// best answer available (see the module docs).
    pub async fn handle(
        &self,
        rpc: CursorRpc,
        ctx: &RequestContext,
        req: Request<Body>,
        upstream: &Upstream,
    ) -> Response<Body> {
        match rpc {
            CursorRpc::WsProbe => status_only(StatusCode::NOT_FOUND),
            CursorRpc::BootstrapStatsig => bootstrap_statsig(ctx, req, upstream).await,
            _ => self.adjust(rpc, ctx, req, upstream).await,
        }
    }

    async fn adjust(
        &self,
        rpc: CursorRpc,
        ctx: &RequestContext,
        mut req: Request<Body>,
        upstream: &Upstream,
    ) -> Response<Body> {
        let proto_client = is_proto_request(&req);
        let client_version = crate::status::client_version(req.headers());
        if proto_client {
            narrow_accept_encoding(req.headers_mut());
        }
        let resp = match upstream.send(ctx, req).await {
            Ok(resp) => resp,
            Err(err) => {
                tracing::warn!(?rpc, error = %err, "upstream unreachable");
                if proto_client {
                    if let Some(local) = self.local_answer(rpc) {
                        tracing::info!(?rpc, "answered locally (upstream unreachable)");
                        return local;
                    }
                }
                return error_response(&err, true);
            }
        };
        let (parts, body) = resp.into_parts();
        if !parts.status.is_success() {
            // A refused model list still gets ours (the user may not be signed in to Cursor);
            // a refused server config is upstream's to report.
            if proto_client && rpc.is_model_list() {
                if let Some(local) = self.local_answer(rpc) {
                    tracing::info!(?rpc, status = %parts.status, "upstream refused; answered locally");
                    return local;
                }
            }
            return passthrough(parts, boxed(body));
        }
        if !is_proto(&parts.headers) || rpc == CursorRpc::GetDefaultModelForCli {
            // JSON answers are not rewritten; upstream's default model stands when it has one.
            return passthrough(parts, boxed(body));
        }
        let wire = match read_bounded(body).await {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::warn!(?rpc, error = %err, "upstream's answer unusable");
                if let Some(local) = self.local_answer(rpc) {
                    return local;
                }
                let err = UpstreamError::Request {
                    host: ctx.host.clone(),
                    reason: err.to_string(),
                };
                return error_response(&err, true);
            }
        };
        let encoding = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match self.rewrite(
            rpc,
            wire.clone(),
            encoding.as_deref(),
            client_version.as_deref(),
        ) {
            Ok(message) => proto_response(parts.headers, message),
            Err(err) => self.unadjusted(rpc, &err, parts, wire),
        }
    }

    /// The answer when upstream's could not be adjusted.
    fn unadjusted(
        &self,
        rpc: CursorRpc,
        err: &CursorError,
        parts: http::response::Parts,
        wire: Bytes,
    ) -> Response<Body> {
        if rpc == CursorRpc::GetServerConfig {
            // Fail closed: upstream's config as it came could send the Agent around the
            // proxy (HTTP/2 bidi) while our models are listed, so a BYOK run would go
            // straight to Cursor. Our local config keeps the transport that reaches us.
            tracing::warn!(
                ?rpc,
                error = %err,
                "cannot adjust upstream's server config; answering ours (only the agent \
                 transport settings) so the Agent keeps reaching this proxy"
            );
            return proto_response(
                HeaderMap::new(),
                local_server_config(&self.config).encode_to_vec(),
            );
        }
        // A model list we cannot merge: Cursor's own, as it came (our models are then absent
        // from it, so none can be picked).
        tracing::warn!(?rpc, error = %err, "cannot adjust upstream's answer; passing it through");
        passthrough(parts, full(wire))
    }

    /// Decode upstream's (possibly gzip) answer, adjust it, re-encode it uncompressed. The
    /// answer is built over upstream's bytes (appended to, or with only our fields replaced),
    /// so fields this build does not know pass through unchanged.
    fn rewrite(
        &self,
        rpc: CursorRpc,
        wire: Bytes,
        content_encoding: Option<&str>,
        client_version: Option<&str>,
    ) -> Result<Vec<u8>, CursorError> {
        let limits = Limits {
            max_frame_bytes: MAX_ANSWER_WIRE,
            max_decompressed_bytes: MAX_ANSWER_DECODED,
        };
        let message = decode_unary(wire, content_encoding, limits)?;
        if let Some((source, message_type)) = answer_type(rpc) {
            let report = crate::proto::inspect::schema().check(message_type, &message);
            self.status.unknown_schema(source, client_version, &report);
            if let Some(capture) = self.status.capture() {
                capture.message(
                    crate::capture::Direction::FromUpstream,
                    source,
                    message_type,
                    &message,
                    client_version,
                    Some(&report),
                );
            }
        }
        let config = &self.config;
        let out = match rpc {
            CursorRpc::AvailableModels => {
                let resp = decode::<ai::AvailableModelsResponse>(
                    message.clone(),
                    "AvailableModelsResponse",
                )?;
                let ours = available_models_additions(&resp, config);
                tracing::debug!(
                    upstream = resp.models.len(),
                    added = ours.models.len(),
                    "model list merged"
                );
                [message.as_ref(), &ours.encode_to_vec()].concat()
            }
            CursorRpc::GetUsableModels => {
                let resp = decode::<ag::GetUsableModelsResponse>(
                    message.clone(),
                    "GetUsableModelsResponse",
                )?;
                let ours = usable_models_additions(&resp, config);
                [message.as_ref(), &ours.encode_to_vec()].concat()
            }
            CursorRpc::GetServerConfig => {
                let resp = decode::<ai::GetServerConfigResponse>(
                    message.clone(),
                    "GetServerConfigResponse",
                )?;
                let ours = rewrite_server_config(resp.clone(), config);
                crate::proto::wire::update(&message, &resp, &ours, SERVER_CONFIG_OWNED).map_err(
                    |e| CursorError::Wire {
                        message: "GetServerConfigResponse",
                        source: e,
                    },
                )?
            }
            // Not rewritten here (handled before the body is read, or by their own handler).
            CursorRpc::GetDefaultModelForCli | CursorRpc::WsProbe | CursorRpc::BootstrapStatsig => {
                message.to_vec()
            }
        };
        Ok(out)
    }

    /// Our own answer for `rpc` when upstream has none; `None` when we have nothing to say
    /// (no usable model for the CLI default).
    fn local_answer(&self, rpc: CursorRpc) -> Option<Response<Body>> {
        let config = &self.config;
        let message = match rpc {
            CursorRpc::AvailableModels => local_available_models(config).encode_to_vec(),
            CursorRpc::GetUsableModels => local_usable_models(config).encode_to_vec(),
            CursorRpc::GetDefaultModelForCli => {
                local_default_model_for_cli(config)?.encode_to_vec()
            }
            CursorRpc::GetServerConfig => local_server_config(config).encode_to_vec(),
            CursorRpc::WsProbe => return None,
            CursorRpc::BootstrapStatsig => statsig::local_bootstrap(now_ms()),
        };
        Some(proto_response(HeaderMap::new(), message))
    }
}

/// The answers checked for what this build does not know: the status source and the type.
fn answer_type(rpc: CursorRpc) -> Option<(&'static str, &'static str)> {
    match rpc {
        CursorRpc::AvailableModels => {
            Some(("AvailableModels", "aiserver.v1.AvailableModelsResponse"))
        }
        CursorRpc::GetUsableModels => Some(("GetUsableModels", "agent.v1.GetUsableModelsResponse")),
        CursorRpc::GetServerConfig => {
            Some(("GetServerConfig", "aiserver.v1.GetServerConfigResponse"))
        }
        CursorRpc::GetDefaultModelForCli | CursorRpc::WsProbe | CursorRpc::BootstrapStatsig => None,
    }
}

/// `BootstrapStatsig`: upstream's answer with the agent-door gates off, or, when that answer
/// cannot be had or read, our local bootstrap with only those gates (off). Never upstream's
/// bytes unrewritten: they may hold the gates on (`statsig.rs` says why this fails closed).
async fn bootstrap_statsig(
    ctx: &RequestContext,
    mut req: Request<Body>,
    upstream: &Upstream,
) -> Response<Body> {
    let json_client = is_json(req.headers());
    narrow_accept_encoding(req.headers_mut());
    let failure = match upstream.send(ctx, req).await {
        Err(err) => format!("upstream unreachable: {err}"),
        Ok(resp) if !resp.status().is_success() => {
            format!("upstream answered {}", resp.status())
        }
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            match read_bounded(body).await {
                Err(err) => err.to_string(),
                Ok(wire) => match rewrite_statsig(&parts.headers, wire) {
                    Ok(answer) => return answer_with(parts.headers, answer),
                    Err(err) => err,
                },
            }
        }
    };
    tracing::warn!(
        reason = %failure,
        "BootstrapStatsig: upstream's bootstrap not usable; answering ours (agent-door gates off, \
         other experiments at their defaults)"
    );
    let local = statsig::local_bootstrap(now_ms());
    if json_client {
        let config = statsig::local_config(now_ms());
        let body = serde_json::json!({ "config": config }).to_string();
        return answer_with(HeaderMap::new(), StatsigAnswer::Json(body.into_bytes()));
    }
    answer_with(HeaderMap::new(), StatsigAnswer::Proto(local))
}

/// A rewritten bootstrap, in the form upstream gave it.
enum StatsigAnswer {
    Proto(Vec<u8>),
    /// A Connect-enveloped protobuf (flag 0, one frame), with upstream's content type.
    Enveloped(Vec<u8>),
    Json(Vec<u8>),
}

/// Upstream's bootstrap (possibly gzip; bare protobuf, one Connect envelope, or Connect JSON
/// with the config in `config`) with the gates off.
fn rewrite_statsig(headers: &HeaderMap, wire: Bytes) -> Result<StatsigAnswer, String> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok());
    let limits = Limits {
        max_frame_bytes: MAX_ANSWER_WIRE,
        max_decompressed_bytes: MAX_ANSWER_DECODED,
    };
    let message = decode_unary(wire, encoding, limits).map_err(|e| e.to_string())?;
    if is_json(headers) {
        let mut root: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&message).map_err(|e| format!("answer is not JSON: {e}"))?;
        let Some(serde_json::Value::String(config)) = root.get("config") else {
            return Err("JSON answer has no string `config`".into());
        };
        let rewritten = statsig::rewrite_config(config).map_err(|e| e.to_string())?;
        root.insert("config".into(), rewritten.into());
        let body = serde_json::to_vec(&root).map_err(|e| e.to_string())?;
        return Ok(StatsigAnswer::Json(body));
    }
    // A protobuf message cannot start with byte 0 (field number 0), so a leading 0 whose
    // length prefix spans the rest is a Connect envelope (uncompressed).
    if let [0, a, b, c, d, payload @ ..] = &message[..] {
        if u32::from_be_bytes([*a, *b, *c, *d]) as usize == payload.len() {
            let out = statsig::rewrite_message(payload).map_err(|e| e.to_string())?;
            let framed = crate::connect::encode_frame(0, &out).map_err(|e| e.to_string())?;
            return Ok(StatsigAnswer::Enveloped(framed.to_vec()));
        }
    }
    statsig::rewrite_message(&message)
        .map(StatsigAnswer::Proto)
        .map_err(|e| e.to_string())
}

fn answer_with(mut headers: HeaderMap, answer: StatsigAnswer) -> Response<Body> {
    let (content_type, body) = match answer {
        StatsigAnswer::Proto(body) => return proto_response(headers, body),
        StatsigAnswer::Enveloped(body) => (None, body),
        StatsigAnswer::Json(body) => (Some("application/json"), body),
    };
    strip_hop_by_hop(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::CONTENT_ENCODING);
    if let Some(media) = content_type {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    }
    let mut resp = Response::new(full(body));
    *resp.headers_mut() = headers;
    resp
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn decode<M: Message + Default>(message: Bytes, name: &'static str) -> Result<M, CursorError> {
    M::decode(message).map_err(|source| CursorError::Decode {
        message: name,
        source,
    })
}

/// Reads a whole answer body, bounded in size and time.
async fn read_bounded<B>(body: B) -> Result<Bytes, CursorError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let collect = Limited::new(body, MAX_ANSWER_WIRE).collect();
    match tokio::time::timeout(ANSWER_READ_TIMEOUT, collect).await {
        Err(_) => Err(CursorError::Timeout {
            secs: ANSWER_READ_TIMEOUT.as_secs(),
        }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(CursorError::TooLarge {
            max: MAX_ANSWER_WIRE,
        }),
        Ok(Err(e)) => Err(CursorError::Read(e.to_string())),
    }
}

/// Binary Connect unary: `content-type: application/proto`, or a Connect GET asking for
/// `encoding=proto`.
fn is_proto_request<B>(req: &Request<B>) -> bool {
    if req.method() == Method::GET {
        return req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "encoding=proto"));
    }
    is_proto(req.headers())
}

fn is_proto(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/proto"))
}

/// We decode gzip and identity only: ask upstream for nothing else (a `br` answer could not be
/// merged). Clients that do not offer gzip are left as they are.
fn narrow_accept_encoding(headers: &mut HeaderMap) {
    let offers_gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("gzip"));
    if offers_gzip {
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
    }
}

/// Connection-specific headers never travel past us (RFC 9110 §7.6.1); nor does `Trailer`,
/// since the bodies we answer with carry no trailers of upstream's.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    crate::upstream::headers::strip_hop_by_hop(headers, false);
    headers.remove(header::TRAILER);
}

fn passthrough(mut parts: http::response::Parts, body: Body) -> Response<Body> {
    strip_hop_by_hop(&mut parts.headers);
    // A re-collected body gets its length recomputed; a streamed one keeps upstream's framing.
    if http_body::Body::size_hint(&body).exact().is_some() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    Response::from_parts(parts, body)
}

/// A 200 `application/proto` answer, uncompressed, keeping `headers` (upstream's) otherwise.
fn proto_response(mut headers: HeaderMap, message: Vec<u8>) -> Response<Body> {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::CONTENT_ENCODING);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/proto"),
    );
    let mut resp = Response::new(full(message));
    *resp.headers_mut() = headers;
    resp
}

fn status_only(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::io::{Read, Write};
    use std::path::Path;

    use base64::Engine;

    use crate::config::Config;

    /// The real `AvailableModelsResponse` capture (raw protobuf), or `None` (with `test` reported
    /// as skipped) when the shared directory is absent.
    pub fn capture_models_raw(test: &str) -> Option<Vec<u8>> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/protocol/captures/yelixir-native-cli-20260825-models.gzip.b64");
        let Ok(b64) = std::fs::read_to_string(&path) else {
            // Straight to the stderr handle in one write on a line of its own: the test
            // harness captures `eprintln!`, and a skip must show in a plain `cargo test`.
            let line = format!(
                "\nSKIPPED {test}: {} not found (no licence to keep a copy in the repository; \
                 CI has ../shared)\n",
                path.display()
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            return None;
        };
        let gz = base64::engine::general_purpose::STANDARD
            .decode(b64.split_whitespace().collect::<String>())
            .expect("capture is base64");
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .expect("capture is gzip");
        Some(raw)
    }

    /// Two usable models (an effort model, a thinking-budget model) and one without a key.
    pub(crate) fn test_config() -> Config {
        let text = r#"
[providers.openai]
kind = "openai-chat"
api_key = "sk-test"
[providers.anthropic]
kind = "anthropic"
api_key = "sk-ant-test"
[providers.nokey]
kind = "openai-chat"
api_key_env = "CURSOR_BYOK_TEST_SURELY_UNSET_VAR"

[[models]]
id = "gpt"
display_name = "My GPT"
provider = "openai"
model = "gpt-5"
context_window = 400000
reasoning_effort = "minimal"
supports_images = false

[[models]]
id = "claude"
provider = "anthropic"
model = "claude-x"
thinking_budget = 4000

[[models]]
id = "plain"
provider = "nokey"
model = "m"
"#;
        Config::from_toml(text, "test").expect("test config is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_exact_paths() {
        assert_eq!(classify(AVAILABLE_MODELS), Some(CursorRpc::AvailableModels));
        assert_eq!(
            classify("/agent.v1.AgentService/GetUsableModels"),
            Some(CursorRpc::GetUsableModels)
        );
        assert_eq!(
            classify("/aiserver.v1.AiService/GetUsableModels"),
            Some(CursorRpc::GetUsableModels)
        );
        assert_eq!(
            classify("/agent.v1.AgentService/GetDefaultModelForCli"),
            Some(CursorRpc::GetDefaultModelForCli)
        );
        assert_eq!(
            classify("/aiserver.v1.AiService/GetDefaultModelForCli"),
            Some(CursorRpc::GetDefaultModelForCli)
        );
        assert_eq!(
            classify("/aiserver.v1.ServerConfigService/GetServerConfig"),
            Some(CursorRpc::GetServerConfig)
        );
        assert_eq!(classify("/agent/v1/run"), None, "the agent's door");
        assert_eq!(classify("/ws-reachability-probe"), Some(CursorRpc::WsProbe));
        for other in [
            "/aiserver.v1.AiService/AvailableModels/",
            "/aiserver.v1.AiService/AvailableModelsX",
            "/aiserver.v1.aiservice/availablemodels",
            "/agent.v1.AgentService/Run",
            "/agent.v1.AgentService/RunSSE",
            "/aiserver.v1.ServerConfigService/GetNewRepoFlowConfig",
            "/aiserver.v1.AiService/GetModelLabels",
            "/agent/v1/run/x",
            "/",
            "",
        ] {
            assert_eq!(classify(other), None, "{other}");
        }
    }

    #[test]
    fn proto_detection() {
        let req = |method: Method, uri: &str, ct: Option<&str>| {
            let mut b = Request::builder().method(method).uri(uri);
            if let Some(ct) = ct {
                b = b.header(header::CONTENT_TYPE, ct);
            }
            b.body(()).expect("request")
        };
        assert!(is_proto_request(&req(
            Method::POST,
            "/x",
            Some("application/proto")
        )));
        assert!(is_proto_request(&req(
            Method::POST,
            "/x",
            Some("Application/Proto; charset=x")
        )));
        assert!(!is_proto_request(&req(
            Method::POST,
            "/x",
            Some("application/json")
        )));
        assert!(!is_proto_request(&req(
            Method::POST,
            "/x",
            Some("application/protobuf")
        )));
        assert!(!is_proto_request(&req(Method::POST, "/x", None)));
        assert!(is_proto_request(&req(
            Method::GET,
            "/x?connect=v1&encoding=proto&message=",
            None
        )));
        assert!(!is_proto_request(&req(
            Method::GET,
            "/x?encoding=json",
            None
        )));
    }

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-cursor-thing", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-cursor-thing"));
    }

    #[test]
    fn gzip_answers_are_rewritten_and_bad_ones_refused() {
        let services = CursorServices::new(Arc::new(test_support::test_config()));
        let upstream = ai::AvailableModelsResponse {
            models: vec![ai::available_models_response::AvailableModel {
                name: "composer-2.5".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let gz = crate::connect::encode_unary(
            Bytes::from(upstream.encode_to_vec()),
            crate::connect::Encoding::Gzip,
        )
        .expect("gzip");
        let out = services
            .rewrite(CursorRpc::AvailableModels, gz, Some("gzip"), None)
            .expect("rewrites");
        let back = ai::AvailableModelsResponse::decode(&out[..]).expect("decodes");
        assert_eq!(back.models.len(), 3);
        assert_eq!(back.models[0], upstream.models[0]);

        let bad = services.rewrite(
            CursorRpc::AvailableModels,
            Bytes::from_static(b"\x12\xff"),
            None,
            None,
        );
        assert!(matches!(bad, Err(CursorError::Decode { .. })), "{bad:?}");
        let bad = services.rewrite(
            CursorRpc::GetServerConfig,
            Bytes::from_static(b"x"),
            Some("br"),
            None,
        );
        assert!(matches!(bad, Err(CursorError::Codec(_))), "{bad:?}");
    }

    #[test]
    fn answers_keep_fields_this_build_does_not_know() {
        let services = CursorServices::new(Arc::new(test_support::test_config()));
        // Field 900 at the top and inside a model: unknown to this build.
        let unknown = |n: u32| {
            let mut v = Vec::new();
            prost::encoding::encode_key(n, prost::encoding::WireType::LengthDelimited, &mut v);
            v.extend_from_slice(b"\x03new");
            v
        };
        let model = ai::available_models_response::AvailableModel {
            name: "composer-2.5".into(),
            ..Default::default()
        };
        let model_wire = [model.encode_to_vec(), unknown(900)].concat();
        let mut upstream = Vec::new();
        prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, &mut upstream);
        prost::encoding::encode_varint(model_wire.len() as u64, &mut upstream);
        upstream.extend_from_slice(&model_wire);
        upstream.extend(unknown(901));
        assert_eq!(
            ai::AvailableModelsResponse::decode(&upstream[..])
                .unwrap()
                .models[0],
            model,
            "field 2 is `models`"
        );
        let out = services
            .rewrite(
                CursorRpc::AvailableModels,
                Bytes::from(upstream.clone()),
                None,
                None,
            )
            .expect("rewrites");
        assert!(
            out.starts_with(&upstream),
            "upstream's bytes come first, unchanged"
        );
        assert_eq!(
            ai::AvailableModelsResponse::decode(&out[..])
                .unwrap()
                .models
                .len(),
            3
        );

        let config = ai::GetServerConfigResponse {
            config_version: "v1".into(),
            ..Default::default()
        };
        let config_wire = [config.encode_to_vec(), unknown(950)].concat();
        let out = services
            .rewrite(
                CursorRpc::GetServerConfig,
                Bytes::from(config_wire.clone()),
                None,
                Some("3.24.1"),
            )
            .expect("rewrites");
        assert!(out.starts_with(&config_wire), "{out:?}");
        let back = ai::GetServerConfigResponse::decode(&out[..]).unwrap();
        assert_eq!(back.http2_config, ai::Http2Config::ForceBidiDisabled as i32);
        assert_eq!(back.config_version, "v1");
        // Both answers' unknown fields were reported.
        let report = services.status.snapshot().unknown;
        let keys: Vec<&str> = report.items.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "AvailableModelsResponse.AvailableModel.900",
                "AvailableModelsResponse.901",
                "GetServerConfigResponse.950"
            ]
        );
        assert_eq!(report.client_version.as_deref(), Some("3.24.1"));
    }

    #[tokio::test]
    async fn local_answers_are_proto() {
        let services = CursorServices::new(Arc::new(test_support::test_config()));
        let resp = services
            .local_answer(CursorRpc::AvailableModels)
            .expect("answer");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/proto");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let models = ai::AvailableModelsResponse::decode(body).expect("decodes");
        assert_eq!(models.models.len(), 2);
        assert!(services.local_answer(CursorRpc::WsProbe).is_none());
    }

    #[tokio::test]
    async fn bounded_read_refuses_oversized_bodies() {
        let big = http_body_util::Full::new(Bytes::from(vec![0u8; MAX_ANSWER_WIRE + 1]));
        let r = read_bounded(big).await;
        assert!(matches!(r, Err(CursorError::TooLarge { .. })), "{r:?}");
        let small = http_body_util::Full::new(Bytes::from_static(b"ok"));
        assert_eq!(
            read_bounded(small).await.expect("reads"),
            Bytes::from_static(b"ok")
        );
    }
}
