//! Background work on a running run: the user's "move to background" (`background_shell_action`,
//! answered with `force_background_shell_args`; the running shell call then ends through its
//! `backgrounded` event), and completions of background tasks
//! (`background_task_completion_action`), told to the model as a note: mid-turn at the next
//! model call (as steering is), else recorded in the turn so later turns see it. A completion
//! that starts a run is that run's turn (see `action::begin`).

use std::collections::HashSet;

use tracing::{debug, warn};

use super::exec::ExecBridge;
use crate::agent::messages as msg;
use crate::proto::agent::v1 as pb;
use pb::exec_client_message::Message as R;

/// Completions one run keeps for the checkpoint (a client could send any number).
const MAX_COMPLETIONS: usize = 256;

/// The note the model reads for `a`: one line per completion, then the reminder, if any.
pub(super) fn completion_note(a: &pb::BackgroundTaskCompletionAction) -> String {
    let mut lines: Vec<String> = a.completions.iter().map(completion_line).collect();
    if lines.is_empty() {
        lines.push("A background task reported completion without details.".into());
    }
    if let Some(r) = a
        .system_reminder
        .as_deref()
        .filter(|r| !r.trim().is_empty())
    {
        lines.push(format!(
            "<system_reminder>\n{}\n</system_reminder>",
            r.trim()
        ));
    }
    format!(
        "<background_task_completion>\n{}\n</background_task_completion>",
        lines.join("\n")
    )
}

fn completion_line(c: &pb::BackgroundTaskCompletion) -> String {
    use pb::BackgroundTaskCompletionReason as Why;
    use pb::BackgroundTaskKind as Kind;
    use pb::BackgroundTaskStatus as Status;
    let who = match Kind::try_from(c.kind).unwrap_or(Kind::Unspecified) {
        Kind::Shell => format!("Background shell {}", c.task_id),
        Kind::Subagent => format!(
            "Background subagent {}",
            c.subagent_id.as_deref().unwrap_or(&c.task_id)
        ),
        Kind::Unspecified => format!("Background task {}", c.task_id),
    };
    let status = match Status::try_from(c.status).unwrap_or(Status::Unspecified) {
        Status::Success => "finished successfully",
        Status::Error => "failed",
        Status::Aborted => "was stopped",
        Status::Unspecified => "ended",
    };
    let what = match Why::try_from(c.reason).unwrap_or(Why::Unspecified) {
        Why::Unspecified | Why::TaskFinished => status.to_string(),
        Why::TaskProgress => "reported progress (it is still running)".into(),
        Why::WorkerReparented => "was handed over to another parent".into(),
        Why::WorkerMessage => "sent a message".into(),
        Why::WorkerNeedsAttention => "needs attention".into(),
    };
    let mut line = format!("{who} {what}");
    if !c.title.trim().is_empty() {
        line.push_str(&format!(" ({})", c.title.trim()));
    }
    line.push('.');
    if let Some(id) = c.tool_call_id.as_deref().filter(|s| !s.is_empty()) {
        line.push_str(&format!(" Started by tool call {id}."));
    }
    if let Some(d) = c.detail.as_deref().filter(|s| !s.trim().is_empty()) {
        line.push_str(&format!(" {}", d.trim()));
    }
    if let Some(p) = c.output_path.as_deref().filter(|s| !s.is_empty()) {
        line.push_str(&format!(" Output: {p} (read it with read_file)."));
    }
    if let Some(t) = c.thread_id.as_deref().filter(|s| !s.is_empty()) {
        line.push_str(&format!(" Thread: {t}."));
    }
    if c.notification_context
        == pb::BackgroundTaskNotificationContext::UserDrivenInteractiveChild as i32
    {
        line.push_str(" (The user drives this task interactively.)");
    }
    if c.record_only {
        line.push_str(" (For the record; nothing needs doing about it.)");
    }
    line
}

/// Background work the run tracks: force-background requests nobody waits for, and the
/// completions the client reported (for the checkpoint).
#[derive(Default)]
pub(super) struct Background {
    /// Execs nobody waits for (force-background requests): settled as they answer.
    detached: HashSet<u32>,
    /// Background tasks the client reported finished during this run (bounded): the
    /// checkpoint's subagent runs are updated from them.
    completions: Vec<pb::BackgroundTaskCompletion>,
}

