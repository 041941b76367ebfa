//! `list_dir`, `glob_file_search` and `grep`. Glob runs as a `grep_args` files-with-matches
//! search with an empty pattern and the glob as filter (ripgrep semantics), since the client
//! has no glob exec of its own.

use serde_json::{json, Value};

use super::args::{Args, PATH};
use super::call::{wrap, Access, ExecArgs, ExecResult, ToolContext, ToolError, ToolPlan};
use super::text::{basename, cap_head, to_i32};
use crate::proto::agent::v1 as pb;
use pb::grep_union_result::Result as Union;
use pb::tool_call::Tool;

/// What a listing or a search may put in front of the model.
const MAX_TEXT_BYTES: usize = 30_000;
const MAX_LS_LINES: usize = 500;
/// Glob results kept in the UI tool call.
const MAX_GLOB_FILES: usize = 1000;

const DIR: &[&str] = &[
    "path",
    "directory",
    "dir",
    "target_directory",
    "relative_workspace_path",
    "folder",
];

/// The directory argument, or the workspace root; `None` when neither exists.
fn directory(ctx: &ToolContext, a: &Args, keys: &[&str]) -> Result<Option<String>, ToolError> {
    Ok(match a.str_opt(keys)?.filter(|p| !p.trim().is_empty()) {
        Some(p) => Some(ctx.resolve_path(&p)),
        None => ctx.workspace_root.clone().filter(|r| !r.is_empty()),
    })
}

pub(crate) fn plan_ls(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let path = directory(ctx, a, DIR)?
        .ok_or_else(|| a.error("missing required argument `path` (string: the directory to list; no workspace folder is open)"))?;
    let ignore = a
        .str_list_opt(&["ignore", "ignore_globs", "exclude", "excludes"])?
        .unwrap_or_default();
    let args = pb::LsArgs {
        path,
        ignore,
        tool_call_id: call_id.to_string(),
        ..Default::default()
    };
    Ok(ToolPlan::Exec {
        exec: ExecArgs::LsArgs(args.clone()),
        tool_call: wrap(
            call_id,
            Tool::LsToolCall(pb::LsToolCall {
                args: Some(args),
                result: None,
            }),
        ),
        access: Access::Read,
    })
}

pub(crate) fn finish_ls(
    mut t: pb::LsToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::LsToolCall {
    let found = results.iter().find_map(|m| match m {
        ExecResult::LsResult(r) if r.result.is_some() => Some(r.clone()),
        _ => None,
    });
    let path = t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default();
    t.result = Some(found.unwrap_or_else(|| ls_error(&path, failure(thrown))));
    t
}

fn failure(thrown: Option<&str>) -> String {
    match thrown {
        Some(e) => format!("the client failed: {e}"),
        None => "the client returned no result".into(),
    }
}

fn ls_error(path: &str, error: String) -> pb::LsResult {
    pb::LsResult {
        result: Some(pb::ls_result::Result::Error(pb::LsError {
            path: path.to_string(),
            error,
        })),
    }
}

pub(crate) fn render_ls(t: &pb::LsToolCall) -> (String, bool) {
    use pb::ls_result::Result as L;
    let args_path = t.args.as_ref().map(|a| a.path.as_str()).unwrap_or_default();
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(L::Success(s)) => (tree(s.directory_tree_root.as_ref(), args_path), false),
        Some(L::Timeout(s)) => (
            format!(
                "{}\n[The listing timed out; this result is partial.]",
                tree(s.directory_tree_root.as_ref(), args_path)
            ),
            false,
        ),
        Some(L::Error(e)) => (
            format!("Error listing {}: {}", or(&e.path, args_path), e.error),
            true,
        ),
        Some(L::Rejected(e)) => (
            format!(
                "Listing {} was rejected: {}",
                or(&e.path, args_path),
                e.reason
            ),
            true,
        ),
        None => ("The listing did not complete.".into(), true),
    }
}

fn or<'a>(a: &'a str, b: &'a str) -> &'a str {
    if a.is_empty() {
        b
    } else {
        a
    }
}

/// An indented tree, directories first (as the client ordered them), cut at `MAX_LS_LINES`.
fn tree(root: Option<&pb::LsDirectoryTreeNode>, args_path: &str) -> String {
    let Some(root) = root else {
        return format!("{args_path}/ (empty directory)");
    };
    let mut lines = vec![format!(
        "{}/",
        or(&root.abs_path, args_path).trim_end_matches(['/', '\\'])
    )];
    let mut omitted = 0usize;
    walk(root, 1, &mut lines, &mut omitted);
    if lines.len() == 1 {
        lines[0].push_str(" (empty directory)");
    }
    if omitted > 0 {
        lines.push(format!(
            "[... {omitted} more entries not shown; list a subdirectory to see them]"
        ));
    }
    lines.join("\n")
}

