//! `setup system-proxy`: point the OS's automatic proxy configuration at the PAC script, and put
//! the previous values back on `--undo`.
//!
//! Everything here is pure: the commands that read the current values, the parsing of their
//! output, the commands that apply the PAC URL and those that restore what was read. The CLI
//! runs them (printing each first) and keeps the [`Saved`] values in the data directory.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What `setup system-proxy` saves before it changes anything, to restore it on `--undo`.
pub const SAVED_FILE: &str = "system-proxy.json";

/// Windows' per-user Internet Settings key, read by WinINet and by Chromium-based apps.
pub const WINDOWS_KEY: &str = r"HKCU\Software\Microsoft\Windows\CurrentVersion\Internet Settings";
const KDE_FILE: &str = "kioslaverc";
const KDE_GROUP: &str = "Proxy Settings";
const GNOME_SCHEMA: &str = "org.gnome.system.proxy";

/// One program run with its arguments, never through a shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
}

impl Cmd {
    pub fn new(program: &str, args: &[&str]) -> Cmd {
        Cmd {
            program: program.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }
}

impl fmt::Display for Cmd {
    /// As a user would type it (POSIX-shell quoting where needed).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program)?;
        for a in &self.args {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+\\".contains(c));
            if plain {
                write!(f, " {a}")?;
            } else if !a.contains(['"', '$', '`', '\\', '!']) {
                write!(f, " \"{a}\"")?;
            } else {
                write!(f, " '{}'", a.replace('\'', r"'\''"))?;
            }
        }
        Ok(())
    }
}

/// The desktops and OSes whose automatic proxy setting we know how to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// `networksetup`, per network service.
    MacOs,
    /// `gsettings` (GNOME and the desktops that read its proxy schema).
    Gnome,
    /// `kwriteconfig5` on `kioslaverc` (KDE Plasma 5).
    Kde,
    /// `reg` on the per-user Internet Settings.
    Windows,
}

/// The values before `setup system-proxy`, as read from the OS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Previous {
    MacOs {
        /// Per network service: its auto-proxy URL (`None` when unset) and whether it was on.
        services: Vec<MacService>,
    },
    Gnome {
        /// `gsettings get` output, verbatim (GVariant text, which `gsettings set` accepts).
        mode: String,
        autoconfig_url: String,
    },
    Kde {
        /// `None`: the key was absent.
        proxy_type: Option<String>,
        script: Option<String>,
    },
    Windows {
        /// `None`: the value was absent.
        auto_config_url: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacService {
    pub name: String,
    pub url: Option<String>,
    pub enabled: bool,
}

/// The saved state: what was there, and the URL we set (so `--undo` can tell).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    pub url: String,
    pub previous: Vec<Previous>,
}

/// The commands that read what a target holds now (their output goes to the `parse_*`
/// functions). macOS first needs [`mac_list_services`].
pub fn read_commands(target: Target, mac_services: &[String]) -> Vec<Cmd> {
    match target {
        Target::MacOs => mac_services
            .iter()
            .map(|s| Cmd::new("networksetup", &["-getautoproxyurl", s]))
            .collect(),
        Target::Gnome => gnome_reads().to_vec(),
        Target::Kde => kde_reads().to_vec(),
        Target::Windows => vec![windows_read()],
    }
}

/// GNOME's `mode` and `autoconfig-url`, for [`parse_gnome`].
pub fn gnome_reads() -> [Cmd; 2] {
    [
        Cmd::new("gsettings", &["get", GNOME_SCHEMA, "mode"]),
        Cmd::new("gsettings", &["get", GNOME_SCHEMA, "autoconfig-url"]),
    ]
}

/// KDE's `ProxyType` and `Proxy Config Script`, for [`parse_kde`].
pub fn kde_reads() -> [Cmd; 2] {
    [kde_read("ProxyType"), kde_read("Proxy Config Script")]
}

/// Windows' `AutoConfigURL`, for [`parse_windows`].
pub fn windows_read() -> Cmd {
    Cmd::new("reg", &["query", WINDOWS_KEY, "/v", "AutoConfigURL"])
}

