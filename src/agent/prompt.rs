//! What the model is told: a system prompt built from Cursor's request context, and the user
//! message with the context the user attached.

use std::fmt::Write;

use crate::agent::context::{self, rules, selected, Blobs};
use crate::proto::agent::v1 as pb;
use crate::provider::{Message, UserPart};

/// Who the model is; `custom_system_prompt` (the SDK's `systemPrompt`, documented there as
/// replacing the harness prompt) or `system_prompt_spec.replace` replaces this.
const IDENTITY: &str = "You are a coding agent working inside the Cursor editor on the user's \
     workspace. Prefer small, verifiable steps and answer concisely in Markdown.\n";

/// What the loop needs the model to know about its tools; kept whatever the client replaces.
const TOOL_USE: &str = "Use the tools to read, search and change files and to run commands; \
     they run on the user's machine. Read a file before editing it, and refer to files by their \
     workspace paths.\n";

/// What the system prompt is built from. The same inputs give the same bytes, so provider
/// prompt caches keep hitting across the turns of a conversation; the part that can change
/// within a conversation (file-globbed rules coming into play) comes last.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PromptInputs<'a> {
    pub ctx: Option<&'a pb::RequestContext>,
    /// `run_request.custom_system_prompt`: replaces our identity, as Cursor's SDK documents.
    pub custom: Option<&'a str>,
    /// `run_request.system_prompt_spec`, else the request context's `system_prompt_override`.
    pub spec: Option<&'a pb::SystemPromptSpec>,
    pub mode: i32,
    /// Workspace-relative paths attached, read or edited so far (see
    /// [`context::touched_paths`]): they bring file-globbed rules in.
    pub touched: &'a [String],
    /// When the run is a subagent: what kind, and its own instructions.
    pub child: Option<&'a crate::agent::subagents::Child>,
    /// Subagents an earlier turn left running in the background: (id, title).
    pub background: &'a [(String, String)],
    /// `run_request.exclude_workspace_context`: leave out what describes the workspace's
    /// contents (git state, project layout); where the model works (OS, shell, folders) stays,
    /// since its tools need it.
    pub(crate) exclude_workspace: bool,
    /// `ctx`'s file-globbed rules, compiled once for the turn; compiled here when absent.
    pub(crate) globbed: Option<&'a rules::GlobbedRules<'a>>,
}

pub fn system_prompt(inputs: &PromptInputs<'_>) -> String {
    use pb::system_prompt_spec::Spec;
    let spec = inputs
        .spec
        .or_else(|| inputs.ctx.and_then(|c| c.system_prompt_override.as_ref()))
        .and_then(|s| s.spec.as_ref());
    let custom = inputs.custom.map(str::trim).filter(|c| !c.is_empty());
    let mut s = match (spec, custom) {
        (Some(Spec::Replace(text)), _) if !text.trim().is_empty() => format!("{}\n", text.trim()),
        (_, Some(custom)) => format!("{custom}\n"),
        _ => IDENTITY.to_string(),
    };
    s.push_str(TOOL_USE);
    if let Some(child) = inputs.child {
        subagent_role(&mut s, child);
    }
    let mode = inputs.mode;
    if mode == pb::AgentMode::Ask as i32 {
        s.push_str("The user is in Ask mode: answer and explain; do not change files.\n");
    } else if mode == pb::AgentMode::Plan as i32 {
        s.push_str(
            "The user is in Plan mode: investigate and propose a plan before changing anything.\n",
        );
    }
    if let Some(ctx) = inputs.ctx {
        workspace(&mut s, ctx, inputs.exclude_workspace);
        rules::write_static(&mut s, ctx);
        rules::write_skills(&mut s, &rules::skills(ctx));
        subagents(&mut s, ctx);
        mcp_instructions(&mut s, ctx);
        if let Some(h) = ctx
            .hooks_additional_context
            .as_deref()
            .filter(|h| !h.trim().is_empty())
        {
            let _ = writeln!(s, "\n<hooks_context>\n{}\n</hooks_context>", h.trim());
        }
    }
    if let Some(Spec::Append(text)) = spec {
        if !text.trim().is_empty() {
            let _ = write!(s, "\n{}\n", text.trim());
        }
    }
    if let Some(ctx) = inputs.ctx {
        let globbed = match inputs.globbed {
            Some(compiled) => compiled.matching(inputs.touched),
            None => rules::globbed_for(ctx, inputs.touched),
        };
        if !globbed.is_empty() {
            s.push_str("\n<rules>\nRules for the files in play:\n");
            rules::write_bodies(&mut s, globbed.into_iter());
            s.push_str("</rules>\n");
        }
    }
    if !inputs.background.is_empty() {
        s.push_str("\n<background_subagents>\nSubagents started earlier that were still running in the background (use await_subagent to get their results):\n");
        for (id, title) in inputs.background {
            let _ = writeln!(s, "- {id}: {title}");
        }
        s.push_str("</background_subagents>\n");
    }
    s
}

