//! The run state machine without HTTP on Cursor's side: a test plays the client over the
//! run's channels, against a fake provider on 127.0.0.1:0.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_provider::{After, FakeProvider, Reply};
use cursor_byok::agent::{Agent, RunHandle, RunOutput};
use cursor_byok::config::Config;
use cursor_byok::connect::{Code, EndStream};
use cursor_byok::proto::agent::v1 as pb;
use pb::agent_server_message::Message as Server;
use pb::interaction_update::Message as Update;

const TEXT_SSE: &str = concat!(
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"Let me think.\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", world\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":100}}}\n\n",
    "data: [DONE]\n\n",
);

fn config(base_url: &str, heartbeat_secs: u64) -> Arc<Config> {
    let text = format!(
        "[agent]\nheartbeat_secs = {heartbeat_secs}\nkv_timeout_secs = 5\nprovider_max_retries = 0\n\
         [providers.fake]\nkind = \"openai-chat\"\nbase_url = \"{base_url}\"\napi_key = \"sk-test-agent-run\"\n\
         [[models]]\nid = \"fake-model\"\ndisplay_name = \"Fake Model\"\nprovider = \"fake\"\nmodel = \"gpt-fake\"\n"
    );
    Arc::new(Config::from_toml(&text, "test").unwrap())
}

