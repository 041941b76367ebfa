//! After `CONNECT`: terminate TLS for intercepted hosts, tunnel bytes for everything else.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::uri::Scheme;
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::instrument;

use super::plain_error;
use super::rewind::Rewind;
use super::serve;
use super::sni::{self, Peek};
use super::state::ProxyState;
use super::watch::Watch;
use crate::config::host_matches;
use crate::http::{empty, Body, Door, RequestContext};
use crate::upstream::{splice, SpliceLimits};

/// What runs on a connection after its `CONNECT` was answered (an intercepted session or a
/// tunnel): run by the connection's own task once hyper hands the socket over, so the
/// connection's place under `max_connections` and its time bounds hold until it closes.
pub(crate) type Session = Arc<Mutex<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>>;

/// How long a client may stay silent after `CONNECT` before we assume the server speaks first.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a ClientHello may take to arrive in full.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Answer a `CONNECT`. Hosts outside the intercept patterns are dialled first, so a failure is
/// a clear 502, and then tunnelled without looking at a byte. What follows the answer goes in
/// `session`, for the connection's own task to run.
pub(crate) async fn handle(
    state: Arc<ProxyState>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
    watch: Arc<Watch>,
    session: &Session,
) -> Response<Body> {
    let (host, port) = match target(&req) {
        Ok(target) => target,
        Err(reason) => return plain_error(StatusCode::BAD_REQUEST, reason),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let put = |next: Pin<Box<dyn Future<Output = ()> + Send>>| {
        // A poisoned lock only means a panic in another request of this connection.
        *session.lock().unwrap_or_else(|e| e.into_inner()) = Some(next);
    };
    if host_matches(&state.intercept, &host) {
        put(Box::pin(intercept_or_tunnel(
            state, on_upgrade, host, port, peer, watch,
        )));
        return Response::new(empty());
    }
    let Some(permit) = state.tunnels.admit() else {
        return plain_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "cursor-byok: too many open tunnels ([limits] max_tunnels); retry later",
        );
    };
    match state.router.upstream().dialer().dial(&host, port).await {
        Ok(server) => {
            let limits = state.tunnels.limits;
            put(Box::pin(async move {
                let _permit = permit;
                if let Some(client) = upgraded(on_upgrade).await {
                    tunnel(client, server, Bytes::new(), limits).await;
                }
            }));
            Response::new(empty())
        }
        Err(e) => {
            tracing::info!(%host, error = %e, "tunnel target unreachable");
            plain_error(StatusCode::BAD_GATEWAY, &e.client_message())
        }
    }
}

/// `(host, port)` from the authority-form target; a missing port defaults to 443, an invalid
/// one (`0`, over 65535, not a number) is refused rather than silently dialling 443.
fn target(req: &Request<Incoming>) -> Result<(String, u16), &'static str> {
    let authority = req
        .uri()
        .authority()
        .ok_or("cursor-byok: CONNECT needs a host:port target")?;
    let host = crate::http::host_of(authority);
    if host.is_empty() {
        return Err("cursor-byok: CONNECT needs a host:port target");
    }
    Ok((host, port(authority.as_str())?))
}

/// The port after the last `:` outside an IPv6 literal's brackets.
fn port(authority: &str) -> Result<u16, &'static str> {
    match authority.rsplit_once(':') {
        Some((_, port)) if !port.contains(']') => match port.parse::<u16>() {
            Ok(port) if port != 0 => Ok(port),
            _ => Err("cursor-byok: CONNECT target port must be a number from 1 to 65535"),
        },
        _ => Ok(443),
    }
}

async fn upgraded(on_upgrade: OnUpgrade) -> Option<TokioIo<Upgraded>> {
    match on_upgrade.await {
        Ok(io) => Some(TokioIo::new(io)),
        Err(e) => {
            tracing::debug!(error = %e, "CONNECT upgrade failed");
            None
        }
    }
}

/// What to do with the bytes after `CONNECT` to a host within the patterns.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Terminate TLS presenting a leaf for this name.
    Intercept(String),
    Tunnel,
}

/// Intercept only a ClientHello naming a host within the patterns (or naming none, for a
/// CONNECT host within them); everything else tunnels untouched.
fn decide(peek: &Peek, connect_host: &str, patterns: &[String]) -> Decision {
    match peek {
        Peek::ClientHello { sni: Some(name) } if host_matches(patterns, name) => {
            Decision::Intercept(name.clone())
        }
        Peek::ClientHello { sni: None } => Decision::Intercept(connect_host.to_string()),
        _ => Decision::Tunnel,
    }
}

