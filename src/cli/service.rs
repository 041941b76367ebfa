//! `cursor-byok service install | uninstall | status | logs`: the proxy as a per-user login
//! service (systemd user unit, LaunchAgent, Task Scheduler task).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::args::{Args, ServiceAction};
use crate::config::Config;
use crate::setup::logfile;
use crate::setup::os::Os;
use crate::setup::pac::Cmd;
use crate::setup::service::{self, Manifest, Spec};

pub fn run(args: &Args, config: &Config, action: ServiceAction) -> anyhow::Result<()> {
    let os = Os::current().context("no login service is known for this OS")?;
    if let ServiceAction::Install { name, .. }
    | ServiceAction::Uninstall { name }
    | ServiceAction::Status { name } = &action
    {
        service::check_name(name).map_err(|e| anyhow::anyhow!(e))?;
    }
    match action {
        ServiceAction::Install { dry_run, name } => install(args, config, os, &name, dry_run),
        ServiceAction::Uninstall { name } => uninstall(os, &name),
        ServiceAction::Status { name } => status(args, config, os, &name),
        ServiceAction::Logs { lines } => {
            let path = log_path(args, config);
            let tail = logfile::tail(&path, lines)
                .with_context(|| format!("cannot read the log {}", path.display()))?;
            if tail.is_empty() {
                println!("(no log yet at {})", path.display());
            }
            for l in tail {
                println!("{l}");
            }
            Ok(())
        }
    }
}

/// `~/.config` (or `$XDG_CONFIG_HOME`), `~/Library/Application Support`, `%APPDATA%`.
fn config_home() -> anyhow::Result<PathBuf> {
    dirs::config_dir().context("cannot tell your config directory (no home directory?)")
}

fn own_dir() -> anyhow::Result<PathBuf> {
    Ok(config_home()?.join("cursor-byok"))
}

/// Where the key file goes: next to the config, except on Windows, where the config
/// directory is the roaming profile (copied to other machines): the local one instead.
fn key_dir() -> anyhow::Result<PathBuf> {
    if cfg!(windows) {
        let local = dirs::data_local_dir().context("cannot tell your local app data directory")?;
        return Ok(local.join("cursor-byok"));
    }
    own_dir()
}

fn manifest_path(name: &str) -> anyhow::Result<PathBuf> {
    Ok(service::manifest_path(&config_home()?, name))
}

/// Whether the default login service's manager holds the proxy's socket on `listen` (for
/// `setup system-proxy` and `doctor`).
pub fn held(listen: std::net::SocketAddr) -> service::Held {
    let Some(os) = Os::current() else {
        return service::Held::No("no login service is known for this OS".into());
    };
    let manifest = manifest_path(service::DEFAULT_NAME)
        .ok()
        .and_then(|p| service::read_manifest(&p));
    service::held(manifest.as_ref(), os, listen)
}

fn data_dir(args: &Args, config: &Config) -> PathBuf {
    args.data_dir.clone().unwrap_or_else(|| config.data_dir())
}

fn log_path(args: &Args, config: &Config) -> PathBuf {
    absolute(&data_dir(args, config)).join(service::LOG_FILE)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn uid() -> u32 {
    #[cfg(unix)]
    {
        Command::new("id")
            .arg("-u")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
    #[cfg(not(unix))]
    {
        0
    }
}

fn spec(args: &Args, config: &Config, name: &str) -> anyhow::Result<Spec> {
    let exe = std::env::current_exe().context("cannot tell where this binary is")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let data_dir = absolute(&data_dir(args, config));
    let user = match (std::env::var("USERDOMAIN"), std::env::var("USERNAME")) {
        (Ok(d), Ok(u)) => format!("{d}\\{u}"),
        (_, Ok(u)) => u,
        _ => std::env::var("USER").unwrap_or_default(),
    };
    Ok(Spec {
        name: name.to_string(),
        exe,
        config: args
            .config
            .as_deref()
            .map(|c| c.canonicalize().unwrap_or_else(|_| absolute(c))),
        log_file: data_dir.join(service::LOG_FILE),
        data_dir,
        env_file: key_dir()?.join(format!("{name}.env")),
        home: dirs::home_dir().context("cannot tell your home directory")?,
        user,
        listen: config.listen,
    })
}

/// Run one command, printed first; its standard output, or why it failed.
pub(super) fn run_cmd(cmd: &Cmd, echo: bool) -> Result<String, String> {
    if echo {
        println!("$ {cmd}");
    }
    match Command::new(&cmd.program).args(&cmd.args).output() {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let err = err.trim();
            Err(format!(
                "`{}` failed ({}){}",
                cmd.program,
                out.status,
                if err.is_empty() {
                    String::new()
                } else {
                    format!(": {err}")
                }
            ))
        }
        Err(e) => Err(format!("cannot run `{}`: {e}", cmd.program)),
    }
}

/// Is there a systemd user manager to install into? `Err` says why not.
pub(crate) fn user_systemd() -> Result<(), String> {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|v| v.is_empty()) {
        return Err("XDG_RUNTIME_DIR is not set, so there is no user session bus".into());
    }
    run_cmd(
        &Cmd::new("systemctl", &["--user", "show-environment"]),
        false,
    )
    .map(|_| ())
}

