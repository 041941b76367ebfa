//! Cursor's tool catalogue for models. Pure: no IO, no async, no clock.
//!
//! The run offers [`catalog`] to the model, turns each model tool call into a [`ToolPlan`] with
//! [`plan`], carries the plan out with the client (execs, an interaction, or locally), and turns
//! what came back into a [`ToolOutcome`]: text for the model plus the typed `agent.v1.ToolCall`
//! Cursor renders and keeps in the checkpoint.
//!
//! ```text
//! plan ─► Exec / ExecEach ─► client results ─► finish_exec ─────────────┐
//!      ─► Edit ─► read_exec ─► apply_edit ─► write exec ─► finish_edit ─┤
//!      ─► Todos ─► apply_todos ─────────────────────────────────────────┼─► ToolOutcome
//!      ─► Interaction ─► interaction_response ─► finish_interaction ────┘
//! ```
//!
//! The text a model sees is always derived from the finished `ToolCall` alone, so a turn
//! rebuilt from the checkpoint ([`history_from_tool_call`]) gives the model the same text.
//!
//! The files use each other one way: `call` (the shared types) and the helpers (`args`,
//! `text`, `diff`, `catalog`) sit below the tool files, `render` picks a tool file's renderer
//! by kind, and this file dispatches on top.

mod args;
mod call;
mod catalog;
mod diff;
mod edit;
mod fs;
mod interaction;
mod lints;
mod mcp;
mod render;
mod search;
mod shell;
mod stdin;
mod task;
mod text;
mod todos;
mod web;

#[cfg(test)]
mod tests;

use serde_json::Value;

use crate::proto::agent::v1 as pb;
use crate::provider::ToolSpec;
use args::Args;
use call::{wrap, ExecArgs, ExecResult, Mode};
use catalog::Builtin;
use pb::tool_call::Tool;
use render::outcome;

pub use call::{Access, EditSpec, SubagentOptions, ToolContext, ToolError, ToolOutcome, ToolPlan};
pub(crate) use edit::EditWrite;
pub(crate) use mcp::merge_definitions as merge_mcp_tools;
pub(crate) use mcp::to_json as value_to_json;
pub(crate) use render::{error_outcome, history_from_tool_call};
pub(crate) use shell::is_assignment;
pub(crate) use shell::{command_words, result_is_final, shell_delta};

/// The tool list to offer the model. Ask mode gets read-only tools only; Plan mode adds
/// `create_plan` and also leaves out tools that change the workspace.
pub fn catalog(ctx: &ToolContext) -> Vec<ToolSpec> {
    let mut specs: Vec<ToolSpec> = catalog::ALL
        .iter()
        .filter(|b| b.unavailable(ctx).is_none())
        .map(|b| b.spec())
        .collect();
    specs.extend(mcp::specs(ctx));
    specs
}

/// The names [`catalog`] offers, in order.
fn catalog_names(ctx: &ToolContext) -> Vec<String> {
    catalog(ctx).into_iter().map(|s| s.name).collect()
}

enum ToolRef<'a> {
    Builtin(Builtin),
    Mcp(String, &'a pb::McpToolDefinition),
}

/// Which tool a model's tool name means: our MCP names exactly, then built-in names and their
/// aliases, then looser MCP spellings.
fn resolve<'a>(ctx: &'a ToolContext, name: &str) -> Option<ToolRef<'a>> {
    let name = name.trim();
    // Some models prefix tool names with their namespace.
    let name = ["functions.", "default_api.", "default_api:", "tools."]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    let named = mcp::named(&ctx.mcp_tools);
    if let Some((n, def)) = named.iter().find(|(n, _)| n == name) {
        return Some(ToolRef::Mcp(n.clone(), def));
    }
    if let Some(b) = Builtin::from_alias(name) {
        return Some(ToolRef::Builtin(b));
    }
    mcp::find_loose(&named, name).map(|(n, def)| ToolRef::Mcp(n, def))
}

