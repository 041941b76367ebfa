//! Whose a conversation is, for the side calls: the one adapter between them and the
//! conversation pin store. Everything in `side` asks through [`owner_of`] and [`mark_ours`].

use crate::agent::transport::{AgentTransports, Decision};

/// A conversation's owner as far as the pins know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Owner {
    /// It had a turn on one of our models (this one, as Cursor names it).
    Ours { model_id: String },
    /// Its runs went to Cursor.
    Cursor,
    /// No run of it was seen (yet).
    Unknown,
}

/// Whose `conversation_id` is.
pub(super) fn owner_of(t: &AgentTransports, conversation_id: &str) -> Owner {
    if conversation_id.is_empty() {
        return Owner::Unknown;
    }
    match t.conversation_decision(conversation_id) {
        Some(Decision::Ours { model_id }) => Owner::Ours { model_id },
        Some(Decision::Relay) => Owner::Cursor,
        None => Owner::Unknown,
    }
}

/// Mark `conversation_id` as ours on `model_id` (a fork of one of ours, before its blobs).
pub(super) fn mark_ours(t: &AgentTransports, conversation_id: &str, model_id: &str) {
    t.pin_conversation(
        conversation_id,
        Decision::Ours {
            model_id: model_id.to_string(),
        },
    );
}

/// Mark `conversation_id` as Cursor's (a fork of one of Cursor's).
pub(super) fn mark_cursor(t: &AgentTransports, conversation_id: &str) {
    t.pin_conversation(conversation_id, Decision::Relay);
}
