//! `cursor-byok setup system-proxy [--dry-run] [--undo] [--file-url]`: the OS's automatic proxy
//! configuration pointed at the PAC script (see `status::pac` for what goes where, and
//! [`pac::TRADE_OFF`] for what that means while the proxy is down). On Linux and macOS it
//! stops unless the login service's manager holds the proxy's socket (so a script fetch made
//! while the proxy is down waits for it) or `--accept-direct-fallback` says otherwise.

use std::path::Path;

use anyhow::{bail, Context};

use super::args::SystemProxyArgs;
use super::service::{held, run_cmd};
use crate::config::Config;
use crate::setup::pac::{self, Cmd, Previous, Saved, Target};
use crate::setup::service::Held;

/// The proxy settings this machine has that we know how to set.
fn targets() -> Vec<Target> {
    if cfg!(target_os = "macos") {
        return vec![Target::MacOs];
    }
    if cfg!(windows) {
        return vec![Target::Windows];
    }
    let mut found = Vec::new();
    let gnome = Cmd::new("gsettings", &["list-keys", "org.gnome.system.proxy"]);
    if run_cmd(&gnome, false).is_ok() {
        found.push(Target::Gnome);
    }
    let kde = Cmd::new("kwriteconfig5", &["--help"]);
    if run_cmd(&kde, false).is_ok() {
        found.push(Target::Kde);
    }
    found
}

fn read_previous(target: Target, echo: bool) -> anyhow::Result<Previous> {
    let out = |c: &Cmd| run_cmd(c, echo).map_err(|e| anyhow::anyhow!(e));
    Ok(match target {
        Target::MacOs => {
            let services = pac::parse_mac_services(&out(&pac::mac_list_services())?);
            let reads = pac::read_commands(target, &services);
            let mut found = Vec::new();
            for (name, c) in services.iter().zip(&reads) {
                found.push(pac::parse_mac_autoproxy(name, &out(c)?));
            }
            Previous::MacOs { services: found }
        }
        Target::Gnome => {
            let [mode, url] = pac::gnome_reads();
            pac::parse_gnome(&out(&mode)?, &out(&url)?)
        }
        Target::Kde => {
            let [kind, script] = pac::kde_reads();
            // kreadconfig5 prints nothing (and succeeds) for an absent key.
            pac::parse_kde(&out(&kind)?, &out(&script)?)
        }
        // `reg query` fails when the value is absent.
        Target::Windows => pac::parse_windows(run_cmd(&pac::windows_read(), echo).ok().as_deref()),
    })
}

/// The proxy configuration the OS already uses, other than ours (see
/// [`pac::existing_proxy`]); a manual proxy that cannot be read counts as none.
fn existing_proxy(targets: &[Target], previous: &[Previous], ours: &str) -> Option<String> {
    targets.iter().zip(previous).find_map(|(t, p)| {
        let services: Vec<String> = match p {
            Previous::MacOs { services } => services.iter().map(|s| s.name.clone()).collect(),
            _ => Vec::new(),
        };
        let manual = pac::manual_reads(*t, &services)
            .iter()
            .any(|c| run_cmd(c, false).is_ok_and(|out| pac::manual_proxy_on(&out)));
        pac::existing_proxy(p, manual, ours)
    })
}