fn kde_read(key: &str) -> Cmd {
    Cmd::new(
        "kreadconfig5",
        &["--file", KDE_FILE, "--group", KDE_GROUP, "--key", key],
    )
}

fn kde_write(key: &str, value: Option<&str>) -> Cmd {
    let mut args = vec!["--file", KDE_FILE, "--group", KDE_GROUP, "--key", key];
    match value {
        Some(v) => args.push(v),
        None => args.push("--delete"),
    }
    Cmd::new("kwriteconfig5", &args)
}

/// `networksetup -listallnetworkservices`.
pub fn mac_list_services() -> Cmd {
    Cmd::new("networksetup", &["-listallnetworkservices"])
}

/// The enabled services from `networksetup -listallnetworkservices` (its first line is a note;
/// a `*` marks a disabled service).
pub fn parse_mac_services(out: &str) -> Vec<String> {
    out.lines()
        .skip(1)
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('*'))
        .map(str::to_string)
        .collect()
}

/// `networksetup -getautoproxyurl` prints `URL: (null)` / `URL: http://…` and `Enabled: Yes|No`.
pub fn parse_mac_autoproxy(name: &str, out: &str) -> MacService {
    let mut url = None;
    let mut enabled = false;
    for line in out.lines() {
        if let Some(v) = line.strip_prefix("URL:") {
            let v = v.trim();
            if v != "(null)" && !v.is_empty() {
                url = Some(v.to_string());
            }
        } else if let Some(v) = line.strip_prefix("Enabled:") {
            enabled = v.trim().eq_ignore_ascii_case("yes");
        }
    }
    MacService {
        name: name.to_string(),
        url,
        enabled,
    }
}

/// The `Previous` of GNOME from the two `gsettings get` outputs.
pub fn parse_gnome(mode: &str, url: &str) -> Previous {
    Previous::Gnome {
        mode: mode.trim_end_matches(['\r', '\n']).to_string(),
        autoconfig_url: url.trim_end_matches(['\r', '\n']).to_string(),
    }
}

/// `kreadconfig5` prints the value, or nothing when the key is absent.
pub fn parse_kde(proxy_type: &str, script: &str) -> Previous {
    let value = |s: &str| {
        let v = s.trim_end_matches(['\r', '\n']);
        (!v.is_empty()).then(|| v.to_string())
    };
    Previous::Kde {
        proxy_type: value(proxy_type),
        script: value(script),
    }
}

/// `reg query … /v AutoConfigURL` prints `    AutoConfigURL    REG_SZ    <value>`, or fails
/// when the value is absent (pass `None` then).
pub fn parse_windows(out: Option<&str>) -> Previous {
    let value = out.and_then(|out| {
        out.lines().find_map(|l| {
            let rest = l.trim_start().strip_prefix("AutoConfigURL")?;
            let rest = rest.trim_start().strip_prefix("REG_SZ")?;
            // The separator is four spaces; the value keeps its own spacing.
            Some(
                rest.strip_prefix("    ")
                    .unwrap_or(rest.trim_start())
                    .to_string(),
            )
        })
    });
    Previous::Windows {
        auto_config_url: value,
    }
}

/// The commands that tell whether a manual proxy is on (their output goes to
/// [`manual_proxy_on`]); GNOME and KDE say it in the values [`read_commands`] reads.
pub fn manual_reads(target: Target, mac_services: &[String]) -> Vec<Cmd> {
    match target {
        Target::MacOs => mac_services
            .iter()
            .flat_map(|s| {
                [
                    Cmd::new("networksetup", &["-getwebproxy", s]),
                    Cmd::new("networksetup", &["-getsecurewebproxy", s]),
                ]
            })
            .collect(),
        Target::Windows => vec![Cmd::new(
            "reg",
            &["query", WINDOWS_KEY, "/v", "ProxyEnable"],
        )],
        Target::Gnome | Target::Kde => Vec::new(),
    }
}

