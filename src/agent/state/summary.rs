//! Keeping the history inside the model's context window: a cheap token estimate and the plan
//! for summarising older messages.
//!
//! The run asks the model for a summary of [`Compaction::older`] (see [`summary_prompt`]), sends
//! `summary_started` / `summary` / `summary_completed` updates, continues with
//! `[summary_message(text)] + keep`, and records the summary in the checkpoint with
//! [`Checkpoint::set_summary`](super::Checkpoint::set_summary) so the next turn's rebuild starts
//! from it.

use std::fmt::Write;

use crate::base::text::{cut_chars, tail_chars};
use crate::provider::{AssistantPart, Message, UserPart};

/// First line of the user message that stands for summarised turns.
pub(crate) const SUMMARY_PREFIX: &str = "[Summary of the earlier conversation]";

/// Rough cost of an image: providers bill roughly 1–2k tokens for a typical screenshot.
const IMAGE_TOKENS: u64 = 1_000;
/// Per-message framing (role markers, ids).
const MESSAGE_TOKENS: u64 = 4;
/// One tool result in a summary transcript is cut to this many characters.
const TRANSCRIPT_RESULT_CHARS: usize = 4_000;

/// Estimated prompt tokens of `messages`: characters / 4 (a fair average for English and code,
/// an over-estimate for nothing but CJK), images at a flat rate.
pub(crate) fn estimate_tokens(messages: &[Message]) -> u64 {
    messages.iter().map(message_tokens).sum()
}

fn message_tokens(m: &Message) -> u64 {
    let chars = |s: &str| s.chars().count() as u64;
    let body = match m {
        Message::User { parts } => parts
            .iter()
            .map(|p| match p {
                UserPart::Text { text } => chars(text).div_ceil(4),
                UserPart::Image { .. } => IMAGE_TOKENS,
            })
            .sum(),
        Message::Assistant { parts } => parts
            .iter()
            .map(|p| match p {
                AssistantPart::Text { text } | AssistantPart::Reasoning { text, .. } => {
                    chars(text).div_ceil(4)
                }
                AssistantPart::ToolCall {
                    name, arguments, ..
                } => (chars(name) + chars(&arguments.to_string())).div_ceil(4),
            })
            .sum(),
        Message::ToolResult { content, .. } => chars(content).div_ceil(4),
    };
    body + MESSAGE_TOKENS
}

/// A split of the history: `older` is to be summarised, `keep` stays verbatim.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Compaction {
    pub older: Vec<Message>,
    pub keep: Vec<Message>,
    /// Index in the original slice where `keep` starts (see
    /// [`RebuiltHistory::turn_through`](super::RebuiltHistory::turn_through)).
    pub split: usize,
}

/// Plan a compaction when `messages` would not fit in `context_window - reserve` tokens
/// (`reserve`: the system prompt, tool definitions and room for the answer); `None` when they fit
/// or nothing can be split off.
///
/// `keep` is the longest tail that fits in half the budget (the rest of it is left for the
/// summary and the turn's growth), starting at a user message so each tool call stays with its
/// result. If no user boundary fits — one turn with huge tool output — it may start at an
/// assistant message that follows tool results (still never between a call and its result); if
/// nothing fits, it keeps the shortest tail possible.
pub(crate) fn plan_compaction(
    messages: &[Message],
    context_window: u32,
    reserve: u32,
) -> Option<Compaction> {
    let budget = u64::from(context_window.saturating_sub(reserve));
    if estimate_tokens(messages) <= budget {
        return None;
    }
    let keep_budget = budget / 2;
    // suffix[i] = estimated tokens of messages[i..].
    let mut suffix = vec![0u64; messages.len() + 1];
    for i in (0..messages.len()).rev() {
        suffix[i] = suffix[i + 1] + message_tokens(&messages[i]);
    }
    let user_bounds: Vec<usize> = (1..messages.len())
        .filter(|&i| matches!(messages[i], Message::User { .. }))
        .collect();
    let assistant_bounds: Vec<usize> = (1..messages.len())
        .filter(|&i| {
            matches!(messages[i], Message::Assistant { .. })
                && matches!(messages[i - 1], Message::ToolResult { .. })
        })
        .collect();
    let fits = |i: &&usize| suffix[**i] <= keep_budget;
    let split = user_bounds
        .iter()
        .find(fits)
        .or_else(|| assistant_bounds.iter().find(fits))
        .or_else(|| user_bounds.last().max(assistant_bounds.last()))
        .copied()?;
    Some(Compaction {
        older: messages[..split].to_vec(),
        keep: messages[split..].to_vec(),
        split,
    })
}

/// The user message that replaces summarised messages.
pub(crate) fn summary_message(summary: &str) -> Message {
    Message::user_text(format!("{SUMMARY_PREFIX}\n{}", summary.trim()))
}

