//! The KV channel: asking the client to store blobs (`set_blob_args`, acked) and to give them
//! back (`get_blob_args`).

use std::collections::HashMap;

use bytes::Bytes;

use super::{RunError, RunState};
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

    fn answered(&self, ids: &[u32]) -> bool {
        ids.iter()
            .all(|id| self.answers.get(id).is_some_and(Option::is_some))
    }

    fn take(&mut self, id: u32) -> Option<pb::kv_client_message::Message> {
        self.answers.remove(&id).flatten()
    }
}

impl RunState {
    /// Store `blobs` with the client and wait until every one is acknowledged. A checkpoint
    /// may only reference blobs the client has confirmed.
    pub(super) async fn store_blobs(&mut self, blobs: &[Blob]) -> Result<(), RunError> {
        let mut ids = Vec::with_capacity(blobs.len());
        for blob in blobs {
            let id = self.kv.open();
            self.out
                .send(msg::kv(id, KvOut::SetBlobArgs(blob.set_blob_args())))
                .await?;
            ids.push(id);
        }
        self.wait_kv(&ids, "acknowledging the conversation's blobs")
            .await?;
        for id in ids {
            if let Some(pb::kv_client_message::Message::SetBlobResult(r)) = self.kv.take(id) {
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

    /// Ask the client for blobs. `None` for one it does not have, or whose bytes do not hash
    /// to the id asked for.
    pub(super) async fn fetch_blobs(
        &mut self,
        wanted: &[BlobId],
    ) -> Result<Vec<(BlobId, Option<Bytes>)>, RunError> {
        let mut ids = Vec::with_capacity(wanted.len());
        for blob_id in wanted {
            let id = self.kv.open();
            self.out
                .send(msg::kv(
                    id,
                    KvOut::GetBlobArgs(state::get_blob_args(blob_id)),
                ))
                .await?;
            ids.push(id);
        }
        self.wait_kv(&ids, "sending the conversation's blobs")
            .await?;
        Ok(ids
            .into_iter()
            .zip(wanted)
            .map(|(id, blob_id)| {
                let data = match self.kv.take(id) {
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
            .collect())
    }

    async fn wait_kv(&mut self, ids: &[u32], what: &str) -> Result<(), RunError> {
        let timeout = self.run.settings.client_timeout;
        let mut deadline = tokio::time::Instant::now() + timeout;
        while !self.kv.answered(ids) {
            let ev = self.next_event(deadline, what).await?;
            let progress = matches!(&ev, super::ClientEvent::Kv(k) if ids.contains(&k.id));
            self.dispatch(Some(ev)).await?;
            if progress {
                deadline = tokio::time::Instant::now() + timeout;
            }
        }
        Ok(())
    }
}
