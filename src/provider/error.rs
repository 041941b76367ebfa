//! Typed provider errors carrying the provider's own message.
//!
//! Every error says which provider failed, the HTTP status when there was one, and the message
//! the provider put in its error body, so the user sees "Anthropic rejected the API key (HTTP
//! 401): invalid x-api-key" rather than "request failed". Messages never contain the API key:
//! the client scrubs it (see [`ProviderError::scrub`]) and reqwest errors lose their URL.

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use crate::base::text::cut_bytes;

use crate::base::secret::Scrubber;

/// What went wrong, coarse enough to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderErrorKind {
    /// 401 / 403: bad or missing key, no access.
    Auth,
    /// 404: unknown model or endpoint.
    NotFound,
    /// 400 / 413 / 422: the provider refused the request as sent.
    InvalidRequest,
    /// 429; `retry_after` from `retry-after(-ms)` headers or the body (Gemini `retryDelay`).
    RateLimited { retry_after: Option<Duration> },
    /// 529 or an `overloaded_error`.
    Overloaded,
    /// 5xx or a server error reported inside the stream.
    Server,
    /// Connect timeout, HTTP 408, or no bytes for the idle timeout while streaming.
    Timeout,
    /// Connection failed or broke.
    Network,
    /// An error event inside a stream that started with HTTP 200.
    StreamError,
    /// A malformed event or body.
    Decode,
    /// The caller cancelled.
    Canceled,
    /// Invalid settings (bad header, bad URL).
    Config,
    /// Any other status (402, 409, ...).
    Other,
}

/// A provider failure. `Display` is the user-facing sentence.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ProviderError {
    pub kind: ProviderErrorKind,
    pub status: Option<u16>,
    /// Display name of the provider ("OpenAI", "Anthropic", "DeepSeek", ...).
    pub provider: String,
    /// The provider's own message, or ours when it gave none.
    pub message: String,
    /// The provider's error type / code (`invalid_request_error`, `insufficient_quota`, ...).
    pub code: Option<String>,
    retryable: bool,
}

impl ProviderError {
    pub fn new(kind: ProviderErrorKind, provider: &str, message: impl Into<String>) -> Self {
        let retryable = matches!(
            kind,
            ProviderErrorKind::RateLimited { .. }
                | ProviderErrorKind::Overloaded
                | ProviderErrorKind::Server
                | ProviderErrorKind::Network
        );
        ProviderError {
            kind,
            status: None,
            provider: provider.to_string(),
            message: message.into(),
            code: None,
            retryable,
        }
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self.retryable = matches!(status, 408 | 409 | 429 | 500..=599);
        self
    }

    pub(crate) fn with_code(mut self, code: Option<String>) -> Self {
        // Out of quota / credits: retrying will not help.
        if matches!(
            code.as_deref(),
            Some("insufficient_quota" | "billing_hard_limit_reached" | "budget_exceeded")
        ) {
            self.retryable = false;
        }
        self.code = code;
        self
    }

    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Whether a retry may succeed: 408/409/429/5xx, overload, network failures. The client only
    /// retries before anything was streamed to the caller.
    pub fn retryable(&self) -> bool {
        self.retryable
    }

