//! Attacks from the same machine, against the real proxy: a web page that reaches the agent
//! doors (the PAC sends `*.cursor.sh` here for every application, the CA is trusted), a page
//! whose name was re-pointed at 127.0.0.1 (DNS rebinding) on a direct door, and a second
//! local client that knows a live run's request id and tries to take it over. Each one must
//! start nothing, call no provider, and leave the owner's run alone.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::Duration;

use bytes::Bytes;
use common::agent_client::{
    chunked, client_heartbeat, connect_request, frame, play, play_until, run_request, text_of,
    Bidi, Door, Received, Sink, Store, BIDI_APPEND, RUN_SSE, STEP,
};
use common::client::Alpn;
use common::fake_provider::Reply;
use cursor_byok::connect::Code;
use cursor_byok::proto::aiserver::v1 as ai;
use harness::{Harness, OURS, TEXT_SSE};
use http::{Request, StatusCode};
use http_body_util::BodyExt;

/// What a web page can send without a CORS preflight (plus what browsers add to anything).
const BROWSER_SHAPES: [(&str, Option<&str>); 4] = [
    ("sendBeacon", Some("text/plain;charset=UTF-8")),
    ("octet-stream", Some("application/octet-stream")),
    ("typeless", None),
    ("form", Some("application/x-www-form-urlencoded")),
];

/// Send `req` on a fresh HTTP/1.1 connection through `door`: the answer's status and body.
async fn send(door: &Door, req: Request<common::client::Body>) -> (StatusCode, Bytes) {
    let mut conn = door.connect(Alpn::H1).await;
    let resp = tokio::time::timeout(STEP, conn.send(&door.authority(), req))
        .await
        .expect("answered within the step timeout")
        .expect("answered");
    let status = resp.status();
    let body = tokio::time::timeout(STEP, resp.into_body().collect())
        .await
        .expect("the body within the step timeout")
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, body)
}

/// A browser-shaped POST of `body` to `path`: `content_type` (or none), a web origin, and the
/// fetch metadata a browser adds.
fn browser_post(
    path: &str,
    content_type: Option<&str>,
    request_id: &str,
    body: Bytes,
) -> Request<common::client::Body> {
    let mut req = connect_request(path, "application/proto", request_id, chunked(body));
    let h = req.headers_mut();
    h.remove("content-type");
    h.remove("connect-protocol-version");
    if let Some(ct) = content_type {
        h.insert("content-type", ct.parse().expect("value"));
    }
    h.insert("origin", "https://evil.example".parse().expect("value"));
    h.insert("sec-fetch-site", "cross-site".parse().expect("value"));
    h.insert("sec-fetch-mode", "no-cors".parse().expect("value"));
    req
}

fn assert_nothing_started(h: &Harness, what: &str) {
    assert!(
        h.provider.requests().is_empty(),
        "{what}: the provider was called"
    );
    let snap = h.server.status().snapshot();
    assert!(
        snap.active.is_empty() && snap.recent.is_empty(),
        "{what}: a run was registered: {snap:?}"
    );
    h.assert_nothing_relayed();
}

/// A page's `sendBeacon` (and every other simple POST) to BidiAppend carrying a real append 0
/// for the user's model, and the same to RunSSE: refused with 403, no run, no provider call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_shaped_agent_requests_start_no_run() {
    let h = harness::harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    for door in [h.connect_door(), h.http_door(), h.tls_door()] {
        for (i, (what, content_type)) in BROWSER_SHAPES.iter().enumerate() {
            let id = format!("req-page-{i}");
            let bidi = Bidi::new(&door, &id);
            let append = bidi.append_bytes(0, &run_request(OURS, "conv-page", "$(curl x)", true));
            let (status, body) =
                send(&door, browser_post(BIDI_APPEND, *content_type, &id, append)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {body:?}");
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("permission_denied"), "{what}: {text}");
            let reader = frame(&ai::BidiRequestId {
                request_id: id.clone(),
            });
            let (status, _) = send(&door, browser_post(RUN_SSE, *content_type, &id, reader)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{what} RunSSE");
        }
        // The right content type is not enough when a page sent it.
        let bidi = Bidi::new(&door, "req-page-typed")
            .append_header("origin", "https://evil.example")
            .append_header("sec-fetch-site", "cross-site");
        let append = bidi.append_bytes(0, &run_request(OURS, "conv-page", "hi", true));
        assert_eq!(bidi.append_body(append).await.status, StatusCode::FORBIDDEN);
        let same_site =
            Bidi::new(&door, "req-page-site").append_header("sec-fetch-site", "same-site");
        let append = same_site.append_bytes(0, &run_request(OURS, "conv-page", "hi", true));
        assert_eq!(
            same_site.append_body(append).await.status,
            StatusCode::FORBIDDEN
        );
    }
    // HTTP/2 Run with a page's headers.
    let door = h.connect_door();
    let first = frame(&run_request(OURS, "conv-page-h2", "hi", true));
    let conn = harness::h2_conn(&door).await;
    let run = harness::run_with_headers(
        &conn,
        &door,
        "req-page-h2",
        &[
            ("content-type", "text/plain"),
            ("origin", "https://evil.example"),
        ],
        first,
    )
    .await;
    assert_eq!(run.stream.status, StatusCode::FORBIDDEN);
    assert_nothing_started(&h, "browser-shaped requests");
    // The proxy still serves Cursor.
    h.normal_run_succeeds("after-pages").await;
}

