//! `cursor-byok setup cursor`: wire Cursor's `settings.json` to the proxy, or `--undo` it;
//! `setup system-proxy` (in `system_proxy`).

use std::net::SocketAddr;
use std::path::Path;

use super::args::SetupTarget;
use crate::config::{Config, ProxyAuth};
use crate::setup::cursor::{self, Undo, SETTINGS_LOCATIONS};

pub fn run(target: SetupTarget, config: &Config, data_dir: &Path) -> anyhow::Result<()> {
    let args = match target {
        SetupTarget::Cursor(args) => args,
        SetupTarget::SystemProxy(args) => return super::system_proxy::run(args, config, data_dir),
    };
    let path = match args.settings {
        Some(p) => p,
        None => cursor::default_settings_path().map_err(|e| {
            let places: Vec<String> = SETTINGS_LOCATIONS
                .iter()
                .map(|(os, p)| format!("{os}: {p}"))
                .collect();
            anyhow::anyhow!("{e} (Cursor keeps it at {})", places.join("; "))
        })?,
    };
    if args.undo {
        return undo(&path);
    }
    wire(
        &path,
        config.listen,
        args.dry_run,
        config.proxy_auth.as_ref(),
    )
}

/// Writes the wiring, `http.proxy` with the listener's credentials (the per-install secret
/// unless `proxy_auth` names others); what it prints never shows the password.
fn wire(
    path: &Path,
    listen: SocketAddr,
    dry_run: bool,
    auth: Option<&ProxyAuth>,
) -> anyhow::Result<()> {
    let desired = cursor::desired_settings_for(listen, auth);
    let plan = cursor::plan(path, &desired)?;
    println!("Cursor settings: {}", path.display());
    if !plan.changes() {
        println!(
            "Already wired to {}; nothing to change.",
            cursor::proxy_url(listen)
        );
        return Ok(());
    }
    if dry_run {
        print!("{}", cursor::masked(&plan.diff(), auth));
        println!("(dry run: nothing was written)");
        return Ok(());
    }
    if let Some(backup) = cursor::apply(&plan)? {
        println!("backup:  {}", backup.display());
    }
    for (key, value) in &desired {
        println!(
            "set      \"{key}\": {}",
            cursor::masked(&value.to_string(), auth)
        );
    }
    println!();
    println!("Restart Cursor (or run \"Developer: Reload Window\") so the proxy settings apply.");
    println!("Not done yet? Trust the CA once: `cursor-byok ca trust`. Check it all: `cursor-byok doctor`.");
    println!("Undo: `cursor-byok setup cursor --undo`.");
    if auth.is_some() {
        println!(
            "The proxy URL carries the listener's credentials (written only to this file, now \
             readable by you alone): other users on this machine cannot use the proxy."
        );
    }
    Ok(())
}

fn undo(path: &Path) -> anyhow::Result<()> {
    match cursor::undo(path)? {
        Undo::Restored { backup } => {
            println!("Restored {} from {}.", path.display(), backup.display());
        }
        Undo::RestoredSettings { backup, safety } => {
            println!(
                "{} was edited after wiring: put back only the proxy settings as {} had them;",
                path.display(),
                backup.display()
            );
            println!(
                "your other edits stay. The file as it was: {}",
                safety.display()
            );
        }
        Undo::Nothing { backup } => {
            println!(
                "{} already matches {}; nothing to undo.",
                path.display(),
                backup.display()
            );
        }
    }
    println!("Restart Cursor so the change applies.");
    Ok(())
}
