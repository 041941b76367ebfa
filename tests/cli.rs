//! The binary's commands, run as a user would.

use std::process::Command;

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cursor-byok"));
    cmd.env_remove("RUST_LOG").env_remove("CURSOR_BYOK_CONFIG");
    cmd
}

fn fingerprint(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("SHA-256:"))
        .expect("a fingerprint line")
        .trim()
        .to_string()
}

#[test]
fn ca_is_created_once_with_a_private_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let first = bin()
        .args(["ca", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let first = String::from_utf8(first.stdout).unwrap();
    assert!(first.contains("Created a new CA"), "{first}");

    let second = bin()
        .args(["ca", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(second.status.success());
    let second = String::from_utf8(second.stdout).unwrap();
    assert!(second.contains("Using the existing CA"), "{second}");
    assert_eq!(fingerprint(&first), fingerprint(&second));
    assert_eq!(fingerprint(&first).len(), 32 * 3 - 1);
    assert!(!first.contains("PRIVATE KEY"));

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca.key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert!(dir.path().join("ca.der").is_file());
}

#[test]
fn example_config_checks() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.toml");
    let out = bin().args(["check-config", example]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("byok-gpt-5.1"));
}

#[test]
fn bad_config_names_file_key_and_reason_without_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[providers.openai]\nkind = \"openai-chat\"\napi_key = \"sk-test-SUPERSECRET\"\n\n[[models]]\nid = \"m\"\nprovider = \"openai\"\nmodel = \"gpt\"\ncontext_window = \"big\"\n",
    )
    .unwrap();
    let out = bin().args(["check-config"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml"), "{err}");
    assert!(err.contains("models[0].context_window"), "{err}");
    assert!(err.contains("invalid type"), "{err}");
    assert!(
        !err.contains("SUPERSECRET")
            && !String::from_utf8_lossy(&out.stdout).contains("SUPERSECRET")
    );

    // A secret in the wrong type is not echoed either.
    std::fs::write(
        &path,
        "[providers.openai]\nkind = \"openai-chat\"\napi_key = [\"sk-test-SUPERSECRET\"]\n",
    )
    .unwrap();
    let out = bin().args(["check-config"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("providers.openai.api_key"), "{err}");
    assert!(!err.contains("SUPERSECRET"), "{err}");
}

/// Logs written to a pipe (a test runner, a service manager) carry no ANSI colour codes.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\n").unwrap();
    let mut child = bin()
        .env_remove("NO_COLOR")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = String::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("listening") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains("listening"), "{seen}");
    assert!(!seen.contains('\x1b'), "{seen:?}");
}

/// `cursor-byok usage` on `dir`: its output, after checking it succeeded.
fn usage_of(dir: &std::path::Path) -> String {
    let out = bin()
        .args(["usage", "--data-dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs finished on two proxies one after the other (a restart) are all in `usage`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_totals_survive_a_restart() {
    use cursor_byok::config::Config;
    use cursor_byok::provider::Usage;
    use cursor_byok::status::RunStart;

    let dir = tempfile::tempdir().unwrap();
    assert!(usage_of(dir.path()).contains("No finished runs"));

    let mut config = Config::from_toml("listen = \"127.0.0.1:0\"\n", "usage test").unwrap();
    config.data_dir = Some(dir.path().to_path_buf());
    let finished = [
        ("byok-gpt-5.1", 1_000, 200, 800, Some(0.0125)),
        ("byok-claude-sonnet-4-5", 2_000, 100, 1_500, Some(0.5)),
        ("byok-local", 300, 30, 0, None),
    ];
    for round in finished.chunks(2) {
        let (ca, _) =
            cursor_byok::tls::CertificateAuthority::load_or_create(&dir.path().join("ca")).unwrap();
        let server = cursor_byok::proxy::Server::builder(config.clone(), ca)
            .bind()
            .await
            .unwrap();
        for (model, input, output, cache_read, cost) in round {
            let ticket = server.status().run_started(RunStart {
                request_id: "r".into(),
                model: model.to_string(),
                provider: "P".into(),
                transport: "Run".into(),
            });
            let usage = Usage {
                input: *input,
                output: *output,
                cache_read: *cache_read,
                ..Usage::default()
            };
            ticket.progress().usage(usage, *cost);
            ticket.finish("ok", None, Some(usage));
        }
        drop(server);
    }
    let file = dir.path().join("usage.jsonl");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 3);

    let text = usage_of(dir.path());
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in:\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row("byok-gpt-5.1"),
        ["byok-gpt-5.1", "1", "1000", "200", "80.0%", "$0.0125"]
    );
    assert_eq!(
        row("byok-local")[1..],
        ["1", "300", "30", "0.0%", "unknown"]
    );
    let total = row("total");
    assert_eq!(total[1..5], ["3", "3300", "330", "69.7%"]);
    assert_eq!(total[5], "$0.5125");
    assert!(text.contains("3 run(s) since"), "{text}");
}