/// Plan one model tool call. An unknown tool or invalid arguments give a [`ToolError`] whose
/// text tells the model what to fix.
pub fn plan(
    ctx: &ToolContext,
    call_id: &str,
    name: &str,
    args: &Value,
) -> Result<ToolPlan, ToolError> {
    let Some(target) = resolve(ctx, name) else {
        return Err(ToolError::UnknownTool {
            name: name.to_string(),
            available: catalog_names(ctx),
        });
    };
    match target {
        ToolRef::Builtin(b) => {
            if let Some(reason) = b.unavailable(ctx) {
                return Err(ToolError::NotAvailable {
                    tool: b.name().to_string(),
                    reason,
                });
            }
            let a = Args::parse(b.name(), args)?;
            match b {
                Builtin::ReadFile => fs::plan_read(ctx, call_id, &a),
                Builtin::Write => edit::plan_write(ctx, call_id, &a),
                Builtin::DeleteFile => fs::plan_delete(ctx, call_id, &a),
                Builtin::SearchReplace => edit::plan(ctx, call_id, &a),
                Builtin::ListDir => search::plan_ls(ctx, call_id, &a),
                Builtin::GlobFileSearch => search::plan_glob(ctx, call_id, &a),
                Builtin::Grep => search::plan_grep(ctx, call_id, &a),
                Builtin::RunTerminalCmd => shell::plan(ctx, call_id, &a),
                Builtin::WriteShellStdin => stdin::plan(call_id, &a),
                Builtin::ReadLints => lints::plan(ctx, call_id, &a),
                Builtin::WebFetch => web::plan(call_id, &a),
                Builtin::TodoWrite => todos::plan(call_id, &a),
                Builtin::AskQuestion => interaction::plan_ask(call_id, &a),
                Builtin::SwitchMode => interaction::plan_switch(ctx, call_id, &a),
                Builtin::CreatePlan => interaction::plan_create(call_id, &a),
                Builtin::Task => task::plan(ctx, call_id, &a),
                Builtin::AwaitSubagent => task::plan_await(call_id, &a),
            }
        }
        ToolRef::Mcp(our_name, def) => {
            if ctx.readonly && !mcp::read_only(def) {
                return Err(ToolError::NotAvailable {
                    tool: our_name,
                    reason: "this subagent is read-only and this MCP tool is not marked read-only"
                        .into(),
                });
            }
            if ctx.mode_kind() != Mode::Agent && !mcp::read_only(def) {
                return Err(ToolError::NotAvailable {
                    tool: our_name,
                    reason: format!(
                        "{} mode is read-only and this MCP tool is not marked read-only",
                        ctx.mode_kind().label()
                    ),
                });
            }
            let a = Args::parse(&our_name, args)?;
            Ok(mcp::plan(call_id, def, &a))
        }
    }
}

/// A `ToolCall` of the right kind with empty arguments, for `partial_tool_call` while the
/// model is still streaming the arguments. `None` for names we do not know.
pub fn placeholder(ctx: &ToolContext, call_id: &str, name: &str) -> Option<pb::ToolCall> {
    let tool = match resolve(ctx, name)? {
        ToolRef::Mcp(_, def) => Tool::McpToolCall(pb::McpToolCall {
            args: Some(mcp::args_for(def, Default::default(), call_id)),
            ..Default::default()
        }),
        ToolRef::Builtin(b) => match b {
            Builtin::ReadFile => Tool::ReadToolCall(Default::default()),
            Builtin::ListDir => Tool::LsToolCall(Default::default()),
            Builtin::GlobFileSearch => Tool::GlobToolCall(Default::default()),
            Builtin::Grep => Tool::GrepToolCall(Default::default()),
            Builtin::SearchReplace | Builtin::Write => Tool::EditToolCall(Default::default()),
            Builtin::DeleteFile => Tool::DeleteToolCall(Default::default()),
            Builtin::RunTerminalCmd => Tool::ShellToolCall(Default::default()),
            Builtin::WriteShellStdin => Tool::WriteShellStdinToolCall(Default::default()),
            Builtin::ReadLints => Tool::ReadLintsToolCall(Default::default()),
            Builtin::TodoWrite => Tool::UpdateTodosToolCall(Default::default()),
            Builtin::WebFetch => Tool::FetchToolCall(Default::default()),
            Builtin::AskQuestion => Tool::AskQuestionToolCall(Default::default()),
            Builtin::SwitchMode => Tool::SwitchModeToolCall(Default::default()),
            Builtin::CreatePlan => Tool::CreatePlanToolCall(Default::default()),
            Builtin::Task | Builtin::AwaitSubagent => Tool::TaskToolCall(Default::default()),
        },
    };
    Some(wrap(call_id, tool))
}

