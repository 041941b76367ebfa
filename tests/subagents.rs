//! Subagents without HTTP on Cursor's side: the test plays Cursor's client, which answers
//! `subagent_args` by starting the child as a run of its own on the same agent (as the SDK
//! does), and answers the parent's exec with the child's final message.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::fake_cursor::{first_subagent_args, FakeCursor};
use common::fake_provider::{text_sse, tool_results, tool_sse, After, FakeProvider, Reply};
use cursor_byok::agent::{Agent, RunHandle, RunOutput};
use cursor_byok::config::Config;
use cursor_byok::connect::EndStream;
use cursor_byok::proto::agent::v1 as pb;
use pb::agent_server_message::Message as Server;
use pb::exec_server_message::Message as Exec;
use pb::interaction_update::Message as Update;

/// The parent's model on one provider, the subagent model on another, so each side's
/// requests can be told apart.
fn config(parent: &str, child: &str, max_parallel: u32) -> Arc<Config> {
    let dir = tempfile::tempdir().unwrap().keep();
    let text = format!(
        "data_dir = \"{}\"\n[agent]\nkv_timeout_secs = 5\nprovider_max_retries = 0\nmax_parallel_subagents = {max_parallel}\n\
         [providers.parent]\nkind = \"openai-chat\"\nbase_url = \"{parent}\"\napi_key = \"sk-test-parent\"\n\
         [providers.child]\nkind = \"openai-chat\"\nbase_url = \"{child}\"\napi_key = \"sk-test-child\"\n\
         [[models]]\nid = \"parent-model\"\nprovider = \"parent\"\nmodel = \"gpt-parent\"\n\
         [[models]]\nid = \"child-model\"\nprovider = \"child\"\nmodel = \"gpt-child\"\n",
        dir.display()
    );
    Arc::new(Config::from_toml(&text, "test").unwrap())
}

/// A parent turn whose explore subagents use the child model.
fn parent_request(text: &str) -> pb::AgentRunRequest {
    pb::AgentRunRequest {
        conversation_id: Some("conv-parent".into()),
        requested_model: Some(pb::RequestedModel {
            model_id: "byok-parent-model".into(),
            ..Default::default()
        }),
        subagent_model_overrides: vec![pb::SubagentModelOverride {
            subagent_type: "explore".into(),
            selection: Some(pb::subagent_model_override::Selection::Model(
                pb::RequestedModel {
                    model_id: "byok-child-model".into(),
                    ..Default::default()
                },
            )),
        }],
        action: Some(user_action(text)),
        ..Default::default()
    }
}

fn user_action(text: &str) -> pb::ConversationAction {
    common::fake_cursor::user_message_action(text, None)
}

/// The run Cursor's client starts for `subagent_args`: a new conversation, the prompt as
/// the user message, the model in `model_details` only.
fn child_request(a: &pb::SubagentArgs, n: &str) -> pb::AgentRunRequest {
    pb::AgentRunRequest {
        conversation_id: Some(format!("conv-child-{n}")),
        model_details: Some(pb::ModelDetails {
            model_id: a.model_id.clone(),
            ..Default::default()
        }),
        action: Some(user_action(&a.prompt)),
        ..Default::default()
    }
}