fn run_request(text: &str, with_context: bool) -> pb::AgentRunRequest {
    let request_context = with_context.then(|| pb::RequestContext {
        env: Some(pb::RequestContextEnv {
            os_version: "linux-test".into(),
            shell: "bash".into(),
            workspace_paths: vec!["/tmp/ws".into()],
            ..Default::default()
        }),
        ..Default::default()
    });
    pb::AgentRunRequest {
        conversation_id: Some("conv-1".into()),
        requested_model: Some(pb::RequestedModel {
            model_id: "byok-fake-model".into(),
            ..Default::default()
        }),
        action: Some(pb::ConversationAction {
            action: Some(pb::conversation_action::Action::UserMessageAction(
                pb::UserMessageAction {
                    user_message: Some(pb::UserMessage {
                        text: text.into(),
                        message_id: "m1".into(),
                        ..Default::default()
                    }),
                    request_context,
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Reads the run to its end, answering request-context execs like the SDK does.
async fn drive(handle: &mut RunHandle) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let mut messages = Vec::new();
    loop {
        let out = tokio::time::timeout(Duration::from_secs(20), handle.output.recv())
            .await
            .expect("the run must not hang")
            .expect("the run must end with an End");
        match out {
            RunOutput::End(end) => return (messages, end),
            RunOutput::Message(m) => {
                if let Some(Server::ExecServerMessage(e)) = &m.message {
                    if let Some(pb::exec_server_message::Message::RequestContextArgs(_)) = e.message
                    {
                        answer_request_context(handle, e.id, &e.exec_id).await;
                    }
                }
                messages.push(*m);
            }
        }
    }
}

async fn answer_request_context(handle: &RunHandle, id: u32, exec_id: &str) {
    use pb::agent_client_message::Message as In;
    let ctx = pb::RequestContext {
        env: Some(pb::RequestContextEnv {
            os_version: "darwin-from-exec".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let result = pb::ExecClientMessage {
        id,
        exec_id: exec_id.into(),
        message: Some(pb::exec_client_message::Message::RequestContextResult(
            pb::RequestContextResult {
                result: Some(pb::request_context_result::Result::Success(
                    pb::RequestContextSuccess {
                        request_context: Some(ctx),
                        served_from_disk_cache: None,
                    },
                )),
            },
        )),
        ..Default::default()
    };
    handle
        .input
        .send(pb::AgentClientMessage {
            message: Some(In::ExecClientMessage(result)),
        })
        .await
        .unwrap();
    let close = pb::ExecClientControlMessage {
        message: Some(pb::exec_client_control_message::Message::StreamClose(
            pb::ExecClientStreamClose { id },
        )),
    };
    handle
        .input
        .send(pb::AgentClientMessage {
            message: Some(In::ExecClientControlMessage(close)),
        })
        .await
        .unwrap();
}

fn updates(messages: &[pb::AgentServerMessage]) -> Vec<&Update> {
    messages
        .iter()
        .filter_map(|m| match &m.message {
            Some(Server::InteractionUpdate(u)) => u.message.as_ref(),
            _ => None,
        })
        .collect()
}

fn text_of(messages: &[pb::AgentServerMessage]) -> String {
    updates(messages)
        .into_iter()
        .filter_map(|u| match u {
            Update::TextDelta(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_text_turn_streams_and_ends_with_usage() {
    let provider = FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut run = agent.start_run(run_request("Say hello", true), "req-1".into());
    let (messages, end) = drive(&mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(text_of(&messages), "Hello, world");

    let ups = updates(&messages);
    let kinds: Vec<&str> = ups
        .iter()
        .map(|u| match u {
            Update::StepStarted(_) => "step_started",
            Update::ThinkingDelta(_) => "thinking",
            Update::ThinkingCompleted(_) => "thinking_completed",
            Update::TextDelta(_) => "text",
            Update::TokenDelta(_) => "token",
            Update::StepCompleted(_) => "step_completed",
            Update::TurnEnded(_) => "turn_ended",
            Update::Heartbeat(_) => "heartbeat",
            _ => "other",
        })
        .filter(|k| *k != "heartbeat")
        .collect();
    assert_eq!(
        kinds,
        [
            "step_started",
            "thinking",
            "thinking_completed",
            "text",
            "token",
            "text",
            "token",
            "step_completed",
            "turn_ended"
        ]
    );
    let Some(Update::TurnEnded(t)) = ups.last() else {
        panic!("turn_ended last")
    };
    assert_eq!(t.input_tokens, Some(120));
    assert_eq!(t.output_tokens, Some(7));
    assert_eq!(t.cache_read_tokens, Some(100));

    // The provider saw our system prompt with the client's environment and the user text.
    let body = provider.requests()[0].json();
    assert_eq!(body["model"], "gpt-fake");
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("linux-test") && system.contains("/tmp/ws"),
        "{system}"
    );
    assert_eq!(body["messages"][1]["content"], "Say hello");
}

#[tokio::test]
async fn without_request_context_the_client_is_asked() {
    let provider = FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut run = agent.start_run(run_request("hi", false), "req-2".into());
    let (messages, end) = drive(&mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let asked = messages.iter().any(|m| {
        matches!(&m.message, Some(Server::ExecServerMessage(e))
            if matches!(e.message, Some(pb::exec_server_message::Message::RequestContextArgs(_))) && e.id >= 1 && !e.exec_id.is_empty())
    });
    assert!(asked);
    let system = provider.requests()[0].json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(system.contains("darwin-from-exec"), "{system}");
}

#[tokio::test]
async fn a_rejected_key_ends_unauthenticated_naming_the_provider() {
    let body = r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    let provider = FakeProvider::start(vec![Reply::json(401, body)]).await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut run = agent.start_run(run_request("hi", true), "req-3".into());
    let (messages, end) = drive(&mut run).await;
    let err = end.error.expect("an error end frame");
    assert_eq!(err.code, Code::Unauthenticated);
    assert!(err.message.contains("Fake Model"), "{}", err.message);
    assert!(err.message.contains("401"), "{}", err.message);
    assert!(
        err.message.contains("rejected the API key"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("sk-test-agent-run"));
    let details = err
        .decode_error_details()
        .unwrap()
        .expect("ErrorDetails attached");
    assert_eq!(details.details.unwrap().title, "Model provider error");
    assert!(!updates(&messages)
        .iter()
        .any(|u| matches!(u, Update::TurnEnded(_))));
}

#[tokio::test]
async fn cancel_mid_stream_stops_the_provider_and_ends_canceled() {
    let first =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial\"}}]}\n\n";
    let provider = FakeProvider::start(vec![
        Reply::sse(first).then(After::Trickle(Duration::from_millis(50)))
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut run = agent.start_run(run_request("hi", true), "req-4".into());
    // Wait for the first text, then cancel like Cursor's stop button does.
    loop {
        match run.output.recv().await.unwrap() {
            RunOutput::Message(m) if !text_of(std::slice::from_ref(&m)).is_empty() => break,
            RunOutput::Message(_) => continue,
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
    run.input.send(cancel).await.unwrap();
    let (_, end) = drive(&mut run).await;
    assert_eq!(end.error.expect("canceled").code, Code::Canceled);
    assert!(
        provider.wait_hangups(1, Duration::from_secs(5)).await,
        "provider request not closed"
    );
}

#[tokio::test]
async fn a_slow_provider_gets_heartbeats_and_client_heartbeats_are_answered() {
    // An SSE comment as long as the stream, then a pause, then the stream: two equal pieces.
    let pad = format!(": {}\n\n", "x".repeat(TEXT_SSE.len()));
    let body = format!("{pad}{TEXT_SSE}");
    let reply = Reply::sse(body)
        .chunked(pad.len())
        .delay(Duration::from_millis(2500));
    let provider = FakeProvider::start(vec![reply]).await;
    let agent = Agent::new(config(&provider.base_url(), 1)).unwrap();
    let mut run = agent.start_run(run_request("hi", true), "req-5".into());
    let beat = pb::AgentClientMessage {
        message: Some(pb::agent_client_message::Message::ClientHeartbeat(
            pb::ClientHeartbeat {},
        )),
    };
    run.input.send(beat).await.unwrap();
    let (messages, end) = drive(&mut run).await;
    assert!(end.error.is_none());
    let first_text = messages
        .iter()
        .position(|m| !text_of(std::slice::from_ref(m)).is_empty())
        .unwrap();
    let beats = updates(&messages[..first_text])
        .iter()
        .filter(|u| matches!(u, Update::Heartbeat(_)))
        .count();
    // One answering the client's heartbeat, and at least one from silence during the 2.5 s wait.
    assert!(beats >= 2, "{beats} heartbeats before the first text");
}

#[tokio::test]
async fn an_unconfigured_model_ends_with_a_clear_error() {
    let provider = FakeProvider::start(vec![]).await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut req = run_request("hi", true);
    req.requested_model.as_mut().unwrap().model_id = "byok-nope".into();
    let mut run = agent.start_run(req, "req-6".into());
    let (_, end) = drive(&mut run).await;
    assert!(end.error.unwrap().message.contains("byok-nope"));
}
