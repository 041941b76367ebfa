//! Rebuilding the provider history from the checkpoint Cursor sends back.
//!
//! [`HistoryBuilder`] is pure and resumable: it says which blobs it still needs
//! ([`HistoryBuilder::missing`]), the run finds them in its [`BlobCache`](super::BlobCache) or
//! asks the client (`get_blob_args`), and feeds them back with [`HistoryBuilder::supply`] or
//! [`HistoryBuilder::mark_unavailable`]. New needs appear as turn blobs are decoded (their user
//! message and steps), so the run loops until `missing()` is empty, then calls `finish`.
//!
//! Turns we wrote replay exactly (our replay field, see [`super::replay`]); turns written by
//! Cursor's own servers are read from the UI form, with tool calls translated by the caller's
//! fallback. Lost pieces are skipped, never fatal: a turn without its user message is dropped (as
//! Cursor's client does), a step that is missing or undecodable is left out.
//!
//! Memory is bounded by `max_bytes` of blob data: when the blobs of the kept turns exceed it, the
//! oldest turns are dropped (and not fetched further), and the history starts with the note
//! [`OMITTED_NOTE`]. Only when the newest turn alone is over the limit does `finish` fail.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use prost::Message as _;
use serde_json::Value;
use tracing::{debug, warn};

use super::blob::{self, BlobId};
use super::error::StateError;
use super::replay::{self, StepReplay, SummaryReplay};
use super::summary;
use crate::base::text::cut_chars;
use crate::proto::agent::v1 as pb;
use crate::provider::{AssistantPart, Message};

/// The user note standing for turns dropped to respect `max_bytes`.
pub(crate) const OMITTED_NOTE: &str = "[earlier conversation omitted]";

/// A shell turn's output is cut to this many characters in the history.
const MAX_SHELL_OUTPUT_CHARS: usize = 30_000;

/// Translate a tool call from its UI form (turns written by Cursor's servers):
/// `(tool name, arguments, result text, is_error)`, or `None` to leave it out.
pub(crate) type ToolCallFallback<'a> =
    &'a dyn Fn(&pb::ToolCall) -> Option<(String, Value, String, bool)>;

/// Limits and choices for a rebuild.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HistoryOptions {
    /// Blob bytes kept at most (`limits.max_history_bytes`).
    pub max_bytes: usize,
    /// Whether the model takes images (otherwise attached images are left out).
    pub(crate) images_allowed: bool,
}

/// The rebuilt history.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RebuiltHistory {
    pub messages: Vec<Message>,
    /// Turns that contributed messages.
    pub turns: usize,
    /// Turns dropped to respect `max_bytes`.
    pub(crate) omitted_turns: usize,
    pub(crate) approx_tokens: u64,
    /// The todo list of the checkpoint (undecodable or unavailable entries left out).
    pub todos: Vec<pb::TodoItem>,
    /// The blob id of each of `todos`, in the same order.
    pub(crate) todo_ids: Vec<BlobId>,
    /// Index in `messages` where each turn starts, with its id.
    pub(crate) turn_starts: Vec<(usize, BlobId)>,
    /// The last turn covered by the summary the history starts with, if any.
    pub(crate) summarized_through: Option<BlobId>,
}

impl RebuiltHistory {
    /// The last turn lying entirely before message `split` (of these messages, possibly followed
    /// by the current turn's): what a summary of `messages[..split]` covers, for
    /// [`Checkpoint::set_summary`](super::Checkpoint::set_summary). Falls back to the turn an
    /// earlier summary covered; `None` when no whole turn is covered.
    pub(crate) fn turn_through(&self, split: usize) -> Option<BlobId> {
        let ends = self
            .turn_starts
            .iter()
            .skip(1)
            .map(|(start, _)| *start)
            .chain([self.messages.len()]);
        self.turn_starts
            .iter()
            .zip(ends)
            .filter(|(_, end)| *end <= split)
            .map(|((_, id), _)| *id)
            .last()
            .or(self.summarized_through)
    }
}

