//! Through the public API: plans from canonical and aliased calls, finishes, errors, and the
//! history round trip (plan → finish → history gives back the name, arguments and text).

use serde_json::{json, Value};

use super::*;
use pb::exec_client_message::Message as Res;
use pb::exec_server_message::Message as Exec;

fn ctx() -> ToolContext {
    ToolContext {
        workspace_root: Some("/w".into()),
        mcp_tools: vec![pb::McpToolDefinition {
            name: "github-create_issue".into(),
            description: "Create an issue".into(),
            provider_identifier: "github".into(),
            tool_name: "create_issue".into(),
            input_schema_json: Some(
                r#"{"type":"object","properties":{"title":{"type":"string"}}}"#.into(),
            ),
            ..Default::default()
        }],
        web_fetch: true,
        mode: pb::AgentMode::Agent as i32,
        command_denylist: vec!["rm -rf".into()],
        terminals_folder: Some("/home/u/.cursor/projects/w/terminals".into()),
        shell_block_ms: None,
        ..Default::default()
    }
}

fn ask_ctx() -> ToolContext {
    ToolContext {
        mode: pb::AgentMode::Ask as i32,
        ..ctx()
    }
}

fn exec_of(p: &ToolPlan) -> &Exec {
    match p {
        ToolPlan::Exec { exec, .. } => exec,
        other => panic!("expected an exec plan, got {other:?}"),
    }
}

fn planned(name: &str, args: Value) -> ToolPlan {
    plan(&ctx(), "c1", name, &args).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn err(name: &str, args: Value) -> String {
    plan(&ctx(), "c1", name, &args).expect_err(name).to_string()
}

#[test]
fn read_plans_from_canonical_and_aliased_calls() {
    for (name, args) in [
        (
            "read_file",
            json!({"path": "src/a.rs", "offset": 3, "limit": 5}),
        ),
        (
            "Read",
            json!({"file_path": "/w/src/a.rs", "start_line": 3, "max_lines": "5"}),
        ),
        (
            "view_file",
            json!({"target_file": "./src/a.rs", "offset": 3, "limit": 5}),
        ),
    ] {
        let p = planned(name, args);
        assert_eq!(p.access(), Access::Read);
        let Exec::ReadArgs(r) = exec_of(&p) else {
            panic!("{name}")
        };
        assert_eq!(
            (r.path.as_str(), r.tool_call_id.as_str()),
            ("/w/src/a.rs", "c1")
        );
        let Some(pb::tool_call::Tool::ReadToolCall(t)) = &p.tool_call().tool else {
            panic!()
        };
        let a = t.args.clone().unwrap();
        assert_eq!((a.offset, a.limit), (Some(3), Some(5)));
        assert_eq!(p.tool_call().tool_call_id.as_deref(), Some("c1"));
    }
}

#[test]
fn every_tool_plans_to_its_exec_or_interaction() {
    let cases: Vec<(&str, Value)> = vec![
        ("LS", json!({})),
        ("Glob", json!({"pattern": "**/*.rs", "path": "src"})),
        (
            "rg",
            json!({"pattern": "fn main", "include": ["*.rs", "*.toml"], "-i": true, "output_mode": "files"}),
        ),
        ("delete_file", json!({"path": "x"})),
        ("write", json!({"path": "x", "content": ""})),
        ("Bash", json!({"cmd": "ls", "cwd": "sub", "timeout": 30})),
        ("read_lints", json!({"paths": ["a.rs"]})),
        ("WebFetch", json!({"url": "https://example.com"})),
        ("mcp_github_create_issue", json!({"title": "t"})),
    ];
    for (name, args) in cases {
        let p = planned(name, args);
        match (name, exec_of(&p)) {
            ("LS", Exec::LsArgs(a)) => assert_eq!(a.path, "/w"),
            ("Glob", Exec::GrepArgs(a)) => {
                assert_eq!(
                    (a.pattern.as_str(), a.glob.as_deref(), a.path.as_deref()),
                    ("", Some("**/*.rs"), Some("/w/src"))
                );
                assert_eq!(a.output_mode.as_deref(), Some("files_with_matches"));
            }
            ("rg", Exec::GrepArgs(a)) => {
                assert_eq!(a.glob.as_deref(), Some("{*.rs,*.toml}"));
                assert_eq!(
                    (a.case_insensitive, a.output_mode.as_deref()),
                    (Some(true), Some("files_with_matches"))
                );
            }
            ("delete_file", Exec::DeleteArgs(a)) => {
                assert_eq!(a.path, "/w/x");
                assert_eq!(
                    p.access(),
                    Access::Write {
                        path: "/w/x".into()
                    }
                );
            }
            ("write", Exec::WriteArgs(a)) => {
                assert_eq!((a.path.as_str(), a.file_text.as_str()), ("/w/x", ""))
            }
            ("Bash", Exec::ShellStreamArgs(a)) => {
                assert_eq!(
                    (a.command.as_str(), a.working_directory.as_str(), a.timeout),
                    ("ls", "/w/sub", 30_000)
                );
                assert_eq!(
                    a.hard_timeout,
                    Some(30_000),
                    "the model's timeout is a hard limit"
                );
                assert_eq!(a.timeout_behavior, pb::TimeoutBehavior::Background as i32);
                assert!(a.close_stdin && a.parsing_result.is_some());
                assert_eq!(a.simple_commands, vec!["ls"]);
                assert_eq!(a.admin_command_denylist, ["rm -rf"], "forwarded");
                assert_eq!(p.access(), Access::Exclusive);
            }
            ("read_lints", Exec::DiagnosticsArgs(a)) => assert_eq!(a.path, "/w/a.rs"),
            ("WebFetch", Exec::FetchArgs(a)) => assert_eq!(a.url, "https://example.com"),
            ("mcp_github_create_issue", Exec::McpArgs(a)) => {
                assert_eq!(
                    (
                        a.name.as_str(),
                        a.provider_identifier.as_str(),
                        a.tool_name.as_str()
                    ),
                    ("github-create_issue", "github", "create_issue")
                );
                assert_eq!(
                    a.args["title"].kind,
                    Some(prost_types::value::Kind::StringValue("t".into()))
                );
            }
            (n, e) => panic!("{n}: unexpected exec {e:?}"),
        }
    }
    let p = planned("read_lints", json!({"paths": ["a.rs", "b.rs"]}));
    assert!(matches!(&p, ToolPlan::ExecEach { execs, .. } if execs.len() == 2));
    let p = planned(
        "Edit",
        json!({"filePath": "a.rs", "old_str": "x", "new_str": "y", "replaceAll": true}),
    );
    assert_eq!(
        p.access(),
        Access::Write {
            path: "/w/a.rs".into()
        }
    );
    assert!(
        matches!(&p, ToolPlan::Edit { edit, .. } if edit.replace_all && edit.old_string == "x")
    );
    assert!(matches!(p.read_exec(), Some(Exec::ReadArgs(r)) if r.path == "/w/a.rs"));
    assert!(matches!(
        planned(
            "TodoWrite",
            json!({"merge": false, "todos": [{"id": "1", "content": "a", "status": "pending"}]})
        ),
        ToolPlan::Todos { .. }
    ));
    assert!(matches!(
        planned(
            "ask_question",
            json!({"question": "Which?", "options": ["a", "b"]})
        ),
        ToolPlan::Interaction {
            query: pb::interaction_query::Query::AskQuestionInteractionQuery(_),
            ..
        }
    ));
    assert!(matches!(
        planned("switch_mode", json!({"target_mode_id": "plan"})),
        ToolPlan::Interaction {
            query: pb::interaction_query::Query::SwitchModeRequestQuery(_),
            ..
        }
    ));
}

#[test]
fn invalid_arguments_say_what_is_wrong() {
    assert_eq!(
        err("read_file", json!({})),
        "Invalid arguments for `read_file`: missing required argument `path` (string: the file to read)"
    );
    assert_eq!(
        err("read_file", json!({"path": "a", "limit": 0})),
        "Invalid arguments for `read_file`: `limit` must be between 1 and 2147483647 (got 0)"
    );
    assert!(
        err("search_replace", json!({"path": "a", "old_string": "x"}))
            .contains("missing required argument `new_string`")
    );
    assert!(err(
        "search_replace",
        json!({"path": "a", "old_string": "x", "new_string": "x"})
    )
    .contains("identical"));
    assert!(
        err("grep", json!({"pattern": "x", "output_mode": "everything"}))
            .contains("must be one of content, files_with_matches, count")
    );
    assert!(err("write_shell_stdin", json!({"chars": "y\n"})).contains("`shell_id` is required"));
    assert!(err("web_fetch", json!({"url": "file:///etc/passwd"})).contains("http:// or https://"));
    assert!(err(
        "todo_write",
        json!({"merge": true, "todos": [{"content": "x"}]})
    )
    .contains("no `id`"));
    assert!(err("switch_mode", json!({"target_mode_id": "yolo"})).contains("unknown mode"));
    assert!(err("read_file", json!("{not json")).contains("not valid JSON"));
}

#[test]
fn unknown_tools_list_the_available_ones() {
    let e = plan(&ctx(), "c1", "teleport", &json!({})).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("Unknown tool `teleport`. Available tools: read_file, list_dir,"),
        "{text}"
    );
    assert!(text.contains("mcp_github_create_issue"), "{text}");
    // Loose MCP spellings still resolve.
    assert!(plan(&ctx(), "c1", "mcp__github__create_issue", &json!({})).is_ok());
}

