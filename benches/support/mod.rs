//! Helpers shared by the bench binaries (`#[path = "support/mod.rs"] mod support;`).

use std::future::Future;
use std::sync::OnceLock;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};

/// The process's time origin, so timestamps taken in different tasks compare.
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`].
pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// `name` from the environment, parsed, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` quantile (0..=1) of `values`, nearest rank; NaN when empty.
pub fn percentile(values: &[u64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let idx = ((v.len() - 1) as f64 * p).round() as usize;
    v[idx] as f64
}

/// Accept on `listener` for ever (TCP_NODELAY on), serving each connection in its own task.
pub fn spawn_accept_loop<F, Fut>(listener: TcpListener, serve: F)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(stream));
        }
    });
}

/// A multi-threaded runtime with one worker per CPU this process may use (one under
/// `taskset -c 0`), and that count.
pub fn runtime() -> (tokio::runtime::Runtime, usize) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    (rt, threads)
}