/// Where the model works: OS, shell, folders, time zone, and (unless `without_contents`) git
/// state and project layout.
fn workspace(s: &mut String, ctx: &pb::RequestContext, without_contents: bool) {
    let mut w = String::new();
    if let Some(env) = &ctx.env {
        let mut line = |label: &str, v: &str| {
            if !v.is_empty() {
                let _ = writeln!(w, "{label}: {v}");
            }
        };
        line("OS", &env.os_version);
        line("Shell", &env.shell);
        for path in &env.workspace_paths {
            line("Workspace", path);
        }
        line(
            "Working directory",
            env.process_working_directory.as_deref().unwrap_or_default(),
        );
        line("Time zone", &env.time_zone);
        line("Terminal output files", &env.terminals_folder);
    }
    let (repos, layouts) = match without_contents {
        true => (&[][..], &[][..]),
        false => (&ctx.git_repos[..], &ctx.project_layouts[..]),
    };
    for repo in repos {
        let branch = if repo.branch_name.is_empty() {
            String::new()
        } else {
            format!(" (branch {})", repo.branch_name)
        };
        let _ = writeln!(w, "Git repository: {}{branch}", repo.path);
        let status = repo.status.trim();
        if !status.is_empty() {
            let _ = writeln!(w, "{}", context::cap(status, 4_000));
        }
    }
    for layout in layouts {
        let mut tree = String::new();
        layout_lines(&mut tree, layout, 0);
        let _ = write!(w, "Project layout:\n{}", context::cap(&tree, 6_000));
        if !w.ends_with('\n') {
            w.push('\n');
        }
    }
    if !w.is_empty() {
        let _ = write!(s, "\n<environment>\n{w}</environment>\n");
    }
}

/// A directory tree, two levels deep, files named, the rest counted.
fn layout_lines(out: &mut String, node: &pb::LsDirectoryTreeNode, depth: usize) {
    let indent = "  ".repeat(depth);
    let _ = writeln!(out, "{indent}{}/", node.abs_path);
    if depth >= 2 {
        return;
    }
    for child in &node.children_dirs {
        layout_lines(out, child, depth + 1);
    }
    for f in &node.children_files {
        let _ = writeln!(out, "{indent}  {}", f.name);
    }
}

/// A subagent is told it works for another agent, which reads only its final message.
fn subagent_role(s: &mut String, child: &crate::agent::subagents::Child) {
    let _ = writeln!(
        s,
        "\n<subagent>\nYou are a `{}` subagent: another agent gave you the task in the user message. Work on it on your own (nobody answers questions), then end with one final message that reports what you found or did; that message is all the other agent sees.",
        child.kind
    );
    if child.readonly {
        s.push_str("You are read-only: look, do not change files or run commands.\n");
    }
    if !child.instructions.is_empty() {
        let _ = writeln!(s, "{}", child.instructions);
    }
    s.push_str("</subagent>\n");
}

fn subagents(s: &mut String, ctx: &pb::RequestContext) {
    if ctx.custom_subagents.is_empty() {
        return;
    }
    s.push_str("\n<subagents>\nCustom subagents defined for this workspace:\n");
    for a in &ctx.custom_subagents {
        let _ = writeln!(s, "- {}: {}", a.name, a.description.trim());
    }
    s.push_str("</subagents>\n");
}

fn mcp_instructions(s: &mut String, ctx: &pb::RequestContext) {
    for m in ctx
        .mcp_instructions
        .iter()
        .filter(|m| !m.instructions.trim().is_empty())
    {
        let name = if m.server_name.is_empty() {
            &m.server_identifier
        } else {
            &m.server_name
        };
        let _ = writeln!(
            s,
            "\n<mcp_server_instructions server=\"{name}\">\n{}\n</mcp_server_instructions>",
            context::cap(m.instructions.trim(), 10_000)
        );
    }
}

