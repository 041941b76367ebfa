//! The model's prompt for one Cmd+K: the instruction, the selection and the lines around it,
//! the rules and @-mentioned blocks, other context items, dependent edits and the earlier turns
//! of the same prompt bar. Pure: a request in, a provider request out.

use std::fmt::Write as _;

use super::call::{CmdKCall, Surface};
use crate::base::text::cut_bytes;
use crate::proto::aiserver::v1 as pb;
use crate::provider::{Message, ProviderRequest, RequestOptions};

use pb::context_item::Item;

/// Output caps: an edit rarely needs more, a command far less.
const EDIT_MAX_OUTPUT: u32 = 8_192;
const TERMINAL_MAX_OUTPUT: u32 = 1_024;
/// Earlier turns of a prompt bar kept in the prompt (the newest ones).
const MAX_HISTORY_TURNS: usize = 8;
const CUT: &str = "\n[… cut by cursor-byok]";

/// The selection a reply replaces: 1-based `start`, `end` exclusive (`start == end` inserts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRange {
    pub start: i32,
    pub end: i32,
}

/// What the prompt is built from: the call and its items with every hash resolved.
pub(crate) struct PromptInput<'a> {
    pub call: &'a CmdKCall,
    pub items: &'a [pb::ContextItem],
    /// The provider's model name and the model's own options.
    pub model: &'a str,
    pub options: RequestOptions,
    /// The byte bound of the whole prompt.
    pub max_bytes: usize,
}

/// The selection's range, from its `cmd_k_selection` item (line 1 when there is none).
pub(crate) fn selection_range(items: &[pb::ContextItem]) -> LineRange {
    let selection = items.iter().find_map(|i| match &i.item {
        Some(Item::CmdKSelection(s)) => Some(s),
        _ => None,
    });
    let start = selection.map_or(1, |s| s.start_line_number.max(1));
    let len = selection.map_or(0, |s| i32::try_from(s.lines.len()).unwrap_or(i32::MAX));
    LineRange {
        start,
        end: start.saturating_add(len),
    }
}

pub fn build(input: PromptInput<'_>) -> ProviderRequest {
    let surface = input.call.surface();
    let chat = input.call.chat_mode();
    let range = selection_range(input.items);
    let mut text = String::new();
    rules(&mut text, input.call, input.items);
    mentioned(&mut text, input.call.legacy_context());
    other_items(&mut text, input.items);
    if let CmdKCall::Editor(r) = input.call {
        dependent_edits(&mut text, r);
    }
    history(&mut text, input.items);
    match surface {
        Surface::Editor => editor_focus(&mut text, input.items, range),
        Surface::Terminal => terminal_focus(&mut text, input.items),
    }
    let user = cut_bytes(&text, input.max_bytes, CUT);
    let cap = match surface {
        Surface::Editor => EDIT_MAX_OUTPUT,
        Surface::Terminal => TERMINAL_MAX_OUTPUT,
    };
    let mut options = input.options;
    options.max_output_tokens = Some(options.max_output_tokens.unwrap_or(cap).min(cap));
    ProviderRequest {
        model: input.model.to_string(),
        system: system_prompt(surface, chat, range).to_string(),
        messages: vec![Message::user_text(user)],
        tools: Vec::new(),
        options,
    }
}

fn system_prompt(surface: Surface, chat: bool, range: LineRange) -> &'static str {
    match (surface, chat) {
        (Surface::Editor, true) | (Surface::Terminal, true) => {
            "You answer a developer's question inside their editor (Cursor's Cmd+K). Answer \
             briefly and precisely, in Markdown, about the code and context given."
        }
        (Surface::Editor, false) if range.start == range.end => {
            "You write code inline in a developer's editor (Cursor's Cmd+K). Reply with only \
             the lines to insert at the marked point: no explanation, no Markdown fences, no \
             line numbers. Match the file's indentation and style."
        }
        (Surface::Editor, false) => {
            "You edit code inline in a developer's editor (Cursor's Cmd+K). Reply with only \
             the lines that replace the selected lines, as the instruction asks: no \
             explanation, no Markdown fences, no line numbers. Keep what the instruction does \
             not ask to change, and the file's indentation and style."
        }
        (Surface::Terminal, false) => {
            "You write a shell command for a developer's terminal (Cursor's Cmd+K). Reply with \
             only the command (several lines only if it needs them): no explanation, no \
             Markdown fences, no prompt characters. Use the working directory and the \
             terminal's recent history."
        }
    }
}

