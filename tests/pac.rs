//! The PAC script and `setup system-proxy`: the script evaluated by a real JavaScript engine
//! (node, with the standard PAC helper functions defined) for Cursor's hosts, other hosts and
//! the fallback (none for the hosts that carry the agent, DIRECT for Cursor's others); served by the proxy listener; the per-OS commands applied and undone
//! byte for byte on a simulated OS.
//!
//! Without `node` on PATH the engine test is skipped with a message.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;

use cursor_byok::config::Config;
use cursor_byok::proxy::Server;
use cursor_byok::setup::pac::{self, Cmd, MacService, Previous, WINDOWS_KEY};
use cursor_byok::status::pac::{script, PAC_CONTENT_TYPE, PAC_PATH};
use cursor_byok::tls::CertificateAuthority;

/// The helpers every PAC engine provides (Netscape's definitions), so a script may use them.
const PAC_HELPERS: &str = r#"
function dnsDomainIs(host, domain) {
  return host.length >= domain.length && host.substring(host.length - domain.length) == domain;
}
function isPlainHostName(host) { return host.indexOf(".") < 0; }
function shExpMatch(str, pat) {
  var re = new RegExp("^" + pat.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".") + "$");
  return re.test(str);
}
function localHostOrDomainIs(host, hostdom) {
  return host == hostdom || hostdom.lastIndexOf(host + ".", 0) == 0;
}
"#;

fn node() -> Option<&'static str> {
    let ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some("node")
}

