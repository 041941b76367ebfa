//! The exec bridge: asks the Cursor client to run something (`exec_server_message`), and
//! collects what it answers until `stream_close`, a `throw`, or silence.

use std::collections::HashMap;

use crate::proto::agent::v1 as pb;
use pb::exec_client_control_message::Message as Control;

/// What the client answered for one exec.
#[derive(Debug, Default)]
pub(crate) struct ExecOutcome {
    /// Every result message, in arrival order (shell streams send several).
    pub results: Vec<pb::exec_client_message::Message>,
    /// The client's `throw` error, if it failed.
    pub thrown: Option<String>,
    /// What the client's hooks added for the model while running it (bounded).
    pub hooks: Vec<pb::HookAdditionalContext>,
}

/// Hook contexts kept per exec, at most (a client could attach any number).
const MAX_HOOKS: usize = 16;

#[derive(Debug, Default)]
struct PendingExec {
    outcome: ExecOutcome,
    closed: bool,
}

/// Id allocation and bookkeeping of execs in flight. Pure: the run feeds it client messages.
#[derive(Debug)]
pub(crate) struct ExecBridge {
    next_id: u32,
    pending: HashMap<u32, PendingExec>,
    /// The client's own exec id for the next exec (a user command it already started).
    adopt: Option<String>,
}

impl Default for ExecBridge {
    fn default() -> Self {
        // Ids start at 1: 0 is protobuf's default and would match an empty `stream_close {}`.
        ExecBridge {
            next_id: 1,
            pending: HashMap::new(),
            adopt: None,
        }
    }
}

impl ExecBridge {
    /// Allocate the next id (monotonic per run) and its exec id, and start tracking it.
    pub fn open(&mut self) -> (u32, String) {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.pending.insert(id, PendingExec::default());
        let exec_id = self
            .adopt
            .take()
            .unwrap_or_else(|| format!("byok-exec-{id}-{:08x}", rand::random::<u32>()));
        (id, exec_id)
    }

    /// The next exec carries the client's `exec_id` (`shell_command_action.exec_id`), so the
    /// client attaches it to the command it already runs.
    pub(crate) fn adopt_next(&mut self, exec_id: String) {
        self.adopt = Some(exec_id).filter(|e| !e.is_empty());
    }

    /// Record a result. Returns false when it belongs to no exec of ours.
    pub(crate) fn on_result(&mut self, msg: pb::ExecClientMessage) -> bool {
        let Some(p) = self.pending.get_mut(&msg.id) else {
            return false;
        };
        let room = MAX_HOOKS.saturating_sub(p.outcome.hooks.len());
        p.outcome
            .hooks
            .extend(msg.hook_additional_contexts.into_iter().take(room));
        if let Some(m) = msg.message {
            p.outcome.results.push(m);
        }
        true
    }

    /// Record a control message (close, throw, heartbeat). Returns the exec id it concerned.
    pub(crate) fn on_control(&mut self, msg: pb::ExecClientControlMessage) -> Option<u32> {
        match msg.message? {
            Control::StreamClose(c) => {
                self.pending.get_mut(&c.id)?.closed = true;
                Some(c.id)
            }
            Control::Throw(t) => {
                let p = self.pending.get_mut(&t.id)?;
                p.outcome.thrown = Some(if t.error.is_empty() {
                    "the client failed to run it".to_string()
                } else {
                    t.error
                });
                p.closed = true;
                Some(t.id)
            }
            Control::Heartbeat(h) => self.pending.contains_key(&h.id).then_some(h.id),
        }
    }

    /// Finished: closed or thrown, or (when `first_result_suffices`) answered at all.
    pub fn is_done(&self, id: u32, first_result_suffices: bool) -> bool {
        self.pending
            .get(&id)
            .is_none_or(|p| p.closed || (first_result_suffices && !p.outcome.results.is_empty()))
    }

    /// Has the client sent a result that ends this exec (anything but streamed shell output)?
    /// Then the run need not wait for `stream_close`.
    pub(crate) fn has_final(&self, id: u32) -> bool {
        self.pending.get(&id).is_some_and(|p| {
            p.outcome
                .results
                .iter()
                .any(crate::agent::tools::result_is_final)
        })
    }

    /// Stop tracking and hand back what was collected.
    pub fn take(&mut self, id: u32) -> ExecOutcome {
        self.pending
            .remove(&id)
            .map(|p| p.outcome)
            .unwrap_or_default()
    }

    /// Execs still running (to abort on cancel).
    pub(crate) fn open_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.pending.keys().copied().collect();
        ids.sort_unstable();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(id: u32) -> pb::ExecClientControlMessage {
        pb::ExecClientControlMessage {
            message: Some(Control::StreamClose(pb::ExecClientStreamClose { id })),
        }
    }

    #[test]
    fn collects_until_close() {
        let mut b = ExecBridge::default();
        let (a, _) = b.open();
        let (c, _) = b.open();
        assert_eq!((a, c), (1, 2));
        assert!(!b.is_done(a, false));
        let result = pb::ExecClientMessage {
            id: a,
            message: Some(pb::exec_client_message::Message::ShellStream(
                Default::default(),
            )),
            ..Default::default()
        };
        assert!(b.on_result(result.clone()));
        assert!(b.on_result(result));
        assert!(b.is_done(a, true) && !b.is_done(a, false));
        assert_eq!(b.on_control(close(a)), Some(a));
        assert!(b.is_done(a, false));
        assert_eq!(b.take(a).results.len(), 2);
        assert_eq!(b.open_ids(), vec![c]);
        assert_eq!(b.on_control(close(99)), None);
    }

    /// Hook contexts on an exec's results are kept up to [`MAX_HOOKS`], across results.
    #[test]
    fn hook_contexts_are_kept_up_to_the_bound() {
        let mut b = ExecBridge::default();
        let (a, _) = b.open();
        let hook = pb::HookAdditionalContext {
            hook_event_name: "postToolUse".into(),
            content: "note".into(),
        };
        for _ in 0..2 {
            assert!(b.on_result(pb::ExecClientMessage {
                id: a,
                hook_additional_contexts: vec![hook.clone(); MAX_HOOKS - 4],
                ..Default::default()
            }));
        }
        let outcome = b.take(a);
        assert_eq!(outcome.hooks.len(), MAX_HOOKS);
        assert!(outcome.results.is_empty(), "hooks alone carry no result");
    }

    #[test]
    fn throw_ends_with_the_error() {
        let mut b = ExecBridge::default();
        let (a, _) = b.open();
        b.on_control(pb::ExecClientControlMessage {
            message: Some(Control::Throw(pb::ExecClientThrow {
                id: a,
                error: "EACCES".into(),
                ..Default::default()
            })),
        });
        assert!(b.is_done(a, false));
        assert_eq!(b.take(a).thrown.as_deref(), Some("EACCES"));
    }
}
