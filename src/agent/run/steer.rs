//! Steering: `inject_context_action` on a running run. An injection is acknowledged `queued`
//! at once, joins the conversation at the next model call of the turn (after the tool round in
//! flight; a streaming answer is never cut) and is then acknowledged `delivered`.
//!
//! One that the turn can no longer deliver (it arrived after the turn's last model call, or the
//! tool-round limit ended the turn first) is `queued_for_next_turn` and recorded at the end of
//! the turn, so the next turn (and a restart) sees it. Cursor's SDK answers that state by
//! sending the same text as a follow-up turn; the next turn then leaves the recorded copy out
//! ([`drop_carried_copies`]) so the model reads it once.
//!
//! Every injection that got `queued` gets a final state: `delivered`, `queued_for_next_turn`,
//! or `cancelled` when the run is canceled or fails first (the SDK stops its 15 s timer on
//! `queued` and would otherwise wait for ever).

use crate::agent::messages as msg;
use crate::agent::prompt;
use crate::proto::agent::v1 as pb;
use crate::provider::{Message, UserPart};
use pb::context_injection_state::State;

/// One accepted injection, as the model will read it.
struct Injected {
    /// The client's injection id, acknowledged on delivery; empty for our own notes
    /// (background completions), which have no one to acknowledge.
    id: String,
    message: Message,
}

/// The injections of a run. Pure: what the client must hear comes back as messages to send.
pub(super) struct Steering {
    /// The run's id, when the request named one: `expected_run_id` must match it.
    run_id: Option<String>,
    /// Acknowledged `queued`, waiting for the next model call.
    queued: Vec<Injected>,
    /// Acknowledged `queued_for_next_turn`, to be recorded at the end of the turn.
    carried: Vec<Injected>,
    /// The turn still makes model calls (injections can be delivered).
    open: bool,
    /// Notes that came after the turn's last model call: recorded in the turn instead.
    late: Vec<String>,
    /// Nothing more can be delivered or recorded: later injections get this state.
    closed: Option<State>,
}

impl Steering {
    pub(super) fn new(run_id: Option<String>) -> Steering {
        Steering {
            run_id: run_id.filter(|r| !r.is_empty()),
            queued: Vec::new(),
            carried: Vec::new(),
            open: false,
            late: Vec::new(),
            closed: None,
        }
    }

    pub(super) fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// A note of ours for the model (no acknowledgement): at the next model call of the
    /// turn, or, after its last one, into the turn's record.
    pub(super) fn note(&mut self, message: Message) {
        if self.closed.is_some() {
            // The turn is already recorded (or makes no model call): nothing can carry it.
            tracing::warn!(
                note = %message_text(&message).chars().take(200).collect::<String>(),
                "a background completion came after the turn was recorded; the model will not see it"
            );
            return;
        }
        if self.open {
            self.queued.push(Injected {
                id: String::new(),
                message,
            });
        } else {
            self.late.push(message_text(&message));
        }
    }

    /// The notes that missed the turn's model calls, for its record.
    pub(super) fn take_late(&mut self) -> Vec<String> {
        std::mem::take(&mut self.late)
    }
}

/// What heads an injected user message, as the model reads it.
const STEER_NOTE: &str = "[The user sent this while you were working; take it into account]";

/// What an injection adds to the conversation.
fn injected_message(a: &pb::InjectContextAction, images: bool) -> Option<Message> {
    use pb::inject_context_action::Payload;
    match a.payload.as_ref()? {
        Payload::UserContext(u) => {
            let mut user = u.user_message.clone()?;
            user.text = format!("{STEER_NOTE}\n{}", user.text);
            // Content given by blob id is not fetched mid-turn: the injected message's own text and
            // inline context reach the model; blob-referenced items are named as such.
            Some(prompt::user_message_with(
                &user,
                images,
                &crate::agent::context::Blobs::default(),
            ))
        }
        Payload::SystemContext(s) if !s.content.trim().is_empty() => {
            let producer = if s.producer.is_empty() {
                "system"
            } else {
                &s.producer
            };
            Some(Message::user_text(format!(
                "<system_context producer=\"{producer}\">\n{}\n</system_context>",
                s.content
            )))
        }
        Payload::SystemContext(_) => None,
    }
}

