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

/// The TRACE-level log capture every test in this binary shares (one global subscriber).
fn capture() -> Capture {
    static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let capture = Capture::default();
            let writer = capture.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
            capture
        })
        .clone()
}

/// Panic with the log line holding any of `secrets`.
fn assert_logs_clean(logs: &str, secrets: &[String]) {
    for s in secrets {
        if let Some(at) = logs.find(s.as_str()) {
            let start = logs[..at].rfind('\n').map_or(0, |i| i + 1);
            let end = logs[at..].find('\n').map_or(logs.len(), |i| at + i);
            panic!("the logs contain {s:?}: {}", &logs[start..end]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_logs_errors_status_or_files() {
    let capture = capture();

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
    for (path, body) in status_pages(&h).await {
        assert_clean(path, &body);
    }
    let snapshot = serde_json::to_string(&h.server.status().snapshot()).unwrap();
    // The run is there, named by a digest of its request id (never the id itself).
    assert!(
        snapshot.contains(&cursor_byok::status::run_id("req-secret-2")),
        "{snapshot}"
    );
    assert!(!snapshot.contains("req-secret-2"), "{snapshot}");
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
    assert_logs_clean(&logs, &SECRETS.map(String::from));
}

const ORG_TOKEN: &str = "sek-org-SECRET-4f1c9a";
const ECHO_KEY: &str = "sk-echo-SECRET-77aa11";

/// `value` and the encodings a provider might echo it in.
fn forms(value: &str) -> Vec<String> {
    use base64::Engine;
    let pct = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC);
    vec![
        value.to_string(),
        base64::engine::general_purpose::STANDARD.encode(value),
        pct.to_string(),
    ]
}

/// The status page's JSON and HTML from the proxy listener, each with its path.
async fn status_pages(h: &harness::Harness) -> Vec<(&'static str, String)> {
    let tcp = tokio::net::TcpStream::connect(h.server.proxy_addr())
        .await
        .unwrap();
    let mut status = Sender::handshake(tcp, Alpn::H1).await;
    let mut pages = Vec::new();
    for path in ["/__cursor-byok/status.json", "/__cursor-byok/status"] {
        let req = Request::get(path).body(client::empty()).unwrap();
        let resp = status
            .send(&h.server.proxy_addr().to_string(), req)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let body = String::from_utf8_lossy(&client::collect(resp).await).into_owned();
        pages.push((path, body));
    }
    pages
}

/// Status JSON and HTML, the snapshot, and every file in the data dir, without `secrets`.
async fn assert_status_and_files_clean(h: &harness::Harness, secrets: &[String]) {
    let mut shown = vec![serde_json::to_string(&h.server.status().snapshot()).unwrap()];
    shown.extend(status_pages(h).await.into_iter().map(|(_, body)| body));
    let mut files = Vec::new();
    walk(&h.data_dir(), &mut files);
    for f in &files {
        shown.push(String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned());
    }
    for text in &shown {
        for s in secrets {
            assert!(!text.contains(s.as_str()), "{s:?} shown in {text}");
        }
    }
}

/// A provider that echoes the request's headers — a configured extra header and the key, as
/// written, base64- and percent-encoded — in a 400 body, an SSE error event and a non-JSON 502:
/// none of it reaches the Connect end frame, the logs, the status page or the data dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_header_values_are_scrubbed_everywhere() {
    let capture = capture();
    let [raw, b64, pct] = <[String; 3]>::try_from(forms(ORG_TOKEN)).unwrap();
    let echo = format!(
        "invalid headers: x-org-token={raw} (base64 {b64}, url {pct}); authorization=Bearer {ECHO_KEY}"
    );
    let body_400 = serde_json::json!({"error": {"message": echo, "type": "invalid_request_error"}});
    let sse_error = format!(
        "data: {}\n\n",
        serde_json::json!({"error": {"message": echo, "type": "server_error"}})
    );
    let html_502 = format!("<html><pre>{echo}</pre></html>");
    let replies = vec![
        Reply::json(400, body_400.to_string()),
        Reply::sse(sse_error),
        Reply::json(502, html_502),
    ];
    let h = harness_keyed(replies, ECHO_KEY, |c| {
        let fake = c.providers.get_mut("fake").unwrap();
        fake.headers.insert(
            "x-org-token".into(),
            cursor_byok::base::secret::Secret::new(ORG_TOKEN),
        );
    })
    .await;
    let door = h.connect_door();
    let conn = h2_conn(&door).await;
    let store = Store::default();
    let mut secrets = forms(ORG_TOKEN);
    secrets.extend(forms(ECHO_KEY));
    for (i, expect) in ["400", "server error", "502"].into_iter().enumerate() {
        let first = frame(&run_request(OURS, &format!("conv-echo-{i}"), "hi", true));
        let mut run = run_with_headers(&conn, &door, &format!("req-echo-{i}"), &[], first).await;
        let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
        let err = t.end().error.clone().expect("a provider error");
        let mut shown = format!("{err:?}");
        if let Ok(Some(details)) = err.decode_error_details() {
            shown.push_str(&format!("{details:?}"));
        }
        eprintln!("end frame {i}: {}", err.message);
        assert!(err.message.contains(expect), "{}", err.message);
        assert!(err.message.contains("[redacted]"), "{}", err.message);
        for s in &secrets {
            assert!(
                !shown.contains(s.as_str()),
                "{s:?} in the end frame: {shown}"
            );
        }
    }
    // The header really went out, and the provider really echoed it.
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].header("x-org-token"), Some(ORG_TOKEN));
    assert_status_and_files_clean(&h, &secrets).await;
    assert_logs_clean(&capture.text(), &secrets);
}

