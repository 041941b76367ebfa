//! Why a run ended early, which side failed, and the Connect end frame the client gets.
//!
//! The end frame decides what Cursor's client does next. Its retry layers run a turn again on
//! `unavailable`, `internal` and `deadline_exceeded` (and the desktop re-runs a turn the server
//! ended with `canceled` or `aborted` when the user did not stop it), unless the
//! `aiserver.v1.ErrorDetails` says otherwise: `ERROR_USER_ABORTED_REQUEST` is a cancel,
//! `ERROR_CUSTOM_MESSAGE` and `is_retryable = false` are terminal, the key / rate-limit / quota
//! kinds show their own banner. So a failure ends with a retriable code only when a retry can
//! help and the user has seen nothing of the turn; otherwise both the code and the details say
//! "terminal". The table is in docs/errors.md.

use crate::base::Side;
use crate::connect::{Code, ConnectError, ErrorDetail};
use crate::proto::aiserver::v1 as aiserver;
use crate::provider::{ProviderError, ProviderErrorKind};

use aiserver::error_details::Error as Kind;

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// The model provider failed; its error says which provider and why.
    #[error("{model}: {source}")]
    Provider {
        model: String,
        #[source]
        source: ProviderError,
    },
    /// The user canceled (cancel action) or the client went away.
    #[error("the run was canceled")]
    Canceled,
    /// The Cursor client stopped reading or closed its side before the run could finish.
    #[error("Cursor closed the connection")]
    ClientGone,
    /// The transport saw the Cursor client leave for good (how, in words).
    #[error("Cursor's client went away: {0}")]
    ClientLeft(String),
    /// The Cursor client sent something we cannot use.
    #[error("Cursor sent an unusable message: {0}")]
    BadClientMessage(String),
    /// The Cursor client did not answer a request of ours in time.
    #[error("Cursor did not answer {what} within {secs} s")]
    ClientTimeout { what: String, secs: u64 },
    /// The Cursor client reported a failure we cannot continue from.
    #[error("Cursor reported an error for {what}: {message}")]
    ClientFailed { what: String, message: String },
    /// A bug or limit on our side.
    #[error("cursor-byok: {0}")]
    Internal(String),
    /// A run names a model with our prefix that the configuration does not have (renamed or
    /// removed while a chat had it selected): it goes neither to a provider nor to Cursor.
    #[error(
        "cursor-byok: model `{0}` is not configured (renamed or removed from the config?), so \
         this run was sent neither to your provider nor to Cursor. Choose a model again in \
         Cursor's model picker and send the message again"
    )]
    NotConfigured(String),
    /// Nothing says the run is Cursor's, so it was kept here and ended (why, in words).
    #[error("cursor-byok: {0}; it was sent neither to your provider nor to Cursor")]
    Withheld(String),
    /// A request came for a run of ours that has already ended (what, in words).
    #[error("cursor-byok: {0}")]
    RunEnded(String),
    /// The message that decides whose run this is never came (what, in words).
    #[error("cursor-byok: {0}; the run was sent nowhere. Send the message again")]
    NeverDecided(String),
    /// A bound of the proxy's transport was reached (which, in words).
    #[error("cursor-byok: {0}")]
    Limit(String),
}

/// How one failure is told to Cursor's client: the end frame's code, the `ErrorDetails` kind
/// and title, and whether the client may run the turn again by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ending {
    pub code: Code,
    pub kind: Kind,
    pub title: &'static str,
    pub retry: bool,
}

/// Codes Cursor's client retries or re-runs a turn on by itself.
const RETRIED_CODES: [Code; 4] = [
    Code::Unavailable,
    Code::Internal,
    Code::DeadlineExceeded,
    Code::Aborted,
];

impl RunError {
    /// How the failure ends the stream. `shown` says whether the user already saw part of the
    /// turn (text, thinking, a tool call); then a retry would repeat what they saw and run its
    /// tools again, so the ending is terminal whatever the cause.
    pub fn ending(&self, shown: bool) -> Ending {
        let (code, kind, title, transient) = self.cause();
        let retry = transient && !shown;
        if retry {
            return Ending {
                code,
                kind,
                title,
                retry,
            };
        }
        let code = if RETRIED_CODES.contains(&code) {
            Code::Unknown
        } else {
            code
        };
        // Kinds without a banner of their own become the one Cursor's client treats as final.
        let kind = match kind {
            Kind::ProviderError | Kind::Timeout | Kind::Internal | Kind::Unspecified => {
                Kind::CustomMessage
            }
            k => k,
        };
        Ending {
            code,
            kind,
            title,
            retry,
        }
    }

