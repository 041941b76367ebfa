//! The persisted usage record: one JSON line per finished run in `usage.jsonl` under the data
//! directory, so `cursor-byok usage` can total what survives restarts.
//!
//! A line holds the time, the model, the provider and target, the outcome, token counts and the
//! cost: no prompt, no key, no error text. The file is created `0600` and rotated to
//! `usage.jsonl.1` (one generation kept) when it would grow past its bound.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::record::{ModelTotals, RunRecord};

pub const USAGE_FILE: &str = "usage.jsonl";
/// The current file is rotated when a line would take it past this size (about 20 000 runs).
pub(crate) const MAX_USAGE_BYTES: u64 = 4 << 20;

/// One finished run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLine {
    /// When the run ended.
    pub unix_ms: u64,
    pub model: String,
    pub provider: String,
    #[serde(default)]
    pub target: Option<String>,
    pub outcome: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// `None`: the price was unknown.
    pub cost_usd: Option<f64>,
}

impl UsageLine {
    pub(super) fn of(r: &RunRecord) -> UsageLine {
        UsageLine {
            unix_ms: r.started_unix_ms.saturating_add(r.duration_ms),
            model: r.model.clone(),
            provider: r.provider.clone(),
            target: r.target.clone(),
            outcome: r.outcome.clone().unwrap_or_default(),
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            cache_read_tokens: r.cache_read_tokens,
            cache_write_tokens: r.cache_write_tokens,
            cost_usd: r.cost_usd,
        }
    }
}

/// The appending side, one per server.
#[derive(Debug)]
pub struct UsageLog {
    path: PathBuf,
    max_bytes: u64,
    /// Appends and rotation from concurrent runs take turns.
    lock: Mutex<()>,
}

impl UsageLog {
    /// `usage.jsonl` in `dir`.
    pub fn new(dir: &Path) -> UsageLog {
        Self::with_limit(dir, MAX_USAGE_BYTES)
    }

