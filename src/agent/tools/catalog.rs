//! The built-in tools: names, aliases, availability per mode, and the JSON Schemas offered to
//! models. Names and shapes follow Cursor's own agent tools, which models already know.

use serde_json::{json, Value};

use super::args::norm;
use super::{Mode, ToolContext};
use crate::provider::ToolSpec;

/// Default and maximum shell timeouts, in seconds.
pub(crate) const SHELL_DEFAULT_TIMEOUT_SECS: i64 = 120;
pub(crate) const SHELL_MAX_TIMEOUT_SECS: i64 = 1800;
/// Lines `read_file` returns when no `limit` is given.
pub(crate) const READ_DEFAULT_LINES: usize = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    ReadFile,
    ListDir,
    GlobFileSearch,
    Grep,
    SearchReplace,
    Write,
    DeleteFile,
    RunTerminalCmd,
    ReadLints,
    TodoWrite,
    WebFetch,
    AskQuestion,
    SwitchMode,
    CreatePlan,
}

pub(crate) const ALL: [Builtin; 14] = [
    Builtin::ReadFile,
    Builtin::ListDir,
    Builtin::GlobFileSearch,
    Builtin::Grep,
    Builtin::SearchReplace,
    Builtin::Write,
    Builtin::DeleteFile,
    Builtin::RunTerminalCmd,
    Builtin::ReadLints,
    Builtin::TodoWrite,
    Builtin::WebFetch,
    Builtin::AskQuestion,
    Builtin::SwitchMode,
    Builtin::CreatePlan,
];

