//! Building the `ConversationStateStructure` a turn ends with.
//!
//! In Cursor's checkpoint almost every `bytes` field is a blob id, not inline data: `turns[]`
//! are `ConversationTurnStructure` blobs, `todos[]` are `TodoItem` blobs and `summary` is a
//! `ConversationSummary` blob (that is how Cursor's client reads them back). So a checkpoint comes
//! with the blobs it references that the client may not have yet; they must be stored and acked
//! before the checkpoint is published.
//!
//! What goes back to Cursor starts from the previous checkpoint's bytes: only the fields the
//! proxy owns ([`OWNED_FIELDS`]) are replaced, so fields a newer Cursor added (and values this
//! build does not know) survive every turn on the user's model.

use bytes::Bytes;
use prost::Message as _;

use super::blob::{Blob, BlobId};
use super::replay::{self, SummaryReplay};
use crate::proto::agent::v1 as pb;

/// `ConversationStateStructure` fields a BYOK turn writes: todos (3), token_details (5),
/// summary (6), turns (8), mode (10), subagent_states (16), plans (20, a Build registers its
/// plan), subagent_runs_by_parent_tool_call_id (30). Every other field is Cursor's and passes
/// through.
pub(crate) const OWNED_FIELDS: &[u32] = &[3, 5, 6, 8, 10, 16, 20, 30];

/// A new checkpoint and the blobs it references that must be set (and acked) first, beyond the
/// turn's own blobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub state: pb::ConversationStateStructure,
    pub blobs: Vec<Blob>,
}

/// The checkpoint after a turn: the previous state with every field Cursor put there kept
/// (file states, plans, summaries…), `new_turn_id` appended to `turns`, the todo list replaced,
/// the token meter set and the mode updated when given.
///
/// `token_details` is replaced as a whole: a breakdown or usage snapshot left by Cursor's server
/// would describe another prompt and contradict the new totals.
pub fn build_checkpoint(
    prev: &pb::ConversationStateStructure,
    new_turn_id: &BlobId,
    todos: &[pb::TodoItem],
    used_tokens: u32,
    max_tokens: u32,
    mode: Option<i32>,
) -> Checkpoint {
    let mut state = prev.clone();
    let mut blobs = Vec::new();
    state.turns.push(bytes::Bytes::copy_from_slice(new_turn_id));
    state.todos = todos
        .iter()
        .map(|t| {
            let blob = Blob::from_message(t);
            let id = blob.id_bytes();
            // The client already holds what the previous checkpoint referenced.
            if !prev.todos.contains(&id) && !blobs.iter().any(|b: &Blob| b.id == blob.id) {
                blobs.push(blob);
            }
            id
        })
        .collect();
    state.token_details = Some(pb::ConversationTokenDetails {
        used_tokens,
        max_tokens,
        ..Default::default()
    });
    if let Some(mode) = mode {
        state.mode = Some(mode);
    }
    Checkpoint { state, blobs }
}

impl Checkpoint {
    /// Todos unchanged since the previous checkpoint keep their blob — Cursor's bytes, fields
    /// this build does not know included — instead of our re-encoding. `todos` is the list
    /// given to [`build_checkpoint`]; `known` the previous checkpoint's, decoded, with ids.
    pub(crate) fn keep_unchanged_todos(
        &mut self,
        todos: &[pb::TodoItem],
        known: &[(BlobId, pb::TodoItem)],
    ) {
        let mut replaced = Vec::new();
        for (slot, todo) in self.state.todos.iter_mut().zip(todos) {
            if let Some((id, _)) = known.iter().find(|(_, k)| k == todo) {
                replaced.push(std::mem::replace(slot, Bytes::copy_from_slice(id)));
            }
        }
        // Our re-encodings of those are no longer referenced: not stored.
        let todos = &self.state.todos;
        self.blobs.retain(|b| {
            let id = b.id_bytes();
            !replaced.contains(&id) || todos.contains(&id)
        });
    }