/// Whether one [`manual_reads`] output says a manual proxy is on: `Enabled: Yes`
/// (networksetup) or `ProxyEnable    REG_DWORD    0x1` (reg).
pub fn manual_proxy_on(out: &str) -> bool {
    out.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        matches!(words.as_slice(), ["Enabled:", v] if v.eq_ignore_ascii_case("yes"))
            || matches!(words.as_slice(), ["ProxyEnable", "REG_DWORD", v] if *v != "0x0")
    })
}

/// What the OS already uses for its proxies that `setup system-proxy` would replace: an
/// automatic configuration other than `ours`, or a manual proxy (`manual`, from
/// [`manual_proxy_on`]). `None` when there is none. Replacing one would take every other
/// application off the proxy it was given (a company's, often), so the CLI stops and says so.
pub fn existing_proxy(previous: &Previous, manual: bool, ours: &str) -> Option<String> {
    let other = |url: &str| !url.is_empty() && url != ours;
    let found = match previous {
        Previous::MacOs { services } => services
            .iter()
            .find(|s| s.enabled && s.url.as_deref().is_some_and(other))
            .map(|s| {
                let url = s.url.as_deref().unwrap_or_default();
                format!("the automatic proxy configuration {url} on {}", s.name)
            }),
        Previous::Gnome {
            mode,
            autoconfig_url,
        } => {
            let url = autoconfig_url.trim_matches('\'');
            match mode.trim_matches('\'') {
                "manual" => Some("a manual proxy (GNOME's proxy mode is 'manual')".to_string()),
                "auto" if other(url) => Some(format!("the automatic proxy configuration {url}")),
                "auto" if url.is_empty() => {
                    Some("automatic proxy detection (GNOME's proxy mode is 'auto')".to_string())
                }
                _ => None,
            }
        }
        Previous::Kde { proxy_type, script } => match proxy_type.as_deref() {
            Some("1") => Some("a manual proxy (KDE's ProxyType is 1)".to_string()),
            Some("2") if script.as_deref().is_some_and(other) => Some(format!(
                "the automatic proxy configuration {}",
                script.as_deref().unwrap_or_default()
            )),
            Some("3") => Some("automatic proxy detection (KDE's ProxyType is 3)".to_string()),
            _ => None,
        },
        Previous::Windows { auto_config_url } => auto_config_url
            .as_deref()
            .filter(|u| other(u))
            .map(|u| format!("the automatic proxy configuration {u}")),
    };
    found.or_else(|| manual.then(|| "a manual proxy".to_string()))
}

/// The commands that point a target at `url`.
pub fn apply_commands(previous: &Previous, url: &str) -> Vec<Cmd> {
    match previous {
        Previous::MacOs { services } => services
            .iter()
            .flat_map(|s| {
                [
                    Cmd::new("networksetup", &["-setautoproxyurl", &s.name, url]),
                    Cmd::new("networksetup", &["-setautoproxystate", &s.name, "on"]),
                ]
            })
            .collect(),
        Previous::Gnome { .. } => vec![
            Cmd::new(
                "gsettings",
                &["set", GNOME_SCHEMA, "autoconfig-url", &gvariant_string(url)],
            ),
            Cmd::new("gsettings", &["set", GNOME_SCHEMA, "mode", "'auto'"]),
        ],
        Previous::Kde { .. } => vec![
            kde_write("Proxy Config Script", Some(url)),
            // 2: "use proxy auto configuration URL".
            kde_write("ProxyType", Some("2")),
        ],
        Previous::Windows { .. } => vec![windows_set_url(url)],
    }
}

/// Sets the Windows user's automatic proxy script URL.
fn windows_set_url(url: &str) -> Cmd {
    Cmd::new(
        "reg",
        &[
            "add",
            WINDOWS_KEY,
            "/v",
            "AutoConfigURL",
            "/t",
            "REG_SZ",
            "/d",
            url,
            "/f",
        ],
    )
}

