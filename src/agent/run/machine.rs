//! A turn's model rounds as a machine: it takes events (the steering taken for a model call,
//! the provider's stream events, a round's tool results, a cancel) and returns actions (frames
//! to send, a provider call to open or close, tool calls to run). No sockets, no waiting: the
//! driver (`driver.rs`) performs the actions and feeds back what they bring.
//!
//! The rules of a turn live here: how a provider's stream becomes Cursor's frames (text,
//! thinking, partial tool calls, step boundaries); when the rounds stop (an answer without tool
//! calls and no steering waiting, a model stuck repeating itself, the round limit); what a
//! cancel keeps (the partial answer, marked as cut off; pending calls closed with the client's
//! resolution); and whether a provider failure may be retried by Cursor's client (only before
//! anything of the turn reached the user).

use std::collections::HashMap;

use tokio::time::Instant;

use super::error::{Ending, RunError};
use super::model_calls::{cursor_call_id, provider_failure};
use super::pending;
use super::repeats::{RepeatCheck, RepeatDetector};
use super::shown::is_visible;
use super::store::TurnDone;
use super::tooling::Call;
use crate::agent::messages as msg;
use crate::agent::state::{self, StepRecord};
use crate::agent::tools::{self, ToolContext, ToolOutcome};
use crate::proto::agent::v1 as pb;
use crate::provider::{
    AssistantPart, FinishReason, Message, ProviderErrorKind, ProviderEvent, ProviderRequest, Turn,
    TurnBuilder, Usage,
};

/// What ends an answer the user canceled while it streamed, in the stored turn.
pub(crate) const INTERRUPTED_ANSWER: &str =
    "(Interrupted by the user before this answer was finished.)";

/// Builds a model call's request from the conversation so far and the turn's tools.
pub(super) type RequestFor<'a> =
    Box<dyn Fn(&[Message], &ToolContext) -> ProviderRequest + Send + 'a>;

/// A turn in progress: what the model reads next, and what the turn records.
pub(super) struct TurnWork {
    pub(super) user: pb::UserMessage,
    pub(super) messages: Vec<Message>,
    pub(super) steps: Vec<StepRecord>,
    pub(super) todos: Vec<pb::TodoItem>,
    pub(super) tool_ctx: tools::ToolContext,
}

impl TurnWork {
    pub(super) fn done(
        self,
        plan: Option<(String, String)>,
        summary: Option<(String, state::BlobId)>,
    ) -> TurnDone {
        TurnDone {
            user: self.user,
            steps: self.steps,
            todos: self.todos,
            mode: self.tool_ctx.mode,
            plan,
            summary,
        }
    }
}

/// What the machine is told.
pub(super) enum Event {
    /// The steering queued for the model call about to start, taken for it: the messages the
    /// model reads, their texts for the record, and the acknowledgements to send.
    Steering {
        messages: Vec<Message>,
        texts: Vec<String>,
        acks: Vec<pb::AgentServerMessage>,
    },
    /// One event of the open provider call's stream.
    Provider(ProviderEvent),
    /// The provider's stream ended without finishing.
    ProviderClosed,
    /// The round's tool calls ran: their outcomes, in the calls' order.
    Tools(Vec<ToolOutcome>),
    /// The client's waiting messages were handled: whether steering now waits for a call.
    ClientDrained { steering_queued: bool },
    /// The run was canceled: by the user (then the turn is stored as far as it went, with how
    /// the client resolved the pending calls) or by the transport.
    Canceled {
        by_user: bool,
        resolutions: Vec<pb::InterruptedPendingToolCallResolution>,
    },
    /// Performing an action failed for a reason other than a cancel (the client gone, a bad
    /// client message, a timeout).
    Failed(RunError),
}

/// What the driver is asked to do.
pub(super) enum Action {
    /// Send this message to the client.
    Send(Box<pb::AgentServerMessage>),
    /// Take the steering queued for step `step` (answered with [`Event::Steering`]).
    TakeSteering { step: u64 },
    /// Open a provider call for step `step` (its stream comes back as [`Event::Provider`]).
    OpenCall {
        step: u64,
        request: Box<ProviderRequest>,
    },
    /// Drop the provider call: it finished, or nobody wants the rest.
    CloseCall,
    /// Count the finished call's usage (at the price of the target that served it).
    CountUsage(Usage),
    /// Run the tool calls of step `step` (answered with [`Event::Tools`]).
    RunTools { step: u64, calls: Vec<Call> },
    /// Tell the client to stop the execs it still runs for us.
    AbortExecs,
    /// Handle the client's waiting messages (answered with [`Event::ClientDrained`]).
    DrainClient,
    /// The rounds are over.
    End(RoundsEnd),
}

