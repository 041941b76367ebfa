//! The live status page: served by the proxy listener itself, never forwarded, and rendered in a
//! real browser. Headless Chromium loads it while a run is active and the run must appear in the
//! DOM that the page's script builds from the JSON it polls.
//!
//! Without `/usr/bin/chromium` the browser test is skipped with a message, unless
//! `STATUS_PAGE_REQUIRED=1` (set by `.ci/run`, which installs Chromium). With
//! `STATUS_PAGE_SCREENSHOT=<file.png>` it also saves a screenshot (the README's picture).

#[path = "common/skip.rs"]
mod skip;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cursor_byok::config::Config;
use cursor_byok::provider::Usage;
use cursor_byok::proxy::Server;
use cursor_byok::status::{FallbackRoute, RunStart, RunTicket, Status};
use cursor_byok::tls::CertificateAuthority;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHROMIUM: &str = "/usr/bin/chromium";
const ACTIVE_ID: &str = "req-active-7f3a";
const FAILED_ID: &str = "req-failed-19c2";

async fn start(dir: &Path) -> Server {
    let mut config = Config::from_toml("listen = \"127.0.0.1:0\"\n", "status test").unwrap();
    config.data_dir = Some(dir.to_path_buf());
    let (ca, _) = CertificateAuthority::load_or_create(&dir.join("ca")).unwrap();
    Server::builder(config, ca).bind().await.unwrap()
}

fn run(status: &Status, id: &str, model: &str, provider: &str, transport: &str) -> RunTicket {
    status.run_started(RunStart {
        request_id: id.into(),
        model: model.into(),
        provider: provider.into(),
        transport: transport.into(),
    })
}

fn usage(input: u64, output: u64) -> Option<Usage> {
    Some(Usage {
        input,
        output,
        // A warm prompt cache, as an agent's later turns have.
        cache_read: input * 3 / 5,
        ..Usage::default()
    })
}

/// A plausible afternoon: runs that ended every way, latency samples, and a run in progress.
/// `pace` stretches each run (in real time: the registry measures durations itself).
async fn populate(status: &Status, pace: Duration) -> Vec<RunTicket> {
    let finished = [
        (
            "req-0b41",
            "byok-gpt-5.1",
            "OpenAI",
            "RunSSE",
            3,
            "ok",
            usage(18_230, 912),
        ),
        (
            "req-5d0e",
            "byok-claude-sonnet-4-5",
            "Anthropic",
            "RunSSE",
            5,
            "ok",
            usage(42_118, 2_407),
        ),
        (
            "req-9a77",
            "byok-gpt-5.1",
            "OpenAI",
            "Run",
            1,
            "canceled",
            usage(9_804, 120),
        ),
        (
            FAILED_ID,
            "byok-deepseek-chat",
            "DeepSeek",
            "RunSSE",
            0,
            "error",
            None,
        ),
    ];
    for (id, model, provider, transport, steps, outcome, usage) in finished {
        let ticket = run(status, id, model, provider, transport);
        if let Some(u) = usage {
            // List prices of the example config's models; DeepSeek's run failed before usage.
            let cost = match model {
                "byok-gpt-5.1" => Some(u.input as f64 * 1.25e-6 + u.output as f64 * 10e-6),
                _ => Some(u.input as f64 * 3e-6 + u.output as f64 * 15e-6),
            };
            ticket.progress().usage(u, cost);
        }
        if id == "req-5d0e" {
            ticket.progress().route(FallbackRoute {
                target: Some("openrouter/anthropic/claude-sonnet-4.5".into()),
                skipped: vec![
                    "anthropic/claude-sonnet-4-5: Anthropic is overloaded (HTTP 529): Overloaded"
                        .into(),
                ],
            });
        }
        tokio::time::sleep(pace * steps).await;
        let error = (outcome == "error").then(|| {
            "DeepSeek rejected the API key (HTTP 401): Authentication Fails <invalid_request_error>"
                .to_string()
        });
        ticket.finish(outcome, error, usage);
    }
    for (p, ms) in [
        ("OpenAI", 412),
        ("OpenAI", 388),
        ("Anthropic", 655),
        ("DeepSeek", 1_210),
    ] {
        status.provider_latency(p, ms);
    }
    let active = run(
        status,
        ACTIVE_ID,
        "byok-claude-sonnet-4-5",
        "Anthropic",
        "RunSSE",
    );
    active.tokens(31_877, 1_204);
    tokio::time::sleep(pace * 2).await;
    vec![active]
}

/// Chromium, or `None` after reporting `test` as skipped.
fn chromium(test: &str) -> Option<PathBuf> {
    let path = PathBuf::from(CHROMIUM);
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("STATUS_PAGE_REQUIRED").as_deref() == Ok("1") {
        panic!("{CHROMIUM} is missing and STATUS_PAGE_REQUIRED=1 (`.ci/run` installs it)");
    }
    skip::skipped(
        test,
        &format!("{CHROMIUM} is not installed (apt-get install chromium)"),
    );
    None
}

/// Run headless Chromium on `url` with `extra` arguments; its standard output.
async fn chromium_run(browser: &Path, profile: &Path, url: &str, extra: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-proxy-server",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    // Timers run on virtual time: the page's one-second poll fires without real waiting.
    .arg("--virtual-time-budget=3000")
    .args(extra)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("chromium finished within 90 s")
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The part of `dom` from `start` to the next `end`.
fn section<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    let from = dom
        .find(start)
        .unwrap_or_else(|| panic!("no {start} in:\n{dom}"));
    let len = dom[from..].find(end).expect("section ends");
    &dom[from..from + len]
}

