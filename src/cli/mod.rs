//! Command-line interface: `run` (the default), `ca` (+ `trust`, `export`, `untrust`),
//! `check-config`, `setup cursor`, `setup system-proxy`, `service`, `doctor`, `models`, `usage`,
//! `status`.

mod args;
mod ca;
mod doctor;
mod models;
mod service;
mod setup;
mod status;
mod system_proxy;
mod usage;

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;

use crate::config::Config;

pub use args::{Args, Command, RunArgs};

/// Logging for these arguments: to the rotated `--log-file` of `run` (no colour), else to
/// standard error. `Err` when the log file cannot be opened.
pub fn init_logging(args: &Args) -> anyhow::Result<()> {
    let file = match &args.command {
        Some(Command::Run(RunArgs {
            log_file: Some(path),
            ..
        })) => path,
        _ => {
            init_tracing(args.verbose);
            return Ok(());
        }
    };
    let log = crate::setup::logfile::RotatingLog::open(file, crate::setup::service::MAX_LOG_BYTES)
        .with_context(|| format!("cannot open the log file {}", file.display()))?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(args.verbose))
        .with_writer(log)
        .with_ansi(false)
        .try_init();
    Ok(())
}

fn filter(verbose: u8) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "cursor_byok=info,warn",
        1 => "cursor_byok=debug,info",
        _ => "cursor_byok=trace,debug",
    };
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// `RUST_LOG`-style filtering; the default shows our info lines and others' warnings.
pub(crate) fn init_tracing(verbose: u8) {
    let filter = filter(verbose);
    let colour = colour_logs(
        std::env::var_os("NO_COLOR").as_deref(),
        std::io::stderr().is_terminal(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
}

/// Colour codes only for a person at a terminal: a file, a pipe or a service manager's log
/// gets plain text, and a non-empty `NO_COLOR` turns colour off everywhere (no-color.org).
fn colour_logs(no_color: Option<&OsStr>, stderr_is_terminal: bool) -> bool {
    let opted_out = no_color.is_some_and(|v| !v.is_empty());
    stderr_is_terminal && !opted_out
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    match args.command.take() {
        Some(Command::CheckConfig { file }) => {
            let path = file
                .or_else(|| args.config.clone())
                .context("no config file: pass one (`check-config FILE`) or --config")?;
            let config = Config::load(&path)?;
            println!(
                "{}: OK ({} provider(s), {} model(s): {})",
                path.display(),
                config.providers.len(),
                config.models.len(),
                config
                    .models
                    .iter()
                    .map(|m| m.cursor_id())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ok(())
        }
        Some(Command::Ca { action }) => {
            let config = load_config(&args)?;
            ca::run(&data_dir(&args, &config), action)
        }
        Some(Command::Setup { target }) => {
            let config = load_config(&args)?;
            setup::run(target, &config, &data_dir(&args, &config))
        }
        Some(Command::Service { action }) => {
            let config = load_config(&args)?;
            service::run(&args, &config, action)
        }
        Some(Command::Status { json }) => {
            let config = load_config(&args)?;
            status::run(&config, &data_dir(&args, &config), json)
        }
        Some(Command::Doctor {
            cursor_settings,
            skip_providers,
        }) => doctor::run(&args, cursor_settings.as_deref(), skip_providers),
        Some(Command::Models) => {
            let config = load_config(&args)?;
            models::run(&config);
            Ok(())
        }
        Some(Command::Usage) => {
            let config = load_config(&args)?;
            usage::run(&data_dir(&args, &config))
        }
        Some(Command::Run(run)) => {
            if let Some(path) = &run.env_file {
                load_env_file(path)?;
            }
            let result = load_config(&args).and_then(|config| {
                let dir = data_dir(&args, &config);
                run_proxy(config, dir, &run)
            });
            // Under a service the log file is where the user looks, not standard error.
            if let (Err(e), Some(_)) = (&result, &run.log_file) {
                tracing::error!("cursor-byok stopped: {e:#}");
            }
            result
        }
        None => {
            let config = load_config(&args)?;
            let dir = data_dir(&args, &config);
            run_proxy(config, dir, &RunArgs::default())
        }
    }
}

/// Set the variables of an env file, over any value the process inherited: the file is the
/// one `service install` wrote for this service, and a stale key left in the login manager's
/// environment (`systemctl --user set-environment`, `launchctl setenv`) must not win over it.
/// Called before the runtime starts, while this is the only thread, so changing the
/// environment is sound.
fn load_env_file(path: &std::path::Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the env file {}", path.display()))?;
    let vars = crate::setup::service::parse_env_file(&text)
        .map_err(|e| anyhow::anyhow!("the env file {}: {e}", path.display()))?;
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    Ok(())
}

/// The config, with the listener's credentials: the per-install secret (made on first use)
/// unless `proxy_auth` or `open_listener` says otherwise.
fn load_config(args: &Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    };
    let dir = data_dir(args, &config);
    config.use_install_secret(&dir)?;
    Ok(config)
}

fn data_dir(args: &Args, config: &Config) -> PathBuf {
    args.data_dir.clone().unwrap_or_else(|| config.data_dir())
}

fn run_proxy(config: Config, data_dir: PathBuf, run: &RunArgs) -> anyhow::Result<()> {
    // Taken while this is the only thread: the take clears LISTEN_* from the environment.
    let held = crate::base::activation::take_listener()
        .context("cannot serve on the socket the service manager holds")?;
    let capture = match &run.capture {
        Some(path) => {
            let c = crate::capture::Capture::create(path, run.capture_minutes, run.include_content)
                .with_context(|| format!("cannot create the capture file {}", path.display()))?;
            eprintln!(
                "recording a{} capture of the agent traffic into {}",
                if run.include_content {
                    " full (prompts and file contents included, keys masked)"
                } else {
                    " redacted"
                },
                path.display()
            );
            Some(c)
        }
        None => None,
    };
    if let Some((before, after)) = crate::base::process::raise_open_files_limit() {
        if after > before {
            tracing::info!(
                before,
                after,
                "raised the open-files limit to the hard limit"
            );
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let log_to_file = run.log_file.is_some();
    runtime.block_on(async move {
        tokio::spawn(give_back_memory());
        let (ca, _) = crate::tls::CertificateAuthority::load_or_create(&data_dir)?;
        let fingerprint = ca.fingerprint();
        let cert_path = ca.cert_path();
        // Checked before the CA moves into the server; they only feed warnings.
        let mut warnings = crate::setup::doctor::check_trust(&ca);
        let mut builder = crate::proxy::Server::builder(config.clone(), ca)
            .status(crate::status::Status::with_capture(capture));
        if let Some(listener) = held {
            builder = builder.listener(listener);
        }
        let server = builder.bind().await?;
        warnings.push(crate::setup::doctor::check_cursor_settings(
            None,
            server.proxy_addr(),
            config.proxy_auth.as_ref(),
        ));
        // The copy the OS can read when the proxy is down (`setup system-proxy --file-url`).
        if let Err(e) =
            crate::setup::pac::write_file(&data_dir, server.proxy_addr(), &config.intercept)
        {
            tracing::warn!(dir = %data_dir.display(), "cannot write the PAC script: {e}");
        }
        let banner = banner(
            &config,
            server.proxy_addr(),
            &fingerprint,
            &cert_path,
            &warnings,
        );
        if log_to_file {
            tracing::info!("{banner}");
        } else {
            eprintln!("{banner}");
        }
        server.run_until_signal().await?;
        Ok(())
    })
}

/// How often memory a burst freed goes back to the OS. A trim walks the free memory only:
/// next to nothing for an idle heap, about 0.2 s after a 256 MiB burst (`tests/memory.rs`),
/// on a blocking thread.
const MEMORY_TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Gives the allocator's free memory back to the OS every [`MEMORY_TRIM_EVERY`], for as long
/// as the runtime lives, off the runtime's worker threads.
async fn give_back_memory() {
    if !crate::base::process::give_back_memory() {
        return;
    }
    let mut every = tokio::time::interval(MEMORY_TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        let _ = tokio::task::spawn_blocking(crate::base::process::give_back_memory).await;
    }
}

/// What the user needs at start-up: where we listen, which CA, which models, how to wire
/// Cursor, and a warning with its fix for anything not set up yet.
fn banner(
    config: &Config,
    listen: std::net::SocketAddr,
    fingerprint: &str,
    cert: &std::path::Path,
    checks: &[crate::setup::doctor::Check],
) -> String {
    use crate::setup::cursor::proxy_url;
    use std::fmt::Write;
    let url = proxy_url(listen);
    let mut b = String::new();
    let _ = writeln!(
        b,
        "cursor-byok {} listening on http://{listen}",
        env!("CARGO_PKG_VERSION"),
    );
    let _ = writeln!(b, "  status page:      {url}{}", crate::status::PAGE_PATH);
    if let Some(addr) = config.direct.tls_listen {
        let _ = writeln!(b, "  direct TLS door:  https://{addr}");
    }
    if let Some(addr) = config.direct.http_listen {
        let _ = writeln!(b, "  direct HTTP door: http://{addr}");
    }
    let _ = writeln!(b, "  CA: {} (SHA-256 {fingerprint})", cert.display());
    for m in &config.models {
        let _ = writeln!(b, "{}", model_line(config, m));
    }
    let wired = crate::setup::cursor::masked(
        &crate::setup::cursor::wired_proxy_url(listen, config.proxy_auth.as_ref()),
        config.proxy_auth.as_ref(),
    );
    let _ = writeln!(
        b,
        "  Cursor settings: \"http.proxy\": \"{wired}\", \"http.proxySupport\": \"override\", \"cursor.general.disableHttp2\": true   (`cursor-byok setup cursor` writes them)"
    );
    let _ = writeln!(b, "  {}", who_may_connect(config));
    for w in banner_warnings(config, listen, checks) {
        let _ = writeln!(b, "  warning: {w}");
    }
    let _ = write!(
        b,
        "  one summary line per finished run follows; `cursor-byok doctor` checks the whole set-up"
    );
    b
}

/// Who the listener and the direct doors take, said plainly.
fn who_may_connect(config: &Config) -> String {
    let listener = match (&config.proxy_auth, config.open_listener) {
        (Some(a), _) if a.username == crate::config::install_secret::USERNAME => format!(
            "listener: only clients with the per-install secret ({} in the data directory; \
             `setup cursor` puts it in Cursor's \"http.proxy\")",
            crate::config::install_secret::FILE
        ),
        (Some(_), _) => "listener: only clients with the [proxy_auth] credentials".to_string(),
        (None, _) => "listener: OPEN to every local user (open_listener = true): any process \
                      on this machine can use your models and keys through it"
            .to_string(),
    };
    let doors = config.direct.tls_listen.is_some() || config.direct.http_listen.is_some();
    if doors && config.direct.token.is_none() && !config.direct.exposed() {
        format!(
            "{listener}; direct doors: OPEN to every local user (set [direct] token to close \
             them)"
        )
    } else {
        listener
    }
}

/// One configured model, and whether its key is set.
fn model_line(config: &Config, m: &crate::config::ModelConfig) -> String {
    let provider = config.providers.get(&m.provider);
    let usable = provider.is_some_and(|p| p.resolve_api_key().is_some());
    // Names the variable, never its value: the user sees which key to set.
    let var = provider.and_then(|p| p.api_key_env.as_deref());
    let note = match (usable, var) {
        (true, Some(var)) => format!("  [${var} set]"),
        (true, None) => String::new(),
        (false, Some(var)) => format!("  [hidden: ${var} not set]"),
        (false, None) => "  [hidden: no API key]".to_string(),
    };
    format!(
        "  model: {} -> {}/{} ({}){note}",
        m.display_name(),
        m.provider,
        m.model,
        m.cursor_id()
    )
}

/// Each problem with its fix: no usable model, an open listener, and the failed checks.
fn banner_warnings(
    config: &Config,
    listen: std::net::SocketAddr,
    checks: &[crate::setup::doctor::Check],
) -> Vec<String> {
    use crate::setup::doctor::Level;
    let mut warnings = Vec::new();
    if config.usable_models().next().is_none() {
        let vars: Vec<String> = config
            .providers
            .values()
            .filter_map(|p| p.api_key_env.clone())
            .collect();
        warnings.push(format!(
            "no model has an API key, so Cursor shows none of yours: set {} (or use --config)",
            if vars.is_empty() {
                "a provider key".to_string()
            } else {
                vars.join(" / ")
            }
        ));
    }
    if !listen.ip().is_loopback() && config.proxy_auth.is_none() {
        warnings.push(format!(
            "listening on {listen}, reachable from other machines, without proxy_auth: bind \
             127.0.0.1 or set [proxy_auth]"
        ));
    }
    for c in checks.iter().filter(|c| c.level == Level::Fail) {
        warnings.push(match &c.fix {
            Some(fix) => format!("{}: {}; fix: {fix}", c.subject, c.detail),
            None => format!("{}: {}", c.subject, c.detail),
        });
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(colour_logs(None, true));
        assert!(!colour_logs(None, false));
        assert!(!colour_logs(Some(OsStr::new("1")), true));
        assert!(!colour_logs(Some(OsStr::new("1")), false));
        // An empty NO_COLOR does not count (no-color.org).
        assert!(colour_logs(Some(OsStr::new("")), true));
    }

    /// The service's env file wins over a stale value the process inherited.
    #[test]
    fn the_env_file_wins_over_the_inherited_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k.env");
        std::fs::write(&path, "CURSOR_BYOK_TEST_ENV_WINS=fresh\n").expect("write");
        std::env::set_var("CURSOR_BYOK_TEST_ENV_WINS", "stale");
        load_env_file(&path).expect("loads");
        assert_eq!(
            std::env::var("CURSOR_BYOK_TEST_ENV_WINS").as_deref(),
            Ok("fresh")
        );
    }

    #[test]
    fn the_banner_says_who_may_connect() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::from_toml("", "t").expect("config");
        assert!(config.use_install_secret(dir.path()).expect("secret"));
        let secret = config
            .proxy_auth
            .as_ref()
            .expect("auth")
            .password
            .expose()
            .to_string();
        let line = who_may_connect(&config);
        assert!(
            line.contains("only clients with the per-install secret"),
            "{line}"
        );
        let listen = "127.0.0.1:8787".parse().expect("addr");
        let text = banner(&config, listen, "FP", dir.path(), &[]);
        assert!(!text.contains(&secret), "{text}");
        assert!(
            text.contains("http://cursor-byok:<secret>@127.0.0.1:8787"),
            "{text}"
        );

        let mut open = Config::from_toml("open_listener = true\n", "t").expect("config");
        assert!(!open.use_install_secret(dir.path()).expect("no secret"));
        assert!(open.proxy_auth.is_none());
        assert!(who_may_connect(&open).contains("OPEN to every local user"));

        let doors = "open_listener = true\n[direct]\nhttp_listen = \"127.0.0.1:0\"\n";
        let doors = Config::from_toml(doors, "t").expect("config");
        assert!(who_may_connect(&doors).contains("direct doors: OPEN"));
    }
}
