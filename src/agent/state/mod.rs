//! Conversation state the way Cursor keeps it: content-addressed blobs held by the client, and a
//! checkpoint (`ConversationStateStructure`) referencing them. Pure, except for the small disk
//! cache; the run does the KV round trips (`set_blob_args` / `get_blob_args`) with this API.
//!
//! Ending a turn: [`encode_turn`] gives the turn's blobs (children first, the
//! `ConversationTurnStructure` last); [`build_checkpoint`] the next checkpoint plus the blobs it
//! references (todo items, a summary). Every blob must be acked before the checkpoint is sent.
//!
//! Starting a turn: [`HistoryBuilder`] rebuilds the provider history from the checkpoint Cursor
//! sends back, asking for blobs as it discovers them; [`BlobCache`] answers most of them without
//! a round trip. Turns written by Cursor's own servers are read too, so a conversation started
//! on an official model continues on the user's.
//!
//! Our replay data (exact tool-call records, provider extras) rides inside Cursor's
//! `ConversationStep` blobs as an unknown field ([`replay::REPLAY_FIELD`]), invisible to Cursor.

mod blob;
mod cache;
mod checkpoint;
mod error;
mod history;
pub mod replay;
mod subagent_runs;
mod summary;
mod turn_blobs;

pub use blob::{from_get_result, get_blob_args, id_from_bytes, verify, Blob, BlobId};
pub(crate) use cache::{BlobCache, DEFAULT_MAX_BYTES as DEFAULT_CACHE_MAX_BYTES};
pub use checkpoint::{build_checkpoint, decode_todo, summary_blob, Checkpoint};
pub use error::StateError;
pub(crate) use history::{HistoryBuilder, HistoryOptions, RebuiltHistory};
pub use subagent_runs::{background_subagents, record_completions, record_subagents};
pub(crate) use summary::{plan_compaction, summary_message, summary_prompt};
pub use turn_blobs::{
    encode_shell_turn, encode_step, encode_turn, EncodedTurn, StepRecord, TurnRecord,
};
