//! `cursor-byok doctor`: one check per thing that must hold for a working set-up, each failure
//! with the fix. The same checks feed the start-up banner's warnings.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::cursor;
use super::os::Os;
use super::service::Held;
use super::trust::{self, CaFiles};
use crate::config::{Config, ModelConfig, ProviderConfig};
use crate::provider::{
    Message, ProviderClient, ProviderError, ProviderErrorKind, ProviderEvent, ProviderRequest,
    ProviderSettings, RequestOptions, RetryPolicy,
};
use crate::status::{StatusSnapshot, SNAPSHOT_PATH};
use crate::tls::CertificateAuthority;

/// A probe gets this long in all (connect, first byte, the few tokens).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Enough for every API's minimum (OpenAI Responses refuses fewer than 16), still negligible.
const PROBE_MAX_TOKENS: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
    /// Could not be checked here.
    Skip,
}

/// One line of the checklist.
#[derive(Debug, Clone)]
pub struct Check {
    pub level: Level,
    /// What was checked, e.g. "provider `openai`".
    pub subject: String,
    /// What was found.
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    fn new(level: Level, subject: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            level,
            subject: subject.into(),
            detail: detail.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.level {
            Level::Ok => "[ok]  ",
            Level::Warn => "[warn]",
            Level::Fail => "[FAIL]",
            Level::Skip => "[skip]",
        };
        write!(f, "{tag} {}: {}", self.subject, self.detail)?;
        // The fix stays on the failing line, so a grep or a screenshot keeps both together.
        if let Some(fix) = &self.fix {
            write!(f, " -> fix: {fix}")?;
        }
        Ok(())
    }
}

/// The CA in `data_dir`, checked without creating it.
pub fn check_ca(data_dir: &Path) -> (Check, Option<CertificateAuthority>) {
    let subject = "CA";
    // File names as written by `tls::ca` (the tests pin them too).
    let (cert, key) = (data_dir.join("ca.pem"), data_dir.join("ca.key.pem"));
    if !cert.exists() || !key.exists() {
        let check = Check::new(
            Level::Fail,
            subject,
            format!("no CA in {}", data_dir.display()),
        )
        .fix("run `cursor-byok ca` to create it, then `cursor-byok ca trust`");
        return (check, None);
    }
    match CertificateAuthority::load_or_create(data_dir) {
        Ok((ca, _)) => {
            let check = Check::new(
                Level::Ok,
                subject,
                format!(
                    "{} (SHA-256 {}), key readable by you only",
                    ca.cert_path().display(),
                    ca.fingerprint()
                ),
            );
            (check, Some(ca))
        }
        Err(e) => {
            let fix = if e.to_string().contains("chmod") {
                format!("chmod 600 \"{}\"", key.display())
            } else {
                format!(
                    "move {} aside and run `cursor-byok ca` for a new CA (then trust it again)",
                    data_dir.display()
                )
            };
            (
                Check::new(Level::Fail, subject, e.to_string()).fix(fix),
                None,
            )
        }
    }
}

/// Is the proxy running on `listen`, is it us, and has Cursor sent it anything this build does
/// not know (from the running proxy's status snapshot)?
pub async fn check_running(config: &Config) -> Vec<Check> {
    let (check, snapshot) = check_listener(config).await;
    let mut checks = vec![check];
    checks.extend(snapshot.as_ref().and_then(check_unknown));
    checks
}