/// The user's message as the provider sees it: the attached context first (tagged), then the
/// text, then images; content given by blob id comes from `blobs`.
pub(crate) fn user_message_with(
    msg: &pb::UserMessage,
    images_allowed: bool,
    blobs: &Blobs,
) -> Message {
    let mut text = String::new();
    let mut images = Vec::new();
    if let Some(sel) = &msg.selected_context {
        text = selected::render(sel, blobs);
        let (parts, notes) = selected::images(sel, blobs, images_allowed);
        text.push_str(&notes);
        images = parts;
    }
    text.push_str(&origin_note(msg));
    text.push_str(&selected::user_text(msg, blobs));
    text.push_str(&hook_contexts(&msg.hook_additional_contexts));
    let mut parts = vec![UserPart::Text { text }];
    parts.extend(images);
    Message::User { parts }
}

/// Where a message came from when it is not simply the user's words: a system-originated
/// message (a Build, a notification), one sent while the agent worked, one about a plan. Part
/// of the stored message, so replayed turns read the same.
fn origin_note(msg: &pb::UserMessage) -> String {
    let note = if msg.is_simulated_msg == Some(true) {
        let reason = msg
            .simulated_msg_reason
            .and_then(|r| pb::SimulatedMsgReason::try_from(r).ok())
            .filter(|r| *r != pb::SimulatedMsgReason::Unspecified)
            .map(|r| {
                let name = r.as_str_name();
                name.strip_prefix("SIMULATED_MSG_REASON_")
                    .unwrap_or(name)
                    .to_lowercase()
                    .replace('_', " ")
            });
        Some(match reason {
            Some(r) => {
                format!("[System message ({r}), sent on the user's behalf; not typed by the user]")
            }
            None => "[System message, sent on the user's behalf; not typed by the user]".into(),
        })
    } else if msg.turn_steer == Some(true) {
        Some("[The user sent this while you were working on the previous request]".into())
    } else {
        None
    };
    let plan = msg
        .execute_plan_info
        .as_ref()
        .filter(|p| !p.plan_id.is_empty() && msg.is_simulated_msg != Some(true))
        .map(|p| {
            format!(
                "[This message is about the plan {} {}]",
                p.plan_id, p.plan_title
            )
        });
    // Another agent's words (a parent to its subagent), not the user's.
    let sender = nonblank(msg.sent_by_agent_id.as_deref())
        .map(|a| format!("[Sent to you by agent {a}; not typed by the user]"));
    // The client's reminder for a subagent, ahead of its task.
    let reminder = nonblank(msg.subagent_system_reminder.as_deref())
        .map(|r| format!("<system-reminder>\n{r}\n</system-reminder>"));
    let head: Vec<String> = note
        .into_iter()
        .chain(sender)
        .chain(plan)
        .chain(reminder)
        .collect();
    match head.is_empty() {
        true => String::new(),
        false => format!("{}\n", head.join("\n")),
    }
}

/// Hooks rendered at once, and each one's text, at most.
const MAX_HOOKS: usize = 16;
const MAX_HOOK_CHARS: usize = 10_000;

/// Hook output the client attached for the model (`hook_additional_contexts`: on a user
/// message, e.g. from a hook on prompt submission, after the user's words; on an exec result,
/// from a hook after the tool), each tagged with its hook event.
pub(crate) fn hook_contexts(hooks: &[pb::HookAdditionalContext]) -> String {
    let mut out = String::new();
    let given = hooks
        .iter()
        .filter_map(|h| nonblank(Some(&h.content)).map(|c| (h, c)));
    for (h, content) in given.take(MAX_HOOKS) {
        let event = h.hook_event_name.replace('"', "'");
        let _ = write!(
            out,
            "\n\n<hook_context event=\"{event}\">\n{}\n</hook_context>",
            context::cap(content, MAX_HOOK_CHARS)
        );
    }
    out
}