fn text_of(messages: &[pb::AgentServerMessage]) -> String {
    messages
        .iter()
        .filter_map(|m| match &m.message {
            Some(Server::InteractionUpdate(pb::InteractionUpdate {
                message: Some(Update::TextDelta(t)),
                ..
            })) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// What the parent's stream showed, in order.
#[derive(Debug, PartialEq)]
enum Seen {
    SubagentArgs(pb::SubagentArgs),
    Completed(pb::ToolCall),
    ForceBackground(String),
}

/// Drive the parent like Cursor's client; each `subagent_args` starts a child run, driven
/// concurrently, whose final text comes back as `subagent_result` (at once with its id when
/// it runs in the background; `subagent_await_args` then waits for it).
async fn drive_parent(
    agent: &Agent,
    handle: &mut RunHandle,
) -> (Vec<pb::AgentServerMessage>, Vec<Seen>, EndStream) {
    drive(agent, handle, "").await
}

/// [`drive_parent`] for a run labelled `label`: its children are `{label}1`, `{label}2`…
async fn drive(
    agent: &Agent,
    handle: &mut RunHandle,
    label: &str,
) -> (Vec<pb::AgentServerMessage>, Vec<Seen>, EndStream) {
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut messages = Vec::new();
    let mut seen = Vec::new();
    let mut children = 0;
    let mut background: HashMap<String, tokio::task::JoinHandle<ChildEnd>> = HashMap::new();
    // Foreground calls by tool call id: (exec id, exec_id, agent id), to move one.
    let mut foreground: HashMap<String, (u32, String, String)> = HashMap::new();
    loop {
        let out = tokio::time::timeout(Duration::from_secs(20), handle.output.recv())
            .await
            .expect("the parent must not hang")
            .expect("the parent must end with an End");
        let m = match out {
            RunOutput::End(end) => return (messages, seen, end),
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => m,
        };
        match &m.message {
            Some(Server::ExecServerMessage(pb::ExecServerMessage {
                id,
                exec_id,
                message: Some(Exec::SubagentArgs(a)),
                ..
            })) => {
                children += 1;
                seen.push(Seen::SubagentArgs(a.clone()));
                let (agent, input) = (agent.clone(), handle.input.clone());
                let (a, id, exec_id) = (a.clone(), *id, exec_id.clone());
                let n = format!("{label}{children}");
                let agent_id = format!("agent-{n}");
                if a.run_in_background == Some(true) {
                    let now = pb::subagent_result::Result::Success(pb::SubagentSuccess {
                        agent_id: agent_id.clone(),
                        background_reason: pb::SubagentBackgroundReason::AgentRequest as i32,
                        ..Default::default()
                    });
                    for reply in answer(id, &exec_id, subagent_result(now)) {
                        let _ = input.send(Box::new(reply)).await;
                    }
                    let child = tokio::spawn(run_child(&agent, &a, n));
                    background.insert(agent_id, child);
                    messages.push(*m);
                    continue;
                }
                foreground.insert(
                    a.tool_call_id.clone(),
                    (id, exec_id.clone(), agent_id.clone()),
                );
                tokio::spawn(async move {
                    let end = run_child(&agent, &a, n).await;
                    let result = subagent_result(end.result(&agent_id));
                    for reply in answer(id, &exec_id, result) {
                        let _ = input.send(Box::new(reply)).await;
                    }
                });
            }
            Some(Server::ExecServerMessage(pb::ExecServerMessage {
                id,
                exec_id,
                message: Some(Exec::SubagentAwaitArgs(w)),
                ..
            })) => {
                use pb::subagent_await_result::Result as A;
                let result = match background.remove(&w.agent_id) {
                    Some(child) => {
                        let end = child.await.unwrap();
                        A::Complete(pb::SubagentAwaitComplete {
                            agent_id: w.agent_id.clone(),
                            final_message: Some(end.text),
                            tool_call_count: 0,
                            transcript_path: None,
                        })
                    }
                    None => A::NotFound(pb::SubagentAwaitNotFound {
                        agent_id: w.agent_id.clone(),
                    }),
                };
                let result = pb::exec_client_message::Message::SubagentAwaitResult(
                    pb::SubagentAwaitResult {
                        result: Some(result),
                    },
                );
                for reply in answer(*id, exec_id, result) {
                    let _ = handle.input.send(Box::new(reply)).await;
                }
            }
            Some(Server::ExecServerMessage(pb::ExecServerMessage {
                id,
                exec_id,
                message: Some(Exec::ForceBackgroundSubagentArgs(f)),
                ..
            })) => {
                seen.push(Seen::ForceBackground(f.tool_call_id.clone()));
                let status = match foreground.remove(&f.tool_call_id) {
                    Some((call_id, call_exec, agent_id)) => {
                        let moved = pb::subagent_result::Result::Success(pb::SubagentSuccess {
                            agent_id,
                            background_reason: pb::SubagentBackgroundReason::UserRequest as i32,
                            ..Default::default()
                        });
                        for reply in answer(call_id, &call_exec, subagent_result(moved)) {
                            let _ = handle.input.send(Box::new(reply)).await;
                        }
                        pb::ForceBackgroundSubagentStatus::Accepted
                    }
                    None => pb::ForceBackgroundSubagentStatus::NotFound,
                };
                let result = pb::exec_client_message::Message::ForceBackgroundSubagentResult(
                    pb::ForceBackgroundSubagentResult {
                        status: status as i32,
                    },
                );
                for reply in answer(*id, exec_id, result) {
                    let _ = handle.input.send(Box::new(reply)).await;
                }
            }
            Some(Server::InteractionUpdate(pb::InteractionUpdate {
                message: Some(Update::ToolCallCompleted(t)),
                ..
            })) => seen.push(Seen::Completed(t.tool_call.clone().unwrap_or_default())),
            _ => {
                for answer in client.respond(&m) {
                    let _ = handle.input.send(Box::new(answer)).await;
                }
            }
        }
        messages.push(*m);
    }
}

/// How a child run ended: its text, and its error if it failed.
struct ChildEnd {
    text: String,
    error: Option<String>,
}

impl ChildEnd {
    fn result(&self, agent_id: &str) -> pb::subagent_result::Result {
        match &self.error {
            None => pb::subagent_result::Result::Success(pb::SubagentSuccess {
                agent_id: agent_id.into(),
                final_message: Some(self.text.clone()),
                ..Default::default()
            }),
            Some(e) => pb::subagent_result::Result::Error(pb::SubagentError {
                agent_id: Some(agent_id.into()),
                error: e.clone(),
            }),
        }
    }
}

/// The child run for `a`, to its end.
/// The child run for `a`, to its end; it is driven like its parent, so it may start
/// subagents of its own.
fn run_child(agent: &Agent, a: &pb::SubagentArgs, label: String) -> ChildFuture {
    let (agent, request) = (agent.clone(), child_request(a, &label));
    Box::pin(async move {
        let mut child = agent.start_run(request, format!("req-child-{label}"));
        let (messages, _, end) = drive(&agent, &mut child, &label).await;
        ChildEnd {
            text: text_of(&messages),
            error: end.error.map(|e| e.message),
        }
    })
}

/// Boxed: a child's driver runs children of its own, so the future's type would contain itself.
type ChildFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ChildEnd> + Send>>;

fn subagent_result(r: pb::subagent_result::Result) -> pb::exec_client_message::Message {
    pb::exec_client_message::Message::SubagentResult(pb::SubagentResult { result: Some(r) })
}

/// An exec's result, then its close.
fn answer(
    id: u32,
    exec_id: &str,
    result: pb::exec_client_message::Message,
) -> Vec<pb::AgentClientMessage> {
    use pb::agent_client_message::Message as In;
    let close =
        pb::exec_client_control_message::Message::StreamClose(pb::ExecClientStreamClose { id });
    vec![
        pb::AgentClientMessage {
            message: Some(In::ExecClientMessage(pb::ExecClientMessage {
                id,
                exec_id: exec_id.into(),
                message: Some(result),
                ..Default::default()
            })),
        },
        pb::AgentClientMessage {
            message: Some(In::ExecClientControlMessage(pb::ExecClientControlMessage {
                message: Some(close),
            })),
        },
    ]
}

fn tool_names(req: &serde_json::Value) -> Vec<String> {
    req["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["function"]["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_subagent_runs_as_a_recognised_restricted_child_and_its_answer_is_the_tool_result() {
    let call = r#"{"description":"find the answer","prompt":"Find where the answer is kept.","subagent_type":"explore"}"#;
    let parent = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("call_t", "task", call)])),
        Reply::sse(text_sse("The subagent says: the answer is 42.")),
    ])
    .await;
    let child = FakeProvider::start(vec![Reply::sse(text_sse(
        "The answer is 42, in src/answer.rs.",
    ))])
    .await;
    let agent = Agent::new(config(&parent.base_url(), &child.base_url(), 4)).unwrap();
    let mut run = agent.start_run(parent_request("Where is the answer?"), "req-parent".into());
    let (messages, seen, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);

    let Seen::SubagentArgs(a) = &seen[0] else {
        panic!("subagent_args first: {seen:?}")
    };
    assert_eq!(a.subagent_type, "explore");
    assert_eq!(a.model_id, "byok-child-model", "the override for explore");
    assert!(a.readonly);
    assert_eq!(a.prompt, "Find where the answer is kept.");
    assert_eq!(a.parent_conversation_id.as_deref(), Some("conv-parent"));
    assert!(a.tool_call_id.starts_with("call_t"));

    // The child ran on the child model, read-only, told it is a subagent.
    let creq = child.requests()[0].json();
    let names = tool_names(&creq);
    assert!(names.contains(&"read_file".to_string()), "{names:?}");
    for gone in ["write", "search_replace", "delete_file", "run_terminal_cmd"] {
        assert!(
            !names.contains(&gone.to_string()),
            "{gone} offered to a read-only child: {names:?}"
        );
    }
    assert!(creq["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("<subagent>"));
    // The parent, at depth 0, had the tool; a child at depth 1 still has it (bound is 2).
    assert!(tool_names(&parent.requests()[0].json()).contains(&"task".to_string()));

    // The child's final message is the parent's tool result; the UI got the typed task call.
    let results = tool_results(&parent, 1);
    assert!(
        results[0].contains("The answer is 42, in src/answer.rs."),
        "{results:?}"
    );
    let Seen::Completed(tc) = &seen[1] else {
        panic!("then the completed call: {seen:?}")
    };
    let Some(pb::tool_call::Tool::TaskToolCall(t)) = &tc.tool else {
        panic!("a task tool call: {tc:?}")
    };
    assert!(matches!(
        t.result.as_ref().and_then(|r| r.result.as_ref()),
        Some(pb::task_result::Result::Success(s)) if s.agent_id.as_deref() == Some("agent-1")
    ));
    assert_eq!(text_of(&messages), "The subagent says: the answer is 42.");
}

fn two_calls() -> String {
    let one = r#"{"prompt":"Look at module one.","subagent_type":"explore"}"#;
    let two = r#"{"prompt":"Look at module two.","subagent_type":"explore"}"#;
    tool_sse(&[("call_a", "task", one), ("call_b", "task", two)])
}

async fn two_subagents(max_parallel: u32) -> (Vec<Seen>, Vec<String>) {
    let parent = FakeProvider::start(vec![
        Reply::sse(two_calls()),
        Reply::sse(text_sse("Both looked.")),
    ])
    .await;
    let child = FakeProvider::start(vec![
        Reply::sse(text_sse("Module report.")),
        Reply::sse(text_sse("Module report.")),
    ])
    .await;
    let agent = Agent::new(config(&parent.base_url(), &child.base_url(), max_parallel)).unwrap();
    let mut run = agent.start_run(parent_request("Look at both modules"), "req-p2".into());
    let (_, seen, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(child.requests().len(), 2);
    (seen, tool_results(&parent, 1))
}

fn kinds(seen: &[Seen]) -> Vec<&'static str> {
    seen.iter()
        .map(|s| match s {
            Seen::SubagentArgs(_) => "args",
            Seen::Completed(_) => "done",
            Seen::ForceBackground(_) => "force",
        })
        .collect()
}

#[tokio::test]
async fn two_subagents_of_one_turn_run_side_by_side_up_to_the_limit() {
    let (seen, results) = two_subagents(4).await;
    let order = kinds(&seen);
    assert_eq!(
        order,
        ["args", "args", "done", "done"],
        "both started before either ended"
    );
    assert_eq!(results.len(), 2);
    assert!(
        results.iter().all(|r| r.contains("Module report.")),
        "{results:?}"
    );

    let (seen, _) = two_subagents(1).await;
    let order = kinds(&seen);
    assert_eq!(
        order,
        ["args", "done", "args", "done"],
        "one at a time with a limit of 1"
    );
}

#[tokio::test]
async fn a_background_subagent_returns_its_id_at_once_and_await_brings_its_answer() {
    let call =
        r#"{"prompt":"Survey the tests.","subagent_type":"explore","run_in_background":true}"#;
    let parent = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("call_bg", "task", call)])),
        Reply::sse(tool_sse(&[(
            "call_w",
            "await_subagent",
            r#"{"agent_id":"agent-1"}"#,
        )])),
        Reply::sse(text_sse("Survey done.")),
    ])
    .await;
    let child = FakeProvider::start(vec![Reply::sse(text_sse("Tests: 12 files."))]).await;
    let agent = Agent::new(config(&parent.base_url(), &child.base_url(), 4)).unwrap();
    let mut run = agent.start_run(parent_request("Survey the tests"), "req-bg".into());
    let (_, seen, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let Seen::SubagentArgs(a) = &seen[0] else {
        panic!("{seen:?}")
    };
    assert_eq!(a.run_in_background, Some(true));
    let first = tool_results(&parent, 1);
    assert!(
        first[0].contains("agent-1") && first[0].contains("running in the background"),
        "{first:?}"
    );
    let awaited = tool_results(&parent, 2);
    assert!(awaited[1].contains("Tests: 12 files."), "{awaited:?}");
}

