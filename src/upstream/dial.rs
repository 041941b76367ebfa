//! Our own TCP dials: resolve overrides, the outbound proxy, and the loop guard.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine;
use percent_encoding::percent_decode_str;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::{io_reason, UpstreamError};
use crate::base::secret::{Scrubber, Secret};
use crate::config::UpstreamConfig;
use crate::http::RequestContext;

/// Upper bound on the outbound proxy's answer to our `CONNECT`.
const PROXY_RESPONSE_MAX: usize = 8 * 1024;

/// Dials origins for the pooled client and for raw tunnels.
#[derive(Debug, Clone)]
pub struct Dialer {
    resolve: BTreeMap<String, SocketAddr>,
    proxy: Option<OutboundProxy>,
    own: Vec<SocketAddr>,
    timeout: Duration,
}

/// An outbound HTTP proxy. The `CONNECT` is ours rather than hyper-util's `Tunnel`, which
/// reads the proxy's answer into its own buffer and drops any bytes after the head (the tunnel
/// test below needs them), accepts only 200 where HTTP allows any 2xx, and reports failures as
/// fixed strings without the proxy's status line.
#[derive(Debug, Clone)]
struct OutboundProxy {
    host: String,
    port: u16,
    /// `Proxy-Authorization` value from the URL's user info (Debug prints `<redacted>`).
    auth: Option<Secret>,
}

impl Dialer {
    /// `own` are the addresses cursor-byok listens on: never dialled, so our own traffic cannot
    /// loop back into us.
    pub fn new(config: &UpstreamConfig, own: Vec<SocketAddr>) -> Result<Self, UpstreamError> {
        let resolve = config
            .resolve
            .iter()
            .map(|(host, addr)| (host.trim_end_matches('.').to_ascii_lowercase(), *addr))
            .collect();
        let proxy = config
            .proxy
            .as_ref()
            .map(|url| OutboundProxy::parse(url.expose()))
            .transpose()?;
        Ok(Dialer {
            resolve,
            proxy,
            own,
            timeout: config.connect_timeout(),
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A TCP stream to `host:port` (TCP_NODELAY set), within the connect timeout. A `resolve`
    /// override wins over the outbound proxy; otherwise the proxy (if any) opens the tunnel.
    pub async fn dial(&self, host: &str, port: u16) -> Result<TcpStream, UpstreamError> {
        match tokio::time::timeout(self.timeout, self.dial_inner(host, port)).await {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::Timeout {
                host: host.to_string(),
                secs: self.timeout.as_secs(),
            }),
        }
    }

    async fn dial_inner(&self, host: &str, port: u16) -> Result<TcpStream, UpstreamError> {
        let key = host.trim_end_matches('.').to_ascii_lowercase();
        if let Some(addr) = self.resolve.get(&key) {
            return self.connect_addrs(host, &[*addr]).await;
        }
        match &self.proxy {
            Some(proxy) => self.via_proxy(proxy, host, port).await,
            None => self.connect_host(host, port).await,
        }
    }

    async fn connect_host(&self, host: &str, port: u16) -> Result<TcpStream, UpstreamError> {
        let bare = crate::http::bare_host(host);
        let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port))
                .await
                .map_err(|e| UpstreamError::Resolve {
                    host: host.to_string(),
                    reason: io_reason(&e),
                })?
                .collect(),
        };
        self.connect_addrs(host, &addrs).await
    }

    /// Try each address in turn; the last error names the failure, except that a loop, once
    /// seen, is what gets reported (it is the one the user must fix).
    async fn connect_addrs(
        &self,
        host: &str,
        addrs: &[SocketAddr],
    ) -> Result<TcpStream, UpstreamError> {
        let mut last = UpstreamError::Resolve {
            host: host.to_string(),
            reason: "no addresses".into(),
        };
        let mut looped = None;
        for addr in addrs {
            if self.is_own(*addr) {
                looped = Some(UpstreamError::Loop { addr: *addr });
                continue;
            }
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    // Small Connect frames and h2 control frames must not wait for Nagle.
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) => {
                    last = UpstreamError::Connect {
                        host: host.to_string(),
                        reason: io_reason(&e),
                    }
                }
            }
        }
        Err(looped.unwrap_or(last))
    }

    /// Whether `target` reaches one of our listeners, in any spelling: addresses compare in
    /// canonical form (`::ffff:127.0.0.1` is `127.0.0.1`), and any loopback or unspecified
    /// address counts as ours on a port we listen on with a loopback or wildcard address.
    fn is_own(&self, target: SocketAddr) -> bool {
        let ip = canonical(target.ip());
        let local = |ip: IpAddr| ip.is_loopback() || ip.is_unspecified();
        self.own.iter().any(|own| {
            let own_ip = canonical(own.ip());
            own.port() == target.port() && (own_ip == ip || (local(own_ip) && local(ip)))
        })
    }

    async fn via_proxy(
        &self,
        proxy: &OutboundProxy,
        host: &str,
        port: u16,
    ) -> Result<TcpStream, UpstreamError> {
        let mut stream = self.connect_host(&proxy.host, proxy.port).await?;
        // The proxy's answer may echo our credentials: its own (and the registry's) come out.
        let own = proxy.auth.as_ref().map(|a| a.expose());
        let own = own
            .into_iter()
            .flat_map(|a| [a, a.trim_start_matches("Basic ")]);
        let scrubber = Scrubber::new(own);
        let fail = |reason: String| UpstreamError::Proxy {
            proxy: format!("{}:{}", proxy.host, proxy.port),
            host: host.to_string(),
            reason: crate::base::secret::scrub(&scrubber.scrub(&reason)).into_owned(),
        };
        let target = authority(host, port);
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &proxy.auth {
            head.push_str(&format!("Proxy-Authorization: {}\r\n", auth.expose()));
        }
        head.push_str("\r\n");
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| fail(io_reason(&e)))?;
        let answer = read_head(&mut stream).await.map_err(fail)?;
        let status_line = answer.lines().next().unwrap_or_default();
        let ok = status_line
            .split_whitespace()
            .nth(1)
            .is_some_and(|code| code.starts_with('2'));
        if !ok {
            return Err(fail(format!("answered `{status_line}`")));
        }
        Ok(stream)
    }
}

