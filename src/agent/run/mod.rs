//! The run state machine: one per agent run, transport-agnostic.
//!
//! It consumes `AgentClientMessage`s (through [`RunHandle::input`](super::RunHandle)) and
//! produces `AgentServerMessage`s followed by exactly one end of stream. Two helper tasks ride
//! along: an inbox pump (answers client heartbeats at once, turns a cancel action into
//! cancellation, forwards everything else) and a heartbeat that speaks when the run has been
//! silent, because clients abort a stream after 30 s without server output.

mod action;
mod background;
mod error;
mod exec;
mod kv;
mod pending;
mod repeats;
mod review;
mod shown;
mod steer;
mod tooling;
mod turn;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::fallback::{Chain, Opened};
use super::messages as msg;
use super::model::ResolvedModel;
use super::state::BlobCache;
use super::RunOutput;
use crate::connect::EndStream;
use crate::proto::agent::v1 as pb;
use crate::provider::{
    FinishReason, Price, ProviderEvent, ProviderRequest, RequestOptions, Turn, TurnBuilder, Usage,
};
use crate::status::Route;
use std::collections::HashMap;

pub use error::RunError;
use exec::ExecBridge;
pub use exec::ExecOutcome;

/// How long a canceled run still waits on the client to store what the turn did.
const WIND_DOWN: Duration = Duration::from_secs(5);

/// Settings a run needs from the configuration.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub heartbeat: Duration,
    /// How long the client may stay silent while we wait on it (exec result, blob ack).
    pub client_timeout: Duration,
    /// Tool rounds allowed in one turn.
    pub max_tool_rounds: u32,
    /// Bound on the history rebuilt from the checkpoint.
    pub max_history_bytes: usize,
    /// How long a foreground command blocks before it moves to the background (ms).
    pub shell_block_ms: u32,
    /// Subagent calls of one model turn that run at the same time.
    pub max_parallel_subagents: u32,
    /// Notice a model stuck repeating its calls (see `repeats`).
    pub detect_loops: bool,
    /// Our models by display name, short id and Cursor id, each with its Cursor id (a
    /// subagent definition may name its model any of these ways).
    pub model_names: Vec<(String, String)>,
}

/// Client messages the run itself consumes (the inbox pump handles the rest).
#[derive(Debug)]
enum ClientEvent {
    Exec(Box<pb::ExecClientMessage>),
    ExecControl(pb::ExecClientControlMessage),
    Kv(pb::KvClientMessage),
    Interaction(pb::InteractionResponse),
    /// Steering: context to add at the next model call of the running turn.
    Inject(Box<pb::InjectContextAction>),
    /// The user pressed "move to background" on a running command.
    BackgroundShell(pb::BackgroundShellAction),
    /// Background tasks finished: the model is told.
    Completion(Box<pb::BackgroundTaskCompletionAction>),
    /// The user stopped a subagent (by its id).
    CancelSubagent(String),
    /// The user moved a running subagent call (by its tool call id) to the background.
    BackgroundSubagent(String),
}

/// The sending side of a run, shared with the heartbeat and the inbox pump.
///
/// A send waits for room while the run lives; once the run is canceled, its sends together
/// wait at most [`WIND_DOWN`] (counted from the first send after the cancel), so a reader that
/// stopped reading can never hold a canceled run.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::Sender<RunOutput>,
    start: Instant,
    /// Milliseconds since `start` of the last message sent.
    last_sent_ms: Arc<AtomicU64>,
    cancel: CancellationToken,
    /// Set at the first send after the cancel: when sends stop waiting.
    wind_down_until: Arc<std::sync::OnceLock<tokio::time::Instant>>,
    /// Whether the user saw part of the turn (decides how a failure ends).
    shown: shown::Shown,
}

impl Outbox {
    fn new(tx: mpsc::Sender<RunOutput>, cancel: CancellationToken) -> Self {
        Outbox {
            tx,
            start: Instant::now(),
            last_sent_ms: Arc::new(AtomicU64::new(0)),
            cancel,
            wind_down_until: Arc::default(),
            shown: Default::default(),
        }
    }

    async fn send(&self, m: pb::AgentServerMessage) -> Result<(), RunError> {
        self.send_output(RunOutput::Message(Box::new(m))).await
    }

