//! The real proxy (every door open) with a fake provider and a fake Cursor upstream, for the
//! hardening, secrets and load tests. Included with `#[path = "common/harness.rs"] mod harness;`
//! next to `mod common;`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use cursor_byok::config::Config;
use cursor_byok::connect::{ConnectError, EndStream};
use cursor_byok::proxy::Server;
use cursor_byok::status::Status;
use cursor_byok::tls::CertificateAuthority;
use http::StatusCode;
use rustls::pki_types::CertificateDer;

use crate::common::agent_client::{
    play, run_request, Door, H2Run, Received, ServerStream, Sink, Store, Transcript, API,
};
use crate::common::client::{self, Alpn, Sender};
use crate::common::cursor_upstream::{FakeUpstream, AGENT_RUN, AGENT_RUN_SSE, BIDI_APPEND};
use crate::common::fake_provider::{FakeProvider, Reply};

/// Our configured model as Cursor names it.
pub const OURS: &str = "byok-fake-model";
/// A model of Cursor's own.
pub const CURSORS: &str = "claude-4.5-sonnet";

pub const TEXT_SSE: &str = concat!(
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", world\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n",
    "data: [DONE]\n\n",
);
pub const TEXT: &str = "Hello, world";

/// One streamed text event (no end).
pub fn partial(text: &str) -> String {
    format!("data: {{\"id\":\"p\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
}

pub struct Harness {
    pub upstream: FakeUpstream,
    pub provider: FakeProvider,
    pub server: Server,
    pub our_ca: CertificateDer<'static>,
    pub dir: tempfile::TempDir,
}

/// The proxy's config text for a provider at `base_url` with key `api_key`.
pub fn config_text(base_url: &str, api_key: &str) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
[direct]
tls_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
[agent]
heartbeat_secs = 1
kv_timeout_secs = 3
provider_max_retries = 0
provider_idle_timeout_secs = 5
[providers.fake]
kind = "openai-chat"
base_url = "{base_url}"
api_key = "{api_key}"
[[models]]
id = "fake-model"
display_name = "Fake Model"
provider = "fake"
model = "gpt-fake"
"#
    )
}

pub async fn harness(replies: Vec<Reply>, tweak: impl FnOnce(&mut Config)) -> Harness {
    harness_keyed(replies, "sk-test-hardening", tweak).await
}

pub async fn harness_keyed(
    replies: Vec<Reply>,
    api_key: &str,
    tweak: impl FnOnce(&mut Config),
) -> Harness {
    harness_with_status(replies, api_key, Status::new(), tweak).await
}

/// [`harness_keyed`] reporting to `status` (e.g. one recording a capture).
pub async fn harness_with_status(
    replies: Vec<Reply>,
    api_key: &str,
    status: Status,
    tweak: impl FnOnce(&mut Config),
) -> Harness {
    let upstream = FakeUpstream::start(&[API]).await;
    let provider = FakeProvider::start(replies).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        Config::from_toml(&config_text(&provider.base_url(), api_key), "harness").unwrap();
    config.data_dir = Some(dir.path().to_path_buf());
    config.upstream.resolve.insert(API.into(), upstream.addr);
    config.upstream.extra_roots = Some(upstream.ca_pem_path.clone());
    config.upstream.connect_timeout_secs = Some(2);
    tweak(&mut config);
    let (ca, _) = CertificateAuthority::load_or_create(&dir.path().join("ca")).unwrap();
    let pem = std::fs::read(ca.cert_path()).unwrap();
    let our_ca = rustls_pemfile::certs(&mut pem.as_slice())
        .next()
        .unwrap()
        .unwrap();
    let server = Server::builder(config, ca)
        .status(status)
        .bind()
        .await
        .unwrap();
    Harness {
        upstream,
        provider,
        server,
        our_ca,
        dir,
    }
}

impl Harness {
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    pub fn connect_door(&self) -> Door {
        Door::Connect {
            proxy: self.server.proxy_addr(),
            roots: client::roots(&[&self.our_ca]),
        }
    }

    pub fn tls_door(&self) -> Door {
        Door::DirectTls {
            addr: self.server.tls_addr().unwrap(),
            roots: client::roots(&[&self.our_ca]),
        }
    }

    pub fn http_door(&self) -> Door {
        Door::DirectHttp {
            addr: self.server.http_addr().unwrap(),
        }
    }

    /// A normal text turn on a fresh connection must succeed: the proxy kept serving.
    pub async fn normal_run_succeeds(&self, tag: &str) {
        self.provider.push(Reply::sse(TEXT_SSE));
        let store = Store::default();
        let door = self.connect_door();
        let first = run_request(OURS, &format!("conv-ok-{tag}"), "hi", true);
        let mut run = H2Run::open(&door, &format!("req-ok-{tag}"), &first).await;
        assert_eq!(run.stream.status, StatusCode::OK);
        let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
        assert!(t.end().error.is_none(), "{tag}: {:?}", t.end().error);
        assert_eq!(t.text(), TEXT, "{tag}");
        assert!(t.turn_ended().is_some(), "{tag}");
    }

    /// The system prompt of the `i`-th provider request.
    pub fn system_prompt(&self, i: usize) -> String {
        let requests = self.provider.requests();
        let body = requests[i].json();
        body["messages"][0]["content"]
            .as_str()
            .expect("a system message")
            .to_string()
    }

    /// Nothing about agent runs reached Cursor's servers.
    pub fn assert_nothing_relayed(&self) {
        for path in [AGENT_RUN, AGENT_RUN_SSE, BIDI_APPEND] {
            assert!(
                self.upstream.recorded_on(path).is_empty(),
                "{path} reached the upstream"
            );
        }
    }

    /// Wait until no run is active on the status page; false on timeout.
    pub async fn wait_no_active_runs(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.server.status().snapshot().active.is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Read frames until the end frame without answering anything (a client that never acks a
/// blob nor answers an exec).
pub async fn silent(stream: &mut ServerStream) -> Transcript {
    let mut t = Transcript::default();
    loop {
        match stream.next().await {
            None => return t,
            Some(Received::End(end)) => {
                t.end = Some(end);
                return t;
            }
            Some(Received::Message(m)) => t.messages.push(*m),
        }
    }
}

/// The end frame's error, which must be there.
pub fn end_error(t: &Transcript) -> ConnectError {
    let end: &EndStream = t.end();
    end.error.clone().expect("an error end frame")
}

/// A second stream on an existing HTTP/2 connection.
pub fn h2_clone(sender: &Sender) -> Sender {
    match sender {
        Sender::H2(s) => Sender::H2(s.clone()),
        Sender::H1(_) => panic!("HTTP/2 only"),
    }
}

/// A `Run` on `conn` (HTTP/2) whose body starts with `first`, with extra / replaced headers.
pub async fn run_with_headers(
    conn: &Sender,
    door: &Door,
    request_id: &str,
    headers: &[(&str, &str)],
    first: Bytes,
) -> H2Run {
    H2Run::open_on(h2_clone(conn), door, request_id, headers, first).await
}

pub async fn h2_conn(door: &Door) -> Sender {
    door.connect(Alpn::H2).await
}

/// Memory in use by this process (VmRSS), in KiB; 0 where /proc is missing.
/// A number field (`VmRSS:` in KiB, `Threads:`) of `/proc/<pid>/status`; 0 when unreadable.
pub fn proc_status(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Threads of this process (tokio's blocking pool grows under load and shrinks after 10 s idle).
pub fn threads() -> u64 {
    proc_status("self", "Threads:")
}

pub fn rss_kib() -> u64 {
    proc_status("self", "VmRSS:")
}
