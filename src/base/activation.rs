//! The listening socket a service manager holds for the proxy (socket activation): systemd's
//! `sd_listen_fds` protocol (`LISTEN_PID`, `LISTEN_FDS`, descriptors from 3) and launchd's
//! `launch_activate_socket`. The manager keeps the socket open while the proxy is down,
//! crashed, restarting or being upgraded, so a connection made meanwhile (the OS fetching the
//! PAC script, say) waits in the backlog for the proxy instead of being refused.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};

/// The name of the LaunchAgent's `Sockets` entry the proxy asks launchd for.
pub const LAUNCHD_SOCKET: &str = "Listeners";

/// Why the socket a service manager handed over cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("the service manager's LISTEN_FDS is {value:?}, not one socket (the proxy takes exactly one listening socket)")]
    Count { value: String },
    #[error("the socket the service manager handed over cannot be used: {what}")]
    Unusable {
        what: &'static str,
        #[source]
        source: Option<std::io::Error>,
    },
}

impl ActivationError {
    #[cfg(unix)]
    fn unusable(what: &'static str, source: std::io::Error) -> ActivationError {
        ActivationError::Unusable {
            what,
            source: Some(source),
        }
    }
}

/// Set once the inherited descriptors are taken: a second take would make two owners of one
/// descriptor.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The listening socket the service manager handed this process, when it did; `None` when the
/// process was started without one (then the proxy binds `listen` itself). Takes it once per
/// process: later calls return `None`.
///
/// On Linux this removes `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` from the environment,
/// as `sd_listen_fds(1)` does, so no child takes the descriptor for its own: call it before
/// any other thread starts.
pub fn take_listener() -> Result<Option<TcpListener>, ActivationError> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    #[cfg(target_os = "macos")]
    {
        launchd::take()
    }
    #[cfg(all(unix, not(target_os = "macos")))]
    {
        systemd::take()
    }
    #[cfg(not(unix))]
    {
        Ok(None)
    }
}

/// Whether `fds` of the `sd_listen_fds` protocol are for the process `pid`: `LISTEN_PID` must
/// name it (a variable inherited from a parent names the parent, and the descriptors are not
/// ours then). `Ok(None)`: not for us; `Ok(Some(n))`: `n` descriptors from 3.
#[cfg(any(test, all(unix, not(target_os = "macos"))))]
pub(crate) fn listen_fds_for(
    pid: u32,
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
) -> Result<Option<u32>, ActivationError> {
    let (Some(listen_pid), Some(listen_fds)) = (listen_pid, listen_fds) else {
        return Ok(None);
    };
    if listen_pid.trim().parse::<u32>().ok() != Some(pid) {
        return Ok(None);
    }
    match listen_fds.trim().parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(1) => Ok(Some(1)),
        _ => Err(ActivationError::Count {
            value: listen_fds.to_string(),
        }),
    }
}

/// A handed-over descriptor checked to be a listening TCP socket, closed on exec.
#[cfg(unix)]
fn listener_from(fd: std::os::fd::OwnedFd) -> Result<TcpListener, ActivationError> {
    let socket = socket2::Socket::from(fd);
    let kind = socket
        .r#type()
        .map_err(|e| ActivationError::unusable("it is not a socket", e))?;
    if kind != socket2::Type::STREAM {
        return Err(ActivationError::Unusable {
            what: "it is not a stream socket (the unit needs ListenStream=)",
            source: None,
        });
    }
    #[cfg(target_os = "linux")]
    if !socket
        .is_listener()
        .map_err(|e| ActivationError::unusable("cannot tell whether it listens", e))?
    {
        return Err(ActivationError::Unusable {
            what: "it does not listen",
            source: None,
        });
    }
    let addr = socket
        .local_addr()
        .map_err(|e| ActivationError::unusable("it has no local address", e))?;
    if addr.as_socket().is_none() {
        return Err(ActivationError::Unusable {
            what: "it is not an IP socket (the unit needs ListenStream=ADDRESS:PORT)",
            source: None,
        });
    }
    socket
        .set_cloexec(true)
        .map_err(|e| ActivationError::unusable("cannot mark it close-on-exec", e))?;
    Ok(socket.into())
}

#[cfg(all(unix, not(target_os = "macos")))]
mod systemd {
    use std::os::fd::FromRawFd;

    use super::{listen_fds_for, listener_from, ActivationError, TcpListener};

    /// The first descriptor of the protocol (`SD_LISTEN_FDS_START`).
    const FIRST_FD: i32 = 3;

