//! `read_lints`: one `diagnostics_args` exec per path, shown as one `ReadLintsToolCall`.

use serde_json::{json, Value};

use super::args::Args;
use super::call::{wrap, Access, ExecArgs, ExecResult, ToolContext, ToolError, ToolPlan};
use super::text::{cap_head, to_i32};
use crate::proto::agent::v1 as pb;
use pb::read_lints_tool_result::Result as L;
use pb::tool_call::Tool;

const MAX_TEXT_BYTES: usize = 30_000;
/// Paths one call may ask about (each is an exec).
const MAX_PATHS: usize = 50;

pub(crate) fn plan(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let mut paths: Vec<String> = a
        .str_list_opt(&["paths", "path", "files", "file_paths", "target_files"])?
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| ctx.resolve_path(&p))
        .collect();
    if paths.is_empty() {
        match ctx.workspace_root.clone().filter(|r| !r.is_empty()) {
            Some(root) => paths.push(root),
            None => return Err(a.error("missing required argument `paths` (array of file paths; no workspace folder is open)")),
        }
    }
    if paths.len() > MAX_PATHS {
        return Err(a.error(format!(
            "at most {MAX_PATHS} paths per call (got {})",
            paths.len()
        )));
    }
    let mut execs: Vec<ExecArgs> = paths
        .iter()
        .map(|p| {
            ExecArgs::DiagnosticsArgs(pb::DiagnosticsArgs {
                path: p.clone(),
                tool_call_id: call_id.to_string(),
            })
        })
        .collect();
    let tool_call = wrap(
        call_id,
        Tool::ReadLintsToolCall(pb::ReadLintsToolCall {
            args: Some(pb::ReadLintsToolArgs { paths }),
            result: None,
        }),
    );
    Ok(match execs.len() {
        1 => ToolPlan::Exec {
            exec: execs.remove(0),
            tool_call,
            access: Access::Read,
        },
        _ => ToolPlan::ExecEach { execs, tool_call },
    })
}

fn item(d: &pb::Diagnostic) -> pb::DiagnosticItem {
    pb::DiagnosticItem {
        severity: d.severity,
        range: d.range.as_ref().map(|r| pb::DiagnosticRange {
            start: r.start,
            end: r.end,
        }),
        message: d.message.clone(),
        source: d.source.clone(),
        code: d.code.clone(),
        is_stale: d.is_stale,
    }
}

pub(crate) fn finish(
    mut t: pb::ReadLintsToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::ReadLintsToolCall {
    use pb::diagnostics_result::Result as D;
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for r in results.iter().filter_map(|m| match m {
        ExecResult::DiagnosticsResult(r) => r.result.as_ref(),
        _ => None,
    }) {
        match r {
            D::Success(s) => files.push(pb::FileDiagnostics {
                path: s.path.clone(),
                diagnostics: s.diagnostics.iter().map(item).collect(),
                diagnostics_count: to_i32(s.diagnostics.len()),
            }),
            D::Error(e) => errors.push(format!("{}: {}", e.path, e.error)),
            D::Rejected(e) => errors.push(format!("{}: rejected: {}", e.path, e.reason)),
            D::FileNotFound(e) => errors.push(format!("{}: file not found", e.path)),
            D::PermissionDenied(e) => errors.push(format!("{}: permission denied", e.path)),
        }
    }
    if let Some(e) = thrown {
        errors.push(format!("the client failed: {e}"));
    }
    if files.is_empty() && errors.is_empty() {
        errors.push("the client returned no diagnostics".into());
    }
    let success = pb::ReadLintsToolSuccess {
        total_files: to_i32(files.len()),
        total_diagnostics: files.iter().map(|f| f.diagnostics_count).sum(),
        file_diagnostics: files,
    };
    let result = if errors.is_empty() {
        L::Success(success)
    } else {
        // The result has no room for per-file failures: say everything in the error text.
        let mut message = format!("Could not read diagnostics for:\n- {}", errors.join("\n- "));
        if !success.file_diagnostics.is_empty() {
            message.push_str("\n\nDiagnostics for the other paths:\n");
            message.push_str(&render_success(&success));
        }
        L::Error(pb::ReadLintsToolError {
            error_message: message,
        })
    };
    t.result = Some(pb::ReadLintsToolResult {
        result: Some(result),
    });
    t
}

fn severity(s: i32) -> &'static str {
    match pb::DiagnosticSeverity::try_from(s) {
        Ok(pb::DiagnosticSeverity::Error) => "error",
        Ok(pb::DiagnosticSeverity::Warning) => "warning",
        Ok(pb::DiagnosticSeverity::Information) => "info",
        Ok(pb::DiagnosticSeverity::Hint) => "hint",
        _ => "diagnostic",
    }
}