/// The running proxy's report of what Cursor sent that this build does not know.
pub(crate) fn check_unknown(s: &StatusSnapshot) -> Option<Check> {
    let u = &s.unknown;
    if u.items.is_empty() {
        return None;
    }
    let list: Vec<String> = u
        .items
        .iter()
        .take(10)
        .map(|i| format!("{} {} (in {}, {}×)", i.kind, i.key, i.at, i.count))
        .collect();
    let more = u.items.len().saturating_sub(list.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Some(
        Check::new(
            Level::Warn,
            "Cursor schema",
            format!(
                "{} (cursor-byok {}): {}{more}",
                u.summary,
                s.version,
                list.join("; ")
            ),
        )
        .fix(u.advice.clone()),
    )
}

/// Is the proxy running on `listen`, and is it us? Its status snapshot when it is.
pub async fn check_listener(config: &Config) -> (Check, Option<StatusSnapshot>) {
    let base = cursor::proxy_url(config.listen);
    let subject = "listener";
    let client = match reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            let check = Check::new(Level::Skip, subject, format!("cannot check: {e}"));
            return (check, None);
        }
    };
    let mut req = client.get(format!("{base}{SNAPSHOT_PATH}"));
    if let Some(auth) = &config.proxy_auth {
        req = req.basic_auth(&auth.username, Some(auth.password.expose()));
    }
    let check = match req.send().await {
        Ok(resp) if resp.status().is_success() => match resp.json::<StatusSnapshot>().await {
            Ok(s) if s.service == "cursor-byok" => {
                let check = Check::new(
                    Level::Ok,
                    subject,
                    format!(
                        "cursor-byok {} answers on {base} (up {}s, {} active run(s), status page \
                         {base}/__cursor-byok/status)",
                        s.version,
                        s.uptime_secs,
                        s.active.len()
                    ),
                );
                return (check, Some(s));
            }
            _ => other_program(subject, &base),
        },
        Ok(resp) => other_program(subject, &base).detail_suffix(&format!("HTTP {}", resp.status())),
        Err(e) if e.is_connect() => {
            Check::new(Level::Fail, subject, format!("nothing answers on {base}")).fix(
                "start the proxy: `cursor-byok service install` (starts it at login), or run \
                     `cursor-byok` with the same --config",
            )
        }
        Err(e) => Check::new(
            Level::Fail,
            subject,
            format!("{base} did not answer: {}", e.without_url()),
        )
        .fix("restart the proxy; if it persists, run it with -v and look at its log"),
    };
    (check, None)
}

fn other_program(subject: &str, base: &str) -> Check {
    Check::new(
        Level::Fail,
        subject,
        format!("something other than cursor-byok answers on {base}"),
    )
    .fix("stop that program, or set `listen` to a free port (then re-run `cursor-byok setup cursor`)")
}

impl Check {
    fn detail_suffix(mut self, s: &str) -> Check {
        self.detail = format!("{} ({s})", self.detail);
        self
    }
}

/// Provider settings from the config ([`ProviderConfig::settings`], as the agent's), with no
/// retries so a probe fails fast. `None` when the provider has no key.
pub(crate) fn probe_settings(
    name: &str,
    p: &ProviderConfig,
    config: &Config,
) -> Option<ProviderSettings> {
    let mut s = p.settings(name.to_string(), config.upstream.connect_timeout())?;
    s.idle_timeout = PROBE_TIMEOUT;
    s.retry = RetryPolicy {
        max_retries: 0,
        ..RetryPolicy::default()
    };
    Some(s)
}

/// One check per provider: a minimal streamed request to its first model, with the latency to
/// the first event.
pub async fn check_providers(config: &Config) -> Vec<Check> {
    let mut checks = Vec::new();
    for (name, p) in &config.providers {
        checks.push(check_provider(name, p, config).await);
    }
    if config.usable_models().next().is_none() {
        checks.push(
            Check::new(Level::Fail, "models", "no configured model has an API key")
                .fix("set the key variable of at least one provider (see the lines above)"),
        );
    }
    checks
}

