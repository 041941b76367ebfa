//! Set-up commands, run as a user would: `setup cursor` (JSONC edit, backup, idempotence,
//! `--dry-run`, `--undo`, refusal), `doctor` against fake providers, `ca trust|export|untrust`,
//! and `models`.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::fake_provider::{FakeProvider, Reply};
use cursor_byok::config::Config;
use cursor_byok::proxy::Server;
use cursor_byok::setup::jsonc::Document;
use cursor_byok::tls::CertificateAuthority;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_cursor-byok");

/// The binary with a clean environment: no inherited config, logging or keys, and `HOME` in a
/// scratch directory so nothing of the real user's is read (NSS database, Cursor settings).
fn bin(home: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(BIN);
    clean(&mut cmd, home);
    cmd
}

fn clean(cmd: &mut std::process::Command, home: &Path) {
    for var in [
        "RUST_LOG",
        "CURSOR_BYOK_CONFIG",
        "CURSOR_BYOK_DATA_DIR",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "XDG_CONFIG_HOME",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", home);
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(out: Output) -> String {
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// Backups of `settings` in its folder.
fn backups(settings: &Path) -> Vec<PathBuf> {
    let mut b: Vec<PathBuf> = std::fs::read_dir(settings.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .contains(".cursor-byok-")
        })
        .collect();
    b.sort();
    b
}

/// A settings file as people have them: comments of both kinds, a trailing comma, tabs, a
/// proxy setting of their own that we replace.
const USER_SETTINGS: &str = "// Cursor user settings\n{\n\t\"workbench.colorTheme\": \"Cursor Dark\", // my theme\n\t/* editor */\n\t\"editor.fontSize\": 13,\n\t\"http.proxy\": \"http://corp-proxy:3128\",\n\t\"files.exclude\": {\n\t\t\"**/.git\": true, // hide\n\t},\n}\n";

#[test]
fn setup_cursor_edits_jsonc_keeps_comments_and_undoes_to_the_same_bytes() {
    let home = tempfile::tempdir().unwrap();
    let settings = home.path().join("settings.json");
    std::fs::write(&settings, USER_SETTINGS).unwrap();
    let data = home.path().join("data");
    let run = |extra: &[&str]| {
        bin(home.path())
            .arg("--data-dir")
            .arg(&data)
            .args(["setup", "cursor", "--settings"])
            .arg(&settings)
            .args(extra)
            .output()
            .unwrap()
    };

    // Dry run: a diff, nothing written.
    let out = ok(run(&["--dry-run"]));
    assert!(
        out.contains("-\t\"http.proxy\": \"http://corp-proxy:3128\","),
        "{out}"
    );
    // The proxy URL carries the per-install secret, never printed.
    assert!(
        out.contains("+\t\"http.proxy\": \"http://cursor-byok:<secret>@127.0.0.1:8787\","),
        "{out}"
    );
    let secret = std::fs::read_to_string(data.join("proxy-secret")).unwrap();
    let secret = secret.trim();
    assert!(!out.contains(secret), "the secret was printed:\n{out}");
    assert!(
        out.contains("+\t\"cursor.general.disableHttp2\": true"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), USER_SETTINGS);
    assert!(backups(&settings).is_empty());

    // Wire: values set, every comment and the rest of the file kept, a backup of the original.
    let out = ok(run(&[]));
    assert!(out.contains("backup:"), "{out}");
    assert!(!out.contains(secret), "the secret was printed:\n{out}");
    let wired = std::fs::read_to_string(&settings).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&settings).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the settings hold the secret");
    }
    for kept in [
        "// Cursor user settings\n",
        "\"workbench.colorTheme\": \"Cursor Dark\", // my theme\n",
        "\t/* editor */\n",
        "\t\t\"**/.git\": true, // hide\n",
    ] {
        assert!(wired.contains(kept), "lost {kept:?}:\n{wired}");
    }
    let doc = Document::parse(&wired).unwrap();
    assert_eq!(
        doc.get("http.proxy"),
        Some(&json!(format!(
            "http://cursor-byok:{secret}@127.0.0.1:8787"
        )))
    );
    assert_eq!(doc.get("http.proxySupport"), Some(&json!("override")));
    assert_eq!(doc.get("cursor.general.disableHttp2"), Some(&json!(true)));
    assert_eq!(doc.get("http.proxyStrictSSL"), Some(&json!(true)));
    assert_eq!(doc.get("editor.fontSize"), Some(&json!(13)));
    let first_backups = backups(&settings);
    assert_eq!(first_backups.len(), 1);
    assert!(first_backups[0].to_string_lossy().ends_with(".bak"));
    assert_eq!(
        std::fs::read_to_string(&first_backups[0]).unwrap(),
        USER_SETTINGS
    );

    // Idempotent: the second run changes nothing and writes no backup.
    let out = ok(run(&[]));
    assert!(out.contains("Already wired"), "{out}");
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), wired);
    assert_eq!(backups(&settings), first_backups);

    // Undo: the original, byte for byte.
    ok(run(&["--undo"]));
    assert_eq!(std::fs::read(&settings).unwrap(), USER_SETTINGS.as_bytes());
}

