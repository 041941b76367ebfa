//! The calls around a conversation that carry its content (titles, overviews, metadata, forks,
//! blob uploads, analytics transcripts): answered here for a conversation that is ours, passed
//! to Cursor unchanged for one that is Cursor's, and answered here when nothing can tell
//! (never sent on a guess).
//!
//! A call names its conversation (pinned by the transports when its runs were decided), or
//! only its content (`NameAgent`, `CreateTranscriptOverview`): then the content is matched
//! against the hashed prompts of recent runs ([`RecentPrompts`](crate::agent::transport::recent::RecentPrompts)). A call about a conversation no run
//! has decided yet waits [`DECIDE_WAIT`] for one. Titles and overviews of ours are asked of
//! the user's model, or made here from the text's first words ([`title`]). Files, one way:
//! `codec`, `owner` and `title` below this dispatcher.

mod codec;
mod owner;
mod title;

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::agent::transport::recent::RunOwner;
use crate::agent::transport::AgentTransports;
use crate::connect::{decode_unary, Code, ConnectError, Limits};
use crate::http::{full, Body, RequestContext};
use codec::{Ask, Codec, RequestKind};
use owner::Owner;

/// How long a call about a conversation (or a prompt) no run has decided yet waits for one.
/// The desktop sends them beside the run's first message, so the decision is usually in.
pub(crate) const DECIDE_WAIT: Duration = Duration::from_secs(3);
/// A request body must arrive within this.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Strings longer than this are never an id (conversation ids are UUIDs).
const MAX_ID_LEN: usize = 256;

/// A side call handled here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideRpc {
    /// `NameAgent` on `agent.v1.AgentService` or `aiserver.v1.AiService`: the first prompt.
    NameAgent,
    /// `agent.v1.AgentService/CreateTranscriptOverview`: the whole chat as text.
    CreateTranscriptOverview,
    /// `agent.v1.AgentService/UpdateConversationMetadata`: title and workspace paths.
    UpdateConversationMetadata,
    /// `agent.v1.AgentService/NotifyConversationClone`: a fork, before its blobs.
    NotifyConversationClone,
    /// `agent.v1.AgentService/UploadConversationBlobs`: every stored blob of a conversation.
    UploadConversationBlobs,
    /// `agent.v1.AgentService/UploadLocalAgentRunToPromptQuality`: a run's invocations.
    UploadLocalAgentRunToPromptQuality,
    /// `aiserver.v1.AnalyticsService/IngestConversation`: transcript and model.
    IngestConversation,
    /// `aiserver.v1.AiService/NameTab` (legacy): the messages.
    NameTab,
    /// `aiserver.v1.AiService/PotentiallyGenerateMemory` (legacy): every turn.
    PotentiallyGenerateMemory,
}

const PATHS: &[(&str, SideRpc)] = &[
    ("/agent.v1.AgentService/NameAgent", SideRpc::NameAgent),
    ("/aiserver.v1.AiService/NameAgent", SideRpc::NameAgent),
    (
        "/agent.v1.AgentService/CreateTranscriptOverview",
        SideRpc::CreateTranscriptOverview,
    ),
    (
        "/agent.v1.AgentService/UpdateConversationMetadata",
        SideRpc::UpdateConversationMetadata,
    ),
    (
        "/agent.v1.AgentService/NotifyConversationClone",
        SideRpc::NotifyConversationClone,
    ),
    (
        "/agent.v1.AgentService/UploadConversationBlobs",
        SideRpc::UploadConversationBlobs,
    ),
    (
        "/agent.v1.AgentService/UploadLocalAgentRunToPromptQuality",
        SideRpc::UploadLocalAgentRunToPromptQuality,
    ),
    (
        "/aiserver.v1.AnalyticsService/IngestConversation",
        SideRpc::IngestConversation,
    ),
    ("/aiserver.v1.AiService/NameTab", SideRpc::NameTab),
    (
        "/aiserver.v1.AiService/PotentiallyGenerateMemory",
        SideRpc::PotentiallyGenerateMemory,
    ),
];

/// The side call `path` is, if any (exact matches only).
pub fn classify(path: &str) -> Option<SideRpc> {
    PATHS.iter().find(|(p, _)| *p == path).map(|(_, rpc)| *rpc)
}

impl SideRpc {
    fn shape(self) -> RequestKind {
        match self {
            SideRpc::NameAgent => RequestKind::NameAgent,
            SideRpc::CreateTranscriptOverview => RequestKind::TranscriptOverview,
            SideRpc::UpdateConversationMetadata => RequestKind::ConversationMetadata,
            SideRpc::NotifyConversationClone => RequestKind::ConversationClone,
            SideRpc::UploadConversationBlobs => RequestKind::ConversationBlobs,
            SideRpc::UploadLocalAgentRunToPromptQuality => RequestKind::PromptQuality,
            SideRpc::IngestConversation | SideRpc::NameTab | SideRpc::PotentiallyGenerateMemory => {
                RequestKind::Opaque
            }
        }
    }
}

