//! How a failed run ends, row by row of docs/errors.md: the end frame's Connect code and
//! `aiserver.v1.ErrorDetails` (kind, title, detail, `is_retryable`), decoded from what the run
//! sends, against a fake provider on 127.0.0.1:0. Whether Cursor's client retries follows from
//! these; `tests/conformance.rs` checks that with the SDK itself.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_cursor::FakeCursor;
use common::fake_provider::{After, FakeProvider, Reply};
use cursor_byok::agent::{Agent, RunHandle, RunOutput};
use cursor_byok::config::Config;
use cursor_byok::connect::{Code, ConnectError, EndStream};
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proto::aiserver::v1::error_details::Error as Kind;
use cursor_byok::proto::aiserver::v1::CustomErrorDetails;
use pb::agent_server_message::Message as Server;
use pb::interaction_update::Message as Update;

const KEY: &str = "sk-test-run-errors-0123456789";

fn config(base_url: &str) -> Arc<Config> {
    let dir = tempfile::tempdir().unwrap().keep();
    let text = format!(
        "data_dir = \"{}\"\n[agent]\nheartbeat_secs = 5\nkv_timeout_secs = 5\nprovider_max_retries = 0\n\
         [providers.fake]\nkind = \"openai-chat\"\nbase_url = \"{base_url}\"\napi_key = \"{KEY}\"\n\
         [[models]]\nid = \"fake-model\"\ndisplay_name = \"Fake Model\"\nprovider = \"fake\"\nmodel = \"gpt-fake\"\n",
        dir.display()
    );
    Arc::new(Config::from_toml(&text, "test").unwrap())
}

