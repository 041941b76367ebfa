//! `cursor-byok service`: a per-user login service on each OS, generated from the config.
//!
//! The definitions (systemd user unit, LaunchAgent plist, Task Scheduler XML) and the manager
//! commands are pure functions of a [`Spec`]; the CLI writes the files and runs the commands.
//! API keys reach the service through one env file (0600) that the binary reads itself
//! (`run --env-file`), so every OS works the same and no key sits in a unit or a plist.
//!
//! On Linux and macOS the service manager also holds the proxy's listening socket (a systemd
//! `.socket` unit; the LaunchAgent's `Sockets` entry) and hands it to the proxy at start
//! (`base::activation`). The socket stays open while the proxy is down, crashed, restarting
//! or being upgraded, so a connection made meanwhile (the OS fetching the PAC script, Cursor
//! sending a chat) waits for the proxy instead of being refused: a refused PAC fetch would send
//! Cursor DIRECT, a chat on the user's model included. Windows has no such thing.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::os::Os;
use super::pac::Cmd;
pub use crate::base::activation::LAUNCHD_SOCKET;

/// The service's name: unit `cursor-byok.service`, task `cursor-byok`.
pub const DEFAULT_NAME: &str = "cursor-byok";
/// The LaunchAgent label prefix (reverse-DNS, as launchd expects).
pub(crate) const LAUNCHD_PREFIX: &str = "dev.cursor-byok.";
/// The log file in the data directory, rotated to `.1`.
pub const LOG_FILE: &str = "cursor-byok.log";
/// Rotated when the next line would take it past this.
pub const MAX_LOG_BYTES: u64 = 4 << 20;
/// Variables besides the providers' keys that the service needs the same as the shell:
/// the outbound proxy.
pub const PASSED_VARS: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// A service name is a file name, a unit name, a launchd label and a task name at once:
/// letters, digits, `-`, `_` and `.`, starting with a letter or digit, at most 64 long.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let starts_ok = name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > 64 || !starts_ok || !name.chars().all(ok_char) {
        return Err(format!(
            "the service name {name:?} is not usable: use 1 to 64 letters, digits, `-`, `_` or `.`, \
             starting with a letter or digit"
        ));
    }
    Ok(())
}

/// Windows: the command that leaves `path` to `user` alone (no inherited entries, full
/// control for the user only), run on the key file before any key is written into it.
pub fn private_acl_command(path: &Path, user: &str) -> Cmd {
    let path = path.display().to_string();
    let grant = format!("{user}:F");
    Cmd::new("icacls", &[&path, "/inheritance:r", "/grant:r", &grant])
}

/// Everything a definition is generated from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub name: String,
    /// The binary, absolute.
    pub exe: PathBuf,
    /// The config file, absolute, when the user runs with one.
    pub config: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub env_file: PathBuf,
    pub log_file: PathBuf,
    /// The user's home (macOS: `~/Library/LaunchAgents`; Linux: the unit's directory).
    pub home: PathBuf,
    /// Windows: `DOMAIN\user` the logon trigger is for.
    pub user: String,
    /// The config's `listen`: the socket the service manager holds (Linux, macOS).
    pub listen: SocketAddr,
}

