//! Why a run ended early, which side failed, and the Connect end frame the client gets.

use crate::connect::{Code, ConnectError, ErrorDetail};
use crate::proto::aiserver::v1 as aiserver;
use crate::provider::{ProviderError, ProviderErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
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
    /// A conversation action this build does not carry out (named by its schema branch).
    #[error("cursor-byok does not support the conversation action `{0}` yet")]
    Unsupported(String),
    /// A bug or limit on our side.
    #[error("cursor-byok: {0}")]
    Internal(String),
}

impl RunError {
    pub fn code(&self) -> Code {
        match self {
            RunError::Provider { source, .. } => provider_code(&source.kind),
            RunError::Canceled | RunError::ClientGone | RunError::ClientLeft(_) => Code::Canceled,
            RunError::BadClientMessage(_) => Code::InvalidArgument,
            RunError::ClientTimeout { .. } => Code::DeadlineExceeded,
            RunError::ClientFailed { .. } => Code::Aborted,
            RunError::Unsupported(_) => Code::Unimplemented,
            RunError::Internal(_) => Code::Internal,
        }
    }

    /// Would the same run succeed if the user simply tried again?
    pub fn retryable(&self) -> bool {
        match self {
            RunError::Provider { source, .. } => source.retryable(),
            RunError::ClientTimeout { .. } | RunError::ClientGone | RunError::ClientLeft(_) => true,
            _ => false,
        }
    }

    /// Which side failed, for logs and the status page.
    pub fn side(&self) -> &'static str {
        match self {
            RunError::Provider { .. } => "provider",
            RunError::Canceled => "user",
            RunError::ClientGone
            | RunError::ClientLeft(_)
            | RunError::BadClientMessage(_)
            | RunError::ClientTimeout { .. }
            | RunError::ClientFailed { .. } => "cursor-client",
            RunError::Unsupported(_) | RunError::Internal(_) => "cursor-byok",
        }
    }

    /// The end-of-stream error: a code that fits and a message the user understands, with an
    /// `aiserver.v1.ErrorDetails` so Cursor shows a title and the detail.
    pub fn to_connect(&self) -> ConnectError {
        let message = self.to_string();
        let title = match self {
            RunError::Provider { .. } => "Model provider error",
            RunError::Canceled | RunError::ClientGone | RunError::ClientLeft(_) => "Canceled",
            _ => "cursor-byok error",
        };
        let details = aiserver::ErrorDetails {
            error: aiserver::error_details::Error::Unspecified as i32,
            details: Some(aiserver::CustomErrorDetails {
                title: title.to_string(),
                detail: message.clone(),
                is_retryable: Some(self.retryable()),
                ..Default::default()
            }),
            is_expected: Some(matches!(
                self,
                RunError::Provider { .. } | RunError::Canceled
            )),
        };
        ConnectError::new(self.code(), message).with_detail(ErrorDetail::error_details(&details))
    }
}

fn provider_code(kind: &ProviderErrorKind) -> Code {
    match kind {
        ProviderErrorKind::Auth => Code::Unauthenticated,
        ProviderErrorKind::RateLimited { .. } => Code::ResourceExhausted,
        ProviderErrorKind::Overloaded
        | ProviderErrorKind::Server
        | ProviderErrorKind::Timeout
        | ProviderErrorKind::Network
        | ProviderErrorKind::StreamError => Code::Unavailable,
        ProviderErrorKind::InvalidRequest => Code::InvalidArgument,
        ProviderErrorKind::NotFound => Code::NotFound,
        ProviderErrorKind::Canceled => Code::Canceled,
        ProviderErrorKind::Decode | ProviderErrorKind::Config | ProviderErrorKind::Other => {
            Code::Internal
        }
    }
}
