//! The built-in tools: names, aliases, availability per mode, and the JSON Schemas offered to
//! models (as data, in `catalog.json`). Names and shapes follow Cursor's own agent tools, which models already know.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde::Deserialize;
use serde_json::Value;

use super::args::norm;
use super::call::{Mode, ToolContext};
use crate::provider::ToolSpec;

/// The longest hard timeout and block time a command may ask for, in seconds.
pub(crate) const SHELL_MAX_TIMEOUT_SECS: i64 = 1800;
/// How long a foreground command blocks before it moves to the background, unless
/// `agent.shell_block_secs` says otherwise (Cursor's client uses the same 30 s).
pub(crate) const SHELL_DEFAULT_BLOCK_MS: u32 = 30_000;
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
    WriteShellStdin,
    ReadLints,
    TodoWrite,
    WebFetch,
    AskQuestion,
    SwitchMode,
    CreatePlan,
    Task,
    AwaitSubagent,
}

pub(crate) const ALL: [Builtin; 17] = [
    Builtin::ReadFile,
    Builtin::ListDir,
    Builtin::GlobFileSearch,
    Builtin::Grep,
    Builtin::SearchReplace,
    Builtin::Write,
    Builtin::DeleteFile,
    Builtin::RunTerminalCmd,
    Builtin::WriteShellStdin,
    Builtin::ReadLints,
    Builtin::TodoWrite,
    Builtin::WebFetch,
    Builtin::AskQuestion,
    Builtin::SwitchMode,
    Builtin::CreatePlan,
    Builtin::Task,
    Builtin::AwaitSubagent,
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
            Builtin::WriteShellStdin => "write_shell_stdin",
            Builtin::ReadLints => "read_lints",
            Builtin::TodoWrite => "todo_write",
            Builtin::WebFetch => "web_fetch",
            Builtin::AskQuestion => "ask_question",
            Builtin::SwitchMode => "switch_mode",
            Builtin::CreatePlan => "create_plan",
            Builtin::Task => "task",
            Builtin::AwaitSubagent => "await_subagent",
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
            "writeshellstdin" | "writestdin" | "shellstdin" | "sendstdin" | "sendinput" => {
                Builtin::WriteShellStdin
            }
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
            "task" | "subagent" | "runsubagent" | "delegate" | "spawnagent" | "agent" => {
                Builtin::Task
            }
            "awaitsubagent" | "waitsubagent" | "subagentawait" | "waitforsubagent" => {
                Builtin::AwaitSubagent
            }
            _ => return None,
        };
        Some(b)
    }

    /// Changes the workspace: left out of Ask and Plan modes.
    pub(crate) fn writes(self) -> bool {
        matches!(
            self,
            Builtin::SearchReplace
                | Builtin::Write
                | Builtin::DeleteFile
                | Builtin::RunTerminalCmd
                | Builtin::WriteShellStdin
        )
    }

    /// Why this tool cannot be used in this context, or `None` when it can.
    pub(crate) fn unavailable(self, ctx: &ToolContext) -> Option<String> {
        if let Some(why) = self.restricted(ctx) {
            return Some(why);
        }
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
            Builtin::Task | Builtin::AwaitSubagent if !ctx.subagents.enabled => {
                Some("subagents cannot start further subagents at this depth".into())
            }
            Builtin::CreatePlan if mode != Mode::Plan => {
                Some("plans are created in Plan mode; use switch_mode to ask for it".into())
            }
            _ => None,
        }
    }

    /// Why a subagent run may not use this tool: a read-only kind, or a custom subagent's
    /// tool list that leaves it out.
    fn restricted(self, ctx: &ToolContext) -> Option<String> {
        if ctx.readonly && self.writes() {
            return Some("this subagent is read-only".into());
        }
        let allowed = ctx.allowed_tools.as_ref()?;
        let listed = allowed
            .iter()
            .any(|t| Builtin::from_alias(t) == Some(self) || norm(t) == norm(self.name()));
        (!listed).then(|| "it is not among this subagent's tools".into())
    }

    /// The tool as offered to models: its entry in `catalog.json`.
    pub(crate) fn spec(self) -> ToolSpec {
        // Every builtin has an entry: `every_builtin_round_trips_through_its_alias_table` asks
        // each for its spec, and the file is compiled in, so it cannot change after the tests.
        let entry = CATALOG
            .get(self.name())
            .expect("catalog.json has an entry per builtin (checked by the tests)");
        ToolSpec {
            name: self.name().to_string(),
            description: entry.description.clone(),
            parameters: entry.parameters.clone(),
        }
    }
}

/// One tool in `catalog.json`: what models read about it, and its JSON Schema parameters.
#[derive(Deserialize)]
struct CatalogEntry {
    description: String,
    parameters: Value,
}

/// The descriptions and schemas, as data next to the tools; parsed on first use.
static CATALOG: LazyLock<HashMap<String, CatalogEntry>> = LazyLock::new(|| {
    // Compiled in, and parsed by every test that asks for a spec: a broken file fails the
    // tests, never a user.
    serde_json::from_str(include_str!("catalog.json"))
        .expect("catalog.json is valid (checked by the tests)")
});

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

    #[test]
    fn the_catalog_has_exactly_the_builtins_and_their_limits() {
        let names: std::collections::BTreeSet<_> = CATALOG.keys().map(String::as_str).collect();
        let builtins: std::collections::BTreeSet<_> = ALL.iter().map(|b| b.name()).collect();
        assert_eq!(names, builtins);
        let shell = Builtin::RunTerminalCmd.spec().parameters;
        let timeout = &shell["properties"]["timeout"];
        assert_eq!(timeout["maximum"], SHELL_MAX_TIMEOUT_SECS);
        let block = &shell["properties"]["block_until_ms"];
        assert_eq!(block["maximum"], SHELL_MAX_TIMEOUT_SECS * 1000);
        let default = format!("(default {SHELL_DEFAULT_BLOCK_MS} unless configured)");
        assert!(block["description"].as_str().unwrap().contains(&default));
        let lines = format!("up to {READ_DEFAULT_LINES} lines");
        assert!(Builtin::ReadFile.spec().description.contains(&lines));
    }
}