fn walk(
    node: &pb::LsDirectoryTreeNode,
    depth: usize,
    lines: &mut Vec<String>,
    omitted: &mut usize,
) {
    let indent = "  ".repeat(depth);
    for d in &node.children_dirs {
        if lines.len() >= MAX_LS_LINES {
            *omitted += 1;
        } else {
            let unlisted = !d.children_were_processed
                && d.children_dirs.is_empty()
                && d.children_files.is_empty();
            let note = if unlisted && d.num_files > 0 {
                format!(" ({} files, not listed)", d.num_files)
            } else {
                String::new()
            };
            lines.push(format!("{indent}{}/{note}", basename(&d.abs_path)));
        }
        walk(d, depth + 1, lines, omitted);
    }
    for f in &node.children_files {
        if lines.len() >= MAX_LS_LINES {
            *omitted += 1;
        } else {
            lines.push(format!("{indent}{}", f.name));
        }
    }
}

pub(crate) fn ls_history_args(t: &pb::LsToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let mut v = json!({ "path": a.path });
    if !a.ignore.is_empty() {
        v["ignore"] = json!(a.ignore);
    }
    v
}

pub(crate) fn ls_with_error(mut t: pb::LsToolCall, message: &str) -> pb::LsToolCall {
    let path = t.args.as_ref().map(|a| a.path.clone()).unwrap_or_default();
    t.result = Some(ls_error(&path, message.to_string()));
    t
}

