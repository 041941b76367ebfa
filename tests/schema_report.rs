//! Nothing unnoticed: a run whose client messages carry fields and a oneof branch this build
//! does not know completes; the status JSON and `doctor` list them; each kind is logged once.
//! A conversation action this build does not know ends the run with an error naming it.
//! (Its own test binary: it installs the global tracing subscriber.)

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::Duration;

use bytes::Bytes;
use common::agent_client::{frame, play, run_request, Sink, Store};
use common::fake_provider::Reply;
use common::logs::Logs;
use cursor_byok::config::Config;
use cursor_byok::connect::Code;
use cursor_byok::setup::doctor::{self, Level};
use harness::{config_text, h2_conn, harness, run_with_headers, OURS, TEXT, TEXT_SSE};
use prost::Message as _;

fn len_field(number: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, &mut v);
    prost::encoding::encode_varint(data.len() as u64, &mut v);
    v.extend_from_slice(data);
    v
}

/// A Connect frame holding `message` as is.
fn raw_frame(message: &[u8]) -> Bytes {
    cursor_byok::connect::encode_frame(0, message).unwrap()
}

/// Our run request with an unknown field 200 in `AgentRunRequest`, then an unknown
/// `AgentClientMessage` branch (9) and a client heartbeat with an unknown field (5).
fn crafted_first(conversation: &str) -> Bytes {
    let run = run_request(OURS, conversation, "hi", true);
    let Some(cursor_byok::proto::agent::v1::agent_client_message::Message::RunRequest(r)) =
        run.message
    else {
        unreachable!()
    };
    let request = [r.encode_to_vec(), len_field(200, b"new request field")].concat();
    let heartbeat = len_field(7, &len_field(5, b"beat"));
    [
        raw_frame(&len_field(1, &request)),
        raw_frame(&len_field(9, b"a new kind of client message")),
        raw_frame(&heartbeat),
    ]
    .concat()
    .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_and_branches_are_reported_once_and_runs_complete() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let h = harness(vec![Reply::sse(TEXT_SSE), Reply::sse(TEXT_SSE)], |_| {}).await;
    let door = h.connect_door();
    let conn = h2_conn(&door).await;
    let version = [("x-cursor-client-version", "3.24.1")];
    // Twice: the second run must not log again.
    for i in 0..2 {
        let store = Store::default();
        let first = crafted_first(&format!("conv-drift-{i}"));
        let mut run =
            run_with_headers(&conn, &door, &format!("req-drift-{i}"), &version, first).await;
        let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
        assert!(t.end().error.is_none(), "{:?}", t.end().error);
        assert_eq!(t.text(), TEXT);
    }

    let report = h.server.status().snapshot().unknown;
    let keys: Vec<(&str, &str)> = report
        .items
        .iter()
        .map(|i| (i.kind.as_str(), i.key.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            ("field", "AgentRunRequest.200"),
            ("oneof branch", "AgentClientMessage.9"),
            ("field", "ClientHeartbeat.5"),
        ]
    );
    assert_eq!(
        report.summary,
        "Cursor 3.24.1 sent 3 things this version does not know"
    );
    assert!(report.items.iter().all(|i| i.count == 2), "{report:?}");

    // The status JSON carries it (what the page and doctor read).
    let json = serde_json::to_value(h.server.status().snapshot()).unwrap();
    assert_eq!(json["unknown"]["items"][1]["key"], "AgentClientMessage.9");

    // doctor, against the running proxy.
    let mut config = Config::from_toml(&config_text("http://127.0.0.1:9", "sk-x"), "t").unwrap();
    config.listen = h.server.proxy_addr();
    let checks = doctor::check_running(&config).await;
    assert_eq!(checks.len(), 2, "{checks:?}");
    let schema = &checks[1];
    assert_eq!(schema.level, Level::Warn);
    let line = schema.to_string();
    assert!(
        line.contains("Cursor 3.24.1 sent 3 things this version does not know")
            && line.contains("AgentClientMessage.9")
            && line.contains("update cursor-byok"),
        "{line}"
    );

    // One warning per kind, with the client version, across both runs.
    let text = logs.text();
    for key in [
        "AgentRunRequest.200",
        "AgentClientMessage.9",
        "ClientHeartbeat.5",
    ] {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(key) && l.contains("WARN"))
            .collect();
        assert_eq!(lines.len(), 1, "{key}: {lines:#?}");
        assert!(lines[0].contains("Cursor 3.24.1"), "{}", lines[0]);
    }
}

