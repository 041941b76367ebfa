//! `web_fetch` through the client's `fetch_args` (offered only when the client supports it).

use serde_json::{json, Value};

use super::args::Args;
use super::call::{wrap, Access, ExecArgs, ExecResult, ToolError, ToolPlan};
use super::text::{cap_head, cap_middle};
use crate::proto::agent::v1 as pb;
use pb::fetch_result::Result as F;
use pb::tool_call::Tool;

const MAX_MODEL_BYTES: usize = 50_000;
const MAX_UI_BYTES: usize = 200_000;

pub(crate) fn plan(call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let url = a.str_nonblank(
        &["url", "uri", "link", "href"],
        "string: an http:// or https:// URL",
    )?;
    let url = url.trim().to_string();
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(a.error(format!(
            "`url` must start with http:// or https:// (got `{url}`)"
        )));
    }
    let args = pb::FetchArgs {
        url,
        tool_call_id: call_id.to_string(),
    };
    Ok(ToolPlan::Exec {
        exec: ExecArgs::FetchArgs(args.clone()),
        tool_call: wrap(
            call_id,
            Tool::FetchToolCall(pb::FetchToolCall {
                args: Some(args),
                result: None,
            }),
        ),
        access: Access::Read,
    })
}

pub(crate) fn finish(
    mut t: pb::FetchToolCall,
    results: &[ExecResult],
    thrown: Option<&str>,
) -> pb::FetchToolCall {
    let url = t.args.as_ref().map(|a| a.url.clone()).unwrap_or_default();
    let found = results.iter().find_map(|m| match m {
        ExecResult::FetchResult(r) => r.result.clone(),
        _ => None,
    });
    let result = match found {
        Some(F::Success(mut s)) => {
            // Pages can be huge; the checkpoint keeps a bounded copy.
            s.content = cap_middle(&s.content, MAX_UI_BYTES);
            F::Success(s)
        }
        Some(other) => other,
        None => F::Error(pb::FetchError {
            url,
            error: match thrown {
                Some(e) => format!("the client failed: {e}"),
                None => "the client returned no result".into(),
            },
        }),
    };
    t.result = Some(pb::FetchResult {
        result: Some(result),
    });
    t
}

pub(crate) fn render(t: &pb::FetchToolCall) -> (String, bool) {
    let args_url = t.args.as_ref().map(|a| a.url.as_str()).unwrap_or_default();
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(F::Success(s)) => {
            let url = if s.url.is_empty() {
                args_url
            } else {
                s.url.as_str()
            };
            let kind = if s.content_type.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.content_type)
            };
            let (body, cut) = cap_head(&s.content, MAX_MODEL_BYTES);
            let more = if cut {
                format!("\n[... content cut at {MAX_MODEL_BYTES} bytes]")
            } else {
                String::new()
            };
            (
                format!(
                    "URL: {url}\nStatus: {}{kind}\n\n{body}{more}",
                    s.status_code
                ),
                false,
            )
        }
        Some(F::Error(e)) => {
            let url = if e.url.is_empty() {
                args_url
            } else {
                e.url.as_str()
            };
            (format!("Fetching {url} failed: {}", e.error), true)
        }
        None => ("The fetch did not complete.".into(), true),
    }
}

pub(crate) fn history_args(t: &pb::FetchToolCall) -> Value {
    json!({ "url": t.args.as_ref().map(|a| a.url.clone()).unwrap_or_default() })
}

pub(crate) fn with_error(mut t: pb::FetchToolCall, message: &str) -> pb::FetchToolCall {
    let url = t.args.as_ref().map(|a| a.url.clone()).unwrap_or_default();
    t.result = Some(pb::FetchResult {
        result: Some(F::Error(pb::FetchError {
            url,
            error: message.to_string(),
        })),
    });
    t
}
