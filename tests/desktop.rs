//! What the desktop app (3.23–3.24) needs beyond what the SDK exercises: the picker fields of
//! our model entries, loop detection through the proxy, Remote-SSH settings, transcripts.
//! These are checked against crafted client messages: the SDK sends none of them.

mod common;
#[path = "common/harness.rs"]
mod shared;

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

use common::agent_client::{frame, run_request, text_of, H2Run, Received};
use common::fake_cursor::FakeCursor;
use common::fake_provider::{self, Reply};
use shared::{Harness, OURS};

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

// ---- a model stuck in a loop ----

/// One turn over HTTP/2 `Run`, `client` answering every exec, to the end frame.
async fn turn(
    h: &Harness,
    request_id: &str,
    first: &ag::AgentClientMessage,
    client: &mut FakeCursor,
) -> (Vec<ag::AgentServerMessage>, cursor_byok::connect::EndStream) {
    let H2Run { tx, mut stream } = H2Run::open(&h.connect_door(), request_id, first).await;
    let mut messages = Vec::new();
    loop {
        match stream.next().await {
            None => panic!("the stream ended without an end frame"),
            Some(Received::End(end)) => return (messages, end),
            Some(Received::Message(m)) => {
                for answer in client.respond(&m) {
                    // The run may have ended (the request body gone): nothing to answer.
                    let _ = tx.send(frame(&answer)).await;
                }
                messages.push(*m);
            }
        }
    }
}

/// A provider that asks for the same read of the same file for ever.
async fn stuck_harness(tweak: impl FnOnce(&mut Config)) -> Harness {
    let h = shared::harness_keyed(Vec::new(), "sk-test-desktop", tweak).await;
    h.provider.respond_with(|_| {
        Some(Reply::sse(fake_provider::tool_sse(&[(
            "call_same",
            "read_file",
            r#"{"path":"a.txt"}"#,
        )])))
    });
    h
}

/// The `tool` messages of the provider's `n`-th request.
fn tool_results(h: &Harness, n: usize) -> Vec<String> {
    fake_provider::tool_results(&h.provider, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_one_call_is_warned_at_the_third_and_stopped_at_the_fifth() {
    let ws = tempfile::tempdir().expect("tempdir");
    std::fs::write(ws.path().join("a.txt"), "alpha\n").expect("write");
    let h = stuck_harness(|_| {}).await;
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-loop", "read a.txt", false);
    let (messages, end) = turn(&h, "req-loop", &first, &mut client).await;
    assert!(
        end.error.is_none(),
        "a loop ends the turn, not the run: {:?}",
        end.error
    );

    // Five rounds: the model was asked five times and no more (not the 50 of max_tool_rounds).
    assert_eq!(h.provider.requests().len(), 5);
    // Request i carries the results of the i calls before it.
    let second = tool_results(&h, 2);
    assert!(
        second.iter().all(|r| !r.contains("cursor-byok:")),
        "{second:?}"
    );
    let third = tool_results(&h, 3);
    let warned = third.last().expect("three results");
    assert!(warned.contains("alpha"), "the real result stays: {warned}");
    assert!(
        warned.contains("3 times in a row") && warned.contains("Change approach"),
        "{warned}"
    );
    let text = text_of(&messages);
    assert!(
        text.contains("Stopped: the model made the same call with the same arguments 5 times"),
        "{text}"
    );
    assert!(text.contains("Send a message to continue"), "{text}");
    assert!(
        messages.iter().any(|m| matches!(
            &m.message,
            Some(ag::agent_server_message::Message::InteractionUpdate(u))
                if matches!(u.message, Some(ag::interaction_update::Message::TurnEnded(_)))
        )),
        "the turn ends as a turn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_loop_detection_off_the_round_limit_is_what_stops_it() {
    let ws = tempfile::tempdir().expect("tempdir");
    std::fs::write(ws.path().join("a.txt"), "alpha\n").expect("write");
    let h = stuck_harness(|c| {
        c.agent.detect_loops = false;
        c.agent.max_tool_rounds = 7;
    })
    .await;
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-loop-off", "read a.txt", false);
    let (messages, end) = turn(&h, "req-loop-off", &first, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(h.provider.requests().len(), 7);
    assert!(tool_results(&h, 6)
        .iter()
        .all(|r| !r.contains("cursor-byok:")));
    assert!(text_of(&messages).contains("Stopped after 7 tool rounds"));
}
