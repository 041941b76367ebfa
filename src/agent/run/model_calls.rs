//! The run's model calls: each opened on the fallback chain, streamed to the client as one step
//! (text and thinking as they arrive, tool calls as partial tool calls while their arguments
//! stream), and counted (steps, tokens, cost, the target that served it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::Client;
use super::error::RunError;
use super::outbox::Outbox;
use super::setup::{Run, RunSummary};
use crate::agent::fallback::{Chain, Opened};
use crate::agent::messages as msg;
use crate::agent::model::ResolvedModel;
use crate::agent::tools::{self, ToolContext};
use crate::proto::agent::v1 as pb;
use crate::provider::{
    FinishReason, Price, ProviderError, ProviderErrorKind, ProviderEvent, ProviderRequest,
    RequestOptions, Turn, TurnBuilder, Usage,
};
use crate::status::{FallbackRoute, RunProgress};

/// What one model call produced.
pub(super) struct ModelCall {
    pub(super) turn: Turn,
    /// How long the model thought, if it did.
    pub(super) thinking_ms: u32,
}

/// The run's model calls so far.
pub(super) struct ModelCalls {
    cancel: CancellationToken,
    /// The latest step (one model call each).
    pub(super) step: u64,
    /// Usage summed over the run's model calls.
    pub(super) usage: Usage,
    /// The latest model call's usage: the size of the context now.
    pub(super) last_call: Usage,
    /// Dollars so far; `None` once a call's price is unknown.
    cost_usd: Option<f64>,
    /// The target that served the latest call, for the summary line.
    route: Arc<Mutex<FallbackRoute>>,
    /// Live figures for the status page.
    progress: RunProgress,
    /// What a model call canceled mid-stream had produced.
    pub(super) partial: Option<Turn>,
}

impl ModelCalls {
    pub(super) fn new(
        cancel: CancellationToken,
        route: Arc<Mutex<FallbackRoute>>,
        progress: RunProgress,
    ) -> ModelCalls {
        ModelCalls {
            cancel,
            step: 0,
            usage: Usage::default(),
            last_call: Usage::default(),
            cost_usd: Some(0.0),
            route,
            progress,
            partial: None,
        }
    }

    pub(super) fn summary(&self) -> RunSummary {
        RunSummary {
            usage: self.usage,
            steps: self.step,
            cost_usd: self.cost_usd,
        }
    }

    /// One model call as one step: text and thinking stream to the client as they arrive,
    /// tool calls show up as partial tool calls while their arguments stream. Client events
    /// that come meanwhile are handled as they come.
    pub(super) async fn model_step(
        &mut self,
        run: &Run,
        client: &mut Client,
        request: ProviderRequest,
        tools: &ToolContext,
    ) -> Result<ModelCall, RunError> {
        self.step += 1;
        let started = Instant::now();
        client.out.send(msg::step_started(self.step)).await?;
        let Opened {
            first,
            mut stream,
            target,
            ..
        } = self.open(&run.chain, request).await?;
        let price = run.chain.targets[target].price;
        let mut s = StepStream::new(self.step);
        let mut pending = Some(first);
        let mut first_event = true;
        // One waiter for the whole stream, not a fresh one per event.
        let mut canceled = crate::base::cancel::cancelled(&self.cancel);
        loop {
            let event = tokio::select! {
                biased;
                _ = &mut canceled => {
                    self.partial = Some(std::mem::take(&mut s.builder).finish());
                    return Err(RunError::Canceled);
                }
                ev = async { pending.take() }, if pending.is_some() => ev,
                ev = stream.recv() => ev,
                ev = client.recv(), if client.listening() => {
                    client.dispatch(ev).await?;
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
            if s.forward(event, &client.out, tools, &run.model).await? {
                break;
            }
        }
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        client
            .out
            .send(msg::step_completed(self.step, elapsed))
            .await?;
        self.record_call(&s.usage, price);
        self.last_call = s.usage;
        Ok(ModelCall {
            turn: s.builder.finish(),
            thinking_ms: s.thinking_ms,
        })
    }

    /// Start a model call on the chain (cancellable while it waits for a first event).
    pub(super) async fn open(
        &mut self,
        chain: &Chain,
        request: ProviderRequest,
    ) -> Result<Opened, RunError> {
        let opened = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(RunError::Canceled),
            o = chain.open(request, &self.cancel) => o,
        };
        self.progress.route(opened.route.clone());
        *self.route.lock().unwrap_or_else(|p| p.into_inner()) = opened.route.clone();
        Ok(opened)
    }

    /// Count one model call's tokens and cost (at the price of the target that served it).
    pub(super) fn record_call(&mut self, usage: &Usage, price: Option<Price>) {
        add_usage(&mut self.usage, usage);
        self.cost_usd = match (self.cost_usd, price) {
            (Some(sum), Some(price)) => Some(sum + price.cost(usage)),
            _ => None,
        };
        self.progress.usage(self.usage, self.cost_usd);
    }

    /// One model call without tools, to its end: its text (its usage recorded).
    pub(super) async fn complete(
        &mut self,
        run: &Run,
        request: ProviderRequest,
    ) -> Result<String, RunError> {
        let opened = self.open(&run.chain, request).await?;
        let price = run.chain.targets[opened.target].price;
        let mut builder = TurnBuilder::new();
        builder.push(&opened.first);
        let mut stream = opened.stream;
        if !opened.first.is_terminal() {
            loop {
                let event = tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => return Err(RunError::Canceled),
                    e = stream.recv() => e,
                };
                match event {
                    Some(e) => builder.push(&e),
                    None => break,
                }
            }
        }
        let turn = builder.finish();
        if let Some(u) = &turn.usage {
            self.record_call(u, price);
        }
        if let Some(e) = turn.error {
            return Err(provider_error(&run.model, e));
        }
        Ok(turn.text())
    }
}

