//! The product as a user runs it: the `cursor-byok run` binary in its own process, with its own
//! data directory (it generates the CA there), a fake provider and a fake Cursor upstream. A
//! client plays Cursor through the CONNECT door over TLS, trusting the CA the binary wrote: an
//! agent run with a tool round on each transport, then the status page, then SIGTERM.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::agent_client::{frame, run_request, text_of, updates, Bidi, Door, H2Run, ServerStream};
use common::agent_client::{Received, API};
use common::cursor_upstream::{FakeUpstream, AGENT_RUN, AGENT_RUN_SSE, BIDI_APPEND};
use common::fake_cursor::FakeCursor;
use common::fake_provider::{text_sse, tool_sse, FakeProvider, Reply};
use cursor_byok::connect::EndStream;
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proxy::DEFAULT_GRACE;
use cursor_byok::status::StatusSnapshot;
use pb::exec_server_message::Message as X;
use pb::interaction_update::Message as Update;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Our configured model as Cursor names it.
const OURS: &str = "byok-fake-model";
const PROVIDER_KEY: &str = "sk-e2e-not-a-real-key";
/// What the binary may take to exit after SIGTERM: its grace for live streams
/// ([`DEFAULT_GRACE`]) plus room for a loaded machine.
const EXIT_WITHIN: Duration = Duration::from_secs(DEFAULT_GRACE.as_secs() + 5);

struct Binary {
    child: tokio::process::Child,
    addr: SocketAddr,
    door: Door,
    /// What the binary wrote to stderr, for the failure messages.
    stderr: tokio::sync::watch::Receiver<String>,
    _dir: tempfile::TempDir,
}

/// Start `cursor-byok run` with our model on `provider` and Cursor's API at `upstream`; return
/// once it has printed its banner (it listens by then), trusting the CA it generated.
async fn start(provider: &FakeProvider, upstream: &FakeUpstream) -> Binary {
    let dir = tempfile::tempdir().unwrap();
    // A free port for the listener (the config names it; the child binds it).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = format!(
        r#"
listen = "{addr}"
[agent]
provider_max_retries = 0
[upstream]
extra_roots = "{roots}"
connect_timeout_secs = 2
[upstream.resolve]
"{API}" = "{upstream}"
[providers.fake]
kind = "openai-chat"
base_url = "{base}"
api_key = "{PROVIDER_KEY}"
[[models]]
id = "fake-model"
display_name = "Fake Model"
provider = "fake"
model = "gpt-fake"
"#,
        roots = upstream.ca_pem_path.display(),
        upstream = upstream.addr,
        base = provider.base_url(),
    );
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config).unwrap();
    let data_dir = dir.path().join("data");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-byok"))
        .arg("--config")
        .arg(&config_path)
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("run")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start cursor-byok");

    // The banner names the listener once it is bound: wait for that line, not for a time.
    let (tx, rx) = tokio::sync::watch::channel(String::new());
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            tx.send_modify(|s| {
                s.push_str(&line);
                s.push('\n');
            });
        }
    });
    let listening = format!("listening on http://{addr}");
    let mut seen = rx.clone();
    let up = tokio::time::timeout(
        Duration::from_secs(30),
        seen.wait_for(|s| s.contains(&listening)),
    )
    .await;
    assert!(
        matches!(up, Ok(Ok(_))),
        "the binary did not print {listening:?}; stderr:\n{}",
        rx.borrow().as_str()
    );

    Binary {
        // Wired the way `setup cursor` wires Cursor: the per-install secret on every CONNECT.
        door: Door::ConnectAuth {
            proxy: addr,
            roots: roots_from(&data_dir.join("ca.pem")),
            auth: common::proxy_process::secret_auth(&data_dir),
        },
        child,
        addr,
        stderr: rx,
        _dir: dir,
    }
}

/// A root store holding the CA certificate the binary wrote.
fn roots_from(pem: &Path) -> rustls::RootCertStore {
    let pem = std::fs::read(pem).expect("the binary wrote its CA into the data dir");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert.expect("a PEM certificate")).unwrap();
    }
    assert_eq!(roots.len(), 1, "one CA certificate");
    roots
}

impl Binary {
    fn stderr(&self) -> String {
        self.stderr.borrow().clone()
    }