const PROXY_PASSWORD: &str = "p@ss:w%rd-SECRET-31";
const PROXY_PASSWORD_ENCODED: &str = "p%40ss%3Aw%25rd-SECRET-31";

/// An outbound proxy that admits the first tunnel only with `Basic us:er:<password>` (then
/// echoes), and refuses every later one with a 407 whose reason echoes the credentials.
async fn outbound_proxy() -> std::net::SocketAddr {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let plain = format!("us:er:{PROXY_PASSWORD}");
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(plain)
    );
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut stream, _)) = listener.accept().await {
            let head = client::read_head(&mut stream).await;
            let auth = head
                .lines()
                .find_map(|l| l.strip_prefix("Proxy-Authorization: "))
                .unwrap_or_default()
                .to_string();
            if first && auth == expected {
                first = false;
                stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 256];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        let _ = stream.write_all(&buf[..n]).await;
                    }
                });
            } else {
                let answer = format!("HTTP/1.1 407 no for {auth} {PROXY_PASSWORD}\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        }
    });
    addr
}

/// `upstream.proxy` with a password holding `@`, `:` and `%` (percent-encoded in the URL)
/// opens a tunnel; a refusal echoing the credentials shows none of them to the client or logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_proxy_credentials_work_and_never_show() {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let capture = capture();
    let proxy = outbound_proxy().await;
    let url = format!("http://us%3Aer:{PROXY_PASSWORD_ENCODED}@{proxy}");
    let h = harness_keyed(vec![], API_KEY, |c| {
        c.upstream.proxy = Some(cursor_byok::base::secret::Secret::new(url));
    })
    .await;
    let mut tunnel = client::tunnel(h.server.proxy_addr(), "outside.example:443").await;
    tunnel.write_all(b"through").await.unwrap();
    let mut buf = [0u8; 7];
    tunnel.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"through");

    let (status, head, mut refused) =
        client::connect_raw(h.server.proxy_addr(), "outside.example:443", None).await;
    assert_eq!(status, 502, "{head}");
    let mut body = vec![0u8; 1024];
    let n = refused.read(&mut body).await.unwrap();
    let body = String::from_utf8_lossy(&body[..n]).into_owned();
    eprintln!("refused: {body}");
    assert!(body.contains("407"), "{body}");
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("us:er:{PROXY_PASSWORD}"));
    let secrets = [
        PROXY_PASSWORD.to_string(),
        PROXY_PASSWORD_ENCODED.to_string(),
        b64,
    ];
    for s in &secrets {
        assert!(!body.contains(s.as_str()), "{s:?} in {body}");
    }
    assert_status_and_files_clean(&h, &secrets).await;
    assert_logs_clean(&capture.text(), &secrets);
}

