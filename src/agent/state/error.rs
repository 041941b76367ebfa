//! Errors of the state layer. None of them is about I/O to the client: the run owns the KV round
//! trips and reports their failures itself.

/// What went wrong while reading or rebuilding conversation state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A blob's bytes do not hash to the id it was supplied for (the client does not verify
    /// ids, so we must).
    #[error("blob {id} does not match its SHA-256 id")]
    BlobIdMismatch { id: String },
    /// A blob that should hold `what` does not decode as one.
    #[error("blob {id} is not a valid {what}")]
    Undecodable { what: &'static str, id: String },
    /// The history does not fit in `max` bytes even after dropping every older turn.
    #[error("the conversation history needs {bytes} bytes, more than the {max}-byte limit (limits.max_history_bytes)")]
    HistoryTooLarge { bytes: u64, max: u64 },
    /// `finish` was called while blobs were still missing.
    #[error("the conversation history is incomplete: {missing} blob(s) were neither supplied nor marked unavailable")]
    Incomplete { missing: usize },
}
