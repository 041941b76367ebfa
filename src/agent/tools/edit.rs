//! `search_replace` and `write`. Both show in Cursor as an `EditToolCall`.
//!
//! An edit reads the whole file through the client, replaces in memory, and writes the full
//! new text back through the client: the workspace may be remote, and the client is the only
//! one that can touch it.

use std::borrow::Cow;

use serde_json::{json, Value};

use super::args::{Args, PATH};
use super::call::{wrap, Access, EditSpec, ExecArgs, ExecResult, ToolContext, ToolError, ToolPlan};
use super::diff;
use super::text::to_i32;
use crate::proto::agent::v1 as pb;
use pb::edit_result::Result as E;
use pb::tool_call::Tool;

const OLD: &[&str] = &[
    "old_string",
    "old_str",
    "oldText",
    "old_text",
    "search",
    "old",
];
const NEW: &[&str] = &[
    "new_string",
    "new_str",
    "newText",
    "new_text",
    "replace",
    "replacement",
    "new",
];
const CONTENTS: &[&str] = &["contents", "content", "file_text", "text", "code", "data"];

/// An edit applied in memory: `exec` is the write to send to the client; the rest is kept
/// for [`super::finish_edit`] (diff, before/after for the UI).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EditWrite {
    pub exec: ExecArgs,
    before: String,
    after: String,
}

impl EditWrite {
    #[cfg(test)]
    pub fn after(&self) -> &str {
        &self.after
    }
}

pub(crate) fn plan(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let path = ctx.resolve_path(&a.str_nonblank(PATH, "string: the file to edit")?);
    let old_string = a.str_req(
        OLD,
        "string: the exact text to replace; empty to create a new file",
    )?;
    let new_string = a.str_req(NEW, "string: the replacement text")?;
    let replace_all = a
        .bool_opt(&["replace_all", "replaceAll", "all", "global"])?
        .unwrap_or(false);
    if old_string == new_string {
        return Err(a.error("`old_string` and `new_string` are identical; nothing would change"));
    }
    Ok(ToolPlan::Edit {
        tool_call: edit_call(call_id, &path),
        path,
        edit: EditSpec {
            old_string,
            new_string,
            replace_all,
        },
    })
}

fn edit_call(call_id: &str, path: &str) -> pb::ToolCall {
    wrap(
        call_id,
        Tool::EditToolCall(pb::EditToolCall {
            args: Some(pb::EditArgs {
                path: path.to_string(),
                stream_content: None,
            }),
            result: None,
        }),
    )
}

pub(crate) fn plan_write(
    ctx: &ToolContext,
    call_id: &str,
    a: &Args,
) -> Result<ToolPlan, ToolError> {
    let path = ctx.resolve_path(&a.str_nonblank(PATH, "string: the file to write")?);
    let contents = a.str_req(CONTENTS, "string: the complete new contents of the file")?;
    Ok(ToolPlan::Exec {
        exec: write_args(&path, contents, call_id),
        tool_call: edit_call(call_id, &path),
        access: Access::Write { path },
    })
}

fn write_args(path: &str, text: String, call_id: &str) -> ExecArgs {
    ExecArgs::WriteArgs(pb::WriteArgs {
        path: path.to_string(),
        file_text: text,
        tool_call_id: call_id.to_string(),
        ..Default::default()
    })
}

/// The finished tool call with `result` set.
fn with_result(tool_call: &pb::ToolCall, result: E) -> pb::ToolCall {
    let mut tc = tool_call.clone();
    if let Some(Tool::EditToolCall(t)) = &mut tc.tool {
        t.result = Some(pb::EditResult {
            result: Some(result),
        });
    }
    tc
}

fn edit_error(path: &str, message: String) -> E {
    E::Error(pb::EditError {
        path: path.to_string(),
        error: message.clone(),
        model_visible_error: Some(message),
    })
}

