//! Stop accepting, let live connections finish for a grace period, then close.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use hyper_util::server::graceful::GracefulConnection;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Shared by every listener and connection task.
#[derive(Clone, Default)]
pub(crate) struct Shutdown {
    /// Stop accepting; HTTP connections finish their streams and close.
    graceful: CancellationToken,
    /// The grace period is over: drop whatever is still open.
    hard: CancellationToken,
    tracker: TaskTracker,
}

impl Shutdown {
    pub(crate) fn stopping(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.graceful.cancelled()
    }

    pub(crate) fn hard_token(&self) -> CancellationToken {
        self.hard.clone()
    }

    /// Run a connection task that ends at the latest when the grace period does.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let hard = WhenWoken::new(self.hard.clone().cancelled_owned());
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                _ = task => {}
                _ = hard => {}
            }
        });
    }

    /// Drive one hyper connection; on shutdown ask it to finish its streams and close.
    ///
    /// Returns a boxed `Send` future: proving `Send` here, with concrete types, spares callers
    /// the compiler's higher-ranked lifetime limits on generic hyper connections in async fns.
    pub(crate) fn serve<C>(&self, conn: C) -> Pin<Box<dyn Future<Output = ()> + Send>>
    where
        C: GracefulConnection + Send + 'static,
        C::Error: Display + Send,
    {
        let graceful = self.graceful.clone();
        Box::pin(drive(conn, graceful))
    }

    /// Stop accepting, wait up to `grace` for live connections, then close the rest.
    pub(crate) async fn run(&self, grace: Duration) {
        self.graceful.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::info!(
                open = self.tracker.len(),
                "grace period over; closing remaining connections"
            );
        }
        self.hard.cancel();
        // Closing is immediate once cancelled; the bound only guards against a stuck task.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.tracker.wait()).await;
    }
}

impl Shutdown {
    /// Close everything now (the server handle was dropped without a graceful shutdown).
    pub(crate) fn close_now(&self) {
        self.graceful.cancel();
        self.hard.cancel();
    }
}

async fn drive<C>(conn: C, graceful: CancellationToken)
where
    C: GracefulConnection,
    C::Error: Display,
{
    tokio::pin!(conn);
    let stopping = WhenWoken::new(graceful.cancelled_owned());
    let result = tokio::select! {
        biased;
        result = conn.as_mut() => result,
        _ = stopping => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Polls a rarely-ready future (a cancellation) only after its own waker fired, and once at the
/// start. Beside a busy connection it is otherwise polled on every wake of the task, at the cost
/// of two lock round-trips each time; this makes it one atomic swap.
struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
}

struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> WhenWoken<F> {
    fn new(inner: F) -> Self {
        WhenWoken {
            inner: Box::pin(inner),
            signal: Arc::new(Signal {
                woken: AtomicBool::new(true),
                task: AtomicWaker::new(),
            }),
        }
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Register before checking, so a wake in between is never lost.
        self.signal.task.register(cx.waker());
        if !self.signal.woken.swap(false, Ordering::Acquire) {
            return Poll::Pending;
        }
        let waker = Waker::from(self.signal.clone());
        self.inner.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once the token is cancelled.
    struct Probe {
        polls: Arc<AtomicUsize>,
        cancelled: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            self.cancelled.as_mut().poll(cx)
        }
    }

    #[tokio::test]
    async fn polls_inner_only_when_its_waker_fired() {
        let token = CancellationToken::new();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut fut = WhenWoken::new(Probe {
            polls: polls.clone(),
            cancelled: Box::pin(token.clone().cancelled_owned()),
        });
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..10 {
            assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        }
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "polled once at the start only"
        );
        token.cancel();
        assert!(Pin::new(&mut fut).poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_cancel_wakes_the_task() {
        let token = CancellationToken::new();
        let fut = WhenWoken::new(token.clone().cancelled_owned());
        let task = tokio::spawn(fut);
        tokio::task::yield_now().await;
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the cancel woke the task")
            .unwrap();
    }
}
