//! The run state machine: one per agent run, transport-agnostic.
//!
//! It consumes `AgentClientMessage`s (through [`RunHandle::input`](super::RunHandle)) and
//! produces `AgentServerMessage`s followed by exactly one end of stream. An inbox pump rides
//! along (it answers client heartbeats at once, turns a cancel action into cancellation and
//! forwards everything else to the run).
//!
//! The run is two sans-IO machines, events in and actions out: `lifecycle` is its course (what
//! the request asks for; a model turn's opening, rounds, storing and end; what a cancel or a
//! failure leaves), and `machine` a turn's model rounds. `turn` drives the course and `driver`
//! the rounds: they do every wait of the run, each under cancellation, and the course's steps
//! under the `outbox`'s heartbeat timer, which speaks when the run has been silent because
//! clients abort a stream after 30 s without server output. A model turn opens with `opening`
//! and `history` and is stored by `store`; `tooling` carries out a round of tool calls,
//! `model_calls` opens and counts the model's calls, `client` holds every exchange that waits
//! on the client, and `outbox` / `inbox` are the two channels. This file only starts the tasks
//! and reports the end.

mod action;
mod background;
mod client;
mod command_check;
mod driver;
mod error;
mod exec;
mod history;
mod inbox;
mod kv;
mod lifecycle;
mod machine;
mod model_calls;
mod opening;
mod outbox;
mod pending;
mod repeats;
mod review;
mod setup;
mod shown;
mod steer;
mod store;
mod tooling;
mod turn;

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::agent::run_io::RunOutput;
use crate::connect::EndStream;
use crate::proto::agent::v1 as pb;
use crate::provider::Usage;
use crate::status::{FallbackRoute, RunTicket};
use client::Client;
use model_calls::ModelCalls;
use outbox::Outbox;
use turn::RunState;

pub(crate) use error::RunError;
pub(crate) use setup::Run;
pub(crate) use setup::{RunSettings, RunSummary};

/// Why a transport ended a run, when it did: read by the run when its cancellation fires.
pub(super) type TransportFailure = Arc<Mutex<Option<RunError>>>;

/// Drive `run` to its end. Always sends exactly one `RunOutput::End` (unless the receiver is
/// gone), whatever happens inside — including a panic.
pub(super) fn spawn(
    mut run: Run,
    first: pb::AgentRunRequest,
    inbox: mpsc::Receiver<Box<pb::AgentClientMessage>>,
    out: mpsc::Sender<RunOutput>,
    cancel: CancellationToken,
    failure: TransportFailure,
    ticket: RunTicket,
) {
    let span = tracing::info_span!(
        "run",
        request_id = %run.request_id,
        model = %run.model.config.cursor_id(),
        provider = %run.provider_name(),
    );
    let outbox = Outbox::new(out, cancel.clone());
    let done = CancellationToken::new();
    let (events_tx, events_rx) = mpsc::channel(64);
    let resolutions = pending::CancelResolutions::default();
    tokio::spawn(
        inbox::pump_inbox(
            inbox,
            events_tx,
            outbox.clone(),
            cancel.clone(),
            done.clone(),
            resolutions.clone(),
        )
        .instrument(span.clone()),
    );
    let route = Arc::new(Mutex::new(FallbackRoute::default()));
    track_subagent(&run, &first, &cancel);
    let close = RunClose {
        registry: run.subagents.clone(),
        parent_key: run.request_id.clone(),
        stopped: cancel.clone(),
        done,
        failure,
        model_name: run.model.config.cursor_id(),
        provider_name: run.provider_name(),
        route: route.clone(),
        started: Instant::now(),
        outbox: outbox.clone(),
        secrets: std::mem::take(&mut run.secrets),
    };
    let client = Client::new(
        &run,
        outbox,
        events_rx,
        cancel.clone(),
        first.run_id.clone(),
    );
    let model = ModelCalls::new(cancel, route, ticket.progress());
    let state = RunState::new(run, client, model, resolutions);
    // Boxed: the request is several KiB, and the run's future would otherwise carry copies
    // of it in every state for the run's whole life.
    let work = tokio::spawn(state.execute(Box::new(first)).instrument(span.clone()));
    tokio::spawn(
        async move {
            let result = work.await;
            close.end(result, ticket).await;
        }
        .instrument(span),
    );
}