/// How a turn's model rounds ended.
#[derive(Debug)]
pub(super) enum RoundsEnd {
    /// The model answered without tool calls, or the turn was stopped (stuck, round limit).
    Done,
    /// Canceled; the turn's steps hold what it did, cut off. `store`: canceled by the user, so
    /// the turn is kept for the next one.
    Canceled { store: bool },
    /// Failed; `ending` says how the client's stream ends (retriable only when nothing of the
    /// turn was shown yet).
    Failed { error: RunError, ending: Ending },
}

/// The limits of the turn's rounds.
pub(super) struct RoundRules {
    pub(super) max_tool_rounds: u32,
    pub(super) detect_loops: bool,
}

/// Where the machine is.
enum Phase {
    /// Waiting for the steering of the next call.
    Steering,
    /// A provider call is open.
    Streaming(Box<StepStream>),
    /// The round's tool calls run.
    Tools(Vec<Call>),
    /// Waiting to hear whether steering came during the answer.
    Draining,
    Ended,
}

/// A turn's model rounds.
pub(super) struct Machine<'a> {
    work: TurnWork,
    request: RequestFor<'a>,
    model_name: String,
    max_tool_rounds: u32,
    repeats: RepeatDetector,
    /// The latest step (one model call each).
    step: u64,
    rounds: u32,
    /// Something of the run reached the user: a failure is no longer retriable.
    shown: bool,
    phase: Phase,
}