#[test]
fn ask_mode_offers_read_only_tools() {
    let names: Vec<String> = catalog(&ask_ctx()).into_iter().map(|s| s.name).collect();
    for w in [
        "search_replace",
        "write",
        "delete_file",
        "run_terminal_cmd",
        "todo_write",
        "create_plan",
        "mcp_github_create_issue",
    ] {
        assert!(!names.contains(&w.to_string()), "{w} offered in Ask mode");
    }
    for r in [
        "read_file",
        "list_dir",
        "glob_file_search",
        "grep",
        "read_lints",
        "web_fetch",
        "switch_mode",
    ] {
        assert!(names.contains(&r.to_string()), "{r} missing in Ask mode");
    }
    let e = plan(&ask_ctx(), "c1", "Bash", &json!({"command": "rm -rf /"})).unwrap_err();
    assert!(matches!(e, ToolError::NotAvailable { .. }), "{e}");
    let all: Vec<String> = catalog(&ctx()).into_iter().map(|s| s.name).collect();
    assert!(all.contains(&"write".to_string()) && !all.contains(&"create_plan".to_string()));
    let no_fetch = ToolContext {
        web_fetch: false,
        ..ctx()
    };
    assert!(!catalog(&no_fetch).iter().any(|s| s.name == "web_fetch"));
}

