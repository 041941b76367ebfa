//! When something fails: a client protocol error, a peer that is gone. The client always
//! learns what happened (GOAWAY, RST_STREAM, or the 502 the hyper path gives).

use bytes::Bytes;

use super::common::{Conn, Direction};
use super::flow::Flow;
use super::frame::{self, ConnError, Reason};
use super::hpack::Headers;
use super::stream::{Data, Half, Item, Stream};
use crate::upstream::UpstreamError;

/// The client broke the protocol: GOAWAY with the reason, and every stream cancelled.
pub(super) fn client_error(flow: &mut Flow, e: &ConnError) {
    tracing::debug!(error = %e, "client connection error");
    frame::put_goaway(
        flow.peers.client.out.buf(),
        flow.last_stream,
        e.reason,
        &e.what,
    );
    let ids: Vec<u32> = flow.streams.keys().copied().collect();
    for id in ids {
        if let Some(st) = flow.remove(id) {
            let target = flow.peers.get_mut(st.target);
            if let Some(peer) = target.filter(|_| st.target != Conn::Client) {
                frame::put_rst(peer.out.buf(), id, Reason::CANCEL);
            }
        }
    }
}

/// Our own server's connection ended: its streams are reset.
pub(super) fn internal_gone(flow: &mut Flow) {
    if let Some(peer) = flow.peers.internal.take() {
        flow.release_credits(peer);
    }
    streams_lost(flow, Conn::Internal, None);
}

/// The origin failed (dial, I/O, protocol): streams it had not answered get the same 502
/// the hyper path gives; answered ones are reset. New streams go to our server. `None` if
/// it was gone already, else whether it closed while idle (not a failed dial).
pub(super) fn upstream_gone(flow: &mut Flow, err: &UpstreamError) -> Option<bool> {
    let peer = flow.peers.upstream.take()?;
    let affected = flow
        .streams
        .values()
        .filter(|st| st.target == Conn::Upstream)
        .count();
    let idle = affected == 0 && peer.connected;
    if affected > 0 {
        tracing::warn!(side = ?err.side(), error = %err, streams = affected, "upstream connection failed");
    } else {
        tracing::debug!(error = %err, "upstream connection ended");
    }
    flow.release_credits(peer);
    streams_lost(flow, Conn::Upstream, Some(err));
    Some(idle)
}

fn streams_lost(flow: &mut Flow, side: Conn, err: Option<&UpstreamError>) {
    let ids: Vec<u32> = flow
        .streams
        .iter()
        .filter(|(_, st)| st.target == side)
        .map(|(id, _)| *id)
        .collect();
    for id in ids {
        let Some(st) = flow.remove(id) else {
            continue;
        };
        match err {
            Some(err) if !st.answered => answer_error(flow, id, st, err),
            _ => {
                frame::put_rst(flow.peers.client.out.buf(), id, Reason::INTERNAL_ERROR);
            }
        }
    }
}

/// Answer a stream ourselves with the error the hyper path would give.
fn answer_error(flow: &mut Flow, id: u32, old: Stream, err: &UpstreamError) {
    let (status, content_type, body) = crate::upstream::error_parts(err, old.connect_style);
    let mut headers = Headers::default();
    headers.push(b":status", status.as_str().as_bytes());
    headers.push(b"content-type", content_type.as_bytes());
    headers.push(b"content-length", body.len().to_string().as_bytes());
    let mut down = Half::new(old.down.send_window);
    down.ended_in = true;
    down.queue.push_back(Item::Headers {
        headers,
        end: false,
        input: 0,
    });
    down.queue.push_back(Item::Data(Data {
        bytes: Bytes::from(body),
        end: true,
        raw: None,
        from: None,
    }));
    if !old.up.ended_in {
        // The rest of the upload goes nowhere: tell the client once it has the answer, or
        // it stalls at its stream window (RFC 9113 §8.1).
        down.queue.push_back(Item::Reset(Reason::NO_ERROR));
    }
    let mut up = Half::new(0);
    up.ended_in = true;
    up.ended_out = true;
    flow.streams.insert(
        id,
        Stream {
            target: Conn::Client,
            up,
            down,
            answered: true,
            connect_style: old.connect_style,
            discard_up: true,
        },
    );
    flow.flush_dir(id, Direction::Down);
}
