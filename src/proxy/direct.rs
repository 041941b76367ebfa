//! Direct doors, for clients that take a backend URL instead of a proxy (Cursor's CLI and SDK,
//! the local agent endpoint): requests here are for the configured Cursor origin.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::Version;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::LazyConfigAcceptor;
use tracing::instrument;

use super::serve;
use super::state::ProxyState;
use super::watch::{Watch, Watched};
use crate::config::host_matches;
use crate::http::{Door, RequestContext};

/// TLS door: a leaf for the name the client asks for — any intercepted host, `localhost`, or a
/// loopback address — then HTTP (h2 or h1 per ALPN). Other names get no handshake.
#[instrument(skip_all, name = "direct_tls_conn", fields(%peer))]
pub(crate) async fn serve_tls(
    state: Arc<ProxyState>,
    stream: Watched<TcpStream>,
    peer: SocketAddr,
    watch: Arc<Watch>,
) {
    let local_ip = stream.get_ref().local_addr().map(|a| a.ip()).ok();
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = match tokio::time::timeout(serve::HANDSHAKE_TIMEOUT, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "not a TLS client");
            return;
        }
        Err(_) => return,
    };
    let sni = start
        .client_hello()
        .server_name()
        .map(str::to_ascii_lowercase);
    let Some(name) = leaf_name(sni.as_deref(), local_ip, &state.intercept) else {
        tracing::info!(sni = ?sni, "refusing TLS for a name outside the intercept patterns");
        return;
    };
    let config = match state.certs.server_config(&name) {
        Ok(config) => config,
        Err(e) => {
            tracing::warn!(error = %e, "cannot mint a leaf; closing");
            return;
        }
    };
    let tls = match tokio::time::timeout(serve::HANDSHAKE_TIMEOUT, start.into_stream(config)).await
    {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "client TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let base = origin_context(&state, Door::DirectTls, peer);
    serve::serve_tls_stream(state, tls, base, watch).await;
}

/// Plain-HTTP door (HTTP/1.1, or HTTP/2 with prior knowledge).
#[instrument(skip_all, name = "direct_http_conn", fields(%peer))]
pub(crate) async fn serve_http(
    state: Arc<ProxyState>,
    stream: Watched<TcpStream>,
    peer: SocketAddr,
    watch: Arc<Watch>,
) {
    let base = origin_context(&state, Door::DirectHttp, peer);
    serve::serve_http(state, TokioIo::new(stream), None, base, Some(watch)).await;
}

fn origin_context(state: &ProxyState, door: Door, peer: SocketAddr) -> RequestContext {
    RequestContext {
        scheme: state.origin.scheme.clone(),
        host: state.origin.host.clone(),
        port: state.origin.port,
        client_version: Version::HTTP_11,
        door,
        peer,
    }
}

/// The name a leaf is minted for, or `None` to refuse. Without SNI (clients send none for IP
/// literals) the leaf names the address the client dialled.
fn leaf_name(sni: Option<&str>, local_ip: Option<IpAddr>, patterns: &[String]) -> Option<String> {
    match sni {
        None => local_ip.map(|ip| ip.to_string()),
        Some(name) if name == "localhost" || host_matches(patterns, name) => Some(name.to_string()),
        Some(name) => name
            .parse::<IpAddr>()
            .ok()
            .filter(IpAddr::is_loopback)
            .map(|ip| ip.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_leaf_only_for_our_hosts() {
        let p = vec!["*.cursor.sh".to_string()];
        let lo: Option<IpAddr> = Some([127, 0, 0, 1].into());
        assert_eq!(
            leaf_name(Some("api2.cursor.sh"), lo, &p).as_deref(),
            Some("api2.cursor.sh")
        );
        assert_eq!(
            leaf_name(Some("localhost"), lo, &p).as_deref(),
            Some("localhost")
        );
        assert_eq!(leaf_name(None, lo, &p).as_deref(), Some("127.0.0.1"));
        assert_eq!(leaf_name(Some("example.com"), lo, &p), None);
        assert_eq!(leaf_name(Some("10.0.0.1"), lo, &p), None);
    }
}