fn read_success(content: &str) -> Res {
    Res::ReadResult(pb::ReadResult {
        result: Some(pb::read_result::Result::Success(pb::ReadSuccess {
            path: "/w/a.txt".into(),
            output: Some(pb::read_success::Output::Content(content.into())),
            ..Default::default()
        })),
    })
}

fn write_ok() -> Res {
    Res::WriteResult(pb::WriteResult {
        result: Some(pb::write_result::Result::Success(pb::WriteSuccess {
            path: "/w/a.txt".into(),
            ..Default::default()
        })),
    })
}

fn edit(old: &str, new: &str, all: bool) -> ToolPlan {
    planned(
        "search_replace",
        json!({"path": "/w/a.txt", "old_string": old, "new_string": new, "replace_all": all}),
    )
}

#[test]
fn edits_apply_or_explain_why_not() {
    let file = "alpha\nbeta\nalpha\n";
    let p = edit("beta", "BETA", false);
    let w = apply_edit(&p, &[read_success(file)], None).unwrap();
    assert!(
        matches!(&w.exec, Exec::WriteArgs(a) if a.file_text == "alpha\nBETA\nalpha\n" && a.path == "/w/a.txt")
    );
    let o = finish_edit(&p, &w, &[write_ok()], None);
    assert!(!o.is_error);
    assert_eq!(o.content, "Edited /w/a.txt: 1 lines added, 1 removed.");
    let Some(pb::tool_call::Tool::EditToolCall(t)) = &o.tool_call.tool else {
        panic!()
    };
    let Some(pb::edit_result::Result::Success(s)) =
        t.result.as_ref().and_then(|r| r.result.clone())
    else {
        panic!()
    };
    assert_eq!(
        s.diff_string.as_deref(),
        Some("--- a/w/a.txt\n+++ b/w/a.txt\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n alpha\n")
    );

    let o = apply_edit(&edit("gamma", "x", false), &[read_success(file)], None).unwrap_err();
    assert!(
        o.is_error && o.content.starts_with("old_string not found in /w/a.txt"),
        "{}",
        o.content
    );
    let o = apply_edit(&edit("alpha", "x", false), &[read_success(file)], None).unwrap_err();
    assert_eq!(
        o.content,
        "old_string matches 2 times in /w/a.txt; add more context or set replace_all"
    );
    let w = apply_edit(&edit("alpha", "x", true), &[read_success(file)], None).unwrap();
    assert_eq!(w.after(), "x\nbeta\nx\n");

    let missing = Res::ReadResult(pb::ReadResult {
        result: Some(pb::read_result::Result::FileNotFound(
            pb::ReadFileNotFound {
                path: "/w/a.txt".into(),
            },
        )),
    });
    let o = apply_edit(&edit("a", "b", false), std::slice::from_ref(&missing), None).unwrap_err();
    assert!(
        o.is_error && o.content.starts_with("File not found: /w/a.txt"),
        "{}",
        o.content
    );
    // An empty old_string on a missing file creates it.
    let p = edit("", "new\n", false);
    let w = apply_edit(&p, &[missing], None).unwrap();
    assert_eq!(
        finish_edit(&p, &w, &[write_ok()], None).content,
        "Created /w/a.txt (1 lines)."
    );
    // A refused write is an error for the model.
    let denied = Res::WriteResult(pb::WriteResult {
        result: Some(pb::write_result::Result::PermissionDenied(
            pb::WritePermissionDenied {
                path: "/w/a.txt".into(),
                error: "EACCES".into(),
                ..Default::default()
            },
        )),
    });
    let p = edit("beta", "b", false);
    let w = apply_edit(&p, &[read_success(file)], None).unwrap();
    let o = finish_edit(&p, &w, &[denied], None);
    assert_eq!(
        (o.content.as_str(), o.is_error),
        ("Permission denied writing /w/a.txt: EACCES", true)
    );
}

fn stream(event: pb::shell_stream::Event) -> Res {
    Res::ShellStream(pb::ShellStream { event: Some(event) })
}

fn shell_run(events: Vec<Res>) -> ToolOutcome {
    let p = planned(
        "run_terminal_cmd",
        json!({"command": "cargo test", "timeout": 60}),
    );
    finish_exec(&ctx(), &p, &events, None)
}

#[test]
fn shell_output_comes_back_with_its_exit_code() {
    use pb::shell_stream::Event as E;
    let o = shell_run(vec![
        stream(E::Start(Default::default())),
        stream(E::Stdout(pb::ShellStreamStdout {
            data: "running\n".into(),
        })),
        stream(E::Stderr(pb::ShellStreamStderr {
            data: "warning: x\n".into(),
        })),
        stream(E::Stdout(pb::ShellStreamStdout {
            data: "FAILED\n".into(),
        })),
        stream(E::Exit(pb::ShellStreamExit {
            code: 101,
            ..Default::default()
        })),
    ]);
    // A failing command is an ordinary result: the model reads it and decides.
    assert!(!o.is_error);
    assert_eq!(o.content, "running\nwarning: x\nFAILED\n[exit code: 101]");
    let Some(pb::tool_call::Tool::ShellToolCall(t)) = &o.tool_call.tool else {
        panic!()
    };
    let Some(pb::shell_result::Result::Failure(f)) =
        t.result.as_ref().and_then(|r| r.result.clone())
    else {
        panic!()
    };
    assert_eq!(
        (f.exit_code, f.stdout.as_str(), f.stderr.as_str()),
        (101, "running\nFAILED\n", "warning: x\n")
    );

    let big = "x".repeat(100_000);
    let o = shell_run(vec![
        stream(E::Stdout(pb::ShellStreamStdout {
            data: format!("HEAD{big}TAIL"),
        })),
        stream(E::Exit(pb::ShellStreamExit::default())),
    ]);
    assert!(o.content.starts_with("HEAD") && o.content.contains("TAIL\n[exit code: 0]"));
    assert!(
        o.content.contains("bytes elided ...]") && o.content.len() < 31_000,
        "{}",
        o.content.len()
    );

    let o = shell_run(vec![stream(E::Rejected(pb::ShellRejected {
        reason: "user said no".into(),
        ..Default::default()
    }))]);
    assert!(o.is_error && o.content.contains("rejected: user said no"));
    let o = shell_run(vec![stream(E::Exit(pb::ShellStreamExit {
        code: 1,
        aborted: true,
        abort_reason: Some(pb::ShellAbortReason::Timeout as i32),
        ..Default::default()
    }))]);
    assert!(
        o.is_error && o.content.contains("timed out after 60s"),
        "{}",
        o.content
    );
    let p = planned("run_terminal_cmd", json!({"command": "ls"}));
    let o = finish_exec(&ctx(), &p, &[], Some("spawn ENOENT"));
    assert!(o.is_error && o.content.contains("spawn ENOENT"));
}