/// The write to exec next; `Err` is the call finished as failed (e.g. `old_string` not found).
// Once per edit: the large error (the UI tool call) costs nothing worth boxing for.
#[allow(clippy::result_large_err)]
pub(crate) fn apply(
    path: &str,
    edit: &EditSpec,
    tool_call: &pb::ToolCall,
    read: &[ExecResult],
    thrown: Option<&str>,
) -> Result<EditWrite, pb::ToolCall> {
    use pb::read_result::Result as R;
    let fail = |r: E| with_result(tool_call, r);
    let found = read.iter().find_map(|m| match m {
        ExecResult::ReadResult(r) | ExecResult::RedactedReadResult(r) => r.result.as_ref(),
        _ => None,
    });
    let before = match found {
        Some(R::Success(s)) => {
            // Writing back a truncated read would cut the file.
            if s.truncated {
                return Err(fail(edit_error(
                    path,
                    format!("{path} is too large to edit through the client (the read was truncated); write the complete contents with `write` instead"),
                )));
            }
            match &s.output {
                Some(pb::read_success::Output::Content(c)) => c.clone(),
                Some(pb::read_success::Output::Data(_)) => {
                    return Err(fail(edit_error(
                        path,
                        format!("{path} is a binary file and cannot be edited as text"),
                    )))
                }
                None => String::new(),
            }
        }
        Some(R::FileNotFound(_)) if edit.old_string.is_empty() => String::new(),
        Some(R::FileNotFound(_)) => {
            return Err(fail(E::FileNotFound(pb::EditFileNotFound {
                path: path.to_string(),
            })))
        }
        Some(R::PermissionDenied(_)) => {
            return Err(fail(E::ReadPermissionDenied(
                pb::EditReadPermissionDenied {
                    path: path.to_string(),
                },
            )))
        }
        Some(R::Rejected(r)) => {
            return Err(fail(E::Rejected(pb::EditRejected {
                path: path.to_string(),
                reason: r.reason.clone(),
            })))
        }
        Some(R::Error(e)) => {
            return Err(fail(edit_error(
                path,
                format!("could not read {path}: {}", e.error),
            )))
        }
        Some(R::InvalidFile(e)) => {
            return Err(fail(edit_error(
                path,
                format!("cannot edit {path}: {}", e.reason),
            )))
        }
        None => {
            let why = thrown.unwrap_or("the client returned no content");
            return Err(fail(edit_error(
                path,
                format!("could not read {path}: {why}"),
            )));
        }
    };
    let after = replace(&before, edit, path).map_err(|m| fail(edit_error(path, m)))?;
    let call_id = tool_call.tool_call_id.clone().unwrap_or_default();
    Ok(EditWrite {
        exec: write_args(path, after.clone(), &call_id),
        before,
        after,
    })
}

/// The new text, or the message for the model when the edit cannot apply.
fn replace(before: &str, edit: &EditSpec, path: &str) -> Result<String, String> {
    if edit.old_string.is_empty() {
        if before.is_empty() {
            return Ok(edit.new_string.clone());
        }
        return Err(format!(
            "old_string is empty but {path} already has content; give the exact text to replace, or use `write` to replace the whole file"
        ));
    }
    let (old, new) = line_endings(before, &edit.old_string, &edit.new_string);
    match before.matches(old.as_ref()).count() {
        0 => Err(format!(
            "old_string not found in {path}. It must match the file exactly, including whitespace and indentation; read the file again to see its current content."
        )),
        1 => Ok(before.replacen(old.as_ref(), new.as_ref(), 1)),
        _ if edit.replace_all => Ok(before.replace(old.as_ref(), new.as_ref())),
        n => Err(format!(
            "old_string matches {n} times in {path}; add more context or set replace_all"
        )),
    }
}

/// Strings are matched as given; only when that fails on a CRLF file and the model wrote bare
/// LFs are both sides converted to CRLF (models rarely reproduce `\r`).
fn line_endings<'a>(before: &str, old: &'a str, new: &'a str) -> (Cow<'a, str>, Cow<'a, str>) {
    if !before.contains(old)
        && before.contains("\r\n")
        && old.contains('\n')
        && !old.contains("\r\n")
    {
        let crlf =
            |s: &str| -> Cow<'a, str> { Cow::Owned(s.replace("\r\n", "\n").replace('\n', "\r\n")) };
        let converted = crlf(old);
        if before.contains(converted.as_ref()) {
            return (converted, crlf(new));
        }
    }
    (Cow::Borrowed(old), Cow::Borrowed(new))
}