fn run_request(text: &str) -> pb::AgentRunRequest {
    let request_context = pb::RequestContext {
        env: Some(pb::RequestContextEnv {
            os_version: "linux-test".into(),
            shell: "bash".into(),
            workspace_paths: vec!["/tmp/ws".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    pb::AgentRunRequest {
        conversation_id: Some("conv-errors".into()),
        requested_model: Some(pb::RequestedModel {
            model_id: "byok-fake-model".into(),
            ..Default::default()
        }),
        action: Some(common::fake_cursor::user_message_action(
            text,
            Some(request_context),
        )),
        ..Default::default()
    }
}

/// Reads the run to its end, answering like Cursor's client.
async fn drive(handle: &mut RunHandle) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut messages = Vec::new();
    loop {
        let out = tokio::time::timeout(Duration::from_secs(20), handle.output.recv())
            .await
            .expect("the run must not hang")
            .expect("the run must end with an End");
        match out {
            RunOutput::End(end) => return (messages, end),
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => {
                for answer in client.respond(&m) {
                    let _ = handle.input.send(Box::new(answer)).await;
                }
                messages.push(*m);
            }
        }
    }
}

fn text_of(messages: &[pb::AgentServerMessage]) -> String {
    messages
        .iter()
        .filter_map(|m| match &m.message {
            Some(Server::InteractionUpdate(u)) => match &u.message {
                Some(Update::TextDelta(t)) => Some(t.text.as_str()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// What one failed run ended with.
struct Ended {
    error: ConnectError,
    kind: Kind,
    custom: CustomErrorDetails,
    text: String,
    provider_calls: usize,
}

impl Ended {
    fn assert(&self, code: Code, kind: Kind, title: &str, retry: bool) {
        assert_eq!(self.error.code, code, "{:?}", self.error);
        assert_eq!(self.kind, kind, "{:?}", self.custom);
        assert_eq!(self.custom.title, title);
        assert_eq!(self.custom.is_retryable, Some(retry), "{:?}", self.custom);
        assert!(!self.custom.detail.contains(KEY), "{}", self.custom.detail);
        assert!(!self.error.message.contains(KEY), "{}", self.error.message);
    }
}

async fn end_with(replies: Vec<Reply>) -> Ended {
    let provider = FakeProvider::start(replies).await;
    let agent = Agent::new(config(&provider.base_url())).unwrap();
    let mut run = agent.start_run(run_request("hi"), "req-errors".into());
    let (messages, end) = drive(&mut run).await;
    ended(end, &messages, provider.requests().len())
}

fn ended(end: EndStream, messages: &[pb::AgentServerMessage], provider_calls: usize) -> Ended {
    let error = end.error.expect("an error end frame");
    let details = error
        .decode_error_details()
        .expect("decodes")
        .expect("ErrorDetails attached");
    Ended {
        kind: details.error(),
        custom: details.details.clone().expect("custom details"),
        error,
        text: text_of(messages),
        provider_calls,
    }
}

fn openai_error(message: &str, code: &str) -> String {
    format!(
        r#"{{"error":{{"message":"{message}","type":"invalid_request_error","code":"{code}"}}}}"#
    )
}

/// A few words of text, then whatever `after` does to the stream.
fn partial(text: &str) -> String {
    format!(
        "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"{text}\"}}}}]}}\n\n"
    )
}

#[tokio::test]
async fn a_refused_key_shows_as_a_bad_key_and_is_not_retried() {
    let body = openai_error(
        &format!("Incorrect API key provided: {KEY}"),
        "invalid_api_key",
    );
    let e = end_with(vec![Reply::json(401, body)]).await;
    e.assert(
        Code::Unauthenticated,
        Kind::BadUserApiKey,
        "Invalid API key",
        false,
    );
    assert!(
        e.custom.detail.contains("Fake Model"),
        "{}",
        e.custom.detail
    );
    assert!(
        e.custom.detail.contains("Incorrect API key provided"),
        "the provider's words: {}",
        e.custom.detail
    );
    assert_eq!(
        e.custom.additional_info.get("status").map(String::as_str),
        Some("401")
    );
    assert_eq!(e.provider_calls, 1);
}

#[tokio::test]
async fn a_rate_limit_with_a_long_retry_after_is_final() {
    let body = openai_error("Rate limit reached for requests", "rate_limit_exceeded");
    let e = end_with(vec![Reply::json(429, body).header("retry-after", "120")]).await;
    e.assert(
        Code::ResourceExhausted,
        Kind::ApiKeyRateLimit,
        "Rate limited",
        false,
    );
    assert!(
        e.custom.detail.contains("retry after 120"),
        "{}",
        e.custom.detail
    );
}

#[tokio::test]
async fn a_rate_limit_without_retry_after_may_be_retried_by_the_client() {
    let body = openai_error("Rate limit reached for requests", "rate_limit_exceeded");
    let e = end_with(vec![Reply::json(429, body)]).await;
    e.assert(
        Code::ResourceExhausted,
        Kind::ApiKeyRateLimit,
        "Rate limited",
        true,
    );
    assert!(e.custom.detail.contains("Rate limit reached"));
}

#[tokio::test]
async fn an_exhausted_quota_is_final() {
    let body = openai_error("You exceeded your current quota", "insufficient_quota");
    let e = end_with(vec![Reply::json(429, body)]).await;
    e.assert(
        Code::ResourceExhausted,
        Kind::ResourceExhausted,
        "Out of credit",
        false,
    );
    assert!(e.custom.detail.contains("exceeded your current quota"));
}

#[tokio::test]
async fn a_context_too_long_says_so() {
    let body = openai_error(
        "This model's maximum context length is 128000 tokens.",
        "context_length_exceeded",
    );
    let e = end_with(vec![Reply::json(400, body)]).await;
    e.assert(
        Code::InvalidArgument,
        Kind::ConversationTooLong,
        "Conversation too long",
        false,
    );
    assert!(e.custom.detail.contains("maximum context length"));
}

#[tokio::test]
async fn an_unknown_model_is_a_bad_model_name() {
    let body = openai_error("The model `gpt-fake` does not exist", "model_not_found");
    let e = end_with(vec![Reply::json(404, body)]).await;
    e.assert(
        Code::NotFound,
        Kind::BadModelName,
        "Model not available",
        false,
    );
    assert!(e.custom.detail.contains("does not exist"));
}

#[tokio::test]
async fn a_bad_request_is_final() {
    let body = openai_error("Invalid value for 'tools'", "invalid_value");
    let e = end_with(vec![Reply::json(400, body)]).await;
    e.assert(
        Code::InvalidArgument,
        Kind::BadRequest,
        "Request refused by the provider",
        false,
    );
    assert!(e.custom.detail.contains("Invalid value for 'tools'"));
}

#[tokio::test]
async fn a_provider_down_before_output_may_be_retried() {
    let body = r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#;
    let e = end_with(vec![Reply::json(503, body)]).await;
    e.assert(
        Code::Unavailable,
        Kind::ProviderError,
        "Model provider error",
        true,
    );
    assert!(e.text.is_empty());
    assert!(e.custom.detail.contains("503") && e.custom.detail.contains("overloaded"));
}

#[tokio::test]
async fn a_provider_cut_after_output_is_final() {
    let e = end_with(vec![Reply::sse(partial("Half an answer")).then(After::Cut)]).await;
    assert_eq!(e.text, "Half an answer");
    e.assert(
        Code::Unknown,
        Kind::CustomMessage,
        "Model provider error",
        false,
    );
    assert!(
        e.custom.detail.contains("send the message again"),
        "{}",
        e.custom.detail
    );
}

#[tokio::test]
async fn a_provider_error_event_after_output_is_final() {
    let body = format!(
        "{}data: {{\"error\":{{\"message\":\"The server had an error processing your request\",\"type\":\"server_error\"}}}}\n\n",
        partial("Half")
    );
    let e = end_with(vec![Reply::sse(body)]).await;
    assert_eq!(e.text, "Half");
    e.assert(
        Code::Unknown,
        Kind::CustomMessage,
        "Model provider error",
        false,
    );
    assert!(e.custom.detail.contains("The server had an error"));
}

#[tokio::test]
async fn a_provider_timeout_before_output_may_be_retried() {
    let e = end_with(vec![Reply::json(408, "request timeout")]).await;
    e.assert(
        Code::DeadlineExceeded,
        Kind::Timeout,
        "Model provider timed out",
        true,
    );
}

#[tokio::test]
async fn our_own_failure_is_final() {
    // A model the proxy does not know is a failure on our side (the routing sent it here).
    let provider = FakeProvider::start(vec![]).await;
    let agent = Agent::new(config(&provider.base_url())).unwrap();
    let mut req = run_request("hi");
    req.requested_model = Some(pb::RequestedModel {
        model_id: "byok-not-configured".into(),
        ..Default::default()
    });
    let mut run = agent.start_run(req, "req-ours".into());
    let (messages, end) = drive(&mut run).await;
    let e = ended(end, &messages, provider.requests().len());
    e.assert(
        Code::Unknown,
        Kind::CustomMessage,
        "cursor-byok error",
        false,
    );
    assert!(e.custom.detail.contains("not configured"));
    assert_eq!(e.provider_calls, 0);
}

#[tokio::test]
async fn a_user_cancel_is_a_cancel() {
    let provider = FakeProvider::start(vec![
        Reply::sse(partial("Working")).then(After::Trickle(Duration::from_millis(50)))
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url())).unwrap();
    let mut run = agent.start_run(run_request("hi"), "req-cancel".into());
    let mut messages = Vec::new();
    loop {
        match run.output.recv().await.expect("output") {
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => {
                let done = !text_of(std::slice::from_ref(&m)).is_empty();
                messages.push(*m);
                if done {
                    break;
                }
            }
            RunOutput::End(e) => panic!("ended early: {:?}", e.error),
        }
    }
    let cancel = pb::AgentClientMessage {
        message: Some(pb::agent_client_message::Message::ConversationAction(
            pb::ConversationAction {
                action: Some(pb::conversation_action::Action::CancelAction(
                    pb::CancelAction::default(),
                )),
                ..Default::default()
            },
        )),
    };
    run.input.send(Box::new(cancel)).await.unwrap();
    let (rest, end) = drive(&mut run).await;
    messages.extend(rest);
    let e = ended(end, &messages, provider.requests().len());
    e.assert(Code::Canceled, Kind::UserAbortedRequest, "Canceled", false);
}

#[tokio::test]
async fn a_client_that_left_ends_as_a_cancel() {
    let provider = FakeProvider::start(vec![
        Reply::sse(partial("Working")).then(After::Trickle(Duration::from_millis(50)))
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url())).unwrap();
    let mut run = agent.start_run(run_request("hi"), "req-left".into());
    let mut messages = Vec::new();
    loop {
        match run.output.recv().await.expect("output") {
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => {
                let done = !text_of(std::slice::from_ref(&m)).is_empty();
                messages.push(*m);
                if done {
                    break;
                }
            }
            RunOutput::End(e) => panic!("ended early: {:?}", e.error),
        }
    }
    run.failer().client_left("the reader closed the stream");
    let (rest, end) = drive(&mut run).await;
    messages.extend(rest);
    let e = ended(end, &messages, provider.requests().len());
    e.assert(
        Code::Canceled,
        Kind::UserAbortedRequest,
        "Cursor's client left",
        false,
    );
    assert!(e.custom.detail.contains("reader closed"));
}