/// `FindProxyForURL` of `script` for each host, evaluated by node in a fresh context that holds
/// only the PAC helpers (as a PAC engine's sandbox does).
fn evaluate(node: &str, script: &str, hosts: &[&str]) -> Vec<String> {
    let program = format!(
        r#"const vm = require("vm");
const ctx = vm.createContext({{}});
vm.runInContext({helpers}, ctx);
vm.runInContext({script}, ctx);
const hosts = {hosts};
for (const h of hosts) {{
  console.log(vm.runInContext("FindProxyForURL(" + JSON.stringify("https://" + h + "/") + ", " + JSON.stringify(h) + ")", ctx));
}}
"#,
        helpers = serde_json::to_string(PAC_HELPERS).unwrap(),
        script = serde_json::to_string(script).unwrap(),
        hosts = serde_json::to_string(hosts).unwrap(),
    );
    let out = Command::new(node).arg("-e").arg(program).output().unwrap();
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// What a PAC consumer does with an answer: the entries in order, the first that works.
fn first_working(answer: &str, proxy_up: bool) -> String {
    for entry in answer.split(';').map(str::trim) {
        if entry == "DIRECT" {
            return "DIRECT".into();
        }
        if entry.starts_with("PROXY ") && proxy_up {
            return entry.into();
        }
    }
    "FAIL".into()
}

#[test]
fn a_real_engine_sends_only_cursors_hosts_to_the_proxy_and_agent_hosts_never_direct() {
    let Some(node) = node() else {
        eprintln!("SKIPPED: `node` is not on PATH, so the PAC script is not evaluated here");
        return;
    };
    let listen: SocketAddr = "127.0.0.1:8787".parse().unwrap();
    let config = Config::embedded_default();
    let text = script(listen, &config.intercept);
    // The hosts that carry agent RPCs: the proxy or nothing.
    let agent_hosts = [
        "api2.cursor.sh",
        "agent.api5.cursor.sh",
        "agentn.api5.cursor.sh",
        "agentn.global.api5.cursor.sh",
        "API2.Cursor.SH",
        "api2.cursor.sh.",
    ];
    // Cursor's other hosts: the proxy, DIRECT when it is down.
    let cursor_hosts = [
        "cursor.sh",
        "api3.cursor.sh",
        "repo42.cursor.sh",
        "api5.cursor.sh",
        // Ends like an agent host's domain without being under it.
        "evilapi5.cursor.sh",
    ];
    let other_hosts = [
        "github.com",
        "evilcursor.sh",
        "cursor.sh.evil.example",
        "api2.cursor.sh.evil.example",
        "api.openai.com",
        "localhost",
        "127.0.0.1",
        "cursor.com",
    ];
    let all: Vec<&str> = agent_hosts
        .iter()
        .chain(&cursor_hosts)
        .chain(&other_hosts)
        .copied()
        .collect();
    let answers = evaluate(node, &text, &all);
    assert_eq!(answers.len(), all.len(), "{answers:?}");
    for (host, answer) in all.iter().zip(&answers) {
        let (want, when_down) = if agent_hosts.contains(host) {
            ("PROXY 127.0.0.1:8787", "FAIL")
        } else if cursor_hosts.contains(host) {
            ("PROXY 127.0.0.1:8787; DIRECT", "DIRECT")
        } else {
            ("DIRECT", "DIRECT")
        };
        assert_eq!(answer, want, "{host}");
        // Proxy down: the agent's hosts fail (no BYOK prompt reaches Cursor); the rest has a
        // way out.
        assert_eq!(first_working(answer, false), when_down, "{host}");
        if want != "DIRECT" {
            assert_eq!(
                first_working(answer, true),
                "PROXY 127.0.0.1:8787",
                "{host}"
            );
        }
    }

    // A config with an exact host and another wildcard: both reach the proxy, nothing more.
    let patterns = vec!["*.cursor.sh".to_string(), "api.cursor.com".to_string()];
    let text = script("0.0.0.0:9999".parse().unwrap(), &patterns);
    let answers = evaluate(
        node,
        &text,
        &[
            "api.cursor.com",
            "www.cursor.com",
            "x.cursor.sh",
            "api2.cursor.sh",
        ],
    );
    assert_eq!(
        answers,
        [
            "PROXY 127.0.0.1:9999; DIRECT",
            "DIRECT",
            "PROXY 127.0.0.1:9999; DIRECT",
            "PROXY 127.0.0.1:9999",
        ]
    );
    // A host the config does not intercept is not the proxy's, agent host or not.
    let text = script(listen, &["api.cursor.com".to_string()]);
    let answers = evaluate(node, &text, &["api2.cursor.sh", "api.cursor.com"]);
    assert_eq!(answers, ["DIRECT", "PROXY 127.0.0.1:8787; DIRECT"]);
}

/// One HTTP/1.1 GET to the proxy listener; (status line, headers, body).
async fn get(addr: SocketAddr, path: &str) -> (String, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let (status, headers) = head.split_once("\r\n").unwrap();
    (
        status.to_string(),
        headers.to_ascii_lowercase(),
        body.to_string(),
    )
}

#[tokio::test]
async fn the_proxy_serves_its_pac_without_asking_for_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let text = "listen = \"127.0.0.1:0\"\n[proxy_auth]\nusername = \"u\"\npassword = \"p\"\n";
    let mut config = Config::from_toml(text, "pac test").unwrap();
    config.data_dir = Some(dir.path().to_path_buf());
    let (ca, _) = CertificateAuthority::load_or_create(&dir.path().join("ca")).unwrap();
    let server = Server::builder(config.clone(), ca).bind().await.unwrap();
    let addr = server.proxy_addr();
    let (status, headers, body) = get(addr, PAC_PATH).await;
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        headers.contains(&format!("content-type: {PAC_CONTENT_TYPE}")),
        "{headers}"
    );
    assert_eq!(body, script(addr, &config.intercept));
    assert!(body.contains(&format!("PROXY {addr}; DIRECT")), "{body}");
    assert!(body.contains(&format!("\"PROXY {addr}\"")), "{body}");
    // The status page next to it still asks.
    let (status, _, _) = get(addr, cursor_byok::status::SNAPSHOT_PATH).await;
    assert!(
        status.contains(" 407 ") || status.contains(" 401 "),
        "{status}"
    );
}

