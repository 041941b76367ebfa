//! The agent's HTTP face, [`AgentTransports`]: what every transport shares (the agent, the
//! upstream, the routing pins, the HTTP/1.1 pairing, the frame limits), the decision on a
//! run's first message, and the schema check on each client message. Below the transports.

use std::sync::Arc;

use super::inference_ids::InferenceIds;
use super::pairing::Pairings;
use super::pins::PinStore;
use super::recent::RecentPrompts;
use super::routing::{Decision, RoutingTable};
use super::streams::CursorStreams;
use crate::agent::cmdk::CmdK;
use crate::agent::subagents::ParentLink;
use crate::agent::{model, Agent, RunError};
use crate::connect::{Code, ConnectError, Limits};
use crate::proto::agent::v1 as pb;
use crate::upstream::Upstream;

/// See [`AgentTransports::pairing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pairing {
    pub requests: usize,
    pub(crate) held_append_bytes: usize,
    pub(crate) backlog_bytes: usize,
}

/// The agent's HTTP face. Cheap to clone.
#[derive(Clone)]
pub struct AgentTransports {
    pub(super) inner: Arc<TransportsShared>,
}

pub(super) struct TransportsShared {
    agent: Agent,
    upstream: Upstream,
    pub(super) routes: RoutingTable,
    /// The one store of conversation pins, kept across restarts (resumes name no model).
    pins: PinStore,
    /// Recent runs' prompts, for the side calls that name no conversation.
    recent: RecentPrompts,
    pub(super) bidi: Pairings,
    pub(super) limits: Limits,
    cmdk: CmdK,
    /// Request ids of `RunInferenceSSE` / `RunInferencePoll` streams (their appends are not
    /// agent messages).
    pub(super) inference: InferenceIds,
    /// Request ids of Cursor's own `…SSE` / `…Poll` streams (their appends are Cursor's).
    pub(super) streams: CursorStreams,
}

impl AgentTransports {
    pub fn new(agent: Agent, upstream: Upstream) -> Self {
        let limits = Limits {
            max_frame_bytes: agent.config().limits.max_frame_bytes,
            max_decompressed_bytes: agent.config().limits.max_decompressed_bytes,
        };
        let pins = PinStore::open(&agent.config().data_dir());
        AgentTransports {
            inner: Arc::new(TransportsShared {
                cmdk: CmdK::new(agent.clone()),
                agent,
                upstream,
                routes: RoutingTable::default(),
                pins,
                recent: RecentPrompts::default(),
                bidi: Pairings::default(),
                limits,
                inference: InferenceIds::default(),
                streams: CursorStreams::default(),
            }),
        }
    }

    pub fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    /// Cmd+K on the user's models.
    pub fn cmdk(&self) -> &CmdK {
        &self.inner.cmdk
    }

    /// What the HTTP/1.1 transport holds right now: the request ids it pairs, the bytes of
    /// appends waiting for their turn and of run output waiting for a reader.
    pub fn pairing(&self) -> Pairing {
        let bidi = &self.inner.bidi;
        Pairing {
            requests: bidi.len(),
            held_append_bytes: bidi.held_bytes(),
            backlog_bytes: bidi.backlog_bytes(),
        }
    }

    /// The conversation pins: where each conversation's runs go, and whether it ever had a
    /// turn on one of our models (for the calls around a conversation, which name it).
    pub fn pins(&self) -> &PinStore {
        &self.inner.pins
    }

    /// Ours or Cursor's, for a run's first client message (`parent`: what the run's requests
    /// say of a parent run); pins the answer, except for prewarms and subagent runs. A model
    /// with our prefix is ours or refused. A child of one of our runs is ours, or refused
    /// unless it names the model our subagent call asked for. One that names no model (a
    /// resume) follows its conversation's pin, kept across restarts; without one it is refused
    /// with an error that says why, never relayed on a guess.
    pub(super) fn decide(
        &self,
        request_id: &str,
        first: &pb::AgentClientMessage,
        parent: &ParentLink,
    ) -> Result<Decision, ConnectError> {
        let opening = Opening::of(first);
        let child = self.child_of_ours(parent, opening.prompt.as_deref());
        let decision = self
            .route(&opening, child.as_ref())
            .and_then(|d| self.configured(d));
        let decision = decision.map_err(|e| {
            tracing::warn!(request_id, conversation = %opening.conversation, "{e}");
            e.to_connect()
        })?;
        if !opening.prewarm {
            self.inner.routes.pin_request(request_id, decision.clone());
            if child.is_none() {
                self.inner.pins.pin(&opening.conversation, &decision);
            }
        }
        self.inner.recent.record_run(first, &decision);
        tracing::debug!(request_id, ?decision, "agent run routed");
        Ok(decision)
    }

