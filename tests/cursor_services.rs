//! `cursor::CursorServices::handle` against a small fake Cursor origin (plain HTTP/1.1 on
//! 127.0.0.1:0) and against an unreachable one.

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http::uri::Scheme;
use http::{header, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prost::Message;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use cursor_byok::config::{Config, UpstreamConfig};
use cursor_byok::cursor::{classify, CursorRpc, CursorServices};
use cursor_byok::http::{full, Body, Door, RequestContext};
use cursor_byok::proto::agent::v1 as ag;
use cursor_byok::proto::aiserver::v1 as ai;
use cursor_byok::upstream::Upstream;

const CONFIG: &str = r#"
[providers.openai]
kind = "openai-chat"
api_key = "sk-test"

[[models]]
id = "gpt"
display_name = "My GPT"
provider = "openai"
model = "gpt-5"
reasoning_effort = "medium"
"#;

/// The real capture when the shared directory is present, else a one-model stand-in.
fn upstream_models() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/protocol/captures/yelixir-native-cli-20260825-models.gzip.b64");
    match std::fs::read_to_string(&path) {
        Ok(b64) => {
            let gz = base64::engine::general_purpose::STANDARD
                .decode(b64.split_whitespace().collect::<String>())
                .expect("base64");
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(&gz[..])
                .read_to_end(&mut raw)
                .expect("gzip");
            raw
        }
        Err(_) => {
            eprintln!(
                "note: {} absent; using a stand-in model list",
                path.display()
            );
            ai::AvailableModelsResponse {
                models: vec![ai::available_models_response::AvailableModel {
                    name: "composer-2.5".into(),
                    default_on: true,
                    ..Default::default()
                }],
                ..Default::default()
            }
            .encode_to_vec()
        }
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).expect("gzip");
    enc.finish().expect("gzip")
}

struct Fake {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

async fn fake_cursor() -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(AtomicUsize::new(0));
    let models = Bytes::from(upstream_models());
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let models = models.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let models = models.clone();
                    async move { Ok::<_, Infallible>(answer(req, models)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Fake { addr, hits }
}

fn answer(req: Request<Incoming>, models: Bytes) -> Response<Full<Bytes>> {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/json");
    let seen_accept = req
        .headers()
        .get(header::ACCEPT_ENCODING)
        .cloned()
        .unwrap_or(header::HeaderValue::from_static("-"));
    let proto = |body: Vec<u8>, gz: bool| {
        let mut b = Response::builder()
            .header(header::CONTENT_TYPE, "application/proto")
            .header("x-seen-accept-encoding", seen_accept.clone());
        let body = if gz {
            b = b.header(header::CONTENT_ENCODING, "gzip");
            gzip(&body)
        } else {
            body
        };
        b.body(Full::new(Bytes::from(body))).expect("response")
    };
    match req.uri().path() {
        "/aiserver.v1.AiService/AvailableModels" if json => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(b"{\"models\":[]}")))
            .expect("response"),
        "/aiserver.v1.AiService/AvailableModels"
            if req.headers().contains_key("x-send-garbage") =>
        {
            proto(b"\x12\xff\xff".to_vec(), false)
        }
        "/aiserver.v1.AiService/AvailableModels" => proto(models.to_vec(), true),
        "/aiserver.v1.ServerConfigService/GetServerConfig"
            if req.headers().contains_key("x-send-garbage") =>
        {
            proto(b"\x12\xff\xff".to_vec(), true)
        }
        "/aiserver.v1.AnalyticsService/BootstrapStatsig" => statsig_answer(&req),
        "/aiserver.v1.ServerConfigService/GetServerConfig" => proto(
            ai::GetServerConfigResponse {
                config_version: "v9".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            true,
        ),
        "/agent.v1.AgentService/GetDefaultModelForCli" => proto(
            ag::GetDefaultModelForCliResponse {
                model: Some(ag::ModelDetails {
                    model_id: "composer-2.5".into(),
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
            false,
        ),
        _ => Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(
                b"{\"code\":\"internal\",\"message\":\"boom\"}",
            )))
            .expect("response"),
    }
}

fn setup() -> (CursorServices, Upstream) {
    let config = Config::from_toml(CONFIG, "test").expect("config");
    let upstream = Upstream::new(
        &UpstreamConfig::default(),
        Vec::new(),
        CancellationToken::new(),
    )
    .expect("upstream");
    (CursorServices::new(Arc::new(config)), upstream)
}

fn ctx(port: u16) -> RequestContext {
    RequestContext {
        scheme: Scheme::HTTP,
        host: "127.0.0.1".into(),
        port,
        client_version: Version::HTTP_11,
        door: Door::DirectHttp,
        peer: "127.0.0.1:1".parse().expect("addr"),
    }
}

fn request(path: &str, content_type: &str) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri(path)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::ACCEPT_ENCODING, "gzip, br")
        .header("connect-protocol-version", "1")
        .body(full(Bytes::new()))
        .expect("request")
}