pub fn run(args: SystemProxyArgs, config: &Config, data_dir: &Path) -> anyhow::Result<()> {
    let saved_path = data_dir.join(pac::SAVED_FILE);
    if args.undo {
        return undo(&saved_path);
    }
    if already_applied(&saved_path)? {
        return Ok(());
    }
    let held = held(config.listen);
    check_held(&held, &args, config)?;
    let targets = targets();
    if targets.is_empty() {
        bail!(
            "no automatic proxy setting found to change here (neither gsettings with \
             org.gnome.system.proxy nor kwriteconfig5); use `cursor-byok setup cursor` instead, \
             or point your desktop's proxy settings at {} yourself",
            pac::served_url(config.listen)
        );
    }
    let file = data_dir.join(crate::status::pac::PAC_FILE);
    let url = if args.file_url {
        pac::file_url(&std::path::absolute(&file).unwrap_or(file.clone()))
    } else {
        pac::served_url(config.listen)
    };
    println!("Reading the current values:");
    let mut previous = Vec::new();
    for t in &targets {
        previous.push(read_previous(*t, true)?);
    }
    if let Some(existing) = existing_proxy(&targets, &previous, &url) {
        if !args.replace_existing {
            bail!(
                "this machine already uses {existing}. Pointing the OS at our PAC script would \
                 take every other application off it (Cursor's other hosts and everything else \
                 would go DIRECT). Instead, use `cursor-byok setup cursor` (Cursor's own proxy \
                 setting, nothing else changes), or ask whoever runs that proxy to send \
                 *.cursor.sh to {}. To replace it anyway: `cursor-byok setup system-proxy \
                 --replace-existing` (`--undo` puts it back)",
                pac::served_url(config.listen)
            );
        }
        println!("Replacing {existing} (`--undo` puts it back).");
    }
    let commands: Vec<Cmd> = previous
        .iter()
        .flat_map(|p| pac::apply_commands(p, &url))
        .collect();
    if args.dry_run {
        print_dry_run(&file, &saved_path, &commands, &previous);
        return Ok(());
    }
    let written = pac::write_file(data_dir, config.listen, &config.intercept)
        .with_context(|| format!("cannot write the PAC script to {}", file.display()))?;
    println!("PAC script: {}", written.display());
    let saved = Saved {
        url: url.clone(),
        previous,
    };
    save(&saved_path, &saved)?;
    println!("Saved the previous values to {}", saved_path.display());
    println!("Applying:");
    for c in &commands {
        if let Err(e) = run_cmd(c, true) {
            bail!("{e}\n`cursor-byok setup system-proxy --undo` puts back what was changed");
        }
    }
    print_applied(&url, &args, config, &held);
    Ok(())
}

/// Stop unless the service manager holds the socket or the user accepts the DIRECT fallback
/// (a dry run only says it would stop). Windows has no socket activation: there only the
/// explicit acceptance applies it.
fn check_held(held: &Held, args: &SystemProxyArgs, config: &Config) -> anyhow::Result<()> {
    let Held::No(why) = held else {
        return Ok(());
    };
    if args.accept_direct_fallback {
        if cfg!(windows) {
            println!("Accepted: {}", pac::WINDOWS_TRADE_OFF);
        } else {
            println!("Accepted: {}", pac::unheld_trade_off(why, config.listen));
        }
        return Ok(());
    }
    let stop = if cfg!(windows) {
        format!(
            "{}\nDo one of:\n  \
             - `cursor-byok setup cursor`: Cursor's own proxy setting, which has no fallback at \
             all;\n  \
             - `cursor-byok setup system-proxy --accept-direct-fallback`: apply it anyway.",
            pac::WINDOWS_TRADE_OFF
        )
    } else {
        unheld_stop(why, config)
    };
    if args.dry_run {
        println!("note: without --accept-direct-fallback this stops here: {stop}");
        return Ok(());
    }
    bail!("setup system-proxy stops here: {stop}")
}

/// Linux and macOS: what to do when the service manager does not hold the socket.
fn unheld_stop(why: &str, config: &Config) -> String {
    format!(
        "{}. Do one of:\n  \
         - `cursor-byok service install`: the service manager then holds {listen} from login \
         on and a script fetch waits for the proxy; then run this again;\n  \
         - `cursor-byok setup cursor`: Cursor's own proxy setting, which has no fallback at \
         all;\n  \
         - `cursor-byok setup system-proxy --accept-direct-fallback`: apply it anyway.",
        pac::unheld_trade_off(why, config.listen),
        listen = config.listen,
    )
}

