//! The front door: the proxy listener and the direct doors.
//!
//! ```no_run
//! # async fn run(config: cursor_byok::config::Config) -> anyhow::Result<()> {
//! use cursor_byok::proxy::Server;
//! use cursor_byok::tls::CertificateAuthority;
//!
//! let (ca, _) = CertificateAuthority::load_or_create(&config.data_dir())?;
//! let server = Server::builder(config, ca).bind().await?;
//! println!("proxy on {}", server.proxy_addr());
//! server.run_until_signal().await?; // Ctrl-C / SIGTERM → graceful shutdown
//! # Ok(()) }
//! ```
//!
//! Doors:
//! - **Proxy listener** (`listen`): HTTP/1.1 proxy protocol. `CONNECT host:port` to a host
//!   within the `intercept` patterns peeks the ClientHello: TLS naming such a host (or none) is
//!   terminated with a leaf from our CA and served as HTTP/1.1 or HTTP/2 (per ALPN); anything
//!   else is tunnelled byte for byte, replaying what was read. `CONNECT` to any other host is
//!   dialled first (a failure answers 502) and tunnelled without a look. Absolute-form
//!   plain-HTTP requests are forwarded. With `proxy_auth`, requests without the right
//!   `Proxy-Authorization: Basic` get 407.
//! - **Direct TLS door** (`direct.tls_listen`): presents a leaf for the SNI name (any
//!   intercepted host, `localhost`, a loopback IP; without SNI, the dialled address), ALPN h2 +
//!   http/1.1. **Direct HTTP door** (`direct.http_listen`). Requests on both are for
//!   `direct.origin`.
//!
//! Every request for a Cursor host goes through [`crate::router::Router::handle`]; passthrough
//! is [`crate::upstream::Upstream`]. Shutdown: stop accepting, let HTTP streams finish within
//! the grace period (HTTP/2 gets GOAWAY), then close what is left, tunnels included.

mod auth;
mod connect;
mod direct;
mod front;
mod guard;
mod rewind;
mod serve;
mod server;
mod shutdown;
mod sni;
mod state;
mod watch;

use std::net::SocketAddr;

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::http::{full, Body};

pub use server::{Server, ServerBuilder, DEFAULT_GRACE};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{reason}")]
    Config { reason: String },
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Upstream(#[from] crate::upstream::UpstreamError),
    #[error("cannot listen for shutdown signals: {0}")]
    Signal(std::io::Error),
}

/// A short plain-text answer from the front door itself (not from any origin).
pub(crate) fn plain_error(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = Response::new(full(format!("{message}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