#[instrument(skip_all, name = "connect", fields(%peer, %host, port = port))]
async fn intercept_or_tunnel(
    state: Arc<ProxyState>,
    on_upgrade: OnUpgrade,
    host: String,
    port: u16,
    peer: SocketAddr,
    watch: Arc<Watch>,
) {
    let Some(mut client) = upgraded(on_upgrade).await else {
        return;
    };
    // The TLS handshake and the first request inside it are due within the head timeout.
    watch.expect_head();
    let (seen, peek, closed) = read_client_hello(&mut client).await;
    if closed && seen.is_empty() {
        return; // the client left without a byte: nothing to carry
    }
    match decide(&peek, &host, &state.intercept) {
        Decision::Intercept(name) => {
            let config = match state.certs.server_config(&name) {
                Ok(config) => config,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot mint a leaf; closing");
                    return;
                }
            };
            tracing::debug!(%name, "intercepting");
            let base = RequestContext {
                scheme: Scheme::HTTPS,
                host: name,
                port,
                client_version: Version::HTTP_11,
                door: Door::Connect,
                peer,
            };
            serve::serve_tls(
                state.clone(),
                Rewind::new(seen.freeze(), client),
                config,
                base,
                watch,
            )
            .await;
        }
        Decision::Tunnel => {
            tracing::debug!(?peek, "tunnelling");
            // A byte tunnel has no heads: its idle and half-close limits bound it.
            watch.got_head();
            // The CONNECT was answered already: beyond the cap all we can do is close.
            let Some(_permit) = state.tunnels.admit() else {
                return;
            };
            match state.router.upstream().dialer().dial(&host, port).await {
                Ok(server) => tunnel(client, server, seen.freeze(), state.tunnels.limits).await,
                Err(e) => tracing::info!(error = %e, "tunnel target unreachable"),
            }
        }
    }
}

/// Read until the bytes are a whole ClientHello, clearly not one, or the client goes quiet.
/// Returns what was read, the verdict, and whether the client closed its side.
async fn read_client_hello<IO: AsyncRead + Unpin>(io: &mut IO) -> (BytesMut, Peek, bool) {
    let mut buf = BytesMut::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + FIRST_BYTES_TIMEOUT + HELLO_TIMEOUT;
    loop {
        let wait = if buf.is_empty() {
            FIRST_BYTES_TIMEOUT
        } else {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        };
        match tokio::time::timeout(wait, io.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => return (buf, Peek::NeedMore, true),
            // Silence: perhaps a protocol where the server speaks first.
            Err(_) => return (buf, Peek::NeedMore, false),
        }
        match sni::peek(&buf) {
            Peek::NeedMore if buf.len() < sni::MAX_HELLO => continue,
            Peek::NeedMore => return (buf, Peek::NotClientHello, false),
            done => return (buf, done, false),
        }
    }
}

/// Byte-exact tunnel: replay what was already read, then copy both ways until both sides end
/// or one of `limits` does.
async fn tunnel<C>(client: C, mut server: TcpStream, seen: Bytes, limits: SpliceLimits)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    if !seen.is_empty() {
        if let Err(e) = server.write_all(&seen).await {
            tracing::debug!(error = %e, "tunnel replay failed");
            return;
        }
    }
    let end = splice(client, server, limits).await;
    tracing::debug!(?end, "tunnel closed");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns() -> Vec<String> {
        vec!["*.cursor.sh".to_string()]
    }

    #[test]
    fn ports_are_checked() {
        assert_eq!(port("example.com:8443"), Ok(8443));
        assert_eq!(port("example.com"), Ok(443));
        assert_eq!(port("[::1]"), Ok(443));
        assert_eq!(port("[::1]:22"), Ok(22));
        for bad in ["127.0.0.1:70000", "host:0", "host:abc", "host:", "[::1]:-1"] {
            assert!(port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn intercepts_only_matching_hellos() {
        let hello = |sni: Option<&str>| Peek::ClientHello {
            sni: sni.map(str::to_string),
        };
        let p = patterns();
        assert_eq!(
            decide(&hello(Some("api2.cursor.sh")), "api2.cursor.sh", &p),
            Decision::Intercept("api2.cursor.sh".into())
        );
        assert_eq!(
            decide(&hello(None), "api2.cursor.sh", &p),
            Decision::Intercept("api2.cursor.sh".into())
        );
        assert_eq!(
            decide(&hello(Some("example.com")), "api2.cursor.sh", &p),
            Decision::Tunnel
        );
        assert_eq!(
            decide(&Peek::NotClientHello, "api2.cursor.sh", &p),
            Decision::Tunnel
        );
        assert_eq!(
            decide(&Peek::NeedMore, "api2.cursor.sh", &p),
            Decision::Tunnel
        );
    }
}
