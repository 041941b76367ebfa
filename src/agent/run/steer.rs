//! Steering: `inject_context_action` on a running run. An injection is acknowledged `queued`
//! at once, joins the conversation at the next model call of the turn (after the tool round in
//! flight; a streaming answer is never cut) and is then acknowledged `delivered`. One that
//! arrives after the turn's last model call is `queued_for_next_turn`: the client sends it as
//! the next turn (Cursor's SDK does exactly that on this answer).

use super::{RunError, RunState};
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

/// The injections of a run.
pub(super) struct Steering {
    /// The run's id, when the request named one: `expected_run_id` must match it.
    run_id: Option<String>,
    queued: Vec<Injected>,
    /// The turn still makes model calls (injections can be delivered).
    open: bool,
    /// Notes that came after the turn's last model call: recorded in the turn instead.
    late: Vec<String>,
}

impl Steering {
    pub(super) fn new(run_id: Option<String>) -> Steering {
        Steering {
            run_id: run_id.filter(|r| !r.is_empty()),
            queued: Vec::new(),
            open: false,
            late: Vec::new(),
        }
    }

    pub(super) fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// A note of ours for the model (no acknowledgement): at the next model call of the
    /// turn, or, after its last one, into the turn's record.
    pub(super) fn note(&mut self, message: Message) {
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

/// What an injection adds to the conversation.
fn injected_message(a: &pb::InjectContextAction, images: bool) -> Option<Message> {
    use pb::inject_context_action::Payload;
    match a.payload.as_ref()? {
        Payload::UserContext(u) => {
            let mut user = u.user_message.clone()?;
            user.text = format!(
                "[The user sent this while you were working; take it into account]\n{}",
                user.text
            );
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

impl RunState {
    /// An injection arrived: reject, defer or queue it, and say so.
    pub(super) async fn on_inject(&mut self, a: pb::InjectContextAction) -> Result<(), RunError> {
        let id = a.injection_id.clone();
        let s = &self.steering;
        let state = match (&s.run_id, a.expected_run_id.as_str()) {
            (Some(run), expected) if !expected.is_empty() && expected != run => {
                State::Rejected(pb::ContextInjectionRejected {
                    reason: format!("this run is {run}, not {expected}"),
                })
            }
            _ => match injected_message(&a, self.run.model.config.supports_images) {
                None => State::Rejected(pb::ContextInjectionRejected {
                    reason: "the injection carries no context".into(),
                }),
                Some(_) if !s.open => {
                    State::QueuedForNextTurn(pb::ContextInjectionQueuedForNextTurn {})
                }
                Some(message) => {
                    self.steering.queued.push(Injected {
                        id: id.clone(),
                        message,
                    });
                    State::Queued(pb::ContextInjectionQueued {})
                }
            },
        };
        self.out.send(msg::injection_state(id, state)).await
    }

    /// The turn makes model calls from now on: injections wait for the next one.
    pub(super) fn open_steering(&mut self) {
        self.steering.open = true;
    }

    /// Handle whatever the client has sent meanwhile, without waiting (an injection that came
    /// in during the last model call must still make the turn's next call).
    pub(super) async fn drain_events(&mut self) -> Result<(), RunError> {
        while let Ok(ev) = self.events.try_recv() {
            self.dispatch(Some(ev)).await?;
        }
        Ok(())
    }

    /// Move the queued injections into the conversation for the model call about to start;
    /// each is acknowledged `delivered`. Returns the texts to record in the turn.
    pub(super) async fn deliver_injections(
        &mut self,
        messages: &mut Vec<Message>,
    ) -> Result<Vec<String>, RunError> {
        let step = self.step + 1;
        let mut texts = Vec::new();
        for inj in std::mem::take(&mut self.steering.queued) {
            texts.push(message_text(&inj.message));
            messages.push(inj.message);
            if !inj.id.is_empty() {
                self.out
                    .send(msg::injection_delivered(inj.id, step))
                    .await?;
            }
        }
        Ok(texts)
    }

    /// The turn is over: what is still queued goes to the next turn.
    pub(super) async fn defer_injections(&mut self) -> Result<(), RunError> {
        self.steering.open = false;
        for inj in std::mem::take(&mut self.steering.queued) {
            if inj.id.is_empty() {
                self.steering.late.push(message_text(&inj.message));
                continue;
            }
            let state = State::QueuedForNextTurn(pb::ContextInjectionQueuedForNextTurn {});
            self.out.send(msg::injection_state(inj.id, state)).await?;
        }
        Ok(())
    }
}
