//! `read_file` and `delete_file`.

use serde_json::{json, Value};

use super::args::{Args, LIMIT, OFFSET, PATH};
use super::call::{wrap, Access, ExecArgs, ExecResult, ToolContext, ToolError, ToolPlan};
use super::catalog::READ_DEFAULT_LINES;
use super::text::to_u32;
use crate::proto::agent::v1 as pb;
use pb::read_result::Result as Read;
use pb::read_tool_result::Result as ReadTool;
use pb::tool_call::Tool;

/// What one read may put in front of the model.
const MAX_READ_BYTES: usize = 100_000;
/// Longer lines (minified files) are cut.
const MAX_LINE_CHARS: usize = 2000;

pub(crate) fn plan_read(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let path = ctx.resolve_path(&a.str_nonblank(PATH, "string: the file to read")?);
    let offset = a
        .int_in(OFFSET, i64::from(i32::MIN), i64::from(i32::MAX))?
        .and_then(|v| i32::try_from(v).ok());
    let limit = a
        .int_in(LIMIT, 1, i64::from(i32::MAX))?
        .and_then(|v| i32::try_from(v).ok());
    // The range is applied here, not by the client: its offset base is not documented, and
    // slicing locally keeps the numbering the model sees exact.
    let exec = ExecArgs::ReadArgs(pb::ReadArgs {
        path: path.clone(),
        tool_call_id: call_id.to_string(),
        ..Default::default()
    });
    let tool_call = wrap(
        call_id,
        Tool::ReadToolCall(pb::ReadToolCall {
            args: Some(pb::ReadToolArgs {
                path,
                offset,
                limit,
                include_line_numbers: Some(true),
            }),
            result: None,
        }),
    );
    Ok(ToolPlan::Exec {
        exec,
        tool_call,
        access: Access::Read,
    })
}

pub(crate) fn finish_read(
    mut t: pb::ReadToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::ReadToolCall {
    let args = t.args.clone().unwrap_or_default();
    let found = results.iter().find_map(|m| match m {
        ExecResult::ReadResult(r) | ExecResult::RedactedReadResult(r) => Some(r),
        _ => None,
    });
    let result = match (found, thrown) {
        (Some(r), _) => read_to_tool(&args, r),
        (None, Some(e)) => read_error(format!("The client failed to read {}: {e}", args.path)),
        (None, None) => read_error(format!("The client returned no result for {}", args.path)),
    };
    t.result = Some(pb::ReadToolResult {
        result: Some(result),
    });
    t
}

fn read_error(message: String) -> ReadTool {
    ReadTool::Error(pb::ReadToolError {
        error_message: message,
    })
}

fn read_to_tool(args: &pb::ReadToolArgs, r: &pb::ReadResult) -> ReadTool {
    let path = |p: &str| {
        if p.is_empty() {
            args.path.clone()
        } else {
            p.to_string()
        }
    };
    match &r.result {
        Some(Read::Success(s)) => match &s.output {
            Some(pb::read_success::Output::Content(c)) => slice(args, s, c),
            Some(pb::read_success::Output::Data(d)) => read_error(format!(
                "{} is a binary file ({} bytes) and cannot be shown as text",
                path(&s.path),
                d.len()
            )),
            None => slice(args, s, ""),
        },
        Some(Read::Error(e)) => read_error(format!("Error reading {}: {}", path(&e.path), e.error)),
        Some(Read::Rejected(e)) => read_error(format!(
            "Reading {} was rejected: {}",
            path(&e.path),
            e.reason
        )),
        Some(Read::FileNotFound(e)) => read_error(format!("File not found: {}", path(&e.path))),
        Some(Read::PermissionDenied(e)) => {
            read_error(format!("Permission denied reading {}", path(&e.path)))
        }
        Some(Read::InvalidFile(e)) => {
            read_error(format!("Cannot read {}: {}", path(&e.path), e.reason))
        }
        None => read_error(format!(
            "The client returned an empty read result for {}",
            args.path
        )),
    }
}

/// Cut the requested range (1-based `offset`, negative from the end) out of the whole file.
fn slice(args: &pb::ReadToolArgs, s: &pb::ReadSuccess, content: &str) -> ReadTool {
    let lines: Vec<&str> = content.lines().collect();
    let total = lines.len();
    // When the client truncated the file, its own count is the true one.
    let total_reported = total.max(usize::try_from(s.total_lines).unwrap_or(0));
    let start = match args.offset {
        None | Some(0) => 1,
        Some(o) if o > 0 => usize::try_from(o).unwrap_or(usize::MAX),
        Some(o) => {
            total.saturating_sub(usize::try_from(o.unsigned_abs()).unwrap_or(usize::MAX)) + 1
        }
    };
    if total > 0 && start > total {
        return read_error(format!(
            "offset {} is past the end of {}, which has {total} lines",
            args.offset.unwrap_or_default(),
            args.path
        ));
    }
    let limit = args
        .limit
        .and_then(|l| usize::try_from(l).ok())
        .filter(|l| *l > 0)
        .unwrap_or(READ_DEFAULT_LINES);
    let mut out = String::new();
    let mut end = start - 1;
    for (i, line) in lines.iter().enumerate().skip(start - 1).take(limit) {
        let line = crate::base::text::cut_chars(line, MAX_LINE_CHARS, "… [line truncated]");
        if !out.is_empty() && out.len() + line.len() > MAX_READ_BYTES {
            break;
        }
        out.push_str(&line);
        out.push('\n');
        end = i + 1;
    }
    ReadTool::Success(pb::ReadToolSuccess {
        output: Some(pb::read_tool_success::Output::Content(out)),
        is_empty: total == 0,
        exceeded_limit: end < total_reported || s.truncated,
        total_lines: to_u32(total_reported),
        file_size: u32::try_from(s.file_size).unwrap_or(u32::MAX),
        path: if s.path.is_empty() {
            args.path.clone()
        } else {
            s.path.clone()
        },
        read_range: Some(pb::ReadRange {
            start_line: to_u32(start),
            end_line: to_u32(end),
        }),
        include_line_numbers: Some(true),
        ..Default::default()
    })
}

pub(crate) fn render_read(t: &pb::ReadToolCall) -> (String, bool) {
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(ReadTool::Success(s)) => {
            let content = match &s.output {
                Some(pb::read_tool_success::Output::Content(c)) => c.as_str(),
                None => "",
                Some(_) => return ("(The file content is not available as text.)".into(), false),
            };
            if content.is_empty() {
                return (
                    if s.is_empty || s.total_lines == 0 {
                        "File is empty."
                    } else {
                        "(No lines in this range.)"
                    }
                    .into(),
                    false,
                );
            }
            let start = s.read_range.as_ref().map_or(1, |r| r.start_line.max(1));
            let mut text = String::with_capacity(content.len() + content.len() / 8);
            let mut last = start;
            for (i, line) in content.lines().enumerate() {
                last = start.saturating_add(to_u32(i));
                text.push_str(&format!("{last:>6}\t{line}\n"));
            }
            if s.exceeded_limit {
                text.push_str(&format!(
                    "\n[Showing lines {start}-{last} of {}. Use offset and limit to read other parts.]\n",
                    s.total_lines
                ));
            }
            (text, false)
        }
        Some(ReadTool::Error(e)) => (e.error_message.clone(), true),
        None => ("The read did not complete.".into(), true),
    }
}

