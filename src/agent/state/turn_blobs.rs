//! Writing a finished turn the way Cursor's own server does: a `UserMessage` blob, one
//! `ConversationStep` blob per step (with our replay field appended), and a
//! `ConversationTurnStructure` blob referencing them.

use prost::Message as _;
use serde_json::Value;

use super::blob::{Blob, BlobId};
use super::replay::{self, StepReplay};
use crate::proto::agent::v1 as pb;
use crate::provider::ProviderExtra;

/// One finished turn, as the run recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    pub user: pb::UserMessage,
    /// `user` exactly as Cursor sent it, when it did: the blob keeps fields this build does not
    /// know.
    pub user_wire: Option<bytes::Bytes>,
    pub steps: Vec<StepRecord>,
    pub request_id: String,
}

/// One step of a turn, in the order the model produced it (for one model call: thinking, text,
/// then its tool calls; then the next call).
// A turn has a handful of steps, built once: boxing the UI tool call would only make the
// record clumsier to build.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum StepRecord {
    Assistant {
        text: String,
    },
    /// Context that joined the turn between two model calls (steering, a system note): the
    /// model read it as a user message. Cursor's step kinds have no user form, so it is an
    /// empty assistant message for the UI, with the text in our replay field.
    UserContext {
        text: String,
    },
    Thinking {
        text: String,
        duration_ms: u32,
        extra: Option<ProviderExtra>,
    },
    ToolCall {
        /// The UI form, with arguments and result, as sent in `tool_call_completed`.
        tool_call: pb::ToolCall,
        /// What the model saw: its call id, tool name, arguments and the result text.
        call_id: String,
        name: String,
        arguments: Value,
        result: String,
        is_error: bool,
        extra: Option<ProviderExtra>,
    },
}

/// The blobs of one turn. `blobs` lists children first and the turn blob last, each once; the
/// client must ack them all before a checkpoint may reference `turn_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedTurn {
    pub blobs: Vec<Blob>,
    pub turn_id: BlobId,
}

/// Encode a turn into its blobs.
pub fn encode_turn(turn: &TurnRecord) -> EncodedTurn {
    let user = match &turn.user_wire {
        Some(wire) => Blob::new(wire.clone()),
        None => Blob::from_message(&turn.user),
    };
    let mut blobs = vec![user.clone()];
    let mut step_ids = Vec::with_capacity(turn.steps.len());
    for step in &turn.steps {
        let blob = encode_step(step);
        step_ids.push(blob.id_bytes());
        // Identical steps (say, the same short answer twice) share one blob; send it once.
        if !blobs.iter().any(|b| b.id == blob.id) {
            blobs.push(blob);
        }
    }
    let structure = pb::ConversationTurnStructure {
        turn: Some(
            pb::conversation_turn_structure::Turn::AgentConversationTurn(
                pb::AgentConversationTurnStructure {
                    user_message: user.id_bytes(),
                    steps: step_ids,
                    request_id: Some(turn.request_id.clone()).filter(|r| !r.is_empty()),
                    user_message_id: Some(turn.user.message_id.clone()).filter(|m| !m.is_empty()),
                    ..Default::default()
                },
            ),
        ),
    };
    let turn_blob = Blob::from_message(&structure);
    let turn_id = turn_blob.id;
    blobs.push(turn_blob);
    EncodedTurn { blobs, turn_id }
}

/// One `ConversationStep` blob: the step as Cursor knows it, then our replay field.
pub fn encode_step(step: &StepRecord) -> Blob {
    use pb::conversation_step::Message as M;
    let (message, replay) = match step {
        StepRecord::Assistant { text } => (
            M::AssistantMessage(pb::AssistantMessage {
                text: text.clone(),
                ..Default::default()
            }),
            StepReplay::Text {},
        ),
        StepRecord::UserContext { text } => (
            M::AssistantMessage(pb::AssistantMessage::default()),
            StepReplay::UserContext { text: text.clone() },
        ),
        StepRecord::Thinking {
            text,
            duration_ms,
            extra,
        } => (
            M::ThinkingMessage(pb::ThinkingMessage {
                text: text.clone(),
                duration_ms: *duration_ms,
                ..Default::default()
            }),
            StepReplay::Thinking {
                extra: extra.clone(),
            },
        ),
        StepRecord::ToolCall {
            tool_call,
            call_id,
            name,
            arguments,
            result,
            is_error,
            extra,
        } => (
            M::ToolCall(tool_call.clone()),
            StepReplay::ToolCall {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
                result: result.clone(),
                is_error: *is_error,
                extra: extra.clone(),
            },
        ),
    };
    let mut buf = pb::ConversationStep {
        message: Some(message),
    }
    .encode_to_vec();
    replay::append_json(&mut buf, &replay);
    Blob::new(buf)
}

