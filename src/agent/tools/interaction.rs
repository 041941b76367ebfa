//! Tools that need the user: `ask_question`, `switch_mode`, `create_plan`. Each becomes an
//! `interaction_query`; the matching `interaction_response` finishes it.

use serde_json::{json, Value};

use super::args::{norm, Args};
use super::call::{wrap, ToolContext, ToolError, ToolPlan};
use super::todos;
use crate::proto::agent::v1 as pb;
use pb::ask_question_args::{Option as Choice, Question};
use pb::interaction_query::Query;
use pb::interaction_response::Result as Response;
use pb::tool_call::Tool;
use pb::AgentMode;

/// Cursor's mode ids (`SwitchModeArgs.target_mode_id`).
pub(crate) fn mode_id(mode: i32) -> &'static str {
    match AgentMode::try_from(mode) {
        Ok(AgentMode::Ask) => "ask",
        Ok(AgentMode::Plan) => "plan",
        Ok(AgentMode::Debug) => "debug",
        Ok(AgentMode::Triage) => "triage",
        Ok(AgentMode::Project) => "project",
        Ok(AgentMode::Multitask) => "multitask",
        Ok(AgentMode::Custom) => "custom",
        _ => "agent",
    }
}

fn parse_mode(s: &str) -> Option<AgentMode> {
    let n = norm(s);
    Some(match n.strip_prefix("agentmode").unwrap_or(&n) {
        "agent" | "code" | "default" | "act" => AgentMode::Agent,
        "ask" | "chat" => AgentMode::Ask,
        "plan" | "planning" | "architect" => AgentMode::Plan,
        "debug" => AgentMode::Debug,
        _ => return None,
    })
}

pub(crate) fn plan_ask(call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let title = a.str_opt(&["title", "header"])?.unwrap_or_default();
    let questions = match a.get(&["questions"]) {
        Some(v) => questions(v).map_err(|e| a.error(e))?,
        None => {
            // A single question given flat.
            let prompt = a.str_nonblank(
                &["question", "prompt", "text", "message"],
                "array `questions` of {prompt, options}, or a string `question`",
            )?;
            let options = match a.get(&["options", "choices"]) {
                Some(v) => choices(v).map_err(|e| a.error(e))?,
                None => Vec::new(),
            };
            let allow_multiple = a
                .bool_opt(&["allow_multiple", "multi_select", "multiple"])?
                .unwrap_or(false);
            vec![Question {
                id: "q1".into(),
                prompt,
                options,
                allow_multiple,
            }]
        }
    };
    if questions.is_empty() {
        return Err(a.error("`questions` must hold at least one question"));
    }
    let args = pb::AskQuestionArgs {
        title,
        questions,
        ..Default::default()
    };
    Ok(ToolPlan::Interaction {
        query: Query::AskQuestionInteractionQuery(pb::AskQuestionInteractionQuery {
            args: Some(args.clone()),
            tool_call_id: call_id.to_string(),
        }),
        tool_call: wrap(
            call_id,
            Tool::AskQuestionToolCall(pb::AskQuestionToolCall {
                args: Some(args),
                result: None,
            }),
        ),
    })
}

/// A JSON array (or a string holding one).
fn array(v: &Value, what: &str) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(a) => Ok(a.clone()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Array(a)) => Ok(a),
            _ => Err(format!("`{what}` must be an array")),
        },
        _ => Err(format!("`{what}` must be an array")),
    }
}

