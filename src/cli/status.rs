//! `cursor-byok status [--json]`: what the status page shows, in a terminal: whether the proxy
//! runs, its active runs, today's cost per model (from the usage record), the last errors.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::config::Config;
use crate::status::usage::{self, UsageLine};
use crate::status::{ModelTotals, RunRecord, StatusSnapshot};

/// Errors listed at most.
const LAST_ERRORS: usize = 5;

#[derive(Debug, Serialize)]
pub struct Report {
    /// The status page's address.
    pub page: String,
    pub running: bool,
    /// Why it is not running (or not ours), when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_running: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uptime_secs: Option<u64>,
    pub active: Vec<RunRecord>,
    /// `YYYY-MM-DD`, UTC.
    pub(crate) today_utc: String,
    /// Runs that ended today, per model, from the usage record.
    pub today: Vec<ModelTotals>,
    pub today_total: ModelTotals,
    /// Newest first.
    pub last_errors: Vec<ErrorLine>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ErrorLine {
    pub unix_ms: u64,
    pub model: String,
    pub outcome: String,
    /// The error text, when the live proxy still has it (the usage record keeps none).
    pub error: Option<String>,
}

/// Gather the report: the live snapshot when the proxy answers, the usage record always.
pub fn report(config: &Config, data_dir: &Path) -> anyhow::Result<Report> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (check, snapshot) = runtime.block_on(crate::setup::doctor::check_listener(config));
    let (lines, _bad) = usage::read(data_dir).with_context(|| {
        format!(
            "cannot read the usage record {}",
            data_dir.join(usage::USAGE_FILE).display()
        )
    })?;
    let now_ms = snapshot
        .as_ref()
        .map(|s| s.now_unix_ms)
        .unwrap_or_else(now_unix_ms);
    Ok(build(config, snapshot, check.detail, &lines, now_ms))
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Pure: the report from what was read.
pub fn build(
    config: &Config,
    snapshot: Option<StatusSnapshot>,
    why_not: String,
    lines: &[UsageLine],
    now_ms: u64,
) -> Report {
    let day_start = now_ms - now_ms % 86_400_000;
    let today: Vec<UsageLine> = lines
        .iter()
        .filter(|l| l.unix_ms >= day_start)
        .cloned()
        .collect();
    let (models, total) = usage::totals(&today);
    let mut last_errors: Vec<ErrorLine> = match &snapshot {
        Some(s) => s
            .recent
            .iter()
            .filter(|r| r.outcome.as_deref().is_some_and(|o| o != "ok"))
            .map(|r| ErrorLine {
                unix_ms: r.started_unix_ms.saturating_add(r.duration_ms),
                model: r.model.clone(),
                outcome: r.outcome.clone().unwrap_or_default(),
                error: r.error.clone(),
            })
            .collect(),
        None => Vec::new(),
    };
    if last_errors.is_empty() {
        last_errors = today
            .iter()
            .rev()
            .filter(|l| l.outcome != "ok")
            .map(|l| ErrorLine {
                unix_ms: l.unix_ms,
                model: l.model.clone(),
                outcome: l.outcome.clone(),
                error: None,
            })
            .collect();
    }
    last_errors.truncate(LAST_ERRORS);
    let page = format!(
        "{}{}",
        crate::setup::cursor::proxy_url(config.listen),
        crate::status::PAGE_PATH
    );
    Report {
        page,
        running: snapshot.is_some(),
        not_running: snapshot.is_none().then_some(why_not),
        version: snapshot.as_ref().map(|s| s.version.clone()),
        uptime_secs: snapshot.as_ref().map(|s| s.uptime_secs),
        active: snapshot.map(|s| s.active).unwrap_or_default(),
        today_utc: super::usage::utc(day_start)[..10].to_string(),
        today: models,
        today_total: total,
        last_errors,
    }
}

/// `3h 2m`, `5m 10s`, `42s`.
pub fn duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

/// The report as terminal lines.
pub fn lines(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    match (&r.version, r.uptime_secs) {
        (Some(v), Some(up)) => out.push(format!(
            "proxy: cursor-byok {v} running for {} — {}",
            duration(up),
            r.page
        )),
        _ => out.push(format!(
            "proxy: not running ({})",
            r.not_running.as_deref().unwrap_or("no answer")
        )),
    }
    out.push(String::new());
    if r.active.is_empty() {
        out.push("active runs: none".into());
    } else {
        out.push(format!("active runs: {}", r.active.len()));
        for a in &r.active {
            out.push(format!(
                "  {}  {} via {}  {}  in {} / out {} tokens",
                a.run_id,
                a.model,
                a.provider,
                duration(a.duration_ms / 1000),
                a.input_tokens,
                a.output_tokens
            ));
        }
    }
    out.push(String::new());
    if r.today.is_empty() {
        out.push(format!("today ({} UTC): no finished runs", r.today_utc));
    } else {
        out.push(format!("today ({} UTC):", r.today_utc));
        for l in usage::table(&r.today, &r.today_total) {
            out.push(format!("  {l}"));
        }
    }
    out.push(String::new());
    if r.last_errors.is_empty() {
        out.push("last errors: none".into());
    } else {
        out.push("last errors:".into());
        for e in &r.last_errors {
            out.push(format!(
                "  {} UTC  {}  {}{}",
                super::usage::utc(e.unix_ms),
                e.model,
                e.outcome,
                e.error
                    .as_deref()
                    .map(|t| format!(": {t}"))
                    .unwrap_or_default()
            ));
        }
    }
    out
}

pub fn run(config: &Config, data_dir: &Path, json: bool) -> anyhow::Result<()> {
    let r = report(config, data_dir)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).context("cannot encode the report")?
        );
    } else {
        for l in lines(&r) {
            println!("{l}");
        }
    }
    Ok(())
}