    /// `GET /__cursor-byok/status.json` on the proxy listener, decoded.
    async fn status(&self) -> StatusSnapshot {
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "GET /__cursor-byok/status.json HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let text = String::from_utf8(raw).expect("a UTF-8 answer");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("transfer-encoding"),
            "a whole body: {head}"
        );
        serde_json::from_str(body).unwrap_or_else(|e| panic!("status.json: {e}: {body}"))
    }

    /// Send SIGTERM.
    async fn sigterm(&self) {
        let pid = self.child.id().expect("still running").to_string();
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {pid}");
    }

    /// The exit status, which must come within [`EXIT_WITHIN`], and what went to stderr.
    async fn exit(mut self) -> (std::process::ExitStatus, String) {
        let exit = tokio::time::timeout(EXIT_WITHIN, self.child.wait()).await;
        // The reader of stderr sees its end when the process is gone.
        let mut rx = self.stderr.clone();
        let _ = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|_| false)).await;
        let stderr = self.stderr();
        match exit {
            Ok(status) => (status.unwrap(), stderr),
            Err(_) => panic!("no exit within {EXIT_WITHIN:?} of SIGTERM; stderr:\n{stderr}"),
        }
    }

    /// SIGTERM, then [`Binary::exit`].
    async fn terminate(self) -> (std::process::ExitStatus, String) {
        self.sigterm().await;
        self.exit().await
    }
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    /// HTTP/2 `Run`.
    H2,
    /// `RunSSE` + `BidiAppend` over HTTP/1.1.
    Sse,
}

/// One run as the client holds it: the server stream and where its answers go.
enum Sink {
    H2(tokio::sync::mpsc::Sender<bytes::Bytes>),
    Bidi(Bidi),
}

async fn open(
    door: &Door,
    transport: Transport,
    request_id: &str,
    first: &pb::AgentClientMessage,
) -> (ServerStream, Sink) {
    match transport {
        Transport::H2 => {
            let H2Run { tx, stream } = H2Run::open(door, request_id, first).await;
            assert_eq!(stream.status, http::StatusCode::OK);
            assert_eq!(stream.headers["content-type"], "application/connect+proto");
            (stream, Sink::H2(tx))
        }
        Transport::Sse => {
            let bidi = Bidi::new(door, request_id);
            let sse = {
                let b = bidi.clone();
                tokio::spawn(async move { b.open_sse().await })
            };
            bidi.send(first).await;
            let stream = sse.await.unwrap();
            assert_eq!(stream.status, http::StatusCode::OK);
            assert_eq!(stream.headers["content-type"], "text/event-stream");
            (stream, Sink::Bidi(bidi))
        }
    }
}

/// Play Cursor's side (execs against `client`'s workspace) until the end frame.
async fn play(
    stream: &mut ServerStream,
    sink: &Sink,
    client: &mut FakeCursor,
) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let mut messages = Vec::new();
    loop {
        match stream.next().await {
            None => panic!("the stream ended without an end frame after {messages:?}"),
            Some(Received::End(end)) => return (messages, end),
            Some(Received::Message(m)) => {
                for answer in client.respond(&m) {
                    match sink {
                        // The run may have ended already (its request body is gone then).
                        Sink::H2(tx) => {
                            let _ = tx.send(frame(&answer)).await;
                        }
                        Sink::Bidi(b) => b.send(&answer).await,
                    }
                }
                messages.push(*m);
            }
        }
    }
}