    /// Room for one output: waits while the run lives, bounded once it is canceled.
    async fn reserve(&self) -> Result<mpsc::Permit<'_, RunOutput>, RunError> {
        if !self.cancel.is_cancelled() {
            tokio::select! {
                biased;
                permit = self.tx.reserve() => return permit.map_err(|_| RunError::ClientGone),
                _ = self.cancel.cancelled() => {}
            }
        }
        let until = *self
            .wind_down_until
            .get_or_init(|| tokio::time::Instant::now() + WIND_DOWN);
        match tokio::time::timeout_at(until, self.tx.reserve()).await {
            Ok(permit) => permit.map_err(|_| RunError::ClientGone),
            // Nobody takes the output of a canceled run: give up on it.
            Err(_) => Err(RunError::ClientGone),
        }
    }

    async fn send_output(&self, o: RunOutput) -> Result<(), RunError> {
        let permit = self.reserve().await?;
        self.shown.note(&o);
        permit.send(o);
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_sent_ms.store(ms, Ordering::Relaxed);
        Ok(())
    }

    fn silent_for(&self) -> Duration {
        let now = self.start.elapsed();
        now.saturating_sub(Duration::from_millis(
            self.last_sent_ms.load(Ordering::Relaxed),
        ))
    }
}

/// What a finished run reports for the summary line and the status page.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    pub usage: Usage,
    pub steps: u64,
    /// Dollars, when every call's price is known.
    pub cost_usd: Option<f64>,
}

pub(super) struct Run {
    pub request_id: String,
    pub model: ResolvedModel,
    /// Where the model's calls go: its provider, then its fallbacks.
    pub chain: Chain,
    pub settings: RunSettings,
    pub cache: BlobCache,
    /// The first `AgentRunRequest` as received (see [`RunRequest`](super::RunRequest)).
    pub first_wire: bytes::Bytes,
    /// The client's secrets in the scrubber, until the run's end frame is out.
    pub secrets: crate::secret::Registration,
    /// Subagent calls waiting for their child runs (shared by every run).
    pub subagents: super::subagents::Registry,
    /// When this run is a subagent: its kind and limits.
    pub child: Option<super::subagents::Child>,
}