    /// The checkpoint as it goes to Cursor: `prev_wire` (the bytes `prev` was decoded from) with
    /// the owned fields that changed replaced. Input that does not scan as protobuf (it decoded,
    /// so this should not happen) falls back to our own encoding, with a warning.
    pub(crate) fn encode_over(
        &self,
        prev: &pb::ConversationStateStructure,
        prev_wire: &[u8],
    ) -> Bytes {
        match crate::proto::wire::update(prev_wire, prev, &self.state, OWNED_FIELDS) {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) => {
                tracing::warn!("previous checkpoint unreadable at the wire level ({e}); fields this build does not know are not kept");
                Bytes::from(self.state.encode_to_vec())
            }
        }
    }

    /// Record that `text` summarises every turn up to and including `through_turn`: a
    /// `ConversationSummary` blob (Cursor's own format, so its client shows it) referenced by
    /// `summary`, carrying our replay field so the next rebuild knows which turns it replaces.
    /// `turns` keeps every turn: Cursor's UI lists the whole conversation from it.
    pub(crate) fn set_summary(&mut self, text: &str, through_turn: &BlobId) {
        let blob = summary_blob(text, through_turn);
        self.state.summary = Some(blob.id_bytes());
        if !self.blobs.iter().any(|b| b.id == blob.id) {
            self.blobs.push(blob);
        }
    }
}

/// A `ConversationSummary` blob with our [`SummaryReplay`] appended.
pub fn summary_blob(text: &str, through_turn: &BlobId) -> Blob {
    let mut buf = pb::ConversationSummary {
        summary: text.to_string(),
    }
    .encode_to_vec();
    replay::append_json(
        &mut buf,
        &SummaryReplay {
            through_turn: hex::encode(through_turn),
        },
    );
    Blob::new(buf)
}

