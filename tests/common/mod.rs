//! Helpers shared by integration tests (`mod common;` in a test file).

pub mod agent_client;
pub mod client;
pub mod cursor_upstream;
pub mod fake_cursor;
pub mod fake_provider;
pub mod logs;
pub mod proxy_process;
pub mod skip;

use std::net::SocketAddr;

/// A loopback address that refuses connections for as long as this value lives.
///
/// The port stays bound (without listening), so no server started later in the same test
/// binary can be handed it. A dropped listener's port could be: the proxy's own listener once
/// got it and an "upstream unreachable" test dialled the proxy itself.
#[allow(dead_code)]
pub struct ClosedPort {
    pub addr: SocketAddr,
    _held: tokio::net::TcpSocket,
}

#[allow(dead_code)]
pub fn closed_port() -> ClosedPort {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(([127, 0, 0, 1], 0).into()).expect("bind");
    ClosedPort {
        addr: socket.local_addr().expect("bound address"),
        _held: socket,
    }
}

/// Wait until `cond` holds, checking every few milliseconds; false if `timeout` passes first.
/// For a state no event announces (a count kept by another task, another process's
/// descriptors); where an event exists, wait on it instead.
#[allow(dead_code)]
pub async fn wait_until(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Wait until `gauge` reads the same for 10 polls in a row (about 50 ms: the in-process
/// server's connection tasks have ended and nothing else moves), at most `timeout`; returns
/// the last reading. For a baseline taken once earlier work has wound down.
#[allow(dead_code)]
pub async fn settled<T: PartialEq>(
    timeout: std::time::Duration,
    mut gauge: impl FnMut() -> T,
) -> T {
    let mut last = gauge();
    let mut same = 0;
    wait_until(timeout, || {
        let now = gauge();
        same = if now == last { same + 1 } else { 0 };
        last = now;
        same >= 10
    })
    .await;
    last
}

/// Tasks alive in the current runtime: an in-process server's connection tasks among them, so
/// a test can see that it accepted or let go of connections.
#[allow(dead_code)]
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// For tests on tokio's paused clock that talk over loopback: a task ticking every 20 ms bounds
/// each jump of the clock, so a reply in flight is never overtaken by a timer that would not
/// have fired in real time. Keep the handle alive for the test.
#[allow(dead_code)]
pub fn metronome() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(20));
        loop {
            tick.tick().await;
        }
    })
}