impl Run {
    /// Drive the run to its end. Always sends exactly one `RunOutput::End` (unless the
    /// receiver is gone), whatever happens inside — including a panic.
    pub(super) fn spawn(
        mut self,
        first: pb::AgentRunRequest,
        inbox: mpsc::Receiver<Box<pb::AgentClientMessage>>,
        out: mpsc::Sender<RunOutput>,
        cancel: CancellationToken,
        failure: Arc<std::sync::Mutex<Option<RunError>>>,
        ticket: crate::status::RunTicket,
    ) {
        let span = tracing::info_span!(
            "run",
            request_id = %self.request_id,
            model = %self.model.config.cursor_id(),
            provider = %self.provider_name(),
        );
        let outbox = Outbox::new(out, cancel.clone());
        let done = CancellationToken::new();
        let (events_tx, events_rx) = mpsc::channel(64);
        let resolutions = pending::CancelResolutions::default();
        tokio::spawn(
            pump_inbox(
                inbox,
                events_tx,
                outbox.clone(),
                cancel.clone(),
                done.clone(),
                resolutions.clone(),
            )
            .instrument(span.clone()),
        );
        tokio::spawn(
            heartbeat(outbox.clone(), self.settings.heartbeat, done.clone())
                .instrument(span.clone()),
        );

        let secrets = std::mem::take(&mut self.secrets);
        // A child run can be canceled by its subagent id while it runs; a run that is nobody's
        // child yet may be named one by a request that comes after it started.
        let registry = self.subagents.clone();
        let subagent_id = self
            .child
            .as_ref()
            .map(|c| c.conversation_id.clone())
            .or_else(|| first.conversation_id.clone())
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| self.request_id.clone());
        match &self.child {
            Some(child) => registry.track_child(&subagent_id, Some(child), cancel.clone()),
            None => registry.track_unlinked(&self.request_id, &subagent_id, cancel.clone()),
        }
        let parent_key = self.request_id.clone();
        let stopped = cancel.clone();
        let model_name = self.model.config.cursor_id();
        let provider_name = self.provider_name();
        let route = Arc::new(std::sync::Mutex::new(Route::default()));
        let started = Instant::now();
        let state = RunState {
            run: self,
            out: outbox.clone(),
            events: events_rx,
            events_open: true,
            cancel: cancel.clone(),
            exec: ExecBridge::default(),
            kv: kv::KvBridge::default(),
            interactions: HashMap::new(),
            next_interaction: 1,
            shell_streams: HashMap::new(),
            detached: Default::default(),
            step: 0,
            usage: Usage::default(),
            last_call: Usage::default(),
            cost_usd: Some(0.0),
            route: route.clone(),
            progress: ticket.progress(),
            steering: steer::Steering::new(first.run_id.clone()),
            cancel_resolutions: resolutions,
            winding_down: false,
            plan_entry: None,
            partial: None,
            completions: Vec::new(),
        };
        // Boxed: the request is several KiB, and the run's future would otherwise carry copies
        // of it in every state for the run's whole life.
        let work = tokio::spawn(state.execute(Box::new(first)).instrument(span.clone()));
        tokio::spawn(
            async move {
                let result = work.await;
                registry.untrack(&subagent_id);
                registry.untrack_unlinked(&parent_key);
                // The client never delivers a subagent's Stop: a parent's end reaches its
                // children here.
                registry.parent_ended(&parent_key, stopped.is_cancelled());
                let result = match result {
                    Ok(r) => r,
                    Err(e) if e.is_panic() => {
                        warn!("agent run task panicked");
                        Err(RunError::Internal(
                            "the agent run failed unexpectedly (a bug in cursor-byok; see its log)"
                                .into(),
                        ))
                    }
                    Err(_) => Err(RunError::Canceled),
                };
                // A cancel by the transport (a bad client frame, the client gone) ends with
                // that reason, not "canceled".
                let failure = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
                let result = match (result, failure) {
                    (Err(RunError::Canceled | RunError::ClientGone), Some(why)) => Err(why),
                    (r, _) => r,
                };
                done.cancel();
                let (outcome, error, usage) = match &result {
                    Ok(s) => ("ok", None, Some(s.usage)),
                    Err(RunError::Canceled) => ("canceled", None, None),
                    Err(e) => ("error", Some(e.to_string()), None),
                };
                ticket.finish(outcome, error, usage);
                let secs = started.elapsed().as_secs_f64();
                let via = route_words(
                    &route.lock().unwrap_or_else(|p| p.into_inner()),
                    &provider_name,
                );
                let end = match &result {
                    Ok(summary) => {
                        info!(
                            outcome = "ok",
                            input_tokens = summary.usage.input,
                            output_tokens = summary.usage.output,
                            cache_read_tokens = summary.usage.cache_read,
                            cache_write_tokens = summary.usage.cache_write,
                            cost_usd = summary.cost_usd,
                            steps = summary.steps,
                            "run finished: {model_name} via {via}, {}, {secs:.1}s",
                            usage_words(&summary.usage, summary.cost_usd),
                        );
                        EndStream::ok()
                    }
                    Err(e) => {
                        info!(
                            outcome = "error",
                            side = e.side(),
                            code = e.ending(outbox.shown.get()).code.as_str(),
                            "run ended: {model_name} via {via} after {secs:.1}s: {e}"
                        );
                        EndStream::from_error(e.to_connect_after(outbox.shown.get()))
                    }
                };
                // The end gets the same bounded wind-down as any output of a canceled run;
                // dropped when nobody takes it.
                if outbox.send_output(RunOutput::End(end)).await.is_err() {
                    debug!("the run's end frame was dropped: nobody reads its stream");
                }
                drop(secrets);
            }
            .instrument(span),
        );
    }
}

impl Run {
    /// The display name of the model's first provider.
    pub(in crate::agent) fn provider_name(&self) -> String {
        self.chain
            .targets
            .first()
            .map(|t| t.client.name().to_string())
            .unwrap_or_default()
    }
}