/// The text parts of a user message (what the turn's record keeps of it).
pub(super) fn message_text(m: &Message) -> String {
    match m {
        Message::User { parts } => parts
            .iter()
            .filter_map(|p| match p {
                UserPart::Text { text } => Some(text.as_str()),
                UserPart::Image { .. } => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

impl Steering {
    /// An injection arrived: reject, defer or queue it. Returns the acknowledgement to send.
    pub(super) fn on_inject(
        &mut self,
        a: pb::InjectContextAction,
        images: bool,
    ) -> pb::AgentServerMessage {
        let id = a.injection_id.clone();
        let state = match (&self.run_id, a.expected_run_id.as_str()) {
            (Some(run), expected) if !expected.is_empty() && expected != run => {
                State::Rejected(pb::ContextInjectionRejected {
                    reason: format!("this run is {run}, not {expected}"),
                })
            }
            _ => match injected_message(&a, images) {
                None => State::Rejected(pb::ContextInjectionRejected {
                    reason: "the injection carries no context".into(),
                }),
                Some(_) if self.closed.is_some() => self.closed.clone().unwrap_or_else(cancelled),
                Some(message) if !self.open => {
                    self.carried.push(Injected {
                        id: id.clone(),
                        message,
                    });
                    State::QueuedForNextTurn(pb::ContextInjectionQueuedForNextTurn {})
                }
                Some(message) => {
                    self.queued.push(Injected {
                        id: id.clone(),
                        message,
                    });
                    State::Queued(pb::ContextInjectionQueued {})
                }
            },
        };
        msg::injection_state(id, state)
    }

    /// A run without a model turn (summarize, a user command), or a turn being recorded:
    /// injections go to the next turn, which the client sends them as.
    pub(super) fn defer_to_next_turn(&mut self) {
        self.closed = Some(State::QueuedForNextTurn(
            pb::ContextInjectionQueuedForNextTurn {},
        ));
    }

    /// The turn makes model calls from now on: injections wait for the next one.
    pub(super) fn open_turn(&mut self) {
        self.open = true;
    }

    /// Move the queued injections into the conversation for the model call about to start (as
    /// step `step`); each is acknowledged `delivered`. Returns the texts to record in the turn,
    /// and the acknowledgements to send.
    pub(super) fn deliver(
        &mut self,
        messages: &mut Vec<Message>,
        step: u64,
    ) -> (Vec<String>, Vec<pb::AgentServerMessage>) {
        let mut texts = Vec::new();
        let mut acks = Vec::new();
        for inj in std::mem::take(&mut self.queued) {
            texts.push(message_text(&inj.message));
            messages.push(inj.message);
            if !inj.id.is_empty() {
                acks.push(msg::injection_delivered(inj.id, step));
            }
        }
        (texts, acks)
    }

    /// The turn makes no more model calls: what is still queued goes to the next turn.
    /// Returns the acknowledgements to send.
    pub(super) fn defer(&mut self) -> Vec<pb::AgentServerMessage> {
        self.open = false;
        let mut acks = Vec::new();
        for inj in std::mem::take(&mut self.queued) {
            if inj.id.is_empty() {
                self.late.push(message_text(&inj.message));
                continue;
            }
            let state = State::QueuedForNextTurn(pb::ContextInjectionQueuedForNextTurn {});
            acks.push(msg::injection_state(inj.id.clone(), state));
            self.carried.push(inj);
        }
        acks
    }

    /// The turn is being recorded: the injections carried to the next turn, as texts to store
    /// at its end. Later ones are answered `queued_for_next_turn` without a record (the client
    /// sends them as the next turn).
    pub(super) fn take_carried(&mut self) -> Vec<String> {
        self.defer_to_next_turn();
        let carried = std::mem::take(&mut self.carried);
        carried.iter().map(|i| message_text(&i.message)).collect()
    }

    /// The run was canceled or failed: any injection that comes from now on is `cancelled`.
    pub(super) fn close_canceled(&mut self) {
        self.open = false;
        self.closed = Some(cancelled());
    }

    /// Every injection still waiting is `cancelled`: the messages that say so.
    pub(super) fn cancel_waiting(&mut self) -> Vec<pb::AgentServerMessage> {
        self.carried.clear();
        std::mem::take(&mut self.queued)
            .into_iter()
            // Our own notes (no id) were never acknowledged to the client.
            .filter(|inj| !inj.id.is_empty())
            .map(|inj| msg::injection_state(inj.id, cancelled()))
            .collect()
    }
}

fn cancelled() -> State {
    State::Cancelled(pb::ContextInjectionCancelled {})
}

/// Leave out injections the previous turn carried over (the messages at the end of `history`)
/// whose text is `user_text`: the client sent that text again as this turn's message.
pub(super) fn drop_carried_copies(history: &mut Vec<Message>, user_text: &str) {
    let copy = format!("{STEER_NOTE}\n{}", user_text.trim());
    let mut i = history.len();
    while i > 0 {
        let Message::User { .. } = &history[i - 1] else {
            break;
        };
        if message_text(&history[i - 1]).trim_end().ends_with(&copy) && !user_text.trim().is_empty()
        {
            history.remove(i - 1);
        }
        i -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::inject_context_action::Payload;

    fn user(id: &str, text: &str) -> pb::InjectContextAction {
        pb::InjectContextAction {
            injection_id: id.into(),
            payload: Some(Payload::UserContext(pb::UserContextInjection {
                user_message: Some(pb::UserMessage {
                    text: text.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    /// The injection id and state an acknowledgement carries.
    fn ack(m: &pb::AgentServerMessage) -> (String, State) {
        use pb::agent_server_message::Message as M;
        use pb::interaction_update::Message as U;
        let Some(M::InteractionUpdate(u)) = &m.message else {
            panic!("not an interaction update: {m:?}");
        };
        let Some(U::ContextInjectionState(s)) = &u.message else {
            panic!("not an injection state: {u:?}");
        };
        let state = s.state.as_ref().and_then(|s| s.state.clone());
        (s.injection_id.clone(), state.expect("a state"))
    }

    #[test]
    fn an_injection_in_an_open_turn_is_queued_then_delivered_at_the_next_call() {
        let mut s = Steering::new(Some("run-1".into()));
        s.open_turn();
        let (id, state) = ack(&s.on_inject(user("i1", "use tabs"), false));
        assert_eq!(id, "i1");
        assert!(matches!(state, State::Queued(_)));
        assert!(s.has_queued());

        let mut messages = Vec::new();
        let (texts, acks) = s.deliver(&mut messages, 3);
        assert_eq!(messages.len(), 1);
        assert_eq!(texts, [format!("{STEER_NOTE}\nuse tabs")]);
        let (id, state) = ack(&acks[0]);
        assert_eq!(id, "i1");
        let State::Delivered(d) = state else {
            panic!("{state:?}")
        };
        assert_eq!(d.step, 3);
        assert!(!s.has_queued());
    }

    #[test]
    fn a_wrong_run_id_or_an_empty_payload_is_rejected() {
        let mut s = Steering::new(Some("run-1".into()));
        s.open_turn();
        let mut other = user("i1", "x");
        other.expected_run_id = "run-2".into();
        let (_, state) = ack(&s.on_inject(other, false));
        let State::Rejected(r) = state else {
            panic!("{state:?}")
        };
        assert!(r.reason.contains("run-1") && r.reason.contains("run-2"));

        let empty = pb::InjectContextAction {
            injection_id: "i2".into(),
            payload: Some(Payload::SystemContext(pb::SystemContextInjection {
                producer: "ide".into(),
                content: "  ".into(),
            })),
            ..Default::default()
        };
        assert!(matches!(
            ack(&s.on_inject(empty, false)).1,
            State::Rejected(_)
        ));
        assert!(!s.has_queued());
    }

    #[test]
    fn what_the_turn_cannot_deliver_goes_to_the_next_turn_and_is_recorded() {
        let mut s = Steering::new(None);
        s.open_turn();
        s.on_inject(user("i1", "first"), false);
        s.note(Message::user_text("background done"));
        // The turn's last model call is over: the injection is carried, our note recorded.
        let acks = s.defer();
        assert_eq!(acks.len(), 1, "our own note is never acknowledged");
        assert!(matches!(ack(&acks[0]).1, State::QueuedForNextTurn(_)));
        assert_eq!(s.take_late(), ["background done"]);
        // Between the turn's calls and its record, a new one is carried too.
        assert!(matches!(
            ack(&s.on_inject(user("i2", "second"), false)).1,
            State::QueuedForNextTurn(_)
        ));
        let carried = s.take_carried();
        assert_eq!(carried.len(), 2);
        assert!(carried[0].ends_with("first") && carried[1].ends_with("second"));
        // Once recorded, later ones are answered without a record.
        assert!(matches!(
            ack(&s.on_inject(user("i3", "third"), false)).1,
            State::QueuedForNextTurn(_)
        ));
        assert!(s.take_carried().is_empty());
    }

    #[test]
    fn a_cancel_answers_every_waiting_injection_and_every_later_one() {
        let mut s = Steering::new(None);
        s.open_turn();
        s.on_inject(user("i1", "a"), false);
        s.note(Message::user_text("ours"));
        s.close_canceled();
        let acks = s.cancel_waiting();
        assert_eq!(acks.len(), 1, "only the client's injection is answered");
        assert_eq!(ack(&acks[0]).0, "i1");
        assert!(matches!(ack(&acks[0]).1, State::Cancelled(_)));
        assert!(matches!(
            ack(&s.on_inject(user("i2", "b"), false)).1,
            State::Cancelled(_)
        ));
    }

    #[test]
    fn the_next_turn_reads_a_carried_injection_once() {
        let mut history = vec![
            Message::user_text("earlier"),
            Message::user_text(format!("{STEER_NOTE}\nfix the test")),
        ];
        drop_carried_copies(&mut history, " fix the test ");
        assert_eq!(history.len(), 1);
        assert_eq!(message_text(&history[0]), "earlier");
        // An empty text drops nothing.
        let mut history = vec![Message::user_text(format!("{STEER_NOTE}\n"))];
        drop_carried_copies(&mut history, "");
        assert_eq!(history.len(), 1);
    }
}