impl Spec {
    /// The service's command line: the same binary, config and data directory as now.
    pub fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(c) = &self.config {
            a.push("--config".to_string());
            a.push(c.display().to_string());
        }
        a.push("--data-dir".into());
        a.push(self.data_dir.display().to_string());
        a.push("run".into());
        a.push("--env-file".into());
        a.push(self.env_file.display().to_string());
        a.push("--log-file".into());
        a.push(self.log_file.display().to_string());
        a
    }

    pub(crate) fn launchd_label(&self) -> String {
        format!("{LAUNCHD_PREFIX}{}", self.name)
    }

    /// Where the definition lives on `os`.
    pub fn definition_path(&self, os: Os, config_home: &Path) -> PathBuf {
        match os {
            Os::Linux => config_home
                .join("systemd/user")
                .join(format!("{}.service", self.name)),
            Os::MacOs => self
                .home
                .join("Library/LaunchAgents")
                .join(format!("{}.plist", self.launchd_label())),
            // Registered with schtasks from this file, kept for `uninstall` to remove.
            Os::Windows => self.data_dir.join(format!("{}-task.xml", self.name)),
        }
    }

    /// Linux: where the `.socket` unit that holds the listening socket lives, beside the
    /// service's unit. macOS keeps its socket in the plist; Windows has none.
    pub fn socket_path(&self, os: Os, config_home: &Path) -> Option<PathBuf> {
        match os {
            Os::Linux => Some(
                config_home
                    .join("systemd/user")
                    .join(format!("{}.socket", self.name)),
            ),
            Os::MacOs | Os::Windows => None,
        }
    }

    /// The definition's text on `os`.
    pub fn definition(&self, os: Os) -> String {
        match os {
            Os::Linux => systemd_unit(self),
            Os::MacOs => launchd_plist(self),
            Os::Windows => task_xml(self),
        }
    }
}

impl Spec {
    /// The definition as written to disk: Task Scheduler reads its XML as UTF-16 (little
    /// endian, with a byte-order mark), the others are UTF-8.
    pub fn definition_bytes(&self, os: Os) -> Vec<u8> {
        let text = self.definition(os);
        match os {
            Os::Windows => [0xFF, 0xFE]
                .into_iter()
                .chain(text.encode_utf16().flat_map(u16::to_le_bytes))
                .collect(),
            Os::Linux | Os::MacOs => text.into_bytes(),
        }
    }
}

/// A systemd user unit: started by its socket unit (the one that is enabled), restarted on
/// failure for as long as it takes: a start limit would let systemd give up, and with it the
/// socket, so connections would be refused again.
pub fn systemd_unit(spec: &Spec) -> String {
    let mut exec = systemd_quote(&spec.exe.display().to_string());
    for a in spec.args() {
        exec.push(' ');
        exec.push_str(&systemd_quote(&a));
    }
    let socket = format!("{}.socket", spec.name);
    format!(
        "[Unit]\n\
         Description=cursor-byok: Cursor's Agent on your own model provider\n\
         Requires={socket}\n\
         After={socket}\n\
         StartLimitIntervalSec=0\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={exec}\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         Environment=NO_COLOR=1\n\
         \n\
         [Install]\n\
         Also={socket}\n"
    )
}

/// The systemd socket unit: listens on `listen` from the user's login on, and hands the socket
/// to the service (`LISTEN_FDS`), which it starts on the first connection if it is not running.
pub fn systemd_socket_unit(spec: &Spec) -> String {
    format!(
        "[Unit]\n\
         Description=cursor-byok: the proxy's listening socket, held while the proxy is down\n\
         \n\
         [Socket]\n\
         ListenStream={listen}\n\
         Accept=no\n\
         NoDelay=true\n\
         Service={name}.service\n\
         \n\
         [Install]\n\
         WantedBy=sockets.target\n",
        listen = spec.listen,
        name = spec.name,
    )
}

