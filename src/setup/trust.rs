//! Trusting (and un-trusting) the install's CA: the exact commands per OS, running them where
//! the platform lets a user do so, and checking whether the OS trusts it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::os::Os;
use crate::tls::CertificateAuthority;

/// Nickname in the NSS database and file name in the system anchors.
pub(crate) const NICKNAME: &str = "cursor-byok";
/// The CA's common name (as it appears in keychains and certificate stores).
pub const COMMON_NAME: &str = "cursor-byok local CA";

/// One command, as argv (run directly, no shell) and as text to paste.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub argv: Vec<String>,
    pub(crate) needs_root: bool,
}

impl Step {
    fn new(argv: &[&str]) -> Step {
        Step {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            needs_root: false,
        }
    }

    fn root(mut self) -> Step {
        self.needs_root = true;
        self
    }

    /// The command as a user would type it (`sudo` added where root is needed).
    pub fn shell(&self) -> String {
        let words: Vec<String> = self.argv.iter().map(|a| quote(a)).collect();
        let cmd = words.join(" ");
        if self.needs_root {
            format!("sudo {cmd}")
        } else {
            cmd
        }
    }
}

/// A titled group of steps; the groups of one OS marked `alternative` are "one of these".
#[derive(Debug, Clone)]
pub struct Group {
    pub os: Os,
    pub title: &'static str,
    pub alternative: bool,
    pub steps: Vec<Step>,
}

/// Paths the commands name.
#[derive(Debug, Clone)]
pub struct CaFiles {
    pub pem: PathBuf,
    pub der: PathBuf,
    pub home: PathBuf,
}

impl CaFiles {
    pub fn of(ca: &CertificateAuthority) -> CaFiles {
        CaFiles {
            pem: absolute(&ca.cert_path()),
            der: absolute(&ca.der_path()),
            home: dirs::home_dir().unwrap_or_else(|| PathBuf::from("~")),
        }
    }

    fn keychain(&self) -> String {
        path_str(&self.home.join("Library/Keychains/login.keychain-db"))
    }

    fn nssdb(&self) -> PathBuf {
        self.home.join(".pki").join("nssdb")
    }
}

const DEBIAN_ANCHOR: &str = "/usr/local/share/ca-certificates/cursor-byok.crt";
const FEDORA_ANCHOR: &str = "/etc/pki/ca-trust/source/anchors/cursor-byok.pem";

/// Commands that make the OS (and, on Linux, Electron's NSS store) trust the CA.
pub fn trust_groups(f: &CaFiles) -> Vec<Group> {
    let pem = path_str(&f.pem);
    let der = path_str(&f.der);
    let nss = format!("sql:{}", path_str(&f.nssdb()));
    vec![
        Group {
            os: Os::MacOs,
            title: "login keychain (asks for your password)",
            alternative: false,
            steps: vec![Step::new(&[
                "security",
                "add-trusted-cert",
                "-r",
                "trustRoot",
                "-k",
                &f.keychain(),
                &pem,
            ])],
        },
        Group {
            os: Os::Windows,
            title: "current user's Root store (confirm the dialog)",
            alternative: false,
            steps: vec![Step::new(&["certutil", "-user", "-addstore", "Root", &der])],
        },
        Group {
            os: Os::Linux,
            title: "system store, Debian/Ubuntu",
            alternative: true,
            steps: vec![
                Step::new(&["cp", &pem, DEBIAN_ANCHOR]).root(),
                Step::new(&["update-ca-certificates"]).root(),
            ],
        },
        Group {
            os: Os::Linux,
            title: "system store, Fedora/RHEL",
            alternative: true,
            steps: vec![
                Step::new(&["cp", &pem, FEDORA_ANCHOR]).root(),
                Step::new(&["update-ca-trust"]).root(),
            ],
        },
        Group {
            os: Os::Linux,
            title: "system store, Arch and other p11-kit systems",
            alternative: true,
            steps: vec![Step::new(&["trust", "anchor", "--store", &pem]).root()],
        },
        Group {
            os: Os::Linux,
            title: "NSS database that Cursor (Electron/Chromium) reads; certutil is in \
                    libnss3-tools / nss-tools",
            alternative: false,
            steps: vec![Step::new(&[
                "certutil", "-d", &nss, "-A", "-t", "C,,", "-n", NICKNAME, "-i", &pem,
            ])],
        },
    ]
}

