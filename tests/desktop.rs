//! What the desktop app (3.23–3.24) needs beyond what the SDK exercises: the picker fields of
//! our model entries, loop detection through the proxy, Remote-SSH settings, transcripts.
//! These are checked against crafted client messages: the SDK sends none of them.

use std::sync::Arc;

use bytes::Bytes;
use http::uri::Scheme;
use http::{header, Request, StatusCode, Version};
use http_body_util::BodyExt;
use prost::Message;
use tokio_util::sync::CancellationToken;

use cursor_byok::config::{Config, UpstreamConfig};
use cursor_byok::cursor::{classify, CursorServices};
use cursor_byok::http::{full, Body, Door, RequestContext};
use cursor_byok::proto::agent::v1 as ag;
use cursor_byok::proto::aiserver::v1 as ai;
use cursor_byok::upstream::Upstream;

const MODELS: &str = r#"
[providers.anthropic]
kind = "anthropic"
api_key = "sk-test"

[[models]]
id = "sonnet"
display_name = "My Sonnet"
provider = "anthropic"
model = "claude-sonnet-4-5"
thinking_budget = 4000

[[models]]
id = "local"
provider = "anthropic"
model = "qwen3-coder"
"#;

/// Asks the model-list RPCs of a proxy whose upstream is unreachable (a bound port nobody
/// listens on), so the answers are our entries alone.
async fn ask(path: &str) -> Bytes {
    let config = Config::from_toml(MODELS, "test").expect("config");
    let upstream = Upstream::new(
        &UpstreamConfig::default(),
        Vec::new(),
        CancellationToken::new(),
    )
    .expect("upstream");
    let services = CursorServices::new(Arc::new(config));
    let closed = tokio::net::TcpSocket::new_v4().expect("socket");
    closed.bind(([127, 0, 0, 1], 0).into()).expect("bind");
    let port = closed.local_addr().expect("addr").port();
    let ctx = RequestContext {
        scheme: Scheme::HTTP,
        host: "127.0.0.1".into(),
        port,
        client_version: Version::HTTP_11,
        door: Door::DirectHttp,
        peer: "127.0.0.1:1".parse().expect("addr"),
    };
    let req: Request<Body> = Request::builder()
        .method("POST")
        .uri(path)
        .header(header::CONTENT_TYPE, "application/proto")
        .header("connect-protocol-version", "1")
        .body(full(Bytes::new()))
        .expect("request");
    let rpc = classify(path).expect("classified");
    let resp = services.handle(rpc, &ctx, req, &upstream).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.into_body().collect().await.expect("body").to_bytes()
}

#[tokio::test]
async fn picker_entries_fill_what_cursors_picker_reads_on_every_plan() {
    use ai::available_models_response::ModelVendorId;
    let body = ask("/aiserver.v1.AiService/AvailableModels").await;
    let answer = ai::AvailableModelsResponse::decode(body).expect("decodes");
    let names: Vec<_> = answer.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["byok-sonnet", "byok-local"]);
    for m in &answer.models {
        assert_eq!(
            m.visible_in_routed_model_view,
            Some(true),
            "{}: listed in the routed view",
            m.name
        );
        assert_eq!(m.supports_agent, Some(true));
        assert_eq!(m.supports_plan_mode, Some(true));
        assert_eq!(m.supports_sandboxing, Some(true));
        assert_eq!(m.supports_smart_mode_classifier, Some(false));
        assert_eq!(m.supports_non_max_mode, Some(true));
        assert_eq!(m.supports_max_mode, Some(false));
        assert_eq!(m.is_hidden, Some(false));
        assert_eq!(m.is_chat_only, Some(false));
        assert_eq!(m.is_long_context_only, Some(false));
        assert_eq!(m.only_supports_cmd_k, Some(false));
        assert_eq!(m.requires_data_retention, Some(false));
        assert_eq!(m.default_disabled_in_admin_allowlist, Some(false));
        assert_eq!(m.is_user_added, None, "routing unchanged: left unset");
        assert_eq!(m.server_model_name.as_deref(), Some(m.name.as_str()));
        assert!(m.default_on);
        assert!(!m.variants.is_empty());
    }
    let sonnet = &answer.models[0];
    let vendor = sonnet.vendor.as_ref().expect("vendor");
    assert_eq!(vendor.id, ModelVendorId::Anthropic as i32);
    assert_eq!(vendor.display_name, "Anthropic");
    assert_eq!(sonnet.vendor_name.as_deref(), Some("Anthropic"));
    assert_eq!(sonnet.client_display_name.as_deref(), Some("My Sonnet"));
    assert_eq!(sonnet.supports_thinking, Some(true));
    let local = &answer.models[1];
    assert_eq!(
        local.vendor.as_ref().map(|v| v.id),
        Some(ModelVendorId::Unspecified as i32)
    );
    assert_eq!(local.vendor_name.as_deref(), Some("cursor-byok"));
    assert_eq!(local.supports_thinking, Some(false));
}

#[tokio::test]
async fn usable_models_carry_display_names_and_no_credentials() {
    let body = ask("/agent.v1.AgentService/GetUsableModels").await;
    let answer = ag::GetUsableModelsResponse::decode(body).expect("decodes");
    let ids: Vec<_> = answer.models.iter().map(|m| m.model_id.as_str()).collect();
    assert_eq!(ids, ["byok-sonnet", "byok-local"]);
    let sonnet = &answer.models[0];
    assert_eq!(sonnet.display_model_id, "byok-sonnet");
    assert_eq!(sonnet.display_name, "My Sonnet");
    assert_eq!(sonnet.display_name_short, "My Sonnet");
    assert!(sonnet.thinking_details.is_some());
    assert!(answer.models[1].thinking_details.is_none());
    for m in &answer.models {
        assert_eq!(m.max_mode, Some(false));
        assert!(m.aliases.is_empty());
        assert!(m.credentials.is_none(), "the key never leaves the proxy");
    }
}