    /// The delay the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.kind {
            ProviderErrorKind::RateLimited { retry_after } => retry_after,
            _ => None,
        }
    }

    /// The stream ended before the response finished (no finish event).
    pub fn truncated(provider: &str) -> Self {
        Self::new(
            ProviderErrorKind::Network,
            provider,
            "the stream ended before the response finished",
        )
    }

    pub fn canceled(provider: &str) -> Self {
        Self::new(ProviderErrorKind::Canceled, provider, "canceled")
    }

    /// Remove `scrubber`'s secrets from the message and code (a provider may echo its key or
    /// a header back). [`Display`](fmt::Display) also applies the process-wide registry.
    pub fn scrub(mut self, scrubber: &Scrubber) -> Self {
        self.message = scrubber.scrub(&self.message).into_owned();
        self.code = self.code.map(|c| scrubber.scrub(&c).into_owned());
        self
    }

    /// Build from a non-2xx response: status, the retry delay from headers, and the body.
    pub fn from_http(
        provider: &str,
        status: u16,
        header_retry_after: Option<Duration>,
        body: &[u8],
    ) -> Self {
        let parsed = parse_error_body(body);
        let overloaded = parsed.code.as_deref() == Some("overloaded_error");
        let kind = match status {
            401 | 403 => ProviderErrorKind::Auth,
            404 => ProviderErrorKind::NotFound,
            400 | 413 | 422 => ProviderErrorKind::InvalidRequest,
            429 => ProviderErrorKind::RateLimited {
                retry_after: header_retry_after.or(parsed.retry_delay),
            },
            408 => ProviderErrorKind::Timeout,
            529 => ProviderErrorKind::Overloaded,
            _ if overloaded => ProviderErrorKind::Overloaded,
            500..=599 => ProviderErrorKind::Server,
            _ => ProviderErrorKind::Other,
        };
        let message = parsed.message.unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                http::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("no error message")
                    .to_string()
            } else {
                cut_bytes(text, 500, "…")
            }
        });
        ProviderError::new(kind, provider, message)
            .with_status(status)
            .with_code(parsed.code)
    }

    /// Build from an error payload inside a 200 stream (OpenAI `{"error":{...}}`, Responses
    /// `{"type":"error","code",...}`, Anthropic `{"type":"error","error":{...}}`).
    pub(crate) fn from_stream_payload(provider: &str, payload: &Value) -> Self {
        let parsed = parse_error_value(payload);
        let kind = match parsed.code.as_deref() {
            // Gemini's `status` names come last in each arm.
            Some("overloaded_error" | "overloaded" | "server_is_overloaded" | "UNAVAILABLE") => {
                ProviderErrorKind::Overloaded
            }
            Some("rate_limit_error" | "rate_limit_exceeded" | "RESOURCE_EXHAUSTED") => {
                ProviderErrorKind::RateLimited {
                    retry_after: parsed.retry_delay,
                }
            }
            Some(
                "api_error"
                | "server_error"
                | "internal_error"
                | "internal_server_error"
                | "INTERNAL",
            ) => ProviderErrorKind::Server,
            _ => ProviderErrorKind::StreamError,
        };
        let message = parsed
            .message
            .unwrap_or_else(|| cut_bytes(&payload.to_string(), 500, "…"));
        ProviderError::new(kind, provider, message).with_code(parsed.code)
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.provider;
        let http = |f: &mut fmt::Formatter<'_>| match self.status {
            Some(s) => write!(f, " (HTTP {s})"),
            None => Ok(()),
        };
        match &self.kind {
            ProviderErrorKind::Auth => write!(f, "{p} rejected the API key")?,
            ProviderErrorKind::NotFound => write!(f, "{p} does not know this model or endpoint")?,
            ProviderErrorKind::InvalidRequest => write!(f, "{p} rejected the request")?,
            ProviderErrorKind::RateLimited { retry_after } => {
                write!(f, "{p} rate-limited the request")?;
                if let Some(d) = retry_after {
                    write!(f, " (retry after {:.1}s)", d.as_secs_f64())?;
                }
            }
            ProviderErrorKind::Overloaded => write!(f, "{p} is overloaded")?,
            ProviderErrorKind::Server => write!(f, "{p} had a server error")?,
            ProviderErrorKind::Timeout => write!(f, "{p} timed out")?,
            ProviderErrorKind::Network => write!(f, "could not talk to {p}")?,
            ProviderErrorKind::StreamError => write!(f, "{p} reported an error mid-stream")?,
            ProviderErrorKind::Decode => write!(f, "{p} sent a malformed response")?,
            ProviderErrorKind::Canceled => return write!(f, "the request to {p} was canceled"),
            ProviderErrorKind::Config => write!(f, "the {p} provider settings are invalid")?,
            ProviderErrorKind::Other => write!(f, "{p} returned an error")?,
        }
        http(f)?;
        write!(f, ": {}", crate::base::secret::scrub(&self.message))
    }
}

/// What we could pull out of an error body.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ParsedError {
    pub message: Option<String>,
    pub code: Option<String>,
    pub(crate) retry_delay: Option<Duration>,
}

/// Extract message / type from the error-body shapes providers use: OpenAI
/// `{"error":{"message","type","code"}}`, Anthropic `{"type":"error","error":{"type","message"}}`,
/// Gemini `{"error":{"code","message","status","details"}}` or a one-element array of that,
/// Ollama `{"error":"..."}`, vLLM / FastAPI `{"message"}` / `{"detail"}`.
pub(crate) fn parse_error_body(body: &[u8]) -> ParsedError {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => parse_error_value(&v),
        Err(_) => ParsedError::default(),
    }
}

