//! The KV channel: asking the client to store blobs (`set_blob_args`, acked) and to give them
//! back (`get_blob_args`).

use std::collections::HashMap;

use bytes::Bytes;

use super::error::RunError;
use crate::agent::messages as msg;
use crate::agent::state::{self, Blob, BlobId};
use crate::proto::agent::v1 as pb;
use pb::kv_server_message::Message as KvOut;

/// KV ids in flight and their answers.
#[derive(Debug)]
pub(super) struct KvBridge {
    next_id: u32,
    answers: HashMap<u32, Option<pb::kv_client_message::Message>>,
}

impl Default for KvBridge {
    fn default() -> Self {
        KvBridge {
            next_id: 1,
            answers: HashMap::new(),
        }
    }
}

impl KvBridge {
    fn open(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.answers.insert(id, None);
        id
    }

    pub(super) fn on_message(&mut self, m: pb::KvClientMessage) {
        if let Some(slot) = self.answers.get_mut(&m.id) {
            *slot = m.message;
        } else {
            tracing::debug!(id = m.id, "kv answer for no request of ours");
        }
    }

    pub(super) fn answered(&self, ids: &[u32]) -> bool {
        ids.iter()
            .all(|id| self.answers.get(id).is_some_and(Option::is_some))
    }

    fn take(&mut self, id: u32) -> Option<pb::kv_client_message::Message> {
        self.answers.remove(&id).flatten()
    }

    /// Ask the client to store `blob`: the message to send, and the id its ack comes under.
    pub(super) fn store(&mut self, blob: &Blob) -> (u32, pb::AgentServerMessage) {
        let id = self.open();
        (id, msg::kv(id, KvOut::SetBlobArgs(blob.set_blob_args())))
    }

    /// Ask the client for the blob `blob_id`: the message to send, and the id its answer comes
    /// under.
    pub(super) fn fetch(&mut self, blob_id: &BlobId) -> (u32, pb::AgentServerMessage) {
        let id = self.open();
        (
            id,
            msg::kv(id, KvOut::GetBlobArgs(state::get_blob_args(blob_id))),
        )
    }

    /// The acks of stores `ids`, once all have answered: the first failure, if any.
    pub(super) fn stored(&mut self, ids: Vec<u32>) -> Result<(), RunError> {
        for id in ids {
            if let Some(pb::kv_client_message::Message::SetBlobResult(r)) = self.take(id) {
                if let Some(err) = r.error {
                    return Err(RunError::ClientFailed {
                        what: "storing the conversation".into(),
                        message: format!("{err:?}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The answers to fetches `ids` of `wanted`, once all have answered. `None` for a blob the
    /// client does not have, or whose bytes do not hash to the id asked for.
    pub(super) fn fetched(
        &mut self,
        ids: Vec<u32>,
        wanted: &[BlobId],
    ) -> Vec<(BlobId, Option<Bytes>)> {
        ids.into_iter()
            .zip(wanted)
            .map(|(id, blob_id)| {
                let data = match self.take(id) {
                    Some(pb::kv_client_message::Message::GetBlobResult(r)) => {
                        state::from_get_result(blob_id, &r).unwrap_or_else(|e| {
                            tracing::warn!("{e}");
                            None
                        })
                    }
                    _ => None,
                };
                (*blob_id, data)
            })
            .collect()
    }
}