#[test]
fn the_data_dir_copy_is_the_served_script() {
    let dir = tempfile::tempdir().unwrap();
    let listen: SocketAddr = "127.0.0.1:8787".parse().unwrap();
    let patterns = vec!["*.cursor.sh".to_string()];
    let path = pac::write_file(dir.path(), listen, &patterns).unwrap();
    assert_eq!(path, dir.path().join("proxy.pac"));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        script(listen, &patterns)
    );
    assert!(pac::file_url(&path).starts_with("file:///"));
    assert_eq!(
        pac::served_url(listen),
        "http://127.0.0.1:8787/__cursor-byok/proxy.pac"
    );
}

/// A simulated OS: the settings each target's commands read and write, keyed by
/// `program/key`; a value absent from the map is an unset key.
#[derive(Debug, Clone, Default, PartialEq)]
struct FakeOs {
    values: BTreeMap<String, String>,
}

impl FakeOs {
    /// Apply one command as the real tool would.
    fn run(&mut self, c: &Cmd) {
        let a: Vec<&str> = c.args.iter().map(String::as_str).collect();
        match (c.program.as_str(), a.as_slice()) {
            ("networksetup", ["-setautoproxyurl", svc, url]) => {
                self.values
                    .insert(format!("mac/{svc}/url"), url.to_string());
            }
            ("networksetup", ["-setautoproxystate", svc, state]) => {
                self.values
                    .insert(format!("mac/{svc}/state"), state.to_string());
            }
            ("gsettings", ["set", schema, key, value]) => {
                self.values
                    .insert(format!("gsettings/{schema}/{key}"), value.to_string());
            }
            ("kwriteconfig5", ["--file", f, "--group", g, "--key", k, "--delete"]) => {
                self.values.remove(&format!("kde/{f}/{g}/{k}"));
            }
            ("kwriteconfig5", ["--file", f, "--group", g, "--key", k, v]) => {
                self.values
                    .insert(format!("kde/{f}/{g}/{k}"), v.to_string());
            }
            ("reg", ["add", key, "/v", name, "/t", "REG_SZ", "/d", data, "/f"]) => {
                self.values
                    .insert(format!("reg/{key}/{name}"), data.to_string());
            }
            ("reg", ["delete", key, "/v", name, "/f"]) => {
                self.values.remove(&format!("reg/{key}/{name}"));
            }
            _ => panic!("the simulated OS does not know `{c}`"),
        }
    }

    /// What the read commands would print, parsed by the same functions the CLI uses.
    fn read(&self, target: pac::Target) -> Previous {
        let get = |k: &str| self.values.get(k).cloned();
        match target {
            pac::Target::MacOs => {
                let services: Vec<String> = self
                    .values
                    .keys()
                    .filter_map(|k| k.strip_prefix("mac/")?.strip_suffix("/state"))
                    .map(String::from)
                    .collect();
                let listing = format!(
                    "An asterisk (*) denotes that a network service is disabled.\n{}\n*Disabled\n",
                    services.join("\n")
                );
                let parsed = pac::parse_mac_services(&listing);
                assert_eq!(parsed, services);
                Previous::MacOs {
                    services: parsed
                        .iter()
                        .map(|s| {
                            let url = get(&format!("mac/{s}/url")).unwrap_or_default();
                            let url = if url.is_empty() { "(null)".into() } else { url };
                            let on = get(&format!("mac/{s}/state")).as_deref() == Some("on");
                            let out =
                                format!("URL: {url}\nEnabled: {}\n", if on { "Yes" } else { "No" });
                            pac::parse_mac_autoproxy(s, &out)
                        })
                        .collect(),
                }
            }
            pac::Target::Gnome => pac::parse_gnome(
                &format!(
                    "{}\n",
                    get("gsettings/org.gnome.system.proxy/mode").unwrap()
                ),
                &format!(
                    "{}\n",
                    get("gsettings/org.gnome.system.proxy/autoconfig-url").unwrap()
                ),
            ),
            pac::Target::Kde => {
                let k = |key: &str| {
                    get(&format!("kde/kioslaverc/Proxy Settings/{key}"))
                        .map(|v| format!("{v}\n"))
                        .unwrap_or_default()
                };
                pac::parse_kde(&k("ProxyType"), &k("Proxy Config Script"))
            }
            pac::Target::Windows => {
                let v = get(&format!("reg/{WINDOWS_KEY}/AutoConfigURL"));
                let out = v.map(|v| {
                    format!("\r\n{WINDOWS_KEY}\r\n    AutoConfigURL    REG_SZ    {v}\r\n\r\n")
                });
                pac::parse_windows(out.as_deref())
            }
        }
    }
}

