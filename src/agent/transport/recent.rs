//! The prompts of recent agent runs, kept as SHA-256 hashes only, so a side call that names no
//! conversation (`NameAgent`, `CreateTranscriptOverview`) can still be matched to the run it
//! belongs to. Bounded in count and in age; a watch counter tells waiters a run was decided.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;

use super::routing::Decision;
use crate::proto::agent::v1 as pb;

/// Runs remembered.
pub(crate) const MAX_RECENT: usize = 256;
/// How long a run's prompt is remembered: the desktop names and titles a chat within seconds
/// of its first message; an overview may come minutes later.
pub(crate) const RECENT_TTL: Duration = Duration::from_secs(30 * 60);
/// Longest transcript read for matching (bytes, from its start).
const MAX_SCAN_BYTES: usize = 256 * 1024;
/// A role label before a transcript line's text (`User: …`) is at most this long.
const MAX_LABEL: usize = 32;

/// Whose run a prompt was seen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunOwner {
    /// One of ours, on this model id (as Cursor names it).
    Ours { model_id: String },
    /// Cursor's.
    Cursor,
}

type Hash = [u8; 32];

struct RecentRun {
    whole: Hash,
    first_line: Option<Hash>,
    owner: RunOwner,
    at: Instant,
}

/// The recent runs' prompt hashes. Cheap to share behind the transports.
pub(crate) struct RecentPrompts {
    entries: Mutex<VecDeque<RecentRun>>,
    decided: watch::Sender<u64>,
    ttl: Duration,
    max: usize,
}

impl Default for RecentPrompts {
    fn default() -> Self {
        RecentPrompts::new(RECENT_TTL, MAX_RECENT)
    }
}

impl RecentPrompts {
    pub fn new(ttl: Duration, max: usize) -> Self {
        RecentPrompts {
            entries: Mutex::new(VecDeque::new()),
            decided: watch::channel(0).0,
            ttl,
            max: max.max(1),
        }
    }

    /// A run's first message was decided: remember its prompt (when it carries one) and wake
    /// the side calls waiting for a decision.
    pub(crate) fn record_run(&self, first: &pb::AgentClientMessage, decision: &Decision) {
        if let Some(prompt) = prompt_of(first) {
            let owner = match decision {
                Decision::Ours { model_id } => RunOwner::Ours {
                    model_id: model_id.clone(),
                },
                Decision::Relay => RunOwner::Cursor,
            };
            self.record(prompt, owner);
        }
        self.decided.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Remember `prompt` as seen on a run of `owner`.
    pub fn record(&self, prompt: &str, owner: RunOwner) {
        let now = Instant::now();
        let entry = RecentRun {
            whole: hash(&normalize(prompt)),
            first_line: first_line(prompt).map(|l| hash(&l)),
            owner,
            at: now,
        };
        let mut entries = self.lock();
        entries.push_back(entry);
        while entries.len() > self.max {
            entries.pop_front();
        }
        let ttl = self.ttl;
        entries.retain(|e| now.duration_since(e.at) < ttl);
    }

    /// A receiver that sees every run decided from now on.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.decided.subscribe()
    }

    /// Whose run had exactly this prompt (whitespace aside); ours wins a tie.
    pub(crate) fn match_prompt(&self, prompt: &str) -> Option<RunOwner> {
        let h = hash(&normalize(prompt));
        self.best(|e| e.whole == h)
    }

    /// Whose run's prompt starts a line of `transcript` (its first line, after an optional
    /// role label); ours wins a tie.
    pub(crate) fn match_transcript(&self, transcript: &str) -> Option<RunOwner> {
        let hashes = transcript_hashes(transcript);
        self.best(|e| e.first_line.is_some_and(|h| hashes.contains(&h)))
    }

