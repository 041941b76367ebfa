//! `cursor-byok doctor`: the set-up checklist, one `[ok]`/`[FAIL]` line per check with its fix.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::args::Args;
use crate::config::Config;
use crate::setup::doctor::{self, Check, Level};

pub fn run(
    args: &Args,
    cursor_settings: Option<&Path>,
    skip_providers: bool,
) -> anyhow::Result<()> {
    let mut report = Checklist::default();
    let mut config = load_config(args.config.as_deref(), &mut report)?;

    let data_dir: PathBuf = args.data_dir.clone().unwrap_or_else(|| config.data_dir());
    // The listener's credentials, as `run` uses them: the listener check sends them.
    config.use_install_secret(&data_dir)?;
    let (ca_check, ca) = doctor::check_ca(&data_dir);
    report.add(ca_check);

    let (listener, providers) = network_checks(&config, skip_providers)?;
    let listening = listener.first().is_some_and(|c| c.level == Level::Ok);
    report.extend(listener);
    report.extend(providers);
    report.add(doctor::check_cursor_settings(
        cursor_settings,
        config.listen,
        config.proxy_auth.as_ref(),
    ));
    report.add(doctor::check_wiring(
        doctor::cursor_http_proxy(cursor_settings).as_deref(),
        &crate::setup::cursor::proxy_url(config.listen),
        doctor::system_pac_url(&data_dir).as_deref(),
        listening,
        &super::service::held(config.listen),
    ));
    if let Some(ca) = &ca {
        report.extend(doctor::check_trust(ca));
    }
    report.finish()
}

/// The checklist so far; each check is printed as it is added.
#[derive(Default)]
struct Checklist {
    checks: Vec<Check>,
}

impl Checklist {
    fn add(&mut self, c: Check) {
        println!("{c}");
        self.checks.push(c);
    }

    fn extend(&mut self, checks: impl IntoIterator<Item = Check>) {
        for c in checks {
            self.add(c);
        }
    }

    /// The summary line; an error when any check failed.
    fn finish(self) -> anyhow::Result<()> {
        let checks = self.checks;
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
}

/// The config named by `--config`, or the embedded default; the other checks need it, so an
/// invalid one ends the run after its check.
fn load_config(path: Option<&Path>, report: &mut Checklist) -> anyhow::Result<Config> {
    let Some(path) = path else {
        let config = Config::embedded_default();
        report.add(config_ok("embedded default (no --config)", &config));
        return Ok(config);
    };
    match Config::load(path) {
        Ok(config) => {
            report.add(config_ok(&path.display().to_string(), &config));
            Ok(config)
        }
        Err(e) => {
            report.add(Check {
                level: Level::Fail,
                subject: "config".into(),
                detail: e.to_string(),
                fix: Some(format!(
                    "correct the key named, then `cursor-byok check-config {}`",
                    path.display()
                )),
            });
            anyhow::bail!("the config is invalid; the other checks need it");
        }
    }
}

/// The checks that talk to the network: the running proxy, then (unless skipped) each provider.
fn network_checks(
    config: &Config,
    skip_providers: bool,
) -> anyhow::Result<(Vec<Check>, Vec<Check>)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    Ok(runtime.block_on(async {
        let listener = doctor::check_running(config).await;
        let providers = if skip_providers {
            Vec::new()
        } else {
            doctor::check_providers(config).await
        };
        (listener, providers)
    }))
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
