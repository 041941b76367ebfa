//! `task`: delegate to a subagent (Cursor's Task). The call is the exec `subagent_args`; the
//! client starts the child as a run of its own and answers `subagent_result` with the child's
//! final message, which is the call's result.

use serde_json::{json, Value};

use super::args::Args;
use super::call::{
    wrap, Access, ExecArgs, ExecResult, Mode, SubagentOptions, ToolContext, ToolError, ToolPlan,
};
use super::text::cap_head;
use crate::proto::agent::v1 as pb;
use pb::subagent_type::Type as Kind;
use pb::tool_call::Tool;

/// The child's final message as the model reads it, at most.
const MAX_MODEL_BYTES: usize = 50_000;

/// A built-in kind: its name, its proto kind, and whether it only looks.
type BuiltinKind = (&'static str, fn() -> Kind, bool);

const BUILTIN: [BuiltinKind; 4] = [
    ("general", || Kind::Unspecified(Default::default()), false),
    ("explore", || Kind::Explore(Default::default()), true),
    ("shell", || Kind::Shell(Default::default()), false),
    ("debug", || Kind::Debug(Default::default()), false),
];

pub(crate) fn plan(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let o = &ctx.subagents;
    let prompt = a.str_nonblank(&["prompt", "task", "instructions"], "string: the task")?;
    let description = a.str_opt(&["description", "title"])?.unwrap_or_default();
    let asked_kind = a
        .str_opt(&["subagent_type", "type", "agent", "kind"])?
        .filter(|k| !k.trim().is_empty())
        .unwrap_or_else(|| "general".into());
    let custom = o
        .custom
        .iter()
        .find(|c| c.name.eq_ignore_ascii_case(asked_kind.trim()));
    let (name, kind, looks_only) = match (custom, builtin(&asked_kind)) {
        (Some(c), _) => (
            c.name.clone(),
            Kind::Custom(pb::SubagentTypeCustom {
                name: c.name.clone(),
            }),
            false,
        ),
        (None, Some((n, k, r))) => (n.to_string(), k(), r),
        (None, None) => return Err(a.error(unknown_kind(&asked_kind, o))),
    };
    let model_id =
        model_for(o, &name, custom, a.str_opt(&["model"])?.as_deref()).map_err(|e| a.error(e))?;
    let readonly = a.bool_opt(&["readonly", "read_only"])?.unwrap_or(false) || looks_only;
    // A custom subagent defined with `is_background` always runs in the background (Cursor's
    // `is_background: true` frontmatter); otherwise the model decides.
    let background = a
        .bool_opt(&["run_in_background", "background"])?
        .unwrap_or(false)
        || custom.is_some_and(|c| c.is_background);
    let resume = a
        .str_opt(&["resume", "resume_agent_id", "agent_id"])?
        .filter(|r| !r.trim().is_empty());
    let mode = if ctx.mode_kind() == Mode::Plan {
        pb::TaskMode::Plan
    } else {
        pb::TaskMode::Agent
    };
    let args = pb::SubagentArgs {
        tool_call_id: call_id.to_string(),
        subagent_type: name,
        model_id: model_id.clone(),
        prompt: prompt.clone(),
        readonly: readonly || ctx.readonly,
        resume_agent_id: resume.clone(),
        run_in_background: Some(background),
        parent_conversation_id: Some(o.parent_conversation_id.clone()).filter(|c| !c.is_empty()),
        mode: mode as i32,
        environment: pb::SubagentExecutionEnvironment::Local as i32,
        selected_context: o.selected_context.clone(),
        ..Default::default()
    };
    let task = pb::TaskArgs {
        description,
        prompt,
        subagent_type: Some(pb::SubagentType { r#type: Some(kind) }),
        model: Some(model_id),
        resume,
        mode: mode as i32,
        ..Default::default()
    };
    Ok(task_exec(call_id, ExecArgs::SubagentArgs(args), task))
}

/// An exec shown as the task call `task`. Subagents of one turn run side by side (up to
/// `agent.max_parallel_subagents`), so it counts as a read.
fn task_exec(call_id: &str, exec: ExecArgs, task: pb::TaskArgs) -> ToolPlan {
    ToolPlan::Exec {
        exec,
        tool_call: wrap(
            call_id,
            Tool::TaskToolCall(pb::TaskToolCall {
                args: Some(task),
                ..Default::default()
            }),
        ),
        access: Access::Read,
    }
}

/// Waits the await tool allows, in seconds.
pub(crate) const AWAIT_DEFAULT_SECS: i64 = 30;
pub(crate) const AWAIT_MAX_SECS: i64 = 600;

/// `await_subagent`: wait for a background subagent (exec `subagent_await_args`). Shown as the
/// subagent's task call, whose result is what the wait found.
pub(crate) fn plan_await(call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let id = a.str_nonblank(
        &["agent_id", "subagent_id", "id"],
        "string: the id the task tool returned",
    )?;
    let secs = a
        .int_in(&["timeout", "timeout_secs"], 1, AWAIT_MAX_SECS)?
        .unwrap_or(AWAIT_DEFAULT_SECS);
    let args = pb::SubagentAwaitArgs {
        agent_id: id.trim().to_string(),
        timeout_ms: u32::try_from(secs * 1000).unwrap_or(u32::MAX),
    };
    let task = pb::TaskArgs {
        agent_id: Some(args.agent_id.clone()),
        description: format!("Waiting for subagent {}", args.agent_id),
        ..Default::default()
    };
    Ok(task_exec(call_id, ExecArgs::SubagentAwaitArgs(args), task))
}

fn builtin(kind: &str) -> Option<BuiltinKind> {
    let k = super::args::norm(kind);
    let k = match k.as_str() {
        "generalpurpose" | "default" | "agent" => "general",
        "bash" | "terminal" => "shell",
        other => other,
    };
    BUILTIN.iter().copied().find(|(n, _, _)| *n == k)
}

fn unknown_kind(kind: &str, o: &SubagentOptions) -> String {
    let mut names: Vec<&str> = BUILTIN.iter().map(|(n, _, _)| *n).collect();
    names.extend(o.custom.iter().map(|c| c.name.as_str()));
    format!(
        "unknown subagent_type `{kind}`; use one of: {}",
        names.join(", ")
    )
}

/// The child's model: the custom subagent's own, then an override for its kind, then the
/// model asked for when the user selected it for subagents, then the first selected one, then
/// the parent's.
fn model_for(
    o: &SubagentOptions,
    kind: &str,
    custom: Option<&pb::CustomSubagent>,
    asked: Option<&str>,
) -> Result<String, String> {
    use pb::subagent_model_override::Selection;
    if let Some(c) = custom {
        let m = c.model.trim();
        if !m.is_empty() && !m.eq_ignore_ascii_case("inherit") && !c.force_default_model {
            return ours_by_name(o, m)
                .or_else(|| offered(o, m))
                .map(str::to_string)
                .ok_or_else(|| unresolved(kind, m, o));
        }
    }
    for ov in o
        .overrides
        .iter()
        .filter(|ov| ov.subagent_type.eq_ignore_ascii_case(kind))
    {
        match &ov.selection {
            Some(Selection::Model(m)) if !m.model_id.is_empty() => return Ok(m.model_id.clone()),
            Some(Selection::Inherit(true)) => return Ok(o.parent_model_id.clone()),
            Some(Selection::Disabled(true)) => {
                return Err(format!("the `{kind}` subagent is disabled in this client"))
            }
            _ => {}
        }
    }
    let asked = asked
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| ours_by_name(o, a).unwrap_or(a));
    if let Some(a) = asked.filter(|a| o.selected_models.iter().any(|m| m == a)) {
        return Ok(a.to_string());
    }
    Ok(o.selected_models
        .first()
        .cloned()
        .unwrap_or_else(|| o.parent_model_id.clone()))
}

/// One of Cursor's models the client offered for subagents (selected for them, or set as a
/// kind's override): the only models not ours a child of our run may be sent to Cursor on.
fn offered<'a>(o: &'a SubagentOptions, name: &str) -> Option<&'a str> {
    use pb::subagent_model_override::Selection;
    let overrides = o.overrides.iter().filter_map(|ov| match &ov.selection {
        Some(Selection::Model(m)) => Some(m.model_id.as_str()),
        _ => None,
    });
    o.selected_models
        .iter()
        .map(String::as_str)
        .chain(overrides)
        .find(|m| !m.is_empty() && m.eq_ignore_ascii_case(name))
}

