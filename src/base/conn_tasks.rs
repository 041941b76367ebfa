//! One client connection's work in one task.
//!
//! hyper spawns a future per HTTP/2 stream (server side) and per request-body pipe (client
//! side), and the upstream link's connection is a future of its own. As separate tokio tasks,
//! every hop of a proxied request — client connection, stream, upstream connection and back —
//! is a wake-up through the scheduler. [`LocalExec`] hands those futures to the client
//! connection's task instead, which [`run`] polls beside the connection itself, so a request
//! crosses the proxy in the wake-ups its two sockets need.
//!
//! Used for HTTP/2 client connections, where it pays: many streams on one connection save a
//! wake-up per hop. On HTTP/1.1 (one request at a time, no stream futures) it measured slower
//! than separate tasks, so those keep [`LocalExec::runtime`]. Figures: docs/benchmarks.md.
//!
//! Heavy work does not belong here: agent runs and provider calls spawn tasks of their own;
//! what runs here is HTTP framing and body piping.

use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::sync::mpsc;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// hyper's executor for one connection: futures go to that connection's task, or (made by
/// [`LocalExec::runtime`]) are spawned as tokio tasks.
#[derive(Clone)]
pub(crate) struct LocalExec {
    tx: Option<mpsc::UnboundedSender<Task>>,
}

/// The receiving end, driven by [`run`].
pub(crate) struct ConnTasks {
    rx: mpsc::UnboundedReceiver<Task>,
}

/// An executor for one connection's task, and that task's end of it (for [`run`]).
pub(crate) fn new() -> (LocalExec, ConnTasks) {
    let (tx, rx) = mpsc::unbounded_channel();
    (LocalExec { tx: Some(tx) }, ConnTasks { rx })
}

impl LocalExec {
    /// Every future its own tokio task.
    pub(crate) fn runtime() -> Self {
        LocalExec { tx: None }
    }

    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(tx) = &self.tx else {
            tokio::spawn(fut);
            return;
        };
        // A panic ends that future only, as it would end only its own tokio task: the
        // connection and its other streams go on (a dropped stream is reset by hyper).
        let guarded = AssertUnwindSafe(fut).catch_unwind().map(|outcome| {
            if outcome.is_err() {
                tracing::error!("a connection's task panicked; its stream is dropped");
            }
        });
        if let Err(mpsc::error::SendError(task)) = tx.send(Box::pin(guarded)) {
            // The connection's task is gone (the grace period closed it): the future still
            // has to run, e.g. to close an upstream connection cleanly.
            tokio::spawn(task);
        }
    }
}

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        self.spawn(fut);
    }
}

/// Poll `conn` and every future handed to its [`LocalExec`] until all of them are done: once
/// `conn` has ended and nothing else runs here, the task ends, even if a [`LocalExec`] is
/// still held somewhere (hyper keeps clones in places that outlive the connection). A future
/// handed over after that runs as a tokio task of its own, so nothing is lost and nothing
/// waits on a channel no one will use.
///
/// `conn` is one of the set, so like the others it is polled only when its own waker fired:
/// a wake-up for the upstream connection does not poll the client connection too.
pub(crate) async fn run<F>(conn: F, tasks: ConnTasks)
where
    F: Future<Output = ()> + Send + 'static,
{
    let ConnTasks { mut rx } = tasks;
    let mut set: FuturesUnordered<Task> = FuturesUnordered::new();
    let conn_done = Arc::new(AtomicBool::new(false));
    let done = conn_done.clone();
    set.push(Box::pin(async move {
        conn.await;
        done.store(true, Ordering::Release);
    }));
    let mut senders_gone = false;
    poll_fn(|cx| loop {
        let mut progressed = take_new(&mut rx, &mut senders_gone, &mut set, cx);
        // `Ready(None)` when empty; `Pending` also when it yields after a long batch (having
        // woken us, so returning `Pending` below is right).
        while let Poll::Ready(Some(())) = set.poll_next_unpin(cx) {
            progressed = true;
        }
        // Futures spawned during that poll (a new HTTP/2 stream's) start now, not after a
        // round through the scheduler.
        progressed |= take_new(&mut rx, &mut senders_gone, &mut set, cx);
        if set.is_empty() && (senders_gone || conn_done.load(Ordering::Acquire)) {
            return Poll::Ready(());
        }
        if !progressed {
            return Poll::Pending;
        }
    })
    .await;
    // Later hand-overs fail and are spawned by `LocalExec::spawn`; any that came in between
    // still run.
    rx.close();
    while let Ok(task) = rx.try_recv() {
        tokio::spawn(task);
    }
}

/// Move what was handed over into the set; true if anything was.
fn take_new(
    rx: &mut mpsc::UnboundedReceiver<Task>,
    senders_gone: &mut bool,
    set: &mut FuturesUnordered<Task>,
    cx: &mut Context<'_>,
) -> bool {
    let mut any = false;
    while !*senders_gone {
        match rx.poll_recv(cx) {
            Poll::Ready(Some(task)) => {
                set.push(task);
                any = true;
            }
            Poll::Ready(None) => *senders_gone = true,
            Poll::Pending => break,
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[tokio::test]
    async fn spawned_futures_run_beside_the_connection_and_finish_after_it() {
        let (exec, tasks) = new();
        let done = Arc::new(AtomicUsize::new(0));
        let (d1, d2) = (done.clone(), done.clone());
        let inner = exec.clone();
        let conn = async move {
            exec.spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                // A future may spawn more, after the connection itself has ended.
                inner.spawn(async move {
                    d2.fetch_add(1, Ordering::SeqCst);
                });
                d1.fetch_add(1, Ordering::SeqCst);
            });
        };
        tokio::time::timeout(Duration::from_secs(5), run(conn, tasks))
            .await
            .expect("run ends once the connection and its futures have");
        assert_eq!(done.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_executor_held_elsewhere_does_not_keep_the_task() {
        let (exec, tasks) = new();
        let kept = exec.clone();
        let conn = async move {
            exec.spawn(async {});
        };
        tokio::time::timeout(Duration::from_secs(5), run(conn, tasks))
            .await
            .expect("run ends once the connection and its futures have");
        // A late hand-over still runs, as its own task.
        let (tx, rx) = tokio::sync::oneshot::channel();
        kept.spawn(async move {
            let _ = tx.send(());
        });
        rx.await.expect("ran");
    }

    #[tokio::test]
    async fn a_panicking_future_ends_alone() {
        let (exec, tasks) = new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let conn = async move {
            exec.spawn(async { panic!("a bug in one stream") });
            exec.spawn(async move {
                tokio::task::yield_now().await;
                let _ = tx.send(());
            });
        };
        tokio::time::timeout(Duration::from_secs(5), run(conn, tasks))
            .await
            .expect("run ends");
        rx.await.expect("the other future ran to its end");
    }

    #[tokio::test]
    async fn a_future_handed_over_after_the_task_ended_still_runs() {
        let (exec, tasks) = new();
        drop(tasks);
        let (tx, rx) = tokio::sync::oneshot::channel();
        exec.spawn(async move {
            let _ = tx.send(());
        });
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("spawned on the runtime")
            .expect("ran");
    }
}