pub(crate) fn parse_error_value(v: &Value) -> ParsedError {
    let v = match v {
        Value::Array(items) => match items.first() {
            Some(first) => first,
            None => return ParsedError::default(),
        },
        other => other,
    };
    let inner = match v.get("error") {
        Some(Value::String(s)) => {
            return ParsedError {
                message: Some(s.clone()),
                ..Default::default()
            }
        }
        Some(e @ Value::Object(_)) => e,
        _ => v,
    };
    let str_of = |val: Option<&Value>| match val {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let message = str_of(inner.get("message"))
        .or_else(|| str_of(inner.get("detail")))
        .or_else(|| {
            inner
                .get("detail")
                .filter(|d| !d.is_null())
                .map(|d| cut_bytes(&d.to_string(), 500, "…"))
        });
    // Prefer the most specific code: OpenAI `code` (e.g. insufficient_quota) over `type`;
    // Gemini `status` over the numeric `code`. A gateway (LiteLLM) puts the HTTP status in
    // `code` as a string and its kind in `type` (`budget_exceeded`, `auth_error`): the kind wins.
    let numeric = |c: &str| c.bytes().all(|b| b.is_ascii_digit());
    let kind = str_of(inner.get("type")).filter(|t| !t.is_empty() && t != "error");
    let code = match (inner.get("code"), kind, inner.get("status")) {
        (Some(Value::String(c)), Some(t), _) if numeric(c) => Some(t),
        (Some(Value::String(c)), _, _) if !c.is_empty() => Some(c.clone()),
        (_, Some(t), _) => Some(t),
        (_, _, Some(Value::String(s))) => Some(s.clone()),
        _ => None,
    };
    let retry_delay = inner
        .get("details")
        .and_then(Value::as_array)
        .and_then(|details| {
            details
                .iter()
                .find_map(|d| d.get("retryDelay").and_then(Value::as_str))
        })
        .and_then(parse_duration_suffix_s);
    ParsedError {
        message,
        code,
        retry_delay,
    }
}

/// Google's `"34.4s"` duration form.
fn parse_duration_suffix_s(s: &str) -> Option<Duration> {
    let secs: f64 = s.trim().strip_suffix('s')?.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn anthropic_401_reads_like_a_sentence() {
        let body = br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
        let e = ProviderError::from_http("Anthropic", 401, None, body);
        assert_eq!(e.kind, ProviderErrorKind::Auth);
        assert_eq!(
            e.to_string(),
            "Anthropic rejected the API key (HTTP 401): invalid x-api-key"
        );
        assert_eq!(e.code.as_deref(), Some("authentication_error"));
        assert!(!e.retryable());
    }

    #[test]
    fn openai_error_body_and_quota_is_not_retryable() {
        let body = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let e = ProviderError::from_http("OpenAI", 429, Some(Duration::from_secs(1)), body);
        assert!(matches!(e.kind, ProviderErrorKind::RateLimited { .. }));
        assert_eq!(e.message, "You exceeded your current quota");
        assert!(!e.retryable());
        let e = ProviderError::from_http(
            "OpenAI",
            429,
            None,
            br#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
        );
        assert!(e.retryable());
    }

    #[test]
    fn gemini_array_and_retry_delay() {
        let body = br#"[{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"34.4s"}]}}]"#;
        let e = ProviderError::from_http("Gemini", 429, None, body);
        assert_eq!(e.message, "quota");
        assert_eq!(e.code.as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(e.retry_after(), Some(Duration::from_secs_f64(34.4)));
    }

    #[test]
    fn statuses_map_to_kinds() {
        let k = |s| ProviderError::from_http("P", s, None, b"").kind;
        assert_eq!(k(403), ProviderErrorKind::Auth);
        assert_eq!(k(404), ProviderErrorKind::NotFound);
        assert_eq!(k(422), ProviderErrorKind::InvalidRequest);
        assert_eq!(k(529), ProviderErrorKind::Overloaded);
        assert_eq!(k(503), ProviderErrorKind::Server);
        assert_eq!(k(408), ProviderErrorKind::Timeout);
        assert_eq!(k(402), ProviderErrorKind::Other);
        for s in [408, 409, 429, 500, 502, 529] {
            assert!(
                ProviderError::from_http("P", s, None, b"").retryable(),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 422] {
            assert!(
                !ProviderError::from_http("P", s, None, b"").retryable(),
                "{s}"
            );
        }
        let e = ProviderError::from_http("P", 502, None, b"<html>Bad gateway</html>");
        assert_eq!(e.message, "<html>Bad gateway</html>");
        assert_eq!(
            ProviderError::from_http("P", 503, None, b"").message,
            "Service Unavailable"
        );
    }

    #[test]
    fn overloaded_body_on_a_5xx_is_overloaded() {
        let body =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let e = ProviderError::from_http("Anthropic", 503, None, body);
        assert_eq!(e.kind, ProviderErrorKind::Overloaded);
        assert!(e.retryable());
    }

    #[test]
    fn ollama_and_fastapi_shapes() {
        assert_eq!(
            parse_error_body(br#"{"error":"model \"x\" not found"}"#).message,
            Some("model \"x\" not found".into())
        );
        assert_eq!(
            parse_error_body(br#"{"object":"error","message":"bad","type":"BadRequestError"}"#)
                .message,
            Some("bad".into())
        );
        assert_eq!(
            parse_error_body(br#"{"detail":"Not Found"}"#).message,
            Some("Not Found".into())
        );
    }

    #[test]
    fn stream_payloads() {
        let e = ProviderError::from_stream_payload(
            "Anthropic",
            &json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
        );
        assert_eq!(e.kind, ProviderErrorKind::Overloaded);
        assert!(e.retryable());
        let e = ProviderError::from_stream_payload(
            "OpenAI",
            &json!({"type":"error","code":"insufficient_quota","message":"quota"}),
        );
        assert_eq!(e.kind, ProviderErrorKind::StreamError);
        assert_eq!(e.message, "quota");
        assert!(!e.retryable());
    }

    #[test]
    fn scrub_removes_the_key() {
        let e = ProviderError::from_http(
            "X",
            401,
            None,
            br#"{"error":{"message":"Incorrect API key provided: sk-secret-123"}}"#,
        )
        .scrub(&Scrubber::new(["sk-secret-123"]));
        assert!(!e.to_string().contains("sk-secret-123"));
        assert!(!format!("{e:?}").contains("sk-secret-123"));
    }
}