    /// The natural code, kind and title, and whether the failure is one a retry may cure.
    fn cause(&self) -> (Code, Kind, &'static str, bool) {
        match self {
            RunError::Provider { source, .. } => provider_cause(source),
            RunError::Canceled => (Code::Canceled, Kind::UserAbortedRequest, "Canceled", false),
            RunError::ClientGone | RunError::ClientLeft(_) => (
                Code::Canceled,
                Kind::UserAbortedRequest,
                "Cursor's client left",
                false,
            ),
            RunError::BadClientMessage(_) => (
                Code::InvalidArgument,
                Kind::BadRequest,
                "Unusable message from Cursor",
                false,
            ),
            RunError::ClientTimeout { .. } => (
                Code::DeadlineExceeded,
                Kind::Timeout,
                "Cursor did not answer",
                true,
            ),
            RunError::ClientFailed { .. } => (
                Code::Aborted,
                Kind::CustomMessage,
                "Cursor reported an error",
                false,
            ),
            RunError::NotConfigured(_) => (
                Code::FailedPrecondition,
                Kind::CustomMessage,
                "Model not configured in cursor-byok",
                false,
            ),
            RunError::Withheld(_) => (
                Code::FailedPrecondition,
                Kind::CustomMessage,
                "Kept from Cursor by cursor-byok",
                false,
            ),
            RunError::RunEnded(_) => (
                Code::NotFound,
                Kind::CustomMessage,
                "Agent run already ended",
                false,
            ),
            // Nothing ran yet: the client sending the turn again can help.
            RunError::NeverDecided(_) => (
                Code::DeadlineExceeded,
                Kind::Timeout,
                "Cursor did not start the run",
                true,
            ),
            RunError::Limit(_) => (
                Code::ResourceExhausted,
                Kind::CustomMessage,
                "cursor-byok limit reached",
                false,
            ),
            // A bug repeats on a retry.
            RunError::Internal(_) => (
                Code::Internal,
                Kind::CustomMessage,
                "cursor-byok error",
                false,
            ),
        }
    }

    /// Which side failed, for logs and the status page.
    pub fn side(&self) -> Side {
        match self {
            RunError::Provider { .. } => Side::Provider,
            RunError::Canceled => Side::User,
            RunError::ClientGone
            | RunError::ClientLeft(_)
            | RunError::BadClientMessage(_)
            | RunError::ClientTimeout { .. }
            | RunError::ClientFailed { .. }
            | RunError::Withheld(_)
            | RunError::RunEnded(_)
            | RunError::NeverDecided(_) => Side::Client,
            RunError::Internal(_) | RunError::NotConfigured(_) | RunError::Limit(_) => Side::Proxy,
        }
    }

    /// The end frame for a failure before anything was shown (see [`RunError::to_connect_after`]).
    pub(crate) fn to_connect(&self) -> ConnectError {
        self.to_connect_after(false)
    }

    /// The end-of-stream error: the code and `aiserver.v1.ErrorDetails` from
    /// [`RunError::ending`], with the cause in words (the provider's own among them) as the
    /// detail, so Cursor shows "<title> <detail>". Secrets are scrubbed from the words.
    pub(crate) fn to_connect_after(&self, shown: bool) -> ConnectError {
        let ending = self.ending(shown);
        let mut message = crate::base::secret::scrub(&self.to_string()).into_owned();
        if shown && ending.kind != Kind::UserAbortedRequest {
            message.push_str(
                ". The turn stopped after part of it was shown: send the message again to retry.",
            );
        }
        let mut additional_info = std::collections::HashMap::new();
        additional_info.insert("side".to_string(), self.side().to_string());
        if let RunError::Provider { source, .. } = self {
            additional_info.insert("provider".to_string(), source.provider.clone());
            if let Some(status) = source.status {
                additional_info.insert("status".to_string(), status.to_string());
            }
        }
        let details = aiserver::ErrorDetails {
            error: ending.kind as i32,
            details: Some(aiserver::CustomErrorDetails {
                title: ending.title.to_string(),
                detail: message.clone(),
                is_retryable: Some(ending.retry),
                additional_info,
                ..Default::default()
            }),
            is_expected: Some(!matches!(self, RunError::Internal(_))),
        };
        ConnectError::new(ending.code, message).with_detail(ErrorDetail::error_details(&details))
    }
}