/// Answers client heartbeats, turns a cancel action into cancellation, forwards the rest.
async fn pump_inbox(
    mut inbox: mpsc::Receiver<Box<pb::AgentClientMessage>>,
    events: mpsc::Sender<ClientEvent>,
    out: Outbox,
    cancel: CancellationToken,
    done: CancellationToken,
    resolutions: pending::CancelResolutions,
) {
    use pb::agent_client_message::Message as In;
    loop {
        let m = tokio::select! {
            _ = done.cancelled() => return,
            m = inbox.recv() => m,
        };
        let Some(m) = m else {
            debug!("client finished sending");
            return;
        };
        let event = match m.message {
            Some(In::ClientHeartbeat(_)) => {
                let _ = out.send(msg::heartbeat()).await;
                continue;
            }
            Some(In::ConversationAction(a)) => {
                use pb::conversation_action::Action;
                match a.action {
                    Some(Action::CancelAction(c)) => {
                        debug!("cancel requested by the client");
                        resolutions.set(c.interrupted_pending_tool_call_resolutions);
                        cancel.cancel();
                        continue;
                    }
                    Some(Action::InjectContextAction(i)) => ClientEvent::Inject(Box::new(i)),
                    Some(Action::BackgroundShellAction(b)) => ClientEvent::BackgroundShell(b),
                    Some(Action::BackgroundTaskCompletionAction(c)) => {
                        ClientEvent::Completion(Box::new(c))
                    }
                    Some(Action::CancelSubagentAction(c)) => {
                        ClientEvent::CancelSubagent(c.subagent_id)
                    }
                    Some(Action::BackgroundSubagentAction(b)) => {
                        ClientEvent::BackgroundSubagent(b.tool_call_id)
                    }
                    Some(other) => {
                        // Only a cancel, steering, background work and subagent actions make
                        // sense on a running run.
                        warn!(
                            action = action::branch_name(&other),
                            "conversation action on a running run is not acted on"
                        );
                        continue;
                    }
                    None => continue,
                }
            }
            Some(In::ExecClientMessage(e)) => ClientEvent::Exec(Box::new(e)),
            Some(In::ExecClientControlMessage(c)) => ClientEvent::ExecControl(c),
            Some(In::KvClientMessage(k)) => ClientEvent::Kv(k),
            Some(In::InteractionResponse(r)) => ClientEvent::Interaction(r),
            Some(In::RunRequest(_)) | Some(In::PrewarmRequest(_)) => {
                debug!("ignoring a repeated run/prewarm request");
                continue;
            }
            None => {
                // A branch this build does not know (or an empty message): the transport's
                // schema check has reported it (status page, one warning per kind).
                debug!("client message with no branch this build knows: reported, not acted on");
                continue;
            }
        };
        tokio::select! {
            _ = done.cancelled() => return,
            sent = events.send(event) => if sent.is_err() { return },
        }
    }
}

/// Sends `interaction_update.heartbeat` whenever the run has been silent for `every`.
async fn heartbeat(out: Outbox, every: Duration, done: CancellationToken) {
    loop {
        let wait = every.saturating_sub(out.silent_for());
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if out.silent_for() >= every {
            tokio::select! {
                _ = done.cancelled() => return,
                sent = out.send(msg::heartbeat()) => if sent.is_err() { return },
            }
        }
    }
}

/// The mutable state of one run while it executes.
struct RunState {
    run: Run,
    out: Outbox,
    events: mpsc::Receiver<ClientEvent>,
    events_open: bool,
    cancel: CancellationToken,
    exec: ExecBridge,
    kv: kv::KvBridge,
    /// Interaction responses by query id, as they arrive.
    interactions: HashMap<u32, Option<pb::InteractionResponse>>,
    next_interaction: u32,
    /// Exec id → Cursor call id, for execs whose output streams to the UI (shell).
    shell_streams: HashMap<u32, String>,
    /// Execs nobody waits for (force-background requests): settled as they answer.
    detached: std::collections::HashSet<u32>,
    step: u64,
    /// Usage summed over the turn's model calls.
    usage: Usage,
    /// The latest model call's usage: the size of the context now.
    last_call: Usage,
    /// Dollars so far; `None` once a call's price is unknown.
    cost_usd: Option<f64>,
    /// The target that served the latest call, for the summary line.
    route: Arc<std::sync::Mutex<Route>>,
    /// Live figures for the status page.
    progress: crate::status::RunProgress,
    /// Context injected into the running turn, waiting for the next model call.
    steering: steer::Steering,
    /// What the client said about pending tool calls when it canceled.
    cancel_resolutions: pending::CancelResolutions,
    /// Canceled, storing what the turn did: waits ignore the cancel but are kept short.
    winding_down: bool,
    /// A Build's plan (id, path), registered in the checkpoint.
    plan_entry: Option<(String, String)>,
    /// What a model call canceled mid-stream had produced.
    partial: Option<Turn>,
    /// Background tasks the client reported finished during this run (bounded): the
    /// checkpoint's subagent runs are updated from them.
    completions: Vec<pb::BackgroundTaskCompletion>,
}

