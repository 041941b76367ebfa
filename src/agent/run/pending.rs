//! Tool calls left without a result (a cancel mid-round): each gets one, from the client's
//! resolution when it sent one, so no provider request ever carries a tool call without its
//! result (all three provider kinds reject that).

use std::sync::{Arc, Mutex};

use crate::agent::tools;
use crate::proto::agent::v1 as pb;
use crate::provider::{AssistantPart, Message};

/// What a call interrupted without a resolution reports to the model.
pub(crate) const INTERRUPTED: &str = "The user interrupted this tool call before it finished; it has no result. Do not assume it ran to completion.";

/// The resolutions a `cancel_action` carried, shared between the inbox pump and the run;
/// `None` until the user cancels.
#[derive(Clone, Default)]
pub(super) struct CancelResolutions(
    Arc<Mutex<Option<Vec<pb::InterruptedPendingToolCallResolution>>>>,
);

impl CancelResolutions {
    /// The user canceled, with these resolutions if any.
    pub(super) fn set(&self, r: Option<pb::InterruptedPendingToolCallResolutions>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(r.map(|r| r.resolutions).unwrap_or_default());
    }

    pub(super) fn get(&self) -> Vec<pb::InterruptedPendingToolCallResolution> {
        let r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        r.clone().unwrap_or_default()
    }

