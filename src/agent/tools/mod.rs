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

mod args;
mod catalog;
mod diff;
mod edit;
mod fs;
mod history;
mod interaction;
mod lints;
mod mcp;
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
use catalog::Builtin;
use pb::tool_call::Tool;

pub use edit::{EditSpec, EditWrite};
pub use history::history_from_tool_call;
pub use mcp::merge_definitions as merge_mcp_tools;
pub(crate) use mcp::to_json as value_to_json;
pub use shell::{result_is_final, shell_delta};
pub use task::SubagentOptions;

type ExecArgs = pb::exec_server_message::Message;
type ExecResult = pb::exec_client_message::Message;

/// What the tools need to know about the run.
#[derive(Debug, Clone, Default)]
pub struct ToolContext {
    /// Relative paths resolve against it: the first workspace path, else the working directory.
    pub workspace_root: Option<String>,
    /// `run_request.mcp_tools` and the request context's `tools`, merged.
    pub mcp_tools: Vec<pb::McpToolDefinition>,
    /// The client answers `fetch_args`.
    pub web_fetch: bool,
    /// `pb::AgentMode` of the user's message.
    pub mode: i32,
    /// The request context's `admin_command_denylist`, forwarded in every shell exec as
    /// Cursor's server does (the client enforces it).
    pub command_denylist: Vec<String>,
    /// `RequestContextEnv.terminals_folder`: where the client writes background shells'
    /// output (`<folder>/<shell_id>.txt`), named to the model.
    pub terminals_folder: Option<String>,
    /// How long a foreground command blocks before it moves to the background (ms); `None`:
    /// Cursor's 30 s.
    pub shell_block_ms: Option<u32>,
    /// What the subagent tool needs; it is offered only when `subagents.enabled`.
    pub subagents: SubagentOptions,
    /// A read-only subagent: no writes, deletes or shell commands.
    pub readonly: bool,
    /// A custom subagent's tool list (names as it gives them); `None` allows every tool.
    pub allowed_tools: Option<Vec<String>>,
    /// Auto-review is on (`smart_mode_classifier_auto_mode_enabled`): shell and MCP calls get
    /// a decision before they go to the client.
    pub auto_review: bool,
    /// The client runs shells in its sandbox (`RequestContextEnv.sandbox_enabled`).
    pub sandboxed: bool,
}

/// The modes that change the tool list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Agent,
    Ask,
    Plan,
}

impl Mode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Agent => "Agent",
            Mode::Ask => "Ask",
            Mode::Plan => "Plan",
        }
    }
}

impl ToolContext {
    pub(crate) fn mode_kind(&self) -> Mode {
        match pb::AgentMode::try_from(self.mode) {
            Ok(pb::AgentMode::Ask) => Mode::Ask,
            Ok(pb::AgentMode::Plan) => Mode::Plan,
            _ => Mode::Agent,
        }
    }

    /// An absolute path for `path`: absolute paths stay, relative ones join the workspace root
    /// (with its separator style). Without a root, the path goes to the client as given.
    pub fn resolve_path(&self, path: &str) -> String {
        let p = path.trim();
        let p = p.strip_prefix("file://").unwrap_or(p);
        if is_absolute(p) {
            return p.to_string();
        }
        let Some(root) = self
            .workspace_root
            .as_deref()
            .filter(|r| !r.trim().is_empty())
        else {
            return p.to_string();
        };
        let mut rel = p;
        while let Some(r) = rel.strip_prefix("./").or_else(|| rel.strip_prefix(".\\")) {
            rel = r;
        }
        let root_trimmed = root.trim_end_matches(['/', '\\']);
        if rel.is_empty() || rel == "." {
            return if root_trimmed.is_empty() {
                root.to_string()
            } else {
                root_trimmed.to_string()
            };
        }
        let sep = if root.contains('\\') && !root.contains('/') {
            '\\'
        } else {
            '/'
        };
        format!("{root_trimmed}{sep}{rel}")
    }
}

/// `/x`, `\x`, `C:\x`, `C:/x`, and `~` (the client expands it).
fn is_absolute(p: &str) -> bool {
    let b = p.as_bytes();
    p.starts_with(['/', '\\', '~'])
        || (b.len() >= 3
            && b[0].is_ascii_alphabetic()
            && b[1] == b':'
            && (b[2] == b'\\' || b[2] == b'/'))
}

