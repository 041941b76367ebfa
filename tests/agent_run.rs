//! The run state machine without HTTP on Cursor's side: a test plays the client over the
//! run's channels, against a fake provider on 127.0.0.1:0.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::agent_client::shell_completion;
use common::fake_cursor::FakeCursor;
use common::fake_provider::{text_sse, tool_results, tool_sse, After, FakeProvider, Reply};
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
    config_with(base_url, heartbeat_secs, "")
}

/// [`config`] with `model_extra` appended to the model's table (a price, a fallback chain…).
fn config_with(base_url: &str, heartbeat_secs: u64, model_extra: &str) -> Arc<Config> {
    let dir = tempfile::tempdir().unwrap().keep();
    let text = format!(
        "data_dir = \"{}\"\n[agent]\nheartbeat_secs = {heartbeat_secs}\nkv_timeout_secs = 5\nprovider_max_retries = 0\n\
         [providers.fake]\nkind = \"openai-chat\"\nbase_url = \"{base_url}\"\napi_key = \"sk-test-agent-run\"\n\
         [[models]]\nid = \"fake-model\"\ndisplay_name = \"Fake Model\"\nprovider = \"fake\"\nmodel = \"gpt-fake\"\n{model_extra}",
        dir.display()
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
        action: Some(common::fake_cursor::user_message_action(
            text,
            request_context,
        )),
        ..Default::default()
    }
}

/// Reads the run to its end, answering like Cursor's client (in a throwaway workspace).
async fn drive(handle: &mut RunHandle) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    drive_with(handle, &mut client).await
}

async fn drive_with(
    handle: &mut RunHandle,
    client: &mut FakeCursor,
) -> (Vec<pb::AgentServerMessage>, EndStream) {
    drive_mapped(handle, client, |_| {}).await
}