#[derive(Debug)]
enum TurnKind {
    /// The turn blob is not decoded yet.
    Pending,
    /// Unavailable, undecodable, or of a kind we do not replay.
    Skipped,
    Agent {
        user: Option<BlobId>,
        steps: Vec<Option<BlobId>>,
    },
    Shell {
        command: Option<BlobId>,
        output: Option<BlobId>,
    },
}

impl TurnKind {
    fn children(&self) -> Vec<BlobId> {
        match self {
            TurnKind::Pending | TurnKind::Skipped => Vec::new(),
            TurnKind::Agent { user, steps } => {
                user.iter().chain(steps.iter().flatten()).copied().collect()
            }
            TurnKind::Shell { command, output } => command.iter().chain(output).copied().collect(),
        }
    }
}

#[derive(Debug)]
struct TurnSlot {
    /// `None` when the checkpoint's entry is not a 32-byte id.
    id: Option<BlobId>,
    kind: TurnKind,
    /// Dropped to respect `max_bytes`.
    cut: bool,
}

#[derive(Debug)]
enum SummaryState {
    None,
    Pending(BlobId),
    /// Our summary: text, and the index of the last turn it covers.
    Ours(String, usize),
}

/// A resumable rebuild of the history from a `ConversationStateStructure`.
#[derive(Debug)]
pub(crate) struct HistoryBuilder {
    turns: Vec<TurnSlot>,
    summary: SummaryState,
    todo_ids: Vec<BlobId>,
    todos: HashMap<BlobId, pb::TodoItem>,
    /// Children (user messages, steps, shell parts) supplied so far.
    blobs: HashMap<BlobId, Bytes>,
    blob_bytes: u64,
    unavailable: HashSet<BlobId>,
    opts: HistoryOptions,
}

impl HistoryBuilder {
    pub fn new(state: &pb::ConversationStateStructure, opts: HistoryOptions) -> HistoryBuilder {
        let turns = state
            .turns
            .iter()
            .map(|t| {
                let id = blob::id_from_bytes(t);
                if id.is_none() {
                    warn!(
                        "checkpoint turn id of {} bytes is not a blob id; skipping it",
                        t.len()
                    );
                }
                TurnSlot {
                    id,
                    kind: if id.is_some() {
                        TurnKind::Pending
                    } else {
                        TurnKind::Skipped
                    },
                    cut: false,
                }
            })
            .collect();
        let summary = match state.summary.as_deref().and_then(blob::id_from_bytes) {
            Some(id) => SummaryState::Pending(id),
            None => SummaryState::None,
        };
        HistoryBuilder {
            turns,
            summary,
            todo_ids: state
                .todos
                .iter()
                .filter_map(|t| blob::id_from_bytes(t))
                .collect(),
            todos: HashMap::new(),
            blobs: HashMap::new(),
            blob_bytes: 0,
            unavailable: HashSet::new(),
            opts,
        }
    }

    /// First turn not covered by our summary.
    fn first_turn(&self) -> usize {
        match &self.summary {
            SummaryState::Ours(_, k) => k + 1,
            _ => 0,
        }
    }

    /// Turns still in play: not summarised, not cut.
    fn live_turns(&self) -> impl DoubleEndedIterator<Item = (usize, &TurnSlot)> {
        self.turns
            .iter()
            .enumerate()
            .skip(self.first_turn())
            .filter(|(_, s)| !s.cut)
    }

    fn child_known(&self, id: &BlobId) -> bool {
        self.blobs.contains_key(id) || self.unavailable.contains(id)
    }

