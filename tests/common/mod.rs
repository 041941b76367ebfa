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