#[test]
fn a_background_command_is_spawned_and_names_its_shell_pid_and_output_file() {
    let p = planned(
        "run_terminal_cmd",
        json!({"command": "npm start", "is_background": true, "cwd": "web"}),
    );
    let Exec::BackgroundShellSpawnArgs(a) = exec_of(&p) else {
        panic!("{p:?}")
    };
    assert_eq!(
        (
            a.command.as_str(),
            a.working_directory.as_str(),
            a.tool_call_id.as_str()
        ),
        ("npm start", "/w/web", "c1")
    );
    assert!(a.enable_write_shell_stdin_tool && a.parsing_result.is_some());
    assert_eq!(a.admin_command_denylist, ["rm -rf"]);
    let spawned = Res::BackgroundShellSpawnResult(pb::BackgroundShellSpawnResult {
        result: Some(pb::background_shell_spawn_result::Result::Success(
            pb::BackgroundShellSpawnSuccess {
                shell_id: 7,
                command: "npm start".into(),
                working_directory: "/w/web".into(),
                pid: Some(4242),
            },
        )),
    });
    let o = finish_exec(&ctx(), &p, std::slice::from_ref(&spawned), None);
    assert!(!o.is_error, "{}", o.content);
    for part in [
        "Started in the background",
        "shell 7, pid 4242",
        "/home/u/.cursor/projects/w/terminals/7.txt",
        "`kill 4242`",
    ] {
        assert!(o.content.contains(part), "{part}: {}", o.content);
    }
    // The UI gets Cursor's typed shell call: a background result with the shell id.
    let Some(pb::tool_call::Tool::ShellToolCall(t)) = &o.tool_call.tool else {
        panic!()
    };
    assert!(t.args.as_ref().unwrap().is_background);
    let r = t.result.as_ref().unwrap();
    assert_eq!((r.is_background, r.pid), (Some(true), Some(4242)));
    let Some(pb::shell_result::Result::Success(s)) = &r.result else {
        panic!()
    };
    assert_eq!(s.shell_id, Some(7));
    // Rebuilt from the checkpoint, the model reads the same and the call keeps its flag.
    let (name, args, text, _) = history_from_tool_call(&o.tool_call).unwrap();
    assert_eq!(
        (name.as_str(), text.as_str()),
        ("run_terminal_cmd", o.content.as_str())
    );
    assert_eq!(args["is_background"], true);
    assert!(!o.content.contains("timeout"), "{}", o.content);

    // A timeout the spawn cannot carry is not dropped silently: the model hears of it.
    let timed = planned(
        "run_terminal_cmd",
        json!({"command": "npm start", "is_background": true, "timeout": 60}),
    );
    let o = finish_exec(&ctx(), &timed, &[spawned], None);
    assert!(
        o.content.contains("The timeout was not applied"),
        "{}",
        o.content
    );

    let refused = Res::BackgroundShellSpawnResult(pb::BackgroundShellSpawnResult {
        result: Some(pb::background_shell_spawn_result::Result::Error(
            pb::BackgroundShellSpawnError {
                error: "ENOENT".into(),
                ..Default::default()
            },
        )),
    });
    let o = finish_exec(&ctx(), &p, &[refused], None);
    assert!(o.is_error && o.content.contains("ENOENT"), "{}", o.content);
}