/// A tool call that could not be planned. `Display` is written for the model: the run sends
/// it back as an error tool result and the conversation goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("Unknown tool `{name}`. Available tools: {}.", available.join(", "))]
    UnknownTool {
        name: String,
        available: Vec<String>,
    },
    #[error("Tool `{tool}` is not available: {reason}.")]
    NotAvailable { tool: String, reason: String },
    #[error("Invalid arguments for `{tool}`: {message}")]
    InvalidArgs { tool: String, message: String },
}

/// How the run may schedule a planned call relative to the others of the same model turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Reads nothing the turn's other calls write: may run concurrently.
    Read,
    /// Writes this path: runs after earlier calls touching the same path, in order.
    Write { path: String },
    /// Unknown reach (shell commands, MCP tools, questions to the user): runs alone, in order.
    Exclusive,
}

/// What to do for one model tool call.
// One short-lived plan per tool call: variant sizes do not matter, boxing would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ToolPlan {
    /// One exec on the client. `tool_call` carries the arguments only (for `tool_call_started`
    /// and `partial_tool_call`); pass everything the client answers to [`finish_exec`].
    Exec {
        exec: ExecArgs,
        tool_call: pb::ToolCall,
        access: Access,
    },
    /// Several independent read-only execs for one call (`read_lints` over several paths).
    /// Run them all (concurrently is fine), then call [`finish_exec`] with all their results
    /// concatenated in this order and the first `throw`, if any.
    ExecEach {
        execs: Vec<ExecArgs>,
        tool_call: pb::ToolCall,
    },
    /// A search-and-replace edit: exec [`ToolPlan::read_exec`], give the answer to
    /// [`apply_edit`], exec the write it returns, then call [`finish_edit`].
    Edit {
        path: String,
        edit: EditSpec,
        tool_call: pb::ToolCall,
    },
    /// The todo list: answered locally with [`apply_todos`]; the run keeps the list in the
    /// checkpoint's `todos`.
    Todos {
        merge: bool,
        items: Vec<pb::TodoItem>,
        tool_call: pb::ToolCall,
    },
    /// Needs the user: send `interaction_query { id, query }`, wait for the
    /// `interaction_response` with that id, then call [`finish_interaction`].
    Interaction {
        query: pb::interaction_query::Query,
        tool_call: pb::ToolCall,
    },
}

impl ToolPlan {
    /// The UI `ToolCall` with arguments only.
    pub fn tool_call(&self) -> &pb::ToolCall {
        match self {
            ToolPlan::Exec { tool_call, .. }
            | ToolPlan::ExecEach { tool_call, .. }
            | ToolPlan::Edit { tool_call, .. }
            | ToolPlan::Todos { tool_call, .. }
            | ToolPlan::Interaction { tool_call, .. } => tool_call,
        }
    }

    /// How to schedule it (see [`Access`]).
    pub fn access(&self) -> Access {
        match self {
            ToolPlan::Exec { access, .. } => access.clone(),
            ToolPlan::ExecEach { .. } | ToolPlan::Todos { .. } => Access::Read,
            ToolPlan::Edit { path, .. } => Access::Write { path: path.clone() },
            ToolPlan::Interaction { .. } => Access::Exclusive,
        }
    }

    /// For an edit: the read to run first (the whole file, through the client, because the
    /// workspace may be remote).
    pub fn read_exec(&self) -> Option<ExecArgs> {
        match self {
            ToolPlan::Edit {
                path, tool_call, ..
            } => Some(ExecArgs::ReadArgs(pb::ReadArgs {
                path: path.clone(),
                tool_call_id: tool_call.tool_call_id.clone().unwrap_or_default(),
                ..Default::default()
            })),
            _ => None,
        }
    }
}

/// What goes back to the model and to the UI after a tool ran.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The tool result text for the model.
    pub content: String,
    pub is_error: bool,
    /// The `ToolCall` with its result, for `tool_call_completed` and the checkpoint step.
    pub tool_call: pb::ToolCall,
}

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

enum Target<'a> {
    Builtin(Builtin),
    Mcp(String, &'a pb::McpToolDefinition),
}