async fn check_provider(name: &str, p: &ProviderConfig, config: &Config) -> Check {
    let base = p.base_url().to_string();
    let model = config.models.iter().find(|m| m.provider == name);
    let subject = format!(
        "provider `{name}` ({}, {base}{})",
        p.kind,
        model
            .map(|m| format!(", model {}", m.model))
            .unwrap_or_default()
    );
    let key_hint = match (&p.api_key_env, &p.api_key) {
        (Some(var), _) => format!("${var}"),
        (None, Some(_)) => format!("`api_key` of [providers.{name}]"),
        (None, None) => format!("[providers.{name}]"),
    };
    let Some(settings) = probe_settings(name, p, config) else {
        let level = if model.is_some() {
            Level::Warn
        } else {
            Level::Skip
        };
        return Check::new(level, subject, "no API key, so its models are hidden")
            .fix(format!("set {key_hint} to use it"));
    };
    let Some(model) = model else {
        return Check::new(Level::Skip, subject, "no model uses it; not probed");
    };
    let client = match ProviderClient::new(settings) {
        Ok(c) => c,
        Err(e) => {
            return Check::new(Level::Fail, subject, e.to_string())
                .fix(format!("correct [providers.{name}] in the config"))
        }
    };
    let started = Instant::now();
    match probe(&client, &model.model, started).await {
        Probe::TimedOut => Check::new(
            Level::Fail,
            subject,
            format!("no complete answer within {}s", PROBE_TIMEOUT.as_secs()),
        )
        .fix(format!(
            "check providers.{name}.base_url and your network (behind a corporate proxy, set \
             HTTPS_PROXY for cursor-byok)"
        )),
        Probe::Failed(e) => {
            let fix = probe_failure_fix(&e.kind, name, p, model, &key_hint);
            Check::new(Level::Fail, subject, e.to_string()).fix(fix)
        }
        Probe::Answered { first } => {
            let ms = first.unwrap_or_else(|| started.elapsed()).as_millis();
            Check::new(
                Level::Ok,
                subject,
                format!(
                    "answered in {ms} ms (first byte), {} ms in all",
                    started.elapsed().as_millis()
                ),
            )
        }
    }
}

/// How a probe call ended.
enum Probe {
    /// No complete answer within `PROBE_TIMEOUT`.
    TimedOut,
    /// The stream reported this error.
    Failed(ProviderError),
    /// The stream ended cleanly; `first` is when its first event arrived, counted from `started`.
    Answered { first: Option<Duration> },
}

/// Asks `model` for a one-word answer and waits for the whole stream.
async fn probe(client: &ProviderClient, model: &str, started: Instant) -> Probe {
    let req = ProviderRequest {
        model: model.to_string(),
        messages: vec![Message::user_text("Reply with the single word: ok")],
        options: RequestOptions {
            max_output_tokens: Some(PROBE_MAX_TOKENS),
            ..RequestOptions::default()
        },
        ..ProviderRequest::default()
    };
    let mut stream = client.stream(req, CancellationToken::new());
    let mut first: Option<Duration> = None;
    let mut failure = None;
    let outcome = tokio::time::timeout(PROBE_TIMEOUT, async {
        while let Some(event) = stream.recv().await {
            first.get_or_insert_with(|| started.elapsed());
            if let ProviderEvent::Error(e) = event {
                failure = Some(e);
            }
        }
    })
    .await;
    match (outcome, failure) {
        (Err(_), _) => Probe::TimedOut,
        (Ok(()), Some(e)) => Probe::Failed(e),
        (Ok(()), None) => Probe::Answered { first },
    }
}