fn field(o: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| match o.get(*k) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

fn questions(v: &Value) -> Result<Vec<Question>, String> {
    let mut out = Vec::new();
    for (i, q) in array(v, "questions")?.iter().enumerate() {
        let n = i + 1;
        out.push(match q {
            Value::String(s) if !s.trim().is_empty() => Question {
                id: format!("q{n}"),
                prompt: s.clone(),
                ..Default::default()
            },
            Value::Object(o) => Question {
                id: field(o, &["id"]).unwrap_or_else(|| format!("q{n}")),
                prompt: field(o, &["prompt", "question", "text", "header"])
                    .ok_or_else(|| format!("question #{n} has no `prompt`"))?,
                options: match o.get("options").or_else(|| o.get("choices")) {
                    Some(v) => choices(v)?,
                    None => Vec::new(),
                },
                allow_multiple: ["allow_multiple", "multi_select", "multiSelect", "multiple"]
                    .iter()
                    .any(|k| o.get(*k).and_then(Value::as_bool).unwrap_or(false)),
            },
            _ => return Err(format!("question #{n} must be an object with a `prompt`")),
        });
    }
    Ok(out)
}

fn choices(v: &Value) -> Result<Vec<Choice>, String> {
    let mut out = Vec::new();
    for (i, c) in array(v, "options")?.iter().enumerate() {
        let n = (i + 1).to_string();
        out.push(match c {
            Value::String(s) => Choice {
                id: n,
                label: s.clone(),
            },
            Value::Number(x) => Choice {
                id: n,
                label: x.to_string(),
            },
            Value::Object(o) => {
                let label = field(o, &["label", "text", "value", "title"])
                    .ok_or_else(|| format!("option #{n} has no `label`"))?;
                let label = match field(o, &["description"]) {
                    Some(d) => format!("{label}: {d}"),
                    None => label,
                };
                Choice {
                    id: field(o, &["id"]).unwrap_or(n),
                    label,
                }
            }
            _ => return Err(format!("option #{n} must be a string")),
        });
    }
    Ok(out)
}

pub(crate) fn plan_switch(
    ctx: &ToolContext,
    call_id: &str,
    a: &Args,
) -> Result<ToolPlan, ToolError> {
    let target = a.str_nonblank(
        &["target_mode_id", "target_mode", "mode", "mode_id", "target"],
        "string: agent, ask or plan",
    )?;
    let mode = parse_mode(&target).ok_or_else(|| {
        a.error(format!(
            "unknown mode `{target}`; use agent, ask, plan or debug"
        ))
    })?;
    let target_mode_id = mode_id(mode as i32).to_string();
    if target_mode_id == mode_id(ctx.mode) {
        return Err(a.error(format!(
            "the conversation is already in {target_mode_id} mode"
        )));
    }
    let args = pb::SwitchModeArgs {
        target_mode_id,
        explanation: a
            .str_opt(&["explanation", "reason", "why"])?
            .filter(|e| !e.trim().is_empty()),
        tool_call_id: call_id.to_string(),
    };
    Ok(ToolPlan::Interaction {
        query: Query::SwitchModeRequestQuery(pb::SwitchModeRequestQuery {
            args: Some(args.clone()),
        }),
        tool_call: wrap(
            call_id,
            Tool::SwitchModeToolCall(pb::SwitchModeToolCall {
                args: Some(args),
                result: None,
            }),
        ),
    })
}

pub(crate) fn plan_create(call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let plan = a.str_nonblank(
        &["plan", "content", "markdown", "body", "text"],
        "string: the plan in Markdown",
    )?;
    let todos = match a.get(&["todos", "steps", "tasks"]) {
        Some(v) => todos::parse_items(v, false).map_err(|e| a.error(e))?,
        None => Vec::new(),
    };
    let args = pb::CreatePlanArgs {
        plan,
        todos,
        overview: a
            .str_opt(&["overview", "summary", "description"])?
            .unwrap_or_default(),
        name: a.str_opt(&["name", "title"])?.unwrap_or_default(),
        ..Default::default()
    };
    Ok(ToolPlan::Interaction {
        query: Query::CreatePlanRequestQuery(pb::CreatePlanRequestQuery {
            args: Some(args.clone()),
            tool_call_id: call_id.to_string(),
        }),
        tool_call: wrap(
            call_id,
            Tool::CreatePlanToolCall(pb::CreatePlanToolCall {
                args: Some(args),
                result: None,
            }),
        ),
    })
}

/// What the model reads when the client's response does not answer the call.
pub(crate) const UNFIT_RESPONSE: &str =
    "the client answered the question with an unexpected or empty response";

/// Sets the user's response as the call's result; `false` when the response does not fit the
/// call (see [`UNFIT_RESPONSE`]).
pub(crate) fn answer(
    ctx: &ToolContext,
    tc: &mut pb::ToolCall,
    response: &pb::InteractionResponse,
) -> bool {
    match (&mut tc.tool, &response.result) {
        (Some(Tool::AskQuestionToolCall(t)), Some(Response::AskQuestionInteractionResponse(r))) => {
            t.result = r.result.clone();
            t.result.is_some()
        }
        (Some(Tool::SwitchModeToolCall(t)), Some(Response::SwitchModeRequestResponse(r))) => {
            use pb::switch_mode_request_response::Result as S;
            use pb::switch_mode_result::Result as SR;
            let to = t
                .args
                .as_ref()
                .map(|a| a.target_mode_id.clone())
                .unwrap_or_default();
            let result = match &r.result {
                Some(S::Approved(_)) => Some(SR::Success(pb::SwitchModeSuccess {
                    from_mode_id: mode_id(ctx.mode).to_string(),
                    to_mode_id: to,
                })),
                Some(S::Rejected(x)) => Some(SR::Rejected(pb::SwitchModeRejected {
                    reason: x.reason.clone(),
                })),
                None => None,
            };
            t.result = result.map(|r| pb::SwitchModeResult { result: Some(r) });
            t.result.is_some()
        }
        (Some(Tool::CreatePlanToolCall(t)), Some(Response::CreatePlanRequestResponse(r))) => {
            t.result = r.result.clone();
            t.result.is_some()
        }
        _ => false,
    }
}

pub(crate) fn approved_mode(
    tool_call: &pb::ToolCall,
    response: &pb::InteractionResponse,
) -> Option<i32> {
    match (&tool_call.tool, &response.result) {
        (Some(Tool::SwitchModeToolCall(t)), Some(Response::SwitchModeRequestResponse(r)))
            if matches!(
                r.result,
                Some(pb::switch_mode_request_response::Result::Approved(_))
            ) =>
        {
            t.args
                .as_ref()
                .and_then(|a| parse_mode(&a.target_mode_id))
                .map(|m| m as i32)
        }
        _ => None,
    }
}

pub(crate) fn render_ask(t: &pb::AskQuestionToolCall) -> (String, bool) {
    use pb::ask_question_result::Result as A;
    let args = t.args.clone().unwrap_or_default();
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(A::Success(s)) => {
            let answer_text = |a: &pb::ask_question_success::Answer, q: Option<&Question>| {
                let mut parts: Vec<String> = a
                    .selected_option_ids
                    .iter()
                    .map(|id| {
                        q.and_then(|q| q.options.iter().find(|o| &o.id == id))
                            .map_or_else(|| id.clone(), |o| o.label.clone())
                    })
                    .collect();
                if !a.freeform_text.trim().is_empty() {
                    parts.push(a.freeform_text.trim().to_string());
                }
                if parts.is_empty() {
                    "(no answer)".to_string()
                } else {
                    parts.join(", ")
                }
            };
            let mut lines = vec!["The user answered:".to_string()];
            for q in &args.questions {
                let answer = s
                    .answers
                    .iter()
                    .find(|a| a.question_id == q.id)
                    .map_or_else(|| "(no answer)".to_string(), |a| answer_text(a, Some(q)));
                lines.push(format!("Q: {}\nA: {answer}", q.prompt));
            }
            for a in s.answers.iter().filter(|a| !args.questions.iter().any(|q| q.id == a.question_id)) {
                lines.push(format!("{}: {}", a.question_id, answer_text(a, None)));
            }
            (lines.join("\n"), false)
        }
        Some(A::Error(e)) => (format!("Asking the user failed: {}", e.error_message), true),
        Some(A::Rejected(r)) => {
            let reason = if r.reason.is_empty() { String::new() } else { format!(": {}", r.reason) };
            (format!("The user dismissed the question without answering{reason}."), false)
        }
        Some(A::Async(_)) => (
            "The questions were shown to the user; the answers will arrive later. Continue with what you can do meanwhile.".into(),
            false,
        ),
        None => ("The question was not answered.".into(), true),
    }
}

