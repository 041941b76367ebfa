//! Socket activation, driven on the real binary: a listening socket handed over as descriptor 3
//! with `LISTEN_FDS=1` and `LISTEN_PID` naming the proxy (as systemd's `.socket` unit does). A
//! connection made while no proxy runs waits in the socket's backlog and is answered once the
//! proxy starts, so the OS fetching the PAC script while the proxy is down, crashed or
//! restarting gets the script instead of a refusal (which would send Cursor DIRECT).
#![cfg(all(unix, not(target_os = "macos")))]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cursor_byok::config::Config;
use cursor_byok::status::pac::{script, PAC_CONTENT_TYPE, PAC_PATH};

/// How long a response may take: the proxy starts (a CA on first start) before it answers.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

struct Setup {
    _dir: tempfile::TempDir,
    config: PathBuf,
    data: PathBuf,
    /// The socket the "service manager" (this test) holds for the whole test.
    listener: TcpListener,
    addr: SocketAddr,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{addr}\"\n\
             [providers.openai]\nkind = \"openai-chat\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             api_key = \"sk-not-a-secret\"\n\
             [[models]]\nid = \"m\"\nprovider = \"openai\"\nmodel = \"m\"\n"
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    Setup {
        _dir: dir,
        config,
        data,
        listener,
        addr,
    }
}

/// `cursor-byok run` with `fd` as its descriptor 3, started through `sh` so that
/// `LISTEN_PID=$$` is the pid the binary runs under (`exec` keeps it).
fn start(s: &Setup, fd: RawFd) -> Child {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"LISTEN_PID=$$ exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_cursor-byok"))
        .arg("--config")
        .arg(&s.config)
        .arg("--data-dir")
        .arg(&s.data)
        .arg("run")
        .env("LISTEN_FDS", "1")
        .env_remove("LISTEN_PID")
        .env_remove("RUST_LOG")
        .env_remove("CURSOR_BYOK_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and calls only dup2 and fcntl,
    // which are async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                // dup2 onto itself keeps close-on-exec: clear it so the socket survives exec.
                if libc::fcntl(3, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().expect("start cursor-byok")
}

/// A connection with the PAC request already written: it waits in the backlog until a proxy
/// accepts it.
fn request_pac(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("the held socket takes the connection");
    s.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    let req = format!("GET {PAC_PATH} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// The whole answer on `s`: (status line, lowercased headers, body).
fn answer(mut s: TcpStream, child: &mut Child) -> (String, String, String) {
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        panic!("no answer: {e}; the proxy said: {}", stop(child));
    }
    let text = String::from_utf8(out).unwrap();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        panic!(
            "not an HTTP answer: {text:?}; the proxy said: {}",
            stop(child)
        );
    };
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (
        status.to_string(),
        headers.to_ascii_lowercase(),
        body.to_string(),
    )
}

/// Kills the proxy (as a crash would) and returns what it wrote to standard error.
fn stop(child: &mut Child) -> String {
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

fn assert_is_the_script(s: &Setup, (status, headers, body): (String, String, String)) {
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        headers.contains(&format!("content-type: {PAC_CONTENT_TYPE}")),
        "{headers}"
    );
    let config = Config::load(&s.config).unwrap();
    assert_eq!(body, script(s.addr, &config.intercept));
    assert!(body.contains(&format!("\"PROXY {}\"", s.addr)), "{body}");
}

/// Whether the proxy has written its PAC copy, within `wait`: the file is another process's
/// to write, after it serves, so this watches for it.
fn data_ready(data: &Path, wait: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    while !data.join("proxy.pac").is_file() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

#[test]
fn a_pac_fetch_made_before_the_proxy_starts_is_answered_once_it_does() {
    let s = setup();
    // The OS fetches the script while nothing runs yet: the connection lands in the backlog.
    let pending = request_pac(s.addr);
    let mut proxy = start(&s, s.listener.as_raw_fd());
    let got = answer(pending, &mut proxy);
    assert!(
        proxy.try_wait().unwrap().is_none(),
        "the proxy exited: {}",
        stop(&mut proxy)
    );
    assert_is_the_script(&s, got);
    assert!(
        data_ready(&s.data, std::time::Duration::from_secs(30)),
        "the proxy wrote its PAC copy"
    );
    stop(&mut proxy);
}

#[test]
fn a_connection_made_while_the_proxy_restarts_is_served_by_the_next_one() {
    let s = setup();
    let mut first = start(&s, s.listener.as_raw_fd());
    let got = answer(request_pac(s.addr), &mut first);
    assert_is_the_script(&s, got);
    // A crash: the process is gone, the socket the manager holds stays.
    stop(&mut first);
    let pending = request_pac(s.addr);
    let mut second = start(&s, s.listener.as_raw_fd());
    let got = answer(pending, &mut second);
    assert_is_the_script(&s, got);
    stop(&mut second);
}

#[test]
fn descriptors_named_for_another_process_are_not_taken() {
    // LISTEN_PID naming another process (a parent's variables, inherited): the proxy leaves
    // descriptor 3 alone and binds `listen` itself, which the held socket already has, so it
    // stops saying so instead of serving on a socket that is not its own.
    let s = setup();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cursor-byok"));
    cmd.arg("--config")
        .arg(&s.config)
        .arg("--data-dir")
        .arg(&s.data)
        .arg("run")
        .env("LISTEN_FDS", "1")
        .env("LISTEN_PID", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let fd = s.listener.as_raw_fd();
    // SAFETY: as in `start`: only dup2 and fcntl between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if fd != 3 && libc::dup2(fd, 3) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fcntl(3, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it served: {stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {}", s.addr)),
        "{stderr}"
    );
}
