//! Builders for the server messages a run sends, so the run reads as a sequence of events.

use super::run_io::RunOutput;
use crate::proto::agent::v1 as pb;
use pb::agent_server_message::Message as Server;
use pb::interaction_update::Message as Update;

pub fn update(message: Update) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(Server::InteractionUpdate(pb::InteractionUpdate {
            message: Some(message),
            message_started_at_ms: None,
        })),
        ttft_breakdown: None,
    }
}

pub fn text_delta(text: String) -> pb::AgentServerMessage {
    update(Update::TextDelta(pb::TextDeltaUpdate {
        text,
        is_server_notice: false,
    }))
}

/// A line from the proxy itself (e.g. "tool round limit reached"), rendered as a notice.
pub(crate) fn notice(text: String) -> pb::AgentServerMessage {
    update(Update::TextDelta(pb::TextDeltaUpdate {
        text,
        is_server_notice: true,
    }))
}

pub fn thinking_delta(text: String) -> pb::AgentServerMessage {
    update(Update::ThinkingDelta(pb::ThinkingDeltaUpdate {
        text,
        thinking_style: None,
    }))
}

pub fn thinking_completed(duration_ms: u64) -> pb::AgentServerMessage {
    update(Update::ThinkingCompleted(pb::ThinkingCompletedUpdate {
        thinking_duration_ms: i32::try_from(duration_ms).unwrap_or(i32::MAX),
    }))
}

pub(crate) fn token_delta(tokens: u32) -> pb::AgentServerMessage {
    update(Update::TokenDelta(pb::TokenDeltaUpdate {
        tokens: i32::try_from(tokens).unwrap_or(i32::MAX),
    }))
}

pub fn step_started(step_id: u64) -> pb::AgentServerMessage {
    update(Update::StepStarted(pb::StepStartedUpdate { step_id }))
}

pub fn step_completed(step_id: u64, duration_ms: u64) -> pb::AgentServerMessage {
    update(Update::StepCompleted(pb::StepCompletedUpdate {
        step_id,
        step_duration_ms: i64::try_from(duration_ms).unwrap_or(i64::MAX),
    }))
}

pub fn heartbeat() -> pb::AgentServerMessage {
    update(Update::Heartbeat(pb::HeartbeatUpdate {}))
}

pub fn turn_ended(usage: &crate::provider::Usage) -> pb::AgentServerMessage {
    let n = |v: u64| Some(i64::try_from(v).unwrap_or(i64::MAX));
    update(Update::TurnEnded(pb::TurnEndedUpdate {
        input_tokens: n(usage.input),
        output_tokens: n(usage.output),
        cache_read_tokens: n(usage.cache_read),
        cache_write_tokens: n(usage.cache_write),
        reasoning_tokens: n(usage.reasoning),
        ended_at_ms: Some(now_unix_ms()),
    }))
}

/// Milliseconds since the Unix epoch (0 on a clock set before it).
fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub fn exec(
    id: u32,
    exec_id: String,
    args: pb::exec_server_message::Message,
) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(Server::ExecServerMessage(pb::ExecServerMessage {
            id,
            message: Some(args),
            exec_id,
            ..Default::default()
        })),
        ttft_breakdown: None,
    }
}

pub(crate) fn exec_abort(id: u32) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(Server::ExecServerControlMessage(
            pb::ExecServerControlMessage {
                message: Some(pb::exec_server_control_message::Message::Abort(
                    pb::ExecServerAbort { id },
                )),
            },
        )),
        ttft_breakdown: None,
    }
}

/// A rough token count for a text delta (about four characters a token), for Cursor's live
/// counter; the exact figures come with `turn_ended`.
pub(crate) fn estimate_tokens(text: &str) -> u32 {
    let chars = u32::try_from(text.chars().count()).unwrap_or(u32::MAX);
    chars.div_ceil(4).max(1)
}

pub(crate) fn partial_tool_call(
    call_id: String,
    model_call_id: String,
    tool_call: pb::ToolCall,
    args_text_delta: String,
) -> pb::AgentServerMessage {
    update(Update::PartialToolCall(pb::PartialToolCallUpdate {
        call_id,
        tool_call: Some(tool_call),
        args_text_delta,
        model_call_id,
    }))
}