/// DNS rebinding: a page at `evil.example` (re-pointed at 127.0.0.1) reaches the plain door;
/// its requests name `Host: evil.example` and are refused before anything reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_on_the_direct_door_is_refused() {
    let h = harness::harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    let door = h.http_door();
    let bidi = Bidi::new(&door, "req-rebind");
    let append = bidi.append_bytes(0, &run_request(OURS, "conv-rebind", "hi", true));
    let mut conn = door.connect(Alpn::H1).await;
    let req = connect_request(
        BIDI_APPEND,
        "application/proto",
        "req-rebind",
        chunked(append),
    );
    let resp = tokio::time::timeout(STEP, conn.send("evil.example:8080", req))
        .await
        .expect("answered within the step timeout")
        .expect("answered");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("evil.example"));
    // A passthrough path too: nothing of Cursor's is read back for the page.
    let mut conn = door.connect(Alpn::H1).await;
    let req = Request::get("/aiserver.v1.AiService/AvailableModels")
        .body(chunked(Bytes::new()))
        .expect("request");
    let resp = conn.send("evil.example", req).await.expect("answered");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_nothing_started(&h, "rebinding");
    assert!(h
        .upstream
        .recorded_on("/aiserver.v1.AiService/AvailableModels")
        .is_empty());
    // Loopback and Cursor's names still pass.
    let bidi = Bidi::new(&door, "req-local");
    let store = Store::default();
    bidi.send(&run_request(OURS, "conv-local", "hi", true))
        .await;
    let mut stream = bidi.open_sse().await;
    let t = play(&mut stream, Sink::Bidi(&bidi), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
}

/// A chat stream written one event at a time, slowly enough for a taker to come mid-run.
fn slow_answer(texts: &[&str]) -> Reply {
    let mut body = String::new();
    for t in texts {
        body.push_str(&harness::partial(t));
    }
    body.push_str(concat!(
        "data: {\"id\":\"p\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"p\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4}}\n\n",
        "data: [DONE]\n\n",
    ));
    let piece = harness::partial(texts[0]).len();
    Reply::sse(body)
        .chunked(piece)
        .delay(Duration::from_millis(300))
}

/// A second local client with a live request id (and without the owner's credentials) tries
/// to read the run's output and answer its messages: refused; the owner keeps its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_with_a_live_request_id_fails_and_the_owner_keeps_its_stream() {
    let h = harness::harness(vec![slow_answer(&["one ", "two ", "three "])], |_| {}).await;
    let door = h.connect_door();
    let store = Store::default();
    let owner = Bidi::new(&door, "req-live");
    owner
        .send(&run_request(OURS, "conv-live", "Count", true))
        .await;
    let mut stream = owner.open_sse().await;
    let first = play_until(&mut stream, Sink::Bidi(&owner), &store, |m| {
        !text_of(std::slice::from_ref(m)).is_empty()
    })
    .await;
    assert_eq!(first.text(), "one ");

    let taker = Bidi::new(&door, "req-live")
        .sse_header("authorization", "Bearer someone-else")
        .append_header("authorization", "Bearer someone-else");
    let mut taken = taker.open_sse().await;
    match taken.next().await {
        Some(Received::End(end)) => {
            let err = end.error.expect("an error end frame");
            assert_eq!(err.code, Code::PermissionDenied, "{err:?}");
        }
        other => panic!("the taker got {other:?}"),
    }
    let forged = taker.append_bytes(7, &client_heartbeat());
    let answer = taker.append_body(forged).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{:?}", answer.body);
    // Without any credential at all: the same.
    let bare = Bidi::new(&door, "req-live").sse_header("authorization", "");
    let mut taken = bare.open_sse().await;
    assert!(matches!(taken.next().await, Some(Received::End(e)) if e.error.is_some()));

    let rest = play(&mut stream, Sink::Bidi(&owner), &store).await;
    assert_eq!(rest.text(), "two three ");
    assert!(rest.end().error.is_none(), "{:?}", rest.end().error);
    assert!(rest.turn_ended().is_some());
    assert_eq!(h.provider.requests().len(), 1);
}

