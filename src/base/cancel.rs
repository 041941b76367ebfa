//! Waiting for a cancellation beside busy work, cheaply.
//!
//! A `select!` between a busy future (a connection, a provider stream) and
//! `token.cancelled()` polls the cancellation on every wake of the task: a lock to check the
//! token and another on its notifier, and a fresh `cancelled()` per loop iteration also
//! registers and unregisters a waiter each time. [`cancelled`] makes one waiter up front and
//! polls it only after it was woken, so a loop pays one atomic swap per iteration.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Ready once `token` is cancelled. Create it once, outside the loop, and select on
/// `&mut` it.
pub fn cancelled(token: &CancellationToken) -> Cancelled {
    WhenWoken::new(token.clone().cancelled_owned())
}

pub type Cancelled = WhenWoken<WaitForCancellationFutureOwned>;

/// Polls a rarely-ready future only after its own waker fired, and once at the start.
pub struct WhenWoken<F> {
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
    pub fn new(inner: F) -> Self {
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
    use std::time::Duration;

    /// Counts its polls; ready once the token is cancelled.
    struct Probe {
        polls: Arc<AtomicUsize>,
        cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
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
        let task = tokio::spawn(cancelled(&token));
        tokio::task::yield_now().await;
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the cancel woke the task")
            .unwrap();
    }

    #[tokio::test]
    async fn already_cancelled_is_ready_at_once() {
        let token = CancellationToken::new();
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), cancelled(&token))
            .await
            .expect("ready on the first poll");
    }
}
