//! Stop accepting, let live connections finish for a grace period, then close.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

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

    /// Cancelled when the graceful shutdown starts.
    pub(crate) fn graceful_token(&self) -> CancellationToken {
        self.graceful.clone()
    }

    pub(crate) fn hard_token(&self) -> CancellationToken {
        self.hard.clone()
    }

    /// Run a connection task that ends at the latest when the grace period does.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let hard = crate::base::cancel::cancelled(&self.hard);
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
    let stopping = crate::base::cancel::cancelled(&graceful);
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