/// Which tool a model's tool name means: our MCP names exactly, then built-in names and their
/// aliases, then looser MCP spellings.
fn resolve<'a>(ctx: &'a ToolContext, name: &str) -> Option<Target<'a>> {
    let name = name.trim();
    // Some models prefix tool names with their namespace.
    let name = ["functions.", "default_api.", "default_api:", "tools."]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    let named = mcp::named(&ctx.mcp_tools);
    if let Some((n, def)) = named.iter().find(|(n, _)| n == name) {
        return Some(Target::Mcp(n.clone(), def));
    }
    if let Some(b) = Builtin::from_alias(name) {
        return Some(Target::Builtin(b));
    }
    mcp::find_loose(&named, name).map(|(n, def)| Target::Mcp(n, def))
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
        Target::Builtin(b) => {
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
        Target::Mcp(our_name, def) => {
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
        Target::Mcp(_, def) => Tool::McpToolCall(pb::McpToolCall {
            args: Some(mcp::args_for(def, Default::default(), call_id)),
            ..Default::default()
        }),
        Target::Builtin(b) => match b {
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

/// A `ToolCall` carrying `tool`, tagged with the call id.
pub(crate) fn wrap(call_id: &str, tool: Tool) -> pb::ToolCall {
    pb::ToolCall {
        tool: Some(tool),
        tool_call_id: Some(call_id.to_string()),
        ..Default::default()
    }
}

/// The outcome of a finished `ToolCall`: the model's text is rendered from it.
pub(crate) fn outcome(tool_call: pb::ToolCall) -> ToolOutcome {
    let (content, is_error) = history::render(&tool_call);
    ToolOutcome {
        content,
        is_error,
        tool_call,
    }
}

/// Finish an `Exec` / `ExecEach` plan. `results` is everything the client sent for it, in
/// order; `thrown` is its `throw` error, if it failed.
pub fn finish_exec(
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
pub fn apply_edit(
    plan: &ToolPlan,
    read: &[ExecResult],
    thrown: Option<&str>,
) -> Result<EditWrite, ToolOutcome> {
    match plan {
        ToolPlan::Edit {
            path,
            edit,
            tool_call,
        } => edit::apply(path, edit, tool_call, read, thrown),
        other => Err(error_outcome(
            other.tool_call().clone(),
            "internal error: not an edit".into(),
        )),
    }
}

/// Finish an edit after its write exec.
pub fn finish_edit(
    plan: &ToolPlan,
    write: &EditWrite,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> ToolOutcome {
    edit::finish(plan.tool_call(), write, results, thrown)
}

/// Apply a `Todos` plan to the current list. Returns the new list (to keep in the checkpoint)
/// and the outcome. `now_ms` stamps created/updated items.
pub fn apply_todos(
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
pub fn finish_interaction(
    ctx: &ToolContext,
    plan: &ToolPlan,
    response: &pb::InteractionResponse,
) -> ToolOutcome {
    interaction::finish(ctx, plan.tool_call(), response)
}

/// The `pb::AgentMode` the user approved switching to, when `response` approves a
/// `switch_mode` plan; the run should use it (and its tool list) from the next model call.
pub fn approved_mode(plan: &ToolPlan, response: &pb::InteractionResponse) -> Option<i32> {
    interaction::approved_mode(plan.tool_call(), response)
}

/// A failed outcome: `message` (for the model) set as the error result of `tool_call`.
pub fn error_outcome(tool_call: pb::ToolCall, message: String) -> ToolOutcome {
    let mut tc = tool_call;
    match tc.tool.take() {
        Some(tool) => {
            tc.tool = Some(history::with_error(tool, &message));
            let mut o = outcome(tc);
            o.is_error = true;
            o
        }
        None => ToolOutcome {
            content: message,
            is_error: true,
            tool_call: tc,
        },
    }
}

/// What the model reads for an ask-question answer (`args` asked, `result` answered), e.g. one
/// that arrives later as `async_ask_question_completion_action`.
pub fn render_ask_result(
    args: Option<pb::AskQuestionArgs>,
    result: Option<pb::AskQuestionResult>,
) -> String {
    interaction::render_ask(&pb::AskQuestionToolCall { args, result }).0
}

/// The todos a plan's front matter lists (Cursor's `.plan.md`: `todos:` with `- id:`,
/// `content:`, `status:` entries); empty when it lists none.
pub fn plan_todos(plan: &str) -> Vec<pb::TodoItem> {
    todos::from_front_matter(plan)
}

/// The todos of a `create_plan` call's arguments (as the model wrote them); empty when it
/// listed none or they do not parse.
pub fn created_plan_todos(arguments: &serde_json::Value) -> Vec<pb::TodoItem> {
    ["todos", "steps", "tasks"]
        .iter()
        .find_map(|k| arguments.get(*k))
        .and_then(|v| todos::parse_items(v, false).ok())
        .unwrap_or_default()
}