/// A child whose model never answers, and a parent that calls it and then answers; `action`
/// goes to the parent once the child's model call is under way.
async fn with_a_stuck_child(
    action: pb::conversation_action::Action,
) -> (Vec<Seen>, Vec<String>, Arc<FakeProvider>) {
    let call = r#"{"prompt":"Think forever.","subagent_type":"explore"}"#;
    let parent = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("call_fg", "task", call)])),
        Reply::sse(text_sse("Moving on.")),
    ])
    .await;
    let child = Arc::new(FakeProvider::start(vec![Reply::sse("").then(After::Stall)]).await);
    let agent = Agent::new(config(&parent.base_url(), &child.base_url(), 4)).unwrap();
    let mut run = agent.start_run(parent_request("Start it"), "req-stuck".into());
    let input = run.input.clone();
    let probe = child.clone();
    tokio::spawn(async move {
        // Once the child's model call is under way (a timeout lets the asserts below say so).
        probe.wait_requests(1, Duration::from_secs(60)).await;
        let msg = pb::AgentClientMessage {
            message: Some(pb::agent_client_message::Message::ConversationAction(
                pb::ConversationAction {
                    action: Some(action),
                    ..Default::default()
                },
            )),
        };
        let _ = input.send(Box::new(msg)).await;
    });
    let (_, seen, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let results = tool_results(&parent, 1);
    (seen, results, child)
}

