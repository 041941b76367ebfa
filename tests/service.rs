//! The login service: the systemd unit, LaunchAgent plist and Task Scheduler XML generated from
//! a spec and checked field by field (the unit by `systemd-analyze verify`, the plist and the
//! XML by python3's own parsers, where those exist); the env file that carries the keys; the
//! service's run (`--env-file`, `--log-file`: rotated, no colour); `service install` where there
//! is no user systemd; install → status → uninstall under a user systemd when there is one.
//!
//! Each check that needs a tool this machine lacks prints `SKIPPED:` with the reason.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cursor_byok::setup::os::Os;
use cursor_byok::setup::service::{self, Spec};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cursor-byok"));
    cmd.env_remove("RUST_LOG").env_remove("CURSOR_BYOK_CONFIG");
    cmd
}

/// Whether `cond` came to hold within `timeout`, checked every few milliseconds: for a state
/// another process owns (its log file, the service manager's view), which no event here
/// announces.
fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spec(root: &Path) -> Spec {
    Spec {
        name: "cursor-byok".into(),
        exe: PathBuf::from(env!("CARGO_BIN_EXE_cursor-byok")),
        config: Some(root.join("my config 100%.toml")),
        data_dir: root.join("data"),
        env_file: root.join("conf/cursor-byok.env"),
        log_file: root.join("data/cursor-byok.log"),
        home: root.to_path_buf(),
        user: "DESKTOP-1\\ada".into(),
        listen: "127.0.0.1:8787".parse().unwrap(),
    }
}

fn tool(name: &str, arg: &str) -> bool {
    Command::new(name)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `[section] key=value` of a unit file (later keys of the same name are appended).
fn unit_fields(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            out.entry(format!("{section}.{k}"))
                .or_default()
                .push(v.to_string());
        }
    }
    out
}

#[test]
fn the_systemd_unit_field_by_field() {
    let root = tempfile::tempdir().unwrap();
    let spec = spec(root.path());
    let unit = service::systemd_unit(&spec);
    let f = unit_fields(&unit);
    let one = |k: &str| {
        let v = &f[k];
        assert_eq!(v.len(), 1, "{k}: {v:?}");
        v[0].clone()
    };
    let r = root.path().display();
    assert_eq!(
        one("Service.ExecStart"),
        format!(
            "\"{exe}\" \"--config\" \"{r}/my config 100%%.toml\" \"--data-dir\" \"{r}/data\" \
             \"run\" \"--env-file\" \"{r}/conf/cursor-byok.env\" \"--log-file\" \
             \"{r}/data/cursor-byok.log\"",
            exe = env!("CARGO_BIN_EXE_cursor-byok")
        )
    );
    assert_eq!(one("Service.Type"), "simple");
    assert_eq!(one("Service.Restart"), "on-failure");
    assert_eq!(one("Service.RestartSec"), "5");
    assert_eq!(one("Service.Environment"), "NO_COLOR=1");
    // The socket unit is what starts with the session; it starts the service.
    assert_eq!(one("Unit.Requires"), "cursor-byok.socket");
    assert_eq!(one("Unit.After"), "cursor-byok.socket");
    assert_eq!(one("Install.Also"), "cursor-byok.socket");
    assert!(
        !f.contains_key("Install.WantedBy"),
        "the socket is what is enabled"
    );
    // No start limit: systemd giving up would close the socket too.
    assert_eq!(one("Unit.StartLimitIntervalSec"), "0");
    assert!(one("Unit.Description").starts_with("cursor-byok"));
    // No key in the unit: they travel in the env file only.
    assert!(!f.contains_key("Service.EnvironmentFile"));
    assert_eq!(
        spec.definition_path(Os::Linux, &root.path().join(".config")),
        root.path().join(".config/systemd/user/cursor-byok.service")
    );
}

