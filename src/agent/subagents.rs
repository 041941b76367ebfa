//! Subagent calls outstanding across runs. A parent run registers each `subagent_args` it sends;
//! the client then starts the child as a run of its own (a new request and conversation, the
//! prompt as its user message, the model in `model_details`), and that run claims the entry by
//! prompt and model, so it runs with the tool set and prompt of its kind. Where the client names
//! the parent ([`ParentLink`]: its run's request id, the call id, each possibly on a different
//! request of the child, or only after the child started), that name decides instead.
//!
//! Bounded: at most [`MAX_PENDING`] entries, each kept [`PENDING_TTL`] at most (the client
//! starts the child at once; an entry nobody claims, e.g. a child on an official model that is
//! relayed, just ages out).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::proto::agent::v1 as pb;

/// Outstanding calls kept at most (the oldest goes first).
pub(crate) const MAX_PENDING: usize = 256;
/// How long an unclaimed call waits for its child run.
pub(crate) const PENDING_TTL: Duration = Duration::from_secs(600);
/// Nesting bound: a run at this depth is not offered the subagent tool.
pub const MAX_DEPTH: u32 = 2;

/// Longest parent id kept from a header (they are only compared).
const MAX_LINK_ID: usize = 512;

/// What a child run's requests say about its parent: `x-parent-request-id` (the parent run's
/// request id) and `x-parent-agent-tool-call-id` (the call). Desktop clients may send them on
/// different requests of the child (its RunSSE, its appends), so they are merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParentLink {
    pub request_id: Option<String>,
    pub tool_call_id: Option<String>,
}

impl ParentLink {
    /// The link the values of the two headers give (blank or oversized ones are no link).
    pub fn new(request_id: Option<&str>, tool_call_id: Option<&str>) -> ParentLink {
        let keep = |v: Option<&str>| {
            v.map(str::trim)
                .filter(|v| !v.is_empty() && v.len() <= MAX_LINK_ID)
                .map(str::to_string)
        };
        ParentLink {
            request_id: keep(request_id),
            tool_call_id: keep(tool_call_id),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.request_id.is_none() && self.tool_call_id.is_none()
    }

    /// Take what `other` says that this link does not; true when it added anything. A value
    /// already known is kept: the first request to name the parent wins.
    pub fn merge(&mut self, other: &ParentLink) -> bool {
        let mut added = false;
        if self.request_id.is_none() && other.request_id.is_some() {
            self.request_id.clone_from(&other.request_id);
            added = true;
        }
        if self.tool_call_id.is_none() && other.tool_call_id.is_some() {
            self.tool_call_id.clone_from(&other.tool_call_id);
            added = true;
        }
        added
    }
}

/// What a child run is: its kind and what it may do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Child {
    /// The parent's Cursor call id.
    pub parent_tool_call_id: String,
    /// `subagent_args.subagent_type`: a built-in kind or a custom subagent's name.
    pub kind: String,
    /// 1 for a child of a top-level run.
    pub depth: u32,
    /// No writes, deletes or shell commands.
    pub readonly: bool,
    /// A custom subagent's `tools` (as it names them); empty allows every tool.
    pub tools: Vec<String>,
    /// A custom subagent's own prompt.
    pub instructions: String,
    /// The child run's conversation: Cursor's client uses it as the subagent's id.
    pub conversation_id: String,
    /// The request id of the parent run that made the call.
    pub(crate) parent_run: String,
    /// The call runs in the background: it may outlive the parent run's end (not its stop).
    pub background: bool,
    /// The parent run ended before this child started: it ends at once.
    pub(crate) orphaned: bool,
}

