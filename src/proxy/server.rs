//! Binding the doors, accepting connections, and shutting down.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::auth::{DoorCheck, ProxyAuthCheck};
use super::shutdown::Shutdown;
use super::state::{CapWarning, Origin, ProxyState, Tunnels};
use super::watch::{Bounds, Watch, Watched};
use super::{direct, front, ProxyError};
use crate::agent::transport::AgentTransports;
use crate::agent::Agent;
use crate::config::Config;
use crate::cursor::CursorServices;
use crate::router::Router;
use crate::status::Status;
use crate::tls::{CertStore, CertificateAuthority};
use crate::upstream::{SpliceLimits, Upstream};

/// Grace period for live streams when shutting down on a signal.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// The handler stack: passthrough, Cursor's adjusted services, and the agent. `status` is the
/// registry the status page shows; the agent reports its runs there.
fn router(
    config: &Config,
    upstream: Upstream,
    status: &Status,
) -> Result<(Router, AgentTransports), ProxyError> {
    let config = Arc::new(config.clone());
    let agent =
        Agent::with_status(config.clone(), status.clone()).map_err(|e| ProxyError::Config {
            reason: e.to_string(),
        })?;
    let agent = AgentTransports::new(agent, upstream.clone());
    let router = Router::new(
        upstream,
        CursorServices::new(config).with_status(status.clone()),
        agent.clone(),
    );
    Ok((router, agent))
}

/// Configures and binds a [`Server`].
pub struct ServerBuilder {
    config: Config,
    ca: Arc<CertificateAuthority>,
    grace: Duration,
    status: Option<Status>,
    listener: Option<std::net::TcpListener>,
}

impl ServerBuilder {
    /// Serve the proxy door on `listener` instead of binding `listen`: the socket a service
    /// manager holds while the proxy is down (see `base::activation`).
    pub fn listener(mut self, listener: std::net::TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Use this status registry (default: a fresh one, see [`Server::status`]).
    pub fn status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }

    /// Grace period used by [`Server::run_until_signal`] (default 10 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Bind every enabled door and start accepting.
    pub async fn bind(self) -> Result<Server, ProxyError> {
        let config = self.config;
        // From here on, error text leaving the process is scrubbed of the config's secrets.
        crate::base::secret::register(config.secret_values().iter().map(String::as_str));
        let origin = Origin::parse(&config.direct.origin)?;
        let doors = Doors::bind(&config, self.listener).await?;
        let (proxy_addr, tls_addr, http_addr) = (doors.proxy_addr, doors.tls_addr, doors.http_addr);
        let own: Vec<SocketAddr> = [Some(proxy_addr), tls_addr, http_addr]
            .into_iter()
            .flatten()
            .collect();

        let shutdown = Shutdown::default();
        let limits = &config.limits;
        let splice = SpliceLimits {
            idle: Duration::from_secs(limits.tunnel_idle_secs.max(1)),
            half_close: Duration::from_secs(limits.tunnel_half_close_secs.max(1)),
        };
        let upstream = Upstream::with_splice(&config.upstream, own, shutdown.hard_token(), splice)?;
        let status = self.status.unwrap_or_default();
        status.record_usage_in(&config.data_dir());
        status.serve_pac(crate::status::pac::script(proxy_addr, &config.intercept));
        let (router, agent) = router(&config, upstream, &status)?;
        let state = Arc::new(ProxyState {
            intercept: config.intercept.clone(),
            certs: CertStore::new(self.ca)?,
            router,
            auth: config.proxy_auth.as_ref().map(ProxyAuthCheck::new),
            pages_open: config.install_secret,
            door_auth: DoorCheck::from_config(&config).map(Arc::new),
            origin,
            shutdown: shutdown.clone(),
            status: status.clone(),
            h2_relay: config.upstream.h2_relay,
            tunnels: Tunnels::new(limits.max_tunnels, splice),
            head_timeout: Duration::from_secs(limits.head_timeout_secs.max(1)),
            bounds: Bounds {
                head: Duration::from_secs(limits.head_timeout_secs.max(1)),
                idle: splice.idle,
                body: Duration::from_secs(limits.body_timeout_secs.max(1)),
            },
        });
        let accept_loops = doors.accept(&state, config.limits.max_connections.max(1));
        tracing::info!(%proxy_addr, ?tls_addr, ?http_addr, "listening");
        Ok(Server {
            proxy_addr,
            tls_addr,
            http_addr,
            grace: self.grace,
            shutdown,
            accept_loops,
            status,
            agent,
        })
    }
}

/// A running front door. Dropping it closes everything at once; [`Server::shutdown`] closes
/// gracefully.
pub struct Server {
    proxy_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    grace: Duration,
    shutdown: Shutdown,
    accept_loops: Vec<JoinHandle<()>>,
    status: Status,
    agent: AgentTransports,
}

impl Server {
    pub fn builder(config: Config, ca: impl Into<Arc<CertificateAuthority>>) -> ServerBuilder {
        ServerBuilder {
            config,
            ca: ca.into(),
            grace: DEFAULT_GRACE,
            status: None,
            listener: None,
        }
    }

    /// The proxy listener (CONNECT and absolute-form HTTP).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    /// The direct TLS door, when enabled.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The direct plain-HTTP door, when enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The live run registry behind `http://<proxy_addr>/__cursor-byok/status`.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// The agent's conversation pins (which conversations are the user's).
    pub fn agent_pins(&self) -> &crate::agent::transport::PinStore {
        self.agent.pins()
    }