pub(crate) fn read_history_args(t: &pb::ReadToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let mut v = json!({ "path": a.path });
    if let Some(o) = a.offset {
        v["offset"] = json!(o);
    }
    if let Some(l) = a.limit {
        v["limit"] = json!(l);
    }
    v
}

pub(crate) fn read_with_error(mut t: pb::ReadToolCall, message: &str) -> pb::ReadToolCall {
    t.result = Some(pb::ReadToolResult {
        result: Some(read_error(message.to_string())),
    });
    t
}

pub(crate) fn plan_delete(
    ctx: &ToolContext,
    call_id: &str,
    a: &Args,
) -> Result<ToolPlan, ToolError> {
    let path = ctx.resolve_path(&a.str_nonblank(PATH, "string: the file to delete")?);
    let args = pb::DeleteArgs {
        path: path.clone(),
        tool_call_id: call_id.to_string(),
    };
    Ok(ToolPlan::Exec {
        exec: ExecArgs::DeleteArgs(args.clone()),
        tool_call: wrap(
            call_id,
            Tool::DeleteToolCall(pb::DeleteToolCall {
                args: Some(args),
                result: None,
            }),
        ),
        access: Access::Write { path },
    })
}

pub(crate) fn finish_delete(
    mut t: pb::DeleteToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::DeleteToolCall {
    let path = t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default();
    let found = results.iter().find_map(|m| match m {
        ExecResult::DeleteResult(r) if r.result.is_some() => Some(r.clone()),
        _ => None,
    });
    t.result = Some(found.unwrap_or_else(|| {
        let error = match thrown {
            Some(e) => format!("the client failed: {e}"),
            None => "the client returned no result".into(),
        };
        delete_error(&path, error)
    }));
    t
}

fn delete_error(path: &str, error: String) -> pb::DeleteResult {
    pb::DeleteResult {
        result: Some(pb::delete_result::Result::Error(pb::DeleteError {
            path: path.to_string(),
            error,
        })),
    }
}

pub(crate) fn render_delete(t: &pb::DeleteToolCall) -> (String, bool) {
    use pb::delete_result::Result as D;
    let args_path = t.args.as_ref().map(|a| a.path.as_str()).unwrap_or_default();
    let path = |p: &str| {
        if p.is_empty() {
            args_path.to_string()
        } else {
            p.to_string()
        }
    };
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(D::Success(s)) => (format!("Deleted {}.", path(&s.path)), false),
        Some(D::FileNotFound(e)) => (format!("File not found: {}", path(&e.path)), true),
        Some(D::NotFile(e)) => (
            format!(
                "{} is not a file (it is a {}); only files can be deleted",
                path(&e.path),
                e.actual_type
            ),
            true,
        ),
        Some(D::PermissionDenied(e)) => {
            let detail = if e.client_visible_error.is_empty() {
                String::new()
            } else {
                format!(": {}", e.client_visible_error)
            };
            (
                format!("Permission denied deleting {}{detail}", path(&e.path)),
                true,
            )
        }
        Some(D::FileBusy(e)) => (
            format!("{} is in use and could not be deleted", path(&e.path)),
            true,
        ),
        Some(D::Rejected(e)) => (
            format!("Deleting {} was rejected: {}", path(&e.path), e.reason),
            true,
        ),
        Some(D::Error(e)) => (
            format!("Error deleting {}: {}", path(&e.path), e.error),
            true,
        ),
        None => ("The delete did not complete.".into(), true),
    }
}

