//! Cmd+K's first streamed line: the time from the provider handing its first token (a whole
//! line) to hyper, to the client decoding the `edit_stream` frame that carries it, through the
//! proxy (CONNECT, TLS, HTTP/2, Connect) in this process. The target is well under 1 ms.
//!
//! ```sh
//! taskset -c 0 cargo bench --bench cmdk
//! ```
//! Knobs: `BENCH_SAMPLES` (default 200).

#[path = "../tests/common/mod.rs"]
#[allow(dead_code, unused_imports)]
mod common;
#[path = "../tests/common/harness.rs"]
mod harness;

#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::convert::Infallible;

use bytes::Bytes;
use common::agent_client::{connect_request, frame, API};
use common::client::{self, Alpn};
use cursor_byok::connect::{Encoding, Frame as ConnectFrame, FrameDecoder, Limits, StreamKind};
use cursor_byok::proto::aiserver::v1 as pb;
use http::{Request, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prost::Message;
use tokio::net::TcpListener;

use support::{env_or, now_ns, percentile};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The provider: its first event is one line holding the time it was handed to hyper.
async fn answer(req: Request<Incoming>) -> Response<UnsyncBoxBody<Bytes, BoxError>> {
    let _ = req.into_body().collect().await;
    let stream = futures_util::stream::unfold(0u8, |i| async move {
        let data = match i {
            0 => format!(
                "data: {{\"id\":\"b\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{}\\n\"}}}}]}}\n\n",
                now_ns()
            ),
            1 => "data: {\"id\":\"b\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_string(),
            _ => return None,
        };
        Some((Ok::<_, BoxError>(Frame::data(Bytes::from(data))), i + 1))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    resp
}

async fn start_provider() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    support::spawn_accept_loop(listener, |stream| async move {
        let service = service_fn(|req| async move { Ok::<_, Infallible>(answer(req).await) });
        let _ = auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
    addr
}

fn request() -> Bytes {
    use pb::context_item::Item;
    let item = |i: Item| pb::PotentiallyCachedContextItem {
        item: Some(pb::potentially_cached_context_item::Item::ContextItem(
            pb::ContextItem {
                item: Some(i),
                ..Default::default()
            },
        )),
    };
    frame(&pb::StreamCmdKRequest {
        context_items: vec![
            item(Item::CmdKSelection(pb::context_item::CmdKSelection {
                lines: vec!["let a = 1;".into()],
                start_line_number: 1,
            })),
            item(Item::CmdKQuery(pb::context_item::CmdKQuery {
                query: "bench".into(),
            })),
        ],
        cmd_k_options: Some(pb::CmdKOptions {
            model_details: Some(pb::ModelDetails {
                model_name: Some(harness::OURS.into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// One Cmd+K through the proxy: ns from the provider's first line to its decoded frame.
async fn first_line(conn: &mut client::Sender) -> u64 {
    let req = connect_request(
        "/aiserver.v1.CmdKService/StreamCmdK",
        "application/connect+proto",
        "req-bench",
        client::full(request()),
    );
    let resp = conn.send(API, req).await.unwrap();
    let mut body = resp.into_body();
    let mut dec = FrameDecoder::new(StreamKind::Response, Encoding::Identity, Limits::default());
    let mut sent = None;
    while let Some(Ok(chunk)) = body.frame().await {
        let Ok(data) = chunk.into_data() else {
            continue;
        };
        dec.feed(data);
        while let Ok(Some(f)) = dec.next_frame() {
            let ConnectFrame::Message(m) = f else {
                continue;
            };
            let w = pb::StreamCmdKResponseContextWrapped::decode(m).unwrap();
            use pb::stream_cmd_k_response::Response as Out;
            use pb::stream_cmd_k_response_context_wrapped::Response as Wrapped;
            if let Some(Wrapped::RealResponse(pb::StreamCmdKResponse {
                response: Some(Out::EditStream(s)),
            })) = w.response
            {
                if sent.is_none() {
                    let at = now_ns();
                    sent = Some(at - s.text.trim_start_matches('t').parse::<u64>().unwrap());
                }
            }
        }
    }
    sent.expect("a streamed line")
}

fn main() {
    let (rt, _) = support::runtime();
    rt.block_on(async {
        let samples: usize = env_or("BENCH_SAMPLES", 200);
        let provider = start_provider().await;
        let h = harness::harness(vec![], |c| {
            c.providers.get_mut("fake").unwrap().base_url = Some(format!("http://{provider}"));
        })
        .await;
        let mut conn = client::via_proxy(
            h.server.proxy_addr(),
            "api2.cursor.sh:443",
            API,
            client::roots(&[&h.our_ca]),
            Alpn::H2,
        )
        .await;
        // Warm the pools (provider connection, TLS session) first.
        for _ in 0..10 {
            first_line(&mut conn).await;
        }
        let mut ns = Vec::with_capacity(samples);
        for _ in 0..samples {
            ns.push(first_line(&mut conn).await);
        }
        let us = |p: f64| percentile(&ns, p) / 1000.0;
        println!(
            "cmd-k first streamed line after the provider's first token, {samples} samples: \
             p50 {:.0} µs, p90 {:.0} µs, p99 {:.0} µs, max {:.0} µs (target: under 1,000 µs)",
            us(0.5),
            us(0.9),
            us(0.99),
            us(1.0)
        );
    });
}
