//! Cmd+K through the real proxy, with requests built as the desktop sends them (fields from
//! `cmdk.tsv`, filled the way `cmdk.md` §2 says the client fills them): each test asserts on the
//! decoded stream and on what the fake provider or the fake Cursor upstream saw.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::Duration;

use bytes::Bytes;
use common::agent_client::{connect_request, frame, API, STEP};
use common::client::{self, Alpn, Sender};
use common::cursor_upstream::{cmd_k_reply, REPORT_CMD_K_FATE};
use common::fake_provider::{After, Reply};
use cursor_byok::connect::{EndStream, Frame, FrameDecoder, Limits, StreamKind};
use cursor_byok::proto::aiserver::v1 as pb;
use harness::{harness, partial, Harness, OURS};
use http::StatusCode;
use http_body_util::BodyExt;
use prost::Message;

use pb::context_item::Item;
use pb::stream_cmd_k_response::Response as Out;
use pb::stream_cmd_k_response_context_wrapped::Response as Wrapped;
use pb::stream_terminal_cmd_k_response::Response as TermOut;
use pb::stream_terminal_cmd_k_response_context_wrapped::Response as TermWrapped;

const STREAM_CMD_K: &str = "/aiserver.v1.CmdKService/StreamCmdK";
const STREAM_TERMINAL: &str = "/aiserver.v1.CmdKService/StreamTerminalCmdK";
const RERANK: &str = "/aiserver.v1.CmdKService/RerankCmdKContext";

fn sse(text: &str) -> String {
    common::fake_provider::text_sse(text)
}

fn item(i: Item) -> pb::PotentiallyCachedContextItem {
    pb::PotentiallyCachedContextItem {
        item: Some(pb::potentially_cached_context_item::Item::ContextItem(
            pb::ContextItem {
                item: Some(i),
                ..Default::default()
            },
        )),
    }
}

fn hashed(hash: &str) -> pb::PotentiallyCachedContextItem {
    pb::PotentiallyCachedContextItem {
        item: Some(pb::potentially_cached_context_item::Item::ContextItemHash(
            hash.into(),
        )),
    }
}

const FILE: [&str; 6] = [
    "fn main() {",
    "    let a = 1;",
    "    let b = 2;",
    "    println!(\"{}\", a + b);",
    "}",
    "",
];

/// The editor's items for a selection of `lines` from line `start` (an empty one inserts).
fn editor_items(start: i32, lines: &[&str], query: &str) -> Vec<pb::PotentiallyCachedContextItem> {
    vec![
        item(Item::CmdKSelection(pb::context_item::CmdKSelection {
            lines: lines.iter().map(|l| l.to_string()).collect(),
            start_line_number: start,
        })),
        item(Item::CmdKImmediateContext(
            pb::context_item::CmdKImmediateContext {
                relative_workspace_path: "src/main.rs".into(),
                lines: FILE
                    .iter()
                    .enumerate()
                    .map(|(i, l)| pb::context_item::cmd_k_immediate_context::Line {
                        line: l.to_string(),
                        line_number: i as i32 + 1,
                    })
                    .collect(),
                total_number_of_lines_in_file: FILE.len() as i32,
                ..Default::default()
            },
        )),
        item(Item::CmdKQuery(pb::context_item::CmdKQuery {
            query: query.into(),
        })),
        item(Item::ProjectRule(pb::CursorRule {
            name: "style".into(),
            body: Some("Prefer snake_case.".into()),
            ..Default::default()
        })),
    ]
}

fn options(model: &str, chat: bool) -> pb::CmdKOptions {
    pb::CmdKOptions {
        chat_mode: chat,
        model_details: Some(pb::ModelDetails {
            model_name: Some(model.into()),
            ..Default::default()
        }),
        use_reranker: Some(true),
        use_web: Some(false),
        ..Default::default()
    }
}

