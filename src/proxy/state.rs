//! What every connection task shares, built once by the server and read by every door.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::Scheme;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::auth::{DoorCheck, ProxyAuthCheck};
use super::shutdown::Shutdown;
use super::watch::Bounds;
use super::ProxyError;
use crate::router::Router;
use crate::status::Status;
use crate::tls::CertStore;
use crate::upstream::SpliceLimits;

/// What every connection task shares.
pub(crate) struct ProxyState {
    pub(crate) intercept: Vec<String>,
    pub(crate) certs: CertStore,
    pub(crate) router: Router,
    pub(crate) auth: Option<ProxyAuthCheck>,
    /// The status page asks for no credentials (the listener's are the per-install secret).
    pub(crate) pages_open: bool,
    /// The direct doors' credential check, when the config asks for one.
    pub(crate) door_auth: Option<Arc<DoorCheck>>,
    pub(crate) origin: Origin,
    pub(crate) shutdown: Shutdown,
    /// Live runs for the status page (served by the proxy listener itself).
    pub(crate) status: Status,
    /// HTTP/2 passthrough through the frame relay (`upstream.h2_relay`).
    pub(crate) h2_relay: bool,
    /// Byte tunnels: the cap on open ones and their timeouts.
    pub(crate) tunnels: Tunnels,
    /// Bound on an HTTP/1.1 request head, on every door.
    pub(crate) head_timeout: Duration,
    /// Every connection's time bounds (see [`super::watch`]).
    pub(crate) bounds: Bounds,
}

/// The open byte tunnels, capped; the "cap reached" warning is rate-limited.
pub(crate) struct Tunnels {
    open: Arc<Semaphore>,
    cap: usize,
    pub(crate) limits: SpliceLimits,
    cap_warning: Mutex<CapWarning>,
}

/// A "cap reached" warning that repeats at most once per interval, so a flood of refused
/// connections or tunnels cannot flood the log.
#[derive(Debug)]
pub(crate) struct CapWarning {
    last: Option<Instant>,
}

impl CapWarning {
    const EVERY: Duration = Duration::from_secs(10);

    pub(crate) fn new() -> Self {
        CapWarning { last: None }
    }

    /// Whether to log now; if so, the next one waits a full interval.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if self
            .last
            .is_some_and(|at| now.duration_since(at) < Self::EVERY)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

impl Tunnels {
    pub(crate) fn new(cap: usize, limits: SpliceLimits) -> Self {
        let cap = cap.max(1);
        Tunnels {
            open: Arc::new(Semaphore::new(cap)),
            cap,
            limits,
            cap_warning: Mutex::new(CapWarning::new()),
        }
    }

    /// A place for one more tunnel, held until it closes; `None` (logged) at the cap.
    pub(crate) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.open.clone().try_acquire_owned() {
            return Some(permit);
        }
        // A poisoned lock only means a panic elsewhere mid-update of a timestamp.
        let mut warning = self.cap_warning.lock().unwrap_or_else(|e| e.into_inner());
        if warning.due(Instant::now()) {
            tracing::warn!(
                cap = self.cap,
                "tunnel cap reached ([limits] max_tunnels); refusing new tunnels with 503"
            );
        }
        None
    }
}

/// The Cursor origin behind the direct doors.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub(crate) scheme: Scheme,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Origin {
    pub(crate) fn parse(url: &str) -> Result<Self, ProxyError> {
        let bad = |reason: &str| ProxyError::Config {
            reason: format!("direct.origin `{url}`: {reason}"),
        };
        let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| bad("no scheme"))?;
        if scheme != Scheme::HTTPS && scheme != Scheme::HTTP {
            return Err(bad("scheme must be http or https"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let default = if scheme == Scheme::HTTPS { 443 } else { 80 };
        Ok(Origin {
            host: crate::http::host_of(authority),
            port: authority.port_u16().unwrap_or(default),
            scheme,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_cap_warning_repeats_once_per_interval_for_hours() {
        let mut warning = CapWarning::new();
        let mut logged = 0;
        // A refused connection every second for three hours.
        for _ in 0..3 * 3600 {
            if warning.due(Instant::now()) {
                logged += 1;
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(logged, 3 * 3600 / 10);
        assert!(!warning.due(Instant::now() - Duration::from_secs(1)));
    }
}