/// One ExecStart word: double-quoted with C escapes; `%` and `$` doubled so systemd takes them
/// literally.
pub(crate) fn systemd_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A LaunchAgent: runs at login, restarted when it exits with an error; launchd holds its
/// listening socket ([`LAUNCHD_SOCKET`]) and starts it on a connection when it is not running.
pub(crate) fn launchd_plist(spec: &Spec) -> String {
    let mut args = String::new();
    for a in std::iter::once(spec.exe.display().to_string()).chain(spec.args()) {
        let _ = writeln!(args, "        <string>{}</string>", xml_escape(&a));
    }
    // Output before the log file opens (a bad config, say) still lands beside it.
    let early = spec.data_dir.join("launchd.log");
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
    <key>Label</key>
    <string>{label}</string>
    <key>ProgramArguments</key>
    <array>
{args}    </array>
    <key>RunAtLoad</key>
    <true/>
    <key>KeepAlive</key>
    <dict>
        <key>SuccessfulExit</key>
        <false/>
    </dict>
    <key>ThrottleInterval</key>
    <integer>5</integer>
    <key>ProcessType</key>
    <string>Interactive</string>
    <key>EnvironmentVariables</key>
    <dict>
        <key>NO_COLOR</key>
        <string>1</string>
    </dict>
    <key>StandardOutPath</key>
    <string>{early}</string>
    <key>StandardErrorPath</key>
    <string>{early}</string>
    <key>Sockets</key>
    <dict>
        <key>{socket}</key>
        <dict>
            <key>SockNodeName</key>
            <string>{node}</string>
            <key>SockServiceName</key>
            <string>{port}</string>
            <key>SockType</key>
            <string>stream</string>
            <key>SockFamily</key>
            <string>{family}</string>
        </dict>
    </dict>
</dict>
</plist>
"#,
        label = xml_escape(&spec.launchd_label()),
        early = xml_escape(&early.display().to_string()),
        socket = LAUNCHD_SOCKET,
        node = spec.listen.ip(),
        port = spec.listen.port(),
        family = if spec.listen.is_ipv4() {
            "IPv4"
        } else {
            "IPv6"
        },
    )
}

/// Windows quoting of one argument (CommandLineToArgvW rules).
pub fn windows_quote(s: &str) -> String {
    if !s.is_empty() && !s.contains([' ', '\t', '"']) {
        return s.to_string();
    }
    let mut out = String::from("\"");
    let mut backslashes = 0;
    for c in s.chars() {
        match c {
            '\\' => backslashes += 1,
            '"' => {
                out.push_str(&"\\".repeat(backslashes * 2 + 1));
                out.push('"');
                backslashes = 0;
            }
            c => {
                out.push_str(&"\\".repeat(backslashes));
                out.push(c);
                backslashes = 0;
            }
        }
    }
    out.push_str(&"\\".repeat(backslashes * 2));
    out.push('"');
    out
}

/// A Task Scheduler task for this user at logon, least privilege (no admin needed to register
/// a task for oneself), restarted on failure, never stopped for running long.
pub(crate) fn task_xml(spec: &Spec) -> String {
    let args: Vec<String> = spec.args().iter().map(|a| windows_quote(a)).collect();
    format!(
        r#"<?xml version="1.0" encoding="UTF-16"?>
<Task version="1.2" xmlns="http://schemas.microsoft.com/windows/2004/02/mit/task">
  <RegistrationInfo>
    <Description>cursor-byok: Cursor's Agent on your own model provider</Description>
  </RegistrationInfo>
  <Triggers>
    <LogonTrigger>
      <Enabled>true</Enabled>
      <UserId>{user}</UserId>
    </LogonTrigger>
  </Triggers>
  <Principals>
    <Principal id="Author">
      <UserId>{user}</UserId>
      <LogonType>InteractiveToken</LogonType>
      <RunLevel>LeastPrivilege</RunLevel>
    </Principal>
  </Principals>
  <Settings>
    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>
    <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>
    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>
    <ExecutionTimeLimit>PT0S</ExecutionTimeLimit>
    <RestartOnFailure>
      <Interval>PT1M</Interval>
      <Count>999</Count>
    </RestartOnFailure>
    <Hidden>true</Hidden>
    <Enabled>true</Enabled>
  </Settings>
  <Actions Context="Author">
    <Exec>
      <Command>{exe}</Command>
      <Arguments>{args}</Arguments>
    </Exec>
  </Actions>
</Task>
"#,
        user = xml_escape(&spec.user),
        exe = xml_escape(&spec.exe.display().to_string()),
        args = xml_escape(&args.join(" ")),
    )
}