async fn call(
    services: &CursorServices,
    upstream: &Upstream,
    port: u16,
    req: Request<Body>,
) -> (http::response::Parts, Bytes) {
    let path = req.uri().path().to_string();
    let rpc = classify(&path).expect("classified");
    let resp = services.handle(rpc, &ctx(port), req, upstream).await;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (parts, body)
}

#[tokio::test]
async fn model_list_is_merged_from_a_gzip_answer() {
    let fake = fake_cursor().await;
    let (services, upstream) = setup();
    let original = ai::AvailableModelsResponse::decode(&upstream_models()[..]).expect("decodes");

    let req = request(
        "/aiserver.v1.AiService/AvailableModels",
        "application/proto",
    );
    let (parts, body) = call(&services, &upstream, fake.addr.port(), req).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(parts.headers[header::CONTENT_TYPE], "application/proto");
    assert!(
        parts.headers.get(header::CONTENT_ENCODING).is_none(),
        "re-encoded uncompressed"
    );
    assert_eq!(
        parts.headers["x-seen-accept-encoding"], "gzip",
        "narrowed to what we decode"
    );
    let merged = ai::AvailableModelsResponse::decode(body).expect("merged decodes");
    let n = original.models.len();
    assert_eq!(merged.models.len(), n + 1);
    assert_eq!(&merged.models[..n], &original.models[..]);
    let ours = &merged.models[n];
    assert_eq!(ours.name, "byok-gpt");
    assert_eq!(ours.client_display_name.as_deref(), Some("My GPT"));
    assert_eq!(ours.supports_agent, Some(true));
}

#[tokio::test]
async fn json_and_undecodable_answers_pass_through() {
    let fake = fake_cursor().await;
    let (services, upstream) = setup();
    let port = fake.addr.port();

    let req = request("/aiserver.v1.AiService/AvailableModels", "application/json");
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(&body[..], b"{\"models\":[]}");

    let mut req = request(
        "/aiserver.v1.AiService/AvailableModels",
        "application/proto",
    );
    req.headers_mut()
        .insert("x-send-garbage", header::HeaderValue::from_static("1"));
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(&body[..], b"\x12\xff\xff", "upstream's bytes, as they came");

    // Upstream names the CLI default: it stands.
    let req = request(
        "/agent.v1.AgentService/GetDefaultModelForCli",
        "application/proto",
    );
    let (_, body) = call(&services, &upstream, port, req).await;
    let default = ag::GetDefaultModelForCliResponse::decode(body).expect("decodes");
    assert_eq!(
        default.model.map(|m| m.model_id).as_deref(),
        Some("composer-2.5")
    );
}

#[tokio::test]
async fn refused_model_list_gets_ours_but_refused_config_passes() {
    let fake = fake_cursor().await;
    let (services, upstream) = setup();
    let port = fake.addr.port();

    // The fake answers 500 here.
    let req = request(
        "/agent.v1.AgentService/GetUsableModels",
        "application/proto",
    );
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    let usable = ag::GetUsableModelsResponse::decode(body).expect("decodes");
    let ids: Vec<_> = usable.models.iter().map(|m| m.model_id.as_str()).collect();
    assert_eq!(ids, ["byok-gpt"]);

    let req = request(
        "/aiserver.v1.ServerConfigService/GetServerConfig",
        "application/proto",
    );
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    let config = ai::GetServerConfigResponse::decode(body).expect("decodes");
    assert_eq!(config.config_version, "v9", "upstream's config kept");
    assert_eq!(
        config.http2_config,
        ai::Http2Config::ForceBidiDisabled as i32
    );
}