/// The tool error for a subagent definition whose model matches none of ours nor one the client
/// offered: the child would carry this conversation's files to Cursor, so it is not started.
fn unresolved(kind: &str, model: &str, o: &SubagentOptions) -> String {
    let mut ours: Vec<&str> = Vec::new();
    for (name, _) in &o.model_names {
        if !ours.contains(&name.as_str()) && ours.len() < 12 {
            ours.push(name);
        }
    }
    format!(
        "the `{kind}` subagent asks for the model `{model}`, which is none of the user's \
         cursor-byok models (by id or name: {}) nor a model Cursor offered for subagents; it was \
         not started, so nothing of this conversation went to Cursor. Use another subagent, or \
         ask the user to set its `model:` to one of those names or to `inherit`",
        ours.join(", ")
    )
}

/// Our model's Cursor id for a name a subagent definition gives it (as `.cursor/agents/*.md`
/// files often do: "My GPT", "gpt"), compared without case; `None` for any other name.
fn ours_by_name<'a>(o: &'a SubagentOptions, name: &str) -> Option<&'a str> {
    o.model_names
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, id)| id.as_str())
}

pub(crate) fn finish(
    mut t: pb::TaskToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::TaskToolCall {
    use pb::subagent_result::Result as S;
    use pb::task_result::Result as T;
    if let Some(r) = results.iter().find_map(|m| match m {
        ExecResult::SubagentAwaitResult(r) => Some(r),
        _ => None,
    }) {
        t.result = Some(pb::TaskResult {
            result: Some(awaited(r)),
        });
        return t;
    }
    let found = results.iter().find_map(|m| match m {
        ExecResult::SubagentResult(r) => r.result.clone(),
        _ => None,
    });
    let result = match found {
        Some(S::Success(s)) => T::Success(pb::TaskSuccess {
            conversation_steps: s
                .final_message
                .filter(|m| !m.is_empty())
                .map(assistant_step)
                .into_iter()
                .collect(),
            agent_id: Some(s.agent_id).filter(|a| !a.is_empty()),
            is_background: s.background_reason != 0,
            background_reason: s.background_reason,
            result_suffix: Some(format!("{} tool calls", s.tool_call_count)),
            transcript_path: s.transcript_path,
            ..Default::default()
        }),
        Some(S::Error(e)) => T::Error(pb::TaskError {
            error: match e.agent_id.filter(|a| !a.is_empty()) {
                Some(id) => format!("subagent {id}: {}", e.error),
                None => e.error,
            },
        }),
        None => T::Error(pb::TaskError {
            error: match thrown {
                Some(e) => format!("the client failed to run the subagent: {e}"),
                None => "the client returned no subagent result".into(),
            },
        }),
    };
    t.result = Some(pb::TaskResult {
        result: Some(result),
    });
    t
}

/// What a wait found, as the subagent's task result.
fn awaited(r: &pb::SubagentAwaitResult) -> pb::task_result::Result {
    use pb::subagent_await_result::Result as A;
    use pb::task_result::Result as T;
    match &r.result {
        Some(A::Complete(c)) => T::Success(pb::TaskSuccess {
            conversation_steps: c
                .final_message
                .clone()
                .filter(|m| !m.is_empty())
                .map(assistant_step)
                .into_iter()
                .collect(),
            agent_id: Some(c.agent_id.clone()),
            result_suffix: Some(format!("{} tool calls", c.tool_call_count)),
            transcript_path: c.transcript_path.clone(),
            ..Default::default()
        }),
        Some(A::StillRunning(s)) => T::Success(pb::TaskSuccess {
            agent_id: Some(s.agent_id.clone()),
            is_background: true,
            transcript_path: s.transcript_path.clone(),
            ..Default::default()
        }),
        Some(A::NotFound(n)) => T::Error(pb::TaskError {
            error: format!("no subagent with id {}", n.agent_id),
        }),
        Some(A::Error(e)) => T::Error(pb::TaskError {
            error: e.error.clone(),
        }),
        None => T::Error(pb::TaskError {
            error: "the client returned no await result".into(),
        }),
    }
}

fn assistant_step(text: String) -> pb::ConversationStep {
    pb::ConversationStep {
        message: Some(pb::conversation_step::Message::AssistantMessage(
            pb::AssistantMessage {
                text,
                ..Default::default()
            },
        )),
    }
}

/// The child's final message (all its assistant text).
fn final_text(s: &pb::TaskSuccess) -> String {
    s.conversation_steps
        .iter()
        .filter_map(|step| match &step.message {
            Some(pb::conversation_step::Message::AssistantMessage(m)) => Some(m.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn render(t: &pb::TaskToolCall) -> (String, bool) {
    use pb::task_result::Result as T;
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(T::Success(s)) => {
            let id = s.agent_id.as_deref().unwrap_or("(no id)");
            let text = final_text(s);
            if s.is_background && text.is_empty() {
                let transcript = s
                    .transcript_path
                    .as_deref()
                    .map(|p| format!(" Its transcript is at {p}."))
                    .unwrap_or_default();
                return (
                    format!("Subagent {id} is running in the background.{transcript} Use await_subagent with this id to wait for its result."),
                    false,
                );
            }
            let suffix = s.result_suffix.as_deref().unwrap_or_default();
            let (body, cut) = cap_head(&text, MAX_MODEL_BYTES);
            let more = if cut { "\n[... message cut]" } else { "" };
            (
                format!("Subagent {id} finished ({suffix}). Its final message:\n\n{body}{more}"),
                false,
            )
        }
        Some(T::Error(e)) => (format!("The subagent failed: {}", e.error), true),
        None => ("The subagent did not complete.".into(), true),
    }
}

/// Our name for a `SubagentType` (a custom subagent's name for custom kinds).
fn kind_name(k: Option<&pb::SubagentType>) -> String {
    match k.and_then(|k| k.r#type.as_ref()) {
        Some(Kind::Custom(c)) => c.name.clone(),
        Some(Kind::Explore(_)) => "explore".into(),
        Some(Kind::Shell(_)) | Some(Kind::Bash(_)) => "shell".into(),
        Some(Kind::Debug(_)) => "debug".into(),
        _ => "general".into(),
    }
}

/// Our tool name and arguments for a task call in the history: a wait has only the id.
pub(crate) fn history(t: &pb::TaskToolCall) -> (String, Value) {
    let a = t.args.clone().unwrap_or_default();
    if a.prompt.is_empty() {
        if let Some(id) = a.agent_id {
            return ("await_subagent".into(), json!({ "agent_id": id }));
        }
    }
    ("task".into(), history_args(a))
}

fn history_args(a: pb::TaskArgs) -> Value {
    json!({
        "description": a.description,
        "prompt": a.prompt,
        "subagent_type": kind_name(a.subagent_type.as_ref()),
    })
}

pub(crate) fn with_error(mut t: pb::TaskToolCall, message: &str) -> pb::TaskToolCall {
    t.result = Some(pb::TaskResult {
        result: Some(pb::task_result::Result::Error(pb::TaskError {
            error: message.to_string(),
        })),
    });
    t
}