fn round_trip(target: pac::Target, before: FakeOs, check_applied: impl Fn(&FakeOs)) {
    let url = "http://127.0.0.1:8787/__cursor-byok/proxy.pac";
    let previous = before.read(target);
    let mut os = before.clone();
    let apply = pac::apply_commands(&previous, url);
    assert!(!apply.is_empty());
    for c in &apply {
        os.run(c);
    }
    check_applied(&os);
    // The saved values survive the trip through the file they are kept in.
    let saved = pac::Saved {
        url: url.into(),
        previous: vec![previous],
    };
    let saved: pac::Saved = serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();
    for c in pac::undo_commands(&saved.previous[0]) {
        os.run(&c);
    }
    assert_eq!(os, before, "{target:?}: undo restores byte for byte");
}

fn fake(pairs: &[(&str, &str)]) -> FakeOs {
    FakeOs {
        values: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn each_os_is_applied_and_undone_byte_for_byte() {
    let url = "http://127.0.0.1:8787/__cursor-byok/proxy.pac";
    // GNOME, from the defaults and from a user's own PAC with odd characters.
    for (mode, old) in [("'none'", "''"), ("'manual'", r"'http://corp/it\'s.pac'")] {
        round_trip(
            pac::Target::Gnome,
            fake(&[
                ("gsettings/org.gnome.system.proxy/mode", mode),
                ("gsettings/org.gnome.system.proxy/autoconfig-url", old),
            ]),
            |os| {
                assert_eq!(os.values["gsettings/org.gnome.system.proxy/mode"], "'auto'");
                assert_eq!(
                    os.values["gsettings/org.gnome.system.proxy/autoconfig-url"],
                    format!("'{url}'")
                );
            },
        );
    }
    // KDE: keys absent before (deleted again), and present.
    round_trip(pac::Target::Kde, fake(&[]), |os| {
        assert_eq!(os.values["kde/kioslaverc/Proxy Settings/ProxyType"], "2");
        assert_eq!(
            os.values["kde/kioslaverc/Proxy Settings/Proxy Config Script"],
            url
        );
    });
    round_trip(
        pac::Target::Kde,
        fake(&[
            ("kde/kioslaverc/Proxy Settings/ProxyType", "1"),
            (
                "kde/kioslaverc/Proxy Settings/Proxy Config Script",
                "file:///x y.pac",
            ),
        ]),
        |_| {},
    );
    // Windows: absent before (deleted again), and a previous URL with spaces.
    let reg = format!("reg/{WINDOWS_KEY}/AutoConfigURL");
    round_trip(pac::Target::Windows, fake(&[]), |os| {
        assert_eq!(os.values[&reg], url);
    });
    round_trip(
        pac::Target::Windows,
        fake(&[(&reg, "http://corp/a  b.pac")]),
        |_| {},
    );
    // macOS: two services, one with its own PAC turned off.
    round_trip(
        pac::Target::MacOs,
        fake(&[
            ("mac/Wi-Fi/url", ""),
            ("mac/Wi-Fi/state", "off"),
            ("mac/USB 10/100/1000 LAN/url", "http://corp/p.pac"),
            ("mac/USB 10/100/1000 LAN/state", "off"),
        ]),
        |os| {
            assert_eq!(os.values["mac/Wi-Fi/url"], url);
            assert_eq!(os.values["mac/Wi-Fi/state"], "on");
            assert_eq!(os.values["mac/USB 10/100/1000 LAN/state"], "on");
        },
    );
}

#[test]
fn the_commands_are_the_documented_ones() {
    let url = "http://127.0.0.1:8787/__cursor-byok/proxy.pac";
    let gnome = pac::parse_gnome("'none'\n", "''\n");
    let lines: Vec<String> = pac::apply_commands(&gnome, url)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            format!("gsettings set org.gnome.system.proxy autoconfig-url \"'{url}'\""),
            "gsettings set org.gnome.system.proxy mode \"'auto'\"".to_string(),
        ]
    );
    let mac = Previous::MacOs {
        services: vec![MacService {
            name: "Wi-Fi".into(),
            url: None,
            enabled: false,
        }],
    };
    let lines: Vec<String> = pac::undo_commands(&mac)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            "networksetup -setautoproxyurl Wi-Fi \"\"",
            "networksetup -setautoproxystate Wi-Fi off"
        ]
    );
    let win = pac::parse_windows(None);
    assert_eq!(
        pac::undo_commands(&win)[0].args,
        ["delete", WINDOWS_KEY, "/v", "AutoConfigURL", "/f"]
    );
    let kde = pac::apply_commands(&pac::parse_kde("", ""), url);
    assert_eq!(
        kde[1].args,
        [
            "--file",
            "kioslaverc",
            "--group",
            "Proxy Settings",
            "--key",
            "ProxyType",
            "2"
        ]
    );
}