#[test]
fn the_systemd_socket_unit_holds_the_listen_address() {
    let root = tempfile::tempdir().unwrap();
    let mut spec = spec(root.path());
    let f = unit_fields(&service::systemd_socket_unit(&spec));
    let one = |f: &BTreeMap<String, Vec<String>>, k: &str| {
        let v = &f[k];
        assert_eq!(v.len(), 1, "{k}: {v:?}");
        v[0].clone()
    };
    assert_eq!(one(&f, "Socket.ListenStream"), "127.0.0.1:8787");
    assert_eq!(
        one(&f, "Socket.Accept"),
        "no",
        "one proxy serves every connection"
    );
    assert_eq!(one(&f, "Socket.Service"), "cursor-byok.service");
    assert_eq!(one(&f, "Install.WantedBy"), "sockets.target");
    spec.listen = "[::1]:9000".parse().unwrap();
    let f = unit_fields(&service::systemd_socket_unit(&spec));
    assert_eq!(one(&f, "Socket.ListenStream"), "[::1]:9000");
    assert_eq!(
        spec.socket_path(Os::Linux, &root.path().join(".config")),
        Some(root.path().join(".config/systemd/user/cursor-byok.socket"))
    );
    assert_eq!(spec.socket_path(Os::MacOs, root.path()), None);
    assert_eq!(spec.socket_path(Os::Windows, root.path()), None);
}