#[tokio::test]
async fn ws_probes_get_404_and_never_reach_upstream() {
    let fake = fake_cursor().await;
    let (services, upstream) = setup();
    for path in ["/ws-reachability-probe"] {
        let req = Request::builder()
            .method("GET")
            .uri(path)
            .header(header::UPGRADE, "websocket")
            .header(header::CONNECTION, "upgrade")
            .body(full(Bytes::new()))
            .expect("request");
        assert_eq!(classify(path), Some(CursorRpc::WsProbe));
        let (parts, body) = call(&services, &upstream, fake.addr.port(), req).await;
        assert_eq!(parts.status, StatusCode::NOT_FOUND);
        assert!(body.is_empty());
    }
    assert_eq!(fake.hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn unreachable_upstream_gets_local_answers() {
    let (services, upstream) = setup();
    // A port nobody listens on; kept bound (not listening) so no other test's server gets it.
    let closed = tokio::net::TcpSocket::new_v4().expect("socket");
    closed.bind(([127, 0, 0, 1], 0).into()).expect("bind");
    let port = closed.local_addr().expect("addr").port();

    let req = request(
        "/aiserver.v1.AiService/AvailableModels",
        "application/proto",
    );
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    let models = ai::AvailableModelsResponse::decode(body).expect("decodes");
    let names: Vec<_> = models.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["byok-gpt"]);

    let req = request(
        "/aiserver.v1.ServerConfigService/GetServerConfig",
        "application/proto",
    );
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    let config = ai::GetServerConfigResponse::decode(body).expect("decodes");
    assert_eq!(config.http2_config, 3);

    let req = request(
        "/agent.v1.AgentService/GetDefaultModelForCli",
        "application/proto",
    );
    let (_, body) = call(&services, &upstream, port, req).await;
    let default = ag::GetDefaultModelForCliResponse::decode(body).expect("decodes");
    assert_eq!(
        default.model.map(|m| m.model_id).as_deref(),
        Some("byok-gpt")
    );

    // JSON clients are never answered with protobuf: they get the Connect error.
    let req = request("/aiserver.v1.AiService/AvailableModels", "application/json");
    let (parts, _) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::BAD_GATEWAY);
}

/// A bootstrap shaped as peers record Cursor's: djb2 keys, both door gates on, one other gate,
/// a dynamic config and the user.
fn statsig_config() -> String {
    serde_json::json!({
        "feature_gates": {
            "579159465": {"name": "579159465", "value": true, "rule_id": "on", "secondary_exposures": []},
            "1967931573": {"name": "1967931573", "value": true, "rule_id": "on", "secondary_exposures": []},
            "777": {"name": "777", "value": true, "rule_id": "other"}
        },
        "dynamic_configs": {"2362453234": {"name": "2362453234", "value": {"maxConnections": 2}}},
        "layer_configs": {},
        "user": {"userID": "u1"},
        "time": 1_790_000_000_000u64,
        "has_updates": true,
        "hash_used": "djb2"
    })
    .to_string()
}

/// `BootstrapStatsigResponse`: config (1), timestamp (2) and a field this build does not know.
fn statsig_message() -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::string::encode(1, &statsig_config(), &mut out);
    prost::encoding::uint64::encode(2, &1_790_000_000_000u64, &mut out);
    prost::encoding::string::encode(7, &"kept".to_owned(), &mut out);
    out
}

/// The fake's BootstrapStatsig, in the form the request's `x-statsig` asks for.
fn statsig_answer(req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let form = req
        .headers()
        .get("x-statsig")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("gzip")
        .to_owned();
    let (content_type, body, gz) = match form.as_str() {
        "gzip" => ("application/proto", statsig_message(), true),
        "framed" => {
            let m = statsig_message();
            let mut framed = vec![0u8];
            framed.extend_from_slice(&(m.len() as u32).to_be_bytes());
            framed.extend_from_slice(&m);
            ("application/connect+proto", framed, false)
        }
        "json" => (
            "application/json",
            serde_json::to_vec(&serde_json::json!({"config": statsig_config(), "timestamp": "1"}))
                .expect("json"),
            false,
        ),
        "bad-json" => {
            let mut out = Vec::new();
            prost::encoding::string::encode(1, &"{not json".to_owned(), &mut out);
            ("application/proto", out, true)
        }
        "no-config" => ("application/proto", b"\x10\x01".to_vec(), false),
        "unknown-hash" => {
            let mut out = Vec::new();
            let config = r#"{"feature_gates":{},"hash_used":"md5"}"#.to_owned();
            prost::encoding::string::encode(1, &config, &mut out);
            ("application/proto", out, false)
        }
        _ => {
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .body(Full::new(Bytes::new()))
                .expect("response")
        }
    };
    let mut b = Response::builder().header(header::CONTENT_TYPE, content_type);
    let body = if gz {
        b = b.header(header::CONTENT_ENCODING, "gzip");
        gzip(&body)
    } else {
        body
    };
    b.body(Full::new(Bytes::from(body))).expect("response")
}

fn statsig_request(form: &str, content_type: &str) -> Request<Body> {
    let mut req = request(
        "/aiserver.v1.AnalyticsService/BootstrapStatsig",
        content_type,
    );
    req.headers_mut().insert(
        "x-statsig",
        header::HeaderValue::from_str(form).expect("header"),
    );
    req
}