pub(crate) fn tool_call_started(
    call_id: String,
    model_call_id: String,
    tool_call: pb::ToolCall,
) -> pb::AgentServerMessage {
    update(Update::ToolCallStarted(pb::ToolCallStartedUpdate {
        call_id,
        tool_call: Some(tool_call),
        model_call_id,
    }))
}

pub(crate) fn tool_call_completed(
    call_id: String,
    model_call_id: String,
    tool_call: pb::ToolCall,
) -> pb::AgentServerMessage {
    update(Update::ToolCallCompleted(pb::ToolCallCompletedUpdate {
        call_id,
        tool_call: Some(tool_call),
        model_call_id,
    }))
}

pub fn tool_call_delta(call_id: String, delta: pb::ToolCallDelta) -> pb::AgentServerMessage {
    update(Update::ToolCallDelta(Box::new(pb::ToolCallDeltaUpdate {
        call_id,
        tool_call_delta: Some(Box::new(delta)),
        model_call_id: String::new(),
    })))
}

pub(crate) fn summary_started() -> pb::AgentServerMessage {
    update(Update::SummaryStarted(pb::SummaryStartedUpdate {}))
}

pub fn summary(text: String) -> pb::AgentServerMessage {
    update(Update::Summary(pb::SummaryUpdate { summary: text }))
}

pub(crate) fn summary_completed(failed: bool) -> pb::AgentServerMessage {
    update(Update::SummaryCompleted(pb::SummaryCompletedUpdate {
        hook_message: None,
        failed: failed.then_some(true),
    }))
}

pub fn interaction_query(id: u32, query: pb::interaction_query::Query) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(Server::InteractionQuery(pb::InteractionQuery {
            id,
            query: Some(query),
        })),
        ttft_breakdown: None,
    }
}

pub fn kv(id: u32, message: pb::kv_server_message::Message) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(Server::KvServerMessage(pb::KvServerMessage {
            id,
            message: Some(message),
            span_context: None,
        })),
        ttft_breakdown: None,
    }
}

pub fn checkpoint(state: pb::ConversationStateStructure) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(Server::ConversationCheckpointUpdate(state)),
        ttft_breakdown: None,
    }
}

/// A checkpoint whose encoding `state_wire` keeps Cursor's fields (see
/// [`Checkpoint::encode_over`](crate::agent::state::Checkpoint::encode_over)); `state` is its
/// decoded form.
pub(crate) fn checkpoint_encoded(
    state: pb::ConversationStateStructure,
    state_wire: &[u8],
) -> RunOutput {
    use prost::encoding::{encode_key, encode_varint, WireType};
    /// `AgentServerMessage.conversation_checkpoint_update`.
    const CHECKPOINT: u32 = 3;
    let mut wire = Vec::with_capacity(state_wire.len() + 8);
    encode_key(CHECKPOINT, WireType::LengthDelimited, &mut wire);
    encode_varint(state_wire.len() as u64, &mut wire);
    wire.extend_from_slice(state_wire);
    RunOutput::Encoded(Box::new(checkpoint(state)), wire.into())
}

/// The state of a context injection (steering), acknowledged to the client.
pub(crate) fn injection_state(
    injection_id: String,
    state: pb::context_injection_state::State,
) -> pb::AgentServerMessage {
    update(Update::ContextInjectionState(
        pb::ContextInjectionStateUpdate {
            injection_id,
            state: Some(pb::ContextInjectionState { state: Some(state) }),
        },
    ))
}

/// `delivered`: the model call that carries the injection starts (as step `step`).
pub(crate) fn injection_delivered(injection_id: String, step: u64) -> pb::AgentServerMessage {
    injection_state(
        injection_id.clone(),
        pb::context_injection_state::State::Delivered(pb::ContextInjectionDelivered {
            step: i32::try_from(step).unwrap_or(i32::MAX),
            delivery_batch_id: format!("{injection_id}@{step}"),
            delivered_at_ms: i64::try_from(now_unix_ms()).unwrap_or(i64::MAX),
        }),
    )
}
