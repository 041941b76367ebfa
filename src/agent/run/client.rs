//! The run's side of the conversation with the Cursor client: every exchange that waits on it
//! (execs, blob stores and fetches, questions to the user), and the routing of whatever the
//! client sends meanwhile to the part of the run it concerns.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::background::{self, Background};
use super::error::RunError;
use super::exec::{ExecBridge, ExecOutcome};
use super::inbox::ClientEvent;
use super::kv::KvBridge;
use super::outbox::{Outbox, WIND_DOWN};
use super::setup::Run;
use super::steer::Steering;
use crate::agent::messages as msg;
use crate::agent::state::{Blob, BlobId};
use crate::agent::subagents::SubagentCalls;
use crate::proto::agent::v1 as pb;
use crate::provider::Message;

/// How long a user may take to answer a question before the run gives up.
const INTERACTION_TIMEOUT: Duration = Duration::from_secs(3600);

/// An exec for the client to run, and the Cursor call id its output streams to (shell).
pub(super) type Exec = (pb::exec_server_message::Message, Option<String>);

/// What the run holds of its client: the two channels, the exchanges in flight, and the
/// steering and background work the client's messages feed.
pub(super) struct Client {
    pub(super) out: Outbox,
    events: mpsc::Receiver<ClientEvent>,
    events_open: bool,
    cancel: CancellationToken,
    /// Canceled, storing what the turn did: waits ignore the cancel but are kept short.
    pub(super) winding_down: bool,
    /// How long the client may stay silent while we wait on it.
    timeout: Duration,
    pub(super) exec: ExecBridge,
    kv: KvBridge,
    /// Interaction responses by query id, as they arrive.
    interactions: HashMap<u32, Option<pb::InteractionResponse>>,
    next_interaction: u32,
    /// Exec id → Cursor call id, for execs whose output streams to the UI (shell).
    shell_streams: HashMap<u32, String>,
    pub(super) background: Background,
    /// Context injected into the running turn, waiting for the next model call.
    pub(super) steering: Steering,
    /// Whether the model reads images (injected messages keep theirs).
    images: bool,
    /// Subagent calls and child runs (shared by every run): the user may stop one.
    subagents: SubagentCalls,
}

impl Client {
    pub(super) fn new(
        run: &Run,
        out: Outbox,
        events: mpsc::Receiver<ClientEvent>,
        cancel: CancellationToken,
        run_id: Option<String>,
    ) -> Client {
        Client {
            out,
            events,
            events_open: true,
            cancel,
            winding_down: false,
            timeout: run.settings.client_timeout,
            exec: ExecBridge::default(),
            kv: KvBridge::default(),
            interactions: HashMap::new(),
            next_interaction: 1,
            shell_streams: HashMap::new(),
            background: Background::default(),
            steering: Steering::new(run_id),
            images: run.model.config.supports_images,
            subagents: run.subagents.clone(),
        }
    }

    /// Whether the client may still send something.
    pub(super) fn listening(&self) -> bool {
        self.events_open
    }

    /// The next client event, as it comes (`None`: the client will send nothing more).
    pub(super) async fn recv(&mut self) -> Option<ClientEvent> {
        self.events.recv().await
    }