impl<'a> Machine<'a> {
    /// The rounds of `work`, whose first model call is step `last_step + 1`. `shown`: the run
    /// already showed the user something.
    pub(super) fn new(
        work: TurnWork,
        request: RequestFor<'a>,
        rules: RoundRules,
        model_name: String,
        last_step: u64,
        shown: bool,
    ) -> Machine<'a> {
        let repeats =
            RepeatDetector::new(rules.detect_loops, work.tool_ctx.terminals_folder.clone());
        Machine {
            work,
            request,
            model_name,
            max_tool_rounds: rules.max_tool_rounds,
            repeats,
            step: last_step,
            rounds: 0,
            shown,
            phase: Phase::Steering,
        }
    }

    /// The first actions: take the steering for the first model call.
    pub(super) fn start(&mut self) -> Vec<Action> {
        self.next_call()
    }

    /// What the turn has done so far.
    pub(super) fn into_work(self) -> TurnWork {
        self.work
    }

    /// The turn's tools and todos, for the tool round in flight.
    pub(super) fn tool_work(&mut self) -> (&mut ToolContext, &mut Vec<pb::TodoItem>) {
        (&mut self.work.tool_ctx, &mut self.work.todos)
    }

    /// Whether a provider call is open (the driver then waits on its stream).
    pub(super) fn streaming(&self) -> bool {
        matches!(self.phase, Phase::Streaming(_))
    }

    /// Take one event; the actions to perform, in order.
    pub(super) fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Steering {
                messages,
                texts,
                acks,
            } => self.open_call(messages, texts, acks, now, &mut out),
            Event::Provider(e) => self.on_provider(e, now, &mut out),
            Event::ProviderClosed => self.fail(
                RunError::Internal("the provider stream ended without a finish".into()),
                &mut out,
            ),
            Event::Tools(results) => self.on_results(results, &mut out),
            Event::ClientDrained { steering_queued } => {
                if steering_queued {
                    // Steering that came in during this answer gets its own model call.
                    out.extend(self.next_call());
                } else {
                    self.end(RoundsEnd::Done, &mut out);
                }
            }
            Event::Canceled {
                by_user,
                resolutions,
            } => self.on_cancel(by_user, &resolutions, &mut out),
            Event::Failed(e) => self.fail(e, &mut out),
        }
        out
    }

    fn next_call(&mut self) -> Vec<Action> {
        self.phase = Phase::Steering;
        vec![Action::TakeSteering {
            step: self.step + 1,
        }]
    }

    /// The steering joins the conversation, and the next model call opens as a new step.
    fn open_call(
        &mut self,
        messages: Vec<Message>,
        texts: Vec<String>,
        acks: Vec<pb::AgentServerMessage>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.phase, Phase::Steering) {
            tracing::debug!("steering for no model call about to start: ignored");
            return;
        }
        self.work.messages.extend(messages);
        for text in texts {
            self.work.steps.push(StepRecord::UserContext { text });
        }
        for ack in acks {
            self.send(ack, out);
        }
        let request = (self.request)(&self.work.messages, &self.work.tool_ctx);
        self.step += 1;
        self.send(msg::step_started(self.step), out);
        out.push(Action::OpenCall {
            step: self.step,
            request: Box::new(request),
        });
        self.phase = Phase::Streaming(Box::new(StepStream::new(self.step, now)));
    }

    fn on_provider(&mut self, event: ProviderEvent, now: Instant, out: &mut Vec<Action>) {
        let Phase::Streaming(stream) = &mut self.phase else {
            tracing::debug!("a provider event with no call open: ignored");
            return;
        };
        let mut frames = Vec::new();
        let forwarded = stream.forward(event, now, &self.work.tool_ctx, &mut frames);
        for frame in frames {
            self.send(frame, out);
        }
        match forwarded {
            Forwarded::More => {}
            Forwarded::Finished => self.finish_call(now, out),
            Forwarded::Failed(e) if e.kind == ProviderErrorKind::Canceled => {
                out.push(Action::CloseCall);
                self.on_cancel(false, &[], out);
            }
            Forwarded::Failed(e) => {
                out.push(Action::CloseCall);
                self.fail(provider_failure(&self.model_name, e), out);
            }
        }
    }

    /// The call finished: its step closes, its answer joins the conversation, and its tool
    /// calls run (or the turn may be over).
    fn finish_call(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Phase::Streaming(stream) = std::mem::replace(&mut self.phase, Phase::Draining) else {
            return;
        };
        let elapsed =
            u64::try_from(now.duration_since(stream.started).as_millis()).unwrap_or(u64::MAX);
        self.send(msg::step_completed(self.step, elapsed), out);
        out.push(Action::CloseCall);
        out.push(Action::CountUsage(stream.usage));
        let thinking_ms = stream.thinking_ms;
        let turn = stream.builder.finish();
        record_steps(&mut self.work.steps, &turn, thinking_ms);
        let calls = tool_calls(&turn);
        if !turn.parts().is_empty() {
            self.work.messages.push(turn.message);
        }
        if calls.is_empty() {
            out.push(Action::DrainClient);
            return;
        }
        self.rounds += 1;
        // Each call is shown as started as the round begins.
        self.shown = true;
        self.phase = Phase::Tools(calls.clone());
        out.push(Action::RunTools {
            step: self.step,
            calls,
        });
    }

    /// The round's results go to the model and into the record; the turn stops when the model
    /// is stuck or the round limit is reached.
    fn on_results(&mut self, results: Vec<ToolOutcome>, out: &mut Vec<Action>) {
        let Phase::Tools(calls) = std::mem::replace(&mut self.phase, Phase::Steering) else {
            tracing::debug!("tool results for no round of ours: ignored");
            return;
        };
        let rounds = self.rounds;
        let note = match record_results(&mut self.work, calls, results, &mut self.repeats) {
            Some(why) => format!("\n\n{why}"),
            None if rounds >= self.max_tool_rounds => format!(
                "\n\n(Stopped after {rounds} tool rounds, the limit set by `agent.max_tool_rounds`. Send a message to continue.)"
            ),
            None => {
                out.extend(self.next_call());
                return;
            }
        };
        self.send(msg::notice(note.clone()), out);
        self.work.steps.push(StepRecord::Assistant { text: note });
        self.end(RoundsEnd::Done, out);
    }

    /// A cancel keeps what the user saw: the answer so far marked as cut off, or the round's
    /// calls closed with the client's resolution.
    fn on_cancel(
        &mut self,
        by_user: bool,
        resolutions: &[pb::InterruptedPendingToolCallResolution],
        out: &mut Vec<Action>,
    ) {
        match std::mem::replace(&mut self.phase, Phase::Ended) {
            Phase::Ended => return,
            Phase::Tools(calls) => {
                out.push(Action::AbortExecs);
                record_interrupted(&mut self.work.steps, &calls, resolutions);
            }
            Phase::Streaming(stream) => {
                out.push(Action::CloseCall);
                let partial = stream.builder.finish();
                record_steps(&mut self.work.steps, &partial, 0);
                self.interrupted();
            }
            Phase::Steering => self.interrupted(),
            // The answer was whole.
            Phase::Draining => {}
        }
        out.push(Action::End(RoundsEnd::Canceled { store: by_user }));
    }

    fn interrupted(&mut self) {
        self.work.steps.push(StepRecord::Assistant {
            text: INTERRUPTED_ANSWER.into(),
        });
    }

    /// A failure ends the rounds; retriable only while nothing of the turn was shown.
    fn fail(&mut self, error: RunError, out: &mut Vec<Action>) {
        if matches!(error, RunError::Canceled) {
            return self.on_cancel(false, &[], out);
        }
        if let Phase::Tools(_) = self.phase {
            out.push(Action::AbortExecs);
        }
        let ending = error.ending(self.shown);
        self.end(RoundsEnd::Failed { error, ending }, out);
    }

    fn end(&mut self, end: RoundsEnd, out: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::Ended) {
            self.phase = Phase::Ended;
            out.push(Action::End(end));
        }
    }

    fn send(&mut self, m: pb::AgentServerMessage, out: &mut Vec<Action>) {
        self.shown |= is_visible(&m);
        out.push(Action::Send(Box::new(m)));
    }
}

