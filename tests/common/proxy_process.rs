//! The proxy as a user runs it: its own `cursor-byok run` process, so its memory, descriptors
//! and threads are its own (the benches and the soak sample them). Needs `CARGO_BIN_EXE_…`,
//! which cargo sets for integration tests and benches.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cursor_byok::tls::CertificateAuthority;

use super::agent_client::Door;

pub struct ProxyProcess {
    pub child: tokio::process::Child,
    pub addr: SocketAddr,
    pub roots: rustls::RootCertStore,
    _dir: tempfile::TempDir,
}

/// `Basic` credentials for the per-install secret in `data_dir`.
pub fn secret_auth(data_dir: &std::path::Path) -> String {
    use base64::Engine;
    let secret = std::fs::read_to_string(data_dir.join("proxy-secret"))
        .expect("the proxy made its secret in its data directory");
    let pair = format!("cursor-byok:{}", secret.trim());
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

impl ProxyProcess {
    /// Start it with our model `fake-model` on an OpenAI-compatible provider at `provider`;
    /// `extra` is more TOML: top-level tables (`[agent]`, `[upstream]`…) it adds.
    pub async fn start(provider: SocketAddr, extra: &str) -> ProxyProcess {
        let dir = tempfile::tempdir().unwrap();
        // A free port for the listener (the config names it; the child binds it).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = format!(
            r#"
listen = "{addr}"
{extra}
[providers.fake]
kind = "openai-chat"
base_url = "http://{provider}"
api_key = "sk-bench-not-a-secret"
[[models]]
id = "fake-model"
display_name = "Fake Model"
provider = "fake"
model = "gpt-fake"
"#
        );
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).unwrap();
        let data_dir = dir.path().join("data");
        let (ca, _) = CertificateAuthority::load_or_create(&data_dir).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-byok"))
            .arg("--config")
            .arg(&config_path)
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("run")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start cursor-byok");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the proxy did not start listening"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ProxyProcess {
            child,
            addr,
            roots,
            _dir: dir,
        }
    }

    /// The CONNECT door with the per-install secret the process made in its data directory,
    /// sent the way Cursor sends it once `setup cursor` wired it.
    pub fn door(&self) -> Door {
        Door::ConnectAuth {
            proxy: self.addr,
            roots: self.roots.clone(),
            auth: secret_auth(&self._dir.path().join("data")),
        }
    }

    pub fn pid(&self) -> String {
        self.child.id().expect("the proxy is running").to_string()
    }
}
