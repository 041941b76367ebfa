//! The calls around a conversation (titles, overviews, metadata, forks, blob uploads,
//! analytics transcripts), replayed through the real proxy as the desktop sends them: after a
//! turn on the user's model nothing of them reaches the fake Cursor upstream (a canary in the
//! prompt and blobs never does) and each answer decodes; for a Cursor conversation they pass
//! unchanged.

mod common;
#[path = "common/harness.rs"]
mod harness;

use bytes::Bytes;
use common::agent_client::{play, resume_request, run_request, Door, H2Run, Sink, Store, STEP};
use common::client::{self, Alpn};
use common::cursor_upstream::{relay_reply_bytes, AGENT_RUN};
use common::fake_provider::Reply;
use cursor_byok::connect::ConnectError;
use cursor_byok::proto::agent::v1 as pb;
use harness::{harness, Harness, CURSORS, OURS, TEXT, TEXT_SSE};
use http::{Method, Request, StatusCode};
use prost::Message;

const CANARY: &str = "CANARY-7f3e19-side-calls";

const NAME_AGENT: &str = "/agent.v1.AgentService/NameAgent";
const NAME_AGENT_AI: &str = "/aiserver.v1.AiService/NameAgent";
const OVERVIEW: &str = "/agent.v1.AgentService/CreateTranscriptOverview";
const METADATA: &str = "/agent.v1.AgentService/UpdateConversationMetadata";
const CLONE: &str = "/agent.v1.AgentService/NotifyConversationClone";
const BLOBS: &str = "/agent.v1.AgentService/UploadConversationBlobs";
const INGEST: &str = "/aiserver.v1.AnalyticsService/IngestConversation";
const NAME_TAB: &str = "/aiserver.v1.AiService/NameTab";
const MEMORY: &str = "/aiserver.v1.AiService/PotentiallyGenerateMemory";

/// One unary answer.
struct Answer {
    status: StatusCode,
    content_type: String,
    from_upstream: bool,
    body: Bytes,
}

/// A Connect unary call as the desktop sends it.
async fn unary(door: &Door, alpn: Alpn, path: &str, content_type: &str, body: Vec<u8>) -> Answer {
    let mut conn = door.connect(alpn).await;
    let req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("content-type", content_type)
        .header("connect-protocol-version", "1")
        .header("authorization", "Bearer cursor-session-token")
        .header("x-cursor-client-version", "3.24.0-test")
        .body(client::full(body))
        .unwrap();
    let resp = conn.send(&door.authority(), req).await.expect("an answer");
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let from_upstream = resp.headers().contains_key("x-fake-upstream");
    let body = client::collect(resp).await;
    Answer {
        status,
        content_type,
        from_upstream,
        body,
    }
}

fn proto(m: &impl Message) -> Vec<u8> {
    m.encode_to_vec()
}

/// A message without a schema here, as top-level string fields.
fn strings(fields: &[(u32, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, s) in fields {
        prost::encoding::string::encode(*n, &s.to_string(), &mut b);
    }
    b
}

/// A turn on `model` in `conversation` with `prompt`, played to its end.
async fn turn(h: &Harness, model: &str, conversation: &str, prompt: &str, request_id: &str) {
    let door = h.connect_door();
    let first = run_request(model, conversation, prompt, true);
    let mut run = H2Run::open(&door, request_id, &first).await;
    assert_eq!(run.stream.status, StatusCode::OK);
    if model == CURSORS {
        drop(run.tx);
        assert_eq!(run.stream.raw_to_end().await, relay_reply_bytes());
        return;
    }
    let t = play(&mut run.stream, Sink::H2(&run.tx), &Store::default()).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), TEXT);
}

fn assert_upstream_never_saw(h: &Harness, needle: &str) {
    for r in h.upstream.recorded() {
        let hay = [r.path.as_bytes(), &r.body[..]].concat();
        assert!(
            !hay.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{} reached the upstream with {needle}",
            r.path
        );
    }
}

