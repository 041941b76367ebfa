//! The thin driver of Cmd+K: resolves a call's items, builds its prompt, calls the model's
//! provider chain (the run's clients and fallbacks) and feeds the reply machine, reporting the
//! call to the status page and the usage record like an agent run. No HTTP: the transport
//! hands in a decoded call and sends what comes out of the channel.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::cache::{CacheLimits, ContextCache, Resolved};
use super::call::{CmdKCall, Surface};
use super::decide::{whose, Whose};
use super::prompt::{self, PromptInput};
use super::reply::{CmdKResponse, Reply, Shape};
use crate::agent::fallback::Chain;
use crate::agent::{model, Agent, ResolvedModel, RunError};
use crate::connect::{ConnectError, EndStream};
use crate::provider::{
    FinishReason, ProviderError, ProviderErrorKind, ProviderEvent, RequestOptions, Usage,
};
use crate::status::{RunProgress, RunStart, RunTicket};

/// What a Cmd+K stream sends: response messages, then one end.
#[derive(Debug)]
pub enum Step {
    Frame(CmdKResponse),
    End(EndStream),
}

/// Bounded: a slow client slows the provider read instead of growing memory.
const CHANNEL_CAPACITY: usize = 32;
/// Request ids of Cmd+K calls served here, remembered for their `ReportCmdKFate`.
const SERVED_IDS: usize = 1_024;

/// Cmd+K on the user's models. Cheap to clone.
#[derive(Clone)]
pub struct CmdK {
    inner: Arc<CmdKShared>,
}

struct CmdKShared {
    agent: Agent,
    cache: ContextCache,
    served: Mutex<VecDeque<String>>,
}

impl CmdK {
    pub fn new(agent: Agent) -> CmdK {
        Self::with_cache(agent, CacheLimits::default())
    }

    pub(crate) fn with_cache(agent: Agent, limits: CacheLimits) -> CmdK {
        CmdK {
            inner: Arc::new(CmdKShared {
                agent,
                cache: ContextCache::new(limits),
                served: Mutex::default(),
            }),
        }
    }

    pub fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    /// Whose model a call naming `model_name` runs on (see [`whose`]).
    pub fn whose(&self, model_name: Option<&str>) -> Result<Whose, ConnectError> {
        whose(self.agent().config(), model_name)
    }

    /// Resolve (and keep) a request's items for `session`: what rerank answers with.
    pub fn resolve(
        &self,
        session: &str,
        items: &[crate::proto::aiserver::v1::PotentiallyCachedContextItem],
    ) -> Resolved {
        self.inner.cache.resolve(session, items)
    }

    /// Was the Cmd+K with this request id served here?
    pub fn served(&self, request_id: &str) -> bool {
        let served = self.inner.served.lock().unwrap_or_else(|p| p.into_inner());
        served.iter().any(|id| id == request_id)
    }

    fn remember(&self, request_id: &str) {
        let mut served = self.inner.served.lock().unwrap_or_else(|p| p.into_inner());
        served.push_back(request_id.to_string());
        while served.len() > SERVED_IDS {
            served.pop_front();
        }
    }

    /// Serve `call` on `model_id` (one of ours). The stream ends after one [`Step::End`];
    /// dropping the receiver (the client left) ends the provider call.
    pub fn start(
        &self,
        call: CmdKCall,
        model_id: &str,
        session: &str,
        request_id: &str,
    ) -> mpsc::Receiver<Step> {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        self.remember(request_id);
        let surface = call.surface();
        let (items, statuses) = match self.resolve(session, call.context_items()) {
            Resolved::Missing(hashes) => {
                // Fresh channel with room for both: cannot fail for lack of capacity.
                let _ = tx.try_send(Step::Frame(CmdKResponse::missing(surface, hashes)));
                let _ = tx.try_send(Step::End(EndStream::ok()));
                return rx;
            }
            Resolved::Items { items, statuses } => (items, statuses),
        };
        let mut opening = Vec::new();
        if !statuses.is_empty() {
            opening.push(CmdKResponse::statuses(surface, statuses));
        }
        if call.for_caching() {
            let _ = tx.try_send(Step::End(EndStream::ok()));
            return rx;
        }
        match self.job(&call, &items, model_id, request_id) {
            Ok(job) => {
                tokio::spawn(drive(job, call, opening, tx));
            }
            Err(e) => {
                tracing::warn!("Cmd+K refused: {e}");
                for f in opening {
                    let _ = tx.try_send(Step::Frame(f));
                }
                let _ = tx.try_send(Step::End(EndStream::from_error(e.to_connect())));
            }
        }
        rx
    }

    fn job(
        &self,
        call: &CmdKCall,
        items: &[crate::proto::aiserver::v1::ContextItem],
        model_id: &str,
        request_id: &str,
    ) -> Result<Job, RunError> {
        let agent = self.agent();
        let config = agent.config();
        let model = model::resolve(config, model_id, &[]).ok_or_else(|| {
            RunError::Internal(format!(
                "model `{model_id}` is not configured in cursor-byok"
            ))
        })?;
        let chain = agent.chain(&model, Some(call.session_id().to_string()))?;
        let request = prompt::build(PromptInput {
            call,
            items,
            model: &chain.targets[0].model,
            options: options(&model),
            max_bytes: config.limits.max_history_bytes,
        });
        let shape = Shape::of(
            call.surface(),
            call.chat_mode(),
            prompt::selection_range(items),
        );
        let ticket = agent.status().run_started(RunStart {
            request_id: request_id.to_string(),
            model: model.config.cursor_id(),
            provider: chain.targets[0].client.name().to_string(),
            transport: match call.surface() {
                Surface::Editor => "CmdK".into(),
                Surface::Terminal => "TerminalCmdK".into(),
            },
        });
        Ok(Job {
            model,
            chain,
            request,
            shape,
            ticket,
        })
    }
}