    /// Blob ids still needed, newest turns first, each once. The summary (when there is one) is
    /// asked for alone first, since it decides which turns are needed at all.
    pub fn missing(&self) -> Vec<BlobId> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut push = |id: BlobId, out: &mut Vec<BlobId>| {
            if seen.insert(id) {
                out.push(id);
            }
        };
        for id in &self.todo_ids {
            if !self.todos.contains_key(id) && !self.unavailable.contains(id) {
                push(*id, &mut out);
            }
        }
        if let SummaryState::Pending(id) = self.summary {
            push(id, &mut out);
            return out;
        }
        for (_, slot) in self.live_turns().rev() {
            match (&slot.kind, slot.id) {
                (TurnKind::Pending, Some(id)) => push(id, &mut out),
                (kind, _) => {
                    for c in kind.children() {
                        if !self.child_known(&c) {
                            push(c, &mut out);
                        }
                    }
                }
            }
        }
        for c in self.context_ids() {
            if !self.child_known(&c) {
                push(c, &mut out);
            }
        }
        out
    }

    /// The user message of an agent turn, once its blob is here.
    fn user_of(&self, kind: &TurnKind) -> Option<pb::UserMessage> {
        let TurnKind::Agent { user: Some(u), .. } = kind else {
            return None;
        };
        let data = self.blobs.get(u)?;
        pb::UserMessage::decode(data.as_ref()).ok()
    }

    /// Blobs the live turns' user messages refer to (text, images, entries given by blob id):
    /// replayed turns then read as they did when they were new.
    fn context_ids(&self) -> Vec<BlobId> {
        self.live_turns()
            .filter_map(|(_, slot)| self.user_of(&slot.kind))
            .flat_map(|u| crate::agent::context::wanted_blobs(None, Some(&u)))
            .collect()
    }

    fn context_blobs(&self, user: &pb::UserMessage) -> crate::agent::context::Blobs {
        let mut out = crate::agent::context::Blobs::default();
        for id in crate::agent::context::wanted_blobs(None, Some(user)) {
            if let Some(d) = self.blobs.get(&id) {
                out.insert(id, d.clone());
            }
        }
        out
    }

    /// Feed one blob. Fails only when `data` does not hash to `id` (the builder is unchanged;
    /// the caller may retry or [`mark_unavailable`](Self::mark_unavailable)). Content that does
    /// not decode is skipped with a warning; ids nobody asked for are ignored.
    pub(crate) fn supply(&mut self, id: BlobId, data: Bytes) -> Result<(), StateError> {
        if !blob::verify(&id, &data) {
            return Err(StateError::BlobIdMismatch {
                id: hex::encode(id),
            });
        }
        if matches!(self.summary, SummaryState::Pending(s) if s == id) {
            self.summary = self.decode_summary(&id, &data);
        }
        if self.todo_ids.contains(&id) {
            match pb::TodoItem::decode(data.as_ref()) {
                Ok(t) => {
                    self.todos.insert(id, t);
                }
                Err(_) => {
                    warn!(blob = %hex::encode(id), "todo blob does not decode; leaving it out");
                    self.unavailable.insert(id);
                }
            }
        }
        for (i, slot) in self.turns.iter_mut().enumerate() {
            if slot.id == Some(id) && matches!(slot.kind, TurnKind::Pending) {
                slot.kind = decode_turn(i, &id, &data);
            }
        }
        let wanted = !self.blobs.contains_key(&id)
            && (self
                .live_turns()
                .any(|(_, s)| s.kind.children().contains(&id))
                || self.context_ids().contains(&id));
        if wanted {
            self.blob_bytes += data.len() as u64;
            self.blobs.insert(id, data);
            self.enforce_budget();
        }
        Ok(())
    }

    /// The client does not have `id` (or refused it): what needed it is skipped.
    pub(crate) fn mark_unavailable(&mut self, id: BlobId) {
        debug!(blob = %hex::encode(id), "blob unavailable; skipping what needs it");
        self.unavailable.insert(id);
        if matches!(self.summary, SummaryState::Pending(s) if s == id) {
            warn!("the conversation summary blob is unavailable; replaying every turn instead");
            self.summary = SummaryState::None;
        }
        for (i, slot) in self.turns.iter_mut().enumerate() {
            if slot.id == Some(id) && matches!(slot.kind, TurnKind::Pending) {
                warn!(
                    turn = i,
                    "turn blob unavailable; the turn is left out of the history"
                );
                slot.kind = TurnKind::Skipped;
            }
        }
    }

    fn decode_summary(&self, id: &BlobId, data: &[u8]) -> SummaryState {
        let Ok(s) = pb::ConversationSummary::decode(data) else {
            warn!(blob = %hex::encode(id), "summary blob does not decode; ignoring it");
            return SummaryState::None;
        };
        // Only our own summaries say which turns they replace; Cursor's are ignored (every
        // turn is replayed, and our own compaction takes over if that is too long).
        let Some(r) = replay::extract_json::<SummaryReplay>(data) else {
            debug!("summary written by Cursor's server; replaying the turns instead");
            return SummaryState::None;
        };
        let through = hex::decode(&r.through_turn)
            .ok()
            .and_then(|b| blob::id_from_bytes(&b));
        match self
            .turns
            .iter()
            .rposition(|t| t.id.is_some() && t.id == through)
        {
            Some(k) => SummaryState::Ours(s.summary, k),
            None => {
                warn!("the summary covers a turn that is not in the conversation; ignoring it");
                SummaryState::None
            }
        }
    }

    /// Drop the oldest live turns (never the newest) while the blobs kept exceed `max_bytes`.
    fn enforce_budget(&mut self) {
        while self.blob_bytes > self.opts.max_bytes as u64 {
            let live: Vec<usize> = self.live_turns().map(|(i, _)| i).collect();
            let [oldest, _, ..] = live.as_slice() else {
                return;
            };
            let oldest = *oldest;
            self.turns[oldest].cut = true;
            let still_needed: HashSet<BlobId> = self
                .live_turns()
                .flat_map(|(_, s)| s.kind.children())
                .collect();
            for c in self.turns[oldest].kind.children() {
                if !still_needed.contains(&c) {
                    if let Some(b) = self.blobs.remove(&c) {
                        self.blob_bytes -= b.len() as u64;
                    }
                }
            }
            debug!(
                turn = oldest,
                "history over max_bytes; dropping the oldest turn"
            );
        }
    }

    /// Build the history once [`missing`](Self::missing) is empty.
    pub fn finish(self, fallback: ToolCallFallback<'_>) -> Result<RebuiltHistory, StateError> {
        let missing = self.missing().len();
        if missing > 0 {
            return Err(StateError::Incomplete { missing });
        }
        if self.blob_bytes > self.opts.max_bytes as u64 {
            return Err(StateError::HistoryTooLarge {
                bytes: self.blob_bytes,
                max: self.opts.max_bytes as u64,
            });
        }
        let mut messages = Vec::new();
        let mut summarized_through = None;
        if let SummaryState::Ours(text, k) = &self.summary {
            messages.push(summary::summary_message(text));
            summarized_through = self.turns.get(*k).and_then(|t| t.id);
        }
        let omitted_turns = self
            .turns
            .iter()
            .skip(self.first_turn())
            .filter(|t| t.cut)
            .count();
        if omitted_turns > 0 {
            messages.push(Message::user_text(OMITTED_NOTE));
        }
        let mut turn_starts = Vec::new();
        let mut ids = CallIds::default();
        for (i, slot) in self.live_turns() {
            let start = messages.len();
            let added = match &slot.kind {
                TurnKind::Agent { user, steps } => {
                    self.agent_turn(i, user, steps, fallback, &mut ids, &mut messages)
                }
                TurnKind::Shell { command, output } => {
                    self.shell_turn(command, output, &mut messages)
                }
                TurnKind::Pending | TurnKind::Skipped => false,
            };
            if let (true, Some(id)) = (added, slot.id) {
                turn_starts.push((start, id));
            }
        }
        let (todo_ids, todos) = self
            .todo_ids
            .iter()
            .filter_map(|id| self.todos.get(id).map(|t| (*id, t.clone())))
            .unzip();
        Ok(RebuiltHistory {
            approx_tokens: summary::estimate_tokens(&messages),
            turns: turn_starts.len(),
            omitted_turns,
            messages,
            todos,
            todo_ids,
            turn_starts,
            summarized_through,
        })
    }

    /// Append one agent turn; `false` when it contributes nothing (no user message).
    fn agent_turn(
        &self,
        turn: usize,
        user: &Option<BlobId>,
        steps: &[Option<BlobId>],
        fallback: ToolCallFallback<'_>,
        ids: &mut CallIds,
        out: &mut Vec<Message>,
    ) -> bool {
        let user_msg = user
            .and_then(|u| self.blobs.get(&u))
            .and_then(|d| pb::UserMessage::decode(d.as_ref()).ok());
        let Some(user_msg) = user_msg else {
            warn!(
                turn,
                "the turn's user message is unavailable; leaving the turn out"
            );
            return false;
        };
        out.push(crate::agent::prompt::user_message_with(
            &user_msg,
            self.opts.images_allowed,
            &self.context_blobs(&user_msg),
        ));

        // One model call: its parts, then the results of its tool calls.
        let mut call = CallParts::default();
        for (si, step_id) in steps.iter().enumerate() {
            let Some(data) = step_id.and_then(|s| self.blobs.get(&s)) else {
                continue;
            };
            let Ok(step) = pb::ConversationStep::decode(data.as_ref()) else {
                warn!(turn, step = si, "step blob does not decode; leaving it out");
                continue;
            };
            let replay: Option<StepReplay> = replay::extract_json(data);
            use pb::conversation_step::Message as M;
            if let Some(StepReplay::UserContext { text }) = &replay {
                call.flush(out);
                out.push(Message::user_text(text.clone()));
                continue;
            }
            match step.message {
                Some(M::AssistantMessage(a)) => call.text(a.text, out),
                Some(M::ThinkingMessage(t)) => call.thinking(t.text, replay, out),
                Some(M::ToolCall(tc)) => match recorded_call(&tc, replay, fallback) {
                    Some(mut recorded) => {
                        let id = ids.unique(std::mem::take(&mut recorded.call_id), turn, si);
                        call.tool_call(id, recorded);
                    }
                    None => debug!(
                        turn,
                        step = si,
                        "tool call without a history form; leaving it out"
                    ),
                },
                None => {}
            }
        }
        call.flush(out);
        true
    }

    /// A command the user ran from the chat: a user note with its output.
    fn shell_turn(
        &self,
        command: &Option<BlobId>,
        output: &Option<BlobId>,
        out: &mut Vec<Message>,
    ) -> bool {
        let get = |id: &Option<BlobId>| id.and_then(|i| self.blobs.get(&i));
        let Some(cmd) = get(command).and_then(|d| pb::ShellCommand::decode(d.as_ref()).ok()) else {
            return false;
        };
        let output = get(output)
            .and_then(|d| pb::ShellOutput::decode(d.as_ref()).ok())
            .unwrap_or_default();
        let mut text = format!("[The user ran a shell command]\n$ {}\n", cmd.command);
        for s in [&output.stdout, &output.stderr] {
            if !s.is_empty() {
                text.push_str(&cut_chars(s, MAX_SHELL_OUTPUT_CHARS, "…[truncated]"));
                text.push('\n');
            }
        }
        text.push_str(&format!("(exit code {})", output.exit_code));
        out.push(Message::user_text(text));
        true
    }
}