/// Read an HTTP response head byte by byte, so nothing after it is consumed.
async fn read_head(stream: &mut TcpStream) -> Result<String, String> {
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= PROXY_RESPONSE_MAX {
            return Err("response head too large".into());
        }
        let byte = stream.read_u8().await.map_err(|e| io_reason(&e))?;
        head.push(byte);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// `host:port`, bracketing IPv6 literals.
pub(crate) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl OutboundProxy {
    fn parse(url: &str) -> Result<Self, UpstreamError> {
        let setup = |reason: String| UpstreamError::Setup { reason };
        let uri: http::Uri = url
            .parse()
            .map_err(|e| setup(format!("upstream.proxy is not a URL: {e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(setup(
                "upstream.proxy: only http:// outbound proxies are supported".into(),
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| setup("upstream.proxy has no host".into()))?;
        let auth = authority
            .as_str()
            .rsplit_once('@')
            .map(|(userinfo, _)| basic_auth(userinfo));
        Ok(OutboundProxy {
            host: authority.host().to_string(),
            port: authority.port_u16().unwrap_or(80),
            auth,
        })
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is; anything else unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `Basic` credentials from a URL's user info: user and password are percent-decoded (so a
/// password may hold `@`, `:` or `%`), the user ending at the first raw `:`.
fn basic_auth(userinfo: &str) -> Secret {
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let mut plain: Vec<u8> = percent_decode_str(user).collect();
    plain.push(b':');
    plain.extend(percent_decode_str(password));
    let encoded = base64::engine::general_purpose::STANDARD.encode(plain);
    Secret::new(format!("Basic {encoded}"))
}

/// `scheme://authority/` of the origin `ctx` names: what a dial is given.
pub(super) fn origin_root(ctx: &RequestContext) -> Result<http::Uri, UpstreamError> {
    http::Uri::builder()
        .scheme(ctx.scheme.clone())
        .authority(ctx.authority())
        .path_and_query("/")
        .build()
        .map_err(|e| UpstreamError::Request {
            host: ctx.host.clone(),
            reason: format!("cannot build the upstream URI: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dialer(own: Vec<SocketAddr>) -> Dialer {
        Dialer::new(&UpstreamConfig::default(), own).unwrap()
    }

    #[tokio::test]
    async fn refuses_to_dial_itself() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let own = listener.local_addr().unwrap();
        let err = dialer(vec![own])
            .dial("127.0.0.1", own.port())
            .await
            .unwrap_err();
        assert!(matches!(err, UpstreamError::Loop { .. }), "{err}");
        let wildcard: SocketAddr = format!("0.0.0.0:{}", own.port()).parse().unwrap();
        let err = dialer(vec![wildcard])
            .dial("127.0.0.1", own.port())
            .await
            .unwrap_err();
        assert!(matches!(err, UpstreamError::Loop { .. }), "{err}");
    }

    #[test]
    fn every_spelling_of_ourselves_is_a_loop() {
        let d = dialer(vec!["127.0.0.1:4000".parse().unwrap()]);
        for target in [
            "127.0.0.1:4000",
            "[::ffff:127.0.0.1]:4000",
            "127.0.0.2:4000",
            "127.255.255.254:4000",
            "[::1]:4000",
            "0.0.0.0:4000",
            "[::]:4000",
        ] {
            assert!(d.is_own(target.parse().unwrap()), "{target}");
        }
        for target in ["127.0.0.1:4001", "10.0.0.1:4000", "[::ffff:10.0.0.1]:4000"] {
            assert!(!d.is_own(target.parse().unwrap()), "{target}");
        }
        let lan = dialer(vec!["[::ffff:192.168.1.5]:4000".parse().unwrap()]);
        assert!(lan.is_own("192.168.1.5:4000".parse().unwrap()));
        assert!(!lan.is_own("192.168.1.6:4000".parse().unwrap()));
    }

    #[tokio::test]
    async fn refused_names_the_reason() {
        // Bound but not listening: refused, and no other test can be handed the port.
        let closed = tokio::net::TcpSocket::new_v4().unwrap();
        closed.bind(([127, 0, 0, 1], 0).into()).unwrap();
        let addr = closed.local_addr().unwrap();
        let err = dialer(vec![])
            .dial("127.0.0.1", addr.port())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("connection refused"), "{err}");
    }

    #[tokio::test]
    async fn tunnels_through_outbound_proxy() {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = proxy.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = proxy.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\nhello")
                .await
                .unwrap();
            head
        });
        let config = UpstreamConfig {
            proxy: Some(format!("http://user:pw@{proxy_addr}").into()),
            ..Default::default()
        };
        let mut stream = Dialer::new(&config, vec![])
            .unwrap()
            .dial("api2.cursor.sh", 443)
            .await
            .unwrap();
        let mut rest = [0u8; 5];
        stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(
            &rest, b"hello",
            "bytes after the proxy's head are not swallowed"
        );
        let head = server.await.unwrap();
        assert!(
            head.starts_with("CONNECT api2.cursor.sh:443 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Proxy-Authorization: Basic dXNlcjpwdw==\r\n"),
            "{head}"
        );
    }

    /// A one-shot CONNECT proxy on 127.0.0.1:0: reads the request head, answers `answer`, and
    /// hands back the head it read.
    async fn fake_proxy(answer: &'static [u8]) -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = proxy.accept().await.unwrap();
            let head = read_head(&mut s).await.unwrap();
            s.write_all(answer).await.unwrap();
            head
        });
        (addr, task)
    }

    /// The CONNECT head a dial sends through a proxy URL with `userinfo`.
    async fn head_sent_with(userinfo: &str) -> String {
        let (addr, task) = fake_proxy(b"HTTP/1.1 200 OK\r\n\r\n").await;
        let config = UpstreamConfig {
            proxy: Some(format!("http://{userinfo}@{addr}").into()),
            ..Default::default()
        };
        Dialer::new(&config, vec![])
            .unwrap()
            .dial("example.test", 443)
            .await
            .unwrap();
        task.await.unwrap()
    }

    #[tokio::test]
    async fn proxy_credentials_are_percent_decoded() {
        let basic = |plain: &str| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(plain);
            format!("\r\nProxy-Authorization: Basic {encoded}\r\n")
        };
        // User `us:er` is written `us%3Aer`; the password `p@ss:w%rd` holds all three.
        let head = head_sent_with("us%3Aer:p%40ss:w%25rd").await;
        assert!(head.contains(&basic("us:er:p@ss:w%rd")), "{head}");
        // A raw `@` in the password also works: the host starts after the last one.
        let head = head_sent_with("user:a@b").await;
        assert!(head.contains(&basic("user:a@b")), "{head}");
    }

    #[tokio::test]
    async fn proxy_credentials_never_print() {
        let (addr, task) = fake_proxy(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n").await;
        let config = UpstreamConfig {
            proxy: Some(format!("http://alice:s3cr%40t@{addr}").into()),
            ..Default::default()
        };
        let dialer = Dialer::new(&config, vec![]).unwrap();
        let err = dialer.dial("example.test", 443).await.unwrap_err();
        task.await.unwrap();
        assert!(err.to_string().contains("407"), "{err}");
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:s3cr@t");
        for shown in [
            err.to_string(),
            err.client_message(),
            format!("{err:?}"),
            format!("{dialer:?}"),
            format!("{config:?}"),
        ] {
            for secret in ["s3cr", "alice", encoded.as_str()] {
                assert!(!shown.contains(secret), "{secret:?} in {shown}");
            }
        }
        // A URL the proxy parser refuses does not echo it either.
        let bad = UpstreamConfig {
            proxy: Some("http://alice:s3cr t@[::1".to_string().into()),
            ..Default::default()
        };
        let err = Dialer::new(&bad, vec![]).unwrap_err();
        assert!(!err.to_string().contains("s3cr"), "{err}");
    }
}
