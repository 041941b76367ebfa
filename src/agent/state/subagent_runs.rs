//! The checkpoint's record of subagents, as Cursor's server keeps it:
//! `subagent_runs_by_parent_tool_call_id` (each task call's run: its subagent, status, title)
//! and `subagent_states` (each subagent by id: kind, model, when used). A later turn reads the
//! runs still in the background so the model can wait for them.

use crate::proto::agent::v1 as pb;
use pb::task_result::Result as T;
use pb::SubagentRunStatus as Status;

/// Subagent runs kept in a checkpoint at most (the oldest finished ones go first).
pub(crate) const MAX_RECORDED: usize = 256;

/// Record the turn's finished task calls (a wait updates the run it waited for).
pub fn record_subagents<'a>(
    state: &mut pb::ConversationStateStructure,
    calls: impl Iterator<Item = &'a pb::ToolCall>,
    now_ms: u64,
) {
    for tc in calls {
        let Some(pb::tool_call::Tool::TaskToolCall(t)) = &tc.tool else {
            continue;
        };
        let args = t.args.clone().unwrap_or_default();
        let (status, agent_id, transcript) = match t.result.as_ref().and_then(|r| r.result.as_ref())
        {
            Some(T::Success(s)) if s.is_background => (
                Status::Backgrounded,
                s.agent_id.clone(),
                s.transcript_path.clone(),
            ),
            Some(T::Success(s)) => (
                Status::Success,
                s.agent_id.clone(),
                s.transcript_path.clone(),
            ),
            Some(T::Error(_)) => (Status::Error, args.agent_id.clone(), None),
            None => continue,
        };
        let done = (status != Status::Backgrounded).then_some(now_ms);
        if args.prompt.is_empty() {
            // A wait: it finds the run by its subagent.
            if let Some(run) = state
                .subagent_runs_by_parent_tool_call_id
                .values_mut()
                .find(|r| r.subagent_id.is_some() && r.subagent_id == args.agent_id)
            {
                if status != Status::Error || run.status == Status::Backgrounded as i32 {
                    run.status = status as i32;
                    run.completed_timestamp_ms = done;
                }
            }
        } else if let Some(call) = tc.tool_call_id.clone() {
            state.subagent_runs_by_parent_tool_call_id.insert(
                call.clone(),
                pb::SubagentRunState {
                    parent_tool_call_id: call,
                    subagent_id: agent_id.clone(),
                    environment: pb::SubagentExecutionEnvironment::Local as i32,
                    status: status as i32,
                    title: Some(args.description.clone()).filter(|d| !d.is_empty()),
                    transcript_path: transcript,
                    completed_timestamp_ms: done,
                    ..Default::default()
                },
            );
        }
        if let Some(id) = agent_id.filter(|a| !a.is_empty()) {
            let entry =
                state
                    .subagent_states
                    .entry(id)
                    .or_insert_with(|| pb::SubagentPersistedState {
                        created_timestamp_ms: now_ms,
                        subagent_type: args.subagent_type.clone(),
                        model_id: args.model.clone(),
                        environment: pb::SubagentExecutionEnvironment::Local as i32,
                        ..Default::default()
                    });
            entry.last_used_timestamp_ms = now_ms;
        }
    }
    bound(state);
}

/// Record what the client reported about background subagents: a finished one is no longer
/// listed as running. Found by its task call id, else by its subagent id.
pub fn record_completions(
    state: &mut pb::ConversationStateStructure,
    completions: &[pb::BackgroundTaskCompletion],
    now_ms: u64,
) {
    use pb::BackgroundTaskStatus as Done;
    for c in completions {
        if c.kind != pb::BackgroundTaskKind::Subagent as i32 {
            continue;
        }
        let status = match Done::try_from(c.status) {
            Ok(Done::Success) => Status::Success,
            Ok(Done::Error) => Status::Error,
            Ok(Done::Aborted) => Status::Aborted,
            // Finished, but not how: it is at least no longer running.
            Ok(Done::Unspecified) | Err(_) => Status::Success,
        };
        let id = c
            .subagent_id
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| c.task_id.clone());
        let runs = &mut state.subagent_runs_by_parent_tool_call_id;
        let key = c
            .tool_call_id
            .clone()
            .filter(|k| runs.contains_key(k))
            .or_else(|| {
                runs.iter()
                    .find(|(_, r)| !id.is_empty() && r.subagent_id.as_deref() == Some(&id))
                    .map(|(k, _)| k.clone())
            });
        if let Some(run) = key.and_then(|k| runs.get_mut(&k)) {
            run.status = status as i32;
            run.completed_timestamp_ms = Some(c.completed_at_ms.unwrap_or(now_ms));
        }
    }
}

/// Subagents the checkpoint says are still in the background: (id, title).
pub fn background_subagents(state: &pb::ConversationStateStructure) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = state
        .subagent_runs_by_parent_tool_call_id
        .values()
        .filter(|r| r.status == Status::Backgrounded as i32 || r.status == Status::Running as i32)
        .filter_map(|r| Some((r.subagent_id.clone()?, r.title.clone().unwrap_or_default())))
        .collect();
    out.sort();
    out
}