fn section(out: &mut String, title: &str, body: &str) {
    if !body.trim().is_empty() {
        let _ = write!(out, "## {title}\n{}\n\n", body.trim_end());
    }
}

/// Rules: the explicit context, the request's and the context's rules, custom instructions.
fn rules(out: &mut String, call: &CmdKCall, items: &[pb::ContextItem]) {
    let mut text = String::new();
    if let Some(e) = call
        .legacy_context()
        .and_then(|l| l.explicit_context.as_ref())
    {
        for part in [
            Some(&e.context),
            e.repo_context.as_ref(),
            e.mode_specific_context.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            let _ = writeln!(text, "{}", part.trim_end());
        }
        e.rules.iter().for_each(|r| rule(&mut text, r));
    }
    if let CmdKCall::Editor(r) = call {
        r.rules.iter().for_each(|r| rule(&mut text, r));
    }
    for item in items {
        match &item.item {
            Some(Item::ProjectRule(r)) => rule(&mut text, r),
            Some(Item::CustomInstructions(c)) => {
                let _ = writeln!(text, "{}", c.instructions.trim_end());
            }
            _ => {}
        }
    }
    section(out, "Rules to follow", &text);
}

fn rule(out: &mut String, r: &pb::CursorRule) {
    let body = r.body.as_deref().unwrap_or(&r.description);
    if !body.trim().is_empty() {
        let _ = writeln!(out, "- {} {}", r.name, body.trim_end());
    }
}

/// Code blocks the user @-mentioned.
fn mentioned(out: &mut String, legacy: Option<&pb::CmdKLegacyContext>) {
    let mut text = String::new();
    for b in legacy
        .map(|l| l.prompt_code_blocks.as_slice())
        .unwrap_or_default()
    {
        let contents = b.override_contents.as_deref().unwrap_or(&b.contents);
        let _ = write!(
            text,
            "{}:\n```\n{}\n```\n",
            b.relative_workspace_path,
            contents.trim_end()
        );
    }
    section(out, "Code the user mentioned", &text);
}

/// File chunks, outlines, docs, lints, definitions and the like.
fn other_items(out: &mut String, items: &[pb::ContextItem]) {
    let mut text = String::new();
    for item in items {
        let _ = match &item.item {
            Some(Item::FileChunk(c)) => write!(
                text,
                "{} (from line {}):\n```\n{}\n```\n",
                c.relative_workspace_path,
                c.start_line_number,
                c.chunk_contents.trim_end()
            ),
            Some(Item::OutlineChunk(c)) => write!(
                text,
                "Outline of {}:\n```\n{}\n```\n",
                c.relative_workspace_path,
                c.contents.trim_end()
            ),
            Some(Item::DocumentationChunk(d)) => write!(
                text,
                "Documentation {} ({}):\n{}\n",
                d.doc_name,
                d.page_url,
                d.documentation_chunk.trim_end()
            ),
            Some(Item::Lints(l)) => lints(&mut text, l),
            _ => Ok(()),
        };
    }
    section(out, "Context", &text);
}

fn lints(out: &mut String, l: &pb::context_item::Lints) -> std::fmt::Result {
    for lint in &l.lints {
        writeln!(
            out,
            "Lint in {}: {}",
            l.relative_workspace_path, lint.message
        )?;
    }
    Ok(())
}

