//! Cursor's own runs on the agent WebSocket. A client socket carries several runs; those
//! decided Cursor's go to Cursor's server over one upstream WebSocket (`ws_upstream`), opened
//! for the first of them, carrying the client's `Hello`, each run's held `RunStart` and its
//! frames byte for byte (never re-encoded: unknown fields stay). What comes back for those
//! runs goes to the client unchanged; the upstream's `Hello` is dropped (the client had ours
//! when it said hello) and so is any frame for a run id that is not one of Cursor's runs here.
//!
//! Only a run id decided Cursor's ever sends a frame up. When the upstream ends, each of
//! Cursor's runs ends with `RunEnd` (`unavailable`, naming Cursor's server) once it was
//! accepted, else with `RunRejected`; a refused upgrade maps its HTTP status to a Connect code.
//! Runs of ours on the same socket never notice. The next run of Cursor's opens a new link.

use std::collections::HashMap;

use bytes::Bytes;
use tokio::sync::mpsc::error::TrySendError;
use tracing::debug;

use super::ws_frames::{self, Identity, ServerKind};
use super::ws_upstream::{self, Link, Target, UpEvent, UP_FRAMES};
use crate::connect::Code;

/// One of Cursor's runs on this socket.
struct CursorRun {
    id: Identity,
    /// Cursor's server sent its `RunAccepted` (a failure is then a `RunEnd`).
    accepted: bool,
}

/// Cursor's runs on one client socket and their upstream link.
pub(super) struct CursorRuns {
    target: Target,
    /// The client's `Hello`, as it came: the first frame on every link.
    hello: Option<Bytes>,
    runs: HashMap<String, CursorRun>,
    link: Option<Link>,
}

impl CursorRuns {
    pub(super) fn new(target: Target) -> Self {
        CursorRuns {
            target,
            hello: None,
            runs: HashMap::new(),
            link: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.runs.len()
    }

    pub(super) fn has(&self, run_id: &str) -> bool {
        self.runs.contains_key(run_id)
    }

    pub(super) fn hello(&mut self, raw: Bytes) {
        self.hello = Some(raw);
    }

    /// One of Cursor's runs begins: its held `RunStart` (when it had one) and its first
    /// message go up. Returns frames for the client.
    pub(super) fn start(&mut self, id: Identity, start: Option<Bytes>, first: Bytes) -> Vec<Bytes> {
        let run_id = id.run_id.clone();
        self.runs.insert(
            run_id.clone(),
            CursorRun {
                id,
                accepted: false,
            },
        );
        if self.link.is_none() {
            debug!(run_id, "agent WebSocket: opening Cursor's upstream");
            let link = ws_upstream::open(self.target.clone());
            self.link = Some(link);
            if let Some(hello) = self.hello.clone() {
                if let Some(out) = self.up(hello) {
                    return out;
                }
            }
        }
        if let Some(out) = start.and_then(|s| self.up(s)) {
            return out;
        }
        self.up(first).unwrap_or_default()
    }

    /// A later frame of one of Cursor's runs (a message, `HalfClose`, `CancelRun`) goes up as
    /// it came. Returns frames for the client.
    pub(super) fn forward(&mut self, raw: Bytes) -> Vec<Bytes> {
        self.up(raw).unwrap_or_default()
    }

    /// The next event of the link; pending for ever while there is none.
    pub(super) async fn next_event(&mut self) -> Option<UpEvent> {
        match self.link.as_mut() {
            Some(link) => link.events.recv().await,
            None => std::future::pending().await,
        }
    }

    /// What the client gets for one event of the link (`None`: the link's task ended).
    pub(super) fn on_event(&mut self, event: Option<UpEvent>) -> Vec<Bytes> {
        match event {
            Some(UpEvent::Frame(frame)) => self.down(frame).into_iter().collect(),
            Some(UpEvent::Refused(status)) => {
                let code = Code::from_http_status(status.as_u16());
                let why = format!(
                    "Cursor's server (upstream) refused the agent WebSocket: HTTP {}",
                    status.as_u16()
                );
                self.end_all(code, &why)
            }
            Some(UpEvent::Ended(why)) => self.end_all(Code::Unavailable, &why),
            None => self.end_all(
                Code::Unavailable,
                "the agent WebSocket to Cursor's server (upstream) ended",
            ),
        }
    }

    /// Send `frame` up; on a full queue or a gone link, Cursor's runs end here and the link
    /// closes (returns the client's frames then).
    fn up(&mut self, frame: Bytes) -> Option<Vec<Bytes>> {
        let link = self.link.as_ref()?;
        match link.up.try_send(frame) {
            Ok(()) => None,
            // Its task ended: the event saying why is on its way.
            Err(TrySendError::Closed(_)) => None,
            Err(TrySendError::Full(_)) => Some(self.end_all(
                Code::Unavailable,
                &format!(
                    "Cursor's server (upstream) is not reading the agent WebSocket: more than \
                     {UP_FRAMES} frames waited for it"
                ),
            )),
        }
    }

    /// A frame from Cursor's server: passed on unchanged when it is for one of Cursor's runs
    /// here, else dropped.
    fn down(&mut self, frame: Bytes) -> Option<Bytes> {
        let read = match ws_frames::decode_server(&frame) {
            Ok(read) => read,
            Err(e) => {
                debug!(error = %e, "agent WebSocket: unreadable frame from Cursor's server dropped");
                return None;
            }
        };
        if read.kind == ServerKind::Hello {
            return None;
        }
        let Some(run) = self.runs.get_mut(&read.run_id) else {
            debug!(run_id = read.run_id, kind = ?read.kind, "agent WebSocket: frame from Cursor's server for no run of Cursor's here dropped");
            return None;
        };
        match read.kind {
            ServerKind::RunAccepted => run.accepted = true,
            ServerKind::RunEnd | ServerKind::RunRejected => {
                self.runs.remove(&read.run_id);
            }
            _ => {}
        }
        Some(frame)
    }

    /// The link is gone: each of Cursor's runs ends, saying why; the next run opens a new one.
    fn end_all(&mut self, code: Code, why: &str) -> Vec<Bytes> {
        self.link = None;
        self.runs
            .drain()
            .map(|(_, run)| {
                Bytes::from(if run.accepted {
                    ws_frames::run_end(&run.id, Some((code, why)))
                } else {
                    ws_frames::run_rejected(&run.id, code, why)
                })
            })
            .collect()
    }
}