/// The `<tr>` the page rendered for `request_id`'s run (the embedded JSON has no such markup;
/// the page names a run by a digest of its request id, never the id itself).
fn row<'a>(dom: &'a str, request_id: &str) -> &'a str {
    assert!(!dom.contains(request_id), "the page shows a request id");
    let open = format!(
        "<tr data-run-id=\"{}\">",
        cursor_byok::status::run_id(request_id)
    );
    let start = dom
        .find(&open)
        .unwrap_or_else(|| panic!("no rendered row for {request_id} in:\n{dom}"));
    let len = dom[start..].find("</tr>").expect("row ends");
    &dom[start..start + len]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_shows_the_active_run() {
    let Some(browser) = chromium("browser_shows_the_active_run") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let screenshot = std::env::var("STATUS_PAGE_SCREENSHOT").ok();
    let pace = match screenshot {
        Some(_) => Duration::from_millis(700),
        None => Duration::ZERO,
    };
    let _active = populate(server.status(), pace).await;
    let url = format!("http://{}/__cursor-byok/status", server.proxy_addr());

    let dom = chromium_run(&browser, &dir.path().join("profile"), &url, &["--dump-dom"]).await;

    // Rendered from JSON fetched by the page itself, not only from the embedded first snapshot.
    assert!(
        dom.contains("data-source=\"poll\""),
        "the page never polled:\n{dom}"
    );
    let active = row(&dom, ACTIVE_ID);
    assert!(active.contains("byok-claude-sonnet-4-5"), "{active}");
    assert!(active.contains("Anthropic"), "{active}");
    assert!(active.contains("running"), "{active}");
    assert!(active.contains("31,877"), "{active}");
    let failed = row(&dom, FAILED_ID);
    assert!(failed.contains("error"), "{failed}");
    assert!(failed.contains("rejected the API key"), "{failed}");
    // Error text is text, never markup.
    assert!(failed.contains("&lt;invalid_request_error&gt;"), "{failed}");
    assert!(
        dom.contains("1,210 ms") || dom.contains("1.2 s"),
        "latency missing:\n{dom}"
    );
    // Costs and the route beside the tokens: 42,118 in × $3 + 2,407 out × $15, per million: $0.162459.
    let served = row(&dom, "req-5d0e");
    assert!(served.contains("$0.1625"), "{served}");
    assert!(
        served.contains("openrouter/anthropic/claude-sonnet-4.5 (skipped anthropic/"),
        "{served}"
    );
    let models = section(&dom, "<table id=\"models\">", "</table>");
    assert!(models.contains("byok-claude-sonnet-4-5"), "{models}");
    assert!(models.contains("class=\"total\""), "{models}");
    assert!(models.contains("0.0%"), "{models}");
    // Both charts are drawn by the page: one line per model.
    for id in ["chart-tokens", "chart-cost"] {
        let chart = section(&dom, &format!("id=\"{id}\""), "</svg>");
        for model in ["byok-gpt-5.1", "byok-claude-sonnet-4-5"] {
            assert!(
                chart.contains("<polyline") && chart.contains(&format!("data-model=\"{model}\"")),
                "{id} has no line for {model}:\n{chart}"
            );
        }
    }

    if let Some(shot) = screenshot {
        let shot = std::path::absolute(shot).unwrap();
        chromium_run(
            &browser,
            &dir.path().join("profile"),
            &url,
            &[
                &format!("--screenshot={}", shot.display()),
                "--window-size=1200,1500",
            ],
        )
        .await;
        assert!(shot.is_file());
    }
}

/// A raw HTTP/1.1 exchange on the proxy listener: status code and body.
async fn raw(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test]
async fn served_locally_and_never_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let _active = populate(server.status(), Duration::ZERO).await;
    let addr = server.proxy_addr();

    let (code, body) = raw(
        addr,
        &format!(
            "GET /__cursor-byok/status.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["service"], "cursor-byok");
    assert_eq!(
        json["active"][0]["run_id"],
        cursor_byok::status::run_id(ACTIVE_ID)
    );
    assert!(!body.contains(ACTIVE_ID), "status.json names no request id");
    assert_eq!(json["totals"]["failed"], 2);

    // A page on another origin rebinding its name to 127.0.0.1 sends its own Host: refused.
    let (code, _) = raw(
        addr,
        "GET /__cursor-byok/status.json HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(code, 403);

    // The same path for a Cursor host through the proxy is ours too: answered here, not sent on.
    let (code, body) = raw(
        addr,
        "GET http://api2.cursor.sh/__cursor-byok/status.json HTTP/1.1\r\nHost: api2.cursor.sh\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("only on the proxy listener"), "{body}");
}

#[tokio::test]
async fn proxy_auth_guards_the_page_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::from_toml(
        "listen = \"127.0.0.1:0\"\n[proxy_auth]\nusername = \"me\"\npassword = \"pw\"\n",
        "status auth test",
    )
    .unwrap();
    config.data_dir = Some(dir.path().to_path_buf());
    let (ca, _) = CertificateAuthority::load_or_create(&dir.path().join("ca")).unwrap();
    let server = Server::builder(config, ca).bind().await.unwrap();
    let addr = server.proxy_addr();
    let get = |auth: &str| {
        format!(
            "GET /__cursor-byok/status HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
        )
    };
    // A browser gets the Basic prompt (401), not the proxy's 407.
    assert_eq!(raw(addr, &get("")).await.0, 401);
    // "me:pw" as `Authorization`, as a browser sends it after the prompt.
    let (code, body) = raw(addr, &get("Authorization: Basic bWU6cHc=\r\n")).await;
    assert_eq!(code, 200);
    assert!(body.contains("<title>cursor-byok status</title>"));
    assert_eq!(
        raw(addr, &get("Authorization: Basic bWU6cHg=\r\n")).await.0,
        401
    );
}