/// The commands that put back exactly what was read.
pub fn undo_commands(previous: &Previous) -> Vec<Cmd> {
    match previous {
        Previous::MacOs { services } => services
            .iter()
            .flat_map(|s| {
                // networksetup has no "unset": an empty URL is what a fresh service reports
                // as `(null)`.
                let url = s.url.as_deref().unwrap_or("");
                let state = if s.enabled { "on" } else { "off" };
                [
                    Cmd::new("networksetup", &["-setautoproxyurl", &s.name, url]),
                    Cmd::new("networksetup", &["-setautoproxystate", &s.name, state]),
                ]
            })
            .collect(),
        Previous::Gnome {
            mode,
            autoconfig_url,
        } => vec![
            Cmd::new("gsettings", &["set", GNOME_SCHEMA, "mode", mode]),
            Cmd::new(
                "gsettings",
                &["set", GNOME_SCHEMA, "autoconfig-url", autoconfig_url],
            ),
        ],
        Previous::Kde { proxy_type, script } => vec![
            kde_write("ProxyType", proxy_type.as_deref()),
            kde_write("Proxy Config Script", script.as_deref()),
        ],
        Previous::Windows { auto_config_url } => match auto_config_url {
            Some(v) => vec![windows_set_url(v)],
            None => vec![Cmd::new(
                "reg",
                &["delete", WINDOWS_KEY, "/v", "AutoConfigURL", "/f"],
            )],
        },
    }
}

/// A GVariant string literal (what `gsettings set` parses).
pub(crate) fn gvariant_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', r"\\").replace('\'', r"\'"))
}

/// What the PAC wiring does while the proxy is down, as `setup system-proxy` says it.
pub const TRADE_OFF: &str = "While the proxy is down, the hosts that carry Cursor's agent \
(api2.cursor.sh, *.api5.cursor.sh) fail instead of going DIRECT: no chat on your own model \
reaches Cursor, and Cursor's AI features (its own models too) stop until the proxy is back. \
Cursor's other hosts go DIRECT. Keep the proxy running: `cursor-byok service install`.";

/// The hole a script served by the proxy leaves when no service manager holds its socket, as
/// `setup system-proxy` says it.
pub const SERVED_URL_CAVEAT: &str = "The script is served by the proxy itself and no service \
manager holds its socket: while the proxy is down it cannot be fetched, and a Cursor that \
starts (or re-reads the script) meanwhile goes DIRECT everywhere, agent hosts included, so a \
chat on your own model reaches Cursor. `cursor-byok service install` (Linux, macOS) closes \
that; `cursor-byok setup cursor` has no fallback at all; `cursor-byok doctor` says which case \
you are in.";

/// Windows has no socket activation: what the PAC wiring means there, said before applying.
pub const WINDOWS_TRADE_OFF: &str = "on Windows nothing holds the proxy's port while the \
proxy is down (no socket activation): a Cursor that starts then cannot fetch the PAC script \
and goes DIRECT everywhere, so a chat with one of your models selected sends its prompt to \
Cursor. `cursor-byok setup cursor` (Cursor's own proxy setting) has no such fallback and is \
the safer wiring here.";

/// Why the DIRECT fallback is there when the service manager does not hold the socket.
pub fn unheld_trade_off(why: &str, listen: std::net::SocketAddr) -> String {
    format!(
        "{why}, so while the proxy is down (at login before it starts, a crash, a restart, an \
         upgrade) nothing answers on {listen}: the OS cannot fetch the PAC script, and a Cursor \
         that starts then goes DIRECT for everything; a chat with one of your models selected \
         would send its prompt to Cursor"
    )
}

/// What the socket the service manager holds means for the PAC wiring.
pub fn held_note(at: std::net::SocketAddr) -> String {
    format!(
        "The login service's manager holds {at}: while the proxy is down or restarting, the \
         script fetch (and every connection) waits for it instead of failing, so Cursor never \
         falls back to DIRECT for want of the script. `cursor-byok service uninstall` ends \
         that: undo this first."
    )
}

/// The URL the OS fetches the script from: the proxy's own path (when the proxy is down the
/// fetch fails and PAC consumers fall back to DIRECT for every host), or the data-directory
/// copy as a `file://` URL.
pub fn served_url(listen: std::net::SocketAddr) -> String {
    format!(
        "http://{}{}",
        crate::status::pac::reachable(listen),
        crate::status::pac::PAC_PATH
    )
}