/// The fix for a failed probe, by what kind of failure it was.
fn probe_failure_fix(
    kind: &ProviderErrorKind,
    name: &str,
    p: &ProviderConfig,
    model: &ModelConfig,
    key_hint: &str,
) -> String {
    match kind {
        ProviderErrorKind::Auth => format!(
            "put a valid API key for this endpoint in {key_hint} (it is sent as {})",
            match p.auth() {
                crate::provider::AuthMode::Bearer => "Authorization: Bearer",
                crate::provider::AuthMode::ApiKey => "api-key",
                crate::provider::AuthMode::XApiKey => "x-api-key",
                crate::provider::AuthMode::XGoogApiKey => "x-goog-api-key",
            }
        ),
        ProviderErrorKind::NotFound => format!(
            "check `model = \"{}\"` (model `{}`) and providers.{name}.base_url",
            model.model, model.id
        ),
        ProviderErrorKind::RateLimited { .. } => {
            "wait, or check the plan and quota of this key".into()
        }
        ProviderErrorKind::Network | ProviderErrorKind::Timeout => format!(
            "check providers.{name}.base_url and your network (behind a corporate proxy, \
             set HTTPS_PROXY for cursor-byok)"
        ),
        ProviderErrorKind::InvalidRequest => format!(
            "the endpoint refused a minimal request: check providers.{name}.kind and \
             model `{}`",
            model.id
        ),
        ProviderErrorKind::Config => format!("correct [providers.{name}] in the config"),
        _ => "try again later; if it persists, check the provider's status page".into(),
    }
}

/// The subject of every Cursor settings check.
const CURSOR_SETTINGS: &str = "Cursor settings";

/// Does Cursor's settings file carry the wiring for `listen`?
/// (`http.proxy` carrying `auth`, the listener's credentials, which no message shows).
pub fn check_cursor_settings(
    path: Option<&Path>,
    listen: SocketAddr,
    auth: Option<&crate::config::ProxyAuth>,
) -> Check {
    let subject = CURSOR_SETTINGS;
    // The command that fixes it names the same file the check read.
    let setup = match path {
        Some(p) => format!("cursor-byok setup cursor --settings \"{}\"", p.display()),
        None => "cursor-byok setup cursor".to_string(),
    };
    let (path, text) = match read_cursor_settings(path, &setup) {
        Ok(found) => found,
        Err(check) => return check,
    };
    match cursor::mismatches(&text, &cursor::desired_settings_for(listen, auth)) {
        Ok(m) if m.is_empty() => check_remote_route(&path, &text, listen),
        Ok(m) => {
            let what: Vec<String> = m
                .iter()
                .map(|m| match &m.have {
                    Some(v) => format!("{} is {v}, needs {}", m.key, m.want),
                    None => format!("{} is not set", m.key),
                })
                .map(|line| cursor::masked(&line, auth))
                .collect();
            Check::new(
                Level::Fail,
                subject,
                format!("{}: {}", path.display(), what.join("; ")),
            )
            .fix(format!(
                "run `{setup}` (with the same --config), then restart Cursor"
            ))
        }
        Err(e) => Check::new(
            Level::Fail,
            subject,
            format!("{} does not parse: {e}", path.display()),
        )
        .fix("fix the file in Cursor (\"Preferences: Open User Settings (JSON)\")"),
    }
}