/// The config string (field 1, last occurrence) of a `BootstrapStatsigResponse`.
fn statsig_json(message: &[u8]) -> serde_json::Value {
    let mut buf = message;
    let mut config = None;
    while !buf.is_empty() {
        let (number, wire) = prost::encoding::decode_key(&mut buf).expect("key");
        if number == 1 {
            let mut s = String::new();
            prost::encoding::string::merge(wire, &mut s, &mut buf, Default::default())
                .expect("string");
            config = Some(s);
        } else {
            prost::encoding::skip_field(wire, number, &mut buf, Default::default()).expect("skip");
        }
    }
    serde_json::from_str(&config.expect("field 1")).expect("config is JSON")
}

fn assert_doors_off(json: &serde_json::Value) {
    for key in ["579159465", "1967931573"] {
        assert_eq!(json["feature_gates"][key]["value"], false, "gate {key}");
    }
}

#[tokio::test]
async fn statsig_bootstrap_has_the_door_gates_off_and_keeps_the_rest() {
    let fake = fake_cursor().await;
    let (services, upstream) = setup();
    let port = fake.addr.port();
    assert_eq!(
        classify("/aiserver.v1.AnalyticsService/BootstrapStatsig"),
        Some(CursorRpc::BootstrapStatsig)
    );

    let req = statsig_request("gzip", "application/proto");
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(parts.headers[header::CONTENT_TYPE], "application/proto");
    assert!(parts.headers.get(header::CONTENT_ENCODING).is_none());
    let json = statsig_json(&body);
    assert_doors_off(&json);
    let mut want: serde_json::Value = serde_json::from_str(&statsig_config()).expect("json");
    for key in ["579159465", "1967931573"] {
        want["feature_gates"][key]["value"] = false.into();
        want["feature_gates"][key]["rule_id"] = json["feature_gates"][key]["rule_id"].clone();
    }
    assert_eq!(json, want, "only the two gates change");
    // The other fields, byte for byte and in order.
    let mut tail = Vec::new();
    prost::encoding::uint64::encode(2, &1_790_000_000_000u64, &mut tail);
    prost::encoding::string::encode(7, &"kept".to_owned(), &mut tail);
    assert!(body.starts_with(&tail), "{body:?}");

    let req = statsig_request("framed", "application/proto");
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(
        parts.headers[header::CONTENT_TYPE],
        "application/connect+proto"
    );
    assert_eq!(body[0], 0);
    let len = u32::from_be_bytes(body[1..5].try_into().expect("4 bytes")) as usize;
    assert_eq!(len, body.len() - 5);
    assert_doors_off(&statsig_json(&body[5..]));

    let req = statsig_request("json", "application/json");
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.headers[header::CONTENT_TYPE], "application/json");
    let outer: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(outer["timestamp"], "1");
    let inner: serde_json::Value =
        serde_json::from_str(outer["config"].as_str().expect("config")).expect("json");
    assert_doors_off(&inner);
}

#[tokio::test]
async fn an_unusable_statsig_bootstrap_is_replaced_never_passed() {
    let fake = fake_cursor().await;
    let (services, upstream) = setup();
    for form in ["bad-json", "no-config", "unknown-hash", "refused"] {
        let req = statsig_request(form, "application/proto");
        let (parts, body) = call(&services, &upstream, fake.addr.port(), req).await;
        assert_eq!(parts.status, StatusCode::OK, "{form}");
        let json = statsig_json(&body);
        assert_doors_off(&json);
        assert_eq!(
            json["feature_gates"].as_object().expect("gates").len(),
            2,
            "{form}: ours alone"
        );
    }
    // Unreachable upstream: ours too, in the client's codec.
    let closed = tokio::net::TcpSocket::new_v4().expect("socket");
    closed.bind(([127, 0, 0, 1], 0).into()).expect("bind");
    let port = closed.local_addr().expect("addr").port();
    let req = statsig_request("gzip", "application/json");
    let (parts, body) = call(&services, &upstream, port, req).await;
    assert_eq!(parts.status, StatusCode::OK);
    let outer: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let inner: serde_json::Value =
        serde_json::from_str(outer["config"].as_str().expect("config")).expect("json");
    assert_doors_off(&inner);
}

#[tokio::test]
async fn a_server_config_we_cannot_rewrite_is_replaced_by_ours() {
    let fake = fake_cursor().await;
    let (services, upstream) = setup();
    let mut req = request(
        "/aiserver.v1.ServerConfigService/GetServerConfig",
        "application/proto",
    );
    req.headers_mut()
        .insert("x-send-garbage", header::HeaderValue::from_static("1"));
    let (parts, body) = call(&services, &upstream, fake.addr.port(), req).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_ne!(
        &body[..],
        b"\x12\xff\xff",
        "never upstream's unrewritten bytes"
    );
    let config = ai::GetServerConfigResponse::decode(body).expect("decodes");
    assert_eq!(
        config.http2_config,
        ai::Http2Config::ForceBidiDisabled as i32,
        "the Agent stays on the transport that reaches us"
    );
}