impl Background {
    /// The user asked to move the running command of `tool_call_id` to the background: the
    /// message that asks the client (`running` says whether a command of ours streams for it).
    /// The command's own exec then ends with `backgrounded`, finishing its tool call.
    pub(super) fn force(
        &mut self,
        exec: &mut ExecBridge,
        tool_call_id: String,
        running: bool,
    ) -> pb::AgentServerMessage {
        if !running {
            warn!(
                tool_call_id = %tool_call_id,
                "move to background for a call with no running command of ours; asking the client anyway"
            );
        }
        let (id, exec_id) = exec.open();
        self.detached.insert(id);
        let args = pb::exec_server_message::Message::ForceBackgroundShellArgs(
            pb::ForceBackgroundShellArgs { tool_call_id },
        );
        msg::exec(id, exec_id, args)
    }

    /// An exec nobody waits for (a force-background request) has answered or closed: log what
    /// it said and stop tracking it.
    pub(super) fn settle(&mut self, exec: &mut ExecBridge, id: u32) {
        if !self.detached.contains(&id) || !exec.is_done(id, true) {
            return;
        }
        self.detached.remove(&id);
        let outcome = exec.take(id);
        for r in &outcome.results {
            if let R::ForceBackgroundShellResult(f) = r {
                if f.status == pb::ForceBackgroundShellStatus::NotFound as i32 {
                    warn!("the client has no running command to move to the background");
                } else {
                    debug!("the client moved the command to the background");
                }
            }
        }
        if let Some(e) = outcome.thrown {
            warn!("the client could not move the command to the background: {e}");
        }
    }

    /// Keep the completions for the checkpoint's record of subagent runs.
    pub(super) fn remember(&mut self, a: &pb::BackgroundTaskCompletionAction) {
        let room = MAX_COMPLETIONS.saturating_sub(self.completions.len());
        self.completions
            .extend(a.completions.iter().take(room).cloned());
    }

    pub(super) fn completions(&self) -> &[pb::BackgroundTaskCompletion] {
        &self.completions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_completion_kind_reads_as_a_clear_note() {
        use pb::{BackgroundTaskCompletionReason as Why, BackgroundTaskKind as Kind};
        let shell = pb::BackgroundTaskCompletion {
            task_id: "1000".into(),
            kind: Kind::Shell as i32,
            status: pb::BackgroundTaskStatus::Success as i32,
            title: "sleep 2; echo BG_DONE".into(),
            detail: Some("exit code 0".into()),
            output_path: Some("/t/1000.txt".into()),
            tool_call_id: Some("call_bg#s1".into()),
            ..Default::default()
        };
        let sub = pb::BackgroundTaskCompletion {
            task_id: "t2".into(),
            subagent_id: Some("agent-9".into()),
            kind: Kind::Subagent as i32,
            status: pb::BackgroundTaskStatus::Error as i32,
            detail: Some("ran out of tools".into()),
            ..Default::default()
        };
        let odd = pb::BackgroundTaskCompletion {
            task_id: "x".into(),
            reason: Why::WorkerNeedsAttention as i32,
            record_only: true,
            ..Default::default()
        };
        let note = completion_note(&pb::BackgroundTaskCompletionAction {
            completions: vec![shell, sub, odd],
            system_reminder: Some("Check the logs.".into()),
        });
        for part in [
            "<background_task_completion>",
            "Background shell 1000 finished successfully (sleep 2; echo BG_DONE). Started by tool call call_bg#s1. exit code 0 Output: /t/1000.txt (read it with read_file).",
            "Background subagent agent-9 failed. ran out of tools",
            "Background task x needs attention. (For the record; nothing needs doing about it.)",
            "<system_reminder>\nCheck the logs.\n</system_reminder>",
        ] {
            assert!(note.contains(part), "{part}\n{note}");
        }
        let empty = completion_note(&pb::BackgroundTaskCompletionAction::default());
        assert!(empty.contains("without details"), "{empty}");
    }
}
