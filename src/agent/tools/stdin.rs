//! `write_shell_stdin`: characters to a background shell's stdin (`write_shell_stdin_args`).
//! The client answers how long the shell's output file was before the input, so the model
//! knows where the answer to its input starts.

use serde_json::{json, Value};

use super::args::Args;
use super::call::{wrap, Access, ExecArgs, ExecResult, ToolError, ToolPlan};
use crate::proto::agent::v1 as pb;
use pb::tool_call::Tool;
use pb::write_shell_stdin_result::Result as W;

pub(crate) fn plan(call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let shell_id = a
        .int_in(&["shell_id", "id", "shell"], 0, i64::from(u32::MAX))?
        .ok_or_else(|| a.error("`shell_id` is required: the id run_terminal_cmd returned"))?;
    let chars = a.str_req(
        &["chars", "input", "text", "data"],
        "string: the characters to write",
    )?;
    // In range: `int_in` bounded it by u32::MAX.
    let args = pb::WriteShellStdinArgs {
        shell_id: u32::try_from(shell_id).unwrap_or(u32::MAX),
        chars,
    };
    Ok(ToolPlan::Exec {
        exec: ExecArgs::WriteShellStdinArgs(args.clone()),
        tool_call: wrap(
            call_id,
            Tool::WriteShellStdinToolCall(pb::WriteShellStdinToolCall {
                args: Some(args),
                result: None,
            }),
        ),
        access: Access::Exclusive,
    })
}

pub(crate) fn finish(
    mut t: pb::WriteShellStdinToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::WriteShellStdinToolCall {
    let answer = results.iter().find_map(|r| match r {
        ExecResult::WriteShellStdinResult(w) if w.result.is_some() => Some(w.clone()),
        _ => None,
    });
    t.result =
        Some(answer.unwrap_or_else(|| failed(thrown.unwrap_or("the client sent no result"))));
    t
}

fn failed(error: &str) -> pb::WriteShellStdinResult {
    pb::WriteShellStdinResult {
        result: Some(W::Error(pb::WriteShellStdinError {
            error: error.to_string(),
        })),
    }
}

pub(crate) fn render(t: &pb::WriteShellStdinToolCall) -> (String, bool) {
    let id = t.args.as_ref().map_or(0, |a| a.shell_id);
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(W::Success(s)) => (
            format!(
                "Wrote to the stdin of shell {}. Its output file was {} bytes long before the input: what the process printed since starts there (read the file with read_file).",
                s.shell_id, s.terminal_file_length_before_input_written
            ),
            false,
        ),
        Some(W::Error(e)) => (
            format!("Writing to the stdin of shell {id} failed: {}", e.error),
            true,
        ),
        None => ("The write to the shell did not complete.".into(), true),
    }
}

pub(crate) fn history_args(t: &pb::WriteShellStdinToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    json!({ "shell_id": a.shell_id, "chars": a.chars })
}

pub(crate) fn with_error(
    mut t: pb::WriteShellStdinToolCall,
    message: &str,
) -> pb::WriteShellStdinToolCall {
    t.result = Some(failed(message));
    t
}