/// Where a side call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SideRoute {
    /// Cursor's conversation: upstream, unchanged.
    Pass,
    /// Answered here; titles and overviews on this model when there is one.
    Here { model_id: Option<String> },
}

/// Serve one side call.
pub async fn handle(
    t: &AgentTransports,
    rpc: SideRpc,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let codec = match Codec::of(&parts.headers) {
        Some(c) if parts.method == Method::POST => c,
        _ => {
            return refuse(
                rpc,
                "it is not a Connect unary POST with the proto or JSON codec",
            )
        }
    };
    let limits = Limits {
        max_frame_bytes: t.agent().config().limits.max_frame_bytes,
        max_decompressed_bytes: t.agent().config().limits.max_decompressed_bytes,
    };
    let wire = match read_body(body, limits.max_frame_bytes).await {
        Ok(b) => b,
        Err(why) => return refuse(rpc, &why),
    };
    let encoding = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok());
    let ask = match decode_unary(wire.clone(), encoding, limits)
        .map_err(|e| e.to_string())
        .and_then(|m| codec::read(rpc.shape(), codec, &m).map_err(|e| e.to_string()))
    {
        Ok(a) => a,
        Err(why) => return refuse(rpc, &format!("its body could not be read: {why}")),
    };
    match decide(t, rpc, &ask).await {
        SideRoute::Pass => {
            tracing::debug!(?rpc, "side call of a Cursor conversation: passed upstream");
            let req = Request::from_parts(parts, full(wire));
            t.upstream().forward(&ctx, req).await
        }
        SideRoute::Here { model_id } => {
            tracing::debug!(?rpc, ?model_id, "side call answered here");
            let text = match rpc.shape() {
                RequestKind::NameAgent => {
                    title::title(t.agent(), model_id.as_deref(), &ask.text).await
                }
                RequestKind::TranscriptOverview => {
                    title::overview(t.agent(), model_id.as_deref(), &ask.text).await
                }
                _ => String::new(),
            };
            ok_response(codec, codec::answer(rpc.shape(), codec, text))
        }
    }
}

/// The request body, whole: bounded in bytes and in time.
async fn read_body(body: Incoming, max: usize) -> Result<Bytes, String> {
    match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, max).collect()).await {
        Err(_) => Err(format!(
            "its body did not arrive within {}s",
            BODY_TIMEOUT.as_secs()
        )),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(format!("its body is larger than {max} bytes"))
        }
        Ok(Err(e)) => Err(format!("its body could not be read: {e}")),
    }
}

/// Ours, Cursor's or undecidable (answered here), waiting [`DECIDE_WAIT`] for a run's
/// decision where one may still come.
async fn decide(t: &AgentTransports, rpc: SideRpc, ask: &Ask) -> SideRoute {
    settle(t.recent_prompts().watch(), DECIDE_WAIT, || {
        decide_now(t, rpc, ask)
    })
    .await
}

/// `now()`'s verdict, asked again after each run decided, until `wait` has passed.
async fn settle(
    mut decided: tokio::sync::watch::Receiver<u64>,
    wait: Duration,
    now: impl Fn() -> Option<SideRoute>,
) -> SideRoute {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(v) = now() {
            return v;
        }
        match tokio::time::timeout_at(deadline, decided.changed()).await {
            Ok(Ok(())) => continue,
            // Nothing decided it in time: content we cannot place is never sent.
            _ => return SideRoute::Here { model_id: None },
        }
    }
}

/// The verdict from what is known now; `None` while a run's decision may still settle it.
fn decide_now(t: &AgentTransports, rpc: SideRpc, ask: &Ask) -> Option<SideRoute> {
    let recent = t.recent_prompts();
    let by_run = |o: Option<RunOwner>| match o? {
        RunOwner::Ours { model_id } => Some(SideRoute::Here {
            model_id: Some(model_id),
        }),
        RunOwner::Cursor => Some(SideRoute::Pass),
    };
    match rpc.shape() {
        RequestKind::NameAgent => by_run(recent.match_prompt(&ask.text)),
        // Sent long after the chat's runs: no run is coming to decide it.
        RequestKind::TranscriptOverview => {
            by_run(recent.match_transcript(&ask.text)).or(Some(SideRoute::Here { model_id: None }))
        }
        RequestKind::ConversationClone => decide_clone(t, ask),
        RequestKind::ConversationMetadata
        | RequestKind::ConversationBlobs
        | RequestKind::PromptQuality => by_owner(owner::owner_of(t, &ask.conversation)),
        RequestKind::Opaque => decide_opaque(t, ask),
    }
}