/// The commands that start the installed service (after its definition is written).
pub fn start_commands(spec: &Spec, os: Os, uid: u32, definition: &Path) -> Vec<Cmd> {
    let unit = format!("{}.service", spec.name);
    match os {
        Os::Linux => {
            let socket = format!("{}.socket", spec.name);
            vec![
                Cmd::new("systemctl", &["--user", "daemon-reload"]),
                // The socket is what starts with the session; it starts the service.
                Cmd::new("systemctl", &["--user", "enable", &socket]),
                Cmd::new("systemctl", &["--user", "restart", &socket]),
                // Running now rather than at the first connection; replaces a running one.
                Cmd::new("systemctl", &["--user", "restart", &unit]),
            ]
        }
        Os::MacOs => vec![Cmd::new(
            "launchctl",
            &[
                "bootstrap",
                &format!("gui/{uid}"),
                &definition.display().to_string(),
            ],
        )],
        Os::Windows => vec![
            Cmd::new(
                "schtasks",
                &[
                    "/Create",
                    "/TN",
                    &spec.name,
                    "/XML",
                    &definition.display().to_string(),
                    "/F",
                ],
            ),
            Cmd::new("schtasks", &["/Run", "/TN", &spec.name]),
        ],
    }
}

/// The commands that stop and unregister it (before its files are removed): on Linux the
/// socket first (so no connection starts the service again), then the service, each on its
/// own so an install that predates the socket unit is still stopped.
pub fn stop_commands(spec: &Spec, os: Os, uid: u32) -> Vec<Cmd> {
    let unit = format!("{}.service", spec.name);
    match os {
        Os::Linux => vec![
            Cmd::new(
                "systemctl",
                &[
                    "--user",
                    "disable",
                    "--now",
                    &format!("{}.socket", spec.name),
                ],
            ),
            Cmd::new("systemctl", &["--user", "disable", "--now", &unit]),
        ],
        Os::MacOs => vec![Cmd::new(
            "launchctl",
            &["bootout", &format!("gui/{uid}/{}", spec.launchd_label())],
        )],
        Os::Windows => vec![
            Cmd::new("schtasks", &["/End", "/TN", &spec.name]),
            Cmd::new("schtasks", &["/Delete", "/TN", &spec.name, "/F"]),
        ],
    }
}

/// After the files are removed (systemd forgets the unit only on a reload).
pub fn after_uninstall_commands(os: Os) -> Vec<Cmd> {
    match os {
        Os::Linux => vec![Cmd::new("systemctl", &["--user", "daemon-reload"])],
        Os::MacOs | Os::Windows => Vec::new(),
    }
}

/// The command whose output says whether the service runs, and since when.
pub fn query_command(spec: &Spec, os: Os, uid: u32) -> Cmd {
    match os {
        Os::Linux => Cmd::new(
            "systemctl",
            &[
                "--user",
                "show",
                &format!("{}.service", spec.name),
                "--property=ActiveState,SubState,ActiveEnterTimestamp,MainPID",
            ],
        ),
        Os::MacOs => Cmd::new(
            "launchctl",
            &["print", &format!("gui/{uid}/{}", spec.launchd_label())],
        ),
        Os::Windows => Cmd::new(
            "schtasks",
            &["/Query", "/TN", &spec.name, "/V", "/FO", "LIST"],
        ),
    }
}

/// Linux: the command whose output says whether the socket unit listens, and where.
pub fn socket_query_command(spec: &Spec, os: Os) -> Option<Cmd> {
    match os {
        Os::Linux => Some(Cmd::new(
            "systemctl",
            &[
                "--user",
                "show",
                &format!("{}.socket", spec.name),
                "--property=ActiveState,Listen",
            ],
        )),
        Os::MacOs | Os::Windows => None,
    }
}

/// The env file: `NAME=value` lines. Values with a newline cannot be written (and no key has one).
pub fn env_file_text(vars: &[(String, String)]) -> Result<String, String> {
    let mut out = String::from(
        "# cursor-byok service environment: read by `cursor-byok run --env-file`. Keep it 0600.\n",
    );
    for (k, v) in vars {
        if v.contains(['\n', '\r']) {
            return Err(format!(
                "${k} holds a line break; the env file cannot carry it"
            ));
        }
        let _ = writeln!(out, "{k}={v}");
    }
    Ok(out)
}