pub(crate) fn plan_glob(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let pattern = a.str_nonblank(
        &["glob_pattern", "pattern", "glob", "file_pattern", "name"],
        "string: a glob such as **/*.rs",
    )?;
    let target = a
        .str_opt(&[
            "target_directory",
            "path",
            "directory",
            "dir",
            "cwd",
            "search_path",
        ])?
        .filter(|p| !p.trim().is_empty())
        .map(|p| ctx.resolve_path(&p));
    let dir = target
        .clone()
        .or_else(|| ctx.workspace_root.clone().filter(|r| !r.is_empty()));
    // ripgrep globs are relative to the searched directory: strip it from absolute patterns.
    let glob = match &dir {
        Some(d) => {
            let prefix = format!("{}/", d.trim_end_matches('/'));
            pattern
                .strip_prefix(&prefix)
                .unwrap_or(&pattern)
                .to_string()
        }
        None => pattern.clone(),
    };
    let exec = ExecArgs::GrepArgs(pb::GrepArgs {
        pattern: String::new(),
        path: dir,
        glob: Some(glob),
        output_mode: Some("files_with_matches".into()),
        tool_call_id: call_id.to_string(),
        ..Default::default()
    });
    let tool_call = wrap(
        call_id,
        Tool::GlobToolCall(pb::GlobToolCall {
            args: Some(pb::GlobToolArgs {
                target_directory: target,
                glob_pattern: pattern,
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

fn grep_result(results: &[ExecResult]) -> Option<&pb::grep_result::Result> {
    results.iter().find_map(|m| match m {
        ExecResult::GrepResult(r) => r.result.as_ref(),
        _ => None,
    })
}

/// Workspace results in a stable order (by root), then the active editor's.
fn unions(s: &pb::GrepSuccess) -> Vec<(&str, &Union)> {
    let mut roots: Vec<(&String, &pb::GrepUnionResult)> = s.workspace_results.iter().collect();
    roots.sort_by(|a, b| a.0.cmp(b.0));
    let mut out: Vec<(&str, &Union)> = roots
        .into_iter()
        .filter_map(|(k, v)| v.result.as_ref().map(|r| (k.as_str(), r)))
        .collect();
    if out.is_empty() {
        if let Some(r) = s
            .active_editor_result
            .as_ref()
            .and_then(|r| r.result.as_ref())
        {
            out.push(("", r));
        }
    }
    out
}

pub(crate) fn finish_glob(
    mut t: pb::GlobToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::GlobToolCall {
    use pb::glob_tool_result::Result as G;
    let args = t.args.clone().unwrap_or_default();
    let result = match grep_result(results) {
        Some(pb::grep_result::Result::Success(s)) => {
            let mut files: Vec<String> = Vec::new();
            let (mut total, mut client_truncated, mut ripgrep_truncated) = (0usize, false, false);
            for (_, u) in unions(s) {
                // Whatever shape the client answered in, the file names are what counts.
                let (names, t, c, r): (Vec<&String>, i32, bool, bool) = match u {
                    Union::Files(f) => (
                        f.files.iter().collect(),
                        f.total_files,
                        f.client_truncated,
                        f.ripgrep_truncated,
                    ),
                    Union::Content(c) => (
                        c.matches.iter().map(|m| &m.file).collect(),
                        0,
                        c.client_truncated,
                        c.ripgrep_truncated,
                    ),
                    Union::Count(c) => (
                        c.counts.iter().map(|m| &m.file).collect(),
                        c.total_files,
                        c.client_truncated,
                        c.ripgrep_truncated,
                    ),
                };
                total += usize::try_from(t).unwrap_or(0).max(names.len());
                client_truncated |= c;
                ripgrep_truncated |= r;
                for n in names {
                    if !files.contains(n) {
                        files.push(n.clone());
                    }
                }
            }
            if files.len() > MAX_GLOB_FILES {
                files.truncate(MAX_GLOB_FILES);
                client_truncated = true;
            }
            G::Success(pb::GlobToolSuccess {
                pattern: args.glob_pattern.clone(),
                path: args
                    .target_directory
                    .clone()
                    .unwrap_or_else(|| s.path.clone()),
                total_files: to_i32(total.max(files.len())),
                files,
                client_truncated,
                ripgrep_truncated,
            })
        }
        Some(pb::grep_result::Result::Error(e)) => G::Error(pb::GlobToolError {
            error: e.error.clone(),
        }),
        None => G::Error(pb::GlobToolError {
            error: failure(thrown),
        }),
    };
    t.result = Some(pb::GlobToolResult {
        result: Some(result),
    });
    t
}

pub(crate) fn render_glob(t: &pb::GlobToolCall) -> (String, bool) {
    use pb::glob_tool_result::Result as G;
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(G::Success(s)) => {
            let place = if s.path.is_empty() {
                String::new()
            } else {
                format!(" in {}", s.path)
            };
            if s.files.is_empty() {
                return (
                    format!("No files found matching `{}`{place}.", s.pattern),
                    false,
                );
            }
            let mut text = format!(
                "Found {} files matching `{}`{place}:\n{}",
                s.total_files,
                s.pattern,
                s.files.join("\n")
            );
            let shown = to_i32(s.files.len());
            if s.client_truncated || s.ripgrep_truncated || s.total_files > shown {
                text.push_str(&format!(
                    "\n[Only {shown} files are listed; use a narrower pattern or directory.]"
                ));
            }
            let (capped, cut) = cap_head(&text, MAX_TEXT_BYTES);
            (
                if cut {
                    format!("{capped}[... list cut; use a narrower pattern or directory.]")
                } else {
                    capped
                },
                false,
            )
        }
        Some(G::Error(e)) => (format!("Glob search failed: {}", e.error), true),
        None => ("The file search did not complete.".into(), true),
    }
}

pub(crate) fn glob_history_args(t: &pb::GlobToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let mut v = json!({ "glob_pattern": a.glob_pattern });
    if let Some(d) = a.target_directory {
        v["target_directory"] = json!(d);
    }
    v
}

pub(crate) fn glob_with_error(mut t: pb::GlobToolCall, message: &str) -> pb::GlobToolCall {
    t.result = Some(pb::GlobToolResult {
        result: Some(pb::glob_tool_result::Result::Error(pb::GlobToolError {
            error: message.to_string(),
        })),
    });
    t
}

pub(crate) fn plan_grep(ctx: &ToolContext, call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let pattern = a.str_nonblank(
        &["pattern", "regex", "query", "search_term"],
        "string: a regular expression",
    )?;
    let path = grep_path(ctx, a)?;
    let glob = grep_glob(a)?;
    let output_mode = grep_output_mode(a)?;
    let ctx_arg = |keys: &[&str]| -> Result<Option<i32>, ToolError> {
        Ok(a.int_in(keys, 0, 10_000)?
            .and_then(|v| i32::try_from(v).ok()))
    };
    let case_insensitive = match a.bool_opt(&["case_insensitive", "-i", "ignore_case", "i"])? {
        Some(v) => Some(v),
        None => a.bool_opt(&["case_sensitive"])?.map(|v| !v),
    };
    let args = pb::GrepArgs {
        pattern,
        path,
        glob,
        output_mode: Some(output_mode.to_string()),
        context_before: ctx_arg(&["-B", "context_before", "before_context", "before", "B"])?,
        context_after: ctx_arg(&["-A", "context_after", "after_context", "after", "A"])?,
        context: ctx_arg(&["-C", "context", "context_lines", "C"])?,
        case_insensitive,
        r#type: a.str_opt(&["type", "file_type"])?.filter(|t| !t.is_empty()),
        head_limit: a
            .int_in(
                &["head_limit", "max_results", "max_count", "limit"],
                1,
                1_000_000,
            )?
            .and_then(|v| i32::try_from(v).ok()),
        multiline: a.bool_opt(&["multiline"])?,
        tool_call_id: call_id.to_string(),
        ..Default::default()
    };
    Ok(ToolPlan::Exec {
        exec: ExecArgs::GrepArgs(args.clone()),
        tool_call: wrap(
            call_id,
            Tool::GrepToolCall(pb::GrepToolCall {
                args: Some(args),
                result: None,
            }),
        ),
        access: Access::Read,
    })
}

/// Where to search: a file or directory under any of its spellings, resolved.
fn grep_path(ctx: &ToolContext, a: &Args) -> Result<Option<String>, ToolError> {
    Ok(a.str_opt(
        &[
            PATH,
            &["directory", "dir", "target_directory", "search_path"],
        ]
        .concat(),
    )?
    .filter(|p| !p.trim().is_empty())
    .map(|p| ctx.resolve_path(&p)))
}

/// The files to search: one glob, several joined as `{a,b}`, or none.
fn grep_glob(a: &Args) -> Result<Option<String>, ToolError> {
    Ok(a.str_list_opt(&[
        "glob",
        "include",
        "glob_pattern",
        "file_pattern",
        "includes",
        "include_pattern",
    ])?
    .map(|mut g| {
        g.retain(|s| !s.trim().is_empty());
        g
    })
    .and_then(|g| match g.len() {
        0 => None,
        1 => g.into_iter().next(),
        _ => Some(format!("{{{}}}", g.join(","))),
    }))
}

/// `output_mode` under any of its spellings; content by default.
fn grep_output_mode(a: &Args) -> Result<&'static str, ToolError> {
    Ok(
        match a
            .str_opt(&["output_mode", "mode"])?
            .map(|m| super::args::norm(&m))
        {
            None => "content",
            Some(m) => match m.as_str() {
                "content" | "lines" | "" => "content",
                "fileswithmatches" | "files" | "filenames" | "filesonly" | "l" => {
                    "files_with_matches"
                }
                "count" | "counts" | "c" => "count",
                _ => {
                    return Err(
                        a.error("`output_mode` must be one of content, files_with_matches, count")
                    )
                }
            },
        },
    )
}

pub(crate) fn finish_grep(
    mut t: pb::GrepToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::GrepToolCall {
    let result = match grep_result(results) {
        Some(r) => r.clone(),
        None => pb::grep_result::Result::Error(pb::GrepError {
            error: failure(thrown),
        }),
    };
    t.result = Some(pb::GrepResult {
        result: Some(result),
    });
    t
}

pub(crate) fn render_grep(t: &pb::GrepToolCall) -> (String, bool) {
    let pattern = t
        .args
        .as_ref()
        .map(|a| a.pattern.as_str())
        .unwrap_or_default();
    let s = match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(pb::grep_result::Result::Success(s)) => s,
        Some(pb::grep_result::Result::Error(e)) => {
            return (format!("Search failed: {}", e.error), true)
        }
        None => return ("The search did not complete.".into(), true),
    };
    let parts = unions(s);
    let several = parts.len() > 1;
    let mut text = String::new();
    for (root, u) in parts {
        let body = render_union(u);
        if body.is_empty() {
            continue;
        }
        if several && !root.is_empty() {
            text.push_str(&format!("In {root}:\n"));
        }
        text.push_str(&body);
        text.push('\n');
    }
    if text.trim().is_empty() {
        return (format!("No matches found for `{pattern}`."), false);
    }
    let (capped, cut) = cap_head(text.trim_end(), MAX_TEXT_BYTES);
    let text = if cut {
        format!("{capped}\n[Output cut at {MAX_TEXT_BYTES} bytes; narrow the search with path or glob, or use head_limit.]")
    } else {
        capped
    };
    (text, false)
}

fn render_union(u: &Union) -> String {
    let note = |truncated: bool, what: String| {
        if truncated {
            format!("\n[Results truncated ({what}); narrow the search or use head_limit.]")
        } else {
            String::new()
        }
    };
    match u {
        Union::Content(c) => {
            let mut out = Vec::new();
            for f in &c.matches {
                let mut block = vec![f.file.clone()];
                for m in &f.matches {
                    let sep = if m.is_context_line { '-' } else { ':' };
                    let cut = if m.content_truncated { " [...]" } else { "" };
                    block.push(format!(
                        "{}{sep}{}{cut}",
                        m.line_number,
                        m.content.trim_end_matches(['\n', '\r'])
                    ));
                }
                out.push(block.join("\n"));
            }
            if out.is_empty() {
                return String::new();
            }
            let what = format!("{} matching lines in total", c.total_matched_lines);
            format!(
                "{}{}",
                out.join("\n\n"),
                note(c.client_truncated || c.ripgrep_truncated, what)
            )
        }
        Union::Files(f) => {
            if f.files.is_empty() {
                return String::new();
            }
            let what = format!("{} files in total", f.total_files);
            format!(
                "{}{}",
                f.files.join("\n"),
                note(f.client_truncated || f.ripgrep_truncated, what)
            )
        }
        Union::Count(c) => {
            if c.counts.is_empty() {
                return String::new();
            }
            let lines: Vec<String> = c
                .counts
                .iter()
                .map(|f| format!("{}:{}", f.file, f.count))
                .collect();
            let what = format!("{} files in total", c.total_files);
            format!(
                "{}\nTotal: {} matches in {} files{}",
                lines.join("\n"),
                c.total_matches,
                c.total_files,
                note(c.client_truncated || c.ripgrep_truncated, what)
            )
        }
    }
}

pub(crate) fn grep_history_args(t: &pb::GrepToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let mut v = json!({ "pattern": a.pattern });
    let mut set = |k: &str, x: Option<Value>| {
        if let Some(x) = x {
            v[k] = x;
        }
    };
    set("path", a.path.map(Value::from));
    set("glob", a.glob.map(Value::from));
    set("output_mode", a.output_mode.map(Value::from));
    set("-A", a.context_after.map(Value::from));
    set("-B", a.context_before.map(Value::from));
    set("-C", a.context.map(Value::from));
    set("case_insensitive", a.case_insensitive.map(Value::from));
    set("type", a.r#type.map(Value::from));
    set("head_limit", a.head_limit.map(Value::from));
    set("multiline", a.multiline.map(Value::from));
    v
}

pub(crate) fn grep_with_error(mut t: pb::GrepToolCall, message: &str) -> pb::GrepToolCall {
    t.result = Some(pb::GrepResult {
        result: Some(pb::grep_result::Result::Error(pb::GrepError {
            error: message.to_string(),
        })),
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        path: &str,
        dirs: Vec<pb::LsDirectoryTreeNode>,
        files: &[&str],
    ) -> pb::LsDirectoryTreeNode {
        pb::LsDirectoryTreeNode {
            abs_path: path.into(),
            children_dirs: dirs,
            children_files: files
                .iter()
                .map(|f| pb::ls_directory_tree_node::File {
                    name: (*f).into(),
                    terminal_metadata: None,
                })
                .collect(),
            children_were_processed: true,
            ..Default::default()
        }
    }

    #[test]
    fn ls_renders_an_indented_tree() {
        let mut target = node("/w/target", vec![], &[]);
        target.children_were_processed = false;
        target.num_files = 12;
        let root = node(
            "/w",
            vec![node("/w/src", vec![], &["main.rs"]), target],
            &["Cargo.toml"],
        );
        let t = pb::LsToolCall {
            args: Some(pb::LsArgs {
                path: "/w".into(),
                ..Default::default()
            }),
            result: Some(pb::LsResult {
                result: Some(pb::ls_result::Result::Success(pb::LsSuccess {
                    directory_tree_root: Some(root),
                })),
            }),
        };
        let (text, err) = render_ls(&t);
        assert!(!err);
        assert_eq!(
            text,
            "/w/\n  src/\n    main.rs\n  target/ (12 files, not listed)\n  Cargo.toml"
        );
    }

    #[test]
    fn grep_content_reads_like_ripgrep() {
        let content = pb::GrepContentResult {
            matches: vec![pb::GrepFileMatch {
                file: "src/a.rs".into(),
                matches: vec![
                    pb::GrepContentMatch {
                        line_number: 3,
                        content: "fn a() {".into(),
                        ..Default::default()
                    },
                    pb::GrepContentMatch {
                        line_number: 4,
                        content: "  x".into(),
                        is_context_line: true,
                        ..Default::default()
                    },
                ],
            }],
            total_matched_lines: 1,
            ..Default::default()
        };
        assert_eq!(
            render_union(&Union::Content(content)),
            "src/a.rs\n3:fn a() {\n4-  x"
        );
    }
}
