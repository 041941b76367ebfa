//! `cursor-byok doctor`: the set-up checklist, one `[ok]`/`[FAIL]` line per check with its fix.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::Args;
use crate::config::Config;
use crate::setup::doctor::{self, Check, Level};

pub fn run(
    args: &Args,
    cursor_settings: Option<&Path>,
    skip_providers: bool,
) -> anyhow::Result<()> {
    let mut checks: Vec<Check> = Vec::new();
    let report = |c: Check, checks: &mut Vec<Check>| {
        println!("{c}");
        checks.push(c);
    };

    let config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(config) => {
                report(config_ok(&path.display().to_string(), &config), &mut checks);
                config
            }
            Err(e) => {
                report(
                    Check {
                        level: Level::Fail,
                        subject: "config".into(),
                        detail: e.to_string(),
                        fix: Some(format!(
                            "correct the key named, then `cursor-byok check-config {}`",
                            path.display()
                        )),
                    },
                    &mut checks,
                );
                anyhow::bail!("the config is invalid; the other checks need it");
            }
        },
        None => {
            let config = Config::embedded_default();
            report(
                config_ok("embedded default (no --config)", &config),
                &mut checks,
            );
            config
        }
    };

    let data_dir: PathBuf = args.data_dir.clone().unwrap_or_else(|| config.data_dir());
    let (ca_check, ca) = doctor::check_ca(&data_dir);
    report(ca_check, &mut checks);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (listener, providers) = runtime.block_on(async {
        let listener = doctor::check_running(&config).await;
        let providers = if skip_providers {
            Vec::new()
        } else {
            doctor::check_providers(&config).await
        };
        (listener, providers)
    });
    let listening = listener.first().is_some_and(|c| c.level == Level::Ok);
    for c in listener {
        report(c, &mut checks);
    }
    for c in providers {
        report(c, &mut checks);
    }
    report(
        doctor::check_cursor_settings(cursor_settings, config.listen),
        &mut checks,
    );
    report(
        doctor::check_wiring(
            doctor::cursor_http_proxy(cursor_settings).as_deref(),
            &crate::setup::cursor::proxy_url(config.listen),
            doctor::system_pac_url(&data_dir).as_deref(),
            listening,
        ),
        &mut checks,
    );
    if let Some(ca) = &ca {
        for c in doctor::check_trust(ca) {
            report(c, &mut checks);
        }
    }

    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    println!();
    if failed == 0 {
        println!("All {} checks passed.", checks.len());
        Ok(())
    } else {
        anyhow::bail!(
            "{failed} of {} checks failed; each [FAIL] line says how to fix it",
            checks.len()
        )
    }
}

fn config_ok(origin: &str, config: &Config) -> Check {
    Check {
        level: Level::Ok,
        subject: "config".into(),
        detail: format!(
            "{origin}: {} provider(s), {} model(s), listening on {}",
            config.providers.len(),
            config.models.len(),
            config.listen
        ),
        fix: None,
    }
}