/// A run whose model asks to read a file, gets its content from the client, and answers.
async fn tool_round(bin: &Binary, provider: &FakeProvider, transport: Transport, n: usize) {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hello.txt"), "hello from the workspace\n").unwrap();
    let call = format!("call_{transport:?}");
    provider.push(Reply::sse(tool_sse(&[(
        &call,
        "read_file",
        r#"{"path":"hello.txt"}"#,
    )])));
    provider.push(Reply::sse(text_sse("It says hello.")));

    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, &format!("conv-e2e-{transport:?}"), "read it", false);
    let (mut stream, sink) = open(
        &bin.door,
        transport,
        &format!("req-e2e-{transport:?}"),
        &first,
    )
    .await;
    let (messages, end) = tokio::time::timeout(
        Duration::from_secs(60),
        play(&mut stream, &sink, &mut client),
    )
    .await
    .unwrap_or_else(|_| panic!("{transport:?}: no end frame; stderr:\n{}", bin.stderr()));

    assert!(end.error.is_none(), "{transport:?}: {:?}", end.error);
    assert!(
        text_of(&messages).ends_with("It says hello."),
        "{transport:?}: {messages:?}"
    );
    // The client was asked to read the file, the tool call started and completed, the turn ended.
    assert!(
        client
            .execs
            .iter()
            .any(|e| matches!(&e.message, Some(X::ReadArgs(r)) if r.path.ends_with("hello.txt"))),
        "{transport:?}: {:?}",
        client.execs
    );
    let ups = updates(&messages);
    let started = ups
        .iter()
        .filter(|u| matches!(u, Update::ToolCallStarted(t) if t.model_call_id == call))
        .count();
    let completed = ups
        .iter()
        .filter(|u| matches!(u, Update::ToolCallCompleted(t) if t.model_call_id == call))
        .count();
    assert_eq!((started, completed), (1, 1), "{transport:?}: {ups:?}");
    assert!(
        ups.iter().any(|u| matches!(u, Update::TurnEnded(_))),
        "{transport:?}"
    );

    // The provider was called twice, the second time with the file's content as the tool's
    // result, and with the user's key.
    let requests = provider.requests();
    assert_eq!(requests.len(), 2 * n, "{transport:?}");
    let second = &requests[2 * n - 1];
    assert_eq!(
        second.header("authorization"),
        Some(format!("Bearer {PROVIDER_KEY}").as_str())
    );
    let results: Vec<String> = second.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool" && m["tool_call_id"] == call.as_str())
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(results.len(), 1, "{transport:?}: {results:?}");
    assert!(
        results[0].contains("hello from the workspace"),
        "{transport:?}: {results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_a_tool_round_on_both_transports_and_exits_on_sigterm() {
    let upstream = FakeUpstream::start(&[API]).await;
    let provider = FakeProvider::start(vec![]).await;
    let bin = start(&provider, &upstream).await;

    tool_round(&bin, &provider, Transport::H2, 1).await;
    tool_round(&bin, &provider, Transport::Sse, 2).await;

    // The status page saw both runs through to their end, and nothing is active.
    let snap = bin.status().await;
    assert_eq!(snap.service, "cursor-byok");
    assert!(snap.active.is_empty(), "{:?}", snap.active);
    assert_eq!(
        (snap.totals.finished, snap.totals.ok),
        (2, 2),
        "{:?}",
        snap.totals
    );
    let mut runs: Vec<(String, &str, Option<&str>, Option<&str>)> = snap
        .recent
        .iter()
        .map(|r| {
            assert_eq!(r.model, OURS, "{r:?}");
            // Named by a digest of the request id, never the id itself.
            let id = ["req-e2e-H2", "req-e2e-Sse"]
                .into_iter()
                .find(|id| cursor_byok::status::run_id(id) == r.run_id)
                .unwrap_or("unknown")
                .to_string();
            (
                id,
                r.transport.as_str(),
                r.target.as_deref(),
                r.outcome.as_deref(),
            )
        })
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            (
                "req-e2e-H2".to_string(),
                "Run",
                Some("fake/gpt-fake"),
                Some("ok")
            ),
            (
                "req-e2e-Sse".to_string(),
                "RunSSE",
                Some("fake/gpt-fake"),
                Some("ok")
            ),
        ]
    );

    // A BYOK run never reached Cursor's servers.
    for path in [AGENT_RUN, AGENT_RUN_SSE, BIDI_APPEND] {
        assert!(
            upstream.recorded_on(path).is_empty(),
            "{path} reached the upstream"
        );
    }

    let (status, stderr) = bin.terminate().await;
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    assert!(
        stderr.contains("signal received; shutting down"),
        "stderr:\n{stderr}"
    );
    // The key never reached the log.
    assert!(!stderr.contains(PROVIDER_KEY), "stderr:\n{stderr}");
}

/// A stream that is still answering when SIGTERM comes finishes within the grace, whole, and
/// then the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_live_run_finish_then_exits() {
    // Ten text deltas of one size, written one at a time 100 ms apart.
    let words: Vec<String> = (0..10).map(|i| format!("w{i} ")).collect();
    let event = |text: &str| {
        let delta = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"content":text}}]});
        format!("data: {delta}\n\n")
    };
    let piece = event(&words[0]).len();
    let mut body: String = words.iter().map(|w| event(w)).collect();
    body += &text_sse("");
    let upstream = FakeUpstream::start(&[API]).await;
    let provider = FakeProvider::start(vec![Reply::sse(body)
        .chunked(piece)
        .delay(Duration::from_millis(100))])
    .await;
    let bin = start(&provider, &upstream).await;

    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-e2e-term", "count", true);
    let (mut stream, sink) = open(&bin.door, Transport::H2, "req-e2e-term", &first).await;
    // Read to the first text, then SIGTERM while the rest is still coming.
    let mut messages = Vec::new();
    while text_of(&messages).is_empty() {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
            Ok(Some(Received::Message(m))) => messages.push(*m),
            other => panic!(
                "no text before the end: {other:?}; stderr:\n{}",
                bin.stderr()
            ),
        }
    }
    assert!(
        text_of(&messages).len() < words.concat().len(),
        "{messages:?}"
    );
    bin.sigterm().await;
    let termed = std::time::Instant::now();

    let (rest, end) = tokio::time::timeout(EXIT_WITHIN, play(&mut stream, &sink, &mut client))
        .await
        .unwrap_or_else(|_| panic!("the live run did not finish; stderr:\n{}", bin.stderr()));
    assert!(end.error.is_none(), "{:?}", end.error);
    messages.extend(rest);
    assert_eq!(text_of(&messages), words.concat());
    assert!(
        updates(&messages)
            .iter()
            .any(|u| matches!(u, Update::TurnEnded(_))),
        "{messages:?}"
    );

    // The client lets go of its connection: nothing is live, so the exit does not wait for the
    // rest of the grace.
    drop((stream, sink));
    let (status, stderr) = bin.exit().await;
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    assert!(
        termed.elapsed() < DEFAULT_GRACE,
        "exit {:?} after SIGTERM; stderr:\n{stderr}",
        termed.elapsed()
    );
    assert!(!stderr.contains(PROVIDER_KEY), "stderr:\n{stderr}");
}