fn by_owner(owner: Owner) -> Option<SideRoute> {
    match owner {
        Owner::Ours { model_id } => Some(SideRoute::Here {
            model_id: Some(model_id),
        }),
        Owner::Cursor => Some(SideRoute::Pass),
        Owner::Unknown => None,
    }
}

/// A fork follows its source, and is pinned so before its blobs arrive.
fn decide_clone(t: &AgentTransports, ask: &Ask) -> Option<SideRoute> {
    if let Some(v @ SideRoute::Here { .. }) = by_owner(owner::owner_of(t, &ask.conversation)) {
        return Some(v);
    }
    let verdict = by_owner(owner::owner_of(t, &ask.source))?;
    match &verdict {
        SideRoute::Here {
            model_id: Some(model_id),
        } => owner::mark_ours(t, &ask.conversation, model_id),
        SideRoute::Pass => owner::mark_cursor(t, &ask.conversation),
        SideRoute::Here { model_id: None } => {}
    }
    Some(verdict)
}

/// A message without a schema here: ours when any top-level string names one of our models
/// or conversations; Cursor's when one names a conversation of Cursor's and none is ours.
fn decide_opaque(t: &AgentTransports, ask: &Ask) -> Option<SideRoute> {
    let mut cursors = false;
    for s in ask.strings.iter().filter(|s| s.len() <= MAX_ID_LEN) {
        if t.agent().is_our_model(s) {
            return Some(SideRoute::Here {
                model_id: Some(s.clone()),
            });
        }
        match owner::owner_of(t, s) {
            Owner::Ours { model_id } => {
                return Some(SideRoute::Here {
                    model_id: Some(model_id),
                })
            }
            Owner::Cursor => cursors = true,
            Owner::Unknown => {}
        }
    }
    cursors.then_some(SideRoute::Pass)
}

fn ok_response(codec: Codec, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(codec.content_type()),
    );
    resp
}

/// A side call this proxy cannot read: refused with an error, never sent to Cursor.
fn refuse(rpc: SideRpc, why: &str) -> Response<Body> {
    use crate::proto::aiserver::v1 as aiserver;
    tracing::warn!(?rpc, "side call refused: {why}");
    let message = format!(
        "cursor-byok: this {rpc:?} request was not sent to Cursor because {why}; it may carry \
         a conversation on your own model."
    );
    let details = aiserver::ErrorDetails {
        error: aiserver::error_details::Error::CustomMessage as i32,
        details: Some(aiserver::CustomErrorDetails {
            title: "cursor-byok could not read this request".to_string(),
            detail: message.clone(),
            is_retryable: Some(false),
            ..Default::default()
        }),
        is_expected: Some(true),
    };
    let err = ConnectError::new(Code::InvalidArgument, message)
        .with_detail(crate::connect::ErrorDetail::error_details(&details));
    let mut resp = Response::new(full(err.to_unary_json()));
    *resp.status_mut() =
        http::StatusCode::from_u16(err.http_status()).unwrap_or(http::StatusCode::BAD_REQUEST);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::transport::recent::RecentPrompts;

    fn ours() -> RunOwner {
        RunOwner::Ours {
            model_id: "byok-a".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_undecided_call_is_answered_here_after_the_wait() {
        let recent = RecentPrompts::default();
        let start = tokio::time::Instant::now();
        let v = settle(recent.watch(), DECIDE_WAIT, || None).await;
        assert_eq!(v, SideRoute::Here { model_id: None });
        assert_eq!(start.elapsed(), DECIDE_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_decided_during_the_wait_decides_the_call() {
        let recent = std::sync::Arc::new(RecentPrompts::default());
        let rx = recent.watch();
        let start = tokio::time::Instant::now();
        let later = recent.clone();
        let record = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            later.record("name me", ours());
            // What a run's decision does after recording: wake the waiters.
            later.record_run(
                &Default::default(),
                &crate::agent::transport::Decision::Relay,
            );
        });
        let v = settle(rx, DECIDE_WAIT, || match recent.match_prompt("name me") {
            Some(RunOwner::Ours { model_id }) => Some(SideRoute::Here {
                model_id: Some(model_id),
            }),
            _ => None,
        })
        .await;
        record.await.unwrap();
        assert_eq!(
            v,
            SideRoute::Here {
                model_id: Some("byok-a".into())
            }
        );
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn every_side_path_classifies_and_others_do_not() {
        for (path, rpc) in PATHS {
            assert_eq!(classify(path), Some(*rpc));
        }
        assert_eq!(classify("/agent.v1.AgentService/NameAgentX"), None);
        assert_eq!(classify("/agent.v1.AgentService/Run"), None);
    }
}
