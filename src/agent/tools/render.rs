//! From a finished `ToolCall` to what the model sees: the result text (used both live and when
//! rebuilding history), and for history also our tool name and arguments. It sits above every
//! tool file: each renders its own kind, this file picks by kind.

use serde_json::{json, Value};

use super::call::{ToolOutcome, NOT_COMPLETED};
use super::text::cap_head;
use super::{edit, fs, interaction, lints, mcp, search, shell, stdin, task, todos, web};
use crate::proto::agent::v1 as pb;
use pb::tool_call::Tool;

/// The result text for the model and whether it is an error.
pub(crate) fn render(tc: &pb::ToolCall) -> (String, bool) {
    match &tc.tool {
        Some(Tool::ReadToolCall(t)) => fs::render_read(t),
        Some(Tool::DeleteToolCall(t)) => fs::render_delete(t),
        Some(Tool::EditToolCall(t)) => edit::render(t),
        Some(Tool::LsToolCall(t)) => search::render_ls(t),
        Some(Tool::GlobToolCall(t)) => search::render_glob(t),
        Some(Tool::GrepToolCall(t)) => search::render_grep(t),
        Some(Tool::ShellToolCall(t)) => shell::render(t),
        Some(Tool::WriteShellStdinToolCall(t)) => stdin::render(t),
        Some(Tool::ReadLintsToolCall(t)) => lints::render(t),
        Some(Tool::McpToolCall(t)) => mcp::render(t),
        Some(Tool::FetchToolCall(t)) => web::render(t),
        Some(Tool::WebFetchToolCall(t)) => render_web_fetch(t),
        Some(Tool::UpdateTodosToolCall(t)) => todos::render(t),
        Some(Tool::AskQuestionToolCall(t)) => interaction::render_ask(t),
        Some(Tool::SwitchModeToolCall(t)) => interaction::render_switch(t),
        Some(Tool::CreatePlanToolCall(t)) => interaction::render_create(t),
        Some(Tool::TaskToolCall(t)) => task::render(t),
        _ => (NOT_COMPLETED.into(), true),
    }
}

/// The same tool call with `message` as its error result.
pub(crate) fn with_error(tool: Tool, message: &str) -> Tool {
    match tool {
        Tool::ReadToolCall(t) => Tool::ReadToolCall(fs::read_with_error(t, message)),
        Tool::DeleteToolCall(t) => Tool::DeleteToolCall(fs::delete_with_error(t, message)),
        Tool::EditToolCall(t) => Tool::EditToolCall(edit::with_error(t, message)),
        Tool::LsToolCall(t) => Tool::LsToolCall(search::ls_with_error(t, message)),
        Tool::GlobToolCall(t) => Tool::GlobToolCall(search::glob_with_error(t, message)),
        Tool::GrepToolCall(t) => Tool::GrepToolCall(search::grep_with_error(t, message)),
        Tool::ShellToolCall(t) => Tool::ShellToolCall(shell::with_error(t, message)),
        Tool::WriteShellStdinToolCall(t) => {
            Tool::WriteShellStdinToolCall(stdin::with_error(t, message))
        }
        Tool::ReadLintsToolCall(t) => Tool::ReadLintsToolCall(lints::with_error(t, message)),
        Tool::McpToolCall(t) => Tool::McpToolCall(mcp::with_error(t, message)),
        Tool::FetchToolCall(t) => Tool::FetchToolCall(web::with_error(t, message)),
        Tool::UpdateTodosToolCall(t) => Tool::UpdateTodosToolCall(todos::with_error(t, message)),
        Tool::AskQuestionToolCall(t) => {
            Tool::AskQuestionToolCall(interaction::ask_with_error(t, message))
        }
        Tool::SwitchModeToolCall(t) => {
            Tool::SwitchModeToolCall(interaction::switch_with_error(t, message))
        }
        Tool::CreatePlanToolCall(t) => {
            Tool::CreatePlanToolCall(interaction::create_with_error(t, message))
        }
        Tool::TaskToolCall(t) => Tool::TaskToolCall(task::with_error(t, message)),
        other => other,
    }
}