    /// What the agent's HTTP/1.1 transport holds right now.
    pub fn agent_pairing(&self) -> crate::agent::transport::Pairing {
        self.agent.pairing()
    }

    /// Stop accepting, let live streams finish for up to `grace`, then close the rest.
    pub async fn shutdown(mut self, grace: Duration) {
        self.shutdown.run(grace).await;
        for accept in self.accept_loops.drain(..) {
            let _ = accept.await;
        }
    }

    /// Serve until Ctrl-C or SIGTERM, then shut down gracefully.
    pub async fn run_until_signal(self) -> Result<(), ProxyError> {
        wait_for_signal().await.map_err(ProxyError::Signal)?;
        tracing::info!(grace = ?self.grace, "signal received; shutting down");
        let grace = self.grace;
        self.shutdown(grace).await;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Without a graceful shutdown, nothing outlives the handle.
        self.shutdown.close_now();
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

/// The listeners of the enabled doors, with the addresses they got (a port 0 resolved).
struct Doors {
    proxy: TcpListener,
    tls: Option<TcpListener>,
    http: Option<TcpListener>,
    proxy_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
}

impl Doors {
    async fn bind(
        config: &Config,
        inherited: Option<std::net::TcpListener>,
    ) -> Result<Doors, ProxyError> {
        let proxy = match inherited {
            Some(listener) => adopt(listener, config.listen)?,
            None => bind(config.listen).await?,
        };
        let tls = match config.direct.tls_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let http = match config.direct.http_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let proxy_addr = local_addr(&proxy)?;
        let tls_addr = tls.as_ref().map(local_addr).transpose()?;
        let http_addr = http.as_ref().map(local_addr).transpose()?;
        Ok(Doors {
            proxy,
            tls,
            http,
            proxy_addr,
            tls_addr,
            http_addr,
        })
    }

    /// One accept loop per door, each allowing `cap` connections at once.
    fn accept(self, state: &Arc<ProxyState>, cap: usize) -> Vec<JoinHandle<()>> {
        let mut accept_loops = vec![tokio::spawn(accept_loop(
            self.proxy,
            state.clone(),
            Kind::Proxy,
            cap,
        ))];
        if let Some(listener) = self.tls {
            accept_loops.push(tokio::spawn(accept_loop(
                listener,
                state.clone(),
                Kind::DirectTls,
                cap,
            )));
        }
        if let Some(listener) = self.http {
            accept_loops.push(tokio::spawn(accept_loop(
                listener,
                state.clone(),
                Kind::DirectHttp,
                cap,
            )));
        }
        accept_loops
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ProxyError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ProxyError::Bind { addr, source })
}

/// A listener bound elsewhere (the service manager's), made ready for tokio. It may hold
/// another address than `listen` when the config changed without `service install`: the
/// proxy serves where the socket is, and says so.
fn adopt(listener: std::net::TcpListener, listen: SocketAddr) -> Result<TcpListener, ProxyError> {
    let failed = |source| ProxyError::Bind {
        addr: listen,
        source,
    };
    listener.set_nonblocking(true).map_err(failed)?;
    let listener = TcpListener::from_std(listener).map_err(failed)?;
    let held = local_addr(&listener)?;
    if held != listen && listen.port() != 0 {
        tracing::warn!(
            %held,
            %listen,
            "the service manager's socket is not on `listen`; serving on it (run `cursor-byok service install` again to move it)"
        );
    }
    tracing::info!(%held, "serving on the socket the service manager holds");
    Ok(listener)
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr, ProxyError> {
    listener.local_addr().map_err(|source| ProxyError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Proxy,
    DirectTls,
    DirectHttp,
}

async fn accept_loop(listener: TcpListener, state: Arc<ProxyState>, kind: Kind, cap: usize) {
    let open = Arc::new(Semaphore::new(cap));
    let mut cap_warning = CapWarning::new();
    loop {
        let accepted = tokio::select! {
            _ = state.shutdown.stopping() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, ?kind, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Beyond the cap the connection is closed at once; those already open are unaffected.
        let Ok(permit) = open.clone().try_acquire_owned() else {
            drop(stream);
            if cap_warning.due(tokio::time::Instant::now()) {
                tracing::warn!(
                    ?kind,
                    cap,
                    "connection cap reached; closing new connections"
                );
            }
            continue;
        };
        // Small h2 frames and Connect messages must not wait for Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        let st = state.clone();
        // The permit and the bounds hold for the connection's whole life: a CONNECT's session
        // or tunnel runs in this same task.
        let watch = Watch::new(state.bounds);
        let io = Watched::new(stream, watch.clone());
        state.shutdown.spawn(async move {
            let _permit = permit;
            let serve = async {
                match kind {
                    Kind::Proxy => front::serve(st, io, peer, watch.clone()).await,
                    Kind::DirectTls => direct::serve_tls(st, io, peer, watch.clone()).await,
                    Kind::DirectHttp => direct::serve_http(st, io, peer, watch.clone()).await,
                }
            };
            tokio::select! {
                _ = serve => {}
                why = watch.expired() => {
                    tracing::debug!(?kind, %peer, ?why, "connection closed by its time bounds");
                }
            }
        });
    }
}