    /// Where a run goes, by its model first, then by what is known of its conversation.
    fn route(&self, o: &Opening, child: Option<&Expected>) -> Result<Decision, RunError> {
        let pins = &self.inner.pins;
        let pinned = || pins.get(&o.conversation);
        // Ours on no model known: a prewarm is answered here, a run cannot be.
        let marked = || pins.had_byok_turn(&o.conversation) && pins.get(&o.conversation).is_none();
        let here = || Decision::Ours {
            model_id: String::new(),
        };
        match &o.model_id {
            Some(id) if self.inner.agent.is_our_model(id) => Ok(Decision::Ours {
                model_id: id.clone(),
            }),
            Some(id) if model::has_our_prefix(id) => Err(RunError::NotConfigured(id.clone())),
            _ if child.is_some() => child_route(o.model_id.as_deref(), child),
            // A prewarm carries the conversation's state: one of ours is warmed here.
            Some(_) if o.prewarm => match pinned() {
                Some(d @ Decision::Ours { .. }) => Ok(d),
                _ if marked() => Ok(here()),
                _ => Ok(Decision::Relay),
            },
            Some(_) if !o.resume => Ok(Decision::Relay),
            // A resume that names one of Cursor's models follows its pin, else it is Cursor's.
            Some(_) => match pinned() {
                Some(d) => Ok(d),
                None if marked() => Err(undecidable(&o.conversation)),
                None => Ok(Decision::Relay),
            },
            // No model at all: only the conversation's pin can say.
            None => match pinned() {
                Some(d) => Ok(d),
                None if o.prewarm && marked() => Ok(here()),
                None => Err(undecidable(&o.conversation)),
            },
        }
    }

    /// `d`, unless it is ours on a model the configuration no longer has (a pin made before
    /// the model was renamed or removed).
    fn configured(&self, d: Decision) -> Result<Decision, RunError> {
        match &d {
            Decision::Ours { model_id }
                if !model_id.is_empty() && !self.inner.agent.is_our_model(model_id) =>
            {
                Err(RunError::NotConfigured(model_id.clone()))
            }
            _ => Ok(d),
        }
    }

    /// Whether a new run is the child of one of our runs: a subagent call of ours waits for
    /// it (by the parent its requests name, or its user message), or it names a parent run
    /// of ours.
    fn child_of_ours(&self, parent: &ParentLink, prompt: Option<&str>) -> Option<Expected> {
        if let Some(model) = self.inner.agent.expected_child_model(parent, prompt) {
            return Some(Expected { model: Some(model) });
        }
        let parent_run = parent.request_id.as_deref()?;
        matches!(
            self.inner.routes.request(parent_run),
            Some(Decision::Ours { .. })
        )
        .then_some(Expected { model: None })
    }

    pub(crate) fn upstream(&self) -> &Upstream {
        &self.inner.upstream
    }

    /// What the one pin store says of `conversation_id`: its pin, or ours on no known model
    /// when it only keeps the sticky mark of a BYOK turn (its pin evicted or moved to Cursor).
    pub(crate) fn conversation_decision(&self, conversation_id: &str) -> Option<Decision> {
        let pins = &self.inner.pins;
        match pins.get(conversation_id) {
            Some(d @ Decision::Ours { .. }) => Some(d),
            _ if pins.had_byok_turn(conversation_id) => Some(Decision::Ours {
                model_id: String::new(),
            }),
            d => d,
        }
    }

    /// Pin `conversation_id` to `d` in the one pin store (a fork follows its source).
    pub(crate) fn pin_conversation(&self, conversation_id: &str, d: Decision) {
        match &d {
            Decision::Ours { model_id } if model_id.is_empty() => {
                self.inner.pins.mark_byok(conversation_id, None)
            }
            Decision::Ours { model_id } => {
                self.inner.pins.mark_byok(conversation_id, Some(model_id))
            }
            Decision::Relay => self.inner.pins.pin(conversation_id, &d),
        }
    }

    pub(crate) fn recent_prompts(&self) -> &RecentPrompts {
        &self.inner.recent
    }