/// A child run can be canceled by its subagent id while it runs; a run that is nobody's child
/// yet may be named one by a request that comes after it started.
fn track_subagent(run: &Run, first: &pb::AgentRunRequest, cancel: &CancellationToken) {
    let subagent_id = run
        .child
        .as_ref()
        .map(|c| c.conversation_id.clone())
        .or_else(|| first.conversation_id.clone())
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| run.request_id.clone());
    match &run.child {
        Some(child) => {
            run.subagents
                .track_child(&run.request_id, &subagent_id, Some(child), cancel.clone())
        }
        None => run
            .subagents
            .track_unlinked(&run.request_id, &subagent_id, cancel.clone()),
    }
}

/// What the end of a run needs: to untrack it, judge its result, report it, and send its end.
struct RunClose {
    registry: crate::agent::subagents::SubagentCalls,
    /// The run's request id: it is tracked by it, and its children know their parent by it.
    parent_key: String,
    /// The run's cancellation: whether it was stopped.
    stopped: CancellationToken,
    /// Ends the helper tasks.
    done: CancellationToken,
    failure: TransportFailure,
    model_name: String,
    provider_name: String,
    route: Arc<Mutex<FallbackRoute>>,
    started: Instant,
    outbox: Outbox,
    /// The client's secrets stay in the scrubber until the end frame is out.
    secrets: crate::base::secret::Registration,
}

impl RunClose {
    async fn end(
        self,
        work: Result<Result<RunSummary, RunError>, tokio::task::JoinError>,
        ticket: RunTicket,
    ) {
        self.registry.untrack(&self.parent_key);
        self.registry.untrack_unlinked(&self.parent_key);
        // The client never delivers a subagent's Stop: a parent's end reaches its children
        // here.
        self.registry
            .parent_ended(&self.parent_key, self.stopped.is_cancelled());
        let result = self.judge(work);
        self.done.cancel();
        let (outcome, error, usage) = match &result {
            Ok(s) => ("ok", None, Some(s.usage)),
            Err(RunError::Canceled) => ("canceled", None, None),
            Err(e) => ("error", Some(e.to_string()), None),
        };
        ticket.finish(outcome, error, usage);
        let end = self.log(&result);
        // The end gets the same bounded wind-down as any output of a canceled run; dropped
        // when nobody takes it.
        if self.outbox.send_output(RunOutput::End(end)).await.is_err() {
            debug!("the run's end frame was dropped: nobody reads its stream");
        }
        drop(self.secrets);
    }

    /// The run's result: a panic is an internal error, and a cancel by the transport (a bad
    /// client frame, the client gone) ends with that reason, not "canceled".
    fn judge(
        &self,
        work: Result<Result<RunSummary, RunError>, tokio::task::JoinError>,
    ) -> Result<RunSummary, RunError> {
        let result = match work {
            Ok(r) => r,
            Err(e) if e.is_panic() => {
                warn!("agent run task panicked");
                Err(RunError::Internal(
                    "the agent run failed unexpectedly (a bug in cursor-byok; see its log)".into(),
                ))
            }
            Err(_) => Err(RunError::Canceled),
        };
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match (result, failure) {
            (Err(RunError::Canceled | RunError::ClientGone), Some(why)) => Err(why),
            (r, _) => r,
        }
    }

    /// The summary line of the run, and the end of its stream.
    fn log(&self, result: &Result<RunSummary, RunError>) -> EndStream {
        let model_name = &self.model_name;
        let secs = self.started.elapsed().as_secs_f64();
        let via = route_words(
            &self.route.lock().unwrap_or_else(|p| p.into_inner()),
            &self.provider_name,
        );
        let shown = self.outbox.shown.get();
        match result {
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
                    side = %e.side(),
                    code = e.ending(shown).code.as_str(),
                    "run ended: {model_name} via {via} after {secs:.1}s: {e}"
                );
                EndStream::from_error(e.to_connect_after(shown))
            }
        }
    }
}

/// `fake/gpt-fake (skipped: a/b: HTTP 429 …)`, or the provider's name before any call.
fn route_words(route: &FallbackRoute, provider_name: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let route = FallbackRoute {
            target: Some("backup/m".into()),
            skipped: vec!["fake/m: Fake is overloaded (HTTP 529): busy".into()],
        };
        assert_eq!(
            route_words(&route, "Fake"),
            "backup/m (skipped fake/m: Fake is overloaded (HTTP 529): busy)"
        );
        assert_eq!(route_words(&FallbackRoute::default(), "Fake"), "Fake");
    }
}
