use bytes::Bytes;
use prost::Message as _;
use serde_json::json;

use super::*;
use crate::agent::state::Blob;
use crate::proto::agent::v1 as pb;

fn blobs_of(items: &[&[u8]]) -> (Blobs, Vec<Bytes>) {
    let mut b = Blobs::default();
    let mut ids = Vec::new();
    for data in items {
        let blob = Blob::new(Bytes::copy_from_slice(data));
        ids.push(blob.id_bytes());
        b.insert(blob.id, blob.data);
    }
    (b, ids)
}

fn rendered(sel: pb::SelectedContext, blobs: &Blobs) -> String {
    selected::render(&sel, blobs)
}

#[test]
fn every_selected_kind_is_tagged() {
    let sel = pb::SelectedContext {
        terminal_selections: vec![pb::SelectedTerminalSelection {
            content: "$ make\nerror".into(),
            title: Some("zsh".into()),
            ..Default::default()
        }],
        git_diff: Some(pb::SelectedGitDiff {
            content: "+added line".into(),
            ..Default::default()
        }),
        git_diff_from_branch_to_main: Some(pb::SelectedGitDiffFromBranchToMain {
            content: "+branch line".into(),
            ..Default::default()
        }),
        git_commits: vec![pb::SelectedGitCommit {
            sha: "abc123".into(),
            message: "fix parser".into(),
            diff: "-old".into(),
            ..Default::default()
        }],
        console_logs: vec![pb::SelectedConsoleLog {
            message: "TypeError: x is undefined".into(),
            level: "error".into(),
            ..Default::default()
        }],
        ui_elements: vec![pb::SelectedUiElement {
            element: "<button>Pay</button>".into(),
            xpath: "/html/body/button".into(),
            ..Default::default()
        }],
        external_links: vec![pb::SelectedExternalLink {
            url: "https://example.com/spec.pdf".into(),
            pdf_content: Some("PDF TEXT".into()),
            is_pdf: Some(true),
            ..Default::default()
        }],
        documentations: vec![pb::SelectedDocumentation {
            doc_id: "d1".into(),
            name: "React".into(),
        }],
        selected_documents: vec![pb::SelectedDocument {
            filename: "notes.md".into(),
            mime_type: "text/markdown".into(),
            data_or_blob_id: Some(pb::selected_document::DataOrBlobId::Data(
                Bytes::from_static(b"DOC BODY"),
            )),
            ..Default::default()
        }],
        past_chats: vec![pb::SelectedPastChat {
            agent_id: "a-1".into(),
            name: "Refactor auth".into(),
        }],
        cursor_commands: vec![pb::SelectedCursorCommand {
            name: "review".into(),
            content: "Review the diff for bugs.".into(),
            ..Default::default()
        }],
        selected_skills: vec![pb::AgentSkill {
            full_path: "/w/.cursor/skills/deploy/SKILL.md".into(),
            content: "---\nname: deploy\n---\nDEPLOY STEPS".into(),
            disable_model_invocation: true,
            ..Default::default()
        }],
        selected_subagents: vec![pb::SelectedSubagent {
            name: "reviewer".into(),
        }],
        cursor_rules: vec![pb::SelectedCursorRule {
            rule: Some(pb::CursorRule {
                full_path: "/w/.cursor/rules/manual.mdc".into(),
                content: "---\ndescription: x\n---\nMANUAL BODY".into(),
                ..Default::default()
            }),
        }],
        ..Default::default()
    };
    let t = rendered(sel, &Blobs::default());
    for needle in [
        "<terminal_selection title=\"zsh\">\n$ make\nerror",
        "<git_diff of=\"uncommitted changes\">\n+added line",
        "<git_diff of=\"this branch against main\">\n+branch line",
        "<git_commit sha=\"abc123\">\nfix parser",
        "<console_log level=\"error\">\nTypeError",
        "<ui_element>\nelement: <button>Pay</button>",
        "<link url=\"https://example.com/spec.pdf\" kind=\"pdf\">\nPDF TEXT",
        "<documentation name=\"React\"",
        "<document name=\"notes.md\" type=\"text/markdown\">\nDOC BODY",
        "<past_chat id=\"a-1\">Refactor auth</past_chat>",
        "<command name=\"review\">",
        "Review the diff for bugs.",
        "<skill name=\"deploy\" path=\"/w/.cursor/skills/deploy/SKILL.md\">\nDEPLOY STEPS",
        "<selected_subagent name=\"reviewer\">",
        "<rule path=\"/w/.cursor/rules/manual.mdc\">\nMANUAL BODY",
    ] {
        assert!(t.contains(needle), "{needle:?} missing from\n{t}");
    }
    assert!(!t.contains("description: x"), "frontmatter stays out: {t}");
}