fn ok_proto(a: &Answer) {
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.content_type, "application/proto");
    assert!(!a.from_upstream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_calls_of_a_byok_conversation_never_reach_cursor() {
    let h = harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    let prompt = format!("Refactor the parser module please {CANARY}");
    turn(&h, OURS, "conv-byok", &prompt, "req-byok").await;
    let (h2, h1) = (h.connect_door(), h.http_door());

    // Named on the user's model: the provider's answer is the title.
    h.provider.push(Reply::sse(TEXT_SSE));
    let body = proto(&pb::NameAgentRequest {
        user_message: prompt.clone(),
    });
    let a = unary(&h2, Alpn::H2, NAME_AGENT, "application/proto", body).await;
    ok_proto(&a);
    assert_eq!(pb::NameAgentResponse::decode(a.body).unwrap().name, TEXT);
    let title_request = h.provider.requests().last().unwrap().json();
    assert!(title_request.to_string().contains(CANARY));
    assert!(title_request["max_tokens"]
        .as_u64()
        .or(title_request["max_completion_tokens"].as_u64())
        .is_some_and(|n| n <= 64));

    // The JSON codec, on HTTP/1.1, on the other service.
    h.provider.push(Reply::sse(TEXT_SSE));
    let body = serde_json::json!({ "userMessage": prompt })
        .to_string()
        .into_bytes();
    let a = unary(&h1, Alpn::H1, NAME_AGENT_AI, "application/json", body).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type, "application/json");
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["name"], TEXT);

    let body = proto(&pb::UpdateConversationMetadataRequest {
        conversation_id: "conv-byok".into(),
        name: Some(format!("Parser {CANARY}")),
        workspace_paths: vec![format!("/home/u/{CANARY}")],
        ..Default::default()
    });
    let a = unary(&h2, Alpn::H2, METADATA, "application/proto", body).await;
    ok_proto(&a);
    assert!(pb::UpdateConversationMetadataResponse::decode(a.body).is_ok());

    h.provider.push(Reply::sse(TEXT_SSE));
    let body = proto(&pb::CreateTranscriptOverviewRequest {
        formatted_conversation: format!("User: {prompt}\n\nAssistant: {TEXT}\n"),
    });
    let a = unary(&h1, Alpn::H1, OVERVIEW, "application/proto", body).await;
    ok_proto(&a);
    let overview = pb::CreateTranscriptOverviewResponse::decode(a.body).unwrap();
    assert_eq!(overview.overview, TEXT);

    let body = strings(&[
        (1, "conv-byok"),
        (2, &format!("transcript {CANARY}")),
        (5, OURS),
    ]);
    let a = unary(&h2, Alpn::H2, INGEST, "application/proto", body).await;
    ok_proto(&a);
    assert!(a.body.is_empty());

    for path in [NAME_TAB, MEMORY] {
        let body = strings(&[(1, "conv-byok"), (2, &format!("turns {CANARY}"))]);
        let a = unary(&h2, Alpn::H2, path, "application/proto", body).await;
        ok_proto(&a);
    }

    assert!(h.upstream.recorded().iter().all(|r| r.path != NAME_AGENT));
    assert_upstream_never_saw(&h, CANARY);
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_a_byok_conversation_stays_here_and_is_ours() {
    let h = harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    turn(
        &h,
        OURS,
        "conv-src",
        &format!("first prompt {CANARY}"),
        "req-src",
    )
    .await;
    let door = h.connect_door();

    let body = proto(&pb::NotifyConversationCloneRequest {
        conversation_id: "conv-fork".into(),
        source_conversation_id: "conv-src".into(),
        source_request_id: "req-src".into(),
    });
    let a = unary(&door, Alpn::H2, CLONE, "application/proto", body).await;
    ok_proto(&a);
    assert!(pb::NotifyConversationCloneResponse::decode(a.body).is_ok());

    let body = proto(&pb::UploadConversationBlobsRequest {
        conversation_id: "conv-fork".into(),
        blobs: vec![pb::BlobEntry {
            id: vec![7; 32].into(),
            value: format!("shell output {CANARY}").into_bytes().into(),
        }],
        chunk_index: 0,
        total_chunks: 1,
    });
    let a = unary(&door, Alpn::H2, BLOBS, "application/proto", body).await;
    ok_proto(&a);
    assert!(pb::UploadConversationBlobsResponse::decode(a.body).is_ok());

    // A run on the fork that names no model goes where the fork is pinned: here.
    h.provider.push(Reply::sse(TEXT_SSE));
    let resume = resume_request("conv-fork", Default::default());
    let mut run = H2Run::open(&door, "req-fork", &resume).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &Store::default()).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), TEXT);
    assert_eq!(
        h.provider.requests().len(),
        2,
        "the fork's run went to the provider"
    );
    h.assert_nothing_relayed();
    assert_upstream_never_saw(&h, CANARY);
    assert!(
        h.upstream.recorded().is_empty(),
        "{:?}",
        h.upstream.recorded()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_calls_of_a_cursor_conversation_pass_unchanged() {
    let h = harness(vec![], |_| {}).await;
    let prompt = "Explain the build script";
    turn(&h, CURSORS, "conv-cursor", prompt, "req-cursor").await;
    h.upstream.wait_recorded(AGENT_RUN, 1, STEP).await;
    let door = h.connect_door();
    let calls: Vec<(&str, Vec<u8>)> = vec![
        (
            NAME_AGENT,
            proto(&pb::NameAgentRequest {
                user_message: prompt.into(),
            }),
        ),
        (
            METADATA,
            proto(&pb::UpdateConversationMetadataRequest {
                conversation_id: "conv-cursor".into(),
                name: Some("Build script".into()),
                ..Default::default()
            }),
        ),
        (
            OVERVIEW,
            proto(&pb::CreateTranscriptOverviewRequest {
                formatted_conversation: format!("User: {prompt}\nAssistant: ok"),
            }),
        ),
        (
            CLONE,
            proto(&pb::NotifyConversationCloneRequest {
                conversation_id: "conv-cursor-fork".into(),
                source_conversation_id: "conv-cursor".into(),
                source_request_id: "req-cursor".into(),
            }),
        ),
        (
            BLOBS,
            proto(&pb::UploadConversationBlobsRequest {
                conversation_id: "conv-cursor-fork".into(),
                blobs: vec![pb::BlobEntry {
                    id: vec![1; 32].into(),
                    value: Bytes::from_static(b"blob"),
                }],
                ..Default::default()
            }),
        ),
        (
            INGEST,
            strings(&[(1, "conv-cursor"), (2, "transcript"), (5, CURSORS)]),
        ),
    ];
    for (path, body) in calls {
        let a = unary(&door, Alpn::H2, path, "application/proto", body.clone()).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        assert!(a.from_upstream, "{path} was answered here");
        let seen = h.upstream.recorded_on(path);
        assert_eq!(seen.len(), 1, "{path}");
        assert_eq!(seen[0].body, body, "{path} changed on the way");
        assert_eq!(
            seen[0].headers["authorization"],
            "Bearer cursor-session-token"
        );
    }
    assert!(h.provider.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_agent_falls_back_to_the_prompts_first_words() {
    // One reply for the turn; the title call then gets the provider's 500.
    let h = harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    let prompt = format!("Make the tokenizer handle unicode escapes {CANARY}");
    turn(&h, OURS, "conv-fail", &prompt, "req-fail").await;
    let body = proto(&pb::NameAgentRequest {
        user_message: prompt,
    });
    let a = unary(
        &h.connect_door(),
        Alpn::H2,
        NAME_AGENT,
        "application/proto",
        body,
    )
    .await;
    ok_proto(&a);
    let name = pb::NameAgentResponse::decode(a.body).unwrap().name;
    assert_eq!(name, "Make the tokenizer handle unicode escapes");
    assert_eq!(h.provider.requests().len(), 2, "the model was asked first");
    assert_upstream_never_saw(&h, CANARY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecidable_side_calls_are_answered_here() {
    let h = harness(vec![], |c| c.limits.max_frame_bytes = 64 * 1024).await;
    let door = h.http_door();
    // A prompt no run was seen with: after the wait for a run, a title made here.
    let body = proto(&pb::NameAgentRequest {
        user_message: format!("unseen prompt {CANARY}"),
    });
    let a = unary(&door, Alpn::H1, NAME_AGENT, "application/proto", body).await;
    ok_proto(&a);
    assert_eq!(
        pb::NameAgentResponse::decode(a.body).unwrap().name,
        format!("unseen prompt {CANARY}")
    );
    // Blobs of a conversation no run decided.
    let body = proto(&pb::UploadConversationBlobsRequest {
        conversation_id: "conv-unknown".into(),
        blobs: vec![pb::BlobEntry {
            id: vec![2; 32].into(),
            value: Bytes::from_static(CANARY.as_bytes()),
        }],
        ..Default::default()
    });
    let a = unary(&door, Alpn::H1, BLOBS, "application/proto", body).await;
    ok_proto(&a);
    // A body that does not decode: refused with a Connect error, not sent.
    let a = unary(
        &door,
        Alpn::H1,
        METADATA,
        "application/proto",
        b"\x0a\xff".to_vec(),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let err = ConnectError::from_unary_json(&a.body).expect("a Connect error");
    assert!(
        err.message.contains("not sent to Cursor"),
        "{}",
        err.message
    );
    assert!(err.decode_error_details().unwrap().is_some());
    // A body over the frame limit: refused, not sent.
    let body = proto(&pb::UploadConversationBlobsRequest {
        conversation_id: "conv-unknown".into(),
        blobs: vec![pb::BlobEntry {
            id: vec![3; 32].into(),
            value: CANARY.repeat(8 * 1024).into_bytes().into(),
        }],
        ..Default::default()
    });
    let a = unary(
        &h.connect_door(),
        Alpn::H2,
        BLOBS,
        "application/proto",
        body,
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let err = ConnectError::from_unary_json(&a.body).expect("a Connect error");
    assert!(err.message.contains("larger than"), "{}", err.message);
    assert!(
        h.upstream.recorded().is_empty(),
        "{:?}",
        h.upstream.recorded()
    );
    assert!(h.provider.requests().is_empty());
}
