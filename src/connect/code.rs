//! Connect error codes and their HTTP status mapping (connectrpc.com/docs/protocol#error-codes).

use std::fmt;
use std::str::FromStr;

/// A Connect error code. There is no `ok`: success is the absence of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// Every code, in gRPC numeric order (1..=16).
    pub const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The wire name used in JSON error bodies and end-of-stream frames.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status a unary error with this code is sent with.
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown => 500,
            Code::InvalidArgument => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::Aborted => 409,
            Code::OutOfRange => 400,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DataLoss => 500,
            Code::Unauthenticated => 401,
        }
    }

    /// The code for a unary error response whose body carries no Connect error (e.g. a proxy's
    /// HTML page). This is Connect's fallback table, not the inverse of [`Code::http_status`].
    pub fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code name that is not one of Connect's (its own error, so the codes sit below the codec
/// errors that map to them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown Connect error code {0:?}")]
pub struct UnknownCode(pub String);

impl FromStr for Code {
    type Err = UnknownCode;

    /// Exact wire names only (Connect names are lowercase snake case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Code::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for code in Code::ALL {
            assert_eq!(code.as_str().parse::<Code>().ok(), Some(code));
            assert_eq!(code.to_string(), code.as_str());
        }
        assert!(matches!("ok".parse::<Code>(), Err(UnknownCode(s)) if s == "ok"));
        assert!("Internal".parse::<Code>().is_err());
    }

    #[test]
    fn http_status_per_connect_spec() {
        let table = [
            ("canceled", 499),
            ("unknown", 500),
            ("invalid_argument", 400),
            ("deadline_exceeded", 504),
            ("not_found", 404),
            ("already_exists", 409),
            ("permission_denied", 403),
            ("resource_exhausted", 429),
            ("failed_precondition", 400),
            ("aborted", 409),
            ("out_of_range", 400),
            ("unimplemented", 501),
            ("internal", 500),
            ("unavailable", 503),
            ("data_loss", 500),
            ("unauthenticated", 401),
        ];
        assert_eq!(table.len(), Code::ALL.len());
        for (name, status) in table {
            let code: Code = name.parse().expect("known name");
            assert_eq!(code.http_status(), status, "{name}");
        }
    }

    #[test]
    fn http_fallback_mapping() {
        assert_eq!(Code::from_http_status(400), Code::Internal);
        assert_eq!(Code::from_http_status(401), Code::Unauthenticated);
        assert_eq!(Code::from_http_status(403), Code::PermissionDenied);
        assert_eq!(Code::from_http_status(404), Code::Unimplemented);
        for s in [429, 502, 503, 504] {
            assert_eq!(Code::from_http_status(s), Code::Unavailable);
        }
        for s in [200, 415, 418, 500, 501] {
            assert_eq!(Code::from_http_status(s), Code::Unknown);
        }
    }
}
