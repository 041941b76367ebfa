//! `cursor-byok status [--json]` against a stub status server on 127.0.0.1:0 serving a real
//! registry's snapshot, with a usage record in the data directory; and with nothing listening.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use cursor_byok::status::usage::{UsageLine, UsageLog};
use cursor_byok::status::{RunStart, Status, SNAPSHOT_PATH};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cursor-byok"));
    cmd.env_remove("RUST_LOG").env_remove("CURSOR_BYOK_CONFIG");
    cmd
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Serves `body` at the snapshot path to every connection, until the test ends.
fn stub_server(body: String) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head);
            let resp = if head.starts_with(&format!("GET {SNAPSHOT_PATH} ")) {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into()
            };
            let _ = conn.write_all(resp.as_bytes());
        }
    });
    addr
}

fn line(unix_ms: u64, model: &str, outcome: &str, cost: Option<f64>) -> UsageLine {
    UsageLine {
        unix_ms,
        model: model.into(),
        provider: "OpenAI".into(),
        target: None,
        outcome: outcome.into(),
        input_tokens: 1000,
        output_tokens: 100,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        cost_usd: cost,
    }
}

fn write_usage(dir: &Path, now: u64) {
    let log = UsageLog::new(dir);
    // Yesterday: not in today's figures.
    log.append(&line(now - 25 * 3_600_000, "byok-gpt-5.1", "ok", Some(9.0)))
        .unwrap();
    log.append(&line(now - 1_000, "byok-gpt-5.1", "ok", Some(0.25)))
        .unwrap();
    log.append(&line(now - 900, "byok-gpt-5.1", "ok", Some(0.5)))
        .unwrap();
    log.append(&line(now - 800, "byok-deepseek-chat", "error", None))
        .unwrap();
}

fn run(config: &Path, data: &Path, json: bool) -> String {
    let mut cmd = bin();
    cmd.arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .arg("status");
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn config(dir: &Path, listen: std::net::SocketAddr) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, format!("listen = \"{listen}\"\n")).unwrap();
    path
}

#[test]
fn status_shows_the_live_runs_todays_cost_and_the_last_errors() {
    let status = Status::new();
    let _active = status.run_started(RunStart {
        request_id: "req-live-1".into(),
        model: "byok-claude-sonnet-4-5".into(),
        provider: "Anthropic".into(),
        transport: "RunSSE".into(),
    });
    let failed = status.run_started(RunStart {
        request_id: "req-failed-2".into(),
        model: "byok-gpt-5.1".into(),
        provider: "OpenAI".into(),
        transport: "Run".into(),
    });
    failed.finish(
        "error",
        Some("provider `openai`: rate limited (HTTP 429)".into()),
        None,
    );
    let snapshot = status.snapshot();
    let addr = stub_server(serde_json::to_string(&snapshot).unwrap());
    let dir = tempfile::tempdir().unwrap();
    write_usage(dir.path(), snapshot.now_unix_ms);
    let config = config(dir.path(), addr);

    let json: serde_json::Value = serde_json::from_str(&run(&config, dir.path(), true)).unwrap();
    assert_eq!(json["running"], true);
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    // Named by a digest of its request id, never the id itself.
    assert_eq!(
        json["active"][0]["run_id"],
        cursor_byok::status::run_id("req-live-1")
    );
    assert_eq!(json["active"].as_array().unwrap().len(), 1);
    let today = json["today"].as_array().unwrap();
    let gpt = today.iter().find(|m| m["model"] == "byok-gpt-5.1").unwrap();
    assert_eq!(gpt["runs"], 2, "yesterday's run is left out");
    assert!((gpt["cost_usd"].as_f64().unwrap() - 0.75).abs() < 1e-9);
    assert_eq!(json["today_total"]["runs"], 3);
    assert_eq!(json["last_errors"][0]["model"], "byok-gpt-5.1");
    assert_eq!(
        json["last_errors"][0]["error"],
        "provider `openai`: rate limited (HTTP 429)"
    );
    assert_eq!(json["page"], format!("http://{addr}/__cursor-byok/status"));

    let text = run(&config, dir.path(), false);
    assert!(text.contains("proxy: cursor-byok"), "{text}");
    assert!(text.contains("active runs: 1"), "{text}");
    assert!(
        text.contains(&format!(
            "{}  byok-claude-sonnet-4-5 via Anthropic",
            cursor_byok::status::run_id("req-live-1")
        )),
        "{text}"
    );
    assert!(text.contains("byok-gpt-5.1"), "{text}");
    assert!(text.contains("$0.75") || text.contains("0.75"), "{text}");
    assert!(text.contains("rate limited (HTTP 429)"), "{text}");
}

#[test]
fn status_without_a_running_proxy_still_reads_the_usage_record() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    write_usage(dir.path(), now_ms());
    let config = config(dir.path(), addr);
    let json: serde_json::Value = serde_json::from_str(&run(&config, dir.path(), true)).unwrap();
    assert_eq!(json["running"], false);
    assert!(
        json["not_running"]
            .as_str()
            .unwrap()
            .contains("nothing answers"),
        "{json}"
    );
    assert_eq!(json["active"].as_array().unwrap().len(), 0);
    assert_eq!(json["today_total"]["runs"], 3);
    // Without the live proxy, the failures come from the usage record (outcome, no text).
    assert_eq!(json["last_errors"][0]["model"], "byok-deepseek-chat");
    assert_eq!(json["last_errors"][0]["outcome"], "error");
    let text = run(&config, dir.path(), false);
    assert!(text.starts_with("proxy: not running"), "{text}");
    assert!(text.contains("byok-deepseek-chat  error"), "{text}");
}
