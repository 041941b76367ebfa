//! What the model is told: a system prompt built from Cursor's request context, and the user
//! message with the context the user attached.

use std::fmt::Write;

use base64::Engine;

use crate::proto::agent::v1 as pb;
use crate::provider::{Message, UserPart};

/// Rules larger than this are cut, so one huge rule file cannot crowd out the conversation.
const MAX_RULE_CHARS: usize = 20_000;

pub fn system_prompt(ctx: Option<&pb::RequestContext>, custom: Option<&str>, mode: i32) -> String {
    let mut s = String::from(
        "You are a coding agent working inside the Cursor editor on the user's workspace. \
         Use the tools to read, search and change files and to run commands; they run on the \
         user's machine. Prefer small, verifiable steps, read a file before editing it, and \
         answer concisely in Markdown. Refer to files by their workspace paths.\n",
    );
    if mode == pb::AgentMode::Ask as i32 {
        s.push_str("The user is in Ask mode: answer and explain; do not change files.\n");
    } else if mode == pb::AgentMode::Plan as i32 {
        s.push_str(
            "The user is in Plan mode: investigate and propose a plan before changing anything.\n",
        );
    }
    if let Some(env) = ctx.and_then(|c| c.env.as_ref()) {
        s.push_str("\n<environment>\n");
        if !env.os_version.is_empty() {
            let _ = writeln!(s, "OS: {}", env.os_version);
        }
        if !env.shell.is_empty() {
            let _ = writeln!(s, "Shell: {}", env.shell);
        }
        for path in &env.workspace_paths {
            let _ = writeln!(s, "Workspace: {path}");
        }
        if let Some(cwd) = env
            .process_working_directory
            .as_deref()
            .filter(|c| !c.is_empty())
        {
            let _ = writeln!(s, "Working directory: {cwd}");
        }
        if !env.time_zone.is_empty() {
            let _ = writeln!(s, "Time zone: {}", env.time_zone);
        }
        s.push_str("</environment>\n");
    }
    if let Some(ctx) = ctx {
        let rules: Vec<&pb::CursorRule> = ctx
            .rules
            .iter()
            .filter(|r| !r.content.trim().is_empty())
            .collect();
        if !rules.is_empty() {
            s.push_str("\n<rules>\nFollow these rules from the user and the project:\n");
            for r in rules {
                let content: String = r.content.chars().take(MAX_RULE_CHARS).collect();
                let _ = writeln!(
                    s,
                    "<rule path=\"{}\">\n{}\n</rule>",
                    r.full_path,
                    content.trim()
                );
            }
            s.push_str("</rules>\n");
        }
    }
    if let Some(custom) = custom.filter(|c| !c.trim().is_empty()) {
        let _ = write!(s, "\n{}\n", custom.trim());
    }
    s
}

/// The user's message as the provider sees it: attached files, selections and terminals first,
/// then the text, then images.
pub fn user_message(msg: &pb::UserMessage, images_allowed: bool) -> Message {
    let mut text = String::new();
    if let Some(sel) = &msg.selected_context {
        for f in &sel.files {
            let path = f.relative_path.as_deref().unwrap_or(&f.path);
            let _ = writeln!(
                text,
                "<attached_file path=\"{path}\">\n{}\n</attached_file>",
                f.content
            );
        }
        for c in &sel.code_selections {
            let path = c.relative_path.as_deref().unwrap_or(&c.path);
            let _ = writeln!(
                text,
                "<selection path=\"{path}\">\n{}\n</selection>",
                c.content
            );
        }
        for t in &sel.terminals {
            let _ = writeln!(text, "<terminal>\n{}\n</terminal>", t.content);
        }
        for folder in &sel.folders {
            let _ = writeln!(text, "<attached_folder path=\"{}\" />", folder.path);
        }
        for extra in &sel.extra_context {
            let _ = writeln!(text, "<context>\n{extra}\n</context>");
        }
        for entry in &sel.extra_context_entries {
            if let Some(pb::extra_context_entry::DataOrBlobId::Data(d)) = &entry.data_or_blob_id {
                let _ = writeln!(text, "<context>\n{d}\n</context>");
            }
        }
    }
    text.push_str(&msg.text);
    let mut parts = vec![UserPart::Text { text }];
    if images_allowed {
        for img in msg.selected_context.iter().flat_map(|s| &s.selected_images) {
            use pb::selected_image::DataOrBlobId;
            let data = match &img.data_or_blob_id {
                Some(DataOrBlobId::Data(d)) => d,
                Some(DataOrBlobId::BlobIdWithData(b)) => &b.data,
                _ => continue,
            };
            if data.is_empty() {
                continue;
            }
            parts.push(UserPart::Image {
                mime_type: if img.mime_type.is_empty() {
                    "image/png".into()
                } else {
                    img.mime_type.clone()
                },
                data: base64::engine::general_purpose::STANDARD.encode(data),
            });
        }
    }
    Message::User { parts }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_and_rules_reach_the_prompt() {
        let ctx = pb::RequestContext {
            env: Some(pb::RequestContextEnv {
                os_version: "linux 6.1".into(),
                shell: "bash".into(),
                workspace_paths: vec!["/home/u/proj".into()],
                ..Default::default()
            }),
            rules: vec![pb::CursorRule {
                full_path: ".cursor/rules/style.mdc".into(),
                content: "Use tabs.".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let s = system_prompt(Some(&ctx), Some("Be brief."), pb::AgentMode::Agent as i32);
        for needle in [
            "linux 6.1",
            "bash",
            "/home/u/proj",
            "Use tabs.",
            "Be brief.",
        ] {
            assert!(s.contains(needle), "{needle} missing from {s}");
        }
    }

    #[test]
    fn attached_files_precede_the_text() {
        let msg = pb::UserMessage {
            text: "explain".into(),
            selected_context: Some(pb::SelectedContext {
                files: vec![pb::SelectedFile {
                    path: "/p/a.rs".into(),
                    content: "fn a() {}".into(),
                    relative_path: Some("a.rs".into()),
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let Message::User { parts } = user_message(&msg, true) else {
            panic!()
        };
        let UserPart::Text { text } = &parts[0] else {
            panic!()
        };
        assert!(text.starts_with("<attached_file path=\"a.rs\">"));
        assert!(text.ends_with("explain"));
    }
}