/// The model call being rebuilt: its parts, then the results of its tool calls. A text or
/// thinking step after a tool call starts the next call (the model saw the results in between).
#[derive(Default)]
struct CallParts {
    parts: Vec<AssistantPart>,
    results: Vec<Message>,
}

impl CallParts {
    /// The call is complete: it goes to `out`, then its results.
    fn flush(&mut self, out: &mut Vec<Message>) {
        if !self.parts.is_empty() {
            out.push(Message::Assistant {
                parts: std::mem::take(&mut self.parts),
            });
        }
        out.append(&mut self.results);
    }

    fn text(&mut self, text: String, out: &mut Vec<Message>) {
        if !self.results.is_empty() {
            self.flush(out);
        }
        if !text.is_empty() {
            self.parts.push(AssistantPart::Text { text });
        }
    }

    fn thinking(&mut self, text: String, replay: Option<StepReplay>, out: &mut Vec<Message>) {
        if !self.results.is_empty() {
            self.flush(out);
        }
        // Thinking from Cursor's servers has no replay data: it stays plain reasoning, which
        // providers leave out (they only replay their own extras).
        let extra = match replay {
            Some(StepReplay::Thinking { extra }) => extra,
            _ => None,
        };
        if !text.is_empty() || extra.is_some() {
            self.parts.push(AssistantPart::Reasoning { text, extra });
        }
    }