    /// The cancel came from the user (not from the transport giving up on the client).
    pub(super) fn by_user(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

/// Whether a resolution's `tool_call_id` names the model call `model_id` (Cursor's call ids are
/// ours: the model's id with a `#s<step>` suffix).
fn names(resolution_id: &str, model_id: &str) -> bool {
    resolution_id == model_id
        || resolution_id
            .strip_prefix(model_id)
            .is_some_and(|rest| rest.starts_with("#s"))
}

/// The result text for an interrupted call: the client's resolution, else [`INTERRUPTED`].
/// `(content, is_error)`.
pub(crate) fn resolution_for(
    model_id: &str,
    resolutions: &[pb::InterruptedPendingToolCallResolution],
) -> (String, bool) {
    use pb::interrupted_pending_tool_call_resolution::Resolution;
    use pb::tool_call::Tool;
    let found = resolutions
        .iter()
        .find(|r| names(&r.tool_call_id, model_id))
        .and_then(|r| r.resolution.clone());
    let tool = match found {
        Some(Resolution::ShellResult(r)) => Tool::ShellToolCall(pb::ShellToolCall {
            result: Some(r),
            ..Default::default()
        }),
        Some(Resolution::TaskResult(r)) => Tool::TaskToolCall(pb::TaskToolCall {
            result: Some(r),
            ..Default::default()
        }),
        None => return (INTERRUPTED.to_string(), true),
    };
    let tc = pb::ToolCall {
        tool: Some(tool),
        ..Default::default()
    };
    match tools::history_from_tool_call(&tc) {
        Some((_, _, text, is_error)) => (
            format!("(Interrupted by the user; what the tool had produced:)\n{text}"),
            is_error,
        ),
        None => (INTERRUPTED.to_string(), true),
    }
}

/// Give every tool call in `messages` a result: a call with none gets one right after the
/// results of its round, from `resolutions` or [`INTERRUPTED`].
pub(crate) fn close_pending(
    messages: &mut Vec<Message>,
    resolutions: &[pb::InterruptedPendingToolCallResolution],
) {
    let mut i = 0;
    while i < messages.len() {
        let Message::Assistant { parts } = &messages[i] else {
            i += 1;
            continue;
        };
        let calls: Vec<(String, String)> = parts
            .iter()
            .filter_map(|p| match p {
                AssistantPart::ToolCall { id, name, .. } => Some((id.clone(), name.clone())),
                _ => None,
            })
            .collect();
        let mut end = i + 1;
        while matches!(messages.get(end), Some(Message::ToolResult { .. })) {
            end += 1;
        }
        // A call stored as interrupted takes the client's resolution when one comes later.
        for m in &mut messages[i + 1..end] {
            if let Message::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } = m
            {
                if content == INTERRUPTED {
                    (*content, *is_error) = resolution_for(call_id, resolutions);
                }
            }
        }
        let answered: Vec<&str> = messages[i + 1..end]
            .iter()
            .filter_map(|m| match m {
                Message::ToolResult { call_id, .. } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        let missing: Vec<Message> = calls
            .iter()
            .filter(|(id, _)| !answered.contains(&id.as_str()))
            .map(|(id, name)| {
                let (content, is_error) = resolution_for(id, resolutions);
                Message::ToolResult {
                    call_id: id.clone(),
                    name: name.clone(),
                    content,
                    is_error,
                }
            })
            .collect();
        let added = missing.len();
        messages.splice(end..end, missing);
        i = end + added;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str) -> AssistantPart {
        AssistantPart::ToolCall {
            id: id.into(),
            name: "run_terminal_cmd".into(),
            arguments: json!({}),
            extra: None,
        }
    }

    #[test]
    fn a_call_without_result_gets_the_resolution_or_the_interrupted_note() {
        let mut messages = vec![
            Message::user_text("go"),
            Message::Assistant {
                parts: vec![call("a"), call("b")],
            },
            Message::ToolResult {
                call_id: "a".into(),
                name: "run_terminal_cmd".into(),
                content: "ok".into(),
                is_error: false,
            },
            Message::user_text("next"),
            Message::Assistant {
                parts: vec![call("c")],
            },
        ];
        let resolutions = vec![pb::InterruptedPendingToolCallResolution {
            tool_call_id: "c#s4".into(),
            resolution: Some(
                pb::interrupted_pending_tool_call_resolution::Resolution::ShellResult(
                    pb::ShellResult {
                        result: Some(pb::shell_result::Result::Success(pb::ShellSuccess {
                            stdout: "partial output".into(),
                            ..Default::default()
                        })),
                        ..Default::default()
                    },
                ),
            ),
        }];
        close_pending(&mut messages, &resolutions);
        // Run again with nothing new: unchanged; the interrupted one stays until resolved.
        let once = messages.clone();
        close_pending(&mut messages, &resolutions);
        assert_eq!(messages, once);
        let results: Vec<(&str, &str)> = messages
            .iter()
            .filter_map(|m| match m {
                Message::ToolResult {
                    call_id, content, ..
                } => Some((call_id.as_str(), content.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 3);
        assert_eq!(results[1], ("b", INTERRUPTED));
        assert!(matches!(messages[3], Message::ToolResult { .. }));
        assert_eq!(results[2].0, "c");
        assert!(results[2].1.contains("partial output"), "{}", results[2].1);
        assert!(matches!(messages.last(), Some(Message::ToolResult { .. })));
        let b = pb::InterruptedPendingToolCallResolution {
            tool_call_id: "b#s1".into(),
            ..resolutions[0].clone()
        };
        close_pending(&mut messages, &[b]);
        assert!(
            matches!(&messages[3], Message::ToolResult { content, .. } if content.contains("partial output"))
        );
    }

    /// After closing, every provider kind's request pairs each tool call with a result.
    #[test]
    fn closed_history_is_well_formed_for_every_provider_kind() {
        use crate::provider::DecodeCtx;
        use crate::provider::{ProviderKind, ProviderRequest};
        let mut messages = vec![
            Message::user_text("go"),
            Message::Assistant {
                parts: vec![call("x1")],
            },
            Message::user_text("next"),
        ];
        close_pending(&mut messages, &[]);
        let req = ProviderRequest {
            model: "m".into(),
            system: String::new(),
            messages,
            tools: Vec::new(),
            options: Default::default(),
        };
        let ctx = |kind| DecodeCtx {
            kind,
            origin: "o".into(),
            name: "n".into(),
        };
        let chat =
            crate::provider::openai_chat::build_body(&req, &ctx(ProviderKind::OpenAiChat), false)
                .to_string();
        assert!(chat.contains(r#""tool_call_id":"x1""#), "{chat}");
        let anthropic =
            crate::provider::anthropic::build_body(&req, &ctx(ProviderKind::Anthropic)).to_string();
        assert!(anthropic.contains(r#""tool_use_id":"x1""#), "{anthropic}");
        let responses = crate::provider::openai_responses::build_body(
            &req,
            &ctx(ProviderKind::OpenAiResponses),
        )
        .to_string();
        assert!(
            responses.contains("function_call_output") && responses.contains(r#""call_id":"x1""#),
            "{responses}"
        );
    }
}