fn options(m: &ResolvedModel) -> RequestOptions {
    RequestOptions {
        max_output_tokens: Some(m.config.max_output_tokens),
        temperature: m.config.temperature,
        reasoning_effort: m.reasoning_effort.clone(),
        thinking_budget: m.thinking.then_some(m.config.thinking_budget).flatten(),
    }
}

/// One call ready to run.
struct Job {
    model: ResolvedModel,
    chain: Chain,
    request: crate::provider::ProviderRequest,
    shape: Shape,
    ticket: RunTicket,
}

/// How a call ended, for the status page.
enum Outcome {
    Ok,
    Failed(RunError),
    /// The client closed the stream.
    Left,
}

async fn drive(job: Job, call: CmdKCall, opening: Vec<CmdKResponse>, tx: mpsc::Sender<Step>) {
    // The credentials Cursor's own key setting may carry never show in what leaves.
    let values = call.credential_values();
    let _secrets = crate::base::secret::register_while(values.iter().map(String::as_str));
    let Job {
        model,
        chain,
        request,
        shape,
        ticket,
    } = job;
    let progress = ticket.progress();
    let mut call = RunningCall {
        reply: Reply::new(shape),
        usage: Usage::default(),
        progress,
        tx: &tx,
    };
    let status = format!("Generating with {}", model.config.display_name());
    let outcome = call.run(&model, &chain, request, opening, &status).await;
    let usage = Some(call.usage);
    match outcome {
        Outcome::Ok => ticket.finish("ok", None, usage),
        Outcome::Left => ticket.finish("canceled", Some("Cursor closed the stream".into()), usage),
        Outcome::Failed(e) => {
            let end = e.to_connect_after(call.reply.streamed());
            tracing::warn!(side = %e.side(), "Cmd+K failed: {e}");
            ticket.finish("error", Some(e.to_string()), usage);
            let _ = tx.send(Step::End(EndStream::from_error(end))).await;
        }
    }
}

/// A running call: the reply machine and what it reports.
struct RunningCall<'a> {
    reply: Reply,
    usage: Usage,
    progress: RunProgress,
    tx: &'a mpsc::Sender<Step>,
}

impl RunningCall<'_> {
    async fn run(
        &mut self,
        model: &ResolvedModel,
        chain: &Chain,
        request: crate::provider::ProviderRequest,
        opening: Vec<CmdKResponse>,
        status: &str,
    ) -> Outcome {
        let mut first = opening;
        first.extend(self.reply.opening(status));
        if !self.send(first).await {
            return Outcome::Left;
        }
        let cancel = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let opened = tokio::select! {
            _ = self.tx.closed() => return Outcome::Left,
            o = chain.open(request, &cancel) => o,
        };
        self.progress.provider_latency(started.elapsed());
        self.progress.route(opened.route.clone());
        let price = chain.targets[opened.target].price;
        let mut stream = opened.stream;
        let mut next = Some(opened.first);
        loop {
            let event = match next.take() {
                Some(e) => e,
                // Dropping the stream (on return) ends the provider call.
                None => tokio::select! {
                    _ = self.tx.closed() => return Outcome::Left,
                    e = stream.recv() => e.unwrap_or_else(|| ProviderEvent::Error(
                        ProviderError::new(ProviderErrorKind::StreamError, "provider", "the stream ended without finishing"))),
                },
            };
            let frames = match event {
                ProviderEvent::TextDelta(t) => self.reply.text(&t),
                ProviderEvent::Usage(u) => {
                    self.usage = u;
                    self.progress.usage(u, price.map(|p| p.cost(&u)));
                    continue;
                }
                ProviderEvent::Finished {
                    reason: FinishReason::Stop | FinishReason::ToolCalls,
                } => {
                    let frames = self.reply.finish();
                    if !self.send(frames).await {
                        return Outcome::Left;
                    }
                    let _ = self.tx.send(Step::End(EndStream::ok())).await;
                    return Outcome::Ok;
                }
                ProviderEvent::Finished { reason } => {
                    return Outcome::Failed(unfinished(model, reason));
                }
                ProviderEvent::Error(e) if e.kind == ProviderErrorKind::Canceled => {
                    return Outcome::Left;
                }
                ProviderEvent::Error(source) => {
                    return Outcome::Failed(RunError::Provider {
                        model: model.config.display_name().to_string(),
                        source,
                    });
                }
                _ => continue,
            };
            if !self.send(frames).await {
                return Outcome::Left;
            }
        }
    }

    /// Send frames in order; `false` when the client is gone.
    async fn send(&self, frames: Vec<CmdKResponse>) -> bool {
        for f in frames {
            if self.tx.send(Step::Frame(f)).await.is_err() {
                return false;
            }
        }
        true
    }
}

/// The model stopped for another reason than being done (its output limit, a filter): the
/// edit is incomplete, so the stream ends with an error rather than as a finished edit.
fn unfinished(model: &ResolvedModel, reason: FinishReason) -> RunError {
    let why = match reason {
        FinishReason::Length => "it reached its output limit".to_string(),
        FinishReason::ContentFilter => "its content filter stopped it".to_string(),
        FinishReason::Refusal => "it refused".to_string(),
        FinishReason::Other(r) => format!("it stopped ({r})"),
        FinishReason::Stop | FinishReason::ToolCalls => "it stopped".to_string(),
    };
    RunError::Provider {
        model: model.config.display_name().to_string(),
        source: ProviderError::new(
            ProviderErrorKind::Other,
            &model.config.provider,
            format!("the reply is incomplete: {why}"),
        ),
    }
}