/// What one provider event did to the call.
enum Forwarded {
    More,
    Finished,
    Failed(crate::provider::ProviderError),
}

/// One model call's stream as it arrives: the turn it builds, and what is still open.
struct StepStream {
    step: u64,
    started: Instant,
    builder: TurnBuilder,
    /// When the open thinking block started.
    thinking_since: Option<Instant>,
    thinking_ms: u32,
    usage: Usage,
    /// Tool calls whose arguments stream, by the model's call id: their names.
    partial_names: HashMap<String, String>,
}

impl StepStream {
    fn new(step: u64, started: Instant) -> StepStream {
        StepStream {
            step,
            started,
            builder: TurnBuilder::new(),
            thinking_since: None,
            thinking_ms: 0,
            usage: Usage::default(),
            partial_names: HashMap::new(),
        }
    }

    /// Take one provider event into the turn; what the client is shown of it goes to `out`.
    fn forward(
        &mut self,
        event: ProviderEvent,
        now: Instant,
        tools: &ToolContext,
        out: &mut Vec<pb::AgentServerMessage>,
    ) -> Forwarded {
        self.builder.push(&event);
        if !matches!(
            event,
            ProviderEvent::ReasoningDelta(_) | ProviderEvent::Usage(_)
        ) {
            self.end_thinking(now, out);
        }
        match event {
            ProviderEvent::TextDelta(text) => {
                let tokens = msg::estimate_tokens(&text);
                out.push(msg::text_delta(text));
                out.push(msg::token_delta(tokens));
            }
            ProviderEvent::ReasoningDelta(text) => {
                self.thinking_since.get_or_insert(now);
                out.push(msg::thinking_delta(text));
            }
            ProviderEvent::ToolCallStarted { id, name } => {
                if let Some(tc) = tools::placeholder(tools, &id, &name) {
                    out.push(self.partial_call(&id, tc, String::new()));
                    self.partial_names.insert(id, name);
                }
            }
            ProviderEvent::ToolCallArgsDelta { id, delta } => {
                let placeholder = self
                    .partial_names
                    .get(&id)
                    .and_then(|name| tools::placeholder(tools, &id, name));
                if let Some(tc) = placeholder {
                    out.push(self.partial_call(&id, tc, delta));
                }
            }
            ProviderEvent::ReasoningDone { .. } | ProviderEvent::ToolCallFinished { .. } => {}
            ProviderEvent::Usage(u) => self.usage = u,
            ProviderEvent::Finished { reason } => {
                if reason == FinishReason::Length {
                    out.push(msg::notice(
                        "\n\n(The model stopped at its output token limit.)".into(),
                    ));
                }
                return Forwarded::Finished;
            }
            ProviderEvent::Error(e) => return Forwarded::Failed(e),
        }
        Forwarded::More
    }

    fn partial_call(&self, id: &str, tc: pb::ToolCall, delta: String) -> pb::AgentServerMessage {
        msg::partial_tool_call(cursor_call_id(self.step, id), id.to_string(), tc, delta)
    }

    /// Close an open thinking block, counting how long it lasted.
    fn end_thinking(&mut self, now: Instant, out: &mut Vec<pb::AgentServerMessage>) {
        let Some(t) = self.thinking_since.take() else {
            return;
        };
        let ms = u64::try_from(now.duration_since(t).as_millis()).unwrap_or(u64::MAX);
        out.push(msg::thinking_completed(ms));
        self.thinking_ms = self
            .thinking_ms
            .saturating_add(u32::try_from(ms).unwrap_or(u32::MAX));
    }
}

