//! The command line's grammar: every argument, subcommand and option, with the help text
//! `--help` prints. The files beside it carry each command out.

use std::path::PathBuf;

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};

use crate::setup::service::DEFAULT_NAME as DEFAULT_SERVICE;

#[derive(Debug, Parser)]
#[command(
    name = "cursor-byok",
    version,
    about = "Run Cursor's Agent on your own model provider and API key"
)]
pub struct Args {
    /// Config file (TOML). Without it, an embedded default is used: loopback listener, models
    /// from OPENAI_API_KEY / ANTHROPIC_API_KEY / GEMINI_API_KEY / OPENROUTER_API_KEY /
    /// DEEPSEEK_API_KEY.
    #[arg(long, short, global = true, env = "CURSOR_BYOK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory (CA, caches); overrides the config's `data_dir`.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// More logging (-v debug, -vv trace); RUST_LOG takes precedence.
    #[arg(long, short, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Options of `run`.
#[derive(Debug, Default, clap::Args)]
pub struct RunArgs {
    /// Record a redacted trace of the agent traffic into FILE, to attach to a bug report:
    /// message types, field numbers and sizes, what this version does not know, the Cursor
    /// version, timings. No file contents, prompts, keys, tokens or paths.
    #[arg(long, value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// Stop recording after this many minutes.
    #[arg(long, value_name = "N", requires = "capture")]
    pub(crate) capture_minutes: Option<u64>,
    /// Also record each message's decoded content (prompts, file contents…; keys and
    /// credentials are still masked). Only for your own debugging: do not share such a capture.
    #[arg(long, requires = "capture")]
    pub include_content: bool,
    /// Read NAME=value lines into the environment first (the API keys of `service install`);
    /// its values win over variables already set.
    #[arg(long, value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// Log to FILE (rotated at 4 MiB to FILE.1, no colour) instead of standard error.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (the default).
    Run(RunArgs),
    /// Create the CA if missing; print its path, fingerprint and how to trust it.
    Ca {
        #[command(subcommand)]
        action: Option<CaAction>,
    },
    /// Validate a config file (default: the one given with --config).
    CheckConfig { file: Option<PathBuf> },
    /// Wire an application to the proxy (`setup cursor`), or the OS (`setup system-proxy`).
    Setup {
        #[command(subcommand)]
        target: SetupTarget,
    },
    /// Check the whole set-up: config, CA, listener, providers, Cursor's settings, OS trust.
    Doctor {
        /// Cursor's settings.json (default: the per-OS location).
        #[arg(long, value_name = "FILE")]
        cursor_settings: Option<PathBuf>,
        /// Do not send the one small request per provider.
        #[arg(long)]
        skip_providers: bool,
    },
    /// List the configured models with the ids Cursor sees.
    Models,
    /// Runs, tokens in/out, cache-read share and cost per model, from the usage record in the
    /// data directory (every finished run since it was started, across restarts).
    Usage,
    /// Run the proxy as a per-user service that starts at login (`install`, `uninstall`,
    /// `status`, `logs`).
    Service {
        #[command(subcommand)]
        action: ServiceAction,
    },
    /// What the status page shows: whether the proxy runs, active runs, today's cost per model,
    /// the last errors.
    Status {
        /// One JSON object, for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum CaAction {
    /// Print the exact commands that make this OS (and Cursor) trust the CA; --apply runs them
    /// where a user may.
    Trust {
        /// Run the commands for this machine (keychain / user store / NSS database; the Linux
        /// system store only as root).
        #[arg(long)]
        apply: bool,
    },
    /// Write the CA certificate (never the key) as PEM or DER.
    Export {
        #[arg(long, value_enum, default_value_t = CertFormat::Pem)]
        format: CertFormat,
        /// File to write; standard output when omitted.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Print the commands that remove the CA from the OS and NSS stores.
    Untrust,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CertFormat {
    Pem,
    Der,
}

#[derive(Debug, Subcommand)]
pub enum SetupTarget {
    /// Point Cursor at the proxy: sets http.proxy, http.proxySupport,
    /// cursor.general.disableHttp2 (and keeps certificate checks on) in its user settings.json,
    /// keeping comments and formatting; a timestamped backup is written first.
    Cursor(CursorArgs),
    /// Point the OS's automatic proxy configuration at a PAC script that sends only Cursor's
    /// hosts to the proxy: its agent hosts with no fallback (they fail while the proxy is
    /// down), its others DIRECT when it is not running (macOS networksetup, GNOME/KDE,
    /// Windows Internet Settings); prints each command first.
    SystemProxy(SystemProxyArgs),
}

#[derive(Debug, ClapArgs)]
pub struct CursorArgs {
    /// Cursor's settings.json (default: the per-OS location of Cursor's user settings).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// Restore the settings as they were before cursor-byok changed them.
    #[arg(long, conflicts_with = "dry_run")]
    pub undo: bool,
    /// Show what would change (a diff) without writing anything.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    /// Install and start the per-user service: starts at login, restarts on failure, same
    /// binary, config and data directory as this command; API keys go to an env file (0600).
    Install {
        /// Print the files and commands without writing or running anything.
        #[arg(long)]
        dry_run: bool,
        /// The service's name (for a second instance).
        #[arg(long, default_value = DEFAULT_SERVICE, hide = true)]
        name: String,
    },
    /// Stop the service and remove exactly the files `install` wrote.
    Uninstall {
        #[arg(long, default_value = DEFAULT_SERVICE, hide = true)]
        name: String,
    },
    /// Whether it runs, since when, on which port, and the last error from its log.
    Status {
        #[arg(long, default_value = DEFAULT_SERVICE, hide = true)]
        name: String,
    },
    /// The tail of the service's log file.
    Logs {
        /// How many lines.
        #[arg(long, short = 'n', default_value_t = 50)]
        lines: usize,
    },
}

#[derive(Debug, ClapArgs)]
pub struct SystemProxyArgs {
    /// Put back the values `setup system-proxy` found.
    #[arg(long, conflicts_with = "dry_run")]
    pub undo: bool,
    /// Print the commands (reading the current values only) without changing anything.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Point the OS at the copy in the data directory (`file://`) instead of the proxy's own
    /// URL; only some OS proxy stacks accept file URLs.
    #[arg(long)]
    pub file_url: bool,
    /// Replace a proxy configuration the OS already has (a company's PAC or manual proxy);
    /// without it, setup stops and explains. `--undo` puts it back.
    #[arg(long)]
    pub(crate) replace_existing: bool,
    /// Apply it without the login service holding the proxy's socket (Linux, macOS): while
    /// the proxy is down, a Cursor that starts gets no script and goes DIRECT everywhere, a
    /// chat on your own model included. Without it, setup stops and explains.
    #[arg(long)]
    pub(crate) accept_direct_fallback: bool,
}