pub(crate) fn render_switch(t: &pb::SwitchModeToolCall) -> (String, bool) {
    use pb::switch_mode_result::Result as S;
    let target = t
        .args
        .as_ref()
        .map(|a| a.target_mode_id.as_str())
        .unwrap_or_default();
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(S::Success(s)) => (
            format!("The user approved switching to {} mode.", s.to_mode_id),
            false,
        ),
        Some(S::Rejected(r)) => {
            let reason = if r.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", r.reason)
            };
            (format!("The user declined switching to {target} mode{reason}. Continue in the current mode."), false)
        }
        Some(S::Error(e)) => (format!("Switching mode failed: {}", e.error), true),
        None => ("The mode switch was not answered.".into(), true),
    }
}

pub(crate) fn render_create(t: &pb::CreatePlanToolCall) -> (String, bool) {
    use pb::create_plan_result::Result as C;
    let Some(r) = t.result.as_ref() else {
        return ("The plan was not answered.".into(), true);
    };
    match &r.result {
        Some(C::Error(e)) => (format!("Creating the plan failed: {}", e.error), true),
        Some(C::Success(_)) | None => {
            let at = if r.plan_uri.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.plan_uri)
            };
            (
                format!("The plan was presented to the user{at}. Wait for the user to review it before making changes."),
                false,
            )
        }
    }
}