/// The round's results go to the model and into the record; the repeat detector watches them.
/// Returns why to stop, when the model is stuck.
fn record_results(
    work: &mut TurnWork,
    calls: Vec<Call>,
    results: Vec<ToolOutcome>,
    repeats: &mut RepeatDetector,
) -> Option<String> {
    let mut stuck = None;
    for ((id, name, arguments, extra), mut outcome) in calls.into_iter().zip(results) {
        match repeats.observe(
            &name,
            &arguments.to_string(),
            &outcome.content,
            outcome.is_error,
        ) {
            RepeatCheck::Go => {}
            RepeatCheck::Warn(note) => outcome.content.push_str(&note),
            RepeatCheck::Stop(why) => stuck = stuck.or(Some(why)),
        }
        work.messages.push(Message::ToolResult {
            call_id: id.clone(),
            name: name.clone(),
            content: outcome.content.clone(),
            is_error: outcome.is_error,
        });
        work.steps.push(StepRecord::ToolCall {
            tool_call: outcome.tool_call,
            call_id: id,
            name,
            arguments,
            result: outcome.content,
            is_error: outcome.is_error,
            extra,
        });
    }
    stuck
}

/// The tool calls of a model call, in its order.
fn tool_calls(turn: &Turn) -> Vec<Call> {
    turn.tool_calls()
        .into_iter()
        .map(|(id, name, arguments, extra)| {
            (id.into(), name.into(), arguments.clone(), extra.cloned())
        })
        .collect()
}

/// The steps of one model call, in the order Cursor shows them: thinking, text; the tool calls
/// are recorded once they have run.
fn record_steps(steps: &mut Vec<StepRecord>, turn: &Turn, thinking_ms: u32) {
    for part in turn.parts() {
        match part {
            AssistantPart::Reasoning { text, extra } => steps.push(StepRecord::Thinking {
                text: text.clone(),
                duration_ms: thinking_ms,
                extra: extra.clone(),
            }),
            AssistantPart::Text { text } if !text.is_empty() => {
                steps.push(StepRecord::Assistant { text: text.clone() })
            }
            _ => {}
        }
    }
}

