//! Text and token deltas already queued one behind the other, merged into one of each: Cursor's
//! client appends a `text_delta` to the answer and adds a `token_delta` to its count, so a run of
//! them reads the same as one text delta with the texts joined and one token delta with the
//! counts summed. A fast model's deltas then cost one message each way instead of two per delta.
//!
//! Only plain deltas merge: a notice, a message with any other field set, or one sent as exact
//! bytes (`RunOutput::Encoded`) ends the run of deltas and keeps its place.

use tokio::sync::mpsc;

use crate::agent::messages as msg;
use crate::agent::RunOutput;
use crate::proto::agent::v1 as pb;
use pb::agent_server_message::Message as Server;
use pb::interaction_update::Message as Update;

/// The deltas of one run taken so far.
#[derive(Debug, Default)]
pub(super) struct Deltas {
    text: Option<String>,
    tokens: Option<i32>,
}

impl Deltas {
    /// Take `out` if it is a plain text or token delta; otherwise hand it back.
    pub(super) fn take(&mut self, out: RunOutput) -> Result<(), RunOutput> {
        let RunOutput::Message(mut m) = out else {
            return Err(out);
        };
        match plain_delta(&mut m) {
            Some(Update::TextDelta(t)) => match &mut self.text {
                Some(text) => text.push_str(&t.text),
                None => self.text = Some(std::mem::take(&mut t.text)),
            },
            Some(Update::TokenDelta(t)) => {
                let sum = self.tokens.unwrap_or(0).saturating_add(t.tokens);
                self.tokens = Some(sum);
            }
            _ => return Err(RunOutput::Message(m)),
        }
        Ok(())
    }

    /// Bytes of text held.
    pub(super) fn text_len(&self) -> usize {
        self.text.as_ref().map_or(0, String::len)
    }

    /// The merged messages, the text before the count; the deltas are empty after.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = RunOutput> {
        let text = self.text.take().map(msg::text_delta);
        let tokens = self.tokens.take().map(token_delta);
        text.into_iter()
            .chain(tokens)
            .map(|m| RunOutput::Message(Box::new(m)))
    }
}

/// At most this many outputs are taken into one [`burst`]: a run that keeps its channel full
/// (on another worker thread) cannot hold the taker in one burst for ever.
const BURST_OUTPUTS: usize = 256;

/// `first` and the outputs already queued behind it on `rx`, each run of deltas merged, in
/// order. Never waits. Stops after an end, once the merged text reaches `max_text` bytes, or
/// after [`BURST_OUTPUTS`] outputs.
pub(super) fn burst(
    first: RunOutput,
    rx: &mut mpsc::Receiver<RunOutput>,
    max_text: usize,
) -> Vec<RunOutput> {
    let mut outs = Vec::new();
    let mut deltas = Deltas::default();
    let mut next = Some(first);
    let mut taken = 0;
    while let Some(out) = next.take() {
        taken += 1;
        if let Err(other) = deltas.take(out) {
            let end = matches!(other, RunOutput::End(_));
            outs.extend(deltas.drain());
            outs.push(other);
            if end {
                break;
            }
        }
        if deltas.text_len() >= max_text || taken >= BURST_OUTPUTS {
            break;
        }
        next = rx.try_recv().ok();
    }
    outs.extend(deltas.drain());
    outs
}

/// The delta `m` is, when nothing else is set on it.
fn plain_delta(m: &mut pb::AgentServerMessage) -> Option<&mut Update> {
    if m.ttft_breakdown.is_some() {
        return None;
    }
    let Some(Server::InteractionUpdate(u)) = &mut m.message else {
        return None;
    };
    if u.message_started_at_ms.is_some() {
        return None;
    }
    match &mut u.message {
        Some(
            d @ Update::TextDelta(pb::TextDeltaUpdate {
                is_server_notice: false,
                ..
            }),
        ) => Some(d),
        Some(d @ Update::TokenDelta(_)) => Some(d),
        _ => None,
    }
}

