//! What a client's HTTP request says about the run it starts: its message, and beyond it the
//! secrets to scrub, the parent run a child names, and the request id.

use bytes::Bytes;
use http::HeaderMap;

use crate::agent::subagents::ParentLink;
use crate::proto::agent::v1 as pb;

/// A client message as decoded, with the bytes it came in (the run request keeps them, and
/// the schema check reads them).
pub(super) struct ClientMessage {
    pub(super) message: pb::AgentClientMessage,
    pub(super) wire: Bytes,
}

/// What a client request carries that must never show: its `authorization` bearer token (the
/// user's Cursor session), for the run's scrubber.
fn client_secrets(headers: &HeaderMap) -> Vec<crate::base::secret::Secret> {
    headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.split_once(' ').map_or(v, |(_, token)| token).trim())
        .map(crate::base::secret::Secret::new)
        .collect()
}

/// What the client's HTTP request says about the run it starts, beyond its message.
#[derive(Debug, Default)]
pub(super) struct Caller {
    secrets: Vec<crate::base::secret::Secret>,
    pub(super) parent: ParentLink,
}

impl Caller {
    pub(super) fn of(headers: &HeaderMap) -> Caller {
        Caller {
            secrets: client_secrets(headers),
            parent: parent_link(headers),
        }
    }

    /// The same caller, with `parent` for the parent link its request named.
    pub(super) fn with_parent(self, parent: ParentLink) -> Caller {
        Caller { parent, ..self }
    }

    /// `r` as the run's first request, with what the headers said.
    pub(super) fn run_request(self, r: crate::agent::RunRequest) -> crate::agent::RunRequest {
        crate::agent::RunRequest {
            client_secrets: self.secrets,
            parent: self.parent,
            ..r
        }
    }
}

/// `x-parent-request-id` and `x-parent-agent-tool-call-id`: the parent run and subagent call a
/// child run belongs to, as far as this request says (bounded: only compared, never stored
/// beyond the run).
pub(super) fn parent_link(headers: &HeaderMap) -> ParentLink {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    ParentLink::new(
        value("x-parent-request-id"),
        value("x-parent-agent-tool-call-id"),
    )
}

/// `x-request-id`, the key that pairs RunSSE with its appends.
pub(super) fn request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the headers say about a run: the bearer token for the scrubber (never the
    /// scheme), and the parent call a child names — blank or oversized values are ignored.
    #[test]
    fn the_caller_is_read_from_the_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer tok-123".parse().unwrap(),
        );
        h.insert(
            "x-parent-agent-tool-call-id",
            " call_t#s1 ".parse().unwrap(),
        );
        let c = Caller::of(&h);
        assert_eq!(c.parent.tool_call_id.as_deref(), Some("call_t#s1"));
        assert_eq!(c.secrets.len(), 1);
        assert_eq!(c.secrets[0].expose(), "tok-123");
        let r = c.run_request(crate::agent::RunRequest::default());
        assert_eq!(r.parent.tool_call_id.as_deref(), Some("call_t#s1"));
        h.insert("x-parent-agent-tool-call-id", " ".parse().unwrap());
        assert_eq!(Caller::of(&h).parent.tool_call_id, None);
        let long = "x".repeat(513);
        h.insert("x-parent-agent-tool-call-id", long.parse().unwrap());
        assert_eq!(Caller::of(&h).parent.tool_call_id, None);
    }

    /// The two parent headers may come on different requests of one child run: merged, the
    /// first value of each kept.
    #[test]
    fn parent_headers_from_different_requests_are_merged() {
        let mut sse = HeaderMap::new();
        sse.insert("x-parent-request-id", "req-parent".parse().unwrap());
        let mut append = HeaderMap::new();
        append.insert("x-parent-agent-tool-call-id", "call_t".parse().unwrap());
        append.insert("x-parent-request-id", "req-other".parse().unwrap());
        let mut link = parent_link(&sse);
        assert_eq!(link.tool_call_id, None);
        assert!(link.merge(&parent_link(&append)), "the call id is new");
        assert_eq!(link.request_id.as_deref(), Some("req-parent"));
        assert_eq!(link.tool_call_id.as_deref(), Some("call_t"));
        assert!(
            !link.merge(&parent_link(&append)),
            "nothing new the second time"
        );
    }
}