/// Our run, then `extra` (an encoded `AgentClientMessage`) on the same stream: the run must
/// end with an error naming `key` and `what`, not hang nor continue.
async fn unknown_branch_ends_the_run(extra: Vec<u8>, key: &str, what: &str) {
    let slow = Reply::sse(TEXT_SSE)
        .chunked(16)
        .delay(Duration::from_millis(100));
    let h = harness(vec![slow], |_| {}).await;
    let door = h.connect_door();
    let conn = h2_conn(&door).await;
    let first: Bytes = [
        frame(&run_request(OURS, "conv-branch", "hi", true)),
        raw_frame(&extra),
    ]
    .concat()
    .into();
    let mut run = run_with_headers(&conn, &door, "req-branch", &[], first).await;
    let t = tokio::time::timeout(
        Duration::from_secs(20),
        play(&mut run.stream, Sink::H2(&run.tx), &Store::default()),
    )
    .await
    .expect("the run ends, it does not hang");
    let err = t.end().error.clone().expect("an error end frame");
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(
        err.message.contains(key) && err.message.contains(what),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_conversation_action_ends_the_run_naming_it() {
    let action = len_field(4, &len_field(20, b"a new action"));
    unknown_branch_ends_the_run(action, "ConversationAction.20", "conversation action").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_exec_result_ends_the_run_naming_it() {
    let mut exec = vec![0x08, 0x01]; // id 1
    exec.extend(len_field(58, b"a new result"));
    unknown_branch_ends_the_run(len_field(2, &exec), "ExecClientMessage.58", "exec result").await;
}

const SECRET_KEY: &str = "sk-test-CAPTURE-SECRET-key-123";
const FILE_BODY: &str = "FILE-BODY-the-answer-is-42";
const PROMPT: &str = "PROMPT-what-does-secret-txt-say";
const FILE_NAME: &str = "capture-secret-name.txt";

fn tool_call_sse(id: &str, name: &str, args: &str) -> Reply {
    let start = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":id,"type":"function","function":{"name":name,"arguments":""}}]}}]});
    let body = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":args}}]}}]});
    Reply::sse(format!(
        "data: {start}\n\ndata: {body}\n\n\
         data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"tool_calls\"}}]}}\n\n\
         data: [DONE]\n\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_records_the_run_without_secrets_file_bodies_or_prompts() {
    use common::agent_client::{H2Run, Received};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capture.jsonl");
    let capture = cursor_byok::capture::Capture::create(&path, Some(10), false).unwrap();
    let status = cursor_byok::status::Status::with_capture(Some(capture));
    let replies = vec![
        tool_call_sse("r1", "read_file", &format!(r#"{{"path":"{FILE_NAME}"}}"#)),
        Reply::sse(TEXT_SSE),
    ];
    let h = harness::harness_with_status(replies, SECRET_KEY, status, |_| {}).await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join(FILE_NAME), FILE_BODY).unwrap();
    let mut client = common::fake_cursor::FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-capture", PROMPT, false);
    let H2Run { tx, mut stream } = H2Run::open(&h.connect_door(), "req-capture", &first).await;
    let end = loop {
        match stream.next().await.expect("an end frame") {
            Received::End(end) => break end,
            Received::Message(m) => {
                for answer in client.respond(&m) {
                    let _ = tx.send(frame(&answer)).await;
                }
            }
        }
    };
    assert!(end.error.is_none(), "{:?}", end.error);
    // The secrets were in play: the provider saw the key, the file body and the prompt.
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 2);
    let second = String::from_utf8_lossy(&requests[1].body).into_owned();
    assert!(
        second.contains(FILE_BODY) && second.contains(PROMPT),
        "{second}"
    );

    let text = std::fs::read_to_string(&path).unwrap();
    for secret in [
        SECRET_KEY,
        FILE_BODY,
        PROMPT,
        FILE_NAME,
        "cursor-session-token",
    ] {
        assert!(!text.contains(secret), "the capture contains {secret:?}");
    }
    assert!(!text.contains(&ws.path().display().to_string()), "a path");
    // What it does record: both directions, shapes, the client version, timings, the end.
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["capture"], "cursor-byok");
    assert!(lines.iter().any(|l| l["dir"] == "client->proxy"
        && l["client_version"] == "2.0.0-test"
        && l["shape"].to_string().contains("run_request")));
    assert!(lines
        .iter()
        .any(|l| l["dir"] == "proxy->client"
            && l["shape"].to_string().contains("exec_server_message")));
    assert!(lines.iter().any(|l| l["end"] == "ok"));
    assert!(lines.iter().all(|l| l.get("t_ms").is_some()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknowns_over_run_sse_and_bidi_append_are_reported_and_the_run_completes() {
    use common::agent_client::Bidi;
    use cursor_byok::proto::aiserver::v1 as ai;
    let h = harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    let bidi = Bidi::new(&h.connect_door(), "req-drift-sse");
    let sse = {
        let b = bidi.clone();
        tokio::spawn(async move { b.open_sse().await })
    };
    let run = run_request(OURS, "conv-drift-sse", "hi", true);
    let appends = [
        [run.encode_to_vec(), len_field(1, &len_field(201, b"x"))].concat(),
        len_field(10, b"another new kind of client message"),
    ];
    for message in appends {
        let body = ai::BidiAppendRequest {
            data: hex::encode(message),
            request_id: Some(ai::BidiRequestId {
                request_id: bidi.request_id.clone(),
            }),
            append_seqno: bidi.seqno(),
            ..Default::default()
        };
        let answer = bidi.append_body(body.encode_to_vec().into()).await;
        assert_eq!(answer.status, http::StatusCode::OK, "{answer:?}");
    }
    let mut stream = sse.await.unwrap();
    let t = play(&mut stream, Sink::Bidi(&bidi), &Store::default()).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), TEXT);
    let report = h.server.status().snapshot().unknown;
    let keys: Vec<&str> = report.items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["AgentRunRequest.201", "AgentClientMessage.10"]);
    assert_eq!(report.client_version.as_deref(), Some("2.0.0-test"));
}