    /// A tool call, under its (unique) id `id`, and its result.
    fn tool_call(&mut self, id: String, c: RecordedCall) {
        self.parts.push(AssistantPart::ToolCall {
            id: id.clone(),
            name: c.name.clone(),
            arguments: c.arguments,
            extra: c.extra,
        });
        self.results.push(Message::ToolResult {
            call_id: id,
            name: c.name,
            content: c.result,
            is_error: c.is_error,
        });
    }
}

/// A tool call as the model made it and the result it read.
struct RecordedCall {
    call_id: String,
    name: String,
    arguments: Value,
    result: String,
    is_error: bool,
    extra: Option<crate::provider::ProviderExtra>,
}

/// A tool call step: exactly as we recorded it, else translated from its UI form by
/// `fallback`; `None` when it has no history form.
fn recorded_call(
    tc: &pb::ToolCall,
    replay: Option<StepReplay>,
    fallback: ToolCallFallback<'_>,
) -> Option<RecordedCall> {
    if let Some(StepReplay::ToolCall {
        call_id,
        name,
        arguments,
        result,
        is_error,
        extra,
    }) = replay
    {
        return Some(RecordedCall {
            call_id,
            name,
            arguments,
            result,
            is_error,
            extra,
        });
    }
    let (name, arguments, result, is_error) = fallback(tc)?;
    Some(RecordedCall {
        // Cursor's own id when it recorded one; `CallIds` fills in the rest.
        call_id: tc.tool_call_id.clone().unwrap_or_default(),
        name,
        arguments,
        result,
        is_error,
        extra: None,
    })
}