/// Cursor's settings file (`path`, or the per-OS default) and its text, or the check that says
/// why it could not be read; `setup` is the command that writes it.
fn read_cursor_settings(path: Option<&Path>, setup: &str) -> Result<(PathBuf, String), Check> {
    let subject = CURSOR_SETTINGS;
    let path: PathBuf = match path {
        Some(p) => p.to_path_buf(),
        None => match cursor::default_settings_path() {
            Ok(p) => p,
            Err(e) => return Err(Check::new(Level::Skip, subject, e.to_string())),
        },
    };
    match std::fs::read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            Ok((path, text))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Check::new(
            Level::Fail,
            subject,
            format!("{} not found", path.display()),
        )
        .fix(format!(
            "run `{setup}` (with the same --config), or pass --cursor-settings FILE"
        ))),
        Err(e) => Err(Check::new(
            Level::Fail,
            subject,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

/// Settings wired for `listen`: fine, unless the Remote-SSH route sends agents elsewhere.
fn check_remote_route(path: &Path, text: &str, listen: SocketAddr) -> Check {
    let subject = CURSOR_SETTINGS;
    match remote_route(text) {
        // The user's own value, kept by setup: Remote-SSH windows will not reach us.
        Some(other) => Check::new(
            Level::Warn,
            subject,
            format!(
                "{} points at {}, but {} is {other}: a Remote-SSH window's agent will try the proxy on the remote host and fail",
                path.display(),
                cursor::proxy_url(listen),
                cursor::REMOTE_INFERENCE_ROUTE
            ),
        )
        .fix(format!(
            "set \"{}\": \"always\" in {} if you use Remote-SSH",
            cursor::REMOTE_INFERENCE_ROUTE,
            path.display()
        )),
        None => Check::new(
            Level::Ok,
            subject,
            format!("{} points at {}", path.display(), cursor::proxy_url(listen)),
        ),
    }
}

/// The Remote-SSH inference route when set to anything but "always".
fn remote_route(text: &str) -> Option<serde_json::Value> {
    let doc = crate::setup::jsonc::Document::parse(text).ok()?;
    doc.get(cursor::REMOTE_INFERENCE_ROUTE)
        .filter(|v| v.as_str() != Some("always"))
        .cloned()
}

/// The `http.proxy` in Cursor's settings (`path`, or the per-OS default), when one is set.
pub fn cursor_http_proxy(path: Option<&Path>) -> Option<String> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => cursor::default_settings_path().ok()?,
    };
    let text = std::fs::read_to_string(path).ok()?;
    let doc = super::jsonc::Document::parse(&text).ok()?;
    doc.get("http.proxy")
        .and_then(|v| v.as_str())
        .filter(|v| !v.trim().is_empty())
        .map(cursor::without_credentials)
}

/// The URL `setup system-proxy` pointed the OS at, when it did (from the values it saved in
/// `data_dir`).
pub fn system_pac_url(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join(super::pac::SAVED_FILE)).ok()?;
    serde_json::from_str::<super::pac::Saved>(&text)
        .ok()
        .map(|s| s.url)
}