impl Child {
    /// The child of `args`, sent by a run at `parent_depth`; a custom subagent of that name
    /// brings its tools, prompt and permission mode.
    pub(crate) fn for_call(
        args: &pb::SubagentArgs,
        custom: &[pb::CustomSubagent],
        parent_depth: u32,
    ) -> Child {
        let found = custom
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(&args.subagent_type));
        // READONLY restricts the child; DEFAULT and AGENT_ONLY (whose meaning Cursor does not
        // publish, and which the SDK never sends) run it with its tools.
        let custom_readonly = found.is_some_and(|c| {
            c.permission_mode == pb::CustomSubagentPermissionMode::Readonly as i32
        });
        Child {
            parent_tool_call_id: args.tool_call_id.clone(),
            kind: args.subagent_type.clone(),
            depth: parent_depth.saturating_add(1),
            readonly: args.readonly || custom_readonly,
            tools: found.map(|c| c.tools.clone()).unwrap_or_default(),
            instructions: found
                .map(|c| c.prompt.trim().to_string())
                .unwrap_or_default(),
            conversation_id: String::new(),
            parent_run: String::new(),
            background: args.run_in_background == Some(true),
            orphaned: false,
        }
    }

    /// A run that names its kind (`subagent_type_name`) but matches no call of ours: its
    /// kind's restrictions, one level down.
    pub(crate) fn of_kind(kind: &str) -> Child {
        Child {
            kind: kind.to_string(),
            depth: 1,
            readonly: is_readonly_kind(kind),
            ..Default::default()
        }
    }
}

/// Built-in kinds that only look: Cursor's explore subagent.
pub(crate) fn is_readonly_kind(kind: &str) -> bool {
    kind.eq_ignore_ascii_case("explore")
}

#[derive(Debug)]
struct WaitingCall {
    prompt: String,
    model_id: String,
    /// `resume_agent_id`: the child continues that subagent's conversation.
    resume: Option<String>,
    child: Child,
    at: Instant,
}

/// The calls waiting for their child runs, and the child runs running, shared by every run
/// of the agent.
#[derive(Debug, Clone, Default)]
pub(crate) struct SubagentCalls {
    pending: Arc<Mutex<VecDeque<WaitingCall>>>,
    /// Child runs by their own request id (two runs may share a subagent id: a resumed
    /// subagent, a client that reuses a conversation), with their subagent id to cancel them
    /// by. A run removes itself when it ends, so this holds no more than the runs alive.
    running: Arc<Mutex<HashMap<String, Running>>>,
    /// Runs that started as nobody's child, by request id: a parent named later links them.
    /// A run removes itself when it ends.
    unlinked: Arc<Mutex<HashMap<String, Unlinked>>>,
}

/// A run that started as nobody's child.
#[derive(Debug)]
struct Unlinked {
    /// Its conversation (a child's subagent id), else its request id.
    subagent_id: String,
    cancel: CancellationToken,
}

/// A child run running.
#[derive(Debug)]
struct Running {
    /// Its conversation (what the client cancels it by), else its request id.
    subagent_id: String,
    cancel: CancellationToken,
    /// Its parent run's request id (empty when unknown).
    parent_run: String,
    background: bool,
}

impl SubagentCalls {
    /// A parent sent `args` (for a child described by `child`).
    pub fn register(&self, args: &pb::SubagentArgs, child: Child) {
        let mut p = self.lock();
        prune(&mut p);
        if p.len() >= MAX_PENDING {
            tracing::warn!("too many subagent calls waiting for their runs; forgetting the oldest");
            p.pop_front();
        }
        p.push_back(WaitingCall {
            prompt: args.prompt.trim().to_string(),
            model_id: args.model_id.clone(),
            resume: args.resume_agent_id.clone().filter(|r| !r.is_empty()),
            child,
            at: Instant::now(),
        });
    }