/// Commands that remove the CA again.
pub fn untrust_groups(f: &CaFiles) -> Vec<Group> {
    let pem = path_str(&f.pem);
    let nss = format!("sql:{}", path_str(&f.nssdb()));
    vec![
        Group {
            os: Os::MacOs,
            title: "login keychain",
            alternative: false,
            steps: vec![Step::new(&[
                "security",
                "delete-certificate",
                "-c",
                COMMON_NAME,
                &f.keychain(),
            ])],
        },
        Group {
            os: Os::Windows,
            title: "current user's Root store",
            alternative: false,
            steps: vec![Step::new(&[
                "certutil",
                "-user",
                "-delstore",
                "Root",
                COMMON_NAME,
            ])],
        },
        Group {
            os: Os::Linux,
            title: "system store, Debian/Ubuntu",
            alternative: true,
            steps: vec![
                Step::new(&["rm", DEBIAN_ANCHOR]).root(),
                Step::new(&["update-ca-certificates", "--fresh"]).root(),
            ],
        },
        Group {
            os: Os::Linux,
            title: "system store, Fedora/RHEL",
            alternative: true,
            steps: vec![
                Step::new(&["rm", FEDORA_ANCHOR]).root(),
                Step::new(&["update-ca-trust"]).root(),
            ],
        },
        Group {
            os: Os::Linux,
            title: "system store, Arch and other p11-kit systems",
            alternative: true,
            steps: vec![Step::new(&["trust", "anchor", "--remove", &pem]).root()],
        },
        Group {
            os: Os::Linux,
            title: "NSS database",
            alternative: false,
            steps: vec![Step::new(&["certutil", "-d", &nss, "-D", "-n", NICKNAME])],
        },
    ]
}

/// What `--apply` did for one step.
#[derive(Debug, Clone)]
pub enum Applied {
    Ran {
        command: String,
    },
    Failed {
        command: String,
        reason: String,
    },
    /// Left for the user, with why (needs root, tool missing).
    Skipped {
        command: String,
        reason: String,
    },
}

/// Run the trust commands for this machine where a user may: the keychain on macOS, the user
/// store on Windows, the NSS database on Linux; the Linux system store only when running as
/// root (otherwise its commands are returned for the user to run with sudo).
pub fn apply_trust(f: &CaFiles) -> Vec<Applied> {
    let Some(os) = Os::current() else {
        return vec![Applied::Skipped {
            command: String::new(),
            reason: format!(
                "{} is not supported: trust the CA by hand",
                std::env::consts::OS
            ),
        }];
    };
    let groups = trust_groups(f);
    let mut out = Vec::new();
    match os {
        Os::MacOs | Os::Windows => {
            for g in groups.iter().filter(|g| g.os == os) {
                out.extend(g.steps.iter().map(run));
            }
        }
        Os::Linux => {
            let system = linux_system_group(&groups);
            let root = is_root();
            for step in system.map(|g| g.steps.clone()).unwrap_or_default() {
                if root {
                    out.push(run(&step));
                } else {
                    out.push(Applied::Skipped {
                        command: step.shell(),
                        reason: "needs root: run it yourself".into(),
                    });
                }
            }
            if system.is_none() {
                out.push(Applied::Skipped {
                    command: String::new(),
                    reason: "no update-ca-certificates, update-ca-trust or trust found: add \
                             the CA to the system store by hand"
                        .into(),
                });
            }
            out.extend(apply_nss(f, &groups));
        }
    }
    out
}

/// The system-store variant this Linux has tools for.
fn linux_system_group(groups: &[Group]) -> Option<&Group> {
    let pick = if Path::new("/usr/local/share/ca-certificates").is_dir()
        && on_path("update-ca-certificates")
    {
        "system store, Debian/Ubuntu"
    } else if Path::new("/etc/pki/ca-trust/source/anchors").is_dir() && on_path("update-ca-trust") {
        "system store, Fedora/RHEL"
    } else if on_path("trust") {
        "system store, Arch and other p11-kit systems"
    } else {
        return None;
    };
    groups.iter().find(|g| g.title == pick)
}