/// `Ok` when the client wrote the file, else the `EditResult` error to show.
#[allow(clippy::result_large_err)]
fn write_status(path: &str, results: &[ExecResult], thrown: Option<&str>) -> Result<(), E> {
    use pb::write_result::Result as W;
    let found = results.iter().find_map(|m| match m {
        ExecResult::WriteResult(r) => r.result.as_ref(),
        _ => None,
    });
    match found {
        Some(W::Success(_)) => Ok(()),
        Some(W::PermissionDenied(p)) => {
            Err(E::WritePermissionDenied(pb::EditWritePermissionDenied {
                path: path.to_string(),
                error: p.error.clone(),
                is_readonly: p.is_readonly,
            }))
        }
        Some(W::NoSpace(_)) => Err(edit_error(
            path,
            format!("no space left on the device writing {path}"),
        )),
        Some(W::Error(e)) => Err(edit_error(
            path,
            format!("could not write {path}: {}", e.error),
        )),
        Some(W::Rejected(r)) => Err(E::Rejected(pb::EditRejected {
            path: path.to_string(),
            reason: r.reason.clone(),
        })),
        None => Err(edit_error(
            path,
            format!(
                "could not write {path}: {}",
                thrown.unwrap_or("the client returned no result")
            ),
        )),
    }
}

/// After the write of a `write` call (no read before it: the previous content is unknown).
pub(crate) fn finish_write(
    mut t: pb::EditToolCall,
    contents: &str,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::EditToolCall {
    let path = t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default();
    let result = match write_status(&path, results, thrown) {
        Ok(()) => E::Success(pb::EditSuccess {
            path,
            lines_added: Some(to_i32(contents.lines().count())),
            after_full_file_content: contents.to_string(),
            ..Default::default()
        }),
        Err(e) => e,
    };
    t.result = Some(pb::EditResult {
        result: Some(result),
    });
    t
}

/// After the write of a search-and-replace edit: the call with its result.
pub(crate) fn finish(
    tool_call: &pb::ToolCall,
    write: &EditWrite,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::ToolCall {
    let path = match &tool_call.tool {
        Some(Tool::EditToolCall(t)) => t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default(),
        _ => String::new(),
    };
    let result = match write_status(&path, results, thrown) {
        Ok(()) => {
            let d = diff::summary(&write.before, &write.after, &path);
            E::Success(pb::EditSuccess {
                path,
                lines_added: Some(to_i32(d.added)),
                lines_removed: Some(to_i32(d.removed)),
                diff_string: Some(d.unified),
                before_full_file_content: Some(write.before.clone()),
                after_full_file_content: write.after.clone(),
                message: None,
            })
        }
        Err(e) => e,
    };
    with_result(tool_call, result)
}

pub(crate) fn render(t: &pb::EditToolCall) -> (String, bool) {
    let args_path = t.args.as_ref().map(|a| a.path.as_str()).unwrap_or_default();
    let path = |p: &str| {
        if p.is_empty() {
            args_path.to_string()
        } else {
            p.to_string()
        }
    };
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(E::Success(s)) => {
            let mut text = match &s.before_full_file_content {
                None => format!(
                    "Wrote {} ({} lines).",
                    path(&s.path),
                    s.lines_added.unwrap_or_else(|| to_i32(s.after_full_file_content.lines().count()))
                ),
                Some(b) if b.is_empty() => format!(
                    "Created {} ({} lines).",
                    path(&s.path),
                    s.lines_added.unwrap_or_default()
                ),
                Some(_) => format!(
                    "Edited {}: {} lines added, {} removed.",
                    path(&s.path),
                    s.lines_added.unwrap_or_default(),
                    s.lines_removed.unwrap_or_default()
                ),
            };
            if let Some(m) = s.message.as_deref().filter(|m| !m.is_empty()) {
                text.push(' ');
                text.push_str(m);
            }
            (text, false)
        }
        Some(E::FileNotFound(e)) => (
            format!(
                "File not found: {}. To create a file use `write`, or search_replace with an empty old_string.",
                path(&e.path)
            ),
            true,
        ),
        Some(E::ReadPermissionDenied(e)) => (format!("Permission denied reading {}", path(&e.path)), true),
        Some(E::WritePermissionDenied(e)) => {
            let ro = if e.is_readonly { " (read-only)" } else { "" };
            let detail = if e.error.is_empty() { String::new() } else { format!(": {}", e.error) };
            (format!("Permission denied writing {}{ro}{detail}", path(&e.path)), true)
        }
        Some(E::Rejected(e)) => {
            let reason = if e.reason.is_empty() { "no reason given" } else { e.reason.as_str() };
            (format!("The change to {} was rejected: {reason}", path(&e.path)), true)
        }
        Some(E::Error(e)) => (
            e.model_visible_error.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| {
                format!("Error editing {}: {}", path(&e.path), e.error)
            }),
            true,
        ),
        None => ("The edit did not complete.".into(), true),
    }
}