    /// The call a new run (its user message `prompt`, its model `model_id`) is the child of:
    /// the oldest outstanding one with that prompt and model. A run whose conversation already
    /// has turns (`continues` names it) is only the child of a call that resumes that
    /// conversation's subagent; otherwise it is the user's own. Claimed once.
    pub(crate) fn claim(
        &self,
        prompt: &str,
        model_id: &str,
        continues: Option<&str>,
    ) -> Option<Child> {
        let prompt = prompt.trim();
        self.take_first(|e| {
            e.prompt == prompt
                && (e.model_id.is_empty() || model_id.is_empty() || e.model_id == model_id)
                && continues.is_none_or(|c| e.resume.as_deref() == Some(c))
        })
    }

    /// The model an outstanding call of ours asked for, when a new run is its child by what
    /// the client says of the parent (`link`) or by its user message (`prompt`); nothing is
    /// claimed. `None`: no call of ours waits for this run.
    pub(crate) fn expected_model(&self, link: &ParentLink, prompt: Option<&str>) -> Option<String> {
        let prompt = prompt.map(str::trim).filter(|p| !p.is_empty());
        let mut p = self.lock();
        prune(&mut p);
        p.iter()
            .find(|e| {
                link.tool_call_id.as_deref() == Some(e.child.parent_tool_call_id.as_str())
                    || (!e.child.parent_run.is_empty()
                        && link.request_id.as_deref() == Some(e.child.parent_run.as_str()))
                    || prompt == Some(e.prompt.as_str())
            })
            .map(|e| e.model_id.clone())
    }

    /// A child run the client says belongs to the call `parent_tool_call_id`.
    pub(crate) fn claim_call(&self, parent_tool_call_id: &str) -> Option<Child> {
        self.take_first(|e| e.child.parent_tool_call_id == parent_tool_call_id)
    }

    /// The call a new run is the child of, by what the client says of its parent: the call it
    /// names, else the one call of the parent run it names (or the one with its prompt).
    pub(crate) fn claim_linked(&self, link: &ParentLink, prompt: Option<&str>) -> Option<Child> {
        if let Some(call) = &link.tool_call_id {
            if let Some(c) = self.claim_call(call) {
                return Some(c);
            }
        }
        let parent = link.request_id.as_deref()?;
        let of_parent = |e: &WaitingCall| e.child.parent_run == parent;
        let prompt = prompt.map(str::trim);
        if let Some(c) = self.take_first(|e| of_parent(e) && Some(e.prompt.as_str()) == prompt) {
            return Some(c);
        }
        let mut p = self.lock();
        prune(&mut p);
        let mut theirs = p.iter().enumerate().filter(|(_, e)| of_parent(e));
        match (theirs.next(), theirs.next()) {
            (Some((i, _)), None) => p.remove(i).map(|e| e.child),
            _ => None,
        }
    }

    /// A run that started as nobody's child: a parent named later can still link it, under
    /// `subagent_id` (what the run untracks when it ends).
    pub(crate) fn track_unlinked(
        &self,
        request_id: &str,
        subagent_id: &str,
        cancel: CancellationToken,
    ) {
        if request_id.is_empty() || subagent_id.is_empty() {
            return;
        }
        self.unlinked_lock().insert(
            request_id.to_string(),
            Unlinked {
                subagent_id: subagent_id.to_string(),
                cancel,
            },
        );
    }

    pub(crate) fn untrack_unlinked(&self, request_id: &str) {
        self.unlinked_lock().remove(request_id);
    }

    /// The client named the parent of the running run `request_id` only after it started: from
    /// now on that parent's stop (and, for a foreground call, its end) stops it, and the call
    /// it answers is no longer waiting for a child. Its tools stay those it started with.
    /// Returns whether the run was linked.
    pub(crate) fn link_late(
        &self,
        request_id: &str,
        link: &ParentLink,
        prompt: Option<&str>,
    ) -> bool {
        let Some(run) = self.unlinked_lock().remove(request_id) else {
            return false;
        };
        let claimed = self.claim_linked(link, prompt);
        let parent_run = claimed
            .as_ref()
            .map(|c| c.parent_run.clone())
            .or_else(|| link.request_id.clone())
            .unwrap_or_default();
        if parent_run.is_empty() {
            // Only a call id that matches nothing of ours: nothing to link to.
            self.unlinked_lock().insert(request_id.to_string(), run);
            return false;
        }
        tracing::info!(
            request_id,
            parent_run = %parent_run,
            "the client named the run's parent after it started: linked"
        );
        let child = Child {
            conversation_id: run.subagent_id.clone(),
            parent_run,
            ..claimed.unwrap_or_default()
        };
        self.track_child(request_id, &run.subagent_id, Some(&child), run.cancel);
        true
    }

