//! The IO around the pure decoders: send, retry before any output, idle timeout, cancellation.

use std::sync::Arc;
#[cfg(test)]
use std::time::UNIX_EPOCH;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use rand::Rng;
use reqwest::header::HeaderMap;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::decode::StreamDecoder;
use super::error::{ProviderError, ProviderErrorKind};
use super::schema::ToolNames;
use super::types::ProviderEvent;
use super::{Resolved, RetryPolicy};
use crate::base::secret::Scrubber;

/// An SSE event larger than this is treated as a broken stream rather than buffered forever.
const MAX_PENDING_BYTES: usize = 32 << 20;
/// Error bodies are read up to this size.
const MAX_ERROR_BODY: usize = 64 << 10;

/// One call's request: where, what, and the tool names to map back in its events.
pub(crate) struct Call {
    pub url: reqwest::Url,
    pub body: Bytes,
    pub names: ToolNames,
    /// Retries before any output: the client's policy, or none when a fallback target waits.
    pub max_retries: u32,
}

enum Outcome {
    /// Terminal event delivered, or the receiver is gone.
    Done,
    /// Failed; the caller retries or reports.
    Failed(ProviderError),
}

/// One streamed call, including its retries. Ends after sending a terminal event, when the
/// receiver is dropped, or when `cancel` fires.
pub(crate) async fn run(
    http: reqwest::Client,
    r: Arc<Resolved>,
    call: Call,
    tx: mpsc::Sender<ProviderEvent>,
    cancel: CancellationToken,
) {
    let mut emitted = false;
    let mut attempt: u32 = 0;
    loop {
        let err = match attempt_once(&http, &r, &call, &tx, &cancel, &mut emitted).await {
            Outcome::Done => return,
            Outcome::Failed(e) => e.scrub(&scrubber(&r)),
        };
        if err.kind == ProviderErrorKind::Canceled {
            let _ = tx.try_send(ProviderEvent::Error(err));
            return;
        }
        let delay = retry_delay(&err, attempt, &r.retry);
        match delay {
            Some(d) if !emitted && err.retryable() && attempt < call.max_retries => {
                tracing::warn!(
                    attempt = attempt + 1,
                    delay_ms = d.as_millis() as u64,
                    error = %err,
                    "retrying provider call"
                );
                tokio::select! {
                    _ = cancel.cancelled() => {
                        let _ = tx.try_send(ProviderEvent::Error(ProviderError::canceled(&r.name)));
                        return;
                    }
                    _ = tokio::time::sleep(d) => {}
                }
                attempt += 1;
            }
            _ => {
                tracing::debug!(error = %err, "provider call failed");
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tx.send(ProviderEvent::Error(err)) => {}
                }
                return;
            }
        }
    }
}

/// This client's own secrets (the key, and every header marked sensitive: the extra headers
/// are) on top of the process-wide registry's.
fn scrubber(r: &Resolved) -> Scrubber {
    let headers = r
        .headers
        .values()
        .filter(|v| v.is_sensitive())
        .filter_map(|v| v.to_str().ok());
    Scrubber::new(headers.chain([r.api_key.expose()]))
}

/// The wait before the next attempt: the provider's `retry-after` when given (no retry if it is
/// beyond `max_retry_after`), else exponential backoff with jitter.
fn retry_delay(err: &ProviderError, attempt: u32, p: &RetryPolicy) -> Option<Duration> {
    if let Some(after) = err.retry_after() {
        return (after <= p.max_retry_after).then_some(after);
    }
    let exp = p
        .base_delay
        .saturating_mul(2u32.saturating_pow(attempt.min(16)));
    let capped = exp.min(p.max_delay);
    let jitter: f64 = rand::rng().random_range(0.5..=1.0);
    Some(capped.mul_f64(jitter))
}

/// One request and its stream: send, turn a reply that is no event stream into an error, then
/// forward the decoded events.
async fn attempt_once(
    http: &reqwest::Client,
    r: &Resolved,
    call: &Call,
    tx: &mpsc::Sender<ProviderEvent>,
    cancel: &CancellationToken,
    emitted: &mut bool,
) -> Outcome {
    let resp = match send(http, r, call, cancel).await {
        Ok(resp) => expect_stream(resp, r, cancel).await,
        Err(e) => Err(e),
    };
    match resp {
        Ok(resp) => forward_stream(resp, r, call, tx, cancel, emitted).await,
        Err(e) => Outcome::Failed(e),
    }
}