/// A command the user ran from the chat and its output, as Cursor stores it: a
/// `ShellConversationTurnStructure` over `ShellCommand` and `ShellOutput` blobs. Returns every
/// blob (the turn last) and the turn's id.
pub fn encode_shell_turn(command: &str, output: &pb::ShellOutput) -> (Vec<Blob>, BlobId) {
    let cmd = Blob::from_message(&pb::ShellCommand {
        command: command.to_string(),
    });
    let out = Blob::from_message(output);
    let turn = Blob::from_message(&pb::ConversationTurnStructure {
        turn: Some(
            pb::conversation_turn_structure::Turn::ShellConversationTurn(
                pb::ShellConversationTurnStructure {
                    shell_command: cmd.id_bytes(),
                    shell_output: out.id_bytes(),
                },
            ),
        ),
    });
    let id = turn.id;
    (vec![cmd, out, turn], id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{ExtraData, ProviderKind};
    use serde_json::json;

    pub(crate) fn sample_turn() -> TurnRecord {
        TurnRecord {
            user: pb::UserMessage {
                text: "list the files".into(),
                message_id: "m1".into(),
                ..Default::default()
            },
            user_wire: None,
            steps: vec![
                StepRecord::Thinking {
                    text: "let me look".into(),
                    duration_ms: 120,
                    extra: Some(ProviderExtra {
                        kind: ProviderKind::Anthropic,
                        origin: "https://api.anthropic.com".into(),
                        data: ExtraData::AnthropicThinking {
                            thinking: "let me look".into(),
                            signature: "sig".into(),
                        },
                    }),
                },
                StepRecord::ToolCall {
                    tool_call: pb::ToolCall {
                        tool: Some(pb::tool_call::Tool::LsToolCall(Default::default())),
                        ..Default::default()
                    },
                    call_id: "toolu_1".into(),
                    name: "ls".into(),
                    arguments: json!({"path": "."}),
                    result: "a.rs\nb.rs".into(),
                    is_error: false,
                    extra: None,
                },
                StepRecord::Assistant {
                    text: "Two files.".into(),
                },
            ],
            request_id: "req-1".into(),
        }
    }

    #[test]
    fn blobs_decode_as_cursor_messages() {
        let turn = sample_turn();
        let enc = encode_turn(&turn);
        assert_eq!(enc.blobs.len(), 5);
        for b in &enc.blobs {
            assert_eq!(b.id, crate::proto::blob_id(&b.data));
        }
        let last = enc.blobs.last().unwrap();
        assert_eq!(last.id, enc.turn_id);
        let structure = pb::ConversationTurnStructure::decode(last.data.clone()).unwrap();
        let Some(pb::conversation_turn_structure::Turn::AgentConversationTurn(t)) = structure.turn
        else {
            panic!("not an agent turn")
        };
        assert_eq!(t.user_message.as_ref(), enc.blobs[0].id.as_slice());
        assert_eq!(t.request_id.as_deref(), Some("req-1"));
        assert_eq!(t.user_message_id.as_deref(), Some("m1"));
        let ids: Vec<&[u8]> = t.steps.iter().map(|s| s.as_ref()).collect();
        let expected: Vec<&[u8]> = enc.blobs[1..4].iter().map(|b| b.id.as_slice()).collect();
        assert_eq!(ids, expected);
        assert_eq!(
            pb::UserMessage::decode(enc.blobs[0].data.clone()).unwrap(),
            turn.user
        );
    }

    #[test]
    fn extended_step_decodes_to_the_same_step_and_keeps_replay() {
        let turn = sample_turn();
        let StepRecord::ToolCall { tool_call, .. } = &turn.steps[1] else {
            panic!()
        };
        let blob = encode_step(&turn.steps[1]);
        let step = pb::ConversationStep::decode(blob.data.clone()).unwrap();
        assert_eq!(
            step,
            pb::ConversationStep {
                message: Some(pb::conversation_step::Message::ToolCall(tool_call.clone()))
            }
        );
        // The extension is exactly what follows the plain encoding.
        let plain = step.encode_to_vec();
        assert!(blob.data.starts_with(&plain));
        let replay: StepReplay = replay::extract_json(&blob.data).unwrap();
        assert_eq!(
            replay,
            StepReplay::ToolCall {
                call_id: "toolu_1".into(),
                name: "ls".into(),
                arguments: json!({"path": "."}),
                result: "a.rs\nb.rs".into(),
                is_error: false,
                extra: None,
            }
        );
        let thinking: StepReplay = replay::extract_json(&encode_step(&turn.steps[0]).data).unwrap();
        let StepReplay::Thinking { extra: Some(extra) } = thinking else {
            panic!()
        };
        assert_eq!(extra.origin, "https://api.anthropic.com");
    }

    #[test]
    fn the_extension_is_invisible_to_reflection() {
        // A decoder that knows the full schema (like Cursor's) sees a plain ConversationStep.
        use prost_reflect::{DescriptorPool, DynamicMessage};
        let pool = DescriptorPool::decode(crate::proto::DESCRIPTOR_SET).unwrap();
        let desc = pool
            .get_message_by_name("agent.v1.ConversationStep")
            .unwrap();
        let blob = encode_step(&StepRecord::Assistant { text: "hi".into() });
        let msg = DynamicMessage::decode(desc, blob.data.clone()).unwrap();
        assert!(msg.has_field_by_name("assistant_message"));
    }

    #[test]
    fn identical_steps_share_a_blob() {
        let mut turn = sample_turn();
        turn.steps.push(StepRecord::Assistant {
            text: "Two files.".into(),
        });
        let enc = encode_turn(&turn);
        assert_eq!(enc.blobs.len(), 5);
    }
}