    /// Wait for the next client event, giving up at `deadline`.
    pub(super) async fn next_event(
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
                secs: self.timeout.as_secs(),
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
    pub(super) async fn dispatch(&mut self, ev: Option<ClientEvent>) -> Result<(), RunError> {
        match ev {
            None => self.events_open = false,
            Some(ClientEvent::Exec(m)) => self.on_exec(m).await?,
            Some(ClientEvent::ExecControl(c)) => {
                if let Some(id) = self.exec.on_control(c) {
                    self.background.settle(&mut self.exec, id);
                }
            }
            Some(ClientEvent::BackgroundShell(b)) => {
                let running = self.shell_streams.values().any(|c| *c == b.tool_call_id);
                let m = self
                    .background
                    .force(&mut self.exec, b.tool_call_id, running);
                self.out.send(m).await?;
            }
            Some(ClientEvent::Completion(c)) => self.on_completion(&c),
            Some(ClientEvent::Kv(k)) => self.kv.on_message(k),
            Some(ClientEvent::Inject(i)) => {
                let ack = self.steering.on_inject(*i, self.images);
                self.out.send(ack).await?;
            }
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

    /// An exec result: shell output streams on to the UI, the rest waits in the bridge.
    async fn on_exec(&mut self, m: Box<pb::ExecClientMessage>) -> Result<(), RunError> {
        let id = m.id;
        if let (Some(call_id), Some(pb::exec_client_message::Message::ShellStream(s))) =
            (self.shell_streams.get(&id), m.message.as_ref())
        {
            if let Some(delta) = crate::agent::tools::shell_delta(s) {
                let update = msg::tool_call_delta(call_id.clone(), delta);
                self.out.send(update).await?;
            }
        }
        if !self.exec.on_result(*m) {
            debug!(id, "exec result for no exec of ours");
        }
        self.background.settle(&mut self.exec, id);
        Ok(())
    }

    /// Handle whatever the client has sent meanwhile, without waiting (an injection that came
    /// in during the last model call must still make the turn's next call).
    pub(super) async fn drain_events(&mut self) -> Result<(), RunError> {
        while let Ok(ev) = self.events.try_recv() {
            self.dispatch(Some(ev)).await?;
        }
        Ok(())
    }

    /// Send execs and wait until each has answered (first result that is final, or closed).
    /// Any word from the client about one of them restarts the clock.
    pub(super) async fn run_execs(
        &mut self,
        execs: Vec<Exec>,
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
        let mut deadline = tokio::time::Instant::now() + self.timeout;
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
                deadline = tokio::time::Instant::now() + self.timeout;
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
    pub(super) async fn run_exec(
        &mut self,
        args: pb::exec_server_message::Message,
        stream_to: Option<String>,
        what: &str,
    ) -> Result<ExecOutcome, RunError> {
        let mut outcomes = self.run_execs(vec![(args, stream_to)], what).await?;
        Ok(outcomes.pop().unwrap_or_default())
    }

    /// One exec, waited for at most `within`: `None` when the client did not answer in time
    /// (the exec is aborted at the client; the run goes on).
    pub(super) async fn run_exec_within(
        &mut self,
        args: pb::exec_server_message::Message,
        within: Duration,
        what: &str,
    ) -> Result<Option<ExecOutcome>, RunError> {
        let (id, exec_id) = self.exec.open();
        self.out.send(msg::exec(id, exec_id, args)).await?;
        let deadline = tokio::time::Instant::now() + within;
        while !(self.exec.is_done(id, false) || self.exec.has_final(id)) {
            match self.next_event(deadline, what).await {
                Ok(ev) => self.dispatch(Some(ev)).await?,
                Err(RunError::ClientTimeout { .. }) => {
                    // The client is told to stop it: it must not run (or answer) later.
                    self.exec.take(id);
                    self.out.send(msg::exec_abort(id)).await?;
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Some(self.exec.take(id)))
    }

    /// Store `blobs` with the client and wait until every one is acknowledged. A checkpoint
    /// may only reference blobs the client has confirmed.
    pub(super) async fn store_blobs(&mut self, blobs: &[Blob]) -> Result<(), RunError> {
        let mut ids = Vec::with_capacity(blobs.len());
        for blob in blobs {
            let (id, m) = self.kv.store(blob);
            self.out.send(m).await?;
            ids.push(id);
        }
        self.wait_kv(&ids, "acknowledging the conversation's blobs")
            .await?;
        self.kv.stored(ids)
    }

    /// Ask the client for blobs. `None` for one it does not have, or whose bytes do not hash
    /// to the id asked for.
    pub(super) async fn fetch_blobs(
        &mut self,
        wanted: &[BlobId],
    ) -> Result<Vec<(BlobId, Option<Bytes>)>, RunError> {
        let mut ids = Vec::with_capacity(wanted.len());
        for blob_id in wanted {
            let (id, m) = self.kv.fetch(blob_id);
            self.out.send(m).await?;
            ids.push(id);
        }
        self.wait_kv(&ids, "sending the conversation's blobs")
            .await?;
        Ok(self.kv.fetched(ids, wanted))
    }

    async fn wait_kv(&mut self, ids: &[u32], what: &str) -> Result<(), RunError> {
        let mut deadline = tokio::time::Instant::now() + self.timeout;
        while !self.kv.answered(ids) {
            let ev = self.next_event(deadline, what).await?;
            let progress = matches!(&ev, ClientEvent::Kv(k) if ids.contains(&k.id));
            self.dispatch(Some(ev)).await?;
            if progress {
                deadline = tokio::time::Instant::now() + self.timeout;
            }
        }
        Ok(())
    }

    /// Ask the client `query` and wait for the user's answer.
    pub(super) async fn ask(
        &mut self,
        query: pb::interaction_query::Query,
    ) -> Result<pb::InteractionResponse, RunError> {
        let id = self.next_interaction;
        self.next_interaction = self.next_interaction.wrapping_add(1).max(1);
        self.interactions.insert(id, None);
        self.out.send(msg::interaction_query(id, query)).await?;
        let deadline = tokio::time::Instant::now() + INTERACTION_TIMEOUT;
        while self.interactions.get(&id).is_some_and(Option::is_none) {
            let ev = self.next_event(deadline, "an answer from the user").await?;
            self.dispatch(Some(ev)).await?;
        }
        Ok(self.interactions.remove(&id).flatten().unwrap_or_default())
    }

    /// Stop the subagent `id`: its child run, when it is one of ours.
    pub(super) fn cancel_subagent(&self, id: &str) {
        if self.subagents.cancel(id) {
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

    /// A background task finished: the model hears of it at the next model call of the turn,
    /// or, when the turn makes no more, in the turn's record (the next turn reads it).
    fn on_completion(&mut self, a: &pb::BackgroundTaskCompletionAction) {
        self.background.remember(a);
        let note = background::completion_note(a);
        self.steering.note(Message::user_text(note));
    }

    /// The SDK and CLI send no request context: ask the client for it.
    pub(super) async fn fetch_request_context(
        &mut self,
    ) -> Result<Option<pb::RequestContext>, RunError> {
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

    /// Read a plan file through the client (a Build that names only the file).
    pub(super) async fn read_plan(&mut self, path: &str) -> Result<String, RunError> {
        use pb::exec_client_message::Message as R;
        use pb::read_result::Result as RR;
        let args = pb::exec_server_message::Message::ReadArgs(pb::ReadArgs {
            path: path.to_string(),
            ..Default::default()
        });
        let what = "the plan file";
        let outcome = self.run_exec(args, None, what).await?;
        let failed = |message: String| RunError::ClientFailed {
            what: format!("{what} {path}"),
            message,
        };
        if let Some(err) = outcome.thrown {
            return Err(failed(err));
        }
        for r in outcome.results {
            if let R::ReadResult(res) = r {
                return match res.result {
                    Some(RR::Success(s)) => match s.output {
                        Some(pb::read_success::Output::Content(c)) => Ok(c),
                        Some(pb::read_success::Output::Data(d)) => {
                            Ok(String::from_utf8_lossy(&d).into_owned())
                        }
                        None => Ok(String::new()),
                    },
                    Some(RR::FileNotFound(_)) => Err(failed("the file does not exist".into())),
                    other => Err(failed(format!("the read failed ({other:?})"))),
                };
            }
        }
        Err(failed("no read result".into()))
    }

    /// On failure or cancel, tell the client to stop whatever it is still running for us.
    pub(super) async fn abort_open_execs(&mut self) {
        for id in self.exec.open_ids() {
            let _ = self.out.send(msg::exec_abort(id)).await;
            self.exec.take(id);
        }
    }

    /// The turn is being recorded: the injections carried to the next turn, as texts to store
    /// at its end (see [`Steering::take_carried`]).
    pub(super) async fn take_carried(&mut self) -> Result<Vec<String>, RunError> {
        for ack in self.steering.defer() {
            self.out.send(ack).await?;
        }
        self.drain_events().await?;
        Ok(self.steering.take_carried())
    }

    /// The run was canceled or failed: every injection still waiting is `cancelled`, and so is
    /// any that comes later. Best effort: the client may be gone.
    pub(super) async fn cancel_injections(&mut self) {
        self.steering.close_canceled();
        let _ = self.drain_events().await;
        for m in self.steering.cancel_waiting() {
            let _ = self.out.send(m).await;
        }
    }
}
