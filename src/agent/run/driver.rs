//! The one driver of a turn's model rounds: it performs the [`Machine`]'s actions with the
//! run's client, model calls and tool rounds, and feeds the machine what they bring. Every wait
//! of the rounds is here, and each gives way to the run's cancellation.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::client::Client;
use super::error::RunError;
use super::machine::{Action, Event, Machine, RoundsEnd};
use super::model_calls::ModelCalls;
use super::pending::CancelResolutions;
use super::setup::Run;
use super::tooling::ToolRound;
use crate::base::cancel::Cancelled;
use crate::provider::{Price, ProviderEvent, ProviderStream};

/// What the rounds are carried out with.
pub(super) struct Parts<'r> {
    pub(super) run: &'r Run,
    pub(super) client: &'r mut Client,
    pub(super) model: &'r mut ModelCalls,
    /// How the client resolved pending calls when it canceled, and whether it was the user.
    pub(super) resolutions: &'r CancelResolutions,
}

/// The provider call in flight.
struct Call {
    /// The event the chain opened the call with, until it is taken.
    first: Option<ProviderEvent>,
    stream: ProviderStream,
    started: Instant,
    heard: bool,
}

/// Run `machine` to its end.
pub(super) async fn drive(mut parts: Parts<'_>, machine: &mut Machine<'_>) -> RoundsEnd {
    // One waiter for the whole rounds, not a fresh one per event.
    let mut canceled = crate::base::cancel::cancelled(&parts.model.cancel);
    let mut call: Option<Call> = None;
    let mut price: Option<Price> = None;
    let mut queue: VecDeque<Action> = machine.start().into();
    loop {
        let event = match queue.pop_front() {
            Some(Action::End(end)) => return end,
            Some(action) => perform(&mut parts, machine, action, &mut call, &mut price).await,
            None => match call.as_mut() {
                Some(c) if machine.streaming() => next_event(&mut parts, c, &mut canceled).await,
                // Every other phase is answered by the action that entered it.
                _ => Some(Event::Failed(RunError::Internal(
                    "the turn's rounds stalled with nothing to wait for".into(),
                ))),
            },
        };
        if let Some(event) = event {
            queue.extend(machine.handle(event, Instant::now()));
        }
    }
}

/// Carry out one action; the event it brings back, if any.
async fn perform(
    parts: &mut Parts<'_>,
    machine: &mut Machine<'_>,
    action: Action,
    call: &mut Option<Call>,
    price: &mut Option<Price>,
) -> Option<Event> {
    match action {
        Action::Send(m) => parts
            .client
            .out
            .send(*m)
            .await
            .err()
            .map(|e| failed(parts.resolutions, e)),
        Action::TakeSteering { step } => {
            let mut messages = Vec::new();
            let (texts, acks) = parts.client.steering.deliver(&mut messages, step);
            Some(Event::Steering {
                messages,
                texts,
                acks,
            })
        }
        Action::OpenCall { step, request } => {
            parts.model.step = step;
            let started = Instant::now();
            match parts.model.open(&parts.run.chain, *request).await {
                Ok(opened) => {
                    *price = parts.run.chain.targets[opened.target].price;
                    *call = Some(Call {
                        first: Some(opened.first),
                        stream: opened.stream,
                        started,
                        heard: false,
                    });
                    None
                }
                Err(e) => Some(failed(parts.resolutions, e)),
            }
        }
        Action::CloseCall => {
            *call = None;
            None
        }
        Action::CountUsage(usage) => {
            parts.model.record_call(&usage, *price);
            parts.model.last_call = usage;
            None
        }
        Action::RunTools { step, calls } => {
            let (ctx, todos) = machine.tool_work();
            let mut round = ToolRound {
                run: parts.run,
                client: &mut *parts.client,
                model: &mut *parts.model,
                step,
            };
            Some(match round.carry_out(&calls, ctx, todos).await {
                Ok(results) => Event::Tools(results),
                Err(e) => failed(parts.resolutions, e),
            })
        }
        Action::AbortExecs => {
            parts.client.abort_open_execs().await;
            None
        }
        Action::DrainClient => Some(match parts.client.drain_events().await {
            Ok(()) => Event::ClientDrained {
                steering_queued: parts.client.steering.has_queued(),
            },
            Err(e) => failed(parts.resolutions, e),
        }),
        Action::End(_) => None,
    }
}

/// The open call's next event. What was handled so far is already sent; before waiting, the
/// tasks that are ready run first (the provider's reader among them, whose next events may
/// already be read), so a burst is handled and sent on together: one body chunk, one write
/// for many deltas, where taking each event as it comes costs every hop per delta.
async fn next_event(
    parts: &mut Parts<'_>,
    call: &mut Call,
    canceled: &mut Cancelled,
) -> Option<Event> {
    if let Some(event) = ready(parts, call) {
        return Some(event);
    }
    tokio::task::yield_now().await;
    match ready(parts, call) {
        Some(event) => Some(event),
        None => listen(parts, call, canceled).await,
    }
}

/// The open call's next event when one is already there: a burst of deltas is taken one after
/// the other without setting up a wait for each. A canceled run takes none (`listen` ends it).
fn ready(parts: &mut Parts<'_>, call: &mut Call) -> Option<Event> {
    if parts.model.cancel.is_cancelled() {
        return None;
    }
    let event = call.first.take().or_else(|| call.stream.try_recv())?;
    Some(heard(parts, call, Some(event)))
}

/// Wait for the open call's next event, handling what the client sends meanwhile.
async fn listen(parts: &mut Parts<'_>, call: &mut Call, canceled: &mut Cancelled) -> Option<Event> {
    let resolutions = parts.resolutions;
    let client: &mut Client = &mut *parts.client;
    let Call { first, stream, .. } = &mut *call;
    let event = tokio::select! {
        biased;
        _ = &mut *canceled => return Some(failed(resolutions, RunError::Canceled)),
        ev = async { first.take() }, if first.is_some() => ev,
        ev = stream.recv() => ev,
        ev = client.recv(), if client.listening() => {
            return client.dispatch(ev).await.err().map(|e| failed(resolutions, e));
        }
    };
    Some(heard(parts, call, event))
}

/// What the call brought, as the machine hears it; the first event of a call times the provider.
fn heard(parts: &mut Parts<'_>, call: &mut Call, event: Option<ProviderEvent>) -> Event {
    if !std::mem::replace(&mut call.heard, true) {
        parts.model.provider_latency(call.started.elapsed());
    }
    match event {
        Some(e) => Event::Provider(e),
        None => Event::ProviderClosed,
    }
}

/// A failed action as the machine hears it: a cancel, or a failure.
fn failed(resolutions: &CancelResolutions, e: RunError) -> Event {
    match e {
        RunError::Canceled => Event::Canceled {
            by_user: resolutions.by_user(),
            resolutions: resolutions.get(),
        },
        e => Event::Failed(e),
    }
}