/// The variables the service needs from this shell: each provider's key variable, and the
/// outbound proxy. `(set, missing)`.
fn service_vars(config: &Config) -> (Vec<(String, String)>, Vec<String>) {
    let mut names: Vec<String> = config
        .providers
        .values()
        .filter_map(|p| p.api_key_env.clone())
        .collect();
    names.sort();
    names.dedup();
    let mut set = Vec::new();
    let mut missing = Vec::new();
    for n in names {
        match std::env::var(&n) {
            Ok(v) if !v.is_empty() => set.push((n, v)),
            _ => missing.push(n),
        }
    }
    for n in service::PASSED_VARS {
        if let Ok(v) = std::env::var(n) {
            if !v.is_empty() {
                set.push((n.to_string(), v));
            }
        }
    }
    (set, missing)
}

/// Writes `text` into a file only the user can read: mode 0600, or on Windows an ACL for
/// `user` alone, set before the text goes in.
fn write_private(path: &Path, text: &str, user: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // An existing file keeps its old mode on open: tighten it before the keys go in.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot chmod 600 {}", path.display()))?;
    }
    if cfg!(windows) {
        run_cmd(&service::private_acl_command(path, user), false)
            .map_err(|e| anyhow::anyhow!("cannot make {} private to you: {e}", path.display()))?;
    }
    let _ = user;
    std::io::Write::write_all(&mut f, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

fn install(args: &Args, config: &Config, os: Os, name: &str, dry_run: bool) -> anyhow::Result<()> {
    let spec = spec(args, config, name)?;
    if os == Os::Linux {
        require_user_systemd(dry_run)?;
    }
    let definition_path = spec.definition_path(os, &config_home()?);
    let definition = spec.definition(os);
    let socket_path = spec.socket_path(os, &config_home()?);
    let (vars, missing) = service_vars(config);
    let env_text = service::env_file_text(&vars).map_err(|e| anyhow::anyhow!(e))?;
    let uid = uid();
    let manifest_path = manifest_path(name)?;
    let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();

    print_install_plan(&spec, &definition_path, &names, &missing);
    print_socket_plan(&spec, os, socket_path.as_deref());
    let start = service::start_commands(&spec, os, uid, &definition_path);
    if dry_run {
        println!();
        println!("--- {}", definition_path.display());
        print!("{definition}");
        println!("---");
        if let Some(path) = &socket_path {
            println!("--- {}", path.display());
            print!("{}", service::systemd_socket_unit(&spec));
            println!("---");
        }
        for c in &start {
            println!("$ {c}");
        }
        println!("(dry run: nothing was written or run)");
        return Ok(());
    }

    // A re-install replaces the running one.
    if manifest_path.exists() {
        for c in service::stop_commands(&spec, os, uid) {
            let _ = run_cmd(&c, false);
        }
    }
    let files = ServiceFiles {
        definition: &definition_path,
        socket: socket_path.as_deref(),
        env_text: &env_text,
        manifest: &manifest_path,
    };
    write_service_files(&spec, os, &files)?;
    for c in &start {
        if let Err(e) = run_cmd(c, true) {
            bail!(
                "{e}\nThe files are in place; `cursor-byok service uninstall` removes them again"
            );
        }
    }
    println!();
    println!(
        "Installed: `{name}` starts at login and restarts on failure. Check it: \
         `cursor-byok service status`; its log: `cursor-byok service logs`."
    );
    if os != Os::Windows {
        println!(
            "The service manager holds {} from login on: while the proxy is down or \
             restarting, connections wait for it instead of being refused.",
            spec.listen
        );
    }
    println!(
        "A changed key or config needs `cursor-byok service install` again (it replaces this one)."
    );
    Ok(())
}

/// A systemd user manager, which the Linux service needs; a dry run only notes its absence.
fn require_user_systemd(dry_run: bool) -> anyhow::Result<()> {
    if let Err(why) = user_systemd() {
        let msg = format!(
            "no systemd user manager here ({why}). In a desktop session it is there; over SSH \
             or in a container it is not. Start the proxy from your session's autostart \
             instead (e.g. ~/.config/autostart), or run `loginctl enable-linger $USER` and \
             log in again"
        );
        if !dry_run {
            bail!("{msg}");
        }
        println!("note: {msg}");
    }
    Ok(())
}

/// Where the files go and what the environment file carries (by variable name only).
fn print_install_plan(spec: &Spec, definition_path: &Path, names: &[&str], missing: &[String]) {
    println!("service definition: {}", definition_path.display());
    println!(
        "environment file:   {} (0600; read by the service at start)",
        spec.env_file.display()
    );
    println!(
        "  carries: {}",
        if names.is_empty() {
            "nothing (no provider key is set in this shell)".to_string()
        } else {
            names.join(", ")
        }
    );
    if !missing.is_empty() {
        println!(
            "  not set here, so not passed: {} (set them and run `service install` again)",
            missing.join(", ")
        );
    }
    println!("log file:           {}", spec.log_file.display());
}

/// What holds the listening socket, as the install plan says it.
fn print_socket_plan(spec: &Spec, os: Os, socket_path: Option<&Path>) {
    match (os, socket_path) {
        (Os::Linux, Some(path)) => println!(
            "socket unit:        {} (holds {} while the proxy is down)",
            path.display(),
            spec.listen
        ),
        (Os::MacOs, _) => println!(
            "socket:             {} held by launchd (the plist's Sockets entry)",
            spec.listen
        ),
        _ => println!(
            "socket:             none (Windows has no socket activation: while the proxy is \
             down its port refuses connections)"
        ),
    }
}

/// The files one install writes besides the env file's path, which the spec holds.
struct ServiceFiles<'a> {
    definition: &'a Path,
    /// Linux: the socket unit.
    socket: Option<&'a Path>,
    env_text: &'a str,
    manifest: &'a Path,
}