    fn best(&self, hit: impl Fn(&RecentRun) -> bool) -> Option<RunOwner> {
        let now = Instant::now();
        let entries = self.lock();
        let mut found = None;
        for e in entries.iter().rev() {
            if now.duration_since(e.at) >= self.ttl || !hit(e) {
                continue;
            }
            if matches!(e.owner, RunOwner::Ours { .. }) {
                return Some(e.owner.clone());
            }
            found = Some(RunOwner::Cursor);
        }
        found
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<RecentRun>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The user's text of a run's first message, when it starts a turn with one.
fn prompt_of(first: &pb::AgentClientMessage) -> Option<&str> {
    use pb::agent_client_message::Message as In;
    use pb::conversation_action::Action;
    let Some(In::RunRequest(run)) = &first.message else {
        return None;
    };
    match run.action.as_ref()?.action.as_ref()? {
        Action::UserMessageAction(a) => a
            .user_message
            .as_ref()
            .map(|u| u.text.as_str())
            .filter(|t| !t.trim().is_empty()),
        _ => None,
    }
}

/// Whitespace runs become one space; the ends are trimmed.
fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn first_line(text: &str) -> Option<String> {
    text.lines().map(normalize).find(|l| !l.is_empty())
}

fn hash(text: &str) -> Hash {
    Sha256::digest(text.as_bytes()).into()
}

/// The hashes of each line of `transcript` (bounded), with and without a role label.
fn transcript_hashes(transcript: &str) -> Vec<Hash> {
    let mut end = transcript.len().min(MAX_SCAN_BYTES);
    while !transcript.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = Vec::new();
    for line in transcript[..end].lines() {
        let line = normalize(line);
        if line.is_empty() {
            continue;
        }
        out.push(hash(&line));
        if let Some((label, rest)) = line.split_once(':') {
            if label.len() <= MAX_LABEL {
                let rest = rest.trim();
                if !rest.is_empty() {
                    out.push(hash(rest));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(m: &str) -> RunOwner {
        RunOwner::Ours {
            model_id: m.to_string(),
        }
    }

    #[test]
    fn prompts_match_by_hash_whitespace_aside_and_ours_wins() {
        let recent = RecentPrompts::default();
        recent.record("fix  the\nparser please", RunOwner::Cursor);
        assert_eq!(
            recent.match_prompt(" fix the parser\tplease "),
            Some(RunOwner::Cursor)
        );
        recent.record("fix the parser please", ours("byok-a"));
        assert_eq!(
            recent.match_prompt("fix the parser please"),
            Some(ours("byok-a"))
        );
        assert_eq!(recent.match_prompt("something else"), None);
    }

    #[test]
    fn transcripts_match_on_the_prompts_first_line() {
        let recent = RecentPrompts::default();
        recent.record("rename the module\nand its tests", ours("byok-a"));
        let transcript = "User: rename the module\nand its tests\n\nAssistant: done";
        assert_eq!(recent.match_transcript(transcript), Some(ours("byok-a")));
        assert_eq!(recent.match_transcript("User: other\nAssistant: x"), None);
        // A label longer than a role's is part of the text.
        let long = format!("{}: rename the module", "x".repeat(40));
        assert_eq!(recent.match_transcript(&long), None);
    }

    #[test]
    fn only_hashes_are_kept_and_the_count_is_bounded() {
        let recent = RecentPrompts::new(RECENT_TTL, 3);
        for i in 0..10 {
            recent.record(&format!("prompt {i}"), RunOwner::Cursor);
        }
        assert_eq!(recent.len(), 3);
        assert_eq!(recent.match_prompt("prompt 0"), None);
        assert_eq!(recent.match_prompt("prompt 9"), Some(RunOwner::Cursor));
    }

    #[tokio::test(start_paused = true)]
    async fn prompts_are_forgotten_after_their_lifetime() {
        let recent = RecentPrompts::new(Duration::from_secs(60), 8);
        recent.record("first prompt", ours("byok-a"));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(recent.match_prompt("first prompt"), Some(ours("byok-a")));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(recent.match_prompt("first prompt"), None);
        assert_eq!(recent.match_transcript("first prompt"), None);
        // Expired entries go at the next record.
        recent.record("second", RunOwner::Cursor);
        assert_eq!(recent.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_decided_run_wakes_a_waiter() {
        let recent = RecentPrompts::default();
        let mut rx = recent.watch();
        let first = pb::AgentClientMessage {
            message: Some(pb::agent_client_message::Message::RunRequest(
                pb::AgentRunRequest {
                    action: Some(pb::ConversationAction {
                        action: Some(pb::conversation_action::Action::UserMessageAction(
                            pb::UserMessageAction {
                                user_message: Some(pb::UserMessage {
                                    text: "hello there".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
        };
        recent.record_run(
            &first,
            &Decision::Ours {
                model_id: "byok-a".into(),
            },
        );
        rx.changed().await.expect("the sender lives");
        assert_eq!(recent.match_prompt("hello there"), Some(ours("byok-a")));
    }
}