fn apply_nss(f: &CaFiles, groups: &[Group]) -> Vec<Applied> {
    let Some(group) = groups.iter().find(|g| g.title.starts_with("NSS")) else {
        return Vec::new();
    };
    if !on_path("certutil") {
        return group
            .steps
            .iter()
            .map(|s| Applied::Skipped {
                command: s.shell(),
                reason: "certutil is not installed (apt install libnss3-tools / dnf install \
                         nss-tools)"
                    .into(),
            })
            .collect();
    }
    let db = f.nssdb();
    let dbarg = format!("sql:{}", path_str(&db));
    let mut out = Vec::new();
    if !db.join("cert9.db").exists() {
        if let Err(e) = std::fs::create_dir_all(&db) {
            return vec![Applied::Failed {
                command: format!("mkdir -p {}", quote(&path_str(&db))),
                reason: e.to_string(),
            }];
        }
        out.push(run(&Step::new(&[
            "certutil",
            "-d",
            &dbarg,
            "-N",
            "--empty-password",
        ])));
    }
    // A CA from an earlier install under the same nickname would shadow the new one.
    let _ = Command::new("certutil")
        .args(["-d", &dbarg, "-D", "-n", NICKNAME])
        .output();
    out.extend(group.steps.iter().map(run));
    out
}

fn run(step: &Step) -> Applied {
    let command = step.shell();
    let Some((program, args)) = step.argv.split_first() else {
        return Applied::Failed {
            command,
            reason: "empty command".into(),
        };
    };
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => Applied::Ran { command },
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            Applied::Failed {
                command,
                reason: format!("{} ({})", stderr.trim(), out.status),
            }
        }
        Err(e) => Applied::Failed {
            command,
            reason: e.to_string(),
        },
    }
}

/// Does the OS store (what `rustls-native-certs` reads: the system bundle on Linux, the
/// keychains on macOS, the stores on Windows) contain our CA?
pub(crate) fn os_store_trusts(ca_der: &[u8]) -> Result<bool, String> {
    let result = rustls_native_certs::load_native_certs();
    if result.certs.is_empty() {
        if let Some(e) = result.errors.first() {
            return Err(e.to_string());
        }
    }
    Ok(result.certs.iter().any(|c| c.as_ref() == ca_der))
}

/// Does the NSS database hold our CA? `None` when that cannot be checked (Linux only, needs
/// certutil and an existing database).
pub(crate) fn nss_trusts(f: &CaFiles, ca_pem: &str) -> Option<Result<bool, String>> {
    if Os::current() != Some(Os::Linux) {
        return None;
    }
    let db = f.nssdb();
    if !db.join("cert9.db").exists() {
        return Some(Ok(false));
    }
    if !on_path("certutil") {
        return None;
    }
    let dbarg = format!("sql:{}", path_str(&db));
    let out = Command::new("certutil")
        .args(["-d", &dbarg, "-L", "-n", NICKNAME, "-a"])
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let norm = |s: &str| s.split_whitespace().collect::<String>();
            Some(Ok(
                norm(&String::from_utf8_lossy(&out.stdout)).contains(&norm(ca_pem))
            ))
        }
        Ok(_) => Some(Ok(false)),
        Err(e) => Some(Err(e.to_string())),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            let p = dir.join(program);
            p.is_file() || p.with_extension("exe").is_file()
        })
    })
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Quote a word for a POSIX shell or cmd when it needs it.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+\\".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("\"{}\"", word.replace('"', "\\\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_name_the_files() {
        let f = CaFiles {
            pem: "/data/my dir/ca.pem".into(),
            der: "/data/my dir/ca.der".into(),
            home: "/home/me".into(),
        };
        let shells: Vec<String> = trust_groups(&f)
            .iter()
            .flat_map(|g| g.steps.iter().map(Step::shell))
            .collect();
        assert!(shells.contains(
            &"security add-trusted-cert -r trustRoot -k /home/me/Library/Keychains/login.keychain-db \"/data/my dir/ca.pem\"".to_string()
        ), "{shells:#?}");
        assert!(
            shells.contains(&"certutil -user -addstore Root \"/data/my dir/ca.der\"".to_string())
        );
        assert!(shells.contains(&"sudo update-ca-certificates".to_string()));
        assert!(shells.contains(
            &"certutil -d sql:/home/me/.pki/nssdb -A -t C,, -n cursor-byok -i \"/data/my dir/ca.pem\""
                .to_string()
        ));
        assert!(!untrust_groups(&f).is_empty());
    }
}