#[test]
fn setup_cursor_refuses_a_file_it_cannot_parse() {
    let home = tempfile::tempdir().unwrap();
    let settings = home.path().join("settings.json");
    let broken = "{\n  \"editor.fontSize\": 13,\n  \"http.proxy\": \n}\n";
    std::fs::write(&settings, broken).unwrap();
    let out = bin(home.path())
        .args(["setup", "cursor", "--settings"])
        .arg(&settings)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("cannot parse"), "{stderr}");
    assert!(stderr.contains("line 4"), "{stderr}");
    assert!(stderr.contains("nothing was changed"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), broken);
    assert!(backups(&settings).is_empty());

    // No backup to undo to: said plainly.
    let out = bin(home.path())
        .args(["setup", "cursor", "--undo", "--settings"])
        .arg(&settings)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.contains("no cursor-byok backup"));
}

const GOOD_KEY: &str = "sk-test-GOODKEY-4242";
const BAD_KEY: &str = "sk-test-BADKEY-1717";

fn doctor_config(listen: SocketAddr, good: &FakeProvider, bad: &FakeProvider) -> String {
    format!(
        r#"listen = "{listen}"

[providers.good]
kind = "openai-chat"
base_url = "{}/v1"
api_key_env = "DOCTOR_GOOD_KEY"

[providers.bad]
kind = "openai-chat"
base_url = "{}/v1"
api_key_env = "DOCTOR_BAD_KEY"

[[models]]
id = "good-model"
provider = "good"
model = "gpt-good"

[[models]]
id = "bad-model"
display_name = "Bad Model"
provider = "bad"
model = "gpt-bad"
"#,
        good.base_url(),
        bad.base_url()
    )
}