/// The outcome of a finished `ToolCall`: the model's text is rendered from it.
pub(crate) fn outcome(tool_call: pb::ToolCall) -> ToolOutcome {
    let (content, is_error) = render(&tool_call);
    ToolOutcome {
        content,
        is_error,
        tool_call,
    }
}

/// A failed outcome: `message` (for the model) set as the error result of `tool_call`.
pub(crate) fn error_outcome(tool_call: pb::ToolCall, message: String) -> ToolOutcome {
    let mut tc = tool_call;
    match tc.tool.take() {
        Some(tool) => {
            tc.tool = Some(with_error(tool, &message));
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

fn render_web_fetch(t: &pb::WebFetchToolCall) -> (String, bool) {
    use pb::web_fetch_result::Result as W;
    let url = t.args.as_ref().map(|a| a.url.as_str()).unwrap_or_default();
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(W::Success(s)) => {
            let (body, cut) = cap_head(&s.markdown, 50_000);
            let more = if cut { "\n[... content cut]" } else { "" };
            (format!("URL: {url}\n\n{body}{more}"), false)
        }
        Some(W::Error(e)) => (format!("Fetching {url} failed: {}", e.error), true),
        Some(W::Rejected(r)) => (format!("Fetching {url} was rejected: {}", r.reason), true),
        None => ("The fetch did not complete.".into(), true),
    }
}

/// For rebuilding history from checkpoint turns (ours or written by Cursor's own servers): a
/// `ToolCall` with its result → (tool name in our catalogue, arguments, result text for the
/// model, is_error). `None` for kinds our catalogue cannot express.
pub(crate) fn history_from_tool_call(tc: &pb::ToolCall) -> Option<(String, Value, String, bool)> {
    let (name, args): (String, Value) = match tc.tool.as_ref()? {
        Tool::ReadToolCall(t) => ("read_file".into(), fs::read_history_args(t)),
        Tool::DeleteToolCall(t) => (
            "delete_file".into(),
            json!({ "path": t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default() }),
        ),
        Tool::EditToolCall(t) => edit::history(t),
        Tool::LsToolCall(t) => ("list_dir".into(), search::ls_history_args(t)),
        Tool::GlobToolCall(t) => ("glob_file_search".into(), search::glob_history_args(t)),
        Tool::GrepToolCall(t) => ("grep".into(), search::grep_history_args(t)),
        Tool::ShellToolCall(t) => ("run_terminal_cmd".into(), shell::history_args(t)),
        Tool::WriteShellStdinToolCall(t) => ("write_shell_stdin".into(), stdin::history_args(t)),
        Tool::ReadLintsToolCall(t) => ("read_lints".into(), lints::history_args(t)),
        Tool::McpToolCall(t) => mcp::history(t),
        Tool::FetchToolCall(t) => ("web_fetch".into(), web::history_args(t)),
        Tool::WebFetchToolCall(t) => (
            "web_fetch".into(),
            json!({ "url": t.args.as_ref().map(|a| a.url.clone()).unwrap_or_default() }),
        ),
        Tool::UpdateTodosToolCall(t) => ("todo_write".into(), todos::history_args(t)),
        Tool::AskQuestionToolCall(t) => ("ask_question".into(), interaction::ask_history_args(t)),
        Tool::SwitchModeToolCall(t) => ("switch_mode".into(), interaction::switch_history_args(t)),
        Tool::CreatePlanToolCall(t) => ("create_plan".into(), interaction::create_history_args(t)),
        Tool::TaskToolCall(t) => task::history(t),
        _ => return None,
    };
    let (text, is_error) = render(tc);
    Some((name, args, text, is_error))
}