#[test]
fn the_socket_is_held_only_by_a_socket_activated_install_on_listen() {
    use cursor_byok::setup::service::{held, Held, Manifest};
    let listen: std::net::SocketAddr = "127.0.0.1:8787".parse().unwrap();
    let manifest = |socket: Option<&str>| Manifest {
        os: Os::Linux,
        name: "cursor-byok".into(),
        files: Vec::new(),
        socket: socket.map(|s| s.parse().unwrap()),
    };
    let yes = manifest(Some("127.0.0.1:8787"));
    assert_eq!(held(Some(&yes), Os::Linux, listen), Held::Yes(listen));
    let wildcard = manifest(Some("0.0.0.0:8787"));
    assert!(matches!(
        held(Some(&wildcard), Os::MacOs, listen),
        Held::Yes(_)
    ));
    let why = |h: Held| match h {
        Held::No(why) => why,
        Held::Yes(at) => panic!("held on {at}"),
    };
    assert!(why(held(None, Os::Linux, listen)).contains("not installed"));
    assert!(why(held(Some(&manifest(None)), Os::Linux, listen)).contains("without its socket"));
    let other = manifest(Some("127.0.0.1:9999"));
    assert!(why(held(Some(&other), Os::Linux, listen)).contains("127.0.0.1:9999"));
    assert!(why(held(Some(&yes), Os::Windows, listen)).contains("Windows"));
    // A manifest written before the socket existed still reads, with no socket.
    let old: Manifest =
        serde_json::from_str(r#"{"os":"Linux","name":"cursor-byok","files":[]}"#).unwrap();
    assert_eq!(old.socket, None);
}

#[test]
fn systemd_analyze_accepts_the_unit() {
    if !tool("systemd-analyze", "--version") {
        eprintln!("SKIPPED: systemd-analyze is not installed, so the unit is not verified here");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let spec = spec(root.path());
    let socket = root.path().join("cursor-byok.socket");
    std::fs::write(&socket, service::systemd_socket_unit(&spec)).unwrap();
    let verify = |text: &str| {
        let path = root.path().join("cursor-byok.service");
        std::fs::write(&path, text).unwrap();
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(&socket)
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = verify(&service::systemd_unit(&spec));
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The check has teeth: a unit whose binary is missing is refused.
    let mut broken = spec.clone();
    broken.exe = root.path().join("no-such-binary");
    let out = verify(&service::systemd_unit(&broken));
    assert!(
        !out.status.success() || !out.stderr.is_empty(),
        "a missing binary passed verification"
    );
}

/// python3 as a parser for the plist and the task XML (skipped without it).
fn python(script: &str, input: &Path) -> Option<String> {
    if !tool("python3", "--version") {
        eprintln!("SKIPPED: python3 is not installed, so the file is not parsed here");
        return None;
    }
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

#[test]
fn the_launch_agent_field_by_field() {
    let root = tempfile::tempdir().unwrap();
    let spec = spec(root.path());
    let path = root.path().join("agent.plist");
    std::fs::write(&path, spec.definition_bytes(Os::MacOs)).unwrap();
    assert_eq!(
        spec.definition_path(Os::MacOs, root.path()),
        root.path()
            .join("Library/LaunchAgents/dev.cursor-byok.cursor-byok.plist")
    );
    let Some(json) = python(
        "import plistlib, json, sys; print(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))",
        &path,
    ) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["Label"], "dev.cursor-byok.cursor-byok");
    let mut want = vec![env!("CARGO_BIN_EXE_cursor-byok").to_string()];
    want.extend(spec.args());
    assert_eq!(v["ProgramArguments"], serde_json::json!(want));
    assert_eq!(v["RunAtLoad"], true);
    assert_eq!(
        v["KeepAlive"]["SuccessfulExit"], false,
        "restart on failure"
    );
    assert_eq!(v["EnvironmentVariables"]["NO_COLOR"], "1");
    let early = root.path().join("data/launchd.log").display().to_string();
    assert_eq!(v["StandardErrorPath"], early.as_str());
    assert_eq!(v["StandardOutPath"], early.as_str());
    assert!(v
        .get("EnvironmentVariables")
        .unwrap()
        .get("OPENAI_API_KEY")
        .is_none());
    // launchd holds the listening socket, under the name the proxy asks for.
    let socket = &v["Sockets"][service::LAUNCHD_SOCKET];
    assert_eq!(socket["SockNodeName"], "127.0.0.1");
    assert_eq!(socket["SockServiceName"], "8787");
    assert_eq!(socket["SockType"], "stream");
    assert_eq!(socket["SockFamily"], "IPv4");
}

#[test]
fn the_scheduled_task_field_by_field() {
    let root = tempfile::tempdir().unwrap();
    let spec = spec(root.path());
    let path = root.path().join("task.xml");
    let bytes = spec.definition_bytes(Os::Windows);
    assert_eq!(&bytes[..2], [0xFF, 0xFE], "UTF-16LE with a byte-order mark");
    std::fs::write(&path, bytes).unwrap();
    let script = r#"
import json, sys, xml.etree.ElementTree as ET
ns = {"t": "http://schemas.microsoft.com/windows/2004/02/mit/task"}
root = ET.parse(sys.argv[1]).getroot()
g = lambda p: root.find(p, ns).text
print(json.dumps({
  "trigger_user": g("t:Triggers/t:LogonTrigger/t:UserId"),
  "run_level": g("t:Principals/t:Principal/t:RunLevel"),
  "logon_type": g("t:Principals/t:Principal/t:LogonType"),
  "restart_interval": g("t:Settings/t:RestartOnFailure/t:Interval"),
  "time_limit": g("t:Settings/t:ExecutionTimeLimit"),
  "command": g("t:Actions/t:Exec/t:Command"),
  "arguments": g("t:Actions/t:Exec/t:Arguments"),
}))
"#;
    let Some(json) = python(script, &path) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        v["trigger_user"], "DESKTOP-1\\ada",
        "at this user's logon only"
    );
    assert_eq!(v["run_level"], "LeastPrivilege", "no admin rights");
    assert_eq!(v["logon_type"], "InteractiveToken");
    assert_eq!(v["restart_interval"], "PT1M");
    assert_eq!(v["time_limit"], "PT0S", "never stopped for running long");
    assert_eq!(v["command"], env!("CARGO_BIN_EXE_cursor-byok"));
    let r = root.path().display();
    assert_eq!(
        v["arguments"],
        format!(
            "--config \"{r}/my config 100%.toml\" --data-dir {r}/data run --env-file \
             {r}/conf/cursor-byok.env --log-file {r}/data/cursor-byok.log"
        )
    );
    let create = service::start_commands(&spec, Os::Windows, 0, &path);
    assert_eq!(
        create[0].args,
        [
            "/Create",
            "/TN",
            "cursor-byok",
            "/XML",
            &path.display().to_string(),
            "/F"
        ]
    );
}

#[test]
fn windows_arguments_are_quoted_as_the_c_runtime_splits_them() {
    assert_eq!(service::windows_quote(r"C:\a b\"), r#""C:\a b\\""#);
    assert_eq!(service::windows_quote(r#"say "hi""#), r#""say \"hi\"""#);
    assert_eq!(service::windows_quote(r"C:\plain"), r"C:\plain");
    assert_eq!(service::windows_quote(""), r#""""#);
}

#[test]
fn the_manager_commands_per_os() {
    let root = tempfile::tempdir().unwrap();
    let spec = spec(root.path());
    let plist = spec.definition_path(Os::MacOs, root.path());
    let s = |cmds: Vec<cursor_byok::setup::pac::Cmd>| -> Vec<String> {
        cmds.iter().map(ToString::to_string).collect()
    };
    assert_eq!(
        s(service::start_commands(&spec, Os::Linux, 1000, &plist)),
        [
            "systemctl --user daemon-reload",
            "systemctl --user enable cursor-byok.socket",
            "systemctl --user restart cursor-byok.socket",
            "systemctl --user restart cursor-byok.service"
        ]
    );
    assert_eq!(
        s(service::stop_commands(&spec, Os::Linux, 1000)),
        [
            "systemctl --user disable --now cursor-byok.socket",
            "systemctl --user disable --now cursor-byok.service"
        ]
    );
    assert_eq!(
        service::start_commands(&spec, Os::MacOs, 501, &plist)[0].args,
        ["bootstrap", "gui/501", &plist.display().to_string()]
    );
    assert_eq!(
        s(service::stop_commands(&spec, Os::MacOs, 501)),
        ["launchctl bootout gui/501/dev.cursor-byok.cursor-byok"]
    );
    assert_eq!(
        s(service::stop_commands(&spec, Os::Windows, 0)),
        [
            "schtasks /End /TN cursor-byok",
            "schtasks /Delete /TN cursor-byok /F"
        ]
    );
    let (active, since) = service::parse_systemd_show(
        "ActiveState=active\nSubState=running\nActiveEnterTimestamp=Wed 2026-12-02 21:00:00 UTC\n",
    );
    assert!(active);
    assert_eq!(since.as_deref(), Some("Wed 2026-12-02 21:00:00 UTC"));
}

#[test]
fn the_env_file_carries_keys_and_refuses_what_it_cannot() {
    let vars = vec![
        ("OPENAI_API_KEY".to_string(), "sk-a=b c".to_string()),
        ("HTTPS_PROXY".to_string(), "http://corp:3128".to_string()),
    ];
    let text = service::env_file_text(&vars).unwrap();
    assert_eq!(service::parse_env_file(&text).unwrap(), vars);
    let err = service::env_file_text(&[("K".into(), "a\nb".into())]).unwrap_err();
    assert!(err.contains("$K") && !err.contains("a\nb"), "{err}");
    let err = service::parse_env_file("# c\n\nGOOD=1\nsecret-value-without-name\n").unwrap_err();
    assert_eq!(err, "line 4: not NAME=value");
    let err = service::parse_env_file("1BAD=x").unwrap_err();
    assert!(err.contains("line 1"), "{err}");
}

/// A config on a port nothing listens on, with one provider whose key comes from the env file.
fn config_file(dir: &Path, listen: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"{listen}\"\n\
             [providers.openai]\nkind = \"openai-chat\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             api_key_env = \"CURSOR_BYOK_TEST_SERVICE_KEY\"\n\
             [[models]]\nid = \"m\"\nprovider = \"openai\"\nmodel = \"m\"\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn the_service_run_reads_its_env_file_and_logs_plain_text_to_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "127.0.0.1:0");
    let env = dir.path().join("service.env");
    std::fs::write(
        &env,
        "# written by service install\nCURSOR_BYOK_TEST_SERVICE_KEY=sk-test-from-env-file\n",
    )
    .unwrap();
    let log = dir.path().join("data/cursor-byok.log");
    let mut child = bin()
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["run", "--env-file"])
        .arg(&env)
        .arg("--log-file")
        .arg(&log)
        .env_remove("CURSOR_BYOK_TEST_SERVICE_KEY")
        // Colour would be on for a terminal; the log file never gets it.
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut text = String::new();
    let banner = poll_until(Duration::from_secs(60), || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            child.try_wait().unwrap().is_none(),
            "the proxy exited: {text}"
        );
        text.contains("one summary line per finished run")
    });
    assert!(banner, "no banner in the log: {text}");
    child.kill().unwrap();
    let _ = child.wait();
    assert!(
        text.contains("[$CURSOR_BYOK_TEST_SERVICE_KEY set]"),
        "{text}"
    );
    assert!(
        !text.contains("sk-test-from-env-file"),
        "a key reached the log"
    );
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in the log: {text:?}"
    );
    let mut stderr = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        stderr.push_str(&line.unwrap());
    }
    assert!(
        !stderr.contains("listening on"),
        "the banner went to the log only: {stderr}"
    );
    assert!(dir.path().join("data/proxy.pac").is_file());
}

#[test]
fn service_logs_and_status_read_the_log_file() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let config = config_file(dir.path(), &format!("127.0.0.1:{port}"));
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("cursor-byok.log.1"),
        "2026-12-02T20:00:00Z  INFO cursor_byok: old\n",
    )
    .unwrap();
    std::fs::write(
        data.join("cursor-byok.log"),
        "2026-12-02T21:00:00Z ERROR cursor_byok: provider `openai` refused the key\n\
         2026-12-02T21:00:01Z  INFO cursor_byok: run finished\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = bin()
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .env("XDG_CONFIG_HOME", dir.path().join("xdg"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let logs = run(&["service", "logs", "-n", "2"]);
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        [
            "2026-12-02T21:00:00Z ERROR cursor_byok: provider `openai` refused the key",
            "2026-12-02T21:00:01Z  INFO cursor_byok: run finished"
        ]
    );
    let logs = run(&["service", "logs", "-n", "3"]);
    assert!(
        logs.starts_with("2026-12-02T20:00:00Z"),
        "rotated part first: {logs}"
    );
    if Os::current() == Some(Os::Linux) {
        let status = run(&["service", "status"]);
        assert!(status.contains("service: not installed"), "{status}");
        assert!(
            status.contains(&format!("proxy:   not running on port {port}")),
            "{status}"
        );
        assert!(
            status.contains("last error: 2026-12-02T21:00:00Z ERROR"),
            "{status}"
        );
    }
}

#[test]
fn install_without_a_user_systemd_says_why_and_writes_nothing() {
    if Os::current() != Some(Os::Linux) {
        eprintln!("SKIPPED: the user-systemd check is Linux's");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let xdg = dir.path().join("xdg");
    let out = bin()
        .args(["service", "install", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("XDG_RUNTIME_DIR")
        .env("XDG_CONFIG_HOME", &xdg)
        .env("OPENAI_API_KEY", "sk-never-printed")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no systemd user manager here"), "{stderr}");
    assert!(stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
    assert!(!xdg.exists(), "nothing written");

    // The dry run shows what install would write, naming the keys and never their values.
    let out = bin()
        .args(["service", "install", "--dry-run", "--data-dir"])
        .arg(dir.path().join("data"))
        .env_remove("XDG_RUNTIME_DIR")
        .env("XDG_CONFIG_HOME", &xdg)
        .env("OPENAI_API_KEY", "sk-never-printed")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("carries: OPENAI_API_KEY"), "{stdout}");
    assert!(!stdout.contains("sk-never-printed"), "{stdout}");
    assert!(stdout.contains("ExecStart="), "{stdout}");
    assert!(!xdg.exists(), "nothing written");

    // A name that would reach outside the unit directory is refused before anything else.
    for bad in ["../../evil", "a b", "-x"] {
        let out = bin()
            .args([
                "service",
                "install",
                "--dry-run",
                &format!("--name={bad}"),
                "--data-dir",
            ])
            .arg(dir.path().join("data"))
            .env("XDG_CONFIG_HOME", &xdg)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("is not usable"), "{bad}: {stderr}");
        assert!(!xdg.exists(), "nothing written");
    }
}

/// Under a real systemd user manager (a desktop session, or CI with one): install, see it run,
/// uninstall, see every file gone.
#[test]
fn install_status_uninstall_under_a_user_systemd() {
    if Os::current() != Some(Os::Linux) {
        eprintln!("SKIPPED: systemd user units are Linux's");
        return;
    }
    let has_bus = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|v| !v.is_empty());
    let manager = has_bus
        && Command::new("systemctl")
            .args(["--user", "show-environment"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !manager {
        eprintln!(
            "SKIPPED: no systemd user manager here (XDG_RUNTIME_DIR unset or `systemctl --user` \
             fails), so install -> status -> uninstall is not run"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "127.0.0.1:0");
    let name = format!("cursor-byok-test-{}", std::process::id());
    let run = |args: &[&str]| {
        bin()
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(args)
            .args(["--name", &name])
            .output()
            .unwrap()
    };
    let out = run(&["service", "install"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut text = String::new();
    let active = poll_until(Duration::from_secs(30), || {
        let out = run(&["service", "status"]);
        text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("manager: active")
    });
    assert!(active, "never active: {text}");
    let unit = dirs_config()
        .join("systemd/user")
        .join(format!("{name}.service"));
    assert!(unit.is_file());
    let socket = unit.with_extension("socket");
    assert!(socket.is_file(), "the socket unit is written beside it");
    assert!(text.contains("socket:  listening on"), "{text}");
    let out = run(&["service", "uninstall"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("setup cursor --undo") && text.contains("ca untrust"),
        "{text}"
    );
    assert!(!unit.exists(), "the unit is removed");
    assert!(!socket.exists(), "the socket unit is removed");
}

fn dirs_config() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".config"))
}

#[test]
fn doctor_says_when_cursor_is_cut_off_and_which_wiring_is_active() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let config = config_file(dir.path(), &format!("127.0.0.1:{port}"));
    let settings = dir.path().join("settings.json");
    let data = dir.path().join("data");
    let doctor = || {
        let out = bin()
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .args(["doctor", "--skip-providers", "--cursor-settings"])
            .arg(&settings)
            .env("XDG_CONFIG_HOME", dir.path().join("xdg"))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    std::fs::write(
        &settings,
        format!("{{\"http.proxy\": \"http://127.0.0.1:{port}\"}}"),
    )
    .unwrap();
    let out = doctor();
    let wiring = out
        .lines()
        .find(|l| l.contains("wiring:"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(wiring.starts_with("[FAIL]"), "{wiring}");
    assert!(wiring.contains("Cursor is cut off right now"), "{wiring}");
    assert!(wiring.contains("service install"), "{wiring}");

    // The system PAC alone, served by the proxy: while it is down a Cursor that starts gets no
    // script and goes DIRECT everywhere, so doctor fails and says so.
    std::fs::write(&settings, "{}").unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("system-proxy.json"),
        r#"{"url":"http://127.0.0.1:1/__cursor-byok/proxy.pac","previous":[]}"#,
    )
    .unwrap();
    let out = doctor();
    let wiring = out.lines().find(|l| l.contains("wiring:")).unwrap();
    assert!(wiring.starts_with("[FAIL]"), "{wiring}");
    assert!(wiring.contains("goes DIRECT everywhere"), "{wiring}");
    assert!(wiring.contains("not installed"), "{wiring}");
    assert!(wiring.contains("service install"), "{wiring}");

    // Installed with its socket on `listen` (the manifest `service install` writes): the
    // manager holds the socket, so Cursor waits instead of going DIRECT; doctor says the proxy
    // does not answer and where to look.
    if Os::current() == Some(Os::Linux) {
        let own = dir.path().join("xdg/cursor-byok");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(
            own.join("cursor-byok-install.json"),
            format!(
                r#"{{"os":"Linux","name":"cursor-byok","files":[],"socket":"127.0.0.1:{port}"}}"#
            ),
        )
        .unwrap();
        let out = doctor();
        let wiring = out.lines().find(|l| l.contains("wiring:")).unwrap();
        assert!(wiring.starts_with("[FAIL]"), "{wiring}");
        assert!(wiring.contains("nothing goes DIRECT"), "{wiring}");
        assert!(wiring.contains("service logs"), "{wiring}");
    }
}