impl Builtin {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "read_file",
            Builtin::ListDir => "list_dir",
            Builtin::GlobFileSearch => "glob_file_search",
            Builtin::Grep => "grep",
            Builtin::SearchReplace => "search_replace",
            Builtin::Write => "write",
            Builtin::DeleteFile => "delete_file",
            Builtin::RunTerminalCmd => "run_terminal_cmd",
            Builtin::ReadLints => "read_lints",
            Builtin::TodoWrite => "todo_write",
            Builtin::WebFetch => "web_fetch",
            Builtin::AskQuestion => "ask_question",
            Builtin::SwitchMode => "switch_mode",
            Builtin::CreatePlan => "create_plan",
        }
    }

    /// Our name for a tool name a model emitted: canonical names plus the spellings of other
    /// harnesses (Claude Code, Codex, Cline…), compared without case, `_` or `-`.
    pub(crate) fn from_alias(name: &str) -> Option<Builtin> {
        let b = match norm(name).as_str() {
            "readfile" | "read" | "viewfile" | "openfile" | "view" | "cat" => Builtin::ReadFile,
            "listdir" | "ls" | "listdirectory" | "listfiles" | "dir" => Builtin::ListDir,
            "globfilesearch" | "glob" | "findfiles" | "filesearch" | "findfile" => {
                Builtin::GlobFileSearch
            }
            "grep" | "search" | "rg" | "ripgrep" | "grepsearch" | "searchfiles" => Builtin::Grep,
            "searchreplace" | "edit" | "strreplace" | "editfile" | "replace" | "replaceinfile" => {
                Builtin::SearchReplace
            }
            "write" | "createfile" | "writefile" | "writetofile" => Builtin::Write,
            "deletefile" | "delete" | "rm" | "removefile" => Builtin::DeleteFile,
            "runterminalcmd" | "bash" | "shell" | "runcommand" | "terminal"
            | "runterminalcommand" | "executecommand" | "runshellcommand" | "shellcommand"
            | "exec" | "execute" => Builtin::RunTerminalCmd,
            "readlints" | "lints" | "getdiagnostics" | "diagnostics" | "readlinterrors" => {
                Builtin::ReadLints
            }
            "todowrite" | "todo" | "todos" | "updatetodos" | "writetodos" => Builtin::TodoWrite,
            "webfetch" | "fetch" | "fetchurl" => Builtin::WebFetch,
            "askquestion" | "askuser" | "askuserquestion" | "askfollowupquestion" => {
                Builtin::AskQuestion
            }
            "switchmode" => Builtin::SwitchMode,
            "createplan" => Builtin::CreatePlan,
            _ => return None,
        };
        Some(b)
    }

    /// Changes the workspace: left out of Ask and Plan modes.
    pub(crate) fn writes(self) -> bool {
        matches!(
            self,
            Builtin::SearchReplace | Builtin::Write | Builtin::DeleteFile | Builtin::RunTerminalCmd
        )
    }

    /// Why this tool cannot be used in this context, or `None` when it can.
    pub(crate) fn unavailable(self, ctx: &ToolContext) -> Option<String> {
        let mode = ctx.mode_kind();
        if self.writes() && mode != Mode::Agent {
            return Some(format!(
                "{} mode is read-only; use switch_mode to ask the user for Agent mode if changes are needed",
                mode.label()
            ));
        }
        match self {
            Builtin::WebFetch if !ctx.web_fetch => {
                Some("this Cursor client does not support fetching URLs".into())
            }
            Builtin::TodoWrite if mode == Mode::Ask => Some("Ask mode has no todo list".into()),
            Builtin::CreatePlan if mode != Mode::Plan => {
                Some("plans are created in Plan mode; use switch_mode to ask for it".into())
            }
            _ => None,
        }
    }

    pub(crate) fn spec(self) -> ToolSpec {
        let (description, parameters) = match self {
            Builtin::ReadFile => (
                "Read a text file from the workspace. Returns its lines numbered as `<line>\\t<text>`, \
                 starting at 1. Returns up to 2000 lines unless `limit` is given; use `offset` and \
                 `limit` for other parts of long files. Relative paths resolve against the workspace root.",
                object(
                    json!({
                        "path": {"type": "string", "description": "Path of the file (absolute, or relative to the workspace root)."},
                        "offset": {"type": "integer", "description": "1-based line to start at; a negative value counts from the end of the file."},
                        "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return."}
                    }),
                    &["path"],
                ),
            ),
            Builtin::ListDir => (
                "List a directory as a tree of subdirectories and files. Use it to explore the project layout.",
                object(
                    json!({
                        "path": {"type": "string", "description": "Directory to list; defaults to the workspace root."},
                        "ignore": {"type": "array", "items": {"type": "string"}, "description": "Glob patterns to leave out."}
                    }),
                    &[],
                ),
            ),
            Builtin::GlobFileSearch => (
                "Find files whose path matches a glob pattern, e.g. `**/*.rs` or `src/**/test_*.py`. \
                 A pattern without `/` matches at any depth. Returns the matching paths.",
                object(
                    json!({
                        "glob_pattern": {"type": "string", "description": "Glob pattern to match file paths against."},
                        "target_directory": {"type": "string", "description": "Directory to search in; defaults to the workspace root."}
                    }),
                    &["glob_pattern"],
                ),
            ),
            Builtin::Grep => (
                "Search file contents with a regular expression (ripgrep syntax; escape literal braces \
                 and parentheses). Respects .gitignore. `output_mode`: `content` (matching lines with \
                 line numbers, the default), `files_with_matches` (paths only) or `count`.",
                object(
                    json!({
                        "pattern": {"type": "string", "description": "Regular expression to search for."},
                        "path": {"type": "string", "description": "File or directory to search; defaults to the workspace root."},
                        "glob": {"type": "string", "description": "Only search files matching this glob, e.g. `*.ts` or `src/**/*.rs`."},
                        "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                        "-A": {"type": "integer", "minimum": 0, "description": "Lines of context after each match (content mode)."},
                        "-B": {"type": "integer", "minimum": 0, "description": "Lines of context before each match (content mode)."},
                        "-C": {"type": "integer", "minimum": 0, "description": "Lines of context before and after each match (content mode)."},
                        "case_insensitive": {"type": "boolean", "description": "Ignore case."},
                        "type": {"type": "string", "description": "ripgrep file type, e.g. `rust`, `py`, `js`."},
                        "head_limit": {"type": "integer", "minimum": 1, "description": "Return at most this many lines / files / counts."},
                        "multiline": {"type": "boolean", "description": "Let `.` match newlines and patterns span lines."}
                    }),
                    &["pattern"],
                ),
            ),
            Builtin::SearchReplace => (
                "Edit a file by replacing an exact string. `old_string` must match the file exactly \
                 (whitespace and indentation included) and occur once, unless `replace_all` is true: \
                 include enough surrounding lines to make it unique. An empty `old_string` creates a \
                 new file containing `new_string`. Read the file before editing it.",
                object(
                    json!({
                        "path": {"type": "string", "description": "File to edit."},
                        "old_string": {"type": "string", "description": "Exact text to replace."},
                        "new_string": {"type": "string", "description": "Replacement text (must differ from old_string)."},
                        "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."}
                    }),
                    &["path", "old_string", "new_string"],
                ),
            ),
            Builtin::Write => (
                "Create a file, or overwrite one, with the given full contents. Prefer search_replace \
                 for changing part of an existing file.",
                object(
                    json!({
                        "path": {"type": "string", "description": "File to write."},
                        "contents": {"type": "string", "description": "The complete new contents of the file."}
                    }),
                    &["path", "contents"],
                ),
            ),
            Builtin::DeleteFile => (
                "Delete a file.",
                object(
                    json!({"path": {"type": "string", "description": "File to delete."}}),
                    &["path"],
                ),
            ),
            Builtin::RunTerminalCmd => (
                "Run a shell command on the user's machine and return its output and exit code. The \
                 shell is non-interactive (stdin is closed) and the command is stopped at its timeout: \
                 do not start servers, watchers or anything that waits for input. Use \
                 `working_directory` rather than `cd`.",
                object(
                    json!({
                        "command": {"type": "string", "description": "The command line to run."},
                        "working_directory": {"type": "string", "description": "Directory to run in; defaults to the workspace root."},
                        "timeout": {"type": "integer", "minimum": 1, "maximum": SHELL_MAX_TIMEOUT_SECS, "description": format!("Timeout in seconds (default {SHELL_DEFAULT_TIMEOUT_SECS}).")},
                        "explanation": {"type": "string", "description": "One sentence on why the command is run, shown to the user."}
                    }),
                    &["command"],
                ),
            ),
            Builtin::ReadLints => (
                "Read the diagnostics (errors and warnings from linters and compilers) that the editor \
                 reports for files. Use it after editing.",
                object(
                    json!({
                        "paths": {"type": "array", "items": {"type": "string"}, "description": "Files or directories; defaults to the workspace root."}
                    }),
                    &[],
                ),
            ),
            Builtin::TodoWrite => (
                "Create or update the todo list that tracks a multi-step task and is shown to the user. \
                 Keep exactly one item `in_progress` while working. With `merge` true, items update \
                 the existing ones by id and new ids are appended; with `merge` false the list is replaced.",
                object(
                    json!({
                        "merge": {"type": "boolean", "description": "Merge into the existing list (true) or replace it (false)."},
                        "todos": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "id": {"type": "string"},
                                    "content": {"type": "string", "description": "What to do (may be omitted when merging a status change)."},
                                    "status": {"type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"]}
                                },
                                "required": ["id", "status"]
                            }
                        }
                    }),
                    &["merge", "todos"],
                ),
            ),
            Builtin::WebFetch => (
                "Fetch a web page or file over HTTP(S) and return its content as text.",
                object(
                    json!({"url": {"type": "string", "description": "The http:// or https:// URL to fetch."}}),
                    &["url"],
                ),
            ),
            Builtin::AskQuestion => (
                "Ask the user one or more questions and wait for the answers. Use it only when you \
                 cannot proceed without the user's decision; offer options when the answer is a choice.",
                object(
                    json!({
                        "title": {"type": "string", "description": "Short title for the questions."},
                        "questions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "id": {"type": "string"},
                                    "prompt": {"type": "string", "description": "The question."},
                                    "options": {"type": "array", "items": {"type": "string"}, "description": "Answers to choose from; omit for a free-form answer."},
                                    "allow_multiple": {"type": "boolean", "description": "Allow choosing several options."}
                                },
                                "required": ["prompt"]
                            }
                        }
                    }),
                    &["questions"],
                ),
            ),
            Builtin::SwitchMode => (
                "Ask the user to switch the conversation to another mode: `agent` (make changes and run \
                 commands), `ask` (read-only answers) or `plan` (research, then write a plan for review). \
                 The user must approve.",
                object(
                    json!({
                        "target_mode_id": {"type": "string", "enum": ["agent", "ask", "plan", "debug"]},
                        "explanation": {"type": "string", "description": "Why the switch helps, shown to the user."}
                    }),
                    &["target_mode_id"],
                ),
            ),
            Builtin::CreatePlan => (
                "Present the implementation plan to the user for review. Write the plan in Markdown: \
                 the goal, the files to change and how, and how to verify. Optionally list its steps as todos.",
                object(
                    json!({
                        "name": {"type": "string", "description": "Short name of the plan."},
                        "overview": {"type": "string", "description": "One or two sentences summarising the plan."},
                        "plan": {"type": "string", "description": "The plan in Markdown."},
                        "todos": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {"id": {"type": "string"}, "content": {"type": "string"}},
                                "required": ["content"]
                            }
                        }
                    }),
                    &["plan"],
                ),
            ),
        };
        ToolSpec {
            name: self.name().to_string(),
            description: description.to_string(),
            parameters,
        }
    }
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_round_trips_through_its_alias_table() {
        for b in ALL {
            assert_eq!(Builtin::from_alias(b.name()), Some(b), "{}", b.name());
            let spec = b.spec();
            assert_eq!(spec.parameters["type"], "object");
            assert!(spec.parameters["properties"].is_object());
            assert!(!spec.description.is_empty());
        }
    }

    #[test]
    fn common_foreign_names_are_understood() {
        let cases = [
            ("Read", Builtin::ReadFile),
            ("view_file", Builtin::ReadFile),
            ("LS", Builtin::ListDir),
            ("Glob", Builtin::GlobFileSearch),
            ("rg", Builtin::Grep),
            ("StrReplace", Builtin::SearchReplace),
            ("str_replace", Builtin::SearchReplace),
            ("Edit", Builtin::SearchReplace),
            ("create_file", Builtin::Write),
            ("remove_file", Builtin::DeleteFile),
            ("Bash", Builtin::RunTerminalCmd),
            ("execute_command", Builtin::RunTerminalCmd),
            ("TodoWrite", Builtin::TodoWrite),
            ("WebFetch", Builtin::WebFetch),
        ];
        for (alias, b) in cases {
            assert_eq!(Builtin::from_alias(alias), Some(b), "{alias}");
        }
        assert_eq!(Builtin::from_alias("teleport"), None);
    }
}