/// What the user reads once the OS reads our PAC script: the trade-off and what is left to do.
fn print_applied(url: &str, args: &SystemProxyArgs, config: &Config, held: &Held) {
    println!();
    println!("The OS now reads {url}: Cursor's hosts go to the proxy.");
    println!("{}", pac::TRADE_OFF);
    match held {
        Held::Yes(at) => println!("{}", pac::held_note(*at)),
        Held::No(_) if !args.file_url => println!("{}", pac::SERVED_URL_CAVEAT),
        Held::No(_) => {}
    }
    println!(
        "In Cursor's settings.json keep \"cursor.general.disableHttp2\": true and remove \
         \"http.proxy\" (it overrides the OS setting and has no fallback); restart Cursor."
    );
    println!("Undo: `cursor-byok setup system-proxy --undo`.");
    if config.proxy_auth.is_some() {
        println!();
        println!("{PAC_CANNOT_CARRY_THE_SECRET}");
    }
}

/// The OS proxy setting names a PAC script, and a PAC's `PROXY host:port` has no place for
/// credentials: clients it sends here meet the listener's 407.
const PAC_CANNOT_CARRY_THE_SECRET: &str =
    "note: the listener asks for credentials (the per-install secret, or [proxy_auth]), and the \
     OS proxy setting cannot carry them: applications it sends here are refused with 407. \
     Either keep Cursor wired with `cursor-byok setup cursor` (its \"http.proxy\" carries the \
     secret), or set `open_listener = true` in the config, which opens the listener to every \
     local user (see docs/security.md).";

/// Says so when an earlier run's saved values are still there: applying twice would save our
/// own settings as the ones to restore.
fn already_applied(saved_path: &Path) -> anyhow::Result<bool> {
    let Ok(text) = std::fs::read_to_string(saved_path) else {
        return Ok(false);
    };
    let saved: Saved = serde_json::from_str(&text)
        .with_context(|| format!("{} does not parse", saved_path.display()))?;
    println!(
        "The system proxy already points at {} (the previous values are in {}); \
         `cursor-byok setup system-proxy --undo` restores them.",
        saved.url,
        saved_path.display()
    );
    Ok(true)
}

fn print_dry_run(file: &Path, saved_path: &Path, commands: &[Cmd], previous: &[Previous]) {
    println!();
    println!("Would write the PAC script to {}", file.display());
    println!("Would save the values above to {}", saved_path.display());
    println!("Would run:");
    for c in commands {
        println!("$ {c}");
    }
    println!("`--undo` would then run:");
    for p in previous {
        for c in pac::undo_commands(p) {
            println!("$ {c}");
        }
    }
    println!("(dry run: nothing was changed)");
}

/// The values found, for `--undo`.
fn save(saved_path: &Path, saved: &Saved) -> anyhow::Result<()> {
    std::fs::write(
        saved_path,
        serde_json::to_string_pretty(saved).context("cannot encode the saved values")?,
    )
    .with_context(|| {
        format!(
            "cannot save the previous values to {}",
            saved_path.display()
        )
    })
}

fn undo(saved_path: &Path) -> anyhow::Result<()> {
    let text = match std::fs::read_to_string(saved_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!(
                "Nothing to undo: {} is absent (setup system-proxy was not applied from this \
                 data directory).",
                saved_path.display()
            );
            return Ok(());
        }
        Err(e) => return Err(e).context(format!("cannot read {}", saved_path.display())),
    };
    let saved: Saved = serde_json::from_str(&text)
        .with_context(|| format!("{} does not parse", saved_path.display()))?;
    let mut failed = Vec::new();
    for p in &saved.previous {
        for c in pac::undo_commands(p) {
            if let Err(e) = run_cmd(&c, true) {
                failed.push(e);
            }
        }
    }
    if !failed.is_empty() {
        bail!(
            "{}; the saved values stay in {} for another try",
            failed.join("; "),
            saved_path.display()
        );
    }
    std::fs::remove_file(saved_path)
        .with_context(|| format!("cannot remove {}", saved_path.display()))?;
    println!("Restored the automatic proxy settings as they were. Restart Cursor.");
    Ok(())
}