    pub(super) fn take() -> Result<Option<TcpListener>, ActivationError> {
        let pid = std::env::var("LISTEN_PID").ok();
        let fds = std::env::var("LISTEN_FDS").ok();
        for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            std::env::remove_var(name);
        }
        if listen_fds_for(std::process::id(), pid.as_deref(), fds.as_deref())?.is_none() {
            return Ok(None);
        }
        // SAFETY: LISTEN_PID names this process, so by the sd_listen_fds protocol the service
        // manager opened descriptor 3 for it and nothing else in the process owns it; TAKEN
        // makes this the only place that ever wraps it, so it gets exactly one owner.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(FIRST_FD) };
        listener_from(fd).map(Some)
    }
}

#[cfg(target_os = "macos")]
mod launchd {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::os::fd::FromRawFd;

    use super::{listener_from, ActivationError, TcpListener, LAUNCHD_SOCKET};

    extern "C" {
        /// libSystem (`<launch.h>`): the descriptors of the job's `Sockets` entry `name`, in an
        /// array the caller frees.
        fn launch_activate_socket(
            name: *const c_char,
            fds: *mut *mut c_int,
            cnt: *mut usize,
        ) -> c_int;
        fn free(ptr: *mut c_void);
    }

    /// `launch_activate_socket`'s answers when the process is not a launchd job (`ESRCH`) or
    /// its job has no such socket (`ENOENT`): the proxy binds its own.
    const ESRCH: c_int = 3;
    const ENOENT: c_int = 2;

    pub(super) fn take() -> Result<Option<TcpListener>, ActivationError> {
        let Ok(name) = CString::new(LAUNCHD_SOCKET) else {
            return Ok(None);
        };
        let mut fds: *mut c_int = std::ptr::null_mut();
        let mut count: usize = 0;
        // SAFETY: `name` is a NUL-terminated string alive for the call; `fds` and `count` are
        // valid places for launchd to write its answer.
        let rc = unsafe { launch_activate_socket(name.as_ptr(), &mut fds, &mut count) };
        if rc == ESRCH || rc == ENOENT {
            return Ok(None);
        }
        if rc != 0 {
            return Err(ActivationError::unusable(
                "launchd refused it",
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        let raw: Vec<c_int> = if fds.is_null() {
            Vec::new()
        } else {
            // SAFETY: on success `fds` points to `count` descriptors launchd wrote.
            let v = unsafe { std::slice::from_raw_parts(fds, count) }.to_vec();
            // SAFETY: the array was allocated by launch_activate_socket for us to free, once.
            unsafe { free(fds.cast()) };
            v
        };
        let owned: Vec<std::os::fd::OwnedFd> = raw
            .into_iter()
            // SAFETY: each descriptor was opened by launchd for this process and handed to
            // it by this call, which TAKEN lets run once: nothing else owns them.
            .map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
            .collect();
        let mut owned = owned.into_iter();
        match (owned.next(), owned.next()) {
            (Some(fd), None) => listener_from(fd).map(Some),
            (None, _) => Ok(None),
            (Some(_), Some(_)) => Err(ActivationError::Count {
                value: "several".to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_taken_only_when_listen_pid_names_this_process() {
        assert_eq!(listen_fds_for(42, Some("42"), Some("1")).unwrap(), Some(1));
        assert_eq!(listen_fds_for(42, Some("41"), Some("1")).unwrap(), None);
        assert_eq!(listen_fds_for(42, None, Some("1")).unwrap(), None);
        assert_eq!(listen_fds_for(42, Some("42"), None).unwrap(), None);
        assert_eq!(listen_fds_for(42, Some(""), Some("1")).unwrap(), None);
        assert_eq!(listen_fds_for(42, Some("42"), Some("0")).unwrap(), None);
        let err = listen_fds_for(42, Some("42"), Some("2")).unwrap_err();
        assert!(err.to_string().contains("not one socket"), "{err}");
        assert!(listen_fds_for(42, Some("42"), Some("x")).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn only_a_listening_tcp_socket_is_accepted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let taken = listener_from(std::os::fd::OwnedFd::from(listener)).unwrap();
        assert_eq!(taken.local_addr().unwrap(), addr);
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let err = listener_from(std::os::fd::OwnedFd::from(udp)).unwrap_err();
        assert!(err.to_string().contains("not a stream socket"), "{err}");
        #[cfg(target_os = "linux")]
        {
            let stream =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            let err = listener_from(std::os::fd::OwnedFd::from(stream)).unwrap_err();
            assert!(err.to_string().contains("does not listen"), "{err}");
        }
    }
}
