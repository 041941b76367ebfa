//! Command-line interface: `run` (the default), `ca`, `check-config`.

mod ca;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(
    name = "cursor-byok",
    version,
    about = "Run Cursor's Agent on your own model provider and API key"
)]
pub struct Args {
    /// Config file (TOML). Without it, an embedded default is used: loopback listener, models
    /// from OPENAI_API_KEY / ANTHROPIC_API_KEY.
    #[arg(long, short, global = true, env = "CURSOR_BYOK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory (CA, caches); overrides the config's `data_dir`.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// More logging (-v debug, -vv trace); RUST_LOG takes precedence.
    #[arg(long, short, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (the default).
    Run,
    /// Create the CA if missing; print its path, fingerprint and how to trust it.
    Ca,
    /// Validate a config file (default: the one given with --config).
    CheckConfig { file: Option<PathBuf> },
}

/// `RUST_LOG`-style filtering; the default shows our info lines and others' warnings.
pub fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "cursor_byok=info,warn",
        1 => "cursor_byok=debug,info",
        _ => "cursor_byok=trace,debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Some(Command::CheckConfig { ref file }) => {
            let path = file
                .clone()
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
        Some(Command::Ca) => {
            let config = load_config(&args)?;
            ca::show(&data_dir(&args, &config))
        }
        Some(Command::Run) | None => {
            let config = load_config(&args)?;
            let dir = data_dir(&args, &config);
            run_proxy(config, dir)
        }
    }
}

fn load_config(args: &Args) -> anyhow::Result<Config> {
    Ok(match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    })
}

fn data_dir(args: &Args, config: &Config) -> PathBuf {
    args.data_dir.clone().unwrap_or_else(|| config.data_dir())
}

fn run_proxy(config: Config, data_dir: PathBuf) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (ca, _) = crate::tls::CertificateAuthority::load_or_create(&data_dir)?;
        let fingerprint = ca.fingerprint();
        let cert_path = ca.cert_path();
        let banner = banner(&config, &fingerprint, &cert_path);
        let server = crate::proxy::Server::builder(config, ca).bind().await?;
        eprintln!("{banner}");
        server.run_until_signal().await?;
        Ok(())
    })
}

/// What the user needs at start-up: where we listen, which CA, which models, how to wire Cursor.
fn banner(config: &Config, fingerprint: &str, cert: &std::path::Path) -> String {
    use std::fmt::Write;
    let mut b = String::new();
    let _ = writeln!(
        b,
        "cursor-byok {} listening on http://{}",
        env!("CARGO_PKG_VERSION"),
        config.listen
    );
    if let Some(addr) = config.direct.tls_listen {
        let _ = writeln!(b, "  direct TLS door:  https://{addr}");
    }
    if let Some(addr) = config.direct.http_listen {
        let _ = writeln!(b, "  direct HTTP door: http://{addr}");
    }
    let _ = writeln!(b, "  CA: {} (SHA-256 {fingerprint})", cert.display());
    let usable: Vec<_> = config.usable_models().collect();
    if usable.is_empty() {
        let _ = writeln!(
            b,
            "  warning: no model has an API key; set OPENAI_API_KEY / ANTHROPIC_API_KEY or a config file"
        );
    }
    for m in &usable {
        let _ = writeln!(
            b,
            "  model: {} -> {} ({})",
            m.display_name(),
            m.model,
            m.cursor_id()
        );
    }
    let _ = writeln!(
        b,
        "  Cursor settings: \"http.proxy\": \"http://{}\", \"http.proxySupport\": \"override\", \"cursor.general.disableHttp2\": true",
        config.listen
    );
    let _ = write!(b, "  trust the CA once: cursor-byok ca");
    b
}