/// A text that says something, trimmed.
fn nonblank(v: Option<&str>) -> Option<&str> {
    v.map(str::trim).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    /// The text the provider gets for `msg`.
    fn rendered(msg: &pb::UserMessage) -> String {
        match user_message_with(msg, false, &Blobs::default()) {
            Message::User { parts } => match &parts[0] {
                UserPart::Text { text } => text.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    /// The note is part of the message itself, so a stored Build turn replayed from history
    /// (which renders stored messages with the same function) still reads as system-written.
    #[test]
    fn system_written_messages_say_so_when_replayed_too() {
        let build = pb::UserMessage {
            text: "Implement the plan.".into(),
            is_simulated_msg: Some(true),
            simulated_msg_reason: Some(pb::SimulatedMsgReason::PlanExecution as i32),
            ..Default::default()
        };
        let text = rendered;
        let first = text(&build);
        assert!(
            first.starts_with("[System message (plan execution)"),
            "{first}"
        );
        assert!(first.ends_with("\nImplement the plan."), "{first}");
        let stored = pb::UserMessage::decode(build.encode_to_vec().as_slice()).unwrap();
        assert_eq!(text(&stored), first);
        let plain = pb::UserMessage {
            text: "hi".into(),
            ..Default::default()
        };
        assert_eq!(text(&plain), "hi");
    }

    /// A parent agent's message to its subagent, with the client's reminder: neither reads as
    /// the user's words.
    #[test]
    fn an_agents_message_and_a_subagent_reminder_are_marked() {
        let msg = pb::UserMessage {
            text: "Count the files.".into(),
            sent_by_agent_id: Some("agent-7".into()),
            subagent_system_reminder: Some("Answer in one line.".into()),
            ..Default::default()
        };
        assert_eq!(
            rendered(&msg),
            "[Sent to you by agent agent-7; not typed by the user]\n\
             <system-reminder>\nAnswer in one line.\n</system-reminder>\n\
             Count the files."
        );
    }

    /// What a hook added for the model follows the user's words, tagged with its event; an
    /// empty one adds nothing.
    #[test]
    fn hook_contexts_follow_the_message() {
        let msg = pb::UserMessage {
            text: "Fix the build.".into(),
            hook_additional_contexts: vec![
                pb::HookAdditionalContext {
                    hook_event_name: "beforeSubmitPrompt".into(),
                    content: "The CI uses Rust 1.95.".into(),
                },
                pb::HookAdditionalContext {
                    hook_event_name: "sessionStart".into(),
                    content: "  ".into(),
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            rendered(&msg),
            "Fix the build.\n\n<hook_context event=\"beforeSubmitPrompt\">\n\
             The CI uses Rust 1.95.\n</hook_context>"
        );
    }

    /// A client could attach any number of hooks of any size: at most [`MAX_HOOKS`] are
    /// rendered, each capped with a visible cut.
    #[test]
    fn hook_contexts_are_bounded() {
        let hooks: Vec<pb::HookAdditionalContext> = (0..MAX_HOOKS + 4)
            .map(|i| pb::HookAdditionalContext {
                hook_event_name: format!("hook{i}"),
                content: "x".repeat(MAX_HOOK_CHARS + 500),
            })
            .collect();
        let out = hook_contexts(&hooks);
        assert_eq!(out.matches("<hook_context ").count(), MAX_HOOKS);
        assert!(!out.contains(&format!("hook{MAX_HOOKS}\"")));
        assert_eq!(
            out.matches("[truncated").count(),
            MAX_HOOKS,
            "each one is cut"
        );
        assert!(out.len() < MAX_HOOKS * (MAX_HOOK_CHARS + 200));
    }

    /// `exclude_workspace_context` leaves out the workspace's contents but keeps where the
    /// model works.
    #[test]
    fn excluding_the_workspace_context_keeps_the_environment() {
        let ctx = pb::RequestContext {
            env: Some(pb::RequestContextEnv {
                os_version: "linux 6.1".into(),
                workspace_paths: vec!["/home/u/proj".into()],
                ..Default::default()
            }),
            git_repos: vec![pb::GitRepoInfo {
                path: "/home/u/proj".into(),
                branch_name: "feature-x".into(),
                status: "M src/secret_plan.rs".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let prompt = |exclude_workspace| {
            system_prompt(&PromptInputs {
                ctx: Some(&ctx),
                exclude_workspace,
                ..Default::default()
            })
        };
        let full = prompt(false);
        assert!(
            full.contains("feature-x") && full.contains("secret_plan.rs"),
            "{full}"
        );
        let bare = prompt(true);
        assert!(
            bare.contains("linux 6.1") && bare.contains("/home/u/proj"),
            "{bare}"
        );
        assert!(
            !bare.contains("feature-x") && !bare.contains("secret_plan.rs"),
            "{bare}"
        );
    }

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
        let s = system_prompt(&PromptInputs {
            ctx: Some(&ctx),
            custom: Some("Be brief."),
            mode: pb::AgentMode::Agent as i32,
            ..Default::default()
        });
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
        let Message::User { parts } = user_message_with(&msg, true, &Blobs::default()) else {
            panic!()
        };
        let UserPart::Text { text } = &parts[0] else {
            panic!()
        };
        assert!(text.starts_with("<attached_file path=\"a.rs\">"));
        assert!(text.ends_with("explain"));
    }
}