fn render_success(s: &pb::ReadLintsToolSuccess) -> String {
    if s.total_diagnostics == 0 || s.file_diagnostics.iter().all(|f| f.diagnostics.is_empty()) {
        return "No linter errors found.".into();
    }
    let mut out = Vec::new();
    for f in s
        .file_diagnostics
        .iter()
        .filter(|f| !f.diagnostics.is_empty())
    {
        out.push(format!("{}:", f.path));
        for d in &f.diagnostics {
            let (line, col) = d
                .range
                .as_ref()
                .and_then(|r| r.start.as_ref())
                .map_or((0, 0), |p| (p.line, p.column));
            let origin = match (d.source.is_empty(), d.code.is_empty()) {
                (false, false) => format!(" [{} {}]", d.source, d.code),
                (false, true) => format!(" [{}]", d.source),
                (true, false) => format!(" [{}]", d.code),
                (true, true) => String::new(),
            };
            let stale = if d.is_stale { " (may be stale)" } else { "" };
            out.push(format!(
                "  line {line}:{col}: {}: {}{origin}{stale}",
                severity(d.severity),
                d.message
            ));
        }
    }
    let (text, cut) = cap_head(&out.join("\n"), MAX_TEXT_BYTES);
    if cut {
        format!("{text}[... more diagnostics not shown; ask for fewer paths.]")
    } else {
        text
    }
}

pub(crate) fn render(t: &pb::ReadLintsToolCall) -> (String, bool) {
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(L::Success(s)) => (render_success(s), false),
        Some(L::Error(e)) => (e.error_message.clone(), true),
        None => ("Reading diagnostics did not complete.".into(), true),
    }
}

pub(crate) fn history_args(t: &pb::ReadLintsToolCall) -> Value {
    json!({ "paths": t.args.clone().unwrap_or_default().paths })
}

pub(crate) fn with_error(mut t: pb::ReadLintsToolCall, message: &str) -> pb::ReadLintsToolCall {
    t.result = Some(pb::ReadLintsToolResult {
        result: Some(L::Error(pb::ReadLintsToolError {
            error_message: message.to_string(),
        })),
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::diagnostics_result::Result as D;

    fn diag(path: &str, message: &str) -> ExecResult {
        ExecResult::DiagnosticsResult(pb::DiagnosticsResult {
            result: Some(D::Success(pb::DiagnosticsSuccess {
                path: path.into(),
                diagnostics: vec![pb::Diagnostic {
                    severity: pb::DiagnosticSeverity::Error as i32,
                    range: Some(pb::Range {
                        start: Some(pb::Position { line: 3, column: 7 }),
                        end: None,
                    }),
                    message: message.into(),
                    source: "rustc".into(),
                    code: "E0308".into(),
                    is_stale: false,
                }],
                total_diagnostics: 1,
            })),
        })
    }

    #[test]
    fn diagnostics_of_several_paths_are_listed_per_file() {
        let t = finish(
            pb::ReadLintsToolCall::default(),
            &[diag("/w/a.rs", "mismatched types"), diag("/w/b.rs", "x")],
            None,
        );
        let (text, err) = render(&t);
        assert!(!err);
        assert!(
            text.starts_with(
                "/w/a.rs:\n  line 3:7: error: mismatched types [rustc E0308]\n/w/b.rs:"
            ),
            "{text}"
        );
        let empty = ExecResult::DiagnosticsResult(pb::DiagnosticsResult {
            result: Some(D::Success(pb::DiagnosticsSuccess {
                path: "/w/c.rs".into(),
                ..Default::default()
            })),
        });
        assert_eq!(
            render(&finish(Default::default(), &[empty], None)).0,
            "No linter errors found."
        );
    }

    #[test]
    fn failures_are_reported_with_the_rest() {
        let nf = ExecResult::DiagnosticsResult(pb::DiagnosticsResult {
            result: Some(D::FileNotFound(pb::DiagnosticsFileNotFound {
                path: "/w/x.rs".into(),
            })),
        });
        let (text, err) = render(&finish(
            Default::default(),
            &[nf, diag("/w/a.rs", "bad")],
            None,
        ));
        assert!(err);
        assert!(
            text.contains("/w/x.rs: file not found") && text.contains("bad [rustc E0308]"),
            "{text}"
        );
    }
}
