//! `cursor-byok usage`: runs, tokens and cost per model from the persisted usage record.

use std::path::Path;

use anyhow::Context;

use crate::status::usage;

/// The table, or a sentence saying why there is none.
pub fn lines(data_dir: &Path) -> anyhow::Result<Vec<String>> {
    let (runs, bad) = usage::read(data_dir).with_context(|| {
        format!(
            "cannot read the usage record in {}",
            data_dir.join(usage::USAGE_FILE).display()
        )
    })?;
    if runs.is_empty() {
        return Ok(vec![format!(
            "No finished runs recorded yet in {}.",
            data_dir.join(usage::USAGE_FILE).display()
        )]);
    }
    let (models, total) = usage::totals(&runs);
    let mut out = usage::table(&models, &total);
    let first = runs.iter().map(|r| r.unix_ms).min().unwrap_or(0);
    out.push(String::new());
    out.push(format!(
        "{} run(s) since {} (UTC), from {}; prices are list prices unless the config sets them.",
        runs.len(),
        utc(first),
        data_dir.join(usage::USAGE_FILE).display()
    ));
    if bad > 0 {
        out.push(format!(
            "{bad} line(s) could not be read and were left out."
        ));
    }
    Ok(out)
}

pub fn run(data_dir: &Path) -> anyhow::Result<()> {
    for line in lines(data_dir)? {
        println!("{line}");
    }
    Ok(())
}

/// `2026-12-02 00:47` from Unix milliseconds (civil-from-days, no time-zone crate needed).
pub(super) fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00");
        assert_eq!(super::utc(1_764_636_000_000), "2025-12-02 00:40");
    }
}