/// A `StreamCmdKRequest` as the editor's prompt bar sends it.
fn editor_request(
    model: &str,
    items: Vec<pb::PotentiallyCachedContextItem>,
    chat: bool,
) -> pb::StreamCmdKRequest {
    pb::StreamCmdKRequest {
        context_items: items,
        cmd_k_options: Some(options(model, chat)),
        legacy_context: Some(pb::CmdKLegacyContext {
            explicit_context: Some(pb::ExplicitContext {
                context: "Always write tests.".into(),
                ..Default::default()
            }),
            prompt_code_blocks: vec![pb::CodeBlock {
                relative_workspace_path: "src/lib.rs".into(),
                contents: "pub fn helper() {}".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        session_id: "prompt-bar-1".into(),
        timing_info: Some(pb::TimingInfo {
            user_input_time: 1.0,
            stream_cmdk_time: 2.0,
        }),
        ..Default::default()
    }
}

/// One Connect stream call on `host` (through the proxy listener): its status and raw body.
async fn call_on(
    h: &Harness,
    host: &str,
    path: &str,
    body: Bytes,
    alpn: Alpn,
) -> (StatusCode, Bytes) {
    let mut conn = connect(h, host, alpn).await;
    let req = connect_request(
        path,
        "application/connect+proto",
        "req-cmdk",
        client::full(body),
    );
    let resp = tokio::time::timeout(STEP, conn.send(host, req))
        .await
        .unwrap()
        .unwrap();
    let status = resp.status();
    let body = tokio::time::timeout(STEP, resp.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    (status, body)
}

async fn connect(h: &Harness, host: &str, alpn: Alpn) -> Sender {
    client::via_proxy(
        h.server.proxy_addr(),
        &format!("{host}:443"),
        host,
        client::roots(&[&h.our_ca]),
        alpn,
    )
    .await
}

async fn call(h: &Harness, path: &str, msg: &impl Message) -> (StatusCode, Bytes) {
    call_on(h, "api2.cursor.sh", path, frame(msg), Alpn::H2).await
}

/// The frames of a response body: messages, then the end.
fn frames(body: &Bytes) -> (Vec<Bytes>, EndStream) {
    let mut dec = FrameDecoder::new(
        StreamKind::Response,
        cursor_byok::connect::Encoding::Identity,
        Limits::default(),
    );
    dec.feed(body.clone());
    let mut messages = Vec::new();
    loop {
        match dec.next_frame().expect("valid frames") {
            Some(Frame::Message(m)) => messages.push(m),
            Some(Frame::End(end)) => return (messages, end),
            None => panic!("the stream ended without an end frame: {body:?}"),
        }
    }
}

fn editor_frames(body: &Bytes) -> (Vec<Wrapped>, EndStream) {
    let (messages, end) = frames(body);
    let decoded = messages
        .into_iter()
        .map(|m| {
            pb::StreamCmdKResponseContextWrapped::decode(m)
                .unwrap()
                .response
                .expect("a response")
        })
        .collect();
    (decoded, end)
}

/// The kinds of an editor stream, in order.
fn kinds(frames: &[Wrapped]) -> Vec<&'static str> {
    frames
        .iter()
        .map(|w| match w {
            Wrapped::ContextStatusUpdate(_) => "context_status_update",
            Wrapped::MissingContextItems(_) => "missing_context_items",
            Wrapped::RealResponse(r) => match r.response.as_ref().unwrap() {
                Out::EditStart(_) => "edit_start",
                Out::EditStream(_) => "edit_stream",
                Out::EditEnd(_) => "edit_end",
                Out::Chat(_) => "chat",
                Out::StatusUpdate(_) => "status_update",
            },
        })
        .collect()
}

fn streamed_text(frames: &[Wrapped]) -> String {
    frames
        .iter()
        .filter_map(|w| match w {
            Wrapped::RealResponse(r) => match r.response.as_ref().unwrap() {
                Out::EditStream(s) => Some(s.text.clone()),
                Out::Chat(c) => Some(c.text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn edit_range(frames: &[Wrapped]) -> (i32, Option<i32>, i32) {
    let mut start = None;
    let mut end = None;
    for w in frames {
        if let Wrapped::RealResponse(r) = w {
            match r.response.as_ref().unwrap() {
                Out::EditStart(s) => {
                    start = Some((s.start_line_number, s.max_end_line_number_exclusive))
                }
                Out::EditEnd(e) => end = Some(e.end_line_number_exclusive),
                _ => {}
            }
        }
    }
    let (s, max) = start.expect("an edit_start");
    (s, max, end.expect("an edit_end"))
}

/// The user message the provider got for its `i`-th request.
fn prompt(h: &Harness, i: usize) -> String {
    let body = h.provider.requests()[i].json();
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| {
            m["content"]
                .as_str()
                .map_or_else(|| m["content"].to_string(), str::to_string)
        })
        .collect()
}

fn nothing_reached_cursor(h: &Harness) {
    for path in [STREAM_CMD_K, STREAM_TERMINAL, RERANK, REPORT_CMD_K_FATE] {
        assert!(
            h.upstream.recorded_on(path).is_empty(),
            "{path} reached Cursor"
        );
    }
}

#[tokio::test]
async fn an_edit_of_a_three_line_selection_streams_over_its_range() {
    let h = harness(
        vec![Reply::sse(sse(
            "```rust\n    let a = 10;\n    let b = 20;\n    println!(\"{}\", a * b);\n```\n",
        ))],
        |_| {},
    )
    .await;
    let lines = &FILE[1..4];
    let req = editor_request(
        OURS,
        editor_items(2, lines, "multiply instead, and use 10 and 20"),
        false,
    );
    let (status, body) = call(&h, STREAM_CMD_K, &req).await;
    assert_eq!(status, StatusCode::OK);
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none(), "{:?}", end.error);
    let k = kinds(&frames);
    assert_eq!(
        k[0], "context_status_update",
        "the full items are acknowledged first: {k:?}"
    );
    assert_eq!(&k[1..3], ["status_update", "edit_start"], "{k:?}");
    assert_eq!(k.last(), Some(&"edit_end"), "{k:?}");
    assert_eq!(edit_range(&frames), (2, Some(5), 5));
    assert_eq!(
        streamed_text(&frames),
        "    let a = 10;\n    let b = 20;\n    println!(\"{}\", a * b);",
        "the fence is off, the lines are the selection's replacement"
    );
    let p = prompt(&h, 0);
    for want in [
        "multiply instead, and use 10 and 20",
        ">    2     let a = 1;",
        "Prefer snake_case.",
        "Always write tests.",
        "pub fn helper() {}",
        "Selected lines 2-4",
    ] {
        assert!(p.contains(want), "the prompt has {want:?}:\n{p}");
    }
    let body = h.provider.requests()[0].json();
    assert_eq!(body["model"], "gpt-fake");
    assert!(body["tools"].is_null(), "no tools on Cmd+K: {body}");
    nothing_reached_cursor(&h);
    // Usage goes to the status page like an agent run's.
    let snap = h.server.status().snapshot();
    let run = snap
        .recent
        .iter()
        .find(|r| r.transport == "CmdK")
        .expect("the Cmd+K on the status page");
    assert_eq!((run.input_tokens, run.output_tokens), (80, 5));
}

#[tokio::test]
async fn an_empty_selection_inserts_at_its_line() {
    let h = harness(vec![Reply::sse(sse("    // sum\n"))], |_| {}).await;
    let req = editor_request(OURS, editor_items(4, &[], "add a comment"), false);
    let (_, body) = call(&h, STREAM_CMD_K, &req).await;
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none());
    assert_eq!(
        edit_range(&frames),
        (4, Some(4), 4),
        "start == end: an insert"
    );
    assert_eq!(streamed_text(&frames), "    // sum");
    assert!(prompt(&h, 0).contains("Before line 4 (nothing is selected)"));
}

#[tokio::test]
async fn a_follow_up_carries_the_earlier_instructions() {
    let h = harness(vec![Reply::sse(sse("x"))], |_| {}).await;
    let mut items = editor_items(2, &FILE[1..2], "now make it a const");
    items.push(item(Item::CmdKQueryHistory(
        pb::context_item::CmdKQueryHistory {
            query: Some(pb::context_item::CmdKQuery {
                query: "rename a to alpha".into(),
            }),
            query_history: Some(Box::new(pb::context_item::CmdKQueryHistory {
                query: Some(pb::context_item::CmdKQuery {
                    query: "first: add a type".into(),
                }),
                ..Default::default()
            })),
            ..Default::default()
        },
    )));
    let (_, body) = call(&h, STREAM_CMD_K, &editor_request(OURS, items, false)).await;
    assert!(editor_frames(&body).1.error.is_none());
    let p = prompt(&h, 0);
    let first = p.find("first: add a type").expect("the oldest turn");
    let second = p.find("rename a to alpha").expect("the last turn");
    let now = p.rfind("now make it a const").expect("the instruction");
    assert!(
        first < second && second < now,
        "oldest first, the instruction last:\n{p}"
    );
}

/// The hashes of the acknowledged items, in order.
fn acknowledged(frames: &[Wrapped]) -> Vec<String> {
    frames
        .iter()
        .filter_map(|w| match w {
            Wrapped::ContextStatusUpdate(u) => Some(
                u.context_item_statuses
                    .iter()
                    .map(|s| s.context_item_hash.clone()),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn hashes_acknowledged_are_reused_and_an_unknown_one_is_asked_for_and_resent() {
    let h = harness(
        vec![
            Reply::sse(sse("one")),
            Reply::sse(sse("two")),
            Reply::sse(sse("three")),
        ],
        |_| {},
    )
    .await;
    let items = editor_items(2, &FILE[1..2], "first");
    let (_, body) = call(
        &h,
        STREAM_CMD_K,
        &editor_request(OURS, items.clone(), false),
    )
    .await;
    let (frames, _) = editor_frames(&body);
    let hashes = acknowledged(&frames);
    assert_eq!(hashes.len(), items.len(), "every full item is acknowledged");

    // The next request sends the acknowledged items as their hashes: they resolve here.
    let mut reused: Vec<_> = hashes[..2].iter().map(|h| hashed(h)).collect();
    reused.push(item(Item::CmdKQuery(pb::context_item::CmdKQuery {
        query: "second".into(),
    })));
    let (_, body) = call(&h, STREAM_CMD_K, &editor_request(OURS, reused, false)).await;
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(streamed_text(&frames), "two");
    assert!(
        prompt(&h, 1).contains(">    2     let a = 1;"),
        "the hashed immediate context reached the prompt"
    );

    // A hash never acknowledged: asked for before any real response, no model call.
    let unknown = vec![
        hashed(&hashes[0]),
        hashed("never-acknowledged"),
        item(Item::CmdKQuery(pb::context_item::CmdKQuery {
            query: "third".into(),
        })),
    ];
    let (_, body) = call(&h, STREAM_CMD_K, &editor_request(OURS, unknown, false)).await;
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none());
    assert_eq!(kinds(&frames), ["missing_context_items"]);
    let Wrapped::MissingContextItems(m) = &frames[0] else {
        unreachable!()
    };
    assert_eq!(m.missing_context_item_hashes, ["never-acknowledged"]);
    assert_eq!(
        h.provider.requests().len(),
        2,
        "no model call for a request with a missing item"
    );

    // The client resends the item in full: served.
    let (_, body) = call(
        &h,
        STREAM_CMD_K,
        &editor_request(OURS, editor_items(2, &FILE[1..2], "third"), false),
    )
    .await;
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none());
    assert_eq!(streamed_text(&frames), "three");
    nothing_reached_cursor(&h);
}

#[tokio::test]
async fn rerank_on_our_model_acknowledges_here_and_the_stream_reuses_the_hashes() {
    let h = harness(vec![Reply::sse(sse("done"))], |_| {}).await;
    let items = editor_items(2, &FILE[1..2], "q");
    let rerank = pb::RerankCmdKContextRequest {
        context_items: items.clone(),
        cmd_k_options: Some(options(OURS, false)),
        ..Default::default()
    };
    let mut conn = connect(&h, "api2.cursor.sh", Alpn::H2).await;
    let req = connect_request(
        RERANK,
        "application/proto",
        "req-rerank",
        client::full(rerank.encode_to_vec()),
    );
    let resp = conn.send(API, req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let answer = pb::RerankCmdKContextResponse::decode(client::collect(resp).await).unwrap();
    assert_eq!(answer.did_call, Some(true));
    let Some(pb::rerank_cmd_k_context_response::Response::ContextStatusUpdate(u)) = answer.response
    else {
        panic!("{answer:?}")
    };
    let hashes: Vec<_> = u
        .context_item_statuses
        .iter()
        .map(|s| hashed(&s.context_item_hash))
        .collect();
    assert_eq!(hashes.len(), items.len());
    let (_, body) = call(&h, STREAM_CMD_K, &editor_request(OURS, hashes, false)).await;
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(streamed_text(&frames), "done");
    nothing_reached_cursor(&h);
}

#[tokio::test]
async fn chat_mode_streams_text() {
    let h = harness(
        vec![Reply::sse(sse("It adds `a` and `b`.\n\n```rust\nx\n```"))],
        |_| {},
    )
    .await;
    let (_, body) = call(
        &h,
        STREAM_CMD_K,
        &editor_request(
            OURS,
            editor_items(2, &FILE[1..4], "what does this do?"),
            true,
        ),
    )
    .await;
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none());
    let k = kinds(&frames);
    assert!(!k.iter().any(|k| k.starts_with("edit_")), "{k:?}");
    assert_eq!(
        streamed_text(&frames),
        "It adds `a` and `b`.\n\n```rust\nx\n```",
        "chat text as the model wrote it"
    );
}

fn terminal_request(model: &str) -> pb::StreamTerminalCmdKRequest {
    pb::StreamTerminalCmdKRequest {
        context_items: vec![
            item(Item::TerminalCmdKQuery(
                pb::context_item::TerminalCmdKQuery {
                    query: "list the largest files here".into(),
                },
            )),
            item(Item::TerminalHistory(pb::context_item::TerminalHistory {
                history: "$ cargo build\n   Finished".into(),
                cwd_full: "/home/dev/project".into(),
                active_for_cmd_k: true,
                ..Default::default()
            })),
        ],
        cmd_k_options: Some(pb::TerminalCmdKOptions {
            model_details: Some(pb::ModelDetails {
                model_name: Some(model.into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        session_id: "terminal-1".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn terminal_cmd_k_streams_a_command() {
    let h = harness(
        vec![Reply::sse(sse(
            "```bash\ndu -ah . | sort -rh | head -n 10\n```",
        ))],
        |_| {},
    )
    .await;
    let (status, body) = call(&h, STREAM_TERMINAL, &terminal_request(OURS)).await;
    assert_eq!(status, StatusCode::OK);
    let (messages, end) = frames(&body);
    assert!(end.error.is_none(), "{:?}", end.error);
    let decoded: Vec<TermWrapped> = messages
        .into_iter()
        .map(|m| {
            pb::StreamTerminalCmdKResponseContextWrapped::decode(m)
                .unwrap()
                .response
                .unwrap()
        })
        .collect();
    let mut command = String::new();
    let mut first_status = None;
    for (i, w) in decoded.iter().enumerate() {
        if let TermWrapped::RealResponse(r) = w {
            match r.response.as_ref().unwrap() {
                TermOut::StatusUpdate(_) => first_status = first_status.or(Some(i)),
                TermOut::TerminalCommand(c) => command.push_str(&c.partial_command),
                TermOut::Chat(_) => panic!("no chat outside chat mode"),
            }
        }
    }
    assert_eq!(
        first_status,
        Some(1),
        "after the acknowledgement, a status first"
    );
    assert_eq!(command, "du -ah . | sort -rh | head -n 10");
    let p = prompt(&h, 0);
    assert!(
        p.contains("/home/dev/project")
            && p.contains("cargo build")
            && p.contains("list the largest files"),
        "{p}"
    );
    assert_eq!(
        h.provider.requests()[0].json()["max_tokens"],
        1024,
        "a command's output cap"
    );
    nothing_reached_cursor(&h);
}

#[tokio::test]
async fn a_provider_failure_ends_with_cursors_banner() {
    let body = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    let h = harness(vec![Reply::json(401, body)], |_| {}).await;
    let (status, body) = call(
        &h,
        STREAM_CMD_K,
        &editor_request(OURS, editor_items(2, &FILE[1..2], "q"), false),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a stream's error is in its end frame"
    );
    let (frames, end) = editor_frames(&body);
    assert!(kinds(&frames).contains(&"status_update"));
    let e = end.error.expect("an error end");
    assert_eq!(e.code, cursor_byok::connect::Code::Unauthenticated);
    let details = e.decode_error_details().unwrap().expect("ErrorDetails");
    assert_eq!(
        details.error,
        pb::error_details::Error::BadUserApiKey as i32
    );
    assert!(e.message.contains("Incorrect API key"), "{}", e.message);
    nothing_reached_cursor(&h);
}

#[tokio::test]
async fn the_client_closing_the_stream_ends_the_provider_call() {
    let h = harness(
        vec![Reply::sse(partial("    let a = 1;\\n"))
            .then(After::Trickle(Duration::from_millis(20)))],
        |_| {},
    )
    .await;
    let mut conn = connect(&h, "api2.cursor.sh", Alpn::H2).await;
    let req = connect_request(
        STREAM_CMD_K,
        "application/connect+proto",
        "req-cancel",
        client::full(frame(&editor_request(
            OURS,
            editor_items(2, &FILE[1..2], "q"),
            false,
        ))),
    );
    let resp = conn.send(API, req).await.unwrap();
    let mut body = resp.into_body();
    // Read until the model's first line came: the call is on the provider, mid-stream.
    let mut dec = FrameDecoder::new(
        StreamKind::Response,
        cursor_byok::connect::Encoding::Identity,
        Limits::default(),
    );
    let mut text = String::new();
    while text.is_empty() {
        let chunk = tokio::time::timeout(STEP, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        dec.feed(chunk.into_data().unwrap());
        while let Some(Frame::Message(m)) = dec.next_frame().unwrap() {
            let w = pb::StreamCmdKResponseContextWrapped::decode(m).unwrap();
            text.push_str(&streamed_text(&[w.response.unwrap()]));
        }
    }
    assert_eq!(text, "    let a = 1;");
    assert_eq!(h.provider.requests().len(), 1);
    drop(body);
    drop(conn);
    assert!(
        h.provider.wait_hangups(1, STEP).await,
        "the provider call ended with the stream"
    );
    assert!(
        h.wait_no_active_runs(STEP).await,
        "the Cmd+K left the status page's active list"
    );
}

#[tokio::test]
async fn default_without_cmd_k_goes_to_cursor_unchanged_and_with_it_is_served() {
    let h = harness(vec![], |_| {}).await;
    let req = editor_request("default", editor_items(2, &FILE[1..2], "q"), false);
    let sent = frame(&req);
    let (status, body) = call_on(&h, "api2.cursor.sh", STREAM_CMD_K, sent.clone(), Alpn::H2).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, cmd_k_reply(), "Cursor's answer, unchanged");
    let seen = h.upstream.recorded_on(STREAM_CMD_K);
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body, sent,
        "the request went to Cursor byte for byte"
    );
    assert!(h.provider.requests().is_empty());

    let h = harness(vec![Reply::sse(sse("x"))], |c| {
        c.cmd_k.model = Some("fake-model".into())
    })
    .await;
    let (_, body) = call(&h, STREAM_CMD_K, &req).await;
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none());
    assert_eq!(streamed_text(&frames), "x");
    assert_eq!(h.provider.requests().len(), 1);
    nothing_reached_cursor(&h);
}

#[tokio::test]
async fn a_cursor_model_passes_through_unchanged_on_http1_too() {
    let h = harness(vec![], |c| c.cmd_k.model = Some("fake-model".into())).await;
    for (alpn, path, body) in [
        (
            Alpn::H2,
            STREAM_CMD_K,
            frame(&editor_request(
                "claude-4.5-sonnet",
                editor_items(2, &FILE[1..2], "q"),
                false,
            )),
        ),
        (Alpn::H1, STREAM_TERMINAL, frame(&terminal_request("gpt-5"))),
    ] {
        let (status, answer) = call_on(&h, "api2.cursor.sh", path, body.clone(), alpn).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer, cmd_k_reply());
        assert_eq!(h.upstream.recorded_on(path).last().unwrap().body, body);
    }
    assert!(h.provider.requests().is_empty());
}

#[tokio::test]
async fn unreadable_or_unknown_ours_is_refused_never_relayed() {
    let h = harness(vec![], |_| {}).await;
    for body in [
        Bytes::from_static(b"\x00\x00\x00\x00\x05garbage"),
        frame(&editor_request("byok-not-configured", vec![], false)),
    ] {
        let (status, answer) = call_on(&h, "api2.cursor.sh", STREAM_CMD_K, body, Alpn::H2).await;
        assert_eq!(status, StatusCode::OK);
        let (_, end) = frames(&answer);
        let e = end.error.expect("refused");
        assert_eq!(e.code, cursor_byok::connect::Code::FailedPrecondition);
        assert!(
            e.message
                .contains("sent neither to your provider nor to Cursor"),
            "{}",
            e.message
        );
    }
    nothing_reached_cursor(&h);
}

/// One gzip-compressed envelope (flag 0x01), as a client sending `connect-content-encoding:
/// gzip` frames it.
fn gzip_frame(msg: &impl Message) -> Bytes {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&msg.encode_to_vec()).unwrap();
    let payload = gz.finish().unwrap();
    let mut out = vec![1];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    out.into()
}

#[tokio::test]
async fn a_cmd_k_on_api3_is_served_the_same_gzip_included() {
    let h = harness(vec![Reply::sse(sse("y"))], |_| {}).await;
    let req = editor_request(OURS, editor_items(2, &FILE[1..2], "q"), false);
    let mut conn = connect(&h, "api3.cursor.sh", Alpn::H2).await;
    let mut gzipped = connect_request(
        STREAM_CMD_K,
        "application/connect+proto",
        "req-gzip",
        client::full(gzip_frame(&req)),
    );
    gzipped
        .headers_mut()
        .insert("connect-content-encoding", "gzip".parse().unwrap());
    let resp = conn.send("api3.cursor.sh", gzipped).await.unwrap();
    let (frames, end) = editor_frames(&client::collect(resp).await);
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(streamed_text(&frames), "y");
    h.provider.push(Reply::sse(sse("y")));
    let (status, body) = call_on(&h, "api3.cursor.sh", STREAM_CMD_K, frame(&req), Alpn::H2).await;
    assert_eq!(status, StatusCode::OK);
    let (frames, end) = editor_frames(&body);
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(streamed_text(&frames), "y");
    nothing_reached_cursor(&h);
}

#[tokio::test]
async fn report_fate_of_a_cmd_k_served_here_stays_here() {
    let h = harness(vec![Reply::sse(sse("z"))], |_| {}).await;
    let mut conn = connect(&h, "api2.cursor.sh", Alpn::H2).await;
    let req = connect_request(
        STREAM_CMD_K,
        "application/connect+proto",
        "req-fate",
        client::full(frame(&editor_request(
            OURS,
            editor_items(2, &FILE[1..2], "q"),
            false,
        ))),
    );
    let resp = conn.send(API, req).await.unwrap();
    let _ = client::collect(resp).await;
    for (id, local) in [("req-fate", true), ("someone-elses", false)] {
        let fate = pb::ReportCmdKFateRequest {
            request_id: id.into(),
            fate: pb::report_cmd_k_fate_request::Fate::Accepted as i32,
        };
        let req = connect_request(
            REPORT_CMD_K_FATE,
            "application/proto",
            "req-x",
            client::full(fate.encode_to_vec()),
        );
        let resp = conn.send(API, req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = client::collect(resp).await;
        assert_eq!(
            h.upstream.recorded_on(REPORT_CMD_K_FATE).is_empty(),
            local,
            "{id}"
        );
    }
}

#[tokio::test]
async fn a_body_over_the_frame_bound_is_refused_not_relayed() {
    let h = harness(vec![], |c| c.limits.max_frame_bytes = 4 * 1024).await;
    let big = "x".repeat(64 * 1024);
    let req = editor_request(OURS, editor_items(2, &[big.as_str()], "q"), false);
    let (status, body) = call(&h, STREAM_CMD_K, &req).await;
    assert_eq!(status, StatusCode::OK);
    let e = frames(&body).1.error.expect("refused");
    assert_eq!(e.code, cursor_byok::connect::Code::FailedPrecondition);
    assert!(e.message.contains("larger than"), "{}", e.message);
    assert!(h.provider.requests().is_empty());
    nothing_reached_cursor(&h);
}

#[tokio::test]
async fn a_templated_provider_header_carries_the_prompt_bar_session() {
    let h = harness(vec![Reply::sse(sse("x"))], |c| {
        c.providers.get_mut("fake").unwrap().headers.insert(
            "x-litellm-tags".into(),
            cursor_byok::base::secret::Secret::new("cmd-k,{conversation_id}"),
        );
    })
    .await;
    let (_, body) = call(
        &h,
        STREAM_CMD_K,
        &editor_request(OURS, editor_items(2, &FILE[1..2], "q"), false),
    )
    .await;
    assert!(editor_frames(&body).1.error.is_none());
    assert_eq!(
        h.provider.requests()[0].header("x-litellm-tags"),
        Some("cmd-k,prompt-bar-1")
    );
}