/// [`drive_with`], each of the client's answers passed through `change` before it is sent.
async fn drive_mapped(
    handle: &mut RunHandle,
    client: &mut FakeCursor,
    change: impl Fn(&mut pb::AgentClientMessage),
) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let mut messages = Vec::new();
    loop {
        let out = tokio::time::timeout(Duration::from_secs(20), handle.output.recv())
            .await
            .expect("the run must not hang")
            .expect("the run must end with an End");
        match out {
            RunOutput::End(end) => return (messages, end),
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => {
                for mut answer in client.respond(&m) {
                    change(&mut answer);
                    // The run may be over already; then nobody listens.
                    let _ = handle.input.send(Box::new(answer)).await;
                }
                messages.push(*m);
            }
        }
    }
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
async fn a_finished_run_records_its_cost_beside_its_tokens() {
    let provider = FakeProvider::start(vec![Reply::sse(TEXT_SSE), Reply::sse(TEXT_SSE)]).await;
    let priced = "[models.price]\ninput = 2.0\noutput = 8.0\ncache_read = 0.5\n";
    let status = cursor_byok::status::Status::new();
    let agent =
        Agent::with_status(config_with(&provider.base_url(), 5, priced), status.clone()).unwrap();
    let mut run = agent.start_run(run_request("Say hello", true), "req-cost".into());
    let (_, end) = drive(&mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let snap = status.snapshot();
    let r = &snap.recent[0];
    assert_eq!(
        (r.input_tokens, r.cache_read_tokens, r.output_tokens),
        (120, 100, 7)
    );
    // 20 fresh × $2 + 100 cached × $0.50 + 7 out × $8, per million.
    let want = (20.0 * 2.0 + 100.0 * 0.5 + 7.0 * 8.0) / 1e6;
    assert!(
        (r.cost_usd.unwrap() - want).abs() < 1e-12,
        "{:?}",
        r.cost_usd
    );
    let m = &snap.models[0];
    assert_eq!(
        (m.model.as_str(), m.runs, m.priced_runs),
        ("byok-fake-model", 1, 1)
    );
    assert!((m.cache_read_share - 100.0 / 120.0).abs() < 1e-9);
    assert!((snap.totals.cost_usd - want).abs() < 1e-12);

    // A model without a known price counts tokens only.
    let agent = Agent::with_status(config(&provider.base_url(), 5), status.clone()).unwrap();
    let mut run = agent.start_run(run_request("Say hello", true), "req-free".into());
    let (_, end) = drive(&mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let snap = status.snapshot();
    assert_eq!(snap.recent[0].cost_usd, None);
    assert_eq!(snap.recent[0].input_tokens, 120);
    assert_eq!((snap.models[0].runs, snap.models[0].priced_runs), (2, 1));
    assert_eq!(snap.totals.input_tokens, 240);
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
    assert!(system.contains("linux-test"), "{system}");
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
    assert_eq!(details.details.unwrap().title, "Invalid API key");
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
            RunOutput::Message(_) | RunOutput::Encoded(..) => continue,
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
    run.input.send(Box::new(beat)).await.unwrap();
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

// ---- Issue 6: tools, blobs and checkpoints, multi-turn ----

/// A Chat Completions stream asking for `calls` (id, name, JSON arguments).
fn tool_events(messages: &[pb::AgentServerMessage]) -> Vec<(&'static str, String)> {
    updates(messages)
        .into_iter()
        .filter_map(|u| match u {
            Update::ToolCallStarted(t) => Some(("started", t.call_id.clone())),
            Update::ToolCallCompleted(t) => Some(("completed", t.call_id.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn read_edit_shell_then_answer_changes_the_workspace() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hello.txt"), "hello world\n").unwrap();
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[(
            "call_1",
            "read_file",
            r#"{"path":"hello.txt"}"#,
        )])),
        Reply::sse(tool_sse(&[(
            "call_2",
            "search_replace",
            r#"{"path":"hello.txt","old_string":"world","new_string":"byok"}"#,
        )])),
        Reply::sse(tool_sse(&[(
            "call_3",
            "run_terminal_cmd",
            r#"{"command":"cat hello.txt; echo done >&2"}"#,
        )])),
        Reply::sse(text_sse("All set.")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut run = agent.start_run(run_request("fix the greeting", false), "req-t1".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("hello.txt")).unwrap(),
        "hello byok\n"
    );
    assert!(text_of(&messages).ends_with("All set."));

    // Each call: started then completed, same call id.
    let events = tool_events(&messages);
    assert_eq!(events.len(), 6, "{events:?}");
    for pair in events.chunks(2) {
        assert_eq!((pair[0].0, pair[1].0), ("started", "completed"));
        assert_eq!(pair[0].1, pair[1].1);
    }
    // Shell output streamed to the UI as tool_call_delta.
    assert!(updates(&messages)
        .iter()
        .any(|u| matches!(u, Update::ToolCallDelta(_))));

    // The provider got the results back.
    assert!(tool_results(&provider, 1)[0].contains("hello world"));
    assert!(!tool_results(&provider, 2)[1]
        .to_lowercase()
        .starts_with("error"));
    let shell = &tool_results(&provider, 3)[2];
    assert!(
        shell.contains("hello byok") && shell.contains("done"),
        "{shell}"
    );

    // The turn was stored as blobs (ids = SHA-256) and a checkpoint referencing them.
    assert!(client.blob_ids_are_sha256());
    let checkpoint = client.checkpoint.clone().expect("a checkpoint");
    assert_eq!(checkpoint.turns.len(), 1);
    assert!(client.blobs.contains_key(checkpoint.turns[0].as_ref()));
    let details = checkpoint.token_details.unwrap();
    assert_eq!(details.max_tokens, 128_000);
    assert!(details.used_tokens > 0);
    // Checkpoint after every set_blob, then turn_ended, then the end.
    let last_kv = messages
        .iter()
        .rposition(|m| matches!(m.message, Some(Server::KvServerMessage(_))))
        .unwrap();
    let cp = messages
        .iter()
        .position(|m| matches!(m.message, Some(Server::ConversationCheckpointUpdate(_))))
        .unwrap();
    let te = messages.iter().position(|m| matches!(&m.message, Some(Server::InteractionUpdate(u)) if matches!(u.message, Some(Update::TurnEnded(_))))).unwrap();
    assert!(last_kv < cp && cp < te);
}

#[tokio::test]
async fn parallel_calls_failing_edit_unknown_tool_and_a_throw_all_reach_the_model() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    std::fs::write(ws.path().join("b.txt"), "beta\n").unwrap();
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[
            ("p1", "Read", r#"{"file_path":"a.txt"}"#),
            ("p2", "read_file", r#"{"path":"b.txt"}"#),
            (
                "p3",
                "search_replace",
                r#"{"path":"a.txt","old_string":"missing","new_string":"x"}"#,
            ),
            ("p4", "teleport", r#"{}"#),
        ])),
        Reply::sse(text_sse("ok")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut run = agent.start_run(run_request("look", false), "req-t2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let results = tool_results(&provider, 1);
    assert_eq!(results.len(), 4);
    assert!(results[0].contains("alpha") && results[1].contains("beta"));
    assert!(results[2].contains("not found"), "{}", results[2]);
    assert!(results[3].contains("Unknown tool"), "{}", results[3]);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "alpha\n"
    );

    // A client `throw` is a tool error too, not the end of the run.
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("t1", "read_file", r#"{"path":"a.txt"}"#)])),
        Reply::sse(text_sse("sorry")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    client.throw_execs = true;
    let mut run = agent.start_run(run_request("look", false), "req-t3".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(tool_results(&provider, 1)[0].contains("EACCES"));
}

#[tokio::test]
async fn cancel_during_a_shell_exec_aborts_it_then_ends_canceled() {
    let ws = tempfile::tempdir().unwrap();
    let provider = FakeProvider::start(vec![Reply::sse(tool_sse(&[(
        "s1",
        "run_terminal_cmd",
        r#"{"command":"sleep 100"}"#,
    )]))])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    client.shell_gate = Some(ws.path().join("never"));
    let mut run = agent.start_run(run_request("run it", false), "req-t4".into());
    // Answer until the shell exec goes out, then cancel.
    loop {
        let RunOutput::Message(m) = run.output.recv().await.unwrap() else {
            panic!("ended early")
        };
        let is_shell = matches!(&m.message, Some(Server::ExecServerMessage(e)) if matches!(e.message, Some(pb::exec_server_message::Message::ShellStreamArgs(_))));
        for a in client.respond(&m) {
            run.input.send(Box::new(a)).await.unwrap();
        }
        if is_shell {
            break;
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
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert_eq!(end.error.unwrap().code, Code::Canceled);
    let shell_id = client
        .execs
        .iter()
        .find(|e| {
            matches!(
                e.message,
                Some(pb::exec_server_message::Message::ShellStreamArgs(_))
            )
        })
        .unwrap()
        .id;
    assert_eq!(client.aborted, vec![shell_id], "{messages:?}");
}

#[tokio::test]
async fn a_second_turn_rebuilds_history_from_the_cache_and_after_a_restart_from_the_client() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("n.txt"), "forty-two\n").unwrap();
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("r1", "read_file", r#"{"path":"n.txt"}"#)])),
        Reply::sse(text_sse("It says forty-two.")),
        Reply::sse(text_sse("Yes.")),
        Reply::sse(text_sse("Still yes.")),
    ])
    .await;
    let cfg = config(&provider.base_url(), 5);
    let agent = Agent::new(cfg.clone()).unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut run = agent.start_run(run_request("what is in n.txt?", false), "req-m1".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let checkpoint = client.checkpoint.clone().unwrap();

    let second = |state: pb::ConversationStateStructure| {
        let mut r = run_request("are you sure?", false);
        r.conversation_state = Some(state);
        r
    };
    let check = |n: usize| {
        let body = provider.requests()[n].json();
        let msgs = body["messages"].as_array().unwrap().clone();
        let text = serde_json::to_string(&msgs).unwrap();
        assert!(text.contains("what is in n.txt?"), "{text}");
        assert!(text.contains("forty-two"), "tool result replayed: {text}");
        assert!(text.contains("It says forty-two."), "{text}");
        assert!(
            msgs.iter()
                .any(|m| m["role"] == "tool" && m["tool_call_id"] == "r1"),
            "{text}"
        );
        assert_eq!(msgs.last().unwrap()["content"], "are you sure?");
    };

    // Same proxy: the blobs come from the local cache; the client is not asked.
    let gets_before = count_get_blobs(&client);
    let mut run = agent.start_run(second(checkpoint.clone()), "req-m2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    check(2);
    assert_eq!(count_get_blobs(&client), gets_before);
    assert_eq!(client.checkpoint.as_ref().unwrap().turns.len(), 2);

    // A "restarted" proxy with an empty cache: the client serves the blobs through get_blob.
    let fresh_dir = tempfile::tempdir().unwrap();
    let mut restarted = (*cfg).clone();
    restarted.data_dir = Some(fresh_dir.path().to_path_buf());
    let agent = Agent::new(Arc::new(restarted)).unwrap();
    let mut run = agent.start_run(second(checkpoint), "req-m3".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    check(3);
    assert!(messages.iter().any(|m| matches!(&m.message, Some(Server::KvServerMessage(k)) if matches!(k.message, Some(pb::kv_server_message::Message::GetBlobArgs(_))))));
}

fn count_get_blobs(client: &FakeCursor) -> usize {
    client.gets
}

#[tokio::test]
async fn a_missing_blob_ack_ends_the_run_with_a_clear_error() {
    let provider = FakeProvider::start(vec![Reply::sse(text_sse("hi"))]).await;
    let mut cfg = (*config(&provider.base_url(), 5)).clone();
    cfg.agent.kv_timeout_secs = 1;
    let agent = Agent::new(Arc::new(cfg)).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    client.withhold_acks = true;
    let mut run = agent.start_run(run_request("hi", true), "req-k1".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    let err = end.error.expect("an error");
    // After the answer was shown: a code Cursor's client does not retry.
    assert_eq!(err.code, Code::Unknown);
    assert!(err.message.contains("blobs"), "{}", err.message);
    // No checkpoint pointing at unacknowledged blobs, and no turn_ended.
    assert!(client.checkpoint.is_none());
    assert!(!updates(&messages)
        .iter()
        .any(|u| matches!(u, Update::TurnEnded(_))));
}

#[tokio::test]
async fn an_ask_question_round_trip_reaches_the_model() {
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[(
            "q1",
            "ask_question",
            r#"{"question":"Which colour?","options":["red","blue"]}"#,
        )])),
        Reply::sse(text_sse("Blue it is.")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut run = agent.start_run(run_request("pick", true), "req-q1".into());
    let (messages, end) = drive(&mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(messages
        .iter()
        .any(|m| matches!(m.message, Some(Server::InteractionQuery(_)))));
    let answer = &tool_results(&provider, 1)[0];
    assert!(
        answer.to_lowercase().contains("red") || answer.contains("blue"),
        "{answer}"
    );
}

#[tokio::test]
async fn finished_runs_reach_the_status_registry() {
    let body = r#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#;
    let provider = FakeProvider::start(vec![Reply::sse(TEXT_SSE), Reply::json(401, body)]).await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut run = agent.start_run(run_request("hi", true), "req-s1".into());
    drive(&mut run).await;
    let mut run = agent.start_run(run_request("hi", true), "req-s2".into());
    drive(&mut run).await;
    // The supervisor records the outcome just before the end frame goes out.
    let both_recorded = || {
        let snap = agent.status().snapshot();
        ["req-s1", "req-s2"].iter().all(|id| {
            snap.recent
                .iter()
                .any(|r| r.run_id == cursor_byok::status::run_id(id))
        })
    };
    assert!(
        common::wait_until(Duration::from_secs(5), both_recorded).await,
        "the runs were not recorded"
    );
    let snap = agent.status().snapshot();
    assert!(snap.active.is_empty());
    let ok = snap
        .recent
        .iter()
        .find(|r| r.run_id == cursor_byok::status::run_id("req-s1"))
        .expect("run recorded");
    assert_eq!(ok.model, "byok-fake-model");
    assert_eq!(ok.outcome.as_deref(), Some("ok"));
    assert_eq!((ok.input_tokens, ok.output_tokens), (120, 7));
    let failed = snap
        .recent
        .iter()
        .find(|r| r.run_id == cursor_byok::status::run_id("req-s2"))
        .unwrap();
    assert_eq!(failed.outcome.as_deref(), Some("error"));
    assert!(failed.error.as_deref().unwrap_or_default().contains("401"));
}

#[tokio::test]
async fn a_history_too_long_for_the_context_window_is_summarised() {
    let provider = FakeProvider::start(vec![
        Reply::sse(text_sse("Noted the long file.")),
        Reply::sse(text_sse(
            "SUMMARY: the user pasted a long file about llamas.",
        )),
        Reply::sse(text_sse("Yes, llamas.")),
    ])
    .await;
    let mut cfg = (*config(&provider.base_url(), 5)).clone();
    // Room for about 500 tokens of history: the first turn alone is more.
    cfg.models[0].context_window = 9_000;
    cfg.models[0].max_output_tokens = 500;
    let agent = Agent::new(Arc::new(cfg)).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let long = format!("remember this: {}", "llamas ".repeat(1_000));
    let mut run = agent.start_run(run_request(&long, false), "req-c1".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);

    let mut second = run_request("was it llamas?", false);
    second.conversation_state = client.checkpoint.clone();
    let mut run = agent.start_run(second, "req-c2".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let kinds: Vec<&str> = updates(&messages)
        .iter()
        .filter_map(|u| match u {
            Update::SummaryStarted(_) => Some("started"),
            Update::Summary(_) => Some("summary"),
            Update::SummaryCompleted(_) => Some("completed"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["started", "summary", "completed"]);

    // The summary request carried the old turn; the answer request carried the summary, not it.
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);
    assert!(serde_json::to_string(&requests[1].json())
        .unwrap()
        .contains("llamas llamas"));
    let last = serde_json::to_string(&requests[2].json()["messages"]).unwrap();
    assert!(
        last.contains("[Summary of the earlier conversation]"),
        "{last}"
    );
    assert!(last.contains("SUMMARY: the user pasted"), "{last}");
    assert!(!last.contains("llamas llamas llamas"), "{last}");
    // The checkpoint keeps every turn and records the summary.
    let cp = client.checkpoint.clone().unwrap();
    assert_eq!(cp.turns.len(), 2);
    assert!(cp.summary.is_some());
}

#[tokio::test]
async fn the_tool_round_limit_ends_the_turn_with_an_explanation() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "a\n").unwrap();
    let provider = FakeProvider::start(vec![Reply::sse(tool_sse(&[(
        "l1",
        "read_file",
        r#"{"path":"a.txt"}"#,
    )]))])
    .await;
    let mut cfg = (*config(&provider.base_url(), 5)).clone();
    cfg.agent.max_tool_rounds = 1;
    let agent = Agent::new(Arc::new(cfg)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut run = agent.start_run(run_request("loop", false), "req-l1".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(
        text_of(&messages).contains("max_tool_rounds"),
        "{}",
        text_of(&messages)
    );
    assert_eq!(provider.requests().len(), 1);
    assert!(updates(&messages)
        .iter()
        .any(|u| matches!(u, Update::TurnEnded(_))));
    assert!(client.checkpoint.is_some());
}

/// A model on `primary` (provider `fake`) with one fallback on `backup`, retries off and a
/// one-second first-token timeout.
fn fallback_config(primary: &str, backup: &str) -> Arc<Config> {
    fallback_config_cooling(primary, backup, 30)
}

/// [`fallback_config`] with a cool-down of `cooldown_secs`.
fn fallback_config_cooling(primary: &str, backup: &str, cooldown_secs: u64) -> Arc<Config> {
    fallback_config_with(primary, backup, cooldown_secs, 0)
}

/// [`fallback_config`] with a cool-down and the providers' own retries.
fn fallback_config_with(
    primary: &str,
    backup: &str,
    cooldown_secs: u64,
    retries: u32,
) -> Arc<Config> {
    let dir = tempfile::tempdir().unwrap().keep();
    let text = format!(
        "data_dir = \"{}\"\n[agent]\nkv_timeout_secs = 5\nprovider_max_retries = {retries}\n\
         [fallback]\nfirst_token_timeout_secs = 1\ncooldown_secs = {cooldown_secs}\n\
         [providers.fake]\nkind = \"openai-chat\"\nbase_url = \"{primary}\"\napi_key = \"sk-test-primary\"\n\
         [providers.backup]\nkind = \"openai-chat\"\nbase_url = \"{backup}\"\napi_key = \"sk-test-backup\"\n\
         [[models]]\nid = \"fake-model\"\nprovider = \"fake\"\nmodel = \"gpt-fake\"\n\
         [[models.fallback]]\nprovider = \"backup\"\nmodel = \"gpt-backup\"\nmax_output_tokens = 1234\n\
         [models.fallback.price]\ninput = 1.0\noutput = 2.0\n",
        dir.display()
    );
    Arc::new(Config::from_toml(&text, "test").unwrap())
}

type Outcome = (
    Vec<pb::AgentServerMessage>,
    EndStream,
    cursor_byok::status::RunRecord,
);

/// One run on `agent` in conversation `conv-1`; its messages, end and status record.
async fn run_once(agent: &Agent, request_id: &str) -> Outcome {
    run_in(agent, request_id, "conv-1").await
}

async fn run_in(agent: &Agent, request_id: &str, conversation: &str) -> Outcome {
    let mut req = run_request("Say hello", true);
    req.conversation_id = Some(conversation.into());
    let mut run = agent.start_run(req, request_id.into());
    let (messages, end) = drive(&mut run).await;
    let record = agent.status().snapshot().recent[0].clone();
    assert_eq!(record.run_id, cursor_byok::status::run_id(request_id));
    (messages, end, record)
}

#[tokio::test]
async fn a_target_failing_before_any_output_hands_the_run_to_the_next() {
    let refused = common::closed_port();
    let stall = Reply {
        after: After::Stall,
        ..Reply::sse("")
    };
    let overloaded = Reply::sse(
        "data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"overloaded_error\"}}\n\n",
    );
    let cases: Vec<(&str, Option<Reply>, &str)> = vec![
        ("refused connection", None, "could not talk to Fake"),
        (
            "429",
            Some(Reply::json(429, r#"{"error":{"message":"slow down"}}"#)),
            "rate-limited the request (HTTP 429)",
        ),
        (
            "500",
            Some(Reply::json(500, "{}")),
            "server error (HTTP 500)",
        ),
        (
            "503",
            Some(Reply::json(503, "{}")),
            "server error (HTTP 503)",
        ),
        ("overloaded body", Some(overloaded), "is overloaded"),
        ("no first token", Some(stall), "no first token within 1 s"),
    ];
    for (case, reply, reason) in cases {
        let primary = match &reply {
            Some(r) => Some(FakeProvider::start(vec![r.clone()]).await),
            None => None,
        };
        let primary_url = primary
            .as_ref()
            .map_or(format!("http://{}/v1", refused.addr), |p| p.base_url());
        let backup = FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
        let agent = Agent::new(fallback_config(&primary_url, &backup.base_url())).unwrap();
        let (messages, end, record) = run_once(&agent, "req-fb").await;
        assert!(end.error.is_none(), "{case}: {:?}", end.error);
        assert_eq!(text_of(&messages), "Hello, world", "{case}");
        let sent = backup.requests();
        assert_eq!(sent.len(), 1, "{case}");
        assert_eq!(sent[0].json()["model"], "gpt-backup", "{case}");
        assert_eq!(sent[0].json()["max_tokens"], 1234, "{case}");
        assert_eq!(
            record.target.as_deref(),
            Some("backup/gpt-backup"),
            "{case}"
        );
        assert_eq!(record.skipped.len(), 1, "{case}: {:?}", record.skipped);
        assert!(
            record.skipped[0].starts_with("fake/gpt-fake: ") && record.skipped[0].contains(reason),
            "{case}: {:?}",
            record.skipped
        );
        // Priced at the backup's price: 120 in × $1 + 7 out × $2, per million.
        let cost = record.cost_usd.unwrap();
        assert!((cost - 134e-6).abs() < 1e-12, "{case}: {cost}");
        if let Some(p) = &primary {
            assert_eq!(p.requests().len(), 1, "{case}: one try, no retry");
        }

        // The failed target cools down across runs: the next run goes to the backup at once.
        backup.push(Reply::sse(TEXT_SSE));
        let (_, end, record) = run_once(&agent, "req-fb-2").await;
        assert!(end.error.is_none(), "{case}: {:?}", end.error);
        assert_eq!(backup.requests().len(), 2, "{case}");
        if let Some(p) = &primary {
            assert_eq!(p.requests().len(), 1, "{case}: skipped while cooling");
        }
        assert_eq!(record.target.as_deref(), Some("backup/gpt-backup"));
        assert!(
            record.skipped[0].contains("cooling down for") && record.skipped[0].contains(reason),
            "{case}: {:?}",
            record.skipped
        );
    }
}

#[tokio::test]
async fn once_output_has_started_there_is_no_switch() {
    let partial = Reply::sse(
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
    )
    .then(After::Cut);
    let primary = FakeProvider::start(vec![partial]).await;
    let backup = FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
    let agent = Agent::new(fallback_config(&primary.base_url(), &backup.base_url())).unwrap();
    let (messages, end, record) = run_once(&agent, "req-cut").await;
    assert_eq!(text_of(&messages), "Hel");
    let error = end.error.expect("the failure goes to Cursor");
    assert_eq!(
        error.code,
        Code::Unknown,
        "not retried by the client: {error:?}"
    );
    assert!(backup.requests().is_empty());
    assert_eq!(record.target.as_deref(), Some("fake/gpt-fake"));
    assert!(record.skipped.is_empty());
}

#[tokio::test]
async fn an_error_that_is_not_a_failover_class_goes_to_cursor() {
    let primary =
        FakeProvider::start(vec![Reply::json(401, r#"{"error":{"message":"bad key"}}"#)]).await;
    let backup = FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
    let agent = Agent::new(fallback_config(&primary.base_url(), &backup.base_url())).unwrap();
    let (_, end, record) = run_once(&agent, "req-401").await;
    assert_eq!(end.error.expect("an error").code, Code::Unauthenticated);
    assert!(backup.requests().is_empty());
    assert_eq!(record.target.as_deref(), Some("fake/gpt-fake"));
}

/// A provider's own retries (which wait for `retry-after`) do not delay a fallback: with a
/// target after it, a 429 asking for 30 s hands the run over at once, with one request.
#[tokio::test]
async fn a_rate_limit_with_retry_after_falls_over_without_waiting() {
    let limited =
        Reply::json(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "30");
    let primary = FakeProvider::start(vec![limited.clone(), limited]).await;
    let backup = FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
    let agent = Agent::new(fallback_config_with(
        &primary.base_url(),
        &backup.base_url(),
        30,
        2,
    ))
    .unwrap();
    let (messages, end, record) = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        run_once(&agent, "req-ra"),
    )
    .await
    .expect("the fallback did not wait for retry-after");
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(text_of(&messages), "Hello, world");
    assert_eq!(
        primary.requests().len(),
        1,
        "no retry on a target with a fallback"
    );
    assert_eq!(record.target.as_deref(), Some("backup/gpt-backup"));
}

#[tokio::test]
async fn a_conversation_stays_on_the_target_that_served_it() {
    let primary = FakeProvider::start(vec![Reply::json(503, "{}"), Reply::sse(TEXT_SSE)]).await;
    let backup = FakeProvider::start(vec![Reply::sse(TEXT_SSE), Reply::sse(TEXT_SSE)]).await;
    let config = fallback_config_cooling(&primary.base_url(), &backup.base_url(), 1);
    let agent = Agent::new(config).unwrap();
    let (_, end, record) = run_in(&agent, "req-a", "conv-a").await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(record.target.as_deref(), Some("backup/gpt-backup"));
    // The primary's cool-down is over, but conv-a stays where its caches are. Time passes on
    // the paused clock, between runs (no I/O is in flight while it moves).
    tokio::time::pause();
    tokio::time::advance(std::time::Duration::from_millis(1100)).await;
    tokio::time::resume();
    let (_, end, record) = run_in(&agent, "req-a2", "conv-a").await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(record.target.as_deref(), Some("backup/gpt-backup"));
    assert!(record.skipped.is_empty(), "{:?}", record.skipped);
    assert_eq!((primary.requests().len(), backup.requests().len()), (1, 2));
    // Another conversation starts on the primary again.
    let (_, end, record) = run_in(&agent, "req-b", "conv-b").await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(record.target.as_deref(), Some("fake/gpt-fake"));
    assert_eq!(primary.requests().len(), 2);
}

/// Content given by blob id — the user's text, an extra-context entry, an image, and the
/// request context parts (rules, MCP definitions) — is fetched from the client's KV and
/// reaches the provider as if it had come inline.
#[tokio::test]
async fn blob_referenced_context_is_fetched_through_the_clients_kv() {
    use prost::Message as _;
    use sha2::Digest as _;
    let provider = FakeProvider::start(vec![
        Reply::sse(text_sse("ok")),
        Reply::sse(text_sse("ok again")),
    ])
    .await;
    let cfg = config(&provider.base_url(), 5);
    let agent = Agent::new(cfg).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut put = |data: Vec<u8>| -> bytes::Bytes {
        let id = bytes::Bytes::from(sha2::Sha256::digest(&data).to_vec());
        client.blobs.insert(id.to_vec(), data.into());
        id
    };
    let rules = pb::RequestContextRulesPart {
        rules: vec![pb::CursorRule {
            full_path: "/tmp/ws/AGENTS.md".into(),
            content: "RULE FROM A PART".into(),
            r#type: Some(pb::CursorRuleType {
                r#type: Some(pb::cursor_rule_type::Type::Global(Default::default())),
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mcps = pb::RequestContextMcpsPart {
        tools: vec![pb::McpToolDefinition {
            name: "kb-search".into(),
            provider_identifier: "kb".into(),
            tool_name: "search".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let rules_id = put(rules.encode_to_vec());
    let mcps_id = put(mcps.encode_to_vec());
    let text_id = put(b"TEXT BY BLOB".to_vec());
    let entry_id = put(b"ENTRY BY BLOB".to_vec());
    let image_id = put(b"\x89PNG\r\n\x1a\nfake-png".to_vec());

    let mut req = run_request("", true);
    let action = req.action.as_mut().unwrap();
    action.request_context_parts = Some(pb::RequestContextPartReferences {
        rules_blob_id: rules_id,
        mcps_blob_id: mcps_id,
        ..Default::default()
    });
    let Some(pb::conversation_action::Action::UserMessageAction(a)) = action.action.as_mut() else {
        unreachable!()
    };
    let user = a.user_message.as_mut().unwrap();
    user.text_blob_id = Some(text_id);
    user.selected_context = Some(pb::SelectedContext {
        extra_context_entries: vec![pb::ExtraContextEntry {
            data_or_blob_id: Some(pb::extra_context_entry::DataOrBlobId::BlobId(entry_id)),
        }],
        selected_images: vec![pb::SelectedImage {
            mime_type: "image/jpeg".into(),
            data_or_blob_id: Some(pb::selected_image::DataOrBlobId::BlobId(image_id)),
            ..Default::default()
        }],
        ..Default::default()
    });
    let mut second = req.clone();
    let mut run = agent.start_run(req, "req-blobs".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(client.gets, 5, "each context blob asked for once");
    check_blob_request(&provider);

    // The next turn, on a restarted proxy (empty cache): the first turn is replayed with its
    // blob-referenced content, fetched again from the client, byte for byte as it was sent.
    second.conversation_state = client.checkpoint.clone();
    if let Some(pb::conversation_action::Action::UserMessageAction(a)) =
        second.action.as_mut().and_then(|a| a.action.as_mut())
    {
        a.user_message = Some(pb::UserMessage {
            text: "again".into(),
            message_id: "m2".into(),
            ..Default::default()
        });
    }
    let fresh = tempfile::tempdir().unwrap();
    let mut restarted = (*config(&provider.base_url(), 5)).clone();
    restarted.data_dir = Some(fresh.path().to_path_buf());
    let agent = Agent::new(Arc::new(restarted)).unwrap();
    let mut run = agent.start_run(second, "req-blobs-2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let reqs = provider.requests();
    let first = reqs[0].json()["messages"].as_array().unwrap().clone();
    let again = reqs[1].json()["messages"].as_array().unwrap().clone();
    assert_eq!(
        &again[..first.len()],
        &first[..],
        "turn 1 replays as it was sent"
    );
}

fn check_blob_request(provider: &FakeProvider) {
    let body = provider.requests()[0].json();
    let msgs = body["messages"].as_array().unwrap();
    let system = msgs[0]["content"].as_str().unwrap_or_default();
    assert!(system.contains("RULE FROM A PART"), "{system}");
    let user = serde_json::to_string(msgs.last().unwrap()).unwrap();
    assert!(user.contains("TEXT BY BLOB"), "{user}");
    assert!(user.contains("ENTRY BY BLOB"), "{user}");
    assert!(
        user.contains("data:image/png;base64,"),
        "sniffed PNG: {user}"
    );
    let tools = serde_json::to_string(&body["tools"]).unwrap();
    assert!(tools.contains("mcp_kb_search"), "{tools}");
}

/// The system prompt is byte-identical across the turns of a conversation when its inputs are
/// the same, and the second turn's request starts with the first turn's messages, so provider
/// prompt caches keep hitting.
#[tokio::test]
async fn the_prompt_is_a_stable_prefix_across_turns() {
    let provider = FakeProvider::start(vec![
        Reply::sse(text_sse("First answer.")),
        Reply::sse(text_sse("Second answer.")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let rule = |path: &str, body: &str, t: pb::cursor_rule_type::Type| pb::CursorRule {
        full_path: path.into(),
        content: body.into(),
        r#type: Some(pb::CursorRuleType { r#type: Some(t) }),
        ..Default::default()
    };
    let with_rules = |text: &str| {
        let mut r = run_request(text, true);
        let Some(pb::conversation_action::Action::UserMessageAction(a)) =
            r.action.as_mut().and_then(|a| a.action.as_mut())
        else {
            unreachable!()
        };
        let ctx = a.request_context.as_mut().unwrap();
        ctx.rules = vec![
            rule(
                "/tmp/ws/AGENTS.md",
                "Always rule.",
                pb::cursor_rule_type::Type::Global(Default::default()),
            ),
            rule(
                "/tmp/ws/.cursor/rules/db.mdc",
                "Agent rule body.",
                pb::cursor_rule_type::Type::AgentFetched(pb::CursorRuleTypeAgentFetched {
                    description: "Databases".into(),
                }),
            ),
        ];
        ctx.git_repos = vec![pb::GitRepoInfo {
            path: "/tmp/ws".into(),
            branch_name: "main".into(),
            status: "M a.rs".into(),
            ..Default::default()
        }];
        r
    };
    let mut run = agent.start_run(with_rules("first"), "req-s1".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let mut second = with_rules("second");
    second.conversation_state = client.checkpoint.clone();
    let mut run = agent.start_run(second, "req-s2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);

    let reqs = provider.requests();
    let first = reqs[0].json()["messages"].as_array().unwrap().clone();
    let again = reqs[1].json()["messages"].as_array().unwrap().clone();
    assert_eq!(first[0], again[0], "the same system prompt, byte for byte");
    let system = first[0]["content"].as_str().unwrap();
    assert!(system.contains("Always rule.") && system.contains("Databases"));
    assert!(!system.contains("Agent rule body."), "{system}");
    assert!(
        system.contains("Git repository: /tmp/ws (branch main)"),
        "{system}"
    );
    assert_eq!(
        &again[..first.len()],
        &first[..],
        "turn 1 is a prefix of turn 2"
    );
}

// ---- Issue 21: every conversation action does what Cursor's server does ----

/// A fake provider with `replies`, an agent on it, and a client in a fresh workspace.
async fn setup(replies: Vec<Reply>) -> (FakeProvider, Agent, tempfile::TempDir, FakeCursor) {
    let provider = FakeProvider::start(replies).await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let client = FakeCursor::new(ws.path());
    (provider, agent, ws, client)
}

fn action_request(action: pb::conversation_action::Action) -> pb::AgentRunRequest {
    let mut r = run_request("unused", false);
    r.action = Some(pb::ConversationAction {
        action: Some(action),
        ..Default::default()
    });
    r
}

fn conversation_action(action: pb::conversation_action::Action) -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(pb::agent_client_message::Message::ConversationAction(
            pb::ConversationAction {
                action: Some(action),
                ..Default::default()
            },
        )),
    }
}

fn steer(id: &str, expected_run_id: &str, text: &str) -> pb::AgentClientMessage {
    conversation_action(pb::conversation_action::Action::InjectContextAction(
        pb::InjectContextAction {
            injection_id: id.into(),
            expected_run_id: expected_run_id.into(),
            payload: Some(pb::inject_context_action::Payload::UserContext(
                pb::UserContextInjection {
                    user_message: Some(pb::UserMessage {
                        text: text.into(),
                        message_id: "steer-m".into(),
                        ..Default::default()
                    }),
                    request_context: None,
                },
            )),
        },
    ))
}

/// Like [`drive_with`], but sends `extra` (once) just before answering the first message
/// `when` matches.
async fn drive_sending(
    handle: &mut RunHandle,
    client: &mut FakeCursor,
    when: impl Fn(&pb::AgentServerMessage) -> bool,
    extra: Vec<pb::AgentClientMessage>,
) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let mut extra = Some(extra);
    let mut messages = Vec::new();
    loop {
        let out = tokio::time::timeout(Duration::from_secs(20), handle.output.recv())
            .await
            .expect("the run must not hang")
            .expect("the run must end with an End");
        match out {
            RunOutput::End(end) => return (messages, end),
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => {
                if when(&m) {
                    for e in extra.take().unwrap_or_default() {
                        handle.input.send(Box::new(e)).await.unwrap();
                    }
                }
                for answer in client.respond(&m) {
                    let _ = handle.input.send(Box::new(answer)).await;
                }
                messages.push(*m);
            }
        }
    }
}

fn is_exec(
    m: &pb::AgentServerMessage,
    pred: fn(&pb::exec_server_message::Message) -> bool,
) -> bool {
    matches!(&m.message, Some(Server::ExecServerMessage(e)) if e.message.as_ref().is_some_and(pred))
}

fn injection_states(messages: &[pb::AgentServerMessage]) -> Vec<(String, &'static str)> {
    use pb::context_injection_state::State;
    updates(messages)
        .into_iter()
        .filter_map(|u| match u {
            Update::ContextInjectionState(s) => Some((
                s.injection_id.clone(),
                match s.state.as_ref().and_then(|s| s.state.as_ref()) {
                    Some(State::Queued(_)) => "queued",
                    Some(State::Delivered(_)) => "delivered",
                    Some(State::QueuedForNextTurn(_)) => "queued_for_next_turn",
                    Some(State::Rejected(_)) => "rejected",
                    Some(State::Cancelled(_)) => "cancelled",
                    None => "none",
                },
            )),
            _ => None,
        })
        .collect()
}

fn request_text(provider: &FakeProvider, n: usize) -> String {
    serde_json::to_string(&provider.requests()[n].json()["messages"]).unwrap()
}

#[tokio::test]
async fn steering_during_a_tool_round_reaches_the_next_model_call_and_the_stored_turn() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("r1", "read_file", r#"{"path":"a.txt"}"#)])),
        Reply::sse(text_sse("Done, in French as asked.")),
        Reply::sse(text_sse("ok")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut req = run_request("read a.txt", false);
    req.run_id = Some("run-1".into());
    let mut run = agent.start_run(req, "req-st1".into());
    let read = |m: &pb::AgentServerMessage| {
        is_exec(m, |e| {
            matches!(e, pb::exec_server_message::Message::ReadArgs(_))
        })
    };
    let extra = vec![
        steer("inj-1", "run-1", "answer in French"),
        steer("inj-2", "run-other", "ignored"),
    ];
    let (messages, end) = drive_sending(&mut run, &mut client, read, extra).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(
        injection_states(&messages),
        [
            ("inj-1".to_string(), "queued"),
            ("inj-2".to_string(), "rejected"),
            ("inj-1".to_string(), "delivered"),
        ]
    );
    // Not in the first call; in the second, after the tool result.
    assert!(!request_text(&provider, 0).contains("answer in French"));
    let second = provider.requests()[1].json();
    let msgs = second["messages"].as_array().unwrap();
    let last = msgs.last().unwrap();
    assert_eq!(last["role"], "user");
    assert!(last["content"]
        .as_str()
        .unwrap()
        .contains("answer in French"));
    assert_eq!(msgs[msgs.len() - 2]["role"], "tool");
    assert!(!request_text(&provider, 1).contains("ignored"));

    // The stored turn keeps it: the next turn's history has it between the result and the answer.
    let mut next = run_request("thanks", false);
    next.conversation_state = client.checkpoint.clone();
    let mut run = agent.start_run(next, "req-st2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let third = request_text(&provider, 2);
    let (r, s, d) = (
        third.find("alpha").unwrap(),
        third.find("answer in French").unwrap(),
        third.find("Done, in French").unwrap(),
    );
    assert!(r < s && s < d, "{third}");
}

#[tokio::test]
async fn steering_during_the_final_answer_gets_one_more_model_call() {
    let (provider, agent, _ws, mut client) = setup(vec![
        Reply::sse(text_sse("First answer.")).delay(Duration::from_millis(300)),
        Reply::sse(text_sse("Adjusted answer.")),
    ])
    .await;
    let mut run = agent.start_run(run_request("hi", true), "req-st3".into());
    let started = |m: &pb::AgentServerMessage| matches!(&m.message, Some(Server::InteractionUpdate(u)) if matches!(u.message, Some(Update::StepStarted(_))));
    let (messages, end) = drive_sending(
        &mut run,
        &mut client,
        started,
        vec![steer("i", "", "be brief")],
    )
    .await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(provider.requests().len(), 2);
    assert!(text_of(&messages).contains("First answer.Adjusted answer."));
    assert!(request_text(&provider, 1).contains("be brief"));
    assert!(request_text(&provider, 1).contains("First answer."));
    let states: Vec<&str> = injection_states(&messages)
        .into_iter()
        .map(|s| s.1)
        .collect();
    assert_eq!(states, ["queued", "delivered"]);
}

#[tokio::test]
async fn build_makes_the_plan_the_instruction_in_agent_mode_and_seeds_its_todos() {
    let replies = vec![
        Reply::sse(text_sse("Building.")),
        Reply::sse(text_sse("Built.")),
    ];
    let (provider, agent, ws, mut client) = setup(replies).await;
    let plan = "---\nname: Greeting\ntodos:\n  - id: t1\n    content: Write hello.txt\n    status: pending\n---\n# Greeting plan\nWrite hello.txt with a greeting.\n";
    let mut req = action_request(pb::conversation_action::Action::ExecutePlanAction(
        pb::ExecutePlanAction {
            plan: Some(pb::ConversationPlan { plan: plan.into() }),
            plan_id: Some("plan-7".into()),
            plan_file_path: Some("/ws/.cursor/plans/greeting.plan.md".into()),
            ..Default::default()
        },
    ));
    req.conversation_state = Some(pb::ConversationStateStructure {
        mode: Some(pb::AgentMode::Plan as i32),
        ..Default::default()
    });
    let mut run = agent.start_run(req, "req-b1".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let body = provider.requests()[0].json();
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(!system.contains("Plan mode"), "agent mode: {system}");
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(
        user.contains("Implement the plan") && user.contains("Write hello.txt with a greeting."),
        "{user}"
    );
    assert!(
        user.contains("plan execution"),
        "marked as system-originated: {user}"
    );
    assert!(!user.contains("Continue where you left off"));
    let cp = client.checkpoint.clone().unwrap();
    assert_eq!(cp.mode, Some(pb::AgentMode::Agent as i32));
    assert_eq!(cp.todos.len(), 1);
    assert_eq!(
        cp.plans["plan-7"].path,
        "/ws/.cursor/plans/greeting.plan.md"
    );

    // Only a path: the plan is read through the client.
    std::fs::write(ws.path().join("p.plan.md"), "# Plan B\nDelete tmp/.\n").unwrap();
    let path = ws.path().join("p.plan.md").display().to_string();
    let req = action_request(pb::conversation_action::Action::ExecutePlanAction(
        pb::ExecutePlanAction {
            plan_file_uri: Some(format!("file://{path}")),
            ..Default::default()
        },
    ));
    let mut run = agent.start_run(req, "req-b2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(request_text(&provider, 1).contains("Delete tmp/."));
}

#[tokio::test]
async fn summarize_action_summarises_without_a_model_turn() {
    let (provider, agent, _ws, mut client) = setup(vec![
        Reply::sse(text_sse("Llamas noted.")),
        Reply::sse(text_sse("SUMMARY: llamas.")),
        Reply::sse(text_sse("Yes, llamas.")),
    ])
    .await;
    let mut run = agent.start_run(run_request("remember llamas", true), "req-z1".into());
    drive_with(&mut run, &mut client).await;
    let mut req = action_request(pb::conversation_action::Action::SummarizeAction(
        pb::SummarizeAction {},
    ));
    req.conversation_state = client.checkpoint.clone();
    let mut run = agent.start_run(req, "req-z2".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let kinds: Vec<&str> = updates(&messages)
        .iter()
        .filter_map(|u| match u {
            Update::SummaryStarted(_) => Some("started"),
            Update::Summary(_) => Some("summary"),
            Update::SummaryCompleted(_) => Some("completed"),
            Update::StepStarted(_) => Some("step"),
            Update::TurnEnded(_) => Some("turn_ended"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["started", "summary", "completed", "turn_ended"]);
    assert_eq!(provider.requests().len(), 2);
    assert!(request_text(&provider, 1).contains("remember llamas"));
    let cp = client.checkpoint.clone().unwrap();
    assert!(cp.summary.is_some());
    assert_eq!(cp.turns.len(), 1);
    // The next turn starts from the summary.
    let mut next = run_request("llamas?", true);
    next.conversation_state = Some(cp);
    let mut run = agent.start_run(next, "req-z3".into());
    drive_with(&mut run, &mut client).await;
    let text = request_text(&provider, 2);
    assert!(
        text.contains("SUMMARY: llamas.") && !text.contains("remember llamas"),
        "{text}"
    );
}

#[tokio::test]
async fn a_user_shell_command_runs_streams_and_is_seen_by_the_next_turn() {
    let (provider, agent, _ws, mut client) =
        setup(vec![Reply::sse(text_sse("It printed 42."))]).await;
    let req = action_request(pb::conversation_action::Action::ShellCommandAction(
        pb::ShellCommandAction {
            shell_command: Some(pb::ShellCommand {
                command: "echo 42".into(),
            }),
            exec_id: "client-exec-7".into(),
        },
    ));
    let mut run = agent.start_run(req, "req-sh1".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(provider.requests().is_empty(), "no model call");
    // The command runs under the client's exec id.
    let shell = client
        .execs
        .iter()
        .find(|e| {
            matches!(
                e.message,
                Some(pb::exec_server_message::Message::ShellStreamArgs(_))
            )
        })
        .unwrap();
    assert_eq!(shell.exec_id, "client-exec-7");
    assert_eq!(tool_events(&messages).len(), 2);
    assert!(updates(&messages)
        .iter()
        .any(|u| matches!(u, Update::ToolCallDelta(_))));
    assert!(updates(&messages)
        .iter()
        .any(|u| matches!(u, Update::TurnEnded(_))));
    let mut next = run_request("what did it print?", true);
    next.conversation_state = client.checkpoint.clone();
    let mut run = agent.start_run(next, "req-sh2".into());
    drive_with(&mut run, &mut client).await;
    let text = request_text(&provider, 0);
    assert!(
        text.contains("$ echo 42") && text.contains("42\\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_cancel_with_a_pending_tool_call_stores_the_turn_closed_with_the_resolution() {
    let ws = tempfile::tempdir().unwrap();
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[(
            "s1",
            "run_terminal_cmd",
            r#"{"command":"sleep 100"}"#,
        )])),
        Reply::sse(text_sse("Understood.")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    client.shell_gate = Some(ws.path().join("never"));
    let mut run = agent.start_run(run_request("run it", false), "req-cx1".into());
    let shell = |m: &pb::AgentServerMessage| {
        is_exec(m, |e| {
            matches!(e, pb::exec_server_message::Message::ShellStreamArgs(_))
        })
    };
    let cancel = conversation_action(pb::conversation_action::Action::CancelAction(
        pb::CancelAction {
            reason: "user".into(),
            interrupted_pending_tool_call_resolutions: Some(
                pb::InterruptedPendingToolCallResolutions {
                    resolutions: vec![pb::InterruptedPendingToolCallResolution {
                        tool_call_id: "s1#s1".into(),
                        resolution: Some(
                            pb::interrupted_pending_tool_call_resolution::Resolution::ShellResult(
                                pb::ShellResult {
                                    result: Some(pb::shell_result::Result::Success(
                                        pb::ShellSuccess {
                                            stdout: "half-way output".into(),
                                            ..Default::default()
                                        },
                                    )),
                                    ..Default::default()
                                },
                            ),
                        ),
                    }],
                },
            ),
        },
    ));
    // The cancel goes out after the client answered the shell's start.
    let mut sent = false;
    let end = loop {
        match run.output.recv().await.unwrap() {
            RunOutput::End(e) => break e,
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => {
                for a in client.respond(&m) {
                    let _ = run.input.send(Box::new(a)).await;
                }
                if shell(&m) && !sent {
                    sent = true;
                    run.input.send(Box::new(cancel.clone())).await.unwrap();
                }
            }
        }
    };
    assert_eq!(end.error.unwrap().code, Code::Canceled);
    let cp = client
        .checkpoint
        .clone()
        .expect("the canceled turn is stored");
    let mut next = run_request("never mind", false);
    next.conversation_state = Some(cp);
    let mut run = agent.start_run(next, "req-cx2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let body = provider.requests()[1].json();
    let msgs = body["messages"].as_array().unwrap();
    let call = msgs
        .iter()
        .position(|m| m["tool_calls"][0]["id"] == "s1")
        .expect("the call is replayed");
    assert_eq!(msgs[call + 1]["role"], "tool");
    assert_eq!(msgs[call + 1]["tool_call_id"], "s1");
    assert!(msgs[call + 1]["content"]
        .as_str()
        .unwrap()
        .contains("half-way output"));
}

/// One run of `req` to a clean end; the text of the provider's `n`-th request.
async fn ask(
    agent: &Agent,
    client: &mut FakeCursor,
    provider: &FakeProvider,
    req: pb::AgentRunRequest,
    n: usize,
) -> String {
    let mut run = agent.start_run(req, format!("req-ask-{n}"));
    let (_, end) = drive_with(&mut run, client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    request_text(provider, n)
}

#[tokio::test]
async fn system_originated_actions_reach_the_model_marked_as_such() {
    use pb::conversation_action::Action;
    let (provider, agent, _ws, mut client) = setup(vec![
        Reply::sse(text_sse("a")),
        Reply::sse(text_sse("b")),
        Reply::sse(text_sse("c")),
        Reply::sse(text_sse("d")),
    ])
    .await;

    // Goal continuation names the open todos.
    let todo = pb::TodoItem {
        id: "1".into(),
        content: "wire the cache".into(),
        status: pb::TodoStatus::Pending as i32,
        ..Default::default()
    };
    let todo_blob = prost::Message::encode_to_vec(&todo);
    let id = cursor_byok::proto::blob_id(&todo_blob);
    client.blobs.insert(id.to_vec(), todo_blob.into());
    let mut req = action_request(Action::GoalContinuationAction(
        pb::GoalContinuationAction {},
    ));
    req.conversation_state = Some(pb::ConversationStateStructure {
        todos: vec![id.to_vec().into()],
        ..Default::default()
    });
    let text = ask(&agent, &mut client, &provider, req, 0).await;
    assert!(
        text.contains("wire the cache") && text.contains("goal continuation"),
        "{text}"
    );

    // Subscription notifications: simulated user messages.
    let req = action_request(Action::SubscriptionNotificationAction(
        pb::SubscriptionNotificationAction {
            notifications: vec![pb::UserMessage {
                text: "CI failed on main".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    ));
    let text = ask(&agent, &mut client, &provider, req, 1).await;
    assert!(
        text.contains("CI failed on main") && text.contains("not typed by the user"),
        "{text}"
    );

    // An async question's answer is delivered as that tool call's result.
    let req = action_request(Action::AsyncAskQuestionCompletionAction(
        pb::AsyncAskQuestionCompletionAction {
            original_tool_call_id: "q9#s2".into(),
            original_args: Some(pb::AskQuestionArgs {
                questions: vec![pb::ask_question_args::Question {
                    id: "q1".into(),
                    prompt: "Colour?".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            result: Some(pb::AskQuestionResult {
                result: Some(pb::ask_question_result::Result::Success(
                    pb::AskQuestionSuccess {
                        answers: vec![pb::ask_question_success::Answer {
                            question_id: "q1".into(),
                            freeform_text: "teal".into(),
                            ..Default::default()
                        }],
                    },
                )),
            }),
        },
    ));
    let text = ask(&agent, &mut client, &provider, req, 2).await;
    assert!(text.contains("A: teal"), "{text}");

    // prepend_user_messages go first; a client-supplied history replaces the rebuilt one.
    let mut req = run_request("and now?", false);
    if let Some(Action::UserMessageAction(a)) = req.action.as_mut().and_then(|a| a.action.as_mut())
    {
        a.prepend_user_messages = vec![pb::UserMessage {
            text: "PREPENDED".into(),
            ..Default::default()
        }];
        a.conversation_history = Some(pb::ConversationHistory {
            messages: vec![pb::ConversationHistoryMessage {
                message: Some(pb::conversation_history_message::Message::User(
                    pb::ConversationHistoryUserMessage {
                        content: vec![pb::ConversationHistoryUserContent {
                            content: Some(pb::conversation_history_user_content::Content::Text(
                                pb::ConversationHistoryTextContent {
                                    text: "FROM CLIENT HISTORY".into(),
                                },
                            )),
                        }],
                    },
                )),
            }],
            replace_user_info: None,
        });
    }
    req.conversation_state = client.checkpoint.clone();
    ask(&agent, &mut client, &provider, req, 3).await;
    let body = provider.requests()[3].json();
    let msgs = body["messages"].as_array().unwrap();
    let contents: Vec<&str> = msgs[1..]
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(contents, ["FROM CLIENT HISTORY", "PREPENDED", "and now?"]);
}

/// Every branch of `ConversationAction`, from the compiled descriptors: none falls back to
/// "Continue where you left off." (only `resume_action` means exactly that); each either
/// reaches the model with its own content, answers without a model turn, or ends with an error
/// naming the branch.
#[tokio::test]
async fn no_conversation_action_branch_reaches_a_fallback() {
    use prost::Message as _;
    use prost_reflect::{DescriptorPool, DynamicMessage};
    let pool = DescriptorPool::decode(cursor_byok::proto::DESCRIPTOR_SET).unwrap();
    let desc = pool
        .get_message_by_name("agent.v1.ConversationAction")
        .unwrap();
    let oneof = desc.oneofs().find(|o| o.name() == "action").unwrap();
    let branches: Vec<_> = oneof.fields().collect();
    assert_eq!(branches.len(), 15);
    for field in branches {
        let name = field.name().to_string();
        let mut dynamic = DynamicMessage::new(desc.clone());
        let value = prost_reflect::Value::Message(DynamicMessage::new(
            field.kind().as_message().unwrap().clone(),
        ));
        dynamic.set_field(&field, value);
        let mut action =
            pb::ConversationAction::decode(dynamic.encode_to_vec().as_slice()).unwrap();
        assert!(action.action.is_some(), "{name} decodes to a known branch");
        if let Some(pb::conversation_action::Action::ShellCommandAction(s)) = &mut action.action {
            s.shell_command = Some(pb::ShellCommand {
                command: "true".into(),
            });
        }
        let provider =
            FakeProvider::start(vec![Reply::sse(text_sse("ok")), Reply::sse(text_sse("ok"))]).await;
        let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
        let mut req = run_request("x", true);
        req.action = Some(action);
        let mut run = agent.start_run(req, format!("req-{name}"));
        let (_, end) = drive(&mut run).await;
        let asked: Vec<String> = (0..provider.requests().len())
            .map(|n| request_text(&provider, n))
            .collect();
        if name != "resume_action" {
            assert!(
                !asked
                    .iter()
                    .any(|t| t.contains("Continue where you left off")),
                "{name} fell back to a continue: {asked:?}"
            );
        }
        if let Some(err) = &end.error {
            assert!(
                err.message.contains(&name)
                    || name == "cancel_action"
                    || name == "inject_context_action",
                "{name}: the error must name the branch: {}",
                err.message
            );
            assert!(
                matches!(err.code, Code::Unimplemented | Code::InvalidArgument),
                "{name}: {:?}",
                err.code
            );
        }
    }
}

#[tokio::test]
async fn steering_after_the_last_model_call_is_queued_for_the_next_turn() {
    let (provider, agent, _ws, mut client) = setup(vec![
        Reply::sse(text_sse("Done.")),
        Reply::sse(text_sse("Sure.")),
    ])
    .await;
    let mut run = agent.start_run(run_request("hi", true), "req-q4".into());
    // The turn is storing its blobs: no model call is left to carry the injection.
    let storing =
        |m: &pb::AgentServerMessage| matches!(&m.message, Some(Server::KvServerMessage(_)));
    let (messages, end) = drive_sending(
        &mut run,
        &mut client,
        storing,
        vec![steer("late", "", "one more thing")],
    )
    .await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(
        injection_states(&messages),
        [("late".to_string(), "queued_for_next_turn")]
    );
    assert_eq!(provider.requests().len(), 1);

    // The client sends it as the next turn; a steer that arrives as a new run says so.
    let mut next = run_request("one more thing", true);
    next.conversation_state = client.checkpoint.clone();
    if let Some(pb::conversation_action::Action::UserMessageAction(a)) =
        next.action.as_mut().and_then(|a| a.action.as_mut())
    {
        a.user_message.as_mut().unwrap().turn_steer = Some(true);
    }
    let text = ask(&agent, &mut client, &provider, next, 1).await;
    assert!(
        text.contains("sent this while you were working") && text.contains("one more thing"),
        "{text}"
    );
}

/// "Move to background" on a running command: the run asks the client with
/// `force_background_shell_args` for that call, and the call ends moved to the background.
#[tokio::test]
async fn move_to_background_asks_the_client_and_the_call_ends_backgrounded() {
    let (provider, agent, ws, mut client) = setup(vec![
        Reply::sse(tool_sse(&[(
            "s1",
            "run_terminal_cmd",
            r#"{"command":"npm run dev"}"#,
        )])),
        Reply::sse(text_sse("The server runs in the background.")),
    ])
    .await;
    client.shell_gate = Some(ws.path().join("never"));
    let mut run = agent.start_run(run_request("start the server", true), "req-bg1".into());
    let shell = |m: &pb::AgentServerMessage| {
        is_exec(m, |e| {
            matches!(e, pb::exec_server_message::Message::ShellStreamArgs(_))
        })
    };
    let press = conversation_action(pb::conversation_action::Action::BackgroundShellAction(
        pb::BackgroundShellAction {
            tool_call_id: "s1#s1".into(),
        },
    ));
    let (messages, end) = drive_sending(&mut run, &mut client, shell, vec![press]).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let forced: Vec<&pb::ForceBackgroundShellArgs> = client
        .execs
        .iter()
        .filter_map(|e| match &e.message {
            Some(pb::exec_server_message::Message::ForceBackgroundShellArgs(f)) => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(forced.len(), 1);
    assert_eq!(forced[0].tool_call_id, "s1#s1");
    let result = &tool_results(&provider, 1)[0];
    assert!(
        result.contains("[The user moved the command to the background: shell 1000, pid 4242;"),
        "{result}"
    );
    assert!(text_of(&messages).contains("runs in the background"));
    // The UI's shell call completed with a background result.
    let completed = updates(&messages)
        .into_iter()
        .find_map(|u| match u {
            Update::ToolCallCompleted(t) => t.tool_call.clone(),
            _ => None,
        })
        .unwrap();
    let Some(pb::tool_call::Tool::ShellToolCall(t)) = completed.tool else {
        panic!()
    };
    assert_eq!(t.result.unwrap().is_background, Some(true));
}

/// A background task's completion during a turn joins the next model call, and the
/// stored turn keeps it for the turns after.
#[tokio::test]
async fn a_completion_mid_turn_reaches_the_next_model_call_and_the_stored_turn() {
    let (provider, agent, _ws, mut client) = setup(vec![
        Reply::sse(tool_sse(&[(
            "s1",
            "run_terminal_cmd",
            r#"{"command":"echo hi"}"#,
        )])),
        Reply::sse(text_sse("Tests passed in the background.")),
        Reply::sse(text_sse("ok")),
    ])
    .await;
    let mut run = agent.start_run(run_request("go", true), "req-bg2".into());
    let shell = |m: &pb::AgentServerMessage| {
        is_exec(m, |e| {
            matches!(e, pb::exec_server_message::Message::ShellStreamArgs(_))
        })
    };
    let done = conversation_action(
        pb::conversation_action::Action::BackgroundTaskCompletionAction(shell_completion()),
    );
    let (messages, end) = drive_sending(&mut run, &mut client, shell, vec![done]).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let note = "Background shell 1000 finished successfully (npm test).";
    assert!(!request_text(&provider, 0).contains(note));
    assert!(
        request_text(&provider, 1).contains(note),
        "{}",
        request_text(&provider, 1)
    );
    assert!(request_text(&provider, 1).contains("/t/1000.txt"));
    assert!(
        injection_states(&messages).is_empty(),
        "no acknowledgement to send"
    );

    let mut next = run_request("and now?", true);
    next.conversation_state = client.checkpoint.clone();
    let mut run = agent.start_run(next, "req-bg3".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(request_text(&provider, 2).contains(note));
}

/// A completion that arrives with no turn running starts one: the model is told.
#[tokio::test]
async fn a_completion_between_turns_starts_a_turn_that_tells_the_model() {
    let (provider, agent, _ws, mut client) =
        setup(vec![Reply::sse(text_sse("Noted: the tests passed."))]).await;
    let req = action_request(
        pb::conversation_action::Action::BackgroundTaskCompletionAction(shell_completion()),
    );
    let mut run = agent.start_run(req, "req-bg4".into());
    let (messages, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(text_of(&messages).contains("Noted"));
    assert!(request_text(&provider, 0).contains("Background shell 1000 finished successfully"));
    assert!(client.checkpoint.is_some(), "the turn is stored");
}

/// A steer that is queued when the run is canceled, or fails, gets `cancelled`: the SDK stops
/// its timer on `queued` and would otherwise wait for ever.
#[tokio::test]
async fn a_queued_steer_is_cancelled_when_the_run_is_canceled_or_fails() {
    let ws = tempfile::tempdir().unwrap();
    let partial =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial answer\"}}]}\n\n";
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[(
            "s1",
            "run_terminal_cmd",
            r#"{"command":"sleep 100"}"#,
        )])),
        Reply::sse(partial)
            .chunked(8)
            .delay(Duration::from_millis(60))
            .then(After::Cut),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    client.shell_gate = Some(ws.path().join("never"));

    // Canceled during the tool round, the steer still waiting for the next model call.
    let mut run = agent.start_run(run_request("run it", false), "req-sc1".into());
    let shell = |m: &pb::AgentServerMessage| {
        is_exec(m, |e| {
            matches!(e, pb::exec_server_message::Message::ShellStreamArgs(_))
        })
    };
    let cancel = conversation_action(pb::conversation_action::Action::CancelAction(
        pb::CancelAction::default(),
    ));
    // The steer once the shell runs, the cancel once the steer is queued.
    let mut messages = Vec::new();
    let end = loop {
        let m = match run.output.recv().await.unwrap() {
            RunOutput::End(e) => break e,
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => m,
        };
        for a in client.respond(&m) {
            let _ = run.input.send(Box::new(a)).await;
        }
        if shell(&m) {
            run.input
                .send(Box::new(steer("inj-c", "", "use ls instead")))
                .await
                .unwrap();
        }
        let queued = injection_states(std::slice::from_ref(&m)) == [("inj-c".into(), "queued")];
        messages.push(*m);
        if queued {
            run.input.send(Box::new(cancel.clone())).await.unwrap();
        }
    };
    assert_eq!(end.error.expect("canceled").code, Code::Canceled);
    assert_eq!(
        injection_states(&messages),
        [
            ("inj-c".to_string(), "queued"),
            ("inj-c".to_string(), "cancelled")
        ]
    );

    // The provider fails mid-answer with the steer queued.
    let started = |m: &pb::AgentServerMessage| matches!(&m.message, Some(Server::InteractionUpdate(u)) if matches!(u.message, Some(Update::StepStarted(_))));
    let mut run = agent.start_run(run_request("hi", true), "req-sc2".into());
    let (messages, end) = drive_sending(
        &mut run,
        &mut client,
        started,
        vec![steer("inj-f", "", "x")],
    )
    .await;
    assert!(end.error.is_some(), "the run fails");
    let states = injection_states(&messages);
    assert_eq!(
        states.last(),
        Some(&("inj-f".to_string(), "cancelled")),
        "{states:?}"
    );
    assert!(states
        .iter()
        .all(|(_, s)| *s == "queued" || *s == "cancelled"));
}

/// A cancel while the answer streams (no tool round) stores what the user saw, marked as
/// interrupted: the next turn and a restarted proxy both send it to the model.
#[tokio::test]
async fn a_cancel_mid_answer_stores_the_partial_answer_marked_as_interrupted() {
    let partial =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The capital is Par\"}}]}\n\n";
    let provider = FakeProvider::start(vec![
        Reply::sse(partial).then(After::Trickle(Duration::from_millis(50))),
        Reply::sse(text_sse("Paris.")),
        Reply::sse(text_sse("Paris, again.")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut run = agent.start_run(run_request("capital of France?", true), "req-pa1".into());
    let text = |m: &pb::AgentServerMessage| !text_of(std::slice::from_ref(m)).is_empty();
    let cancel = conversation_action(pb::conversation_action::Action::CancelAction(
        pb::CancelAction::default(),
    ));
    let (messages, end) = drive_sending(&mut run, &mut client, text, vec![cancel]).await;
    assert_eq!(end.error.expect("canceled").code, Code::Canceled);
    assert_eq!(text_of(&messages), "The capital is Par");
    let cp = client
        .checkpoint
        .clone()
        .expect("the canceled turn is stored");
    assert_eq!(cp.turns.len(), 1);

    let check = |n: usize| {
        let body = provider.requests()[n].json();
        let msgs = body["messages"].as_array().unwrap().clone();
        let at = |role: &str, needle: &str| {
            msgs.iter()
                .position(|m| m["role"] == role && m["content"].to_string().contains(needle))
                .unwrap_or_else(|| panic!("no {role} message with {needle}: {body}"))
        };
        let question = at("user", "capital of France?");
        let answer = at("assistant", "The capital is Par");
        let next = at("user", "finish it");
        assert!(question < answer && answer < next, "{body}");
        assert!(
            msgs[answer]["content"]
                .to_string()
                .contains("Interrupted by the user"),
            "{body}"
        );
    };
    let mut next = run_request("finish it", true);
    next.conversation_state = Some(cp.clone());
    let mut run = agent.start_run(next.clone(), "req-pa2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    check(1);
    // A restarted proxy (an empty cache) rebuilds it from the client's blobs.
    let restarted = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut run = restarted.start_run(next, "req-pa3".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    check(2);
}

/// A steer the turn could not deliver (the tool-round limit ended it) is `queued_for_next_turn`
/// and recorded: the next turn carries it, unless that turn's message is the same text (the
/// SDK resends it as a follow-up), which is then read once.
#[tokio::test]
async fn a_steer_queued_for_the_next_turn_is_carried_once() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("r1", "read_file", r#"{"path":"a.txt"}"#)])),
        Reply::sse(text_sse("Checked b.txt too.")),
        Reply::sse(text_sse("Checking b.txt.")),
    ])
    .await;
    let mut cfg = (*config(&provider.base_url(), 5)).clone();
    cfg.agent.max_tool_rounds = 1;
    let agent = Agent::new(Arc::new(cfg)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    let read = |m: &pb::AgentServerMessage| {
        is_exec(m, |e| {
            matches!(e, pb::exec_server_message::Message::ReadArgs(_))
        })
    };
    let mut run = agent.start_run(run_request("read a.txt", false), "req-cq1".into());
    let (messages, end) = drive_sending(
        &mut run,
        &mut client,
        read,
        vec![steer("inj-q", "", "also check b.txt")],
    )
    .await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(
        injection_states(&messages),
        [
            ("inj-q".to_string(), "queued"),
            ("inj-q".to_string(), "queued_for_next_turn")
        ]
    );
    assert_eq!(provider.requests().len(), 1);
    let cp = client.checkpoint.clone().unwrap();

    // Another message next (after a restart: the record is in the client's blobs).
    let restarted = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut next = run_request("and then?", true);
    next.conversation_state = Some(cp.clone());
    let text = ask(&restarted, &mut client, &provider, next, 1).await;
    let (steer_at, next_at) = (
        text.find("also check b.txt").expect("carried"),
        text.find("and then?").unwrap(),
    );
    assert!(
        text.find("alpha").unwrap() < steer_at && steer_at < next_at,
        "{text}"
    );

    // The SDK's follow-up with the same text: read once.
    let mut resent = run_request("also check b.txt", true);
    resent.conversation_state = Some(cp);
    if let Some(pb::conversation_action::Action::UserMessageAction(a)) =
        resent.action.as_mut().and_then(|a| a.action.as_mut())
    {
        a.user_message.as_mut().unwrap().turn_steer = Some(true);
    }
    let text = ask(&agent, &mut client, &provider, resent, 2).await;
    assert_eq!(text.matches("also check b.txt").count(), 1, "{text}");
}

/// A plan made in plan mode with `create_plan` keeps its todos on the call, not in the plan's
/// text: Build seeds the todo list from that call.
#[tokio::test]
async fn build_seeds_the_todos_of_the_create_plan_call_that_wrote_the_plan() {
    let plan = "# Greeting\\nWrite hello.txt, then check it.";
    let args = format!(
        r#"{{"plan":"{plan}","name":"Greeting","todos":[{{"id":"t1","content":"Write hello.txt","status":"pending"}},{{"id":"t2","content":"Check it","status":"pending"}}]}}"#
    );
    let (provider, agent, _ws, mut client) = setup(vec![
        Reply::sse(tool_sse(&[("p1", "create_plan", &args)])),
        Reply::sse(text_sse("The plan is ready.")),
        Reply::sse(text_sse("Built.")),
    ])
    .await;
    let mut req = run_request("plan a greeting", true);
    if let Some(pb::conversation_action::Action::UserMessageAction(a)) =
        req.action.as_mut().and_then(|a| a.action.as_mut())
    {
        a.user_message.as_mut().unwrap().mode = pb::AgentMode::Plan as i32;
    }
    let mut run = agent.start_run(req, "req-bp1".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(client.checkpoint.as_ref().unwrap().todos.is_empty());

    let mut build = action_request(pb::conversation_action::Action::ExecutePlanAction(
        pb::ExecutePlanAction {
            plan: Some(pb::ConversationPlan {
                plan: plan.replace("\\n", "\n"),
            }),
            plan_id: Some("plan-g".into()),
            ..Default::default()
        },
    ));
    build.conversation_state = client.checkpoint.clone();
    let mut run = agent.start_run(build, "req-bp2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let cp = client.checkpoint.clone().unwrap();
    let todos: Vec<pb::TodoItem> = cp
        .todos
        .iter()
        .map(|t| {
            use prost::Message as _;
            let data = client
                .blobs
                .get(t.as_ref())
                .cloned()
                .expect("a stored todo");
            pb::TodoItem::decode(data).expect("a todo")
        })
        .collect();
    let contents: Vec<&str> = todos.iter().map(|t| t.content.as_str()).collect();
    assert_eq!(contents, ["Write hello.txt", "Check it"]);
    assert!(request_text(&provider, 2).contains("Implement the plan"));
}

/// `start_plan_action` with `is_spec` asks for a specification in plan mode; a later message
/// with `execute_plan_info` is shown to the model as being about that plan.
#[tokio::test]
async fn a_spec_request_and_a_message_about_a_plan_reach_the_model_as_such() {
    use pb::conversation_action::Action;
    let (provider, agent, _ws, mut client) = setup(vec![
        Reply::sse(text_sse("Spec.")),
        Reply::sse(text_sse("Ok.")),
    ])
    .await;
    let req = action_request(Action::StartPlanAction(pb::StartPlanAction {
        user_message: Some(pb::UserMessage {
            text: "a login page".into(),
            ..Default::default()
        }),
        is_spec: true,
        ..Default::default()
    }));
    let text = ask(&agent, &mut client, &provider, req, 0).await;
    assert!(
        text.contains("a login page") && text.contains("Write a specification"),
        "{text}"
    );
    let system = provider.requests()[0].json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(system.contains("Plan mode"), "{system}");

    let mut req = run_request("is step 2 done?", true);
    if let Some(Action::UserMessageAction(a)) = req.action.as_mut().and_then(|a| a.action.as_mut())
    {
        a.user_message.as_mut().unwrap().execute_plan_info = Some(pb::ExecutePlanInfo {
            plan_id: "plan-9".into(),
            plan_title: "Login page".into(),
        });
    }
    req.conversation_state = client.checkpoint.clone();
    let text = ask(&agent, &mut client, &provider, req, 1).await;
    assert!(
        text.contains("about the plan plan-9 Login page") && text.contains("is step 2 done?"),
        "{text}"
    );
}

/// Hooks (Cursor's `.cursor/hooks.json`) may add context for the model: on the user message
/// and on a tool's exec result. Both reach the model — the exec's at the next model call of the
/// turn, after the tool result — and the turn's record keeps the latter, so the next turn
/// reads the same.
#[tokio::test]
async fn hook_contexts_on_the_message_and_on_a_tool_result_reach_the_model() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hello.txt"), "hello world\n").unwrap();
    let provider = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[(
            "call_1",
            "read_file",
            r#"{"path":"hello.txt"}"#,
        )])),
        Reply::sse(text_sse("Read it.")),
        Reply::sse(text_sse("Again.")),
    ])
    .await;
    let agent = Agent::new(config(&provider.base_url(), 5)).unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut request = run_request("read the greeting", false);
    if let Some(pb::conversation_action::Action::UserMessageAction(a)) =
        request.action.as_mut().and_then(|a| a.action.as_mut())
    {
        a.user_message.as_mut().unwrap().hook_additional_contexts =
            vec![pb::HookAdditionalContext {
                hook_event_name: "beforeSubmitPrompt".into(),
                content: "PROMPT-HOOK: the repo is frozen.".into(),
            }];
    }
    let mut run = agent.start_run(request, "req-hooks".into());
    let (messages, end) = drive_mapped(&mut run, &mut client, |answer| {
        // The client's postToolUse hook speaks up on the read's result.
        if let Some(pb::agent_client_message::Message::ExecClientMessage(e)) =
            answer.message.as_mut()
        {
            if matches!(
                e.message,
                Some(pb::exec_client_message::Message::ReadResult(_))
            ) {
                e.hook_additional_contexts = vec![pb::HookAdditionalContext {
                    hook_event_name: "postToolUse".into(),
                    content: "TOOL-HOOK: hello.txt is generated.".into(),
                }];
            }
        }
    })
    .await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let reqs = provider.requests();
    let first = reqs[0].json().to_string();
    assert!(
        first.contains("<hook_context event=\\\"beforeSubmitPrompt\\\">")
            && first.contains("PROMPT-HOOK"),
        "{first}"
    );
    let second = reqs[1].json();
    let msgs = second["messages"].as_array().unwrap();
    let tool_at = msgs.iter().position(|m| m["role"] == "tool").unwrap();
    let after: String = msgs[tool_at + 1..].iter().map(|m| m.to_string()).collect();
    assert!(
        after.contains("<hook_context event=\\\"postToolUse\\\">") && after.contains("TOOL-HOOK"),
        "the tool hook follows the tool result: {msgs:?}"
    );

    // The next turn rebuilds the history from the record: the tool hook is still there.
    let checkpoint = messages
        .iter()
        .rev()
        .find_map(|m| match &m.message {
            Some(Server::ConversationCheckpointUpdate(c)) => Some(c.clone()),
            _ => None,
        })
        .expect("a checkpoint");
    let mut next = run_request("and now?", false);
    next.conversation_state = Some(checkpoint);
    let mut run = agent.start_run(next, "req-hooks-2".into());
    let (_, end) = drive_with(&mut run, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let third = provider.requests()[2].json().to_string();
    assert!(third.contains("TOOL-HOOK"), "{third}");
}