/// The hosts the PAC script sends to the proxy with no fallback, for the checks' text.
fn pac_agent_hosts() -> String {
    crate::status::pac::AGENT_HOSTS
        .iter()
        .map(|h| match h.strip_prefix('.') {
            Some(domain) => format!("*.{domain}"),
            None => h.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What closes the DIRECT fallback of a served script: the socket-activated service, or on
/// Windows (no socket activation) Cursor's own proxy setting.
fn unheld_fix() -> &'static str {
    if cfg!(windows) {
        "`cursor-byok setup cursor` (Cursor's own proxy setting has no fallback; Windows has no \
         socket activation), then `cursor-byok setup system-proxy --undo`"
    } else {
        "`cursor-byok service install`: the service manager then holds the proxy's socket from \
         login on, and a script fetch waits for the proxy"
    }
}

/// The system PAC at `url`, served by the proxy, while the proxy answers: whether a Cursor
/// that starts while it is down would still get the script.
fn pac_up(url: &str, held: &Held) -> Check {
    let subject = "wiring";
    let agent = pac_agent_hosts();
    match held {
        Held::Yes(at) => Check::new(
            Level::Ok,
            subject,
            format!(
                "system PAC {url}: Cursor's agent hosts ({agent}) go through the proxy with no \
                 fallback, and the service manager holds {at}, so while the proxy is down or \
                 restarting the script fetch waits for it instead of falling back to DIRECT"
            ),
        ),
        Held::No(why) => Check::new(
            Level::Warn,
            subject,
            format!(
                "system PAC {url}: Cursor's agent hosts ({agent}) go through the proxy with no \
                 fallback, but {why}: while the proxy is down nothing answers there, so a \
                 Cursor that starts then cannot fetch the script and goes DIRECT everywhere, \
                 a chat on your own model included"
            ),
        )
        .fix(unheld_fix()),
    }
}

/// The system PAC at `url` while the proxy is down. A script fetched from the proxy itself
/// cannot be fetched now unless the service manager holds the socket: a Cursor that starts
/// (or re-reads the script) meanwhile goes DIRECT everywhere, agent hosts included. With the
/// socket held, the fetch waits (nothing goes DIRECT) and the proxy fails to start. A
/// `file://` script keeps the agent hosts failing.
fn pac_down(url: &str, held: &Held) -> Check {
    let subject = "wiring";
    if let (Held::Yes(at), false) = (held, url.starts_with("file:")) {
        return Check::new(
            Level::Fail,
            subject,
            format!(
                "system PAC {url}: the service manager holds {at}, so Cursor waits for the \
                 proxy (nothing goes DIRECT), but the proxy does not answer: Cursor's chats and \
                 login hang until it does"
            ),
        )
        .fix("see why it does not start: `cursor-byok service status` and `cursor-byok service logs`");
    }
    if url.starts_with("file:") {
        return Check::new(
            Level::Warn,
            subject,
            format!(
                "system PAC {url} with the proxy down: Cursor's agent hosts ({}) fail (no chat \
                 reaches Cursor, on any model); its other hosts go DIRECT",
                pac_agent_hosts()
            ),
        );
    }
    let why = match held {
        Held::No(why) => format!(" ({why})"),
        Held::Yes(_) => String::new(),
    };
    Check::new(
        Level::Fail,
        subject,
        format!(
            "system PAC {url} with the proxy down: the script is served by the proxy and \
             nothing holds its socket{why}, so it cannot be fetched now and a Cursor that \
             starts or re-reads it meanwhile goes DIRECT everywhere; a chat with one of your \
             models selected would then reach Cursor. A Cursor that loaded the script before \
             keeps its agent hosts ({}) on the proxy, failing",
            pac_agent_hosts()
        ),
    )
}

/// Which wiring sends Cursor to the proxy, and whether Cursor is cut off right now: its
/// `http.proxy` has no fallback; the system PAC has none for the agent hosts, and falls back
/// to DIRECT for Cursor's other hosts (and for all of them when the script cannot be fetched,
/// which `held` says whether it can happen: the service manager holds the socket or not).
pub fn check_wiring(
    http_proxy: Option<&str>,
    ours: &str,
    system_pac: Option<&str>,
    listening: bool,
    held: &Held,
) -> Check {
    let subject = "wiring";
    let start = "keep the proxy running: `cursor-byok service install` starts it at login";
    let same = |p: &str| {
        p.trim_end_matches('/')
            .eq_ignore_ascii_case(ours.trim_end_matches('/'))
    };
    match (http_proxy, system_pac, listening) {
        // Another proxy (a corporate one): whether it answers is not ours to judge.
        (Some(p), _, _) if !same(p) => Check::new(
            Level::Warn,
            subject,
            format!("Cursor's http.proxy is {p}, not cursor-byok's {ours}: Cursor does not use it"),
        )
        .fix("`cursor-byok setup cursor` (chain your proxy with `[upstream] proxy`)"),
        (Some(p), _, false) => Check::new(
            Level::Fail,
            subject,
            format!(
                "Cursor is cut off right now: its http.proxy is {p} and nothing answers there, so \
                 chats, Tab and login fail"
            ),
        )
        .fix(format!(
            "{start}; or `cursor-byok setup system-proxy` (DIRECT when the proxy is down) and \
             remove http.proxy (`cursor-byok setup cursor --undo`)"
        )),
        (Some(p), pac, true) => Check::new(
            Level::Ok,
            subject,
            format!(
                "Cursor settings http.proxy = {p}{} (no fallback: Cursor is cut off whenever the \
                 proxy stops)",
                pac.map(|u| format!("; the system PAC {u} is also set but http.proxy wins"))
                    .unwrap_or_default()
            ),
        ),
        (None, Some(u), true) if u.starts_with("file:") => Check::new(
            Level::Ok,
            subject,
            format!(
                "system PAC {u}: Cursor's agent hosts ({agent}) go through the proxy with no \
                 fallback (while it is down they fail, Cursor's own models too: no chat on your \
                 model reaches Cursor); Cursor's other hosts go DIRECT when it is down",
                agent = pac_agent_hosts()
            ),
        ),
        (None, Some(u), true) => pac_up(u, held),
        (None, Some(u), false) => {
            let down = pac_down(u, held);
            if down.fix.is_some() {
                down
            } else {
                down.fix(start)
            }
        }
        (None, None, _) => Check::new(
            Level::Fail,
            subject,
            "Cursor is not pointed at the proxy (no http.proxy, no system PAC)",
        )
        .fix("`cursor-byok setup cursor`, or `cursor-byok setup system-proxy` (see the README)"),
    }
}

/// Whether the OS (and on Linux the NSS database) trusts the CA, where that can be checked.
pub fn check_trust(ca: &CertificateAuthority) -> Vec<Check> {
    let files = CaFiles::of(ca);
    let mut checks = Vec::new();
    match trust::os_store_trusts(ca.cert_der().as_ref()) {
        Ok(true) => checks.push(Check::new(
            Level::Ok,
            "CA trust",
            "the OS store trusts the CA",
        )),
        Ok(false) => checks.push(
            Check::new(
                Level::Fail,
                "CA trust",
                "the OS store does not trust the CA",
            )
            .fix("run `cursor-byok ca trust` (or `ca trust --apply`), then restart Cursor"),
        ),
        Err(e) => checks.push(Check::new(
            Level::Skip,
            "CA trust",
            format!("cannot read the OS store: {e}"),
        )),
    }
    match trust::nss_trusts(&files, ca.cert_pem()) {
        Some(Ok(true)) => checks.push(Check::new(
            Level::Ok,
            "CA trust (NSS)",
            "the NSS database Cursor reads on Linux has the CA",
        )),
        Some(Ok(false)) => checks.push(
            Check::new(
                Level::Fail,
                "CA trust (NSS)",
                "~/.pki/nssdb (read by Cursor on Linux) lacks the CA",
            )
            .fix("run `cursor-byok ca trust --apply` (needs certutil: libnss3-tools)"),
        ),
        Some(Err(e)) => checks.push(Check::new(Level::Skip, "CA trust (NSS)", e)),
        None if Os::current() == Some(Os::Linux) => checks.push(Check::new(
            Level::Skip,
            "CA trust (NSS)",
            "certutil not installed (libnss3-tools), cannot check ~/.pki/nssdb",
        )),
        None => {}
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_the_fix() {
        let c = Check::new(Level::Fail, "provider `x`", "rejected").fix("set $X");
        assert_eq!(
            c.to_string(),
            "[FAIL] provider `x`: rejected -> fix: set $X"
        );
        let c = Check::new(Level::Ok, "CA", "fine");
        assert_eq!(c.to_string(), "[ok]   CA: fine");
    }

    #[test]
    fn wiring_says_when_cursor_is_cut_off() {
        let ours = "http://127.0.0.1:8787";
        let p = Some(ours);
        let pac = Some("http://127.0.0.1:8787/__cursor-byok/proxy.pac");
        let held = Held::Yes("127.0.0.1:8787".parse().unwrap());
        let check_wiring = |p, pac, up| super::check_wiring(p, ours, pac, up, &held);
        let other = check_wiring(Some("http://proxy.corp:3128"), None, false);
        assert_eq!(other.level, Level::Warn);
        assert!(other.detail.contains("not cursor-byok's"), "{other}");
        let cut = check_wiring(p, None, false);
        assert_eq!(cut.level, Level::Fail);
        assert!(cut.detail.contains("cut off right now"), "{cut}");
        assert!(cut.to_string().contains("service install"), "{cut}");
        assert_eq!(check_wiring(p, None, true).level, Level::Ok);
        // http.proxy wins over the system setting, so the PAC's fallback does not help.
        assert_eq!(check_wiring(p, pac, false).level, Level::Fail);
        let both = check_wiring(p, pac, true);
        assert!(both.detail.contains("http.proxy wins"), "{both}");
        assert_eq!(check_wiring(None, pac, true).level, Level::Ok);
        let up = check_wiring(None, pac, true);
        assert!(up.detail.contains("no fallback"), "{up}");
        assert!(up.detail.contains("holds 127.0.0.1:8787"), "{up}");
        assert!(
            up.detail.contains("api2.cursor.sh, *.api5.cursor.sh"),
            "{up}"
        );
        // Served by the proxy with its socket held: down means Cursor waits, never DIRECT.
        let waits = check_wiring(None, pac, false);
        assert_eq!(waits.level, Level::Fail);
        assert!(waits.detail.contains("nothing goes DIRECT"), "{waits}");
        assert!(waits.to_string().contains("service logs"), "{waits}");
        // Nobody holds the socket: down means the script cannot be fetched, so DIRECT
        // everywhere; up, a warning that says so.
        let unheld = Held::No("the login service is not installed".into());
        let down = super::check_wiring(None, ours, pac, false, &unheld);
        assert_eq!(down.level, Level::Fail);
        assert!(down.detail.contains("DIRECT everywhere"), "{down}");
        assert!(down.detail.contains("not installed"), "{down}");
        assert!(down.to_string().contains("service install"), "{down}");
        let up = super::check_wiring(None, ours, pac, true, &unheld);
        assert_eq!(up.level, Level::Warn);
        assert!(up.detail.contains("goes DIRECT everywhere"), "{up}");
        assert!(up.to_string().contains("service install"), "{up}");
        let file = check_wiring(
            None,
            Some("file:///home/u/.local/share/cursor-byok/proxy.pac"),
            false,
        );
        assert_eq!(file.level, Level::Warn);
        assert!(
            file.detail.contains("fail (no chat reaches Cursor"),
            "{file}"
        );
        assert_eq!(check_wiring(None, None, true).level, Level::Fail);
    }

    #[test]
    fn settings_check_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let listen: SocketAddr = "127.0.0.1:8787".parse().unwrap();
        std::fs::write(&path, "{\"http.proxy\": \"http://127.0.0.1:1\"}").unwrap();
        let c = check_cursor_settings(Some(&path), listen, None);
        assert_eq!(c.level, Level::Fail);
        assert!(
            c.detail.contains("http.proxy is \"http://127.0.0.1:1\""),
            "{c}"
        );
        assert!(c.to_string().contains("cursor-byok setup cursor"));
        let plan = cursor::plan(&path, &cursor::desired_settings(listen)).unwrap();
        cursor::apply(&plan).unwrap();
        assert_eq!(
            check_cursor_settings(Some(&path), listen, None).level,
            Level::Ok
        );
    }

    #[test]
    fn settings_check_names_the_remote_ssh_route() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        let listen: SocketAddr = "127.0.0.1:8787".parse().unwrap();
        std::fs::write(&path, "{}").unwrap();
        let plan = cursor::plan(&path, &cursor::desired_settings(listen)).unwrap();
        cursor::apply(&plan).unwrap();
        // Wired before the route was part of the wiring: missing, so setup must run again.
        let text = std::fs::read_to_string(&path).unwrap();
        let without = text.replace(
            "\"cursorAgentHost.remoteInferenceRoute\": \"always\"",
            "\"x\": 1",
        );
        std::fs::write(&path, &without).unwrap();
        let c = check_cursor_settings(Some(&path), listen, None);
        assert_eq!(c.level, Level::Fail, "{c}");
        assert!(
            c.detail
                .contains("cursorAgentHost.remoteInferenceRoute is not set"),
            "{c}"
        );
        // The user's own value: a warning that says what breaks.
        std::fs::write(&path, text.replace("\"always\"", "\"auto\"")).unwrap();
        let c = check_cursor_settings(Some(&path), listen, None);
        assert_eq!(c.level, Level::Warn, "{c}");
        assert!(c.detail.contains("Remote-SSH"), "{c}");
    }
}
