//! The sending side of a run: every server message goes out through one [`Outbox`], which also
//! knows how long the run has been silent (for the heartbeat) and whether the user saw anything.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::RunError;
use super::shown::Shown;
use crate::agent::messages as msg;
use crate::agent::run_io::RunOutput;
use crate::proto::agent::v1 as pb;

/// How long a canceled run still waits on the client to store what the turn did.
pub(super) const WIND_DOWN: Duration = Duration::from_secs(5);

/// The sending side of a run, shared with the heartbeat and the inbox pump.
///
/// A send waits for room while the run lives; once the run is canceled, its sends together
/// wait at most [`WIND_DOWN`] (counted from the first send after the cancel), so a reader that
/// stopped reading can never hold a canceled run.
#[derive(Clone)]
pub(super) struct Outbox {
    tx: mpsc::Sender<RunOutput>,
    start: Instant,
    /// Milliseconds since `start` of the last message sent.
    last_sent_ms: Arc<AtomicU64>,
    cancel: CancellationToken,
    /// Set at the first send after the cancel: when sends stop waiting.
    wind_down_until: Arc<std::sync::OnceLock<tokio::time::Instant>>,
    /// Whether the user saw part of the turn (decides how a failure ends).
    pub(super) shown: Shown,
}

impl Outbox {
    pub(super) fn new(tx: mpsc::Sender<RunOutput>, cancel: CancellationToken) -> Self {
        Outbox {
            tx,
            start: Instant::now(),
            last_sent_ms: Arc::new(AtomicU64::new(0)),
            cancel,
            wind_down_until: Arc::default(),
            shown: Default::default(),
        }
    }

    pub(super) async fn send(&self, m: pb::AgentServerMessage) -> Result<(), RunError> {
        self.send_output(RunOutput::Message(Box::new(m))).await
    }

    /// Room for one output: waits while the run lives, bounded once it is canceled.
    async fn reserve(&self) -> Result<mpsc::Permit<'_, RunOutput>, RunError> {
        if !self.cancel.is_cancelled() {
            // Room is there most of the time: take it without setting up a wait.
            match self.tx.try_reserve() {
                Ok(permit) => return Ok(permit),
                Err(mpsc::error::TrySendError::Closed(())) => return Err(RunError::ClientGone),
                Err(mpsc::error::TrySendError::Full(())) => {}
            }
            tokio::select! {
                biased;
                permit = self.tx.reserve() => return permit.map_err(|_| RunError::ClientGone),
                _ = self.cancel.cancelled() => {}
            }
        }
        let until = *self
            .wind_down_until
            .get_or_init(|| tokio::time::Instant::now() + WIND_DOWN);
        match tokio::time::timeout_at(until, self.tx.reserve()).await {
            Ok(permit) => permit.map_err(|_| RunError::ClientGone),
            // Nobody takes the output of a canceled run: give up on it.
            Err(_) => Err(RunError::ClientGone),
        }
    }

    pub(super) async fn send_output(&self, o: RunOutput) -> Result<(), RunError> {
        let permit = self.reserve().await?;
        self.shown.note(&o);
        permit.send(o);
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_sent_ms.store(ms, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn silent_for(&self) -> Duration {
        let now = self.start.elapsed();
        now.saturating_sub(Duration::from_millis(
            self.last_sent_ms.load(Ordering::Relaxed),
        ))
    }
}

/// Sends `interaction_update.heartbeat` whenever the run has been silent for `every`.
pub(super) async fn heartbeat(out: Outbox, every: Duration, done: CancellationToken) {
    loop {
        let wait = every.saturating_sub(out.silent_for());
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if out.silent_for() >= every {
            tokio::select! {
                _ = done.cancelled() => return,
                sent = out.send(msg::heartbeat()) => if sent.is_err() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::EndStream;

    /// A live run waits for room as long as it takes; once canceled, its sends together give
    /// up after the wind-down, so a reader that stopped reading cannot hold the run.
    #[tokio::test(start_paused = true)]
    async fn a_canceled_runs_sends_give_up_after_the_wind_down() {
        let (tx, _rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let out = Outbox::new(tx, cancel.clone());
        out.send(msg::heartbeat()).await.unwrap(); // the channel is full now
        let blocked = tokio::spawn({
            let out = out.clone();
            async move { out.send(msg::heartbeat()).await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!blocked.is_finished(), "a live run waits for its reader");
        let canceled_at = tokio::time::Instant::now();
        cancel.cancel();
        assert!(matches!(blocked.await.unwrap(), Err(RunError::ClientGone)));
        assert_eq!(canceled_at.elapsed(), WIND_DOWN);
        // Later sends (the end frame) share that deadline: they give up at once.
        let later = tokio::time::Instant::now();
        let end = out.send_output(RunOutput::End(EndStream::ok())).await;
        assert!(matches!(end, Err(RunError::ClientGone)));
        assert_eq!(later.elapsed(), Duration::ZERO);
    }

    /// With room, a send takes it at once; a full channel makes it wait for the reader; a
    /// reader gone is the client gone.
    #[tokio::test(start_paused = true)]
    async fn a_send_with_room_goes_at_once_and_a_full_one_waits() {
        use futures_util::FutureExt;
        let (tx, mut rx) = mpsc::channel(1);
        let out = Outbox::new(tx, CancellationToken::new());
        assert!(matches!(
            out.send(msg::heartbeat()).now_or_never(),
            Some(Ok(()))
        ));
        let mut second = Box::pin(out.send(msg::heartbeat()));
        assert!((&mut second).now_or_never().is_none(), "full: it waits");
        assert!(rx.recv().await.is_some());
        assert!(matches!(second.await, Ok(())));
        drop(rx);
        assert!(matches!(
            out.send(msg::heartbeat()).now_or_never(),
            Some(Err(RunError::ClientGone))
        ));
    }
}