/// What one model call produced.
struct ModelCall {
    turn: Turn,
    /// How long the model thought, if it did.
    thinking_ms: u32,
}

impl RunState {
    async fn execute(mut self, req: Box<pb::AgentRunRequest>) -> Result<RunSummary, RunError> {
        let result = self.begin(req).await;
        if result.is_err() {
            self.cancel_injections().await;
            self.abort_open_execs().await;
        }
        result?;
        Ok(RunSummary {
            usage: self.usage,
            steps: self.step,
            cost_usd: self.cost_usd,
        })
    }

    fn options(&self) -> RequestOptions {
        let m = &self.run.model;
        RequestOptions {
            max_output_tokens: Some(m.config.max_output_tokens),
            temperature: m.config.temperature,
            reasoning_effort: m.reasoning_effort.clone(),
            thinking_budget: if m.thinking {
                m.config.thinking_budget
            } else {
                None
            },
        }
    }

    fn provider_error(&self, e: crate::provider::ProviderError) -> RunError {
        if e.kind == crate::provider::ProviderErrorKind::Canceled {
            return RunError::Canceled;
        }
        RunError::Provider {
            model: self.run.model.config.display_name().to_string(),
            source: e,
        }
    }

    /// One model call as one step: text and thinking stream to the client as they arrive,
    /// tool calls show up as partial tool calls while their arguments stream.
    async fn model_step(
        &mut self,
        request: ProviderRequest,
        tools: &super::tools::ToolContext,
    ) -> Result<ModelCall, RunError> {
        self.step += 1;
        let step = self.step;
        let started = Instant::now();
        self.out.send(msg::step_started(step)).await?;
        let Opened {
            first,
            mut stream,
            target,
            ..
        } = self.open(request).await?;
        let price = self.run.chain.targets[target].price;
        let mut pending = Some(first);
        let mut builder = TurnBuilder::new();
        let mut thinking_since: Option<Instant> = None;
        let mut thinking_ms = 0u32;
        let mut usage = Usage::default();
        let mut partial_names: HashMap<String, String> = HashMap::new();
        let mut first_event = true;
        // One waiter for the whole stream, not a fresh one per event.
        let mut canceled = crate::cancel::cancelled(&self.cancel);
        loop {
            let event = tokio::select! {
                biased;
                _ = &mut canceled => {
                    self.partial = Some(std::mem::take(&mut builder).finish());
                    return Err(RunError::Canceled);
                }
                ev = async { pending.take() }, if pending.is_some() => ev,
                ev = stream.recv() => ev,
                ev = self.events.recv(), if self.events_open => {
                    self.dispatch(ev).await?;
                    continue;
                }
            };
            let Some(event) = event else {
                return Err(RunError::Internal(
                    "the provider stream ended without a finish".into(),
                ));
            };
            if std::mem::take(&mut first_event) {
                self.progress.provider_latency(started.elapsed());
            }
            builder.push(&event);
            if !matches!(
                event,
                ProviderEvent::ReasoningDelta(_) | ProviderEvent::Usage(_)
            ) {
                thinking_ms += self.end_thinking(&mut thinking_since).await?;
            }
            match event {
                ProviderEvent::TextDelta(text) => {
                    let tokens = msg::estimate_tokens(&text);
                    self.out.send(msg::text_delta(text)).await?;
                    self.out.send(msg::token_delta(tokens)).await?;
                }
                ProviderEvent::ReasoningDelta(text) => {
                    thinking_since.get_or_insert_with(Instant::now);
                    self.out.send(msg::thinking_delta(text)).await?;
                }
                ProviderEvent::ToolCallStarted { id, name } => {
                    if let Some(tc) = super::tools::placeholder(tools, &id, &name) {
                        self.out
                            .send(msg::partial_tool_call(
                                cursor_call_id(step, &id),
                                id.clone(),
                                tc,
                                String::new(),
                            ))
                            .await?;
                        partial_names.insert(id, name);
                    }
                }
                ProviderEvent::ToolCallArgsDelta { id, delta } => {
                    if let Some(name) = partial_names.get(&id) {
                        if let Some(tc) = super::tools::placeholder(tools, &id, name) {
                            self.out
                                .send(msg::partial_tool_call(
                                    cursor_call_id(step, &id),
                                    id.clone(),
                                    tc,
                                    delta,
                                ))
                                .await?;
                        }
                    }
                }
                ProviderEvent::ReasoningDone { .. } | ProviderEvent::ToolCallFinished { .. } => {}
                ProviderEvent::Usage(u) => usage = u,
                ProviderEvent::Finished { reason } => {
                    if reason == FinishReason::Length {
                        self.out
                            .send(msg::notice(
                                "\n\n(The model stopped at its output token limit.)".into(),
                            ))
                            .await?;
                    }
                    break;
                }
                ProviderEvent::Error(e) => return Err(self.provider_error(e)),
            }
        }
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.out.send(msg::step_completed(step, elapsed)).await?;
        self.record_call(&usage, price);
        self.last_call = usage;
        Ok(ModelCall {
            turn: builder.finish(),
            thinking_ms,
        })
    }