/// Decode a `TodoItem` blob; `None` when it is not one.
pub fn decode_todo(data: &[u8]) -> Option<pb::TodoItem> {
    pb::TodoItem::decode(data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn todo(id: &str, status: pb::TodoStatus) -> pb::TodoItem {
        pb::TodoItem {
            id: id.into(),
            content: format!("do {id}"),
            status: status as i32,
            ..Default::default()
        }
    }

    #[test]
    fn keeps_previous_fields_and_appends_the_turn() {
        let prev = pb::ConversationStateStructure {
            turns: vec![Bytes::from_static(&[1; 32])],
            summary: Some(Bytes::from_static(&[9; 32])),
            file_states: [("a.rs".to_string(), Bytes::from_static(&[7; 32]))].into(),
            read_paths: vec!["/p/a.rs".into()],
            mode: Some(pb::AgentMode::Agent as i32),
            todos: vec![Blob::from_message(&todo("1", pb::TodoStatus::Pending)).id_bytes()],
            token_details: Some(pb::ConversationTokenDetails {
                used_tokens: 1,
                max_tokens: 2,
                prompt_context_usage_snapshot_blob_id: Some(Bytes::from_static(&[3; 32])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let todos = [
            todo("1", pb::TodoStatus::Pending),
            todo("2", pb::TodoStatus::InProgress),
        ];
        let cp = build_checkpoint(
            &prev,
            &[2; 32],
            &todos,
            1500,
            200_000,
            Some(pb::AgentMode::Plan as i32),
        );
        let s = &cp.state;
        assert_eq!(s.turns.len(), 2);
        assert_eq!(s.turns[1].as_ref(), &[2; 32]);
        assert_eq!(s.summary, prev.summary);
        assert_eq!(s.file_states, prev.file_states);
        assert_eq!(s.read_paths, prev.read_paths);
        assert_eq!(s.mode, Some(pb::AgentMode::Plan as i32));
        assert_eq!(
            s.token_details,
            Some(pb::ConversationTokenDetails {
                used_tokens: 1500,
                max_tokens: 200_000,
                ..Default::default()
            })
        );
        // Todos are blob ids; only the new one needs storing.
        assert_eq!(s.todos.len(), 2);
        assert_eq!(cp.blobs.len(), 1);
        assert_eq!(s.todos[1], cp.blobs[0].id_bytes());
        assert_eq!(decode_todo(&cp.blobs[0].data), Some(todos[1].clone()));
        // The checkpoint survives the wire.
        let back = pb::ConversationStateStructure::decode(s.encode_to_vec().as_slice()).unwrap();
        assert_eq!(&back, s);

        let cp = build_checkpoint(&prev, &[2; 32], &[], 0, 0, None);
        assert_eq!(cp.state.mode, prev.mode);
        assert!(cp.state.todos.is_empty());
    }

    /// A protobuf field the schema does not have: `number` with `data` as its bytes.
    fn unknown(number: u32, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, &mut v);
        prost::encoding::encode_varint(data.len() as u64, &mut v);
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn unknown_fields_and_values_survive_a_turn() {
        let prev = pb::ConversationStateStructure {
            turns: vec![Bytes::from_static(&[1; 32])],
            plan: Some(Bytes::from_static(&[4; 32])),
            read_paths: vec!["/p/a.rs".into()],
            mode: Some(99), // a mode this build does not know
            ..Default::default()
        };
        let mut wire = prev.encode_to_vec();
        let extra = [
            unknown(200, b"opaque"),
            unknown(201, &unknown(1, b"nested")),
        ]
        .concat();
        wire.extend_from_slice(&extra);
        let prev = pb::ConversationStateStructure::decode(wire.as_slice()).unwrap();
        let cp = build_checkpoint(&prev, &[2; 32], &[], 10, 100, None);
        let out = cp.encode_over(&prev, &wire);
        assert!(out.windows(extra.len()).any(|w| w == extra));
        let back = pb::ConversationStateStructure::decode(out.clone()).unwrap();
        assert_eq!(back, cp.state);
        assert_eq!(back.mode, Some(99));
        assert_eq!(back.plan, prev.plan);
        // Unchanged fields keep their place; only what changed moved to the end.
        let numbers: Vec<u32> = crate::proto::wire::fields(&out)
            .map(|f| f.unwrap().number)
            .collect();
        assert_eq!(numbers, [7, 10, 18, 200, 201, 5, 8, 8]);
        // Garbage in: our own encoding, no panic.
        assert_eq!(cp.encode_over(&prev, &[0xff]), cp.state.encode_to_vec());
    }

    #[test]
    fn unchanged_todos_keep_cursors_blob() {
        let kept = todo("1", pb::TodoStatus::Pending);
        // Cursor's blob for it carries a field this build does not know.
        let cursors = Blob::new([kept.encode_to_vec(), unknown(99, b"new")].concat());
        let known = [(cursors.id, kept.clone())];
        let prev = pb::ConversationStateStructure {
            todos: vec![cursors.id_bytes()],
            ..Default::default()
        };
        let todos = [kept, todo("2", pb::TodoStatus::InProgress)];
        let mut cp = build_checkpoint(&prev, &[2; 32], &todos, 0, 0, None);
        cp.keep_unchanged_todos(&todos, &known);
        assert_eq!(cp.state.todos[0], cursors.id_bytes());
        assert_eq!(cp.blobs.len(), 1, "only the new todo needs storing");
        assert_eq!(cp.state.todos[1], cp.blobs[0].id_bytes());
    }

    #[test]
    fn summary_is_a_cursor_summary_blob_with_our_range() {
        let mut cp = build_checkpoint(&Default::default(), &[2; 32], &[], 0, 0, None);
        cp.set_summary("we did things", &[1; 32]);
        let blob = cp.blobs.last().unwrap();
        assert_eq!(cp.state.summary, Some(blob.id_bytes()));
        let s = pb::ConversationSummary::decode(blob.data.clone()).unwrap();
        assert_eq!(s.summary, "we did things");
        let r: SummaryReplay = replay::extract_json(&blob.data).unwrap();
        assert_eq!(r.through_turn, hex::encode([1; 32]));
    }
}