/// One model call's stream as it arrives: the turn it builds, and what is still open.
struct StepStream {
    step: u64,
    builder: TurnBuilder,
    /// When the open thinking block started.
    thinking_since: Option<Instant>,
    thinking_ms: u32,
    usage: Usage,
    /// Tool calls whose arguments stream, by the model's call id: their names.
    partial_names: HashMap<String, String>,
}

impl StepStream {
    fn new(step: u64) -> StepStream {
        StepStream {
            step,
            builder: TurnBuilder::new(),
            thinking_since: None,
            thinking_ms: 0,
            usage: Usage::default(),
            partial_names: HashMap::new(),
        }
    }

    /// Take one provider event into the turn and show it to the client. True once the call
    /// has finished.
    async fn forward(
        &mut self,
        event: ProviderEvent,
        out: &Outbox,
        tools: &ToolContext,
        model: &ResolvedModel,
    ) -> Result<bool, RunError> {
        self.builder.push(&event);
        if !matches!(
            event,
            ProviderEvent::ReasoningDelta(_) | ProviderEvent::Usage(_)
        ) {
            self.end_thinking(out).await?;
        }
        match event {
            ProviderEvent::TextDelta(text) => {
                let tokens = msg::estimate_tokens(&text);
                out.send(msg::text_delta(text)).await?;
                out.send(msg::token_delta(tokens)).await?;
            }
            ProviderEvent::ReasoningDelta(text) => {
                self.thinking_since.get_or_insert_with(Instant::now);
                out.send(msg::thinking_delta(text)).await?;
            }
            ProviderEvent::ToolCallStarted { id, name } => {
                if let Some(tc) = tools::placeholder(tools, &id, &name) {
                    out.send(self.partial_call(&id, tc, String::new())).await?;
                    self.partial_names.insert(id, name);
                }
            }
            ProviderEvent::ToolCallArgsDelta { id, delta } => {
                let placeholder = self
                    .partial_names
                    .get(&id)
                    .and_then(|name| tools::placeholder(tools, &id, name));
                if let Some(tc) = placeholder {
                    out.send(self.partial_call(&id, tc, delta)).await?;
                }
            }
            ProviderEvent::ReasoningDone { .. } | ProviderEvent::ToolCallFinished { .. } => {}
            ProviderEvent::Usage(u) => self.usage = u,
            ProviderEvent::Finished { reason } => {
                if reason == FinishReason::Length {
                    out.send(msg::notice(
                        "\n\n(The model stopped at its output token limit.)".into(),
                    ))
                    .await?;
                }
                return Ok(true);
            }
            ProviderEvent::Error(e) => return Err(provider_error(model, e)),
        }
        Ok(false)
    }

    fn partial_call(&self, id: &str, tc: pb::ToolCall, delta: String) -> pb::AgentServerMessage {
        msg::partial_tool_call(cursor_call_id(self.step, id), id.to_string(), tc, delta)
    }

    /// Close an open thinking block, counting how long it lasted.
    async fn end_thinking(&mut self, out: &Outbox) -> Result<(), RunError> {
        let Some(t) = self.thinking_since.take() else {
            return Ok(());
        };
        let ms = u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX);
        out.send(msg::thinking_completed(ms)).await?;
        self.thinking_ms += u32::try_from(ms).unwrap_or(u32::MAX);
        Ok(())
    }
}

/// The request options of the run's model.
pub(super) fn request_options(m: &ResolvedModel) -> RequestOptions {
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

/// A failed model call, as the run reports it.
pub(super) fn provider_error(model: &ResolvedModel, e: ProviderError) -> RunError {
    if e.kind == ProviderErrorKind::Canceled {
        return RunError::Canceled;
    }
    RunError::Provider {
        model: model.config.display_name().to_string(),
        source: e,
    }
}

/// Cursor's call id for a model tool call: providers reuse ids across rounds
/// (`functions.Shell:0`), so ours carry the step.
pub(super) fn cursor_call_id(step: u64, model_call_id: &str) -> String {
    format!("{model_call_id}#s{step}")
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input += u.input;
    total.output += u.output;
    total.cache_read += u.cache_read;
    total.cache_write += u.cache_write;
    total.reasoning += u.reasoning;
}