    /// Start a model call on the chain (cancellable while it waits for a first event).
    async fn open(&mut self, request: ProviderRequest) -> Result<Opened, RunError> {
        let opened = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(RunError::Canceled),
            o = self.run.chain.open(request, &self.cancel) => o,
        };
        self.progress.route(opened.route.clone());
        *self.route.lock().unwrap_or_else(|p| p.into_inner()) = opened.route.clone();
        Ok(opened)
    }

    /// Count one model call's tokens and cost (at the price of the target that served it).
    fn record_call(&mut self, usage: &Usage, price: Option<Price>) {
        add_usage(&mut self.usage, usage);
        self.cost_usd = match (self.cost_usd, price) {
            (Some(sum), Some(price)) => Some(sum + price.cost(usage)),
            _ => None,
        };
        self.progress.usage(self.usage, self.cost_usd);
    }

    /// Close an open thinking block; returns how long it lasted.
    async fn end_thinking(&mut self, since: &mut Option<Instant>) -> Result<u32, RunError> {
        let Some(t) = since.take() else { return Ok(0) };
        let ms = u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.out.send(msg::thinking_completed(ms)).await?;
        Ok(u32::try_from(ms).unwrap_or(u32::MAX))
    }

    /// Wait for the next client event, giving up at `deadline`.
    async fn next_event(
        &mut self,
        deadline: tokio::time::Instant,
        what: &str,
    ) -> Result<ClientEvent, RunError> {
        if !self.events_open {
            return Err(RunError::ClientGone);
        }
        if self.winding_down {
            let deadline = deadline.min(tokio::time::Instant::now() + WIND_DOWN);
            return tokio::select! {
                _ = tokio::time::sleep_until(deadline) => Err(RunError::Canceled),
                ev = self.events.recv() => ev.ok_or(RunError::ClientGone),
            };
        }
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(RunError::Canceled),
            _ = tokio::time::sleep_until(deadline) => Err(RunError::ClientTimeout {
                what: what.to_string(),
                secs: self.run.settings.client_timeout.as_secs(),
            }),
            ev = self.events.recv() => match ev {
                Some(ev) => Ok(ev),
                None => {
                    self.events_open = false;
                    Err(RunError::ClientGone)
                }
            },
        }
    }

    /// Route a client event to whatever waits for it. Shell output streams on to the UI.
    async fn dispatch(&mut self, ev: Option<ClientEvent>) -> Result<(), RunError> {
        match ev {
            None => self.events_open = false,
            Some(ClientEvent::Exec(m)) => {
                let id = m.id;
                if let (Some(call_id), Some(pb::exec_client_message::Message::ShellStream(s))) =
                    (self.shell_streams.get(&id), m.message.as_ref())
                {
                    if let Some(delta) = super::tools::shell_delta(s) {
                        let update = msg::tool_call_delta(call_id.clone(), delta);
                        self.out.send(update).await?;
                    }
                }
                if !self.exec.on_result(*m) {
                    debug!(id, "exec result for no exec of ours");
                }
                self.settle_detached(id);
            }
            Some(ClientEvent::ExecControl(c)) => {
                if let Some(id) = self.exec.on_control(c) {
                    self.settle_detached(id);
                }
            }
            Some(ClientEvent::BackgroundShell(b)) => self.force_background(b).await?,
            Some(ClientEvent::Completion(c)) => self.on_completion(&c),
            Some(ClientEvent::Kv(k)) => self.kv.on_message(k),
            Some(ClientEvent::Inject(i)) => self.on_inject(*i).await?,
            Some(ClientEvent::CancelSubagent(id)) => self.cancel_subagent(&id),
            Some(ClientEvent::BackgroundSubagent(call)) => self.background_subagent(call).await?,
            Some(ClientEvent::Interaction(r)) => {
                if let Some(slot) = self.interactions.get_mut(&r.id) {
                    *slot = Some(r);
                } else {
                    debug!(id = r.id, "interaction response for no query of ours");
                }
            }
        }
        Ok(())
    }

    /// Send execs and wait until each has answered (first result that is final, or closed).
    /// Any word from the client about one of them restarts the clock.
    async fn run_execs(
        &mut self,
        execs: Vec<(pb::exec_server_message::Message, Option<String>)>,
        what: &str,
    ) -> Result<Vec<ExecOutcome>, RunError> {
        let mut ids = Vec::with_capacity(execs.len());
        for (args, stream_to) in execs {
            let (id, exec_id) = self.exec.open();
            if let Some(call_id) = stream_to {
                self.shell_streams.insert(id, call_id);
            }
            self.out.send(msg::exec(id, exec_id, args)).await?;
            ids.push(id);
        }
        let timeout = self.run.settings.client_timeout;
        let mut deadline = tokio::time::Instant::now() + timeout;
        while !ids
            .iter()
            .all(|id| self.exec.is_done(*id, false) || self.exec.has_final(*id))
        {
            let ev = self.next_event(deadline, what).await?;
            let concerns_us = match &ev {
                ClientEvent::Exec(m) => ids.contains(&m.id),
                ClientEvent::ExecControl(_) => true,
                _ => false,
            };
            self.dispatch(Some(ev)).await?;
            if concerns_us {
                deadline = tokio::time::Instant::now() + timeout;
            }
        }
        Ok(ids
            .into_iter()
            .map(|id| {
                self.shell_streams.remove(&id);
                self.exec.take(id)
            })
            .collect())
    }

    /// One exec, waited for.
    async fn run_exec(
        &mut self,
        args: pb::exec_server_message::Message,
        stream_to: Option<String>,
        what: &str,
    ) -> Result<ExecOutcome, RunError> {
        let mut outcomes = self.run_execs(vec![(args, stream_to)], what).await?;
        Ok(outcomes.pop().unwrap_or_default())
    }

    /// Stop the subagent `id`: its child run, when it is one of ours.
    fn cancel_subagent(&self, id: &str) {
        if self.run.subagents.cancel(id) {
            info!(subagent = id, "subagent canceled by the user");
        } else {
            warn!(
                subagent = id,
                "cancel for a subagent that is not running here (finished, or on another model)"
            );
        }
    }

    /// Ask the client to move the running subagent call `call` to the background; its
    /// `subagent_result` then comes at once, marked backgrounded. The answer to this exec is
    /// not waited for.
    async fn background_subagent(&mut self, call: String) -> Result<(), RunError> {
        let (id, exec_id) = self.exec.open();
        self.exec.take(id);
        let args = pb::exec_server_message::Message::ForceBackgroundSubagentArgs(
            pb::ForceBackgroundSubagentArgs { tool_call_id: call },
        );
        self.out.send(msg::exec(id, exec_id, args)).await
    }

    /// The SDK and CLI send no request context: ask the client for it.
    async fn fetch_request_context(&mut self) -> Result<Option<pb::RequestContext>, RunError> {
        use pb::exec_client_message::Message as R;
        let args =
            pb::exec_server_message::Message::RequestContextArgs(pb::RequestContextArgs::default());
        let outcome = self.run_exec(args, None, "the request context").await?;
        if let Some(err) = outcome.thrown {
            warn!("client could not build the request context: {err}");
            return Ok(None);
        }
        for r in outcome.results {
            if let R::RequestContextResult(res) = r {
                return Ok(match res.result {
                    Some(pb::request_context_result::Result::Success(s)) => s.request_context,
                    Some(pb::request_context_result::Result::Error(e)) => {
                        warn!("client request context error: {}", e.error);
                        None
                    }
                    _ => None,
                });
            }
        }
        Ok(None)
    }

    /// On failure or cancel, tell the client to stop whatever it is still running for us.
    async fn abort_open_execs(&mut self) {
        for id in self.exec.open_ids() {
            let _ = self.out.send(msg::exec_abort(id)).await;
            self.exec.take(id);
        }
    }
}

