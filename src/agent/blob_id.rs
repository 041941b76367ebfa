//! Blob ids: the id of a blob is the SHA-256 of its bytes (Cursor's convention). The word the
//! conversation's state and the context Cursor sends share, below both.

/// A blob id: SHA-256 of the blob's bytes.
pub type BlobId = [u8; 32];

/// Whether `data` hashes to `id`. An id of the wrong length never matches.
pub fn verify(id: &[u8], data: &[u8]) -> bool {
    id == crate::proto::blob_id(data).as_slice()
}

/// A protobuf `bytes` id as a [`BlobId`]; `None` unless it is exactly 32 bytes.
pub fn id_from_bytes(b: &[u8]) -> Option<BlobId> {
    b.try_into().ok()
}
