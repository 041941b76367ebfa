//! Content-addressed blobs: the id of a blob is the SHA-256 of its bytes (Cursor's convention).

use bytes::Bytes;

use super::error::StateError;
pub use crate::agent::blob_id::{id_from_bytes, verify, BlobId};
use crate::proto::agent::v1 as pb;

/// Immutable bytes plus their id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub id: BlobId,
    pub data: Bytes,
}

impl Blob {
    /// Wrap bytes, computing their id.
    pub fn new(data: impl Into<Bytes>) -> Blob {
        let data = data.into();
        Blob {
            id: crate::proto::blob_id(&data),
            data,
        }
    }

    /// Encode a protobuf message as a blob.
    pub(crate) fn from_message(m: &impl prost::Message) -> Blob {
        Blob::new(m.encode_to_vec())
    }

    /// Lowercase hex of the id, for logs and file names.
    pub(crate) fn hex_id(&self) -> String {
        hex::encode(self.id)
    }

    /// The id as the protobuf `bytes` Cursor's messages carry.
    pub(crate) fn id_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(&self.id)
    }

    /// The KV request asking the client to store this blob.
    pub(crate) fn set_blob_args(&self) -> pb::SetBlobArgs {
        pb::SetBlobArgs {
            blob_id: self.id_bytes(),
            blob_data: self.data.clone(),
        }
    }
}

/// The KV request asking the client for one blob.
pub fn get_blob_args(id: &BlobId) -> pb::GetBlobArgs {
    pb::GetBlobArgs {
        blob_id: Bytes::copy_from_slice(id),
    }
}

/// Interpret the client's answer to `get_blob_args(id)`.
///
/// `Ok(None)` when the client does not have it (it answers unknown ids with an empty result,
/// or with an error); `Err` when it sent bytes that are not the blob asked for.
pub fn from_get_result(
    id: &BlobId,
    result: &pb::GetBlobResult,
) -> Result<Option<Bytes>, StateError> {
    match &result.blob_data {
        // An empty payload is "not found" too (unless the blob really is empty).
        Some(data) if result.error.is_none() && (!data.is_empty() || verify(id, data)) => {
            if verify(id, data) {
                Ok(Some(data.clone()))
            } else {
                Err(StateError::BlobIdMismatch {
                    id: hex::encode(id),
                })
            }
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    #[test]
    fn id_is_sha256() {
        let b = Blob::new(Bytes::from_static(b"hello"));
        let expected: [u8; 32] = sha2::Sha256::digest(b"hello").into();
        assert_eq!(b.id, expected);
        assert_eq!(
            b.hex_id(),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(verify(&b.id, b"hello"));
        assert!(!verify(&b.id, b"hello!"));
        assert!(!verify(&b.id[..31], b"hello"));
        let args = b.set_blob_args();
        assert_eq!(args.blob_id.as_ref(), b.id.as_slice());
        assert_eq!(args.blob_data.as_ref(), b"hello");
    }

    #[test]
    fn get_results_are_verified() {
        let b = Blob::new(Bytes::from_static(b"data"));
        let ok = pb::GetBlobResult {
            blob_data: Some(b.data.clone()),
            error: None,
        };
        assert_eq!(from_get_result(&b.id, &ok).unwrap(), Some(b.data.clone()));
        let empty = pb::GetBlobResult::default();
        assert_eq!(from_get_result(&b.id, &empty).unwrap(), None);
        let empty = pb::GetBlobResult {
            blob_data: Some(Bytes::new()),
            error: None,
        };
        assert_eq!(from_get_result(&b.id, &empty).unwrap(), None);
        let failed = pb::GetBlobResult {
            blob_data: None,
            error: Some(pb::Error {
                message: "no such blob".into(),
            }),
        };
        assert_eq!(from_get_result(&b.id, &failed).unwrap(), None);
        let wrong = pb::GetBlobResult {
            blob_data: Some(Bytes::from_static(b"other")),
            error: None,
        };
        assert!(matches!(
            from_get_result(&b.id, &wrong),
            Err(StateError::BlobIdMismatch { .. })
        ));
        assert_eq!(id_from_bytes(&b.id), Some(b.id));
        assert_eq!(id_from_bytes(b"short"), None);
    }
}