const CHAT_OK: &str = concat!(
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"}}]}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_the_failing_provider_and_its_fix() {
    let good = FakeProvider::start(vec![Reply::sse(CHAT_OK)]).await;
    let bad = FakeProvider::start(vec![Reply::json(
        401,
        format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {BAD_KEY}.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
        ),
    )])
    .await;
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");

    // A running proxy (in-process) and a config naming its port, as a user's would.
    let (ca, _) = CertificateAuthority::load_or_create(&data).unwrap();
    let mut server_config = Config::from_toml(
        &doctor_config("127.0.0.1:0".parse().unwrap(), &good, &bad),
        "doctor test",
    )
    .unwrap();
    server_config.data_dir = Some(data.clone());
    let server = Server::builder(server_config, ca).bind().await.unwrap();
    let config_path = home.path().join("config.toml");
    std::fs::write(
        &config_path,
        doctor_config(server.proxy_addr(), &good, &bad),
    )
    .unwrap();

    // Cursor wired through the command itself.
    let settings = home.path().join("settings.json");
    std::fs::write(&settings, "{}\n").unwrap();
    ok(bin(home.path())
        .arg("--config")
        .arg(&config_path)
        .arg("--data-dir")
        .arg(&data)
        .args(["setup", "cursor", "--settings"])
        .arg(&settings)
        .output()
        .unwrap());

    let mut cmd = tokio::process::Command::new(BIN);
    clean(cmd.as_std_mut(), home.path());
    let out = cmd
        .env("DOCTOR_GOOD_KEY", GOOD_KEY)
        .env("DOCTOR_BAD_KEY", BAD_KEY)
        .arg("--config")
        .arg(&config_path)
        .arg("--data-dir")
        .arg(&data)
        .args(["doctor", "--cursor-settings"])
        .arg(&settings)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = text(&out);
    let all = format!("{stdout}\n{stderr}");
    eprintln!("{all}"); // shown with --nocapture, and on failure
    assert!(
        !out.status.success(),
        "a failing check fails the command:\n{all}"
    );

    let line = |prefix: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{all}"))
            .to_string()
    };
    line("[ok]   config:");
    line("[ok]   CA:");
    line("[ok]   listener:");
    line("[ok]   Cursor settings:");
    let good_line = line("[ok]   provider `good`");
    assert!(good_line.contains(" ms"), "latency shown: {good_line}");
    let bad_line = line("[FAIL] provider `bad`");
    assert!(bad_line.contains("rejected the API key"), "{bad_line}");
    assert!(bad_line.contains("HTTP 401"), "{bad_line}");
    assert!(bad_line.contains("fix:"), "{bad_line}");
    assert!(bad_line.contains("$DOCTOR_BAD_KEY"), "{bad_line}");
    assert!(stderr.contains("checks failed"), "{stderr}");
    let proxy_secret = std::fs::read_to_string(data.join("proxy-secret")).unwrap();
    for secret in [GOOD_KEY, BAD_KEY, proxy_secret.trim()] {
        assert!(!all.contains(secret), "a secret was printed:\n{all}");
    }

    // The probe was minimal and carried the key.
    let reqs = good.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {GOOD_KEY}").as_str())
    );
    let body = reqs[0].json();
    assert_eq!(body["model"], "gpt-good");
    let max = body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"));
    assert_eq!(max, Some(&json!(16)), "{body}");
    drop(server);
}

#[test]
fn ca_subcommands_export_and_explain() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let ca = |args: &[&str]| {
        bin(home.path())
            .arg("--data-dir")
            .arg(&data)
            .arg("ca")
            .args(args)
            .output()
            .unwrap()
    };
    let out = ok(ca(&[]));
    assert!(out.contains("SHA-256:"), "{out}");

    let der = home.path().join("ca.der");
    ok(ca(&[
        "export",
        "--format",
        "der",
        "--out",
        der.to_str().unwrap(),
    ]));
    assert_eq!(
        std::fs::read(&der).unwrap(),
        std::fs::read(data.join("ca.der")).unwrap()
    );
    let pem = ca(&["export", "--format", "pem"]);
    assert_eq!(
        ok(pem),
        std::fs::read_to_string(data.join("ca.pem")).unwrap()
    );

    let pem_path = std::path::absolute(data.join("ca.pem")).unwrap();
    let out = ok(ca(&["trust"]));
    assert!(
        out.contains("security add-trusted-cert -r trustRoot"),
        "{out}"
    );
    assert!(out.contains("certutil -user -addstore Root"), "{out}");
    assert!(out.contains("update-ca-certificates"), "{out}");
    assert!(out.contains("-n cursor-byok -i"), "{out}");
    assert!(out.contains(&pem_path.display().to_string()), "{out}");
    assert!(!out.contains("PRIVATE KEY"));

    let out = ok(ca(&["untrust"]));
    assert!(out.contains("security delete-certificate"), "{out}");
    assert!(out.contains("certutil -user -delstore Root"), "{out}");
    assert!(out.contains("-D -n cursor-byok"), "{out}");
}

#[test]
fn models_lists_cursor_ids_and_key_state() {
    let home = tempfile::tempdir().unwrap();
    let out = bin(home.path())
        .env("OPENAI_API_KEY", "sk-test-models")
        .arg("models")
        .output()
        .unwrap();
    let out = ok(out);
    let gpt = out
        .lines()
        .find(|l| l.starts_with("byok-gpt-5.1 "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(gpt.contains("GPT-5.1 (BYOK)"), "{gpt}");
    assert!(gpt.contains("(openai/gpt-5.1)"), "{gpt}");
    assert!(gpt.ends_with("key: set"), "{gpt}");
    let claude = out
        .lines()
        .find(|l| l.starts_with("byok-claude-sonnet-4-5 "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(claude.ends_with("key: missing"), "{claude}");
    assert!(!out.contains("sk-test-models"));
}