/// Finish an `Exec` / `ExecEach` plan. `results` is everything the client sent for it, in
/// order; `thrown` is its `throw` error, if it failed.
pub(crate) fn finish_exec(
    ctx: &ToolContext,
    plan: &ToolPlan,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> ToolOutcome {
    let (tool_call, exec) = match plan {
        ToolPlan::Exec {
            tool_call, exec, ..
        } => (tool_call, Some(exec)),
        ToolPlan::ExecEach { tool_call, .. } => (tool_call, None),
        other => {
            return error_outcome(
                other.tool_call().clone(),
                "internal error: this tool call is not finished by an exec".into(),
            )
        }
    };
    let mut tc = tool_call.clone();
    let tool = match tc.tool.take() {
        Some(Tool::ReadToolCall(t)) => Tool::ReadToolCall(fs::finish_read(t, results, thrown)),
        Some(Tool::DeleteToolCall(t)) => {
            Tool::DeleteToolCall(fs::finish_delete(t, results, thrown))
        }
        Some(Tool::EditToolCall(t)) => {
            let contents = match exec {
                Some(ExecArgs::WriteArgs(w)) => w.file_text.as_str(),
                _ => "",
            };
            Tool::EditToolCall(edit::finish_write(t, contents, results, thrown))
        }
        Some(Tool::LsToolCall(t)) => Tool::LsToolCall(search::finish_ls(t, results, thrown)),
        Some(Tool::GlobToolCall(t)) => Tool::GlobToolCall(search::finish_glob(t, results, thrown)),
        Some(Tool::GrepToolCall(t)) => Tool::GrepToolCall(search::finish_grep(t, results, thrown)),
        Some(Tool::ShellToolCall(t)) => Tool::ShellToolCall(shell::finish(
            t,
            results,
            thrown,
            ctx.terminals_folder.as_deref(),
        )),
        Some(Tool::WriteShellStdinToolCall(t)) => {
            Tool::WriteShellStdinToolCall(stdin::finish(t, results, thrown))
        }
        Some(Tool::ReadLintsToolCall(t)) => {
            Tool::ReadLintsToolCall(lints::finish(t, results, thrown))
        }
        Some(Tool::McpToolCall(t)) => Tool::McpToolCall(mcp::finish(t, results, thrown)),
        Some(Tool::FetchToolCall(t)) => Tool::FetchToolCall(web::finish(t, results, thrown)),
        Some(Tool::TaskToolCall(t)) => Tool::TaskToolCall(task::finish(t, results, thrown)),
        other => {
            tc.tool = other;
            return error_outcome(
                tc,
                "internal error: no exec result handling for this tool".into(),
            );
        }
    };
    tc.tool = Some(tool);
    outcome(tc)
}

/// Apply a search-and-replace edit to the file the read returned. `Ok` holds the write to
/// exec next; `Err` is the finished (failed) outcome, e.g. `old_string` not found.
// Once per edit: the large error (it carries the UI tool call) costs nothing worth boxing for.
#[allow(clippy::result_large_err)]
pub(crate) fn apply_edit(
    plan: &ToolPlan,
    read: &[ExecResult],
    thrown: Option<&str>,
) -> Result<EditWrite, ToolOutcome> {
    match plan {
        ToolPlan::Edit {
            path,
            edit,
            tool_call,
        } => edit::apply(path, edit, tool_call, read, thrown).map_err(outcome),
        other => Err(error_outcome(
            other.tool_call().clone(),
            "internal error: not an edit".into(),
        )),
    }
}

/// Finish an edit after its write exec.
pub(crate) fn finish_edit(
    plan: &ToolPlan,
    write: &EditWrite,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> ToolOutcome {
    outcome(edit::finish(plan.tool_call(), write, results, thrown))
}

/// Apply a `Todos` plan to the current list. Returns the new list (to keep in the checkpoint)
/// and the outcome. `now_ms` stamps created/updated items.
pub(crate) fn apply_todos(
    plan: &ToolPlan,
    current: &[pb::TodoItem],
    now_ms: i64,
) -> (Vec<pb::TodoItem>, ToolOutcome) {
    match plan {
        ToolPlan::Todos {
            merge,
            items,
            tool_call,
        } => todos::apply(tool_call, current, *merge, items, now_ms),
        other => (
            current.to_vec(),
            error_outcome(
                other.tool_call().clone(),
                "internal error: not a todo update".into(),
            ),
        ),
    }
}

/// Finish an `Interaction` plan with the user's response.
pub(crate) fn finish_interaction(
    ctx: &ToolContext,
    plan: &ToolPlan,
    response: &pb::InteractionResponse,
) -> ToolOutcome {
    let mut tc = plan.tool_call().clone();
    if interaction::answer(ctx, &mut tc, response) {
        outcome(tc)
    } else {
        error_outcome(tc, interaction::UNFIT_RESPONSE.into())
    }
}

/// The `pb::AgentMode` the user approved switching to, when `response` approves a
/// `switch_mode` plan; the run should use it (and its tool list) from the next model call.
pub(crate) fn approved_mode(plan: &ToolPlan, response: &pb::InteractionResponse) -> Option<i32> {
    interaction::approved_mode(plan.tool_call(), response)
}

/// What the model reads for an ask-question answer (`args` asked, `result` answered), e.g. one
/// that arrives later as `async_ask_question_completion_action`.
pub(crate) fn render_ask_result(
    args: Option<pb::AskQuestionArgs>,
    result: Option<pb::AskQuestionResult>,
) -> String {
    interaction::render_ask(&pb::AskQuestionToolCall { args, result }).0
}

/// The todos a plan's front matter lists (Cursor's `.plan.md`: `todos:` with `- id:`,
/// `content:`, `status:` entries); empty when it lists none.
pub(crate) fn plan_todos(plan: &str) -> Vec<pb::TodoItem> {
    todos::from_front_matter(plan)
}

/// The todos of a `create_plan` call's arguments (as the model wrote them); empty when it
/// listed none or they do not parse.
pub(crate) fn created_plan_todos(arguments: &serde_json::Value) -> Vec<pb::TodoItem> {
    ["todos", "steps", "tasks"]
        .iter()
        .find_map(|k| arguments.get(*k))
        .and_then(|v| todos::parse_items(v, false).ok())
        .unwrap_or_default()
}