fn provider_cause(e: &ProviderError) -> (Code, Kind, &'static str, bool) {
    if e.kind == ProviderErrorKind::Canceled {
        return (Code::Canceled, Kind::UserAbortedRequest, "Canceled", false);
    }
    if e.kind == ProviderErrorKind::Auth {
        return (
            Code::Unauthenticated,
            Kind::BadUserApiKey,
            "Invalid API key",
            false,
        );
    }
    if out_of_credit(e) {
        return (
            Code::ResourceExhausted,
            Kind::ResourceExhausted,
            "Out of credit",
            false,
        );
    }
    if context_too_long(e) {
        return (
            Code::InvalidArgument,
            Kind::ConversationTooLong,
            "Conversation too long",
            false,
        );
    }
    kind_cause(e)
}

/// The cause of a provider error by its kind alone: one row per kind, so a new kind is a
/// compile error here.
fn kind_cause(e: &ProviderError) -> (Code, Kind, &'static str, bool) {
    match e.kind {
        // With a delay the provider asked for more than the proxy waits (it honours shorter
        // ones itself): an immediate retry would be refused the same way.
        ProviderErrorKind::RateLimited { retry_after } => (
            Code::ResourceExhausted,
            Kind::ApiKeyRateLimit,
            "Rate limited",
            retry_after.is_none() && e.retryable(),
        ),
        ProviderErrorKind::NotFound => (
            Code::NotFound,
            Kind::BadModelName,
            "Model not available",
            false,
        ),
        ProviderErrorKind::InvalidRequest => (
            Code::InvalidArgument,
            Kind::BadRequest,
            "Request refused by the provider",
            false,
        ),
        ProviderErrorKind::Timeout => (
            Code::DeadlineExceeded,
            Kind::Timeout,
            "Model provider timed out",
            e.retryable(),
        ),
        ProviderErrorKind::Overloaded
        | ProviderErrorKind::Server
        | ProviderErrorKind::Network
        | ProviderErrorKind::StreamError
        | ProviderErrorKind::Other => (
            Code::Unavailable,
            Kind::ProviderError,
            "Model provider error",
            e.retryable(),
        ),
        ProviderErrorKind::Decode => (
            Code::Internal,
            Kind::ProviderError,
            "Model provider error",
            false,
        ),
        ProviderErrorKind::Config => (
            Code::FailedPrecondition,
            Kind::CustomMessage,
            "cursor-byok configuration error",
            false,
        ),
        // Handled above; listed so a new kind is a compile error here.
        ProviderErrorKind::Auth | ProviderErrorKind::Canceled => (
            Code::Unknown,
            Kind::CustomMessage,
            "Model provider error",
            false,
        ),
    }
}

/// Out of credit or quota for good (not a per-minute limit): OpenAI's `insufficient_quota`,
/// HTTP 402 (DeepSeek, OpenRouter), Anthropic's "credit balance is too low", a team gateway's
/// spent budget (LiteLLM's `budget_exceeded`, on a 400 or a 429).
fn out_of_credit(e: &ProviderError) -> bool {
    let message = e.message.to_ascii_lowercase();
    matches!(
        e.code.as_deref(),
        Some(
            "insufficient_quota"
                | "billing_hard_limit_reached"
                | "insufficient_balance"
                | "budget_exceeded"
        )
    ) || e.status == Some(402)
        || message.contains("credit balance")
        || message.contains("budget has been exceeded")
        || message.contains("exceededbudget")
        || message.contains("exceededtokenbudget")
}