/// `setup system-proxy` as a user runs it, on Linux (where the config directory follows
/// `XDG_CONFIG_HOME`): it stops unless the login service holds the proxy's socket on `listen`,
/// or `--accept-direct-fallback` accepts the DIRECT fallback.
#[cfg(target_os = "linux")]
#[test]
fn system_proxy_stops_unless_the_service_manager_holds_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:8787\"\n").unwrap();
    let xdg = dir.path().join("xdg");
    let no_tools = dir.path().join("empty");
    std::fs::create_dir_all(&no_tools).unwrap();
    let past_the_check = "no automatic proxy setting found";
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cursor-byok"))
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["setup", "system-proxy"])
            .args(extra)
            .env("XDG_CONFIG_HOME", &xdg)
            // No gsettings or kwriteconfig5 to find: whatever gets past the check changes
            // nothing on this machine.
            .env("PATH", &no_tools)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run(&[]);
    assert!(!ok, "{text}");
    assert!(text.contains("setup system-proxy stops here"), "{text}");
    assert!(
        text.contains("the login service is not installed"),
        "{text}"
    );
    assert!(text.contains("goes DIRECT for everything"), "{text}");
    assert!(text.contains("`cursor-byok service install`"), "{text}");
    assert!(text.contains("`cursor-byok setup cursor`"), "{text}");
    assert!(text.contains("--accept-direct-fallback"), "{text}");
    assert!(
        !dir.path().join("data/system-proxy.json").exists(),
        "nothing applied"
    );

    let (_, text) = run(&["--dry-run"]);
    assert!(
        text.contains("note: without --accept-direct-fallback this stops here"),
        "{text}"
    );

    // Accepted: it goes on, to the proxy settings this machine has (none, here).
    let (_, text) = run(&["--accept-direct-fallback"]);
    assert!(!text.contains("stops here"), "{text}");
    assert!(
        text.contains("Accepted: the login service is not installed"),
        "{text}"
    );
    assert!(text.contains(past_the_check), "{text}");

    // Installed with its socket on another port: still stops, naming both.
    let own = xdg.join("cursor-byok");
    std::fs::create_dir_all(&own).unwrap();
    let manifest = |socket: &str| {
        std::fs::write(
            own.join("cursor-byok-install.json"),
            format!(r#"{{"os":"Linux","name":"cursor-byok","files":[],"socket":"{socket}"}}"#),
        )
        .unwrap();
    };
    manifest("127.0.0.1:9999");
    let (ok, text) = run(&[]);
    assert!(!ok, "{text}");
    assert!(text.contains("socket is on 127.0.0.1:9999"), "{text}");

    // Installed with its socket on `listen`: no stop.
    manifest("127.0.0.1:8787");
    let (_, text) = run(&[]);
    assert!(!text.contains("stops here"), "{text}");
    assert!(text.contains(past_the_check), "{text}");
}
