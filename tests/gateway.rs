//! A team's LLM gateway in front of the providers (LiteLLM's proxy: virtual keys, budgets,
//! per-user spend): the fake provider answers with LiteLLM's own error bodies, for each
//! provider kind a gateway serves. The conversation id reaches the gateway in a templated
//! header, a spent budget shows Cursor's quota banner and a bad virtual key its invalid-key
//! banner, on agent runs and on Cmd+K alike.

mod common;
#[path = "common/harness.rs"]
mod harness;

use common::agent_client::{play, run_request, H2Run, Sink, Store};
use common::fake_provider::Reply;
use cursor_byok::base::secret::Secret;
use cursor_byok::config::{Config, ProviderKind};
use cursor_byok::connect::{Code, ConnectError};
use cursor_byok::proto::aiserver::v1 as pb;
use harness::{end_error, harness, Harness, OURS};

/// LiteLLM's answer once a key's, user's or team's budget is spent (HTTP 400 in older
/// releases, 429 in newer ones; `code` is the status as a string, `type` says what it is).
const BUDGET: &str = r#"{"error":{"message":"Budget has been exceeded! Current cost: 10.51, Max budget: 10.0","type":"budget_exceeded","param":null,"code":"400"}}"#;
const BUDGET_429: &str = r#"{"error":{"message":"ExceededBudget: User=dev-1 over budget. Spend=10.51, Budget=10.0","type":"budget_exceeded","param":null,"code":"429"}}"#;
/// LiteLLM's answer to a virtual key it does not know (or one blocked or expired).
const BAD_KEY: &str = r#"{"error":{"message":"Authentication Error, Invalid proxy server token passed. Received API Key = sk-...wxyz","type":"auth_error","param":"None","code":"401"}}"#;

const KINDS: [ProviderKind; 3] = [
    ProviderKind::OpenAiChat,
    ProviderKind::OpenAiResponses,
    ProviderKind::Anthropic,
];

fn gateway(kind: ProviderKind) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        // The client's own retries on: a spent budget must still be tried once only.
        c.agent.provider_max_retries = 2;
        let p = c.providers.get_mut("fake").unwrap();
        p.kind = kind;
        p.headers.insert(
            "x-litellm-tags".into(),
            Secret::new("cursor,conversation:{conversation_id}"),
        );
        p.headers
            .insert("x-litellm-end-user-id".into(), Secret::new("dev-1"));
    }
}

/// One agent run on our model in conversation `conv`: its error end.
async fn failed_run(h: &Harness, conv: &str) -> ConnectError {
    let store = Store::default();
    let first = run_request(OURS, conv, "hi", true);
    let mut run = H2Run::open(&h.connect_door(), &format!("req-{conv}"), &first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    end_error(&t)
}

fn kind_of(e: &ConnectError) -> i32 {
    e.decode_error_details()
        .unwrap()
        .expect("ErrorDetails")
        .error
}

#[tokio::test]
async fn litellm_budget_and_key_errors_show_cursors_banners_for_each_kind() {
    for kind in KINDS {
        let replies = vec![
            Reply::json(400, BUDGET),
            Reply::json(429, BUDGET_429),
            Reply::json(401, BAD_KEY),
        ];
        let h = harness(replies, gateway(kind)).await;
        for (conv, want_code, want_kind) in [
            (
                "conv-budget",
                Code::ResourceExhausted,
                pb::error_details::Error::ResourceExhausted,
            ),
            (
                "conv-budget-429",
                Code::ResourceExhausted,
                pb::error_details::Error::ResourceExhausted,
            ),
            (
                "conv-key",
                Code::Unauthenticated,
                pb::error_details::Error::BadUserApiKey,
            ),
        ] {
            let e = failed_run(&h, conv).await;
            assert_eq!(e.code, want_code, "{kind:?} {conv}: {}", e.message);
            assert_eq!(kind_of(&e), want_kind as i32, "{kind:?} {conv}");
        }
        // One request each: a spent budget is not retried, even on a 429.
        let seen = h.provider.requests();
        assert_eq!(seen.len(), 3, "{kind:?}");
        for (r, conv) in seen
            .iter()
            .zip(["conv-budget", "conv-budget-429", "conv-key"])
        {
            assert_eq!(
                r.header("x-litellm-tags"),
                Some(format!("cursor,conversation:{conv}").as_str()),
                "{kind:?}: the conversation id filled in"
            );
            assert_eq!(r.header("x-litellm-end-user-id"), Some("dev-1"));
        }
    }
}