/// The request is over the model's context window, in the words and codes providers use.
fn context_too_long(e: &ProviderError) -> bool {
    if !matches!(
        e.kind,
        ProviderErrorKind::InvalidRequest | ProviderErrorKind::StreamError
    ) {
        return false;
    }
    if matches!(
        e.code.as_deref(),
        Some("context_length_exceeded" | "string_above_max_length" | "request_too_large")
    ) || e.status == Some(413)
    {
        return true;
    }
    let m = e.message.to_ascii_lowercase();
    [
        "context length",
        "context window",
        "context_length",
        "prompt is too long",
        "too many tokens",
        "input is too long",
        "exceeds the maximum number of tokens",
        "maximum context",
    ]
    .iter()
    .any(|p| m.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn provider(e: ProviderError) -> RunError {
        RunError::Provider {
            model: "M".into(),
            source: e,
        }
    }

    fn http(status: u16, body: &str) -> RunError {
        provider(ProviderError::from_http("P", status, None, body.as_bytes()))
    }

    #[test]
    fn retriable_codes_only_before_output() {
        for e in [
            http(500, ""),
            http(529, ""),
            http(429, ""),
            RunError::ClientTimeout {
                what: "x".into(),
                secs: 1,
            },
        ] {
            let before = e.ending(false);
            assert!(before.retry, "{e}");
            let after = e.ending(true);
            assert!(!after.retry, "{e}");
            assert!(!RETRIED_CODES.contains(&after.code), "{e}: {after:?}");
            assert!(after.code != Code::Canceled, "{e}");
        }
    }

    #[test]
    fn nothing_terminal_uses_a_code_the_client_retries() {
        let all = [
            http(401, ""),
            http(404, ""),
            http(400, ""),
            http(402, ""),
            provider(ProviderError::from_http(
                "P",
                429,
                Some(Duration::from_secs(60)),
                b"",
            )),
            RunError::Internal("bug".into()),
            RunError::ClientFailed {
                what: "w".into(),
                message: "m".into(),
            },
            RunError::BadClientMessage("x".into()),
            RunError::NotConfigured("byok-x".into()),
            RunError::Withheld("x".into()),
            RunError::RunEnded("x".into()),
            RunError::Limit("x".into()),
        ];
        for e in all {
            for shown in [false, true] {
                let end = e.ending(shown);
                assert!(!end.retry, "{e}");
                assert!(!RETRIED_CODES.contains(&end.code), "{e}: {end:?}");
            }
        }
    }

    #[test]
    fn kinds_by_cause() {
        let kind = |e: RunError| e.ending(false).kind;
        assert_eq!(kind(http(401, "")), Kind::BadUserApiKey);
        assert_eq!(kind(http(403, "")), Kind::BadUserApiKey);
        assert_eq!(kind(http(429, "")), Kind::ApiKeyRateLimit);
        assert_eq!(kind(http(402, "")), Kind::ResourceExhausted);
        assert_eq!(
            kind(http(
                429,
                r#"{"error":{"message":"You exceeded your current quota","code":"insufficient_quota"}}"#
            )),
            Kind::ResourceExhausted
        );
        assert_eq!(
            kind(http(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#
            )),
            Kind::ResourceExhausted
        );
        for body in [
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","code":"context_length_exceeded"}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
        ] {
            assert_eq!(kind(http(400, body)), Kind::ConversationTooLong, "{body}");
        }
        assert_eq!(kind(http(404, "")), Kind::BadModelName);
        assert_eq!(kind(http(400, "")), Kind::BadRequest);
        assert_eq!(kind(http(503, "")), Kind::ProviderError);
        assert_eq!(kind(RunError::Canceled), Kind::UserAbortedRequest);
        assert_eq!(
            kind(RunError::ClientLeft("gone".into())),
            Kind::UserAbortedRequest
        );
        assert_eq!(http(503, "").ending(true).kind, Kind::CustomMessage);
    }

    #[test]
    fn the_detail_keeps_the_providers_words_and_drops_the_key() {
        let key = "sk-error-test-key-0123456789";
        let _reg = crate::base::secret::register_while([key]);
        let body = format!(r#"{{"error":{{"message":"Incorrect API key provided: {key}"}}}}"#);
        let err = http(401, &body).to_connect();
        let details = err.decode_error_details().unwrap().unwrap();
        let custom = details.details.unwrap();
        assert!(custom.detail.contains("Incorrect API key provided"));
        assert!(!custom.detail.contains(key), "{}", custom.detail);
        assert!(!err.message.contains(key));
        assert_eq!(custom.title, "Invalid API key");
        assert_eq!(custom.is_retryable, Some(false));
    }
}