#[test]
fn a_foreground_command_past_its_block_time_moves_to_the_background() {
    use pb::shell_stream::Event as E;
    let block = ToolContext {
        shell_block_ms: Some(1500),
        ..ctx()
    };
    let p = plan(
        &block,
        "c1",
        "run_terminal_cmd",
        &json!({"command": "make"}),
    )
    .unwrap();
    let Exec::ShellStreamArgs(a) = exec_of(&p) else {
        panic!()
    };
    assert_eq!(
        (a.timeout, a.hard_timeout, a.timeout_behavior),
        (1500, None, pb::TimeoutBehavior::Background as i32)
    );
    let asked = plan(
        &block,
        "c1",
        "run_terminal_cmd",
        &json!({"command": "make", "block_until_ms": 60000, "timeout": 600}),
    )
    .unwrap();
    let Exec::ShellStreamArgs(a) = exec_of(&asked) else {
        panic!()
    };
    assert_eq!((a.timeout, a.hard_timeout), (60_000, Some(600_000)));
    let o = finish_exec(
        &block,
        &p,
        &[
            stream(E::Stdout(pb::ShellStreamStdout {
                data: "compiling\n".into(),
            })),
            stream(E::Backgrounded(pb::ShellStreamBackgrounded {
                shell_id: 3,
                pid: Some(99),
                ms_to_wait: Some(1500),
                reason: Some(pb::ShellBackgroundReason::Timeout as i32),
                ..Default::default()
            })),
        ],
        None,
    );
    assert!(!o.is_error);
    assert!(
        o.content.starts_with("compiling\n[The command was still running after 1s and was moved to the background: shell 3, pid 99; its output goes to /home/u/.cursor/projects/w/terminals/3.txt"),
        "{}",
        o.content
    );
    let user = finish_exec(
        &block,
        &p,
        &[stream(E::Backgrounded(pb::ShellStreamBackgrounded {
            shell_id: 4,
            reason: Some(pb::ShellBackgroundReason::UserRequest as i32),
            ..Default::default()
        }))],
        None,
    );
    assert!(
        user.content
            .contains("[The user moved the command to the background: shell 4;"),
        "{}",
        user.content
    );
    // The client ends a command its hard timeout killed without an exit event.
    let killed = finish_exec(
        &block,
        &asked,
        &[stream(E::Stdout(pb::ShellStreamStdout {
            data: "half\n".into(),
        }))],
        None,
    );
    assert!(killed.is_error);
    assert_eq!(
        killed.content,
        "half\n[The command timed out after 600s and was stopped.]"
    );
}

#[test]
fn stdin_goes_to_a_background_shell() {
    let p = planned("write_shell_stdin", json!({"shell_id": 7, "chars": "y\n"}));
    let Exec::WriteShellStdinArgs(a) = exec_of(&p) else {
        panic!()
    };
    assert_eq!((a.shell_id, a.chars.as_str()), (7, "y\n"));
    assert_eq!(p.access(), Access::Exclusive);
    let ok = Res::WriteShellStdinResult(pb::WriteShellStdinResult {
        result: Some(pb::write_shell_stdin_result::Result::Success(
            pb::WriteShellStdinSuccess {
                shell_id: 7,
                terminal_file_length_before_input_written: 120,
            },
        )),
    });
    let o = finish_exec(&ctx(), &p, &[ok], None);
    assert!(
        !o.is_error && o.content.contains("120 bytes"),
        "{}",
        o.content
    );
    let (name, args, text, _) = history_from_tool_call(&o.tool_call).unwrap();
    assert_eq!(
        (name.as_str(), args["shell_id"].as_u64()),
        ("write_shell_stdin", Some(7))
    );
    assert_eq!(text, o.content);
    let o = finish_exec(&ctx(), &p, &[], Some("no such shell"));
    assert!(
        o.is_error && o.content.contains("no such shell"),
        "{}",
        o.content
    );
    // Ask mode offers neither this nor the shell.
    assert!(plan(
        &ask_ctx(),
        "c1",
        "write_shell_stdin",
        &json!({"shell_id": 1, "chars": "x"})
    )
    .is_err());
}

#[test]
fn shell_deltas_and_final_results() {
    use pb::shell_stream::Event as E;
    let out = pb::ShellStream {
        event: Some(E::Stdout(pb::ShellStreamStdout { data: "hi".into() })),
    };
    let d = shell_delta(&out).unwrap();
    assert!(matches!(
        d.delta,
        Some(pb::tool_call_delta::Delta::ShellToolCallDelta(pb::ShellToolCallDelta {
            delta: Some(pb::shell_tool_call_delta::Delta::Stdout(ref s))
        })) if s.content == "hi"
    ));
    assert!(shell_delta(&pb::ShellStream {
        event: Some(E::Exit(Default::default()))
    })
    .is_none());
    assert!(!result_is_final(&Res::ShellStream(out)));
    assert!(result_is_final(&stream(E::Exit(Default::default()))));
    assert!(result_is_final(&read_success("")));
}

#[test]
fn error_outcomes_keep_the_tool_kind() {
    let p = planned("read_file", json!({"path": "a"}));
    let o = error_outcome(p.tool_call().clone(), "the client did not answer".into());
    assert!(o.is_error);
    assert_eq!(o.content, "the client did not answer");
    assert!(matches!(
        o.tool_call.tool,
        Some(pb::tool_call::Tool::ReadToolCall(_))
    ));
}

#[test]
fn todos_and_interactions_finish() {
    let p = planned(
        "todo_write",
        json!({"merge": false, "todos": [{"id": "1", "content": "a", "status": "in_progress"}]}),
    );
    let (list, o) = apply_todos(&p, &[], 7);
    assert_eq!(list.len(), 1);
    assert_eq!(
        o.content,
        "Todo list updated (1 items):\n- [in_progress] a (id: 1)"
    );

    let p = planned(
        "ask_question",
        json!({"questions": [{"prompt": "Which DB?", "options": ["sqlite", "postgres"]}]}),
    );
    let response = pb::InteractionResponse {
        id: 4,
        result: Some(
            pb::interaction_response::Result::AskQuestionInteractionResponse(
                pb::AskQuestionInteractionResponse {
                    result: Some(pb::AskQuestionResult {
                        result: Some(pb::ask_question_result::Result::Success(
                            pb::AskQuestionSuccess {
                                answers: vec![pb::ask_question_success::Answer {
                                    question_id: "q1".into(),
                                    selected_option_ids: vec!["2".into()],
                                    freeform_text: String::new(),
                                }],
                            },
                        )),
                    }),
                },
            ),
        ),
    };
    let o = finish_interaction(&ctx(), &p, &response);
    assert_eq!(o.content, "The user answered:\nQ: Which DB?\nA: postgres");

    let p = planned(
        "switch_mode",
        json!({"target_mode_id": "Plan", "explanation": "big change"}),
    );
    let approved = pb::InteractionResponse {
        id: 5,
        result: Some(pb::interaction_response::Result::SwitchModeRequestResponse(
            pb::SwitchModeRequestResponse {
                result: Some(pb::switch_mode_request_response::Result::Approved(
                    Default::default(),
                )),
            },
        )),
    };
    assert_eq!(
        approved_mode(&p, &approved),
        Some(pb::AgentMode::Plan as i32)
    );
    let o = finish_interaction(&ctx(), &p, &approved);
    assert_eq!(o.content, "The user approved switching to plan mode.");
    // A mismatched answer is an error, not a crash.
    assert!(finish_interaction(&ctx(), &p, &response).is_error);
}