/// The calls of a round a cancel interrupted, closed with the client's resolution.
fn record_interrupted(
    steps: &mut Vec<StepRecord>,
    calls: &[Call],
    resolutions: &[pb::InterruptedPendingToolCallResolution],
) {
    for (id, name, arguments, extra) in calls {
        let (result, is_error) = pending::resolution_for(id, resolutions);
        steps.push(StepRecord::ToolCall {
            tool_call: pb::ToolCall {
                tool_call_id: Some(id.clone()),
                ..Default::default()
            },
            call_id: id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
            result,
            is_error,
            extra: extra.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{ProviderError, RequestOptions};
    use pb::agent_server_message::Message as Server;
    use pb::interaction_update::Message as Update;

    fn machine(max_tool_rounds: u32, shown: bool) -> Machine<'static> {
        let work = TurnWork {
            user: pb::UserMessage::default(),
            messages: vec![Message::user_text("hello")],
            steps: Vec::new(),
            todos: Vec::new(),
            tool_ctx: ToolContext::default(),
        };
        let request: RequestFor<'static> = Box::new(|messages, _| ProviderRequest {
            model: "m".into(),
            system: String::new(),
            messages: messages.to_vec(),
            tools: Vec::new(),
            options: RequestOptions::default(),
        });
        let rules = RoundRules {
            max_tool_rounds,
            detect_loops: true,
        };
        Machine::new(work, request, rules, "Test model".into(), 0, shown)
    }

    /// The actions, in words: what a reader of a turn's log would want to see.
    fn words(actions: &[Action]) -> Vec<String> {
        actions.iter().map(word).collect()
    }

    fn word(a: &Action) -> String {
        match a {
            Action::Send(m) => format!("send {}", frame(m)),
            Action::TakeSteering { step } => format!("take steering {step}"),
            Action::OpenCall { step, request } => {
                format!("open {step} ({} messages)", request.messages.len())
            }
            Action::CloseCall => "close".into(),
            Action::CountUsage(u) => format!("usage {}/{}", u.input, u.output),
            Action::RunTools { step, calls } => {
                let ids: Vec<_> = calls.iter().map(|c| c.0.as_str()).collect();
                format!("run tools {step} {}", ids.join(","))
            }
            Action::AbortExecs => "abort execs".into(),
            Action::DrainClient => "drain".into(),
            Action::End(RoundsEnd::Done) => "end done".into(),
            Action::End(RoundsEnd::Canceled { store }) => format!("end canceled store={store}"),
            Action::End(RoundsEnd::Failed { ending, .. }) => {
                format!("end failed {} retry={}", ending.code.as_str(), ending.retry)
            }
        }
    }

    fn frame(m: &pb::AgentServerMessage) -> String {
        let Some(Server::InteractionUpdate(u)) = &m.message else {
            return "other".into();
        };
        match &u.message {
            Some(Update::TextDelta(t)) if t.is_server_notice => format!("notice {:?}", t.text),
            Some(Update::TextDelta(t)) => format!("text {:?}", t.text),
            Some(Update::TokenDelta(_)) => "tokens".into(),
            Some(Update::ThinkingDelta(t)) => format!("thinking {:?}", t.text),
            Some(Update::ThinkingCompleted(t)) => {
                format!("thinking done {}ms", t.thinking_duration_ms)
            }
            Some(Update::PartialToolCall(p)) => format!("partial call {}", p.call_id),
            Some(Update::StepStarted(s)) => format!("step started {}", s.step_id),
            Some(Update::StepCompleted(s)) => format!("step completed {}", s.step_id),
            Some(Update::ContextInjectionState(s)) => format!("injection {}", s.injection_id),
            _ => "update".into(),
        }
    }

    fn steering() -> Event {
        Event::Steering {
            messages: Vec::new(),
            texts: Vec::new(),
            acks: Vec::new(),
        }
    }

    fn text(t: &str) -> Event {
        Event::Provider(ProviderEvent::TextDelta(t.into()))
    }

    fn tool_call(id: &str, name: &str, args: serde_json::Value) -> Vec<Event> {
        vec![
            Event::Provider(ProviderEvent::ToolCallStarted {
                id: id.into(),
                name: name.into(),
            }),
            Event::Provider(ProviderEvent::ToolCallFinished {
                id: id.into(),
                name: name.into(),
                arguments: Ok(args),
                extra: None,
            }),
        ]
    }

    fn finished() -> Vec<Event> {
        vec![
            Event::Provider(ProviderEvent::Usage(Usage {
                input: 10,
                output: 2,
                ..Usage::default()
            })),
            Event::Provider(ProviderEvent::Finished {
                reason: FinishReason::Stop,
            }),
        ]
    }

    /// A model call that asks for one tool call: the steering taken, the call, its end.
    fn tool_round(id: &str, name: &str, args: serde_json::Value) -> Vec<Event> {
        let mut events = vec![steering()];
        events.extend(tool_call(id, name, args));
        events.extend(finished());
        events
    }

    fn outcome(content: &str) -> ToolOutcome {
        ToolOutcome {
            content: content.into(),
            is_error: false,
            tool_call: pb::ToolCall::default(),
        }
    }

    fn overloaded() -> Event {
        let e =
            ProviderError::new(ProviderErrorKind::Overloaded, "Fake", "busy").with_retryable(true);
        Event::Provider(ProviderEvent::Error(e))
    }

    /// Feed `events` in order; every action they bring, in words.
    fn feed(m: &mut Machine<'_>, events: Vec<Event>) -> Vec<String> {
        let now = Instant::now();
        events
            .into_iter()
            .flat_map(|e| words(&m.handle(e, now)))
            .collect()
    }

    /// The last action a fresh machine (`shown`: an earlier part of the run was shown) takes
    /// for `events`.
    fn last_action(shown: bool, events: Vec<Event>) -> String {
        let mut m = machine(10, shown);
        m.start();
        feed(&mut m, events).pop().unwrap_or_default()
    }

    #[test]
    fn a_text_turn_streams_one_step_and_ends() {
        let mut m = machine(10, false);
        assert_eq!(words(&m.start()), ["take steering 1"]);
        let mut events = vec![steering(), text("Hi"), text(" there")];
        events.extend(finished());
        events.push(Event::ClientDrained {
            steering_queued: false,
        });
        assert_eq!(
            feed(&mut m, events),
            [
                "send step started 1",
                "open 1 (1 messages)",
                "send text \"Hi\"",
                "send tokens",
                "send text \" there\"",
                "send tokens",
                "send step completed 1",
                "close",
                "usage 10/2",
                "drain",
                "end done",
            ]
        );
        let work = m.into_work();
        assert!(matches!(&work.steps[..], [StepRecord::Assistant { text }] if text == "Hi there"));
        assert_eq!(work.messages.len(), 2, "the answer joins the conversation");
    }

    #[test]
    fn a_tool_round_runs_the_calls_and_sends_the_results_to_the_next_call() {
        let mut m = machine(10, false);
        m.start();
        let events = tool_round("c1", "read_file", serde_json::json!({"path": "a"}));
        let first = feed(&mut m, events);
        assert_eq!(first[1], "open 1 (1 messages)");
        assert_eq!(first[2], "send partial call c1#s1");
        assert_eq!(
            &first[first.len() - 4..],
            [
                "send step completed 1",
                "close",
                "usage 10/2",
                "run tools 1 c1"
            ]
        );
        let next = feed(&mut m, vec![Event::Tools(vec![outcome("contents of a")])]);
        assert_eq!(next, ["take steering 2"]);
        let mut events = vec![steering(), text("Done.")];
        events.extend(finished());
        events.push(Event::ClientDrained {
            steering_queued: false,
        });
        let second = feed(&mut m, events);
        // The call's answer and its result are in the second call's conversation.
        assert_eq!(second[..2], ["send step started 2", "open 2 (3 messages)"]);
        assert_eq!(second.last().map(String::as_str), Some("end done"));
        let work = m.into_work();
        assert!(matches!(
            &work.steps[..],
            [StepRecord::ToolCall { result, .. }, StepRecord::Assistant { .. }]
                if result == "contents of a"
        ));
    }

    #[test]
    fn a_cancel_mid_stream_keeps_the_partial_answer_and_opens_no_further_call() {
        let mut m = machine(10, false);
        m.start();
        feed(&mut m, vec![steering(), text("Half an ans")]);
        let cancel = Event::Canceled {
            by_user: true,
            resolutions: Vec::new(),
        };
        assert_eq!(
            feed(&mut m, vec![cancel]),
            ["close", "end canceled store=true"]
        );
        // Whatever comes late changes nothing.
        let late = feed(&mut m, vec![text("swer"), steering()]);
        assert!(late.is_empty(), "{late:?}");
        let work = m.into_work();
        let texts: Vec<_> = work
            .steps
            .iter()
            .filter_map(|s| match s {
                StepRecord::Assistant { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["Half an ans", INTERRUPTED_ANSWER]);
    }

    #[test]
    fn a_cancel_by_the_transport_during_a_tool_round_aborts_and_stores_nothing() {
        let mut m = machine(10, false);
        m.start();
        let events = tool_round(
            "c1",
            "run_terminal_cmd",
            serde_json::json!({"command": "ls"}),
        );
        feed(&mut m, events);
        let resolutions = vec![pb::InterruptedPendingToolCallResolution::default()];
        let cancel = Event::Canceled {
            by_user: false,
            resolutions,
        };
        assert_eq!(
            feed(&mut m, vec![cancel]),
            ["abort execs", "end canceled store=false"]
        );
        let work = m.into_work();
        assert!(
            matches!(&work.steps[..], [StepRecord::ToolCall { call_id, .. }] if call_id == "c1"),
            "the pending call is recorded, closed"
        );
    }

    #[test]
    fn a_provider_failure_before_any_output_is_retriable() {
        assert_eq!(
            last_action(false, vec![steering(), overloaded()]),
            "end failed unavailable retry=true"
        );
    }

    #[test]
    fn a_provider_failure_after_output_is_not_retriable() {
        assert_eq!(
            last_action(false, vec![steering(), text("Par"), overloaded()]),
            "end failed unknown retry=false"
        );
        // Nor when an earlier part of the run was shown.
        assert_eq!(
            last_action(true, vec![steering(), overloaded()]),
            "end failed unknown retry=false"
        );
    }

    #[test]
    fn a_stream_that_ends_without_finishing_fails_the_turn() {
        assert_eq!(
            last_action(false, vec![steering(), Event::ProviderClosed]),
            "end failed unknown retry=false"
        );
    }

    #[test]
    fn steering_that_arrives_mid_answer_gets_its_own_model_call() {
        let mut m = machine(10, false);
        m.start();
        let mut events = vec![steering(), text("Working on it")];
        events.extend(finished());
        events.push(Event::ClientDrained {
            steering_queued: true,
        });
        let actions = feed(&mut m, events);
        assert_eq!(actions.last().map(String::as_str), Some("take steering 2"));
        let steer = Event::Steering {
            messages: vec![Message::user_text("use tabs")],
            texts: vec!["use tabs".into()],
            acks: vec![msg::injection_delivered("inj-1".into(), 2)],
        };
        assert_eq!(
            feed(&mut m, vec![steer]),
            [
                "send injection inj-1",
                "send step started 2",
                "open 2 (3 messages)"
            ]
        );
        let work = m.into_work();
        assert!(matches!(&work.steps[1], StepRecord::UserContext { text } if text == "use tabs"));
    }

    #[test]
    fn the_round_limit_ends_the_turn_with_a_note() {
        let mut m = machine(1, false);
        m.start();
        let mut events = tool_round("c1", "read_file", serde_json::json!({"path": "a"}));
        events.push(Event::Tools(vec![outcome("a")]));
        let actions = feed(&mut m, events);
        let n = actions.len();
        assert!(
            actions[n - 2].contains("Stopped after 1 tool rounds"),
            "{actions:?}"
        );
        assert_eq!(actions[n - 1], "end done");
        let work = m.into_work();
        assert!(
            matches!(work.steps.last(), Some(StepRecord::Assistant { text }) if text.contains("agent.max_tool_rounds"))
        );
    }

    #[test]
    fn the_repeat_detector_stops_a_model_stuck_on_one_call() {
        let mut m = machine(100, false);
        m.start();
        let mut last = Vec::new();
        for step in 1..=crate::agent::run::repeats::STOP_AT {
            let mut events = tool_round("c", "read_file", serde_json::json!({"path": "same"}));
            events.push(Event::Tools(vec![outcome("same")]));
            last = feed(&mut m, events);
            if step < crate::agent::run::repeats::STOP_AT {
                assert_eq!(
                    last.last().map(String::as_str),
                    Some(format!("take steering {}", step + 1).as_str())
                );
            }
        }
        let n = last.len();
        assert!(last[n - 2].contains("Stopped: the model made"), "{last:?}");
        assert_eq!(last[n - 1], "end done");
    }

    #[test]
    fn a_cancel_before_the_call_answers_marks_the_answer_interrupted() {
        let mut m = machine(10, false);
        m.start();
        feed(&mut m, vec![steering()]);
        let cancel = Event::Canceled {
            by_user: true,
            resolutions: Vec::new(),
        };
        assert_eq!(
            feed(&mut m, vec![cancel]),
            ["close", "end canceled store=true"]
        );
        let work = m.into_work();
        assert!(matches!(
            &work.steps[..],
            [StepRecord::Assistant { text }] if text == INTERRUPTED_ANSWER
        ));
    }

    #[test]
    fn streamed_arguments_show_as_partial_calls_and_a_cut_answer_says_why() {
        let mut m = machine(10, false);
        m.start();
        let started = Event::Provider(ProviderEvent::ToolCallStarted {
            id: "c1".into(),
            name: "read_file".into(),
        });
        let delta = Event::Provider(ProviderEvent::ToolCallArgsDelta {
            id: "c1".into(),
            delta: "{\"path\"".into(),
        });
        let unknown = Event::Provider(ProviderEvent::ToolCallStarted {
            id: "c2".into(),
            name: "no_such_tool".into(),
        });
        let actions = feed(&mut m, vec![steering(), started, delta, unknown]);
        assert_eq!(
            actions[2..],
            ["send partial call c1#s1", "send partial call c1#s1"],
            "an unknown tool shows nothing until it fails"
        );
        let length = Event::Provider(ProviderEvent::Finished {
            reason: FinishReason::Length,
        });
        let actions = feed(&mut m, vec![length]);
        assert!(actions[0].contains("output token limit"), "{actions:?}");
    }

    #[test]
    fn thinking_is_timed_by_the_events_clock() {
        let mut m = machine(10, false);
        m.start();
        let t0 = Instant::now();
        m.handle(steering(), t0);
        let think = Event::Provider(ProviderEvent::ReasoningDelta("hmm".into()));
        assert_eq!(words(&m.handle(think, t0)), ["send thinking \"hmm\""]);
        let later = t0 + std::time::Duration::from_millis(1500);
        assert_eq!(
            words(&m.handle(text("ok"), later)),
            [
                "send thinking done 1500ms",
                "send text \"ok\"",
                "send tokens"
            ]
        );
    }
}