/// The status page is read-only and same-origin: no CORS grant, nothing but GET and HEAD, and
/// no request id in `status.json` while a run is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_grants_no_origin_and_names_no_request_id() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = harness::harness(vec![slow_answer(&["a ", "b "])], |_| {}).await;
    let door = h.connect_door();
    let store = Store::default();
    let owner = Bidi::new(&door, "req-status-live-3f2a");
    owner
        .send(&run_request(OURS, "conv-status", "Count", true))
        .await;
    let mut stream = owner.open_sse().await;
    let _ = play_until(&mut stream, Sink::Bidi(&owner), &store, |m| {
        !text_of(std::slice::from_ref(m)).is_empty()
    })
    .await;
    let addr = h.server.proxy_addr();
    let ask = |head: String| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(head.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        String::from_utf8_lossy(&raw).into_owned()
    };
    let got = ask(format!(
        "GET /__cursor-byok/status.json HTTP/1.1\r\nHost: {addr}\r\nOrigin: https://evil.example\r\nConnection: close\r\n\r\n"
    ))
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        !got.to_ascii_lowercase().contains("access-control-allow"),
        "{got}"
    );
    assert!(!got.contains("req-status-live-3f2a"), "{got}");
    let posted = ask(format!(
        "POST /__cursor-byok/status.json HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    ))
    .await;
    assert!(posted.starts_with("HTTP/1.1 405"), "{posted}");
    let preflight = ask(format!(
        "OPTIONS /__cursor-byok/status.json HTTP/1.1\r\nHost: {addr}\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\nConnection: close\r\n\r\n"
    ))
    .await;
    assert!(!preflight.starts_with("HTTP/1.1 2"), "{preflight}");
    assert!(!preflight
        .to_ascii_lowercase()
        .contains("access-control-allow"));
    let rest = play(&mut stream, Sink::Bidi(&owner), &store).await;
    assert!(rest.end().error.is_none());
}

/// Another local user, who cannot read the per-install secret, reaches the listener: a 407
/// that says what to do, and no tunnel; Cursor, wired with the secret, gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_local_client_without_the_secret_is_refused() {
    use base64::Engine;
    use tokio::io::AsyncReadExt;
    let h = harness::harness(vec![Reply::sse(TEXT_SSE)], |c| {
        let dir = c.data_dir();
        assert!(c.use_install_secret(&dir).expect("the secret"));
    })
    .await;
    let proxy = h.server.proxy_addr();
    let (status, head, mut rest) =
        common::client::connect_raw(proxy, "api2.cursor.sh:443", None).await;
    assert_eq!(status, 407, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authenticate: basic"),
        "{head}"
    );
    let mut body = vec![0u8; 4096];
    let n = tokio::time::timeout(STEP, rest.read(&mut body))
        .await
        .expect("the body")
        .expect("read");
    let body = String::from_utf8_lossy(&body[..n]);
    assert!(body.contains("setup cursor"), "{body}");
    let wrong = base64::engine::general_purpose::STANDARD.encode("cursor-byok:guess");
    let (status, _, _) =
        common::client::connect_raw(proxy, "api2.cursor.sh:443", Some(&format!("Basic {wrong}")))
            .await;
    assert_eq!(status, 407);

    let secret = std::fs::read_to_string(h.data_dir().join("proxy-secret")).expect("the file");
    let good =
        base64::engine::general_purpose::STANDARD.encode(format!("cursor-byok:{}", secret.trim()));
    let (status, head, _) =
        common::client::connect_raw(proxy, "api2.cursor.sh:443", Some(&format!("Basic {good}")))
            .await;
    assert_eq!(status, 200, "{head}");
    assert!(h.provider.requests().is_empty());
}
