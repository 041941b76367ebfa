//! A fake "Cursor upstream" for the SDK conformance tests: TLS (HTTP/1.1 + HTTP/2) on
//! 127.0.0.1:0 with its own test CA, answering just what Cursor's SDK needs besides the agent run
//! (which the proxy serves itself). Every request is recorded (method, path, version,
//! content type).
//!
//! Routes:
//! - `POST /auth/exchange_user_api_key` — `{"accessToken": "<JWT>", …}` (the SDK trades its API
//!   key for a session token before anything else).
//! - `/aiserver.v1.DashboardService/GetTeamReposOrEmptyIfNotInTeam` — an empty message (without
//!   it every file exec fails).
//! - `/aiserver.v1.ServerConfigService/GetServerConfig` — an empty message (the proxy then
//!   applies its own adjustments).
//! - anything else: 404 with a Connect error body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// One request as the fake saw it (read through `Debug` in failure messages).
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub version: String,
    pub content_type: Option<String>,
    pub status: u16,
}

pub struct SdkUpstream {
    pub addr: SocketAddr,
    /// The test CA as a PEM file, for `upstream.extra_roots`.
    pub ca_pem_path: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    _dir: tempfile::TempDir,
    _task: JoinSet<()>,
}

impl SdkUpstream {
    /// A TLS server for `names`, with a fresh test CA.
    pub async fn start(names: &[&str]) -> SdkUpstream {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::default();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "conformance upstream test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf_key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut leaf = CertificateParams::new(names).unwrap();
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf_cert.der().clone()], key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

        let dir = tempfile::tempdir().unwrap();
        let ca_pem_path = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_pem_path, ca_cert.pem()).unwrap();

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut task = JoinSet::new();
        task.spawn(accept_loop(listener, acceptor, seen.clone()));
        SdkUpstream {
            addr,
            ca_pem_path,
            seen,
            _dir: dir,
            _task: task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let mut conns = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let seen = seen.clone();
        conns.spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = service_fn(move |req| {
                let seen = seen.clone();
                async move { Ok::<_, Infallible>(handle(req, seen).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
        while conns.try_join_next().is_some() {}
    }
}

type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

fn body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A JWT-shaped session token (unsigned in any meaningful way: nobody here verifies it).
pub fn fake_jwt() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({"alg": "HS256", "typ": "JWT"});
    let payload = serde_json::json!({
        "sub": "auth0|user_conformance",
        "iss": "https://authentication.cursor.sh",
        "aud": "https://cursor.com",
        "scope": "openid profile email offline_access",
        "type": "session",
        "iat": now,
        "exp": now + 24 * 3600,
    });
    format!(
        "{}.{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(payload.to_string().as_bytes()),
        b64url(b"conformance-signature")
    )
}

async fn handle(req: Request<Incoming>, seen: Arc<Mutex<Vec<Seen>>>) -> Response<Body> {
    let (parts, incoming) = req.into_parts();
    let _ = incoming.collect().await;
    let path = parts.uri.path().to_string();
    let content_type = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let json_client = content_type
        .as_deref()
        .is_some_and(|ct| ct.starts_with("application/json"));
    let (status, ct, bytes): (StatusCode, &str, Bytes) = match path.as_str() {
        "/auth/exchange_user_api_key" => {
            let token = fake_jwt();
            let answer = serde_json::json!({
                "accessToken": token,
                "refreshToken": token,
                "authId": "auth0|user_conformance",
            });
            (
                StatusCode::OK,
                "application/json",
                answer.to_string().into(),
            )
        }
        "/aiserver.v1.DashboardService/GetTeamReposOrEmptyIfNotInTeam"
        | "/aiserver.v1.ServerConfigService/GetServerConfig" => {
            if json_client {
                (
                    StatusCode::OK,
                    "application/json",
                    Bytes::from_static(b"{}"),
                )
            } else {
                (StatusCode::OK, "application/proto", Bytes::new())
            }
        }
        _ => (
            StatusCode::NOT_FOUND,
            "application/json",
            Bytes::from_static(
                br#"{"code":"unimplemented","message":"not served by the conformance fake"}"#,
            ),
        ),
    };
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path,
        version: format!("{:?}", parts.version),
        content_type,
        status: status.as_u16(),
    });
    let mut resp = Response::new(body(bytes));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static(ct));
    resp
}
