//! Configuration errors: file, key and reason, never a secret value.

/// Keys whose values are secrets: a reason that quotes their value is redacted.
/// (`upstream.proxy` may carry credentials in its URL.)
const SECRET_KEYS: &[&str] = &[
    "api_key",
    "headers",
    "password",
    "token",
    "secret",
    "upstream.proxy",
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}:{line}: TOML syntax error: {reason}")]
    Syntax {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("{file}: key `{key}`{}: {reason}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Invalid {
        file: String,
        key: String,
        line: Option<usize>,
        reason: String,
    },
}

impl ConfigError {
    pub(super) fn syntax(file: &str, text: &str, err: &toml::de::Error) -> ConfigError {
        ConfigError::Syntax {
            file: file.to_string(),
            line: err.span().map(|s| line_of(text, s.start)).unwrap_or(0),
            // The message alone: toml's Display would quote the offending source line.
            reason: err.message().trim().to_string(),
        }
    }

    pub(super) fn from_path_error(
        file: &str,
        text: &str,
        err: serde_path_to_error::Error<toml::de::Error>,
    ) -> ConfigError {
        let key = err.path().to_string();
        let inner = err.inner();
        let mut reason = inner.message().trim().to_string();
        if SECRET_KEYS.iter().any(|s| key.contains(s)) {
            reason = redact_quoted(&reason);
        }
        ConfigError::Invalid {
            file: file.to_string(),
            key,
            line: inner.span().map(|s| line_of(text, s.start)),
            reason,
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Replace every `"…"` and `` `…` `` span with a placeholder.
fn redact_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut open: Option<char> = None;
    for c in s.chars() {
        match open {
            Some(q) if c == q => {
                out.push_str("<redacted>");
                out.push(c);
                open = None;
            }
            Some(_) => {}
            None => {
                out.push(c);
                if c == '"' || c == '`' {
                    open = Some(c);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_quoted_spans() {
        assert_eq!(
            super::redact_quoted("invalid type: string \"sk-123\", expected `x`"),
            "invalid type: string \"<redacted>\", expected `<redacted>`"
        );
    }
}