/// `NAME=value` lines; `#` comments and blank lines skipped; no quoting (the value is the rest
/// of the line). The error names the line, never its value.
pub fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: not NAME=value", i + 1));
        };
        let k = k.trim();
        let valid = !k.is_empty()
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(format!("line {}: `{k}` is not a variable name", i + 1));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// What `install` wrote: removed by `uninstall`, nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub os: Os,
    pub name: String,
    pub files: Vec<PathBuf>,
    /// The address the service manager holds for the proxy; `None` for an install without
    /// socket activation (Windows, or one written before it existed).
    #[serde(default)]
    pub socket: Option<SocketAddr>,
}

/// Where `install` keeps its [`Manifest`]: `<config dir>/cursor-byok/<name>-install.json`.
pub fn manifest_path(config_home: &Path, name: &str) -> PathBuf {
    config_home
        .join("cursor-byok")
        .join(format!("{name}-install.json"))
}

/// The manifest at `path`, when there is one that parses.
pub fn read_manifest(path: &Path) -> Option<Manifest> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether a connection made while the proxy is down waits for it: the service manager holds
/// the proxy's socket on `listen`, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// The installed service's manager holds the socket on this address.
    Yes(SocketAddr),
    /// Nobody holds it: while the proxy is down its port refuses connections.
    No(String),
}

/// [`Held`] from the installed service's manifest (`None`: not installed) on `os`, for a proxy
/// on `listen`.
pub fn held(manifest: Option<&Manifest>, os: Os, listen: SocketAddr) -> Held {
    if os == Os::Windows {
        return Held::No("Windows has no socket activation".into());
    }
    let Some(m) = manifest else {
        return Held::No("the login service is not installed".into());
    };
    match m.socket {
        None => Held::No(
            "the login service was installed without its socket (by an older cursor-byok)".into(),
        ),
        Some(at) if !same_address(at, listen) => Held::No(format!(
            "the login service's socket is on {at}, but the config listens on {listen}"
        )),
        Some(at) => Held::Yes(at),
    }
}

/// One address as clients dial it: a wildcard is reached on loopback.
fn same_address(a: SocketAddr, b: SocketAddr) -> bool {
    crate::status::pac::reachable(a) == crate::status::pac::reachable(b)
}

/// What `systemctl --user show … --property=…` printed, as (active, since).
pub fn parse_systemd_show(out: &str) -> (bool, Option<String>) {
    let mut active = false;
    let mut since = None;
    for line in out.lines() {
        if let Some(v) = line.strip_prefix("ActiveState=") {
            active = v.trim() == "active";
        } else if let Some(v) = line.strip_prefix("ActiveEnterTimestamp=") {
            let v = v.trim();
            if !v.is_empty() {
                since = Some(v.to_string());
            }
        }
    }
    (active, since)
}

/// The last line of the log that reports an error (`ERROR` level, or a failed start).
pub fn last_error(log: &str) -> Option<&str> {
    log.lines()
        .rev()
        .find(|l| l.contains(" ERROR ") || l.starts_with("error:"))
}

#[cfg(test)]
mod name_and_acl_tests {
    use super::*;

    #[test]
    fn service_names_are_checked() {
        for ok in ["cursor-byok", "byok2", "work.proxy", "a_b"] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        let long = "a".repeat(65);
        for bad in [
            "",
            "../x",
            "a/b",
            "-x",
            ".hidden",
            "a b",
            "x;rm",
            "ü",
            long.as_str(),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_windows_key_file_is_left_to_its_user() {
        let c = private_acl_command(
            Path::new(r"C:\Users\me\AppData\Local\cursor-byok\k.env"),
            r"PC\me",
        );
        assert_eq!(
            c.to_string(),
            r"icacls C:\Users\me\AppData\Local\cursor-byok\k.env /inheritance:r /grant:r PC\me:F"
        );
    }
}