#[test]
fn blob_referenced_text_entries_and_images() {
    let png = b"\x89PNG\r\n\x1a\n-png-bytes";
    let (blobs, ids) = blobs_of(&[b"TEXT FROM BLOB", b"ENTRY FROM BLOB", png]);
    let msg = pb::UserMessage {
        text_blob_id: Some(ids[0].clone()),
        selected_context: Some(pb::SelectedContext {
            extra_context_entries: vec![pb::ExtraContextEntry {
                data_or_blob_id: Some(pb::extra_context_entry::DataOrBlobId::BlobId(
                    ids[1].clone(),
                )),
            }],
            selected_images: vec![pb::SelectedImage {
                // Mislabelled: the bytes say PNG.
                mime_type: "image/jpeg".into(),
                data_or_blob_id: Some(pb::selected_image::DataOrBlobId::BlobId(ids[2].clone())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let wanted = wanted_blobs(None, Some(&msg));
    assert_eq!(wanted.len(), 3);
    let Message::User { parts } = crate::agent::prompt::user_message_with(&msg, true, &blobs)
    else {
        panic!()
    };
    let UserPart::Text { text } = &parts[0] else {
        panic!()
    };
    assert!(text.contains("<context>\nENTRY FROM BLOB"), "{text}");
    assert!(text.ends_with("TEXT FROM BLOB"), "{text}");
    assert!(
        matches!(&parts[1], UserPart::Image { mime_type, .. } if mime_type == "image/png"),
        "{parts:?}"
    );
    // A model without vision gets a note, not a silent drop.
    let Message::User { parts } = crate::agent::prompt::user_message_with(&msg, false, &blobs)
    else {
        panic!()
    };
    assert_eq!(parts.len(), 1);
    let UserPart::Text { text } = &parts[0] else {
        panic!()
    };
    assert!(text.contains("this model cannot see images"), "{text}");
}

#[test]
fn image_types_are_sniffed() {
    use selected::sniff_image;
    assert_eq!(
        sniff_image(b"\xff\xd8\xff\xe0rest", "image/png"),
        "image/jpeg"
    );
    assert_eq!(sniff_image(b"GIF89a....", ""), "image/gif");
    assert_eq!(
        sniff_image(b"RIFF\0\0\0\0WEBPVP8 ", "image/png"),
        "image/webp"
    );
    assert_eq!(sniff_image(b"unknown", "image/bmp"), "image/bmp");
}

#[test]
fn large_context_is_capped_visibly() {
    let big = "x".repeat(text::MAX_ITEM_CHARS + 10);
    let sel = pb::SelectedContext {
        extra_context: vec![big.clone(); 6],
        ..Default::default()
    };
    let t = rendered(sel, &Blobs::default());
    assert!(t.contains(TRUNCATED));
    assert!(
        t.chars().count() < text::MAX_TURN_CHARS + 2_000,
        "{}",
        t.len()
    );
    assert!(
        t.contains("the attached context exceeded"),
        "per-turn cap named"
    );
}

#[test]
fn request_context_parts_merge_as_if_inline() {
    let rules = pb::RequestContextRulesPart {
        rules: vec![pb::CursorRule {
            full_path: "/w/AGENTS.md".into(),
            content: "PART RULE".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let skills = pb::RequestContextSkillsPart {
        agent_skills: vec![pb::AgentSkill {
            full_path: "/w/s/SKILL.md".into(),
            description: "part skill".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mcps = pb::RequestContextMcpsPart {
        tools: vec![pb::McpToolDefinition {
            name: "db-query".into(),
            provider_identifier: "db".into(),
            tool_name: "query".into(),
            ..Default::default()
        }],
        mcp_instructions: vec![pb::McpInstructions {
            server_name: "db".into(),
            instructions: "Use read-only queries.".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let subagents = pb::RequestContextSubagentsPart {
        custom_subagents: vec![pb::CustomSubagent {
            name: "reviewer".into(),
            description: "reviews diffs".into(),
            ..Default::default()
        }],
    };
    let (blobs, ids) = blobs_of(&[
        &rules.encode_to_vec(),
        &skills.encode_to_vec(),
        &mcps.encode_to_vec(),
        &subagents.encode_to_vec(),
    ]);
    let refs = pb::RequestContextPartReferences {
        rules_blob_id: ids[0].clone(),
        skills_blob_id: ids[1].clone(),
        mcps_blob_id: ids[2].clone(),
        subagents_blob_id: ids[3].clone(),
        dynamic_context: Some(pb::RequestContext {
            env: Some(pb::RequestContextEnv {
                shell: "fish".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(wanted_blobs(Some(&refs), None).len(), 4);
    let ctx = merge_parts(None, Some(&refs), &blobs).unwrap();
    assert_eq!(ctx.tools.len(), 1);
    let s = crate::agent::prompt::system_prompt(&crate::agent::prompt::PromptInputs {
        ctx: Some(&ctx),
        ..Default::default()
    });
    for needle in [
        "PART RULE",
        "part skill",
        "Shell: fish",
        "<mcp_server_instructions server=\"db\">\nUse read-only queries.",
        "- reviewer: reviews diffs",
    ] {
        assert!(s.contains(needle), "{needle:?} missing from\n{s}");
    }
    // The same part twice (inline and by reference) counts once.
    let again = merge_parts(Some(ctx.clone()), Some(&refs), &blobs).unwrap();
    assert_eq!(again.rules.len(), 1);
}

#[test]
fn touched_files_bring_globbed_rules_and_the_prompt_is_stable() {
    use crate::agent::prompt::{system_prompt, PromptInputs};
    let ctx = pb::RequestContext {
        rules: vec![pb::CursorRule {
            full_path: "/w/.cursor/rules/py.mdc".into(),
            content: "PY RULE".into(),
            r#type: Some(pb::CursorRuleType {
                r#type: Some(pb::cursor_rule_type::Type::FileGlobbed(
                    pb::CursorRuleTypeFileGlobs {
                        globs: vec!["*.py".into()],
                    },
                )),
            }),
            ..Default::default()
        }],
        env: Some(pb::RequestContextEnv {
            workspace_paths: vec!["/w".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let inputs = |touched: &[String]| {
        system_prompt(&PromptInputs {
            ctx: Some(&ctx),
            custom: Some("custom"),
            mode: pb::AgentMode::Agent as i32,
            touched,
            ..Default::default()
        })
    };
    let before = inputs(&[]);
    assert_eq!(before, inputs(&[]), "same inputs, same bytes");
    assert!(!before.contains("PY RULE"));
    let messages = vec![Message::Assistant {
        parts: vec![AssistantPart::ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: json!({"path": "/w/src/main.py"}),
            extra: None,
        }],
    }];
    let touched = touched_paths(&messages, Some("/w"));
    assert_eq!(touched, ["src/main.py"]);
    let after = inputs(&touched);
    assert!(after.contains("PY RULE"));
    assert!(
        after.starts_with(&before[..before.len() - 1]),
        "rules in play come last"
    );
    let attached = vec![Message::user_text(
        "<attached_file path=\"app.py\">\nx\n</attached_file>\nhi",
    )];
    assert_eq!(touched_paths(&attached, Some("/w")), ["app.py"]);
}

#[test]
fn system_prompt_spec_replaces_or_appends() {
    use crate::agent::prompt::{system_prompt, PromptInputs};
    use pb::system_prompt_spec::Spec;
    let replace = pb::SystemPromptSpec {
        spec: Some(Spec::Replace("You are Pirate Bot.".into())),
    };
    let s = system_prompt(&PromptInputs {
        spec: Some(&replace),
        ..Default::default()
    });
    assert!(s.starts_with("You are Pirate Bot."), "{s}");
    assert!(!s.contains("inside the Cursor editor"), "{s}");
    assert!(
        s.contains("Read a file before editing it"),
        "tool use kept: {s}"
    );
    let ctx = pb::RequestContext {
        system_prompt_override: Some(pb::SystemPromptSpec {
            spec: Some(Spec::Append("APPENDED".into())),
        }),
        ..Default::default()
    };
    let s = system_prompt(&PromptInputs {
        ctx: Some(&ctx),
        ..Default::default()
    });
    assert!(s.contains("inside the Cursor editor") && s.trim_end().ends_with("APPENDED"));
}

#[test]
fn the_sdks_system_prompt_replaces_the_identity() {
    use crate::agent::prompt::{system_prompt, PromptInputs};
    let s = system_prompt(&PromptInputs {
        custom: Some("You are the conformance bot."),
        ..Default::default()
    });
    assert!(s.starts_with("You are the conformance bot.\n"), "{s}");
    assert!(!s.contains("inside the Cursor editor"), "{s}");
    assert!(
        s.contains("Read a file before editing it"),
        "tool use kept: {s}"
    );
}

#[test]
fn pull_requests_browsers_videos_editor_state_and_blob_links() {
    let (blobs, ids) = blobs_of(&[b"@@ -1 +1 @@ PR DIFF", b"LINKED PAGE TEXT", b"DOC BY BLOB"]);
    let sel = pb::SelectedContext {
        git_pr_diff_selections: vec![pb::SelectedGitPrDiffSelection {
            pr_url: "https://github.com/o/r/pull/7".into(),
            file_path: "src/a.rs".into(),
            start_line: 1,
            end_line: 9,
            blob_id: Some(ids[0].clone()),
            ..Default::default()
        }],
        selected_pull_requests: vec![pb::SelectedPullRequest {
            number: 7,
            url: "https://github.com/o/r/pull/7".into(),
            title: Some("Faster parser".into()),
            description: Some("PR DESCRIPTION".into()),
            ..Default::default()
        }],
        selected_browsers: vec![pb::SelectedBrowser {
            url: "http://localhost:3000".into(),
            page_title: Some("App".into()),
            ..Default::default()
        }],
        selected_videos: vec![pb::SelectedVideo {
            filename: "bug.mp4".into(),
            ..Default::default()
        }],
        external_links: vec![pb::SelectedExternalLink {
            url: "https://example.com/page".into(),
            blob_id: Some(ids[1].clone()),
            ..Default::default()
        }],
        selected_documents: vec![
            pb::SelectedDocument {
                filename: "spec.txt".into(),
                data_or_blob_id: Some(pb::selected_document::DataOrBlobId::BlobId(ids[2].clone())),
                ..Default::default()
            },
            pb::SelectedDocument {
                filename: "scan.pdf".into(),
                mime_type: "application/pdf".into(),
                data_or_blob_id: Some(pb::selected_document::DataOrBlobId::Data(
                    Bytes::from_static(b"%PDF\xff\xfe"),
                )),
                ..Default::default()
            },
        ],
        invocation_context: Some(pb::InvocationContext {
            data: Some(pb::invocation_context::Data::IdeState(
                pb::invocation_context::IdeState {
                    visible_files: vec![pb::invocation_context::ide_state::File {
                        path: "/w/src/lib.rs".into(),
                        relative_path: Some("src/lib.rs".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
        }),
        code_selections: vec![pb::SelectedCodeSelection {
            content: "fn f() {}".into(),
            path: "/w/f.rs".into(),
            ..Default::default()
        }],
        terminals: vec![pb::SelectedTerminal {
            content: "$ cargo test".into(),
            ..Default::default()
        }],
        folders: vec![pb::SelectedFolder {
            path: "src".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut user = pb::UserMessage {
        selected_context: Some(sel.clone()),
        ..Default::default()
    };
    user.text = "go".into();
    assert_eq!(wanted_blobs(None, Some(&user)).len(), 3);
    let t = rendered(sel, &blobs);
    for needle in [
        "<pr_diff pr=\"https://github.com/o/r/pull/7\" path=\"src/a.rs\" lines=\"1-9\">\n@@ -1 +1 @@ PR DIFF",
        "<pull_request number=\"7\" url=\"https://github.com/o/r/pull/7\" title=\"Faster parser\">\nPR DESCRIPTION",
        "<browser_tab url=\"http://localhost:3000\" title=\"App\" />",
        "<video name=\"bug.mp4\" />",
        "<link url=\"https://example.com/page\" kind=\"web page\">\nLINKED PAGE TEXT",
        "<document name=\"spec.txt\">\nDOC BY BLOB",
        "<document name=\"scan.pdf\" type=\"application/pdf\" /> (binary",
        "<editor_state>\nopen files: src/lib.rs",
        "<selection path=\"/w/f.rs\">\nfn f() {}",
        "<terminal>\n$ cargo test",
        "<attached_folder path=\"src\" />",
    ] {
        assert!(t.contains(needle), "{needle:?} missing from\n{t}");
    }
}

#[test]
fn invocation_context_by_blob_id() {
    let inner = pb::InvocationContext {
        data: Some(pb::invocation_context::Data::SlackThread(
            pb::invocation_context::SlackThread {
                thread: "alice: the build is red".into(),
                channel_name: Some("eng".into()),
                ..Default::default()
            },
        )),
    };
    let (blobs, ids) = blobs_of(&[&inner.encode_to_vec()]);
    let sel = pb::SelectedContext {
        invocation_context: Some(pb::InvocationContext {
            data: Some(pb::invocation_context::Data::BlobId(ids[0].clone())),
        }),
        ..Default::default()
    };
    let user = pb::UserMessage {
        text: "fix it".into(),
        selected_context: Some(sel.clone()),
        ..Default::default()
    };
    assert_eq!(wanted_blobs(None, Some(&user)).len(), 1);
    let t = rendered(sel.clone(), &blobs);
    assert!(
        t.contains("<slack_thread channel=\"eng\">\nalice: the build is red"),
        "{t}"
    );
    let t = rendered(sel, &Blobs::default());
    assert!(t.contains("not available"), "{t}");
}

/// A summary keeps the files touched before it, so a file-globbed rule they brought in stays
/// after the history is compacted (and after a restart, as the summary is stored).
#[test]
fn files_touched_before_a_summary_are_still_touched_after_it() {
    let older = vec![Message::Assistant {
        parts: vec![AssistantPart::ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: json!({"path": "/w/src/main.py"}),
            extra: None,
        }],
    }];
    let note = touched_note(&older);
    assert!(
        note.contains("<touched_file path=\"/w/src/main.py\"/>"),
        "{note}"
    );
    let summary = crate::agent::state::summary_message(&format!("We read main.py.{note}"));
    assert_eq!(touched_paths(&[summary], Some("/w")), ["src/main.py"]);
    assert_eq!(touched_note(&[]), "", "nothing touched, no note");
}

/// The note keeps the 200 files touched last: the oldest go first, and a file touched again
/// counts as recent.
#[test]
fn the_touched_note_keeps_the_newest_200_paths() {
    let read = |i: usize| Message::Assistant {
        parts: vec![AssistantPart::ToolCall {
            id: format!("c{i}"),
            name: "read_file".into(),
            arguments: json!({ "path": format!("/w/f{i}.rs") }),
            extra: None,
        }],
    };
    let mut older: Vec<Message> = (0..250).map(read).collect();
    // f3 again, last: it stays although first read among the oldest.
    older.push(read(3));
    let note = touched_note(&older);
    let paths = touched_paths(&[Message::user_text(note)], Some("/w"));
    assert_eq!(paths.len(), TOUCHED_NOTE_MAX);
    assert_eq!(paths.last().map(String::as_str), Some("f3.rs"));
    assert_eq!(paths[0], "f51.rs", "f0..f50 (f3 aside) are the oldest");
    assert!(!paths.contains(&"f50.rs".to_string()) && !paths.contains(&"f0.rs".to_string()));
    assert!(paths.contains(&"f249.rs".to_string()));
}