/// plan → finish → history gives back the same name, arguments and text.
fn round_trip(name: &str, args: Value, outcome: &ToolOutcome) {
    let (n, a, text, is_error) = history_from_tool_call(&outcome.tool_call).expect("expressible");
    assert_eq!(n, name);
    assert_eq!(a, args);
    assert_eq!(text, outcome.content);
    assert_eq!(is_error, outcome.is_error);
}

#[test]
fn history_round_trips() {
    let args = json!({"path": "/w/a.txt", "offset": 2, "limit": 1});
    let o = finish_exec(
        &ctx(),
        &planned("read_file", args.clone()),
        &[read_success("1\n2\n3\n")],
        None,
    );
    assert!(o.content.starts_with("     2\t2\n"));
    round_trip("read_file", args, &o);

    let args = json!({"command": "make", "working_directory": "/w/sub", "timeout": 30});
    let exit = Res::ShellStream(pb::ShellStream {
        event: Some(pb::shell_stream::Event::Exit(pb::ShellStreamExit {
            code: 2,
            ..Default::default()
        })),
    });
    let o = finish_exec(
        &ctx(),
        &planned("run_terminal_cmd", args.clone()),
        &[exit],
        None,
    );
    round_trip("run_terminal_cmd", args, &o);

    let args = json!({"path": "/w/a.txt", "old_string": "beta\n", "new_string": "BETA\n"});
    let p = planned("search_replace", args.clone());
    let w = apply_edit(&p, &[read_success("alpha\nbeta\ngamma\n")], None).unwrap();
    round_trip(
        "search_replace",
        args,
        &finish_edit(&p, &w, &[write_ok()], None),
    );

    let args = json!({"path": "/w/new.txt", "contents": "hello\n"});
    round_trip(
        "write",
        args.clone(),
        &finish_exec(&ctx(), &planned("write", args), &[write_ok()], None),
    );

    let args = json!({"pattern": "fn", "path": "/w/src", "glob": "*.rs", "output_mode": "count", "-C": 2, "case_insensitive": true});
    let grep = Res::GrepResult(pb::GrepResult {
        result: Some(pb::grep_result::Result::Success(pb::GrepSuccess {
            pattern: "fn".into(),
            workspace_results: [(
                "/w".to_string(),
                pb::GrepUnionResult {
                    result: Some(pb::grep_union_result::Result::Count(pb::GrepCountResult {
                        counts: vec![pb::GrepFileCount {
                            file: "src/a.rs".into(),
                            count: 3,
                        }],
                        total_files: 1,
                        total_matches: 3,
                        ..Default::default()
                    })),
                },
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        })),
    });
    let o = finish_exec(&ctx(), &planned("grep", args.clone()), &[grep], None);
    assert_eq!(o.content, "src/a.rs:3\nTotal: 3 matches in 1 files");
    round_trip("grep", args, &o);

    let args = json!({"title": "hi"});
    let mcp_ok = Res::McpResult(pb::McpResult {
        result: Some(pb::mcp_result::Result::Success(pb::McpSuccess {
            content: vec![pb::McpToolResultContentItem {
                content: Some(pb::mcp_tool_result_content_item::Content::Text(
                    pb::McpTextContent {
                        text: "created #1".into(),
                        output_location: None,
                    },
                )),
            }],
            ..Default::default()
        })),
    });
    let o = finish_exec(
        &ctx(),
        &planned("mcp_github_create_issue", args.clone()),
        &[mcp_ok],
        None,
    );
    assert_eq!(o.content, "created #1");
    round_trip("mcp_github_create_issue", args, &o);

    let args = json!({"merge": true, "todos": [{"id": "1", "content": "", "status": "completed"}]});
    let current = vec![pb::TodoItem {
        id: "1".into(),
        content: "a".into(),
        status: 1,
        ..Default::default()
    }];
    let (_, o) = apply_todos(&planned("todo_write", args.clone()), &current, 1);
    round_trip("todo_write", args, &o);

    // Kinds our catalogue cannot express are left out.
    let sem = pb::ToolCall {
        tool: Some(pb::tool_call::Tool::SemSearchToolCall(Default::default())),
        ..Default::default()
    };
    assert!(history_from_tool_call(&sem).is_none());
}

#[test]
fn paths_resolve_against_the_workspace() {
    let c = ctx();
    assert_eq!(c.resolve_path("src/a.rs"), "/w/src/a.rs");
    assert_eq!(c.resolve_path("./src/a.rs"), "/w/src/a.rs");
    assert_eq!(c.resolve_path("."), "/w");
    assert_eq!(c.resolve_path("/etc/hosts"), "/etc/hosts");
    assert_eq!(c.resolve_path("file:///x/y"), "/x/y");
    let win = ToolContext {
        workspace_root: Some("C:\\proj\\".into()),
        ..ctx()
    };
    assert_eq!(win.resolve_path("src\\a.rs"), "C:\\proj\\src\\a.rs");
    assert_eq!(win.resolve_path("D:/x"), "D:/x");
    let none = ToolContext {
        workspace_root: None,
        ..ctx()
    };
    assert_eq!(none.resolve_path("a.rs"), "a.rs");
    assert!(plan(&none, "c", "list_dir", &json!({})).is_err());
}

#[test]
fn placeholders_pick_the_tool_kind() {
    assert!(matches!(
        placeholder(&ctx(), "c", "Bash").and_then(|t| t.tool),
        Some(pb::tool_call::Tool::ShellToolCall(_))
    ));
    assert!(matches!(
        placeholder(&ctx(), "c", "mcp_github_create_issue").and_then(|t| t.tool),
        Some(pb::tool_call::Tool::McpToolCall(_))
    ));
    assert!(placeholder(&ctx(), "c", "nope").is_none());
}

fn task_ctx() -> ToolContext {
    ToolContext {
        subagents: SubagentOptions {
            enabled: true,
            custom: vec![pb::CustomSubagent {
                name: "reviewer".into(),
                description: "Reviews diffs".into(),
                model: "byok-small".into(),
                ..Default::default()
            }],
            parent_model_id: "byok-parent".into(),
            overrides: vec![pb::SubagentModelOverride {
                subagent_type: "shell".into(),
                selection: Some(pb::subagent_model_override::Selection::Model(
                    pb::RequestedModel {
                        model_id: "byok-shell".into(),
                        ..Default::default()
                    },
                )),
            }],
            selected_models: Vec::new(),
            parent_conversation_id: "conv-p".into(),
            selected_context: Some(pb::SelectedContext::default()),
            model_names: vec![
                ("My Small".into(), "byok-small".into()),
                ("small".into(), "byok-small".into()),
                ("byok-small".into(), "byok-small".into()),
            ],
        },
        ..ctx()
    }
}

fn subagent_args(p: &ToolPlan) -> &pb::SubagentArgs {
    match exec_of(p) {
        Exec::SubagentArgs(a) => a,
        other => panic!("not subagent_args: {other:?}"),
    }
}

#[test]
fn task_sends_subagent_args_with_the_kinds_model_and_readonly_flag() {
    let c = task_ctx();
    let explore = plan(
        &c,
        "t1",
        "Task",
        &json!({"prompt": "Find X", "subagent_type": "explore", "description": "find"}),
    )
    .unwrap();
    let a = subagent_args(&explore);
    assert_eq!(
        (a.tool_call_id.as_str(), a.subagent_type.as_str()),
        ("t1", "explore")
    );
    assert_eq!(a.model_id, "byok-parent");
    assert!(a.readonly, "explore only looks");
    assert_eq!(a.parent_conversation_id.as_deref(), Some("conv-p"));
    assert_eq!(a.run_in_background, Some(false));
    assert!(
        a.selected_context.is_some(),
        "the turn's attachments go along"
    );
    assert!(matches!(
        explore.tool_call().tool,
        Some(pb::tool_call::Tool::TaskToolCall(_))
    ));
    let custom = plan(
        &c,
        "t2",
        "task",
        &json!({"prompt": "Review", "subagent_type": "Reviewer", "run_in_background": true}),
    )
    .unwrap();
    let a = subagent_args(&custom);
    assert_eq!(
        (a.subagent_type.as_str(), a.model_id.as_str()),
        ("reviewer", "byok-small")
    );
    assert!(!a.readonly);
    assert_eq!(a.run_in_background, Some(true));
    let shell = plan(
        &c,
        "t3",
        "task",
        &json!({"prompt": "Run tests", "subagent_type": "bash"}),
    )
    .unwrap();
    assert_eq!(subagent_args(&shell).model_id, "byok-shell");
    // A custom subagent defined as a background one runs in the background, whatever the call.
    let mut bg = task_ctx();
    bg.subagents.custom[0].is_background = true;
    let watcher = plan(
        &bg,
        "t5",
        "task",
        &json!({"prompt": "Watch", "subagent_type": "reviewer", "run_in_background": false}),
    )
    .unwrap();
    assert_eq!(subagent_args(&watcher).run_in_background, Some(true));
    let e = plan(
        &c,
        "t4",
        "task",
        &json!({"prompt": "x", "subagent_type": "wizard"}),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("general, explore, shell, debug, reviewer"),
        "{e}"
    );
}

#[test]
fn task_results_reach_the_model_and_history() {
    let c = task_ctx();
    let p = plan(
        &c,
        "t1",
        "task",
        &json!({"prompt": "Find X", "description": "find"}),
    )
    .unwrap();
    let ok = Res::SubagentResult(pb::SubagentResult {
        result: Some(pb::subagent_result::Result::Success(pb::SubagentSuccess {
            agent_id: "ag-1".into(),
            final_message: Some("X is in src/x.rs".into()),
            tool_call_count: 3,
            ..Default::default()
        })),
    });
    let o = finish_exec(&ctx(), &p, &[ok], None);
    assert!(!o.is_error);
    assert!(
        o.content.contains("ag-1") && o.content.contains("3 tool calls"),
        "{}",
        o.content
    );
    assert!(o.content.ends_with("X is in src/x.rs"), "{}", o.content);
    let (name, args, text, _) = history_from_tool_call(&o.tool_call).unwrap();
    assert_eq!(
        (name.as_str(), args["prompt"].as_str()),
        ("task", Some("Find X"))
    );
    assert_eq!(text, o.content);
    let failed = Res::SubagentResult(pb::SubagentResult {
        result: Some(pb::subagent_result::Result::Error(pb::SubagentError {
            agent_id: None,
            error: "model refused".into(),
        })),
    });
    let o = finish_exec(&ctx(), &p, &[failed], None);
    assert!(
        o.is_error && o.content.contains("model refused"),
        "{}",
        o.content
    );
}

#[test]
fn subagent_limits_shape_the_catalogue() {
    let names = |c: &ToolContext| catalog_names(c);
    assert!(
        !names(&ctx()).contains(&"task".to_string()),
        "off unless enabled"
    );
    assert!(names(&task_ctx()).contains(&"task".to_string()));
    let readonly = ToolContext {
        readonly: true,
        ..task_ctx()
    };
    let n = names(&readonly);
    for gone in ["write", "search_replace", "delete_file", "run_terminal_cmd"] {
        assert!(!n.contains(&gone.to_string()), "{gone} in {n:?}");
    }
    assert!(n.contains(&"read_file".to_string()));
    assert!(plan(&readonly, "c", "Bash", &json!({"command": "ls"})).is_err());
    let listed = ToolContext {
        allowed_tools: Some(vec!["Read".into(), "Grep".into()]),
        ..ctx()
    };
    assert_eq!(
        names(&listed)
            .into_iter()
            .filter(|n| !n.starts_with("mcp"))
            .collect::<Vec<_>>(),
        vec!["read_file", "grep"]
    );
}

#[test]
fn await_subagent_sends_subagent_await_args_and_reports_what_it_found() {
    let c = task_ctx();
    let p = plan(
        &c,
        "w1",
        "await_subagent",
        &json!({"agent_id": "ag-1", "timeout": 5}),
    )
    .unwrap();
    match exec_of(&p) {
        Exec::SubagentAwaitArgs(a) => {
            assert_eq!((a.agent_id.as_str(), a.timeout_ms), ("ag-1", 5000))
        }
        other => panic!("{other:?}"),
    }
    use pb::subagent_await_result::Result as A;
    let answer = |r: A| {
        finish_exec(
            &ctx(),
            &p,
            &[Res::SubagentAwaitResult(pb::SubagentAwaitResult {
                result: Some(r),
            })],
            None,
        )
    };
    let running = answer(A::StillRunning(pb::SubagentAwaitStillRunning {
        agent_id: "ag-1".into(),
        transcript_path: None,
    }));
    assert!(
        !running.is_error && running.content.contains("running in the background"),
        "{}",
        running.content
    );
    let done = answer(A::Complete(pb::SubagentAwaitComplete {
        agent_id: "ag-1".into(),
        final_message: Some("All green.".into()),
        tool_call_count: 2,
        transcript_path: None,
    }));
    assert!(done.content.ends_with("All green."), "{}", done.content);
    let (name, args, text, _) = history_from_tool_call(&done.tool_call).unwrap();
    assert_eq!(
        (name.as_str(), args["agent_id"].as_str()),
        ("await_subagent", Some("ag-1"))
    );
    assert_eq!(text, done.content);
    let missing = answer(A::NotFound(pb::SubagentAwaitNotFound {
        agent_id: "ag-9".into(),
    }));
    assert!(missing.is_error && missing.content.contains("ag-9"));
}

#[test]
fn a_subagents_model_named_by_display_name_or_alias_is_ours() {
    let mut c = task_ctx();
    for (given, want) in [
        ("My Small", "byok-small"),
        ("my small", "byok-small"),
        ("small", "byok-small"),
        ("byok-small", "byok-small"),
    ] {
        c.subagents.custom[0].model = given.into();
        let p = plan(
            &c,
            "t1",
            "task",
            &json!({"prompt": "Review", "subagent_type": "reviewer"}),
        )
        .unwrap();
        assert_eq!(subagent_args(&p).model_id, want, "{given}");
    }
    // Neither ours nor offered by the client: a tool error the parent model reads, no child
    // (it would carry the parent's files to Cursor).
    c.subagents.custom[0].model = "claude-sonnet-4".into();
    let args = json!({"prompt": "Review", "subagent_type": "reviewer"});
    let Err(err) = plan(&c, "t1", "task", &args) else {
        panic!("refused")
    };
    assert!(err.to_string().contains("claude-sonnet-4"), "{err}");
    assert!(err.to_string().contains("My Small"), "{err}");
    // One of Cursor's models the client offered for subagents stays as given.
    c.subagents.selected_models = vec!["claude-sonnet-4".into()];
    let p = plan(&c, "t1", "task", &args).unwrap();
    assert_eq!(subagent_args(&p).model_id, "claude-sonnet-4");
    // A model the call asks for, by display name, when the user selected ours for subagents.
    c.subagents.custom.clear();
    c.subagents.selected_models = vec!["byok-other".into(), "byok-small".into()];
    let p = plan(
        &c,
        "t2",
        "task",
        &json!({"prompt": "Look", "subagent_type": "explore", "model": "My Small"}),
    )
    .unwrap();
    assert_eq!(subagent_args(&p).model_id, "byok-small");
}