#[tokio::test]
async fn cancel_subagent_action_stops_the_child_and_the_parent_hears_of_it() {
    let cancel = pb::conversation_action::Action::CancelSubagentAction(pb::CancelSubagentAction {
        subagent_id: "conv-child-1".into(),
    });
    let (_, results, child) = with_a_stuck_child(cancel).await;
    assert!(results[0].contains("The subagent failed"), "{results:?}");
    assert!(
        child.wait_hangups(1, Duration::from_secs(5)).await,
        "the child's model call stopped"
    );
}

#[tokio::test]
async fn background_subagent_action_moves_the_running_call_to_the_background() {
    let bg =
        pb::conversation_action::Action::BackgroundSubagentAction(pb::BackgroundSubagentAction {
            tool_call_id: "call_fg#s1".into(),
        });
    let (seen, results, _) = with_a_stuck_child(bg).await;
    assert!(
        seen.contains(&Seen::ForceBackground("call_fg#s1".into())),
        "{seen:?}"
    );
    assert!(
        results[0].contains("running in the background"),
        "{results:?}"
    );
}

fn last_checkpoint(messages: &[pb::AgentServerMessage]) -> pb::ConversationStateStructure {
    messages
        .iter()
        .rev()
        .find_map(|m| match &m.message {
            Some(Server::ConversationCheckpointUpdate(s)) => Some(s.clone()),
            _ => None,
        })
        .expect("a checkpoint")
}