const CLIENT_BEARER: &str = "cursor-run-SECRET-5b7d20";
const CLIENT_MODEL_KEY: &str = "sk-client-SECRET-8c1e44";

/// The client's own secrets — its `authorization` bearer token and the key in
/// `requested_model.credentials` — are scrubbed from a provider error that echoes them, on both
/// transports, and leave the scrubber when the run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_echoing_the_clients_secrets_is_scrubbed_while_the_run_lives() {
    use common::agent_client::Bidi;
    use cursor_byok::proto::agent::v1 as pb;
    let capture = capture();
    let echo = |bearer: &str| {
        let b64 = forms(CLIENT_MODEL_KEY)[1].clone();
        let body = serde_json::json!({"error": {"message": format!(
            "bad request from {bearer}; key {CLIENT_MODEL_KEY} ({b64})"
        ), "type": "invalid_request_error"}});
        Reply::json(400, body.to_string())
    };
    let h = harness_keyed(
        vec![echo(CLIENT_BEARER), echo("cursor-session-token")],
        API_KEY,
        |_| {},
    )
    .await;
    let with_key = |conv: &str| {
        let mut m = run_request(OURS, conv, "hi", true);
        if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut m.message {
            r.requested_model.as_mut().unwrap().credentials = Some(
                pb::requested_model::Credentials::ApiKeyCredentials(pb::ApiKeyCredentials {
                    api_key: CLIENT_MODEL_KEY.into(),
                    base_url: None,
                }),
            );
        }
        m
    };
    let mut secrets = forms(CLIENT_BEARER);
    secrets.extend(forms(CLIENT_MODEL_KEY));
    let store = Store::default();
    let door = h.connect_door();

    // HTTP/2 Run, with the client's own bearer token.
    let conn = h2_conn(&door).await;
    let bearer = format!("Bearer {CLIENT_BEARER}");
    let first = frame(&with_key("conv-client-secrets-1"));
    let headers = [("authorization", bearer.as_str())];
    let mut run = run_with_headers(&conn, &door, "req-client-secrets-1", &headers, first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    // RunSSE + BidiAppend (the test client's bearer is `cursor-session-token`).
    let bidi = Bidi::new(&door, "req-client-secrets-2");
    bidi.send(&with_key("conv-client-secrets-2")).await;
    let mut sse = bidi.open_sse().await;
    let t2 = play(&mut sse, Sink::Bidi(&bidi), &store).await;
    let bidi_secrets: Vec<String> = secrets[3..]
        .iter()
        .cloned()
        .chain(forms("cursor-session-token"))
        .collect();
    for (t, secrets) in [(&t, &secrets), (&t2, &bidi_secrets)] {
        let err = t.end().error.clone().expect("a provider error");
        assert!(err.message.contains("400"), "{}", err.message);
        assert!(err.message.contains("[redacted]"), "{}", err.message);
        let shown = format!("{err:?}");
        for s in secrets {
            assert!(
                !shown.contains(s.as_str()),
                "{s:?} in the end frame: {shown}"
            );
        }
    }
    // The provider really echoed them.
    assert_eq!(h.provider.requests().len(), 2);
    assert_status_and_files_clean(&h, &secrets).await;
    assert_logs_clean(&capture.text(), &secrets);
    // The run is over: its values are no longer held.
    let released = common::wait_until(std::time::Duration::from_secs(5), || {
        cursor_byok::base::secret::scrub(CLIENT_BEARER) == CLIENT_BEARER
    })
    .await;
    assert!(released, "still registered");
    assert_eq!(
        cursor_byok::base::secret::scrub(CLIENT_MODEL_KEY),
        CLIENT_MODEL_KEY
    );
}