/// Sends the request and waits for the response head.
async fn send(
    http: &reqwest::Client,
    r: &Resolved,
    call: &Call,
    cancel: &CancellationToken,
) -> Result<reqwest::Response, ProviderError> {
    let name = r.name.as_str();
    let send = http
        .post(call.url.clone())
        .headers(r.headers.clone())
        .body(call.body.clone())
        .send();
    tokio::select! {
        _ = cancel.cancelled() => Err(ProviderError::canceled(name)),
        res = tokio::time::timeout(r.idle_timeout, send) => match res {
            Err(_) => Err(idle_timeout(name, r.idle_timeout, "waiting for the response")),
            Ok(res) => res.map_err(|e| from_reqwest(name, e)),
        },
    }
}

/// The response if it is a stream; an error status, or a JSON body where a stream belongs, as the
/// error it reports.
async fn expect_stream(
    resp: reqwest::Response,
    r: &Resolved,
    cancel: &CancellationToken,
) -> Result<reqwest::Response, ProviderError> {
    let name = r.name.as_str();
    let status = resp.status();
    if !status.is_success() {
        let retry_after = header_retry_after(resp.headers());
        let body = tokio::select! {
            _ = cancel.cancelled() => return Err(ProviderError::canceled(name)),
            b = read_capped(resp, r.idle_timeout) => b,
        };
        return Err(ProviderError::from_http(
            name,
            status.as_u16(),
            retry_after,
            &body,
        ));
    }
    let is_json = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if is_json {
        // A JSON body on 200 instead of a stream: an error some gateways send, or `stream` ignored.
        let body = tokio::select! {
            _ = cancel.cancelled() => return Err(ProviderError::canceled(name)),
            b = read_capped(resp, r.idle_timeout) => b,
        };
        let parsed = super::error::parse_error_body(&body);
        return Err(match parsed.message {
            Some(_) => {
                let v = serde_json::from_slice(&body).unwrap_or_default();
                ProviderError::from_stream_payload(name, &v).with_status(status.as_u16())
            }
            None => ProviderError::new(
                ProviderErrorKind::Decode,
                name,
                "expected an event stream but got a JSON body",
            ),
        });
    }
    Ok(resp)
}

/// Decodes the stream and sends its events on, until a terminal event, an error, the end of the
/// stream, or the receiver gone.
async fn forward_stream(
    resp: reqwest::Response,
    r: &Resolved,
    call: &Call,
    tx: &mpsc::Sender<ProviderEvent>,
    cancel: &CancellationToken,
    emitted: &mut bool,
) -> Outcome {
    let name = r.name.as_str();
    let mut decoder = StreamDecoder::new(r.kind, &r.ctx.origin, name);
    decoder.set_tool_names(call.names.clone());
    let mut chunks = resp.bytes_stream();
    // One waiter and one timer for the whole stream, not a fresh pair per chunk and event.
    let mut canceled = crate::base::cancel::cancelled(cancel);
    let idle = tokio::time::sleep(r.idle_timeout);
    tokio::pin!(idle);
    loop {
        // The idle clock runs while we wait for the provider, not while a slow client holds
        // back the events already read.
        idle.as_mut()
            .reset(tokio::time::Instant::now() + r.idle_timeout);
        let next = tokio::select! {
            biased;
            _ = &mut canceled => return Outcome::Failed(ProviderError::canceled(name)),
            n = chunks.next() => n,
            _ = &mut idle => {
                return Outcome::Failed(idle_timeout(name, r.idle_timeout, "while streaming"))
            }
        };
        let events = match next {
            None => decoder.finish(),
            Some(Err(e)) => return Outcome::Failed(from_reqwest(name, e)),
            Some(Ok(bytes)) => {
                let events = decoder.feed(&bytes);
                if decoder.pending_bytes() > MAX_PENDING_BYTES {
                    return Outcome::Failed(ProviderError::new(
                        ProviderErrorKind::Decode,
                        name,
                        "an event exceeded 32 MiB",
                    ));
                }
                events
            }
        };
        for ev in events {
            if let ProviderEvent::Error(e) = ev {
                // Hand errors back so one arriving before any output can be retried.
                return Outcome::Failed(e);
            }
            let terminal = ev.is_terminal();
            tokio::select! {
                _ = &mut canceled => return Outcome::Failed(ProviderError::canceled(name)),
                sent = tx.send(ev) => if sent.is_err() { return Outcome::Done },
            }
            *emitted = true;
            if terminal {
                return Outcome::Done;
            }
        }
        if decoder.is_done() {
            return Outcome::Done;
        }
    }
}