/// Cursor's call id for a model tool call: providers reuse ids across rounds
/// (`functions.Shell:0`), so ours carry the step.
fn cursor_call_id(step: u64, model_call_id: &str) -> String {
    format!("{model_call_id}#s{step}")
}

/// `fake/gpt-fake (skipped: a/b: HTTP 429 …)`, or the provider's name before any call.
fn route_words(route: &Route, provider_name: &str) -> String {
    let mut s = route
        .target
        .clone()
        .unwrap_or_else(|| provider_name.to_string());
    if !route.skipped.is_empty() {
        s.push_str(&format!(" (skipped {})", route.skipped.join("; ")));
    }
    s
}

/// `120 in (100 cache read) / 7 out tokens, $0.0012` for the summary line.
fn usage_words(u: &Usage, cost_usd: Option<f64>) -> String {
    let mut s = format!("{} in", u.input);
    if u.cache_read > 0 || u.cache_write > 0 {
        s.push_str(&format!(
            " ({} cache read, {} cache write)",
            u.cache_read, u.cache_write
        ));
    }
    s.push_str(&format!(" / {} out tokens", u.output));
    match cost_usd {
        // Cheap runs keep their significant digits.
        Some(c) if c < 0.01 => s.push_str(&format!(", ${c:.6}")),
        Some(c) => s.push_str(&format!(", ${c:.4}")),
        None => s.push_str(", price unknown"),
    }
    s
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input += u.input;
    total.output += u.output;
    total.cache_read += u.cache_read;
    total.cache_write += u.cache_write;
    total.reasoning += u.reasoning;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live run waits for room as long as it takes; once canceled, its sends together give
    /// up after the wind-down, so a reader that stopped reading cannot hold the run.
    #[tokio::test(start_paused = true)]
    async fn a_canceled_runs_sends_give_up_after_the_wind_down() {
        let (tx, _rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let out = Outbox::new(tx, cancel.clone());
        out.send(msg::heartbeat()).await.unwrap(); // the channel is full now
        let blocked = tokio::spawn({
            let out = out.clone();
            async move { out.send(msg::heartbeat()).await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!blocked.is_finished(), "a live run waits for its reader");
        let canceled_at = tokio::time::Instant::now();
        cancel.cancel();
        assert!(matches!(blocked.await.unwrap(), Err(RunError::ClientGone)));
        assert_eq!(canceled_at.elapsed(), WIND_DOWN);
        // Later sends (the end frame) share that deadline: they give up at once.
        let later = tokio::time::Instant::now();
        let end = out.send_output(RunOutput::End(EndStream::ok())).await;
        assert!(matches!(end, Err(RunError::ClientGone)));
        assert_eq!(later.elapsed(), Duration::ZERO);
    }

    #[test]
    fn the_summary_line_names_tokens_and_cost() {
        let u = Usage {
            input: 120,
            output: 7,
            cache_read: 100,
            ..Usage::default()
        };
        assert_eq!(
            usage_words(&u, Some(0.000146)),
            "120 in (100 cache read, 0 cache write) / 7 out tokens, $0.000146"
        );
        let plain = Usage {
            input: 5,
            output: 1,
            ..Usage::default()
        };
        assert_eq!(
            usage_words(&plain, None),
            "5 in / 1 out tokens, price unknown"
        );
        let route = Route {
            target: Some("backup/m".into()),
            skipped: vec!["fake/m: Fake is overloaded (HTTP 529): busy".into()],
        };
        assert_eq!(
            route_words(&route, "Fake"),
            "backup/m (skipped fake/m: Fake is overloaded (HTTP 529): busy)"
        );
        assert_eq!(route_words(&Route::default(), "Fake"), "Fake");
    }
}