/// Decode a turn blob into what it references.
fn decode_turn(index: usize, id: &BlobId, data: &[u8]) -> TurnKind {
    use pb::conversation_turn_structure::Turn;
    let ids = |b: &Bytes| blob::id_from_bytes(b);
    match pb::ConversationTurnStructure::decode(data) {
        Ok(pb::ConversationTurnStructure {
            turn: Some(Turn::AgentConversationTurn(t)),
        }) => TurnKind::Agent {
            user: ids(&t.user_message),
            steps: t.steps.iter().map(ids).collect(),
        },
        Ok(pb::ConversationTurnStructure {
            turn: Some(Turn::ShellConversationTurn(t)),
        }) => TurnKind::Shell {
            command: ids(&t.shell_command),
            output: ids(&t.shell_output),
        },
        Ok(_) => {
            debug!(turn = index, "turn of an unknown kind; leaving it out");
            TurnKind::Skipped
        }
        Err(_) => {
            warn!(turn = index, blob = %hex::encode(id), "turn blob does not decode; leaving it out");
            TurnKind::Skipped
        }
    }
}

/// Keeps tool-call ids unique across the rebuilt history (providers reject duplicates, and
/// some models reuse ids like `functions.Shell:0` in every turn).
#[derive(Default)]
struct CallIds(HashSet<String>);

impl CallIds {
    fn unique(&mut self, id: String, turn: usize, step: usize) -> String {
        let id = if id.is_empty() {
            format!("hist_{turn}_{step}")
        } else {
            id
        };
        if self.0.insert(id.clone()) {
            return id;
        }
        let renamed = format!("{id}_t{turn}s{step}");
        self.0.insert(renamed.clone());
        renamed
    }
}

#[cfg(test)]
mod tests;