pub(crate) fn delete_with_error(mut t: pb::DeleteToolCall, message: &str) -> pb::DeleteToolCall {
    let path = t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default();
    t.result = Some(delete_error(&path, message.to_string()));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_call(offset: Option<i32>, limit: Option<i32>) -> pb::ReadToolCall {
        pb::ReadToolCall {
            args: Some(pb::ReadToolArgs {
                path: "/w/a.txt".into(),
                offset,
                limit,
                include_line_numbers: Some(true),
            }),
            result: None,
        }
    }

    fn success(content: &str) -> ExecResult {
        ExecResult::ReadResult(pb::ReadResult {
            result: Some(Read::Success(pb::ReadSuccess {
                path: "/w/a.txt".into(),
                output: Some(pb::read_success::Output::Content(content.into())),
                total_lines: i32::try_from(content.lines().count()).unwrap(),
                file_size: i64::try_from(content.len()).unwrap(),
                ..Default::default()
            })),
        })
    }

    fn read(offset: Option<i32>, limit: Option<i32>, results: &[ExecResult]) -> (String, bool) {
        render_read(&finish_read(read_call(offset, limit), results, None))
    }

    #[test]
    fn numbers_lines_from_the_range_start() {
        let content = "a\nb\nc\nd\n";
        assert_eq!(
            read(None, None, &[success(content)]).0,
            "     1\ta\n     2\tb\n     3\tc\n     4\td\n"
        );
        let (text, err) = read(Some(2), Some(2), &[success(content)]);
        assert!(!err);
        assert!(text.starts_with("     2\tb\n     3\tc\n"), "{text}");
        assert!(text.contains("[Showing lines 2-3 of 4."), "{text}");
        assert!(read(Some(-1), None, &[success(content)])
            .0
            .starts_with("     4\td\n"));
        let (text, err) = read(Some(9), None, &[success(content)]);
        assert!(err && text.contains("past the end"), "{text}");
        assert_eq!(read(None, None, &[success("")]).0, "File is empty.");
    }

    #[test]
    fn long_files_stop_at_the_default_limit() {
        let content: String = (1..=2500).map(|i| format!("l{i}\n")).collect();
        let (text, _) = read(None, None, &[success(&content)]);
        assert!(text.contains("  2000\tl2000\n") && !text.contains("l2001"));
        assert!(text.contains("[Showing lines 1-2000 of 2500."));
    }

    #[test]
    fn read_errors_are_clear() {
        let cases = [
            (
                Read::FileNotFound(pb::ReadFileNotFound {
                    path: "/w/a.txt".into(),
                }),
                "File not found: /w/a.txt",
            ),
            (
                Read::PermissionDenied(pb::ReadPermissionDenied {
                    path: String::new(),
                }),
                "Permission denied reading /w/a.txt",
            ),
            (
                Read::InvalidFile(pb::ReadInvalidFile {
                    path: "/w/a.txt".into(),
                    reason: "is a directory".into(),
                }),
                "Cannot read /w/a.txt: is a directory",
            ),
            (
                Read::Error(pb::ReadError {
                    path: "/w/a.txt".into(),
                    error: "EIO".into(),
                }),
                "Error reading /w/a.txt: EIO",
            ),
            (
                Read::Rejected(pb::ReadRejected {
                    path: "/w/a.txt".into(),
                    reason: "ignored file".into(),
                }),
                "Reading /w/a.txt was rejected: ignored file",
            ),
        ];
        for (r, want) in cases {
            let got = read(
                None,
                None,
                &[ExecResult::ReadResult(pb::ReadResult { result: Some(r) })],
            );
            assert_eq!(got, (want.to_string(), true));
        }
        let got = render_read(&finish_read(read_call(None, None), &[], Some("boom")));
        assert_eq!(
            got,
            ("The client failed to read /w/a.txt: boom".to_string(), true)
        );
    }
}