#[tokio::test]
async fn the_checkpoint_keeps_background_subagents_and_the_next_turn_is_told_of_them() {
    let call = r#"{"description":"survey","prompt":"Survey the tests.","subagent_type":"explore","run_in_background":true}"#;
    let parent = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("call_bg", "task", call)])),
        Reply::sse(text_sse("Started it.")),
        Reply::sse(text_sse("Still waiting on it.")),
        Reply::sse(text_sse("The survey is done.")),
    ])
    .await;
    let child = FakeProvider::start(vec![Reply::sse(text_sse("Tests: 12 files."))]).await;
    let agent = Agent::new(config(&parent.base_url(), &child.base_url(), 4)).unwrap();
    let mut run = agent.start_run(parent_request("Survey the tests"), "req-t1".into());
    let (messages, _, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let state = last_checkpoint(&messages);
    let recorded = &state.subagent_runs_by_parent_tool_call_id["call_bg#s1"];
    assert_eq!(recorded.subagent_id.as_deref(), Some("agent-1"));
    assert_eq!(recorded.status, pb::SubagentRunStatus::Backgrounded as i32);
    assert_eq!(recorded.title.as_deref(), Some("survey"));
    assert_eq!(
        state.subagent_states["agent-1"].model_id.as_deref(),
        Some("byok-child-model")
    );

    let mut next = parent_request("Is it done?");
    next.conversation_state = Some(state);
    let mut run = agent.start_run(next, "req-t2".into());
    let (turn2, _, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let system = parent.requests()[2].json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains("<background_subagents>") && system.contains("- agent-1: survey"),
        "{system}"
    );

    // The client reports it finished: the model is told, and the checkpoint no longer lists
    // it as running, so later turns are not told to wait for it.
    let state = last_checkpoint(&turn2);
    let mut done = parent_request("");
    done.conversation_state = Some(state);
    done.action = Some(pb::ConversationAction {
        action: Some(
            pb::conversation_action::Action::BackgroundTaskCompletionAction(
                pb::BackgroundTaskCompletionAction {
                    completions: vec![pb::BackgroundTaskCompletion {
                        task_id: "agent-1".into(),
                        subagent_id: Some("agent-1".into()),
                        kind: pb::BackgroundTaskKind::Subagent as i32,
                        status: pb::BackgroundTaskStatus::Success as i32,
                        title: "survey".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ),
        ),
        ..Default::default()
    });
    let mut run = agent.start_run(done, "req-t3".into());
    let (messages, _, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let note = parent.requests()[3].json().to_string();
    assert!(note.contains("survey"), "the model is told: {note}");
    let state = last_checkpoint(&messages);
    assert_eq!(
        state.subagent_runs_by_parent_tool_call_id["call_bg#s1"].status,
        pb::SubagentRunStatus::Success as i32
    );
    assert!(state.subagent_runs_by_parent_tool_call_id["call_bg#s1"]
        .completed_timestamp_ms
        .is_some());
}

#[tokio::test]
async fn nesting_is_bounded_the_grandchild_gets_no_subagent_tool() {
    let level1 = r#"{"prompt":"Level one.","subagent_type":"explore"}"#;
    let level2 = r#"{"prompt":"Level two.","subagent_type":"explore"}"#;
    let parent = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("call_1", "task", level1)])),
        Reply::sse(text_sse("Top done.")),
    ])
    .await;
    // In order: the child's call, the grandchild's answer, the child's answer.
    let child = FakeProvider::start(vec![
        Reply::sse(tool_sse(&[("call_2", "task", level2)])),
        Reply::sse(text_sse("Deep answer.")),
        Reply::sse(text_sse("Middle answer.")),
    ])
    .await;
    let agent = Agent::new(config(&parent.base_url(), &child.base_url(), 4)).unwrap();
    let mut run = agent.start_run(parent_request("Go deep"), "req-deep".into());
    let (_, _, end) = drive_parent(&agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let offered = |n: usize| tool_names(&child.requests()[n].json());
    assert!(
        offered(0).contains(&"task".to_string()),
        "depth 1 may delegate"
    );
    assert!(
        !offered(1).contains(&"task".to_string()),
        "depth 2 may not: {:?}",
        offered(1)
    );
    assert!(tool_results(&child, 2)[0].contains("Deep answer."));
    assert!(tool_results(&parent, 1)[0].contains("Middle answer."));
}

