//! The run's model calls: each opened on the fallback chain (how a call's stream becomes the
//! client's frames is the `machine`'s), and counted (steps, tokens, cost, the target that
//! served it).

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::error::RunError;
use super::setup::{Run, RunSummary};
use crate::agent::fallback::{Chain, Opened};
use crate::agent::model::ResolvedModel;
use crate::provider::{
    Price, ProviderError, ProviderErrorKind, ProviderRequest, RequestOptions, TurnBuilder, Usage,
};
use crate::status::{FallbackRoute, RunProgress};

/// The run's model calls so far.
pub(super) struct ModelCalls {
    /// The run's cancellation.
    pub(super) cancel: CancellationToken,
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
        }
    }

    pub(super) fn summary(&self) -> RunSummary {
        RunSummary {
            usage: self.usage,
            steps: self.step,
            cost_usd: self.cost_usd,
        }
    }

    /// How long the provider took to its first event of a call.
    pub(super) fn provider_latency(&self, d: std::time::Duration) {
        self.progress.provider_latency(d);
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
    provider_failure(model.config.display_name(), e)
}

/// A failed model call of the model shown as `model_name`, as the run reports it.
pub(super) fn provider_failure(model_name: &str, e: ProviderError) -> RunError {
    if e.kind == ProviderErrorKind::Canceled {
        return RunError::Canceled;
    }
    RunError::Provider {
        model: model_name.to_string(),
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
