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
        self.put(permit, o);
        Ok(())
    }

    /// Send `m` if there is room at once; dropped otherwise (and once the run is canceled).
    fn try_send(&self, m: pb::AgentServerMessage) {
        if self.cancel.is_cancelled() {
            return;
        }
        if let Ok(permit) = self.tx.try_reserve() {
            self.put(permit, RunOutput::Message(Box::new(m)));
        }
    }

    /// Send `o` into the room taken, noting what the user saw and when the run last spoke.
    fn put(&self, permit: mpsc::Permit<'_, RunOutput>, o: RunOutput) {
        self.shown.note(&o);
        permit.send(o);
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_sent_ms.store(ms, Ordering::Relaxed);
    }

    pub(super) fn silent_for(&self) -> Duration {
        let now = self.start.elapsed();
        now.saturating_sub(Duration::from_millis(
            self.last_sent_ms.load(Ordering::Relaxed),
        ))
    }
}

/// When a silent run speaks up: clients abort a stream after 30 s without server output, so a
/// run silent for `every` sends `interaction_update.heartbeat`. Sans-IO: told the time and how
/// long the run has been silent, it says whether to beat now or when to look again.
#[derive(Clone, Copy)]
pub(super) struct Heartbeat {
    every: Duration,
}

/// What the heartbeat's clock asks for.
#[derive(Debug, PartialEq)]
pub(super) enum Beat {
    /// Send a heartbeat now.
    Now,
    /// Nothing to send before this instant.
    At(Instant),
}

impl Heartbeat {
    pub(super) fn new(every: Duration) -> Heartbeat {
        // A zero period would beat in a busy loop.
        Heartbeat {
            every: every.max(Duration::from_millis(10)),
        }
    }

    pub(super) fn next(&self, now: Instant, silent_for: Duration) -> Beat {
        match self.every.checked_sub(silent_for) {
            Some(left) if !left.is_zero() => Beat::At(now + left),
            _ => Beat::Now,
        }
    }
}

/// Run `work` to its end, sending a heartbeat through `out` whenever the run has been silent
/// for the heartbeat's period meanwhile. A heartbeat never waits for room: output that waits
/// for the client's reader already tells it the run lives.
pub(super) async fn with_heartbeat<F: std::future::Future>(
    out: &Outbox,
    heartbeat: Heartbeat,
    work: F,
) -> F::Output {
    tokio::pin!(work);
    loop {
        let now = Instant::now();
        let at = match heartbeat.next(now, out.silent_for()) {
            Beat::Now => {
                out.try_send(msg::heartbeat());
                // Sent or not (no room), the next look is a period away.
                now + heartbeat.every
            }
            Beat::At(at) => at,
        };
        tokio::select! {
            biased;
            done = &mut work => return done,
            _ = tokio::time::sleep_until(at) => {}
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

    #[test]
    fn the_heartbeat_beats_once_the_run_was_silent_for_its_period() {
        let hb = Heartbeat::new(Duration::from_secs(20));
        let now = Instant::now();
        assert_eq!(
            hb.next(now, Duration::from_secs(5)),
            Beat::At(now + Duration::from_secs(15))
        );
        assert_eq!(hb.next(now, Duration::from_secs(20)), Beat::Now);
        assert_eq!(hb.next(now, Duration::from_secs(3600)), Beat::Now);
        // A zero period is not a busy loop.
        let zero = Heartbeat::new(Duration::ZERO);
        assert!(matches!(zero.next(now, Duration::ZERO), Beat::At(at) if at > now));
    }

    /// Over two silent hours a step gets a heartbeat every period, and none while it speaks
    /// itself more often than that.
    #[tokio::test(start_paused = true)]
    async fn a_silent_step_gets_heartbeats_for_hours_and_a_talking_one_none() {
        let (tx, mut rx) = mpsc::channel(1024);
        let out = Outbox::new(tx, CancellationToken::new());
        let hb = Heartbeat::new(Duration::from_secs(20));
        let silent = tokio::time::sleep(Duration::from_secs(2 * 3600));
        with_heartbeat(&out, hb, silent).await;
        let mut beats = 0;
        while let Ok(o) = rx.try_recv() {
            assert!(matches!(o, RunOutput::Message(m) if *m == msg::heartbeat()));
            beats += 1;
        }
        // One every 20 s; the step ends at the instant the last one would be due.
        assert_eq!(beats, 2 * 3600 / 20 - 1);

        let (tx, mut rx) = mpsc::channel(1024);
        let out = Outbox::new(tx, CancellationToken::new());
        let talking = async {
            for _ in 0..(3600 / 10) {
                tokio::time::sleep(Duration::from_secs(10)).await;
                out.send(msg::notice("working".into())).await.unwrap();
            }
        };
        with_heartbeat(&out, hb, talking).await;
        let mut notices = 0;
        while let Ok(o) = rx.try_recv() {
            assert!(matches!(o, RunOutput::Message(m) if *m != msg::heartbeat()));
            notices += 1;
        }
        assert_eq!(notices, 360);
    }

    /// A heartbeat never waits for room: with the client's reader stalled, the step goes on
    /// and the heartbeat is dropped, not queued behind it.
    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_without_room_is_dropped_and_the_step_goes_on() {
        let (tx, mut rx) = mpsc::channel(1);
        let out = Outbox::new(tx, CancellationToken::new());
        out.send(msg::notice("first".into())).await.unwrap(); // full now
        let hb = Heartbeat::new(Duration::from_secs(20));
        let step = tokio::time::sleep(Duration::from_secs(600));
        let started = Instant::now();
        with_heartbeat(&out, hb, step).await;
        assert_eq!(started.elapsed(), Duration::from_secs(600));
        assert!(matches!(rx.recv().await, Some(RunOutput::Message(m)) if *m != msg::heartbeat()));
        assert!(rx.try_recv().is_err(), "no heartbeat was queued");
    }
}