    fn unlinked_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Unlinked>> {
        self.unlinked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The oldest live entry that `matches`, removed.
    fn take_first(&self, matches: impl Fn(&WaitingCall) -> bool) -> Option<Child> {
        let mut p = self.lock();
        prune(&mut p);
        let i = p.iter().position(matches)?;
        p.remove(i).map(|e| e.child)
    }

    /// The call `parent_tool_call_id` has its result: its entry, if unclaimed, is gone.
    pub fn forget(&self, parent_tool_call_id: &str) {
        self.lock()
            .retain(|e| e.child.parent_tool_call_id != parent_tool_call_id);
    }

    /// A child run started: `cancel` stops it. Untracked when it ends.
    #[cfg(test)]
    fn track(&self, run_id: &str, subagent_id: &str, cancel: CancellationToken) {
        self.track_child(run_id, subagent_id, None, cancel);
    }

    /// The child run `run_id` (its request id) started, of the call `child` describes:
    /// `cancel` stops it, as does a cancel of `subagent_id`, its parent's stop (and, unless it
    /// runs in the background, its parent's end). A child whose parent ended before it started
    /// is stopped at once.
    pub(crate) fn track_child(
        &self,
        run_id: &str,
        subagent_id: &str,
        child: Option<&Child>,
        cancel: CancellationToken,
    ) {
        if child.is_some_and(|c| c.orphaned) {
            tracing::info!(
                subagent = subagent_id,
                "the subagent's parent run has ended: stopping it"
            );
            cancel.cancel();
        }
        if run_id.is_empty() || subagent_id.is_empty() {
            return;
        }
        let running = Running {
            subagent_id: subagent_id.to_string(),
            cancel,
            parent_run: child.map(|c| c.parent_run.clone()).unwrap_or_default(),
            background: child.is_some_and(|c| c.background),
        };
        self.running_lock().insert(run_id.to_string(), running);
    }

    /// The run `parent_run` ended; `stopped`: the user stopped it (or its client went away).
    /// The client never delivers a subagent's own Stop, so its children end here: all of them
    /// when it was stopped, else those in the foreground (nobody waits for their result any
    /// more); calls whose child has not started yet leave an orphan that ends as it starts.
    /// Returns how many running children were stopped.
    pub(crate) fn parent_ended(&self, parent_run: &str, stopped: bool) -> usize {
        if parent_run.is_empty() {
            return 0;
        }
        let ends =
            |parent: &str, background: bool| parent == parent_run && (stopped || !background);
        for e in self.lock().iter_mut() {
            if ends(&e.child.parent_run, e.child.background) {
                e.child.orphaned = true;
            }
        }
        let mut n = 0;
        for r in self.running_lock().values() {
            if ends(&r.parent_run, r.background) && !r.cancel.is_cancelled() {
                r.cancel.cancel();
                n += 1;
            }
        }
        if n > 0 {
            tracing::info!(children = n, "the parent run ended: its subagents stop too");
        }
        n
    }

    /// The run `run_id` ended.
    pub(crate) fn untrack(&self, run_id: &str) {
        self.running_lock().remove(run_id);
    }

    /// Cancel the child runs of `subagent_id`; false when no such run of ours is running.
    pub fn cancel(&self, subagent_id: &str) -> bool {
        let mut any = false;
        for r in self.running_lock().values() {
            if r.subagent_id == subagent_id {
                r.cancel.cancel();
                any = true;
            }
        }
        any
    }

    fn running_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Entries outstanding.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let mut p = self.lock();
        prune(&mut p);
        p.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<WaitingCall>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Entries are in arrival order: the expired ones are at the front.
fn prune(p: &mut VecDeque<WaitingCall>) {
    while p.front().is_some_and(|e| e.at.elapsed() >= PENDING_TTL) {
        p.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(call: &str, prompt: &str, model: &str) -> pb::SubagentArgs {
        pb::SubagentArgs {
            tool_call_id: call.into(),
            subagent_type: "explore".into(),
            model_id: model.into(),
            prompt: prompt.into(),
            readonly: true,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_claims_its_call_once_by_prompt_and_model() {
        let r = SubagentCalls::default();
        let a = args("t1", "Find the config loader", "byok-m");
        r.register(&a, Child::for_call(&a, &[], 0));
        assert_eq!(r.claim("Find the config loader", "other-model", None), None);
        let child = r
            .claim(" Find the config loader\n", "byok-m", None)
            .unwrap();
        assert_eq!((child.depth, child.readonly), (1, true));
        assert_eq!(child.parent_tool_call_id, "t1");
        assert_eq!(r.claim("Find the config loader", "byok-m", None), None);
    }

    /// A run in a conversation with turns is a child only of a call resuming that
    /// conversation's subagent; a client that names the call is believed whatever the prompt.
    #[tokio::test(start_paused = true)]
    async fn a_resumed_child_continues_its_own_conversation_and_a_named_call_is_claimed() {
        let r = SubagentCalls::default();
        let mut a = args("t1", "Go on with the survey", "byok-m");
        a.resume_agent_id = Some("ag-1".into());
        r.register(&a, Child::for_call(&a, &[], 0));
        assert_eq!(
            r.claim("Go on with the survey", "byok-m", Some("conv-user")),
            None
        );
        let child = r.claim("Go on with the survey", "byok-m", Some("ag-1"));
        assert_eq!(child.map(|c| c.parent_tool_call_id).as_deref(), Some("t1"));
        let b = args("t2", "Survey the tests", "byok-m");
        r.register(&b, Child::for_call(&b, &[], 0));
        assert_eq!(
            r.claim("Survey the tests", "byok-m", Some("conv-user")),
            None
        );
        assert_eq!(r.claim_call("t9"), None);
        assert_eq!(
            r.claim_call("t2").map(|c| c.kind).as_deref(),
            Some("explore")
        );
        assert_eq!(
            r.claim("Survey the tests", "byok-m", None),
            None,
            "claimed once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unclaimed_calls_age_out_and_stay_bounded_over_hours() {
        let r = SubagentCalls::default();
        for i in 0..(3 * 3600 / 10) {
            let a = args(&format!("t{i}"), &format!("task {i}"), "m");
            r.register(&a, Child::for_call(&a, &[], 0));
            assert!(r.len() <= MAX_PENDING);
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        // Ten minutes at one call per 10 s (the newest 10 s old): 59 wait, the rest aged out.
        assert_eq!(r.len(), 59);
        assert_eq!(r.claim("task 0", "m", None), None);
        tokio::time::advance(PENDING_TTL).await;
        assert!(r.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_past_the_bound_forgets_the_oldest() {
        let r = SubagentCalls::default();
        for i in 0..MAX_PENDING + 5 {
            let a = args(&format!("t{i}"), &format!("task {i}"), "m");
            r.register(&a, Child::for_call(&a, &[], 0));
        }
        assert_eq!(r.len(), MAX_PENDING);
        assert_eq!(r.claim("task 0", "m", None), None);
        assert!(r
            .claim(&format!("task {}", MAX_PENDING + 4), "m", None)
            .is_some());
        r.forget("t10");
        assert_eq!(r.claim("task 10", "m", None), None);
    }

    #[test]
    fn a_tracked_child_can_be_canceled_until_it_ends() {
        let r = SubagentCalls::default();
        let token = CancellationToken::new();
        r.track("req-child", "conv-child", token.clone());
        assert!(!r.cancel("other"));
        assert!(r.cancel("conv-child") && token.is_cancelled());
        r.untrack("req-child");
        assert!(!r.cancel("conv-child"));
    }

    /// Two child runs of one subagent id (a resumed subagent) are two entries: the first to
    /// end does not take the other's with it, and a cancel reaches both.
    #[test]
    fn child_runs_are_kept_by_their_own_id() {
        let r = SubagentCalls::default();
        let (first, second) = (CancellationToken::new(), CancellationToken::new());
        r.track("req-1", "conv-child", first.clone());
        r.track("req-2", "conv-child", second.clone());
        r.untrack("req-1");
        assert!(r.cancel("conv-child"), "the second is still tracked");
        assert!(second.is_cancelled() && !first.is_cancelled());
        let (a, b) = (CancellationToken::new(), CancellationToken::new());
        r.track("req-a", "conv-x", a.clone());
        r.track("req-b", "conv-x", b.clone());
        assert!(r.cancel("conv-x") && a.is_cancelled() && b.is_cancelled());
    }

    fn call_of(
        parent_run: &str,
        call: &str,
        prompt: &str,
        background: bool,
    ) -> (pb::SubagentArgs, Child) {
        let mut a = args(call, prompt, "m");
        a.run_in_background = Some(background);
        let mut child = Child::for_call(&a, &[], 0);
        child.parent_run = parent_run.into();
        (a, child)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_parent_stops_all_its_children_an_ended_one_its_foreground_ones() {
        let r = SubagentCalls::default();
        let mut tokens = Vec::new();
        for (parent, call, bg) in [("p1", "f", false), ("p1", "b", true), ("p2", "o", false)] {
            let (a, child) = call_of(parent, call, call, bg);
            r.register(&a, child);
            let claimed = r.claim(call, "m", None).expect("claimed");
            let token = CancellationToken::new();
            let (run, conversation) = (format!("req-{call}"), format!("conv-{call}"));
            r.track_child(&run, &conversation, Some(&claimed), token.clone());
            tokens.push(token);
        }
        // p1 ended normally: its foreground child stops, its background child goes on.
        assert_eq!(r.parent_ended("p1", false), 1);
        assert!(tokens[0].is_cancelled());
        assert!(!tokens[1].is_cancelled());
        assert!(!tokens[2].is_cancelled(), "another parent's child");
        // p1 stopped: its background child stops too.
        assert_eq!(r.parent_ended("p1", true), 1);
        assert!(tokens[1].is_cancelled());
        assert!(!tokens[2].is_cancelled());
        assert_eq!(r.parent_ended("", true), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_whose_parent_ended_before_it_started_ends_at_once() {
        let r = SubagentCalls::default();
        let (a, child) = call_of("p1", "late", "Look late", false);
        r.register(&a, child);
        let (b, child) = call_of("p1", "bg", "Look in the background", true);
        r.register(&b, child);
        r.parent_ended("p1", false);
        let late = r.claim("Look late", "m", None).expect("still its call");
        assert!(late.orphaned);
        let token = CancellationToken::new();
        r.track_child("req-late", "conv-late", Some(&late), token.clone());
        assert!(token.is_cancelled(), "ends as it starts");
        let bg = r
            .claim("Look in the background", "m", None)
            .expect("claimed");
        assert!(
            !bg.orphaned,
            "a background call may outlive its parent's end"
        );
    }

    #[test]
    fn a_custom_subagent_brings_its_tools_prompt_and_permission() {
        let custom = pb::CustomSubagent {
            name: "reviewer".into(),
            tools: vec!["Read".into(), "Grep".into()],
            prompt: "Review carefully.".into(),
            permission_mode: pb::CustomSubagentPermissionMode::Readonly as i32,
            ..Default::default()
        };
        let mut a = args("t1", "p", "m");
        a.subagent_type = "Reviewer".into();
        a.readonly = false;
        let c = Child::for_call(&a, &[custom], 1);
        assert_eq!(c.depth, 2);
        assert!(c.readonly);
        assert_eq!(c.tools, vec!["Read", "Grep"]);
        assert_eq!(c.instructions, "Review carefully.");
    }

    fn link(parent: Option<&str>, call: Option<&str>) -> ParentLink {
        ParentLink::new(parent, call)
    }

    fn register_of(r: &SubagentCalls, parent_run: &str, call: &str, prompt: &str) {
        let a = args(call, prompt, "byok-m");
        let mut child = Child::for_call(&a, &[], 0);
        child.parent_run = parent_run.into();
        r.register(&a, child);
    }

    /// What a call of ours expects of its child is read without claiming it: by the call,
    /// the parent run, or the prompt.
    #[tokio::test(start_paused = true)]
    async fn the_expected_model_is_read_without_a_claim() {
        let r = SubagentCalls::default();
        register_of(&r, "req-a", "t1", "Find the loader");
        assert_eq!(r.expected_model(&link(None, None), Some("other")), None);
        for l in [link(None, Some("t1")), link(Some("req-a"), None)] {
            assert_eq!(r.expected_model(&l, None).as_deref(), Some("byok-m"));
        }
        let by_prompt = r.expected_model(&link(None, None), Some(" Find the loader "));
        assert_eq!(by_prompt.as_deref(), Some("byok-m"));
        assert!(r.claim_call("t1").is_some(), "still there to claim");
    }

    #[tokio::test(start_paused = true)]
    async fn a_named_parent_run_decides_between_its_calls_by_prompt_or_alone() {
        let r = SubagentCalls::default();
        register_of(&r, "req-a", "t1", "Find the loader");
        register_of(&r, "req-a", "t2", "Find the parser");
        register_of(&r, "req-b", "t3", "Find the loader");
        // The parent run alone, two calls: the prompt picks one, none matching picks none.
        assert_eq!(
            r.claim_linked(&link(Some("req-a"), None), Some("other")),
            None
        );
        let c = r.claim_linked(&link(Some("req-a"), None), Some("Find the loader"));
        assert_eq!(c.map(|c| c.parent_tool_call_id).as_deref(), Some("t1"));
        // One call left for that parent: it is the one, whatever the prompt says.
        let c = r.claim_linked(&link(Some("req-a"), None), Some("reworded"));
        assert_eq!(c.map(|c| c.parent_tool_call_id).as_deref(), Some("t2"));
        // The call id wins over the parent run.
        let c = r.claim_linked(&link(Some("req-a"), Some("t3")), None);
        assert_eq!(c.map(|c| c.parent_tool_call_id).as_deref(), Some("t3"));
        assert!(r.is_empty());
        assert_eq!(r.claim_linked(&ParentLink::default(), Some("x")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_parent_named_after_the_child_started_stops_it_with_the_parent() {
        let r = SubagentCalls::default();
        register_of(&r, "req-p", "t1", "Find it");
        let cancel = CancellationToken::new();
        r.track_unlinked("req-c", "conv-c", cancel.clone());
        assert!(!r.link_late("req-c", &link(None, Some("nobody's")), None));
        assert!(r.link_late("req-c", &link(None, Some("t1")), None));
        assert!(r.is_empty(), "the call has its child");
        assert!(
            !r.link_late("req-c", &link(None, Some("t1")), None),
            "linked once"
        );
        assert_eq!(r.parent_ended("req-p", true), 1);
        assert!(cancel.is_cancelled());
    }
}