/// Other prompt bars' edits this one depends on, and those waiting on it.
fn dependent_edits(out: &mut String, r: &pb::StreamCmdKRequest) {
    let mut text = String::new();
    for e in r.previous_edit.iter().chain(&r.previous_edits) {
        let _ = write!(
            text,
            "Already changed in {}:\n```\n{}\n```\nbecame\n```\n{}\n```\n",
            e.relative_path,
            e.original_lines.join("\n"),
            e.new_lines.join("\n")
        );
    }
    for e in &r.upcoming_edits {
        let _ = write!(
            text,
            "About to change in {} (leave to its own edit):\n```\n{}\n```\n",
            e.relative_path,
            e.original_lines.join("\n")
        );
    }
    section(out, "Related edits", &text);
}

/// Earlier turns of the same prompt bar (follow-ups), oldest first.
fn history(out: &mut String, items: &[pb::ContextItem]) {
    let mut turns = Vec::new();
    for item in items {
        match &item.item {
            Some(Item::CmdKQueryHistory(h)) => {
                let mut at = Some(h);
                while let Some(h) = at {
                    let query = h.query.as_ref().map_or("", |q| q.query.as_str());
                    turns.push(format!("Instruction: {query}"));
                    at = h.query_history.as_deref();
                }
            }
            Some(Item::TerminalCmdKQueryHistory(h)) => {
                let mut at = Some(h);
                while let Some(h) = at {
                    let query = h.query.as_ref().map_or("", |q| q.query.as_str());
                    turns.push(format!(
                        "Instruction: {query}\nSuggested command: {}",
                        h.suggested_command
                    ));
                    at = h.query_history.as_deref();
                }
            }
            Some(Item::ChatHistory(h)) => {
                let mut at = Some(h);
                while let Some(h) = at {
                    turns.push(format!(
                        "Question: {}\nAnswer: {}",
                        h.user_message, h.assistant_response
                    ));
                    at = h.chat_history.as_deref();
                }
            }
            _ => {}
        }
    }
    // Nested newest first: the outermost item is the latest earlier turn.
    turns.truncate(MAX_HISTORY_TURNS);
    turns.reverse();
    section(
        out,
        "Earlier in this prompt bar (oldest first)",
        &turns.join("\n\n"),
    );
}

/// The file around the selection (numbered), the selection, and the instruction.
fn editor_focus(out: &mut String, items: &[pb::ContextItem], range: LineRange) {
    let mut file = String::new();
    let mut path = "";
    for item in items {
        if let Some(Item::CmdKImmediateContext(c)) = &item.item {
            path = &c.relative_workspace_path;
            for l in &c.lines {
                let mark = if (range.start..range.end).contains(&l.line_number) {
                    ">"
                } else {
                    " "
                };
                let _ = writeln!(file, "{mark}{:>5} {}", l.line_number, l.line);
            }
        }
    }
    section(
        out,
        &format!("The file {path} around the selection (selected lines marked >)"),
        &file,
    );
    let selection = items.iter().find_map(|i| match &i.item {
        Some(Item::CmdKSelection(s)) => Some(s.lines.join("\n")),
        _ => None,
    });
    match selection.filter(|s| !s.is_empty()) {
        Some(s) => section(
            out,
            &format!("Selected lines {}-{}", range.start, range.end - 1),
            &format!("```\n{s}\n```"),
        ),
        None => section(
            out,
            "Where to insert",
            &format!("Before line {} (nothing is selected).", range.start),
        ),
    }
    section(out, "Instruction", &query(items));
}

fn terminal_focus(out: &mut String, items: &[pb::ContextItem]) {
    for item in items {
        if let Some(Item::TerminalHistory(h)) = &item.item {
            section(out, "Working directory", &h.cwd_full);
            section(out, "Recent terminal output", &h.history);
        }
    }
    section(out, "Instruction", &query(items));
}

/// The user's instruction (`cmd_k_query` or `terminal_cmd_k_query`).
fn query(items: &[pb::ContextItem]) -> String {
    items
        .iter()
        .filter_map(|i| match &i.item {
            Some(Item::CmdKQuery(q)) => Some(q.query.clone()),
            Some(Item::TerminalCmdKQuery(q)) => Some(q.query.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}