/// Writes the env file, the service definition, and last the manifest that lets `uninstall`
/// remove exactly these.
fn write_service_files(spec: &Spec, os: Os, files: &ServiceFiles<'_>) -> anyhow::Result<()> {
    write_private(&spec.env_file, files.env_text, &spec.user)?;
    if let Some(dir) = files.definition.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(files.definition, spec.definition_bytes(os))
        .with_context(|| format!("cannot write {}", files.definition.display()))?;
    let mut written = vec![files.definition.to_path_buf(), spec.env_file.clone()];
    if let Some(path) = files.socket {
        std::fs::write(path, service::systemd_socket_unit(spec))
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.to_path_buf());
    }
    let manifest = Manifest {
        os,
        name: spec.name.clone(),
        files: written,
        socket: (os != Os::Windows).then_some(spec.listen),
    };
    write_private(
        files.manifest,
        &serde_json::to_string_pretty(&manifest).context("manifest")?,
        &spec.user,
    )
}

fn uninstall(os: Os, name: &str) -> anyhow::Result<()> {
    let manifest_path = manifest_path(name)?;
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!(
                "`{name}` is not installed (no {}); nothing to remove.",
                manifest_path.display()
            );
            return Ok(());
        }
        Err(e) => return Err(e).context(format!("cannot read {}", manifest_path.display())),
    };
    let manifest: Manifest = serde_json::from_str(&text)
        .with_context(|| format!("{} does not parse", manifest_path.display()))?;
    let spec = Spec {
        name: manifest.name.clone(),
        exe: PathBuf::new(),
        config: None,
        data_dir: PathBuf::new(),
        env_file: PathBuf::new(),
        log_file: PathBuf::new(),
        home: PathBuf::new(),
        user: String::new(),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let uid = uid();
    for c in service::stop_commands(&spec, os, uid) {
        if let Err(e) = run_cmd(&c, true) {
            println!("  ({e}; continuing)");
        }
    }
    for f in &manifest.files {
        match std::fs::remove_file(f) {
            Ok(()) => println!("removed {}", f.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => println!("cannot remove {}: {e}", f.display()),
        }
    }
    std::fs::remove_file(&manifest_path)
        .with_context(|| format!("cannot remove {}", manifest_path.display()))?;
    for c in service::after_uninstall_commands(os) {
        if let Err(e) = run_cmd(&c, true) {
            println!("  ({e})");
        }
    }
    println!();
    println!("`{name}` is stopped and removed (its log stays in the data directory).");
    println!(
        "Cursor now reaches nothing if it still points at the proxy: undo the wiring with \
         `cursor-byok setup cursor --undo` (or `setup system-proxy --undo`), and remove the CA \
         with `cursor-byok ca untrust`."
    );
    Ok(())
}

/// Who holds the listening socket while the proxy is down: the manager's view on Linux, the
/// install's record elsewhere.
fn print_socket_status(spec: &Spec, os: Os) {
    let recorded = manifest_path(&spec.name)
        .ok()
        .and_then(|p| service::read_manifest(&p))
        .and_then(|m| m.socket);
    let Some(query) = service::socket_query_command(spec, os) else {
        match recorded {
            Some(at) => println!("socket:  {at}, held by launchd"),
            None => {
                println!("socket:  none held (connections are refused while the proxy is down)")
            }
        }
        return;
    };
    match run_cmd(&query, false) {
        Ok(out) => {
            let (active, _) = service::parse_systemd_show(&out);
            let listen = out
                .lines()
                .find_map(|l| l.strip_prefix("Listen="))
                .unwrap_or("nothing");
            if active {
                println!("socket:  listening on {listen} (held while the proxy is down)");
            } else {
                println!(
                    "socket:  not active: connections are refused while the proxy is down \
                     (`cursor-byok service install` again)"
                );
            }
        }
        Err(e) => println!("socket:  cannot ask ({e})"),
    }
}

fn status(args: &Args, config: &Config, os: Os, name: &str) -> anyhow::Result<()> {
    let manifest_path = manifest_path(name)?;
    let installed = manifest_path.exists();
    let spec = spec(args, config, name)?;
    if installed {
        println!(
            "service: installed ({})",
            spec.definition_path(os, &config_home()?).display()
        );
        match run_cmd(&service::query_command(&spec, os, uid()), false) {
            Ok(out) => match os {
                Os::Linux => {
                    let (active, since) = service::parse_systemd_show(&out);
                    println!(
                        "manager: {}{}",
                        if active { "active" } else { "not active" },
                        since.map(|s| format!(" since {s}")).unwrap_or_default()
                    );
                }
                Os::MacOs | Os::Windows => {
                    let state = out
                        .lines()
                        .map(str::trim)
                        .find(|l| l.starts_with("state =") || l.starts_with("Status:"))
                        .unwrap_or("loaded");
                    println!("manager: {state}");
                }
            },
            Err(e) => println!("manager: cannot ask ({e})"),
        }
        print_socket_status(&spec, os);
    } else {
        println!("service: not installed (`cursor-byok service install` makes it start at login)");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (check, snapshot) = runtime.block_on(crate::setup::doctor::check_listener(config));
    match snapshot {
        Some(s) => {
            let since = s.started_unix_ms;
            println!(
                "proxy:   runs on port {} (cursor-byok {}, up {}, since {} UTC, {} active run(s))",
                config.listen.port(),
                s.version,
                super::status::duration(s.uptime_secs),
                super::usage::utc(since),
                s.active.len()
            );
        }
        None => println!(
            "proxy:   not running on port {}: {}",
            config.listen.port(),
            check.detail
        ),
    }
    let log = spec.log_file;
    let tail = logfile::tail(&log, 2000).unwrap_or_default().join("\n");
    match service::last_error(&tail) {
        Some(line) => println!("last error: {line}"),
        None if log.exists() => println!("last error: none in {}", log.display()),
        None => println!("log:     none yet at {}", log.display()),
    }
    Ok(())
}