/// Keep the record bounded: drop the oldest finished runs (and their subagents' states).
fn bound(state: &mut pb::ConversationStateStructure) {
    let runs = &mut state.subagent_runs_by_parent_tool_call_id;
    while runs.len() > MAX_RECORDED {
        let oldest = runs
            .iter()
            .filter_map(|(k, r)| r.completed_timestamp_ms.map(|t| (t, k.clone())))
            .min();
        let Some((_, key)) = oldest else { break };
        if let Some(run) = runs.remove(&key) {
            if let Some(id) = run.subagent_id {
                state.subagent_states.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(call: &str, prompt: &str, agent: &str, background: bool) -> pb::ToolCall {
        pb::ToolCall {
            tool_call_id: Some(call.into()),
            tool: Some(pb::tool_call::Tool::TaskToolCall(pb::TaskToolCall {
                args: Some(pb::TaskArgs {
                    prompt: prompt.into(),
                    description: "survey".into(),
                    agent_id: prompt.is_empty().then(|| agent.to_string()),
                    model: Some("byok-m".into()),
                    ..Default::default()
                }),
                result: Some(pb::TaskResult {
                    result: Some(T::Success(pb::TaskSuccess {
                        agent_id: Some(agent.into()),
                        is_background: background,
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn a_background_run_is_recorded_found_by_a_later_turn_and_closed_by_a_wait() {
        let mut state = pb::ConversationStateStructure::default();
        record_subagents(&mut state, [task("c1", "Survey", "ag-1", true)].iter(), 10);
        let run = &state.subagent_runs_by_parent_tool_call_id["c1"];
        assert_eq!(run.status, Status::Backgrounded as i32);
        assert_eq!(run.subagent_id.as_deref(), Some("ag-1"));
        assert_eq!(
            state.subagent_states["ag-1"].model_id.as_deref(),
            Some("byok-m")
        );
        assert_eq!(
            background_subagents(&state),
            vec![("ag-1".to_string(), "survey".to_string())]
        );
        record_subagents(&mut state, [task("w1", "", "ag-1", false)].iter(), 20);
        let run = &state.subagent_runs_by_parent_tool_call_id["c1"];
        assert_eq!(run.status, Status::Success as i32);
        assert_eq!(run.completed_timestamp_ms, Some(20));
        assert!(background_subagents(&state).is_empty());
        assert_eq!(state.subagent_states["ag-1"].last_used_timestamp_ms, 20);
        assert_eq!(state.subagent_states["ag-1"].created_timestamp_ms, 10);
    }

    #[test]
    fn the_record_stays_bounded() {
        let mut state = pb::ConversationStateStructure::default();
        for i in 0..MAX_RECORDED + 10 {
            let calls = [task(&format!("c{i}"), "p", &format!("ag-{i}"), false)];
            record_subagents(&mut state, calls.iter(), i as u64);
        }
        assert_eq!(
            state.subagent_runs_by_parent_tool_call_id.len(),
            MAX_RECORDED
        );
        assert!(!state
            .subagent_runs_by_parent_tool_call_id
            .contains_key("c0"));
        assert!(!state.subagent_states.contains_key("ag-0"));
    }

    #[test]
    fn a_completion_closes_the_background_run_it_names() {
        let mut state = pb::ConversationStateStructure::default();
        record_subagents(
            &mut state,
            [
                task("c1", "Survey", "ag-1", true),
                task("c2", "Build", "ag-2", true),
            ]
            .iter(),
            10,
        );
        let done = |id: &str, call: Option<&str>, status: pb::BackgroundTaskStatus| {
            pb::BackgroundTaskCompletion {
                task_id: id.into(),
                kind: pb::BackgroundTaskKind::Subagent as i32,
                status: status as i32,
                tool_call_id: call.map(str::to_string),
                ..Default::default()
            }
        };
        // By subagent id, and by tool call id; a shell completion touches nothing.
        let shell = pb::BackgroundTaskCompletion {
            task_id: "ag-2".into(),
            kind: pb::BackgroundTaskKind::Shell as i32,
            ..Default::default()
        };
        record_completions(
            &mut state,
            &[done("ag-1", None, pb::BackgroundTaskStatus::Success), shell],
            20,
        );
        assert_eq!(
            background_subagents(&state),
            vec![("ag-2".into(), "survey".into())]
        );
        let run = &state.subagent_runs_by_parent_tool_call_id["c1"];
        assert_eq!(run.status, Status::Success as i32);
        assert_eq!(run.completed_timestamp_ms, Some(20));
        record_completions(
            &mut state,
            &[done("other", Some("c2"), pb::BackgroundTaskStatus::Aborted)],
            30,
        );
        assert!(background_subagents(&state).is_empty());
        assert_eq!(
            state.subagent_runs_by_parent_tool_call_id["c2"].status,
            Status::Aborted as i32
        );
    }
}