fn idle_timeout(name: &str, after: Duration, phase: &str) -> ProviderError {
    ProviderError::new(
        ProviderErrorKind::Timeout,
        name,
        format!("no data for {:.1}s {phase}", after.as_secs_f64()),
    )
    .with_retryable(false)
}

/// reqwest errors lose their URL (it may carry a query) and keep their cause chain.
fn from_reqwest(name: &str, e: reqwest::Error) -> ProviderError {
    let e = e.without_url();
    let kind = if e.is_timeout() {
        ProviderErrorKind::Timeout
    } else {
        ProviderErrorKind::Network
    };
    let retryable = e.is_connect() || e.is_timeout() || e.is_request() || e.is_body();
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    ProviderError::new(kind, name, msg).with_retryable(retryable)
}

async fn read_capped(resp: reqwest::Response, idle: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunks = resp.bytes_stream();
    while let Ok(Some(Ok(b))) = tokio::time::timeout(idle, chunks.next()).await {
        let room = MAX_ERROR_BODY.saturating_sub(out.len());
        out.extend_from_slice(&b[..b.len().min(room)]);
        if out.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    out
}

/// `retry-after-ms` (OpenAI) wins over `retry-after` (seconds or an HTTP date).
pub(crate) fn header_retry_after(h: &HeaderMap) -> Option<Duration> {
    let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let v = get("retry-after")?;
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = parse_http_date(v)?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// An HTTP date (IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`, or the two obsolete
/// forms), as RFC 9110 lets `retry-after` carry.
fn parse_http_date(s: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_date() {
        let t = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 784_111_777);
        let t = parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT").unwrap();
        assert_eq!(t, UNIX_EPOCH);
        assert!(parse_http_date("yesterday").is_none());
        assert!(parse_http_date("Sun, 99 Nov 1994 08:49:37 GMT").is_none());
    }

    #[test]
    fn http_date_obsolete_forms() {
        // RFC 9110 §5.6.7: recipients accept the RFC 850 and asctime forms too.
        for s in ["Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"] {
            let t = parse_http_date(s).unwrap_or_else(|| panic!("{s}"));
            assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 784_111_777);
        }
        assert!(parse_http_date("Sun, 06 Nov 1994 25:49:37 GMT").is_none());
    }

    #[test]
    fn retry_after_headers() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(header_retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(header_retry_after(&h), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            "Thu, 01 Jan 1970 00:00:00 GMT".parse().unwrap(),
        );
        assert_eq!(header_retry_after(&h), Some(Duration::ZERO));
        h.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(header_retry_after(&h), None);
    }

    #[test]
    fn backoff_grows_with_jitter_and_cap_and_respects_retry_after() {
        let p = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(10),
        };
        let server = ProviderError::new(ProviderErrorKind::Server, "P", "x");
        for attempt in 0..8 {
            let d = retry_delay(&server, attempt, &p).unwrap();
            let full = (Duration::from_millis(100) * 2u32.pow(attempt)).min(p.max_delay);
            assert!(d <= full && d >= full / 2, "{attempt}: {d:?}");
        }
        let limited = ProviderError::new(
            ProviderErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(3)),
            },
            "P",
            "x",
        );
        assert_eq!(retry_delay(&limited, 0, &p), Some(Duration::from_secs(3)));
        let too_long = ProviderError::new(
            ProviderErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(30)),
            },
            "P",
            "x",
        );
        assert_eq!(retry_delay(&too_long, 0, &p), None);
    }
}