/// A self-contained request for a summary of `older`, as one user message holding a plain-text
/// transcript (so it needs no tool definitions and no provider extras). The transcript keeps
/// its most recent part when it would exceed `max_chars`.
pub(crate) fn summary_prompt(older: &[Message], max_chars: usize) -> Vec<Message> {
    let mut t = String::new();
    for m in older {
        match m {
            Message::User { parts } => {
                t.push_str("USER:\n");
                for p in parts {
                    match p {
                        UserPart::Text { text } => t.push_str(text),
                        UserPart::Image { .. } => t.push_str("[image]"),
                    }
                    t.push('\n');
                }
            }
            Message::Assistant { parts } => {
                for p in parts {
                    match p {
                        AssistantPart::Text { text } => {
                            let _ = writeln!(t, "ASSISTANT:\n{text}");
                        }
                        // Reasoning is the model's scratchpad; the summary needs what it did.
                        AssistantPart::Reasoning { .. } => {}
                        AssistantPart::ToolCall {
                            name, arguments, ..
                        } => {
                            let _ = writeln!(t, "ASSISTANT called {name} {arguments}");
                        }
                    }
                }
            }
            Message::ToolResult {
                name,
                content,
                is_error,
                ..
            } => {
                let status = if *is_error { " (failed)" } else { "" };
                let _ = writeln!(
                    t,
                    "RESULT of {name}{status}:\n{}",
                    cut_chars(content, TRANSCRIPT_RESULT_CHARS, "…[truncated]")
                );
            }
        }
    }
    let t = tail_chars(&t, max_chars, "[…earlier part cut…]\n");
    let prompt = format!(
        "Summarise the conversation below between a user and a coding agent, so that the agent \
         can continue the work without it. Keep: the user's goals and constraints, decisions \
         made, files read or changed (with paths) and what changed, commands run and their \
         outcome, errors still open, and what remains to do. Be concise and factual; use \
         Markdown bullet points. Reply with the summary only.\n\n<conversation>\n{t}\n</conversation>"
    );
    vec![Message::user_text(prompt)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(t: &str) -> Message {
        Message::user_text(t)
    }
    fn call(id: &str) -> Message {
        Message::Assistant {
            parts: vec![AssistantPart::ToolCall {
                id: id.into(),
                name: "read".into(),
                arguments: json!({"path": "a"}),
                extra: None,
            }],
        }
    }
    fn result(id: &str, size: usize) -> Message {
        Message::ToolResult {
            call_id: id.into(),
            name: "read".into(),
            content: "x".repeat(size),
            is_error: false,
        }
    }
    fn text(t: &str) -> Message {
        Message::Assistant {
            parts: vec![AssistantPart::Text { text: t.into() }],
        }
    }

    #[test]
    fn estimates() {
        assert_eq!(estimate_tokens(&[user("abcdefgh")]), 2 + MESSAGE_TOKENS);
        let img = Message::User {
            parts: vec![UserPart::Image {
                mime_type: "image/png".into(),
                data: "A".repeat(100_000),
            }],
        };
        assert_eq!(estimate_tokens(&[img]), IMAGE_TOKENS + MESSAGE_TOKENS);
    }

    #[test]
    fn nothing_to_do_when_it_fits() {
        assert_eq!(
            plan_compaction(&[user("hi"), text("hello")], 1000, 100),
            None
        );
    }

    #[test]
    fn splits_at_a_user_turn_keeping_pairs_together() {
        let msgs = vec![
            user("one"),
            call("1"),
            result("1", 4000),
            text("done"),
            user("two"),
            call("2"),
            result("2", 400),
            text("done"),
            user("three"),
            call("3"),
            result("3", 400),
        ];
        let c = plan_compaction(&msgs, 1200, 200).unwrap();
        assert_eq!(c.split, 4);
        assert_eq!(c.older, msgs[..4]);
        assert_eq!(c.keep, msgs[4..]);
        assert!(matches!(c.keep[0], Message::User { .. }));
        // No call is separated from its result.
        for (i, m) in c.keep.iter().enumerate() {
            if let Message::ToolResult { call_id, .. } = m {
                assert!(c.keep[..i].iter().any(|p| *p == call(call_id)));
            }
        }
    }

    #[test]
    fn one_huge_turn_splits_after_tool_results() {
        let msgs = vec![
            user("one"),
            call("1"),
            result("1", 8000),
            call("2"),
            result("2", 100),
            text("done"),
        ];
        let c = plan_compaction(&msgs, 1000, 100).unwrap();
        assert_eq!(c.split, 3);
        assert!(matches!(c.keep[0], Message::Assistant { .. }));
        assert!(matches!(c.older.last(), Some(Message::ToolResult { .. })));
    }

    #[test]
    fn keeps_the_shortest_tail_when_nothing_fits() {
        let msgs = vec![user("a"), text("b"), user(&"x".repeat(40_000))];
        let c = plan_compaction(&msgs, 1000, 100).unwrap();
        assert_eq!(c.split, 2);
        assert_eq!(
            plan_compaction(&[user(&"x".repeat(40_000))], 1000, 100),
            None
        );
    }

    #[test]
    fn summary_prompt_is_plain_text_and_bounded() {
        let msgs = vec![
            user("fix the bug"),
            call("1"),
            result("1", 10_000),
            text("fixed"),
        ];
        let p = summary_prompt(&msgs, 1_000_000);
        let [Message::User { parts }] = p.as_slice() else {
            panic!()
        };
        let UserPart::Text { text } = &parts[0] else {
            panic!()
        };
        assert!(
            text.contains("fix the bug") && text.contains("read") && text.contains("[truncated]")
        );
        let p = summary_prompt(&msgs, 100);
        let Message::User { parts } = &p[0] else {
            panic!()
        };
        let UserPart::Text { text } = &parts[0] else {
            panic!()
        };
        assert!(text.contains("fixed") && !text.contains("fix the bug"));
        let Message::User { parts } = summary_message(" s ") else {
            panic!()
        };
        assert_eq!(
            parts[0],
            UserPart::Text {
                text: format!("{SUMMARY_PREFIX}\ns")
            }
        );
    }
}