/// `file://` URL of a local path (absolute; percent-encoded; Windows drive paths as
/// `file:///C:/…`).
pub fn file_url(path: &Path) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
    const PATH: &AsciiSet = &CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'`')
        .add(b'{')
        .add(b'}');
    let text = path.to_string_lossy().replace('\\', "/");
    let text = if text.starts_with('/') {
        text
    } else {
        format!("/{text}")
    };
    format!("file://{}", utf8_percent_encode(&text, PATH))
}

/// Write the PAC copy into `data_dir` (replacing it atomically); its path.
pub fn write_file(
    data_dir: &Path,
    listen: std::net::SocketAddr,
    patterns: &[String],
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(data_dir)?;
    let path = data_dir.join(crate::status::pac::PAC_FILE);
    let tmp = data_dir.join(format!("{}.tmp", crate::status::pac::PAC_FILE));
    std::fs::write(&tmp, crate::status::pac::script(listen, patterns))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_print_as_typed() {
        let c = Cmd::new("gsettings", &["set", GNOME_SCHEMA, "mode", "'auto'"]);
        assert_eq!(
            c.to_string(),
            r#"gsettings set org.gnome.system.proxy mode "'auto'""#
        );
        let c = Cmd::new("networksetup", &["-setautoproxyurl", "Wi-Fi", "http://x/y"]);
        assert_eq!(
            c.to_string(),
            "networksetup -setautoproxyurl Wi-Fi http://x/y"
        );
    }

    #[test]
    fn file_urls() {
        assert_eq!(
            file_url(Path::new("/home/a b/proxy.pac")),
            "file:///home/a%20b/proxy.pac"
        );
        assert_eq!(
            file_url(Path::new(r"C:\Users\a\proxy.pac")),
            "file:///C:/Users/a/proxy.pac"
        );
    }

    #[test]
    fn a_proxy_already_in_use_is_found() {
        let ours = "http://127.0.0.1:8080/proxy.pac";
        let gnome = |mode: &str, url: &str| parse_gnome(mode, url);
        let found = |p: &Previous| existing_proxy(p, false, ours);
        assert!(found(&gnome("'auto'\n", "'http://wpad.corp/proxy.pac'\n"))
            .is_some_and(|w| w.contains("wpad.corp")));
        assert!(found(&gnome("'manual'", "''")).is_some_and(|w| w.contains("manual")));
        assert!(found(&gnome("'auto'", "''")).is_some(), "auto-detection");
        assert_eq!(found(&gnome("'none'", "''")), None);
        assert_eq!(
            found(&gnome("'auto'", &format!("'{ours}'"))),
            None,
            "ours already"
        );
        assert!(found(&parse_kde("1", "")).is_some());
        assert!(found(&parse_kde("2", "http://corp/p.pac")).is_some());
        assert_eq!(found(&parse_kde("", "")), None);
        let win = parse_windows(Some("    AutoConfigURL    REG_SZ    http://corp/p.pac\r\n"));
        assert!(found(&win).is_some_and(|w| w.contains("corp/p.pac")));
        let none = Previous::Windows {
            auto_config_url: None,
        };
        assert_eq!(found(&none), None);
        assert!(existing_proxy(&none, true, ours).is_some_and(|w| w.contains("manual")));
        let mac = Previous::MacOs {
            services: vec![MacService {
                name: "Wi-Fi".into(),
                url: Some("http://corp/p.pac".into()),
                enabled: true,
            }],
        };
        assert!(found(&mac).is_some_and(|w| w.contains("Wi-Fi")));
        assert!(manual_proxy_on("Enabled: Yes\nServer: corp\nPort: 3128\n"));
        assert!(!manual_proxy_on("Enabled: No\nServer: \nPort: 0\n"));
        assert!(manual_proxy_on("\n    ProxyEnable    REG_DWORD    0x1\n"));
        assert!(!manual_proxy_on("\n    ProxyEnable    REG_DWORD    0x0\n"));
        assert_eq!(manual_reads(Target::Windows, &[]).len(), 1);
        assert_eq!(manual_reads(Target::MacOs, &["Wi-Fi".into()]).len(), 2);
    }
}