pub(crate) fn ask_history_args(t: &pb::AskQuestionToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let qs: Vec<Value> = a
        .questions
        .iter()
        .map(|q| {
            json!({
                "id": q.id,
                "prompt": q.prompt,
                "options": q.options.iter().map(|o| o.label.clone()).collect::<Vec<_>>(),
                "allow_multiple": q.allow_multiple,
            })
        })
        .collect();
    let mut v = json!({ "questions": qs });
    if !a.title.is_empty() {
        v["title"] = json!(a.title);
    }
    v
}

pub(crate) fn switch_history_args(t: &pb::SwitchModeToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let mut v = json!({ "target_mode_id": a.target_mode_id });
    if let Some(e) = a.explanation {
        v["explanation"] = json!(e);
    }
    v
}

pub(crate) fn create_history_args(t: &pb::CreatePlanToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    let mut v = json!({ "plan": a.plan });
    if !a.name.is_empty() {
        v["name"] = json!(a.name);
    }
    if !a.overview.is_empty() {
        v["overview"] = json!(a.overview);
    }
    if !a.todos.is_empty() {
        v["todos"] = todos::items_json(&a.todos);
    }
    v
}

pub(crate) fn ask_with_error(
    mut t: pb::AskQuestionToolCall,
    message: &str,
) -> pb::AskQuestionToolCall {
    t.result = Some(pb::AskQuestionResult {
        result: Some(pb::ask_question_result::Result::Error(
            pb::AskQuestionError {
                error_message: message.to_string(),
            },
        )),
    });
    t
}

pub(crate) fn switch_with_error(
    mut t: pb::SwitchModeToolCall,
    message: &str,
) -> pb::SwitchModeToolCall {
    t.result = Some(pb::SwitchModeResult {
        result: Some(pb::switch_mode_result::Result::Error(pb::SwitchModeError {
            error: message.to_string(),
        })),
    });
    t
}

pub(crate) fn create_with_error(
    mut t: pb::CreatePlanToolCall,
    message: &str,
) -> pb::CreatePlanToolCall {
    t.result = Some(pb::CreatePlanResult {
        result: Some(pb::create_plan_result::Result::Error(pb::CreatePlanError {
            error: message.to_string(),
        })),
        plan_uri: String::new(),
    });
    t
}
