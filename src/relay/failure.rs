//! When something fails: a stream reset, a client protocol error, a peer that is gone. The
//! client always learns what happened (GOAWAY, RST_STREAM, or the 502 the hyper path gives).

use bytes::Bytes;

use super::conn::Relay;
use super::frame::{self, ConnError, Reason};
use super::hpack::Headers;
use super::peer::Side;
use super::stream::{Dir, Direction, Item, Stream};
use crate::upstream::UpstreamError;

/// Why a peer's connection ended.
pub(super) enum Fault {
    Closed(String),
    Protocol(ConnError),
}

impl From<ConnError> for Fault {
    fn from(e: ConnError) -> Self {
        Fault::Protocol(e)
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Closed(why) => f.write_str(why),
            Fault::Protocol(e) => write!(f, "protocol error: {e}"),
        }
    }
}

pub(super) fn io_fault(e: &std::io::Error) -> Fault {
    Fault::Closed(format!("connection failed: {e}"))
}

impl Relay {
    /// A stream error: both sides get RST_STREAM.
    pub(super) fn reset_stream(&mut self, id: u32, reason: Reason) {
        let Some(st) = self.remove(id) else {
            return;
        };
        for side in [Side::Client, st.target] {
            if let Some(peer) = self.peer(side) {
                frame::put_rst(&mut peer.out, id, reason);
            }
        }
    }

    /// Shutdown: no new streams; the connection closes when the last one ends.
    pub(super) fn drain(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        frame::put_goaway(&mut self.client.out, self.last_stream, Reason::NO_ERROR, "");
    }

    /// The client broke the protocol: GOAWAY with the reason, and close.
    pub(super) fn client_error(&mut self, e: ConnError) {
        tracing::debug!(error = %e, "client connection error");
        frame::put_goaway(&mut self.client.out, self.last_stream, e.reason, &e.what);
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(st) = self.remove(id) {
                if let Some(peer) = self.peer(st.target).filter(|_| st.target != Side::Client) {
                    frame::put_rst(&mut peer.out, id, Reason::CANCEL);
                }
            }
        }
        self.closing = true;
    }

    pub(super) fn peer_gone(&mut self, side: Side, fault: Fault) {
        match side {
            Side::Upstream => {
                let err = UpstreamError::Request {
                    host: self.host.clone(),
                    reason: fault.to_string(),
                };
                self.upstream_gone(err);
            }
            Side::Internal => {
                tracing::warn!(why = %fault, "connection to our own server ended");
                self.internal_server = None;
                if let Some(peer) = self.internal.take() {
                    for credit in peer.credits {
                        self.grant(credit.from, None, credit.len);
                    }
                }
                self.streams_lost(Side::Internal, None);
            }
            Side::Client => {}
        }
    }

    /// The origin failed (dial, I/O, protocol): streams it had not answered get the same
    /// 502 the hyper path gives; answered ones are reset. New streams go to our server.
    pub(super) fn upstream_gone(&mut self, err: UpstreamError) {
        let Some(peer) = self.upstream.take() else {
            return;
        };
        self.dial = None;
        let affected = self
            .streams
            .values()
            .filter(|st| st.target == Side::Upstream)
            .count();
        // Closed while idle (not a failed dial): the next passthrough stream redials.
        self.may_redial = affected == 0 && peer.io.is_some();
        if affected > 0 {
            tracing::warn!(side = ?err.side(), error = %err, streams = affected, "upstream connection failed");
        } else {
            tracing::debug!(error = %err, "upstream connection ended");
        }
        for credit in peer.credits {
            self.grant(credit.from, None, credit.len);
        }
        self.streams_lost(Side::Upstream, Some(&err));
    }

    fn streams_lost(&mut self, side: Side, err: Option<&UpstreamError>) {
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, st)| st.target == side)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(st) = self.remove(id) else {
                continue;
            };
            match err {
                Some(err) if !st.answered => self.answer_error(id, st, err),
                _ => {
                    frame::put_rst(&mut self.client.out, id, Reason::INTERNAL_ERROR);
                }
            }
        }
    }

    /// Answer a stream ourselves with the error the hyper path would give.
    fn answer_error(&mut self, id: u32, old: Stream, err: &UpstreamError) {
        let (status, content_type, body) = crate::upstream::error_parts(err, old.connect_style);
        let mut headers = Headers::default();
        headers.push(b":status", status.as_str().as_bytes());
        headers.push(b"content-type", content_type.as_bytes());
        headers.push(b"content-length", body.len().to_string().as_bytes());
        let mut down = Dir::new(old.down.send_window);
        down.ended_in = true;
        down.queue.push_back(Item::Headers {
            headers,
            end: false,
            input: 0,
        });
        down.queue.push_back(Item::Data {
            bytes: Bytes::from(body),
            end: true,
            raw: None,
            from: None,
        });
        if !old.up.ended_in {
            // The rest of the upload goes nowhere: tell the client once it has the answer,
            // or it stalls at its stream window (RFC 9113 §8.1).
            down.queue.push_back(Item::Reset(Reason::NO_ERROR));
        }
        let mut up = Dir::new(0);
        up.ended_in = true;
        up.ended_out = true;
        self.streams.insert(
            id,
            Stream {
                target: Side::Client,
                up,
                down,
                answered: true,
                connect_style: old.connect_style,
                discard_up: true,
            },
        );
        self.flush_dir(id, Direction::Down);
    }
}