    /// The schema check on one client message of one of our runs (`wire`, an encoded
    /// `AgentClientMessage`): what this build does not know goes to the status registry (and
    /// the log, once per kind). Returns why the run must end when the message carries a branch
    /// the run cannot act on: a conversation action or an exec result it does not know would
    /// otherwise be dropped silently, or leave the run waiting for an answer that never comes.
    pub(super) fn inspect_client(
        &self,
        wire: &[u8],
        client_version: Option<&str>,
    ) -> Option<String> {
        let report = crate::proto::inspect::schema().check(AGENT_CLIENT_MESSAGE, wire);
        let status = self.agent().status();
        status.unknown_schema("agent run", client_version, &report);
        if let Some(capture) = status.capture() {
            capture.message(
                crate::capture::Direction::FromClient,
                "agent run",
                AGENT_CLIENT_MESSAGE,
                wire,
                client_version,
                Some(&report),
            );
        }
        let (what, u) = UNHANDLED
            .iter()
            .find_map(|(at, what)| report.branch_at(at).map(|u| (what, u)))?;
        Some(format!(
            "{what} this cursor-byok {} does not know ({}); update cursor-byok, and if the \
             newest release does not know it either, report it with a capture \
             (`cursor-byok run --capture FILE`)",
            env!("CARGO_PKG_VERSION"),
            u.key,
        ))
    }
}

const AGENT_CLIENT_MESSAGE: &str = "agent.v1.AgentClientMessage";

/// A failure reading a request's body or frames, as the client is told it: a bound reached,
/// or input that cannot be read (never passed on unread).
pub(super) fn unreadable(e: ConnectError) -> ConnectError {
    let e = match e.code {
        Code::ResourceExhausted => RunError::Limit(e.message),
        Code::Canceled => RunError::ClientLeft(e.message),
        _ => RunError::BadClientMessage(e.message),
    };
    e.to_connect()
}

/// What a run's first client message says about where it goes.
struct Opening {
    model_id: Option<String>,
    conversation: String,
    resume: bool,
    prewarm: bool,
    /// Its user message, to match it with a subagent call of ours.
    prompt: Option<String>,
}

impl Opening {
    fn of(first: &pb::AgentClientMessage) -> Opening {
        use pb::agent_client_message::Message as In;
        use pb::conversation_action::Action;
        match &first.message {
            Some(In::RunRequest(r)) => {
                let action = r.action.as_ref().and_then(|a| a.action.as_ref());
                Opening {
                    model_id: model::requested_model_id(r).map(str::to_string),
                    conversation: r.conversation_id.clone().unwrap_or_default(),
                    resume: matches!(action, Some(Action::ResumeAction(_))),
                    prewarm: false,
                    prompt: match action {
                        Some(Action::UserMessageAction(a)) => {
                            a.user_message.as_ref().map(|u| u.text.clone())
                        }
                        _ => None,
                    },
                }
            }
            Some(In::PrewarmRequest(p)) => Opening {
                model_id: model::prewarm_model_id(p).map(str::to_string),
                conversation: p.conversation_id.clone().unwrap_or_default(),
                resume: false,
                prewarm: true,
                prompt: None,
            },
            _ => Opening {
                model_id: None,
                conversation: String::new(),
                resume: false,
                prewarm: false,
                prompt: None,
            },
        }
    }
}

/// A run that is the child of one of our runs, and the model our call asked for (when a call
/// of ours waits for it).
struct Expected {
    model: Option<String>,
}

/// A child of one of our runs that names no model of ours: Cursor's only when it names the
/// model our subagent call asked for (the task tool asks for one of Cursor's models only when
/// the client offered it for subagents); otherwise it would carry the parent's files to Cursor.
fn child_route(model_id: Option<&str>, child: Option<&Expected>) -> Result<Decision, RunError> {
    let expected = child.and_then(|c| c.model.as_deref());
    match model_id {
        Some(id) if expected == Some(id) => Ok(Decision::Relay),
        Some(id) => Err(RunError::Withheld(format!(
            "this run is a subagent of a run on your own model and names the model `{id}`, \
             which is none of your cursor-byok models nor the one its subagent call asked for"
        ))),
        None => Err(RunError::Withheld(
            "this run is a subagent of a run on your own model and names no model".to_string(),
        )),
    }
}

/// The error for a run nothing decides: neither its model nor a pin of its conversation says
/// whether it is the user's, so it goes nowhere.
fn undecidable(conversation: &str) -> RunError {
    RunError::Withheld(if conversation.is_empty() {
        "this agent run names no model and no conversation".to_string()
    } else {
        format!(
            "this agent run resumes conversation {conversation} without naming a model, and \
             cursor-byok has no record of which of your models that conversation is on (choose \
             the model again in Cursor's model picker, or start a new conversation)"
        )
    })
}

/// Where an unknown oneof branch ends the run, and what to call it.
const UNHANDLED: [(&str, &str); 3] = [
    (
        "AgentClientMessage.run_request.action",
        "a conversation action",
    ),
    (
        "AgentClientMessage.conversation_action",
        "a conversation action",
    ),
    ("AgentClientMessage.exec_client_message", "an exec result"),
];
