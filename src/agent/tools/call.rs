//! The words every tool file shares: what the tools know of the run ([`ToolContext`]), what
//! to do for one model tool call ([`ToolPlan`]), what came of it ([`ToolOutcome`]) and why it
//! could not be planned ([`ToolError`]). A leaf: it uses no other file of the tools.

use crate::proto::agent::v1 as pb;
use pb::tool_call::Tool;

pub(crate) type ExecArgs = pb::exec_server_message::Message;
pub(crate) type ExecResult = pb::exec_client_message::Message;

/// What the model reads for a call whose tool never finished (or that carries none).
pub(crate) const NOT_COMPLETED: &str = "The tool call did not complete.";

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
    pub(crate) fn resolve_path(&self, path: &str) -> String {
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

/// What a subagent call needs from the parent run.
#[derive(Debug, Clone, Default)]
pub struct SubagentOptions {
    /// Offer the tool (not at the nesting bound).
    pub enabled: bool,
    /// The request context's `custom_subagents` (the SDK's `agents` option arrives there).
    pub custom: Vec<pb::CustomSubagent>,
    /// The parent's model, as Cursor named it.
    pub parent_model_id: String,
    /// `run_request.subagent_model_overrides`.
    pub overrides: Vec<pb::SubagentModelOverride>,
    /// `run_request.selected_subagent_models`, by model id.
    pub selected_models: Vec<String>,
    pub parent_conversation_id: String,
    /// What the user attached to the turn, passed on so the child sees it too.
    pub selected_context: Option<pb::SelectedContext>,
    /// Our models by the names a subagent definition may give them (display name, short id,
    /// Cursor id), each with its Cursor id.
    pub model_names: Vec<(String, String)>,
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
    /// and `partial_tool_call`); pass everything the client answers to [`super::finish_exec`].
    Exec {
        exec: ExecArgs,
        tool_call: pb::ToolCall,
        access: Access,
    },
    /// Several independent read-only execs for one call (`read_lints` over several paths).
    /// Run them all (concurrently is fine), then call [`super::finish_exec`] with all their results
    /// concatenated in this order and the first `throw`, if any.
    ExecEach {
        execs: Vec<ExecArgs>,
        tool_call: pb::ToolCall,
    },
    /// A search-and-replace edit: exec [`ToolPlan::read_exec`], give the answer to
    /// [`super::apply_edit`], exec the write it returns, then call [`super::finish_edit`].
    Edit {
        path: String,
        edit: EditSpec,
        tool_call: pb::ToolCall,
    },
    /// The todo list: answered locally with [`super::apply_todos`]; the run keeps the list in the
    /// checkpoint's `todos`.
    Todos {
        merge: bool,
        items: Vec<pb::TodoItem>,
        tool_call: pb::ToolCall,
    },
    /// Needs the user: send `interaction_query { id, query }`, wait for the
    /// `interaction_response` with that id, then call [`super::finish_interaction`].
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
    pub(crate) fn read_exec(&self) -> Option<ExecArgs> {
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

/// A search-and-replace: `old_string` → `new_string`, once (or everywhere with `replace_all`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditSpec {
    pub old_string: String,
    pub new_string: String,
    pub replace_all: bool,
}

/// A `ToolCall` carrying `tool`, tagged with the call id.
pub(crate) fn wrap(call_id: &str, tool: Tool) -> pb::ToolCall {
    pb::ToolCall {
        tool: Some(tool),
        tool_call_id: Some(call_id.to_string()),
        ..Default::default()
    }
}