fn token_delta(tokens: i32) -> pb::AgentServerMessage {
    msg::update(Update::TokenDelta(pb::TokenDeltaUpdate { tokens }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::EndStream;

    fn text(t: &str) -> RunOutput {
        RunOutput::Message(Box::new(msg::text_delta(t.into())))
    }

    fn tokens(n: i32) -> RunOutput {
        RunOutput::Message(Box::new(token_delta(n)))
    }

    fn update_of(out: &RunOutput) -> Option<&Update> {
        match &out.message()?.message {
            Some(Server::InteractionUpdate(u)) => u.message.as_ref(),
            _ => None,
        }
    }

    #[test]
    fn pairs_merge_into_one_text_and_one_summed_count() {
        let mut d = Deltas::default();
        for (t, n) in [("Hel", 1), ("lo, ", 2), ("world", 3)] {
            d.take(text(t)).unwrap();
            d.take(tokens(n)).unwrap();
        }
        assert_eq!(d.text_len(), "Hello, world".len());
        let merged: Vec<_> = d.drain().collect();
        assert_eq!(merged.len(), 2);
        assert!(matches!(
            update_of(&merged[0]),
            Some(Update::TextDelta(t)) if t.text == "Hello, world" && !t.is_server_notice
        ));
        assert!(matches!(
            update_of(&merged[1]),
            Some(Update::TokenDelta(t)) if t.tokens == 6
        ));
        assert_eq!(d.drain().count(), 0, "drained deltas are gone");
    }

    #[test]
    fn counts_saturate_and_a_lone_kind_stays_alone() {
        let mut d = Deltas::default();
        d.take(tokens(i32::MAX)).unwrap();
        d.take(tokens(5)).unwrap();
        let merged: Vec<_> = d.drain().collect();
        assert_eq!(merged.len(), 1);
        assert!(matches!(
            update_of(&merged[0]),
            Some(Update::TokenDelta(t)) if t.tokens == i32::MAX
        ));
    }

    #[test]
    fn anything_but_a_plain_delta_is_handed_back_whole() {
        let mut d = Deltas::default();
        let notice = RunOutput::Message(Box::new(msg::notice("limit".into())));
        let mut stamped = msg::text_delta("x".into());
        if let Some(Server::InteractionUpdate(u)) = &mut stamped.message {
            u.message_started_at_ms = Some(7);
        }
        let mut timed = msg::text_delta("y".into());
        timed.ttft_breakdown = Some(Default::default());
        let encoded = RunOutput::Encoded(Box::new(msg::text_delta("z".into())), Default::default());
        for out in [
            notice,
            RunOutput::Message(Box::new(stamped)),
            RunOutput::Message(Box::new(timed)),
            RunOutput::Message(Box::new(msg::heartbeat())),
            encoded,
            RunOutput::End(EndStream::ok()),
        ] {
            let back = d.take(out).expect_err("not a plain delta");
            assert!(!matches!(
                update_of(&back),
                Some(Update::TextDelta(t)) if t.text.is_empty()
            ));
        }
        assert_eq!(d.drain().count(), 0);
    }

    #[tokio::test]
    async fn a_burst_merges_what_is_queued_and_stops_at_the_end() {
        let (tx, mut rx) = mpsc::channel(16);
        for out in [
            tokens(1),
            text("b"),
            tokens(2),
            RunOutput::Message(Box::new(msg::heartbeat())),
            text("c"),
            RunOutput::End(EndStream::ok()),
            text("after the end"),
        ] {
            tx.send(out).await.unwrap();
        }
        let outs = burst(text("a"), &mut rx, 1024);
        let kinds: Vec<String> = outs
            .iter()
            .map(|o| match update_of(o) {
                Some(Update::TextDelta(t)) => format!("text:{}", t.text),
                Some(Update::TokenDelta(t)) => format!("tokens:{}", t.tokens),
                _ if matches!(o, RunOutput::End(_)) => "end".into(),
                _ => "other".into(),
            })
            .collect();
        assert_eq!(kinds, ["text:ab", "tokens:3", "other", "text:c", "end"]);
        assert!(rx.try_recv().is_ok(), "what follows the end stays queued");
        // Alone, the first goes back at once; merged text stops at its bound.
        assert_eq!(burst(text("x"), &mut rx, 1024).len(), 1);
        for _ in 0..4 {
            tx.send(text("yy")).await.unwrap();
        }
        let outs = burst(text("yy"), &mut rx, 4);
        assert!(matches!(update_of(&outs[0]), Some(Update::TextDelta(t)) if t.text == "yyyy"));
        let left = std::iter::from_fn(|| rx.try_recv().ok()).count();
        assert_eq!(left, 3, "the rest waits for the next burst");
    }

    /// Tokens alone never reach the text bound: the output count stops the burst.
    #[tokio::test]
    async fn a_burst_takes_at_most_its_output_bound() {
        let queued = BURST_OUTPUTS + 10;
        let (tx, mut rx) = mpsc::channel(queued);
        for _ in 0..queued {
            tx.send(tokens(1)).await.unwrap();
        }
        let outs = burst(tokens(1), &mut rx, 1024);
        assert_eq!(outs.len(), 1);
        assert!(matches!(
            update_of(&outs[0]),
            Some(Update::TokenDelta(t)) if t.tokens == BURST_OUTPUTS as i32
        ));
        let left = std::iter::from_fn(|| rx.try_recv().ok()).count();
        assert_eq!(
            left,
            queued + 1 - BURST_OUTPUTS,
            "the rest waits for the next burst"
        );
    }
}
