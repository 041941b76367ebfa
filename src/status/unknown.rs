//! What Cursor sent that this build does not know (see [`crate::proto::inspect`]): counted per
//! kind, each new kind logged once at `warn`, listed on the status page and by `doctor`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::proto::inspect::Report;

/// Kinds kept (a Cursor release adds a handful; this bounds a misbehaving client).
const MAX_KINDS: usize = 200;

/// What a user should do about it; shown with the list.
pub(crate) const ADVICE: &str =
    "update cursor-byok; if the newest release still lists these, report \
     them: attach a capture (`cursor-byok run --capture FILE`, redacted) to a bug report";

/// The report as the page and `doctor` show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownReport {
    /// "Cursor 3.24.1 sent 3 things this version does not know", or empty when there is none.
    pub summary: String,
    /// What to do about it (empty when there is nothing).
    pub advice: String,
    /// The Cursor client version last seen sending one of them.
    pub client_version: Option<String>,
    /// In the order first seen.
    pub items: Vec<UnknownItem>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownItem {
    /// `field`, `oneof branch` or `enum value`.
    pub kind: String,
    /// `ExecClientMessage.58`, `ConversationAction.20`, `AgentMode=99`.
    pub key: String,
    /// Where it was first seen: `AgentClientMessage.run_request.action`.
    pub at: String,
    /// Which traffic carried it: `agent run`, `AvailableModels`, `GetServerConfig`.
    pub source: String,
    pub client_version: Option<String>,
    pub count: u64,
    pub(crate) first_seen_unix_ms: u64,
}

/// The Cursor client's version from `x-cursor-client-version`, when it is a plausible one
/// (short, printable, no spaces): it goes to logs and the page.
pub fn client_version(headers: &http::HeaderMap) -> Option<String> {
    let v = headers
        .get("x-cursor-client-version")?
        .to_str()
        .ok()?
        .trim();
    let plausible = !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic());
    plausible.then(|| v.to_string())
}

/// The registry inside [`Status`](super::Status).
#[derive(Default)]
pub(super) struct Unknowns {
    items: Vec<UnknownItem>,
    index: BTreeMap<(String, String), usize>,
    client_version: Option<String>,
}

impl Unknowns {
    /// Count what `report` found; returns the kinds seen for the first time (to log).
    pub(super) fn record(
        &mut self,
        source: &str,
        client_version: Option<&str>,
        report: &Report,
        now_unix_ms: u64,
    ) -> Vec<UnknownItem> {
        let mut new = Vec::new();
        if report.unknown.is_empty() {
            return new;
        }
        if client_version.is_some() {
            self.client_version = client_version.map(str::to_string);
        }
        for u in &report.unknown {
            let id = (u.kind.as_str().to_string(), u.key.clone());
            if let Some(&i) = self.index.get(&id) {
                self.items[i].count += 1;
                continue;
            }
            if self.items.len() >= MAX_KINDS {
                continue;
            }
            let item = UnknownItem {
                kind: id.0.clone(),
                key: u.key.clone(),
                at: u.at.clone(),
                source: source.to_string(),
                client_version: client_version.map(str::to_string),
                count: 1,
                first_seen_unix_ms: now_unix_ms,
            };
            self.index.insert(id, self.items.len());
            self.items.push(item.clone());
            new.push(item);
        }
        new
    }

    pub(super) fn report(&self) -> UnknownReport {
        if self.items.is_empty() {
            return UnknownReport::default();
        }
        let n = self.items.len();
        let who = match &self.client_version {
            Some(v) => format!("Cursor {v}"),
            None => "Cursor".to_string(),
        };
        let things = if n == 1 { "thing" } else { "things" };
        UnknownReport {
            summary: format!("{who} sent {n} {things} this version does not know"),
            advice: ADVICE.to_string(),
            client_version: self.client_version.clone(),
            items: self.items.clone(),
        }
    }
}

/// The one warning per new kind.
pub(super) fn warn_new(item: &UnknownItem) {
    let who = match &item.client_version {
        Some(v) => format!("Cursor {v}"),
        None => "Cursor (version not sent)".to_string(),
    };
    tracing::warn!(
        kind = %item.kind,
        key = %item.key,
        at = %item.at,
        source = %item.source,
        client_version = item.client_version.as_deref().unwrap_or(""),
        "{who} sent a {} this cursor-byok {} does not know: {} (in {}); {ADVICE}",
        item.kind,
        env!("CARGO_PKG_VERSION"),
        item.key,
        item.at,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inspect::{Unknown, UnknownKind};

    #[test]
    fn counts_kinds_and_reports_new_ones_once() {
        let mut u = Unknowns::default();
        let report = Report {
            unknown: vec![
                Unknown {
                    kind: UnknownKind::Branch,
                    key: "ExecClientMessage.58".into(),
                    at: "AgentClientMessage.exec_client_message".into(),
                },
                Unknown {
                    kind: UnknownKind::EnumValue,
                    key: "AgentMode=99".into(),
                    at: "x.mode".into(),
                },
            ],
            total: 2,
            error: None,
        };
        assert_eq!(u.record("agent run", Some("3.24.1"), &report, 1).len(), 2);
        assert!(u.record("agent run", Some("3.24.1"), &report, 2).is_empty());
        let r = u.report();
        assert_eq!(
            r.summary,
            "Cursor 3.24.1 sent 2 things this version does not know"
        );
        assert_eq!(r.items[0].count, 2);
        assert_eq!(r.items[1].kind, "enum value");
        assert_eq!(Unknowns::default().report(), UnknownReport::default());
    }
}
