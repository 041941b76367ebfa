//! Secrets never leak: a full turn, a provider-401 turn and a relayed (Cursor's model) run, all
//! at TRACE log level with a recognisable provider API key and Cursor bearer token. Neither
//! appears in the captured logs, the end-frame messages, the status page, nor any file in the
//! data dir. (Its own test binary: it installs the global tracing subscriber.)

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::path::Path;

use common::agent_client::{frame, play, run_request, Sink, Store, API, STEP};
use common::client::{self, Alpn, Sender};
use common::cursor_upstream::AGENT_RUN;
use common::fake_provider::Reply;
use harness::{h2_conn, harness_keyed, run_with_headers, CURSORS, OURS, TEXT, TEXT_SSE};
use http::{Request, StatusCode};

const API_KEY: &str = "sk-test-SECRET-abc123";
const BEARER: &str = "Bearer cursor-token-SECRET-xyz";
const SECRETS: [&str; 3] = [API_KEY, BEARER, "cursor-token-SECRET-xyz"];

use common::logs::Logs as Capture;

fn assert_clean(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} contains the secret {s:?}");
    }
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, files);
        } else {
            files.push(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_logs_errors_status_or_files() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let unauthorized = r#"{"error":{"message":"Incorrect API key provided: sk-test-***123","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    let h = harness_keyed(
        vec![Reply::sse(TEXT_SSE), Reply::json(401, unauthorized)],
        API_KEY,
        |_| {},
    )
    .await;
    let door = h.connect_door();
    let conn = h2_conn(&door).await;
    let auth = [("authorization", BEARER)];
    let mut messages = Vec::new();

    // A full turn (the proxy asks for the request context, writes blobs, checkpoints).
    let store = Store::default();
    let first = frame(&run_request(OURS, "conv-secret", "hi", false));
    let mut run = run_with_headers(&conn, &door, "req-secret-1", &auth, first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), TEXT);

    // A turn the provider refuses.
    let first = frame(&run_request(OURS, "conv-secret-2", "hi", true));
    let mut run = run_with_headers(&conn, &door, "req-secret-2", &auth, first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    let err = t.end().error.clone().expect("a 401 error");
    messages.push(format!("{err:?}"));
    if let Ok(Some(details)) = err.decode_error_details() {
        messages.push(format!("{details:?}"));
    }

    // A run of Cursor's, relayed with the bearer.
    let first = frame(&run_request(CURSORS, "conv-secret-3", "hi", true));
    let run = run_with_headers(&conn, &door, "req-secret-3", &auth, first).await;
    let common::agent_client::H2Run { tx, stream } = run;
    drop(tx);
    let relayed = stream.raw_to_end().await;
    messages.push(String::from_utf8_lossy(&relayed).into_owned());

    // The secrets were really in play.
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {API_KEY}").as_str())
    );
    let recorded = h.upstream.wait_recorded(AGENT_RUN, 1, STEP).await;
    assert_eq!(recorded[0].headers["authorization"], BEARER);

    // The status page (HTML and JSON) on the proxy listener.
    let tcp = tokio::net::TcpStream::connect(h.server.proxy_addr())
        .await
        .unwrap();
    let mut status = Sender::handshake(tcp, Alpn::H1).await;
    for path in ["/__cursor-byok/status.json", "/__cursor-byok/status"] {
        let req = Request::get(path).body(client::empty()).unwrap();
        let resp = status
            .send(&h.server.proxy_addr().to_string(), req)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let body = client::collect(resp).await;
        assert_clean(path, &String::from_utf8_lossy(&body));
    }
    let snapshot = serde_json::to_string(&h.server.status().snapshot()).unwrap();
    assert!(snapshot.contains("req-secret-2"), "{snapshot}");
    assert_clean("the status snapshot", &snapshot);

    for m in &messages {
        assert_clean("an error message", m);
    }
    assert!(messages[0].contains("401"), "{}", messages[0]);

    let mut files = Vec::new();
    walk(&h.data_dir(), &mut files);
    assert!(!files.is_empty());
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert_clean(&f.display().to_string(), &String::from_utf8_lossy(&bytes));
    }

    let _ = API;
    let logs = capture.text();
    eprintln!(
        "captured {} bytes of TRACE logs, {} files in the data dir",
        logs.len(),
        files.len()
    );
    assert!(logs.contains("TRACE"), "trace level was captured");
    assert!(logs.contains("req-secret-1"), "our spans were captured");
    for s in SECRETS {
        if let Some(at) = logs.find(s) {
            let start = logs[..at].rfind('\n').map_or(0, |i| i + 1);
            let end = logs[at..].find('\n').map_or(logs.len(), |i| at + i);
            panic!("the logs contain {s:?}: {}", &logs[start..end]);
        }
    }
}