/// The first request of the run `request` on `provider`, run to its end.
async fn tools_of_run(
    agent: &Agent,
    request: cursor_byok::agent::RunRequest,
    provider: &FakeProvider,
) -> Vec<String> {
    let before = provider.requests().len();
    let mut run = agent.start_run(request, "req-look".into());
    let (_, _, end) = drive_parent(agent, &mut run).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    tool_names(&provider.requests()[before].json())
}

/// What tells a child from the user's own run: a client that names the parent call
/// (`x-parent-agent-tool-call-id`, carried as `parent_tool_call_id`) is believed whatever the
/// prompt; without it, a run with the same prompt and model is the child only when it starts a
/// conversation of its own — one that already has turns is the user's, with every tool.
#[tokio::test]
async fn a_child_is_told_by_the_parents_call_id_and_a_look_alike_conversation_is_not_one() {
    let call = r#"{"description":"look","prompt":"Find where the answer is kept.","subagent_type":"explore"}"#;
    let parent = FakeProvider::start(vec![Reply::sse(tool_sse(&[("call_t", "task", call)]))]).await;
    let child = FakeProvider::start(vec![
        Reply::sse(text_sse("A user's answer.")),
        Reply::sse(text_sse("The child's answer.")),
    ])
    .await;
    let agent = Agent::new(config(&parent.base_url(), &child.base_url(), 4)).unwrap();
    let mut run = agent.start_run(parent_request("Where is the answer?"), "req-parent".into());
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let a = first_subagent_args(&mut run, &mut client).await;

    // The same prompt and model, in a conversation that already has a turn: the user's.
    let mut look_alike = child_request(&a, "user");
    look_alike.conversation_state = Some(pb::ConversationStateStructure {
        turns: vec![bytes::Bytes::from_static(b"earlier turn")],
        ..Default::default()
    });
    let names = tools_of_run(&agent, look_alike.into(), &child).await;
    assert!(
        names.contains(&"write".to_string()),
        "not a child: {names:?}"
    );

    // A different prompt (the client may word it its own way), but the call named.
    let mut named = child_request(&a, "named");
    named.action = Some(user_action("Task: find it."));
    let request = cursor_byok::agent::RunRequest {
        parent: cursor_byok::agent::subagents::ParentLink::new(None, Some(&a.tool_call_id)),
        ..named.into()
    };
    let names = tools_of_run(&agent, request, &child).await;
    assert!(
        names.contains(&"read_file".to_string()) && !names.contains(&"write".to_string()),
        "the named child runs read-only: {names:?}"
    );
}