    pub(crate) fn with_limit(dir: &Path, max_bytes: u64) -> UsageLog {
        UsageLog {
            path: dir.join(USAGE_FILE),
            max_bytes,
            lock: Mutex::new(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one line, rotating first when it would not fit.
    pub fn append(&self, line: &UsageLine) -> io::Result<()> {
        let mut text = serde_json::to_vec(line).map_err(io::Error::other)?;
        text.push(b'\n');
        let _turn = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let size = fs::metadata(&self.path).map_or(0, |m| m.len());
        if size > 0 && size + text.len() as u64 > self.max_bytes {
            fs::rename(&self.path, rotated(&self.path))?;
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)?;
        }
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.open(&self.path)?.write_all(&text)
    }
}

fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// Every line kept under `dir`, oldest first, and how many lines did not parse (a torn last
/// line after a crash, a line from a newer version).
pub fn read(dir: &Path) -> io::Result<(Vec<UsageLine>, usize)> {
    let current = dir.join(USAGE_FILE);
    let mut lines = Vec::new();
    let mut bad = 0;
    for path in [rotated(&current), current] {
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for line in io::BufReader::new(file).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str(&line) {
                Ok(l) => lines.push(l),
                Err(_) => bad += 1,
            }
        }
    }
    Ok((lines, bad))
}

/// Per model (by name), then the total over all of them (named `total`).
pub fn totals(lines: &[UsageLine]) -> (Vec<ModelTotals>, ModelTotals) {
    let mut by_model: BTreeMap<&str, ModelTotals> = BTreeMap::new();
    let mut all = ModelTotals {
        model: "total".into(),
        ..ModelTotals::default()
    };
    for l in lines {
        let m = by_model.entry(&l.model).or_insert_with(|| ModelTotals {
            model: l.model.clone(),
            ..ModelTotals::default()
        });
        for t in [m, &mut all] {
            t.add(
                l.input_tokens,
                l.output_tokens,
                l.cache_read_tokens,
                l.cost_usd,
            );
        }
    }
    (by_model.into_values().collect(), all)
}

/// The totals as an aligned text table, the total last.
pub fn table(models: &[ModelTotals], total: &ModelTotals) -> Vec<String> {
    let header = [
        "model",
        "runs",
        "tokens in",
        "tokens out",
        "cache read",
        "cost",
    ]
    .map(String::from);
    let row = |t: &ModelTotals| {
        let cost = match (t.priced_runs, t.runs) {
            (0, _) => "unknown".to_string(),
            (p, r) if p < r => format!("${:.4} ({} of {} runs priced)", t.cost_usd, p, r),
            _ => format!("${:.4}", t.cost_usd),
        };
        [
            t.model.clone(),
            t.runs.to_string(),
            t.input_tokens.to_string(),
            t.output_tokens.to_string(),
            format!("{:.1}%", t.cache_read_share * 100.0),
            cost,
        ]
    };
    let rows: Vec<[String; 6]> = std::iter::once(header)
        .chain(models.iter().map(row))
        .chain(std::iter::once(row(total)))
        .collect();
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let mut line = format!("{:<w$}", r[0], w = widths[0]);
            for i in 1..5 {
                line.push_str(&format!("  {:>w$}", r[i], w = widths[i]));
            }
            line.push_str("  ");
            line.push_str(&r[5]);
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(model: &str, input: u64, cache_read: u64, cost: Option<f64>) -> UsageLine {
        UsageLine {
            unix_ms: 1,
            model: model.into(),
            provider: "P".into(),
            target: None,
            outcome: "ok".into(),
            input_tokens: input,
            output_tokens: 10,
            cache_read_tokens: cache_read,
            cache_write_tokens: 0,
            cost_usd: cost,
        }
    }

    #[test]
    fn appends_private_lines_and_rotates_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let one = serde_json::to_vec(&line("byok-a", 100, 50, Some(0.5)))
            .unwrap()
            .len() as u64
            + 1;
        // Room for three lines per file.
        let log = UsageLog::with_limit(dir.path(), one * 3);
        for _ in 0..5 {
            log.append(&line("byok-a", 100, 50, Some(0.5))).unwrap();
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(log.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let kept = |p: &Path| fs::read_to_string(p).unwrap().lines().count();
        assert_eq!(kept(&rotated(log.path())), 3);
        assert_eq!(kept(log.path()), 2);
        // Another rotation drops the oldest generation.
        for _ in 0..2 {
            log.append(&line("byok-a", 100, 50, Some(0.5))).unwrap();
        }
        assert_eq!(kept(&rotated(log.path())), 3);
        assert_eq!(kept(log.path()), 1);
        let (lines, bad) = read(dir.path()).unwrap();
        assert_eq!((lines.len(), bad), (4, 0));
    }

    #[test]
    fn totals_per_model_and_overall() {
        let dir = tempfile::tempdir().unwrap();
        let log = UsageLog::new(dir.path());
        log.append(&line("byok-a", 100, 50, Some(0.25))).unwrap();
        log.append(&line("byok-a", 300, 250, Some(0.5))).unwrap();
        log.append(&line("byok-b", 100, 0, None)).unwrap();
        // A torn last line is counted, not fatal.
        let mut f = OpenOptions::new().append(true).open(log.path()).unwrap();
        f.write_all(b"{\"unix_ms\":").unwrap();
        let (lines, bad) = read(dir.path()).unwrap();
        assert_eq!(bad, 1);
        let (models, total) = totals(&lines);
        assert_eq!(models.len(), 2);
        assert_eq!((models[0].runs, models[0].input_tokens), (2, 400));
        assert!((models[0].cache_read_share - 0.75).abs() < 1e-12);
        assert!((models[0].cost_usd - 0.75).abs() < 1e-12);
        assert_eq!(
            (total.runs, total.priced_runs, total.output_tokens),
            (3, 2, 30)
        );
        let text = table(&models, &total);
        assert_eq!(text.len(), 4);
        assert!(text[0].starts_with("model"), "{text:?}");
        assert!(
            text[1].starts_with("byok-a") && text[1].ends_with("$0.7500"),
            "{text:?}"
        );
        assert!(text[2].ends_with("unknown"), "{text:?}");
        assert!(
            text[3].contains("75.0%") || text[3].contains("60.0%"),
            "{text:?}"
        );
        assert!(text[3].ends_with("(2 of 3 runs priced)"), "{text:?}");
    }

    #[test]
    fn no_file_is_no_usage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), (Vec::new(), 0));
    }
}