/// An edit that read first becomes `search_replace` over the smallest line-aligned changed
/// region; one that did not (a full write) becomes `write`.
pub(crate) fn history(t: &pb::EditToolCall) -> (String, Value) {
    let path = t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default();
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(E::Success(s)) => match &s.before_full_file_content {
            Some(before) => {
                let (old, new) = diff::changed_region(before, &s.after_full_file_content);
                (
                    "search_replace".into(),
                    json!({"path": path, "old_string": old, "new_string": new}),
                )
            }
            // Written elsewhere with only a diff: an empty `after` is not an empty file.
            None if s.after_full_file_content.is_empty()
                && s.diff_string.as_deref().is_some_and(|d| !d.is_empty()) =>
            {
                (
                    "search_replace".into(),
                    json!({"path": path, "diff": s.diff_string}),
                )
            }
            None => (
                "write".into(),
                json!({"path": path, "contents": s.after_full_file_content}),
            ),
        },
        _ => ("search_replace".into(), json!({ "path": path })),
    }
}

pub(crate) fn with_error(mut t: pb::EditToolCall, message: &str) -> pb::EditToolCall {
    let path = t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default();
    t.result = Some(pb::EditResult {
        result: Some(edit_error(&path, message.to_string())),
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(old: &str, new: &str, all: bool) -> EditSpec {
        EditSpec {
            old_string: old.into(),
            new_string: new.into(),
            replace_all: all,
        }
    }

    #[test]
    fn replace_requires_a_unique_match() {
        let p = "/w/f.rs";
        assert_eq!(
            replace("a b a", &spec("b", "c", false), p).unwrap(),
            "a c a"
        );
        let e = replace("a b a", &spec("a", "x", false), p).unwrap_err();
        assert_eq!(
            e,
            "old_string matches 2 times in /w/f.rs; add more context or set replace_all"
        );
        assert_eq!(replace("a b a", &spec("a", "x", true), p).unwrap(), "x b x");
        let e = replace("a b a", &spec("zz", "x", false), p).unwrap_err();
        assert!(e.starts_with("old_string not found in /w/f.rs"), "{e}");
    }

    #[test]
    fn empty_old_string_creates_only_empty_files() {
        assert_eq!(replace("", &spec("", "new", false), "f").unwrap(), "new");
        assert!(replace("x", &spec("", "new", false), "f")
            .unwrap_err()
            .contains("already has content"));
    }

    #[test]
    fn crlf_files_accept_lf_edits() {
        let before = "one\r\ntwo\r\nthree\r\n";
        let after = replace(before, &spec("one\ntwo\n", "1\n2\n", false), "f").unwrap();
        assert_eq!(after, "1\r\n2\r\nthree\r\n");
        // An exact match is used as given.
        assert_eq!(
            replace("a\nb", &spec("a\nb", "c", false), "f").unwrap(),
            "c"
        );
    }
}
