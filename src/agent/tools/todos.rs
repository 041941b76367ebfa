//! `todo_write`: the todo list lives in the run's checkpoint (`todos`); updates are applied
//! locally, with merge-by-id semantics.

use serde_json::{json, Value};

use super::args::Args;
use super::call::{wrap, ToolError, ToolOutcome, ToolPlan, NOT_COMPLETED};
use crate::proto::agent::v1 as pb;
use pb::tool_call::Tool;
use pb::TodoStatus;

pub(crate) fn status_name(s: i32) -> &'static str {
    match TodoStatus::try_from(s) {
        Ok(TodoStatus::Pending) => "pending",
        Ok(TodoStatus::InProgress) => "in_progress",
        Ok(TodoStatus::Completed) => "completed",
        Ok(TodoStatus::Cancelled) => "cancelled",
        _ => "unspecified",
    }
}

fn parse_status(s: &str) -> Option<TodoStatus> {
    Some(match super::args::norm(s).as_str() {
        "pending" | "todo" | "notstarted" | "open" => TodoStatus::Pending,
        "inprogress" | "doing" | "active" | "started" | "working" => TodoStatus::InProgress,
        "completed" | "complete" | "done" | "finished" => TodoStatus::Completed,
        "cancelled" | "canceled" | "skipped" | "abandoned" => TodoStatus::Cancelled,
        _ => return None,
    })
}

/// Todo items from a model's list. Items may be objects or bare strings (content only).
/// Without `require_ids`, missing ids are numbered by position. A missing status stays
/// unspecified (a merge then keeps the current one).
pub(crate) fn parse_items(value: &Value, require_ids: bool) -> Result<Vec<pb::TodoItem>, String> {
    let parsed;
    let value = match value {
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s)
                .map_err(|_| "`todos` must be an array of todo objects".to_string())?;
            &parsed
        }
        v => v,
    };
    let Value::Array(items) = value else {
        return Err("`todos` must be an array of todo objects".into());
    };
    let text = |o: &serde_json::Map<String, Value>, keys: &[&str]| -> Option<String> {
        keys.iter().find_map(|k| match o.get(*k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let (id, content, status) = match item {
            Value::String(s) => (None, s.clone(), None),
            Value::Object(o) => (
                text(o, &["id", "todo_id", "key"]),
                text(o, &["content", "text", "title", "task", "description"]).unwrap_or_default(),
                text(o, &["status", "state"]),
            ),
            _ => {
                return Err(format!(
                    "todo #{} must be an object with id, content and status",
                    i + 1
                ))
            }
        };
        let id = match id.filter(|s| !s.trim().is_empty()) {
            Some(id) => id,
            None if require_ids => {
                return Err(format!("todo #{} has no `id` (needed to merge)", i + 1))
            }
            None => (i + 1).to_string(),
        };
        let status = match status {
            None => TodoStatus::Unspecified,
            Some(s) => parse_status(&s).ok_or_else(|| {
                format!("todo `{id}` has status `{s}`; use pending, in_progress, completed or cancelled")
            })?,
        };
        out.push(pb::TodoItem {
            id,
            content,
            status: status as i32,
            ..Default::default()
        });
    }
    Ok(out)
}

pub(crate) fn plan(call_id: &str, a: &Args) -> Result<ToolPlan, ToolError> {
    let merge = a.bool_opt(&["merge"])?.unwrap_or(false);
    let value = a
        .get(&["todos", "items", "todo_list", "tasks", "todo"])
        .ok_or_else(|| {
            a.error("missing required argument `todos` (array of {id, content, status})")
        })?;
    let items = parse_items(value, merge).map_err(|e| a.error(e))?;
    if !merge {
        if let Some(it) = items.iter().find(|it| it.content.trim().is_empty()) {
            return Err(a.error(format!("todo `{}` has no `content`", it.id)));
        }
    }
    let tool_call = wrap(
        call_id,
        Tool::UpdateTodosToolCall(pb::UpdateTodosToolCall {
            args: Some(pb::UpdateTodosArgs {
                todos: items.clone(),
                merge,
            }),
            result: None,
        }),
    );
    Ok(ToolPlan::Todos {
        merge,
        items,
        tool_call,
    })
}

fn with_result(tool_call: &pb::ToolCall, result: pb::update_todos_result::Result) -> pb::ToolCall {
    let mut tc = tool_call.clone();
    if let Some(Tool::UpdateTodosToolCall(t)) = &mut tc.tool {
        t.result = Some(pb::UpdateTodosResult {
            result: Some(result),
        });
    }
    tc
}

/// The outcome of a finished update: the model reads what [`render`] makes of the call, as
/// for any finished call.
fn outcome(tool_call: pb::ToolCall) -> ToolOutcome {
    let (content, is_error) = match &tool_call.tool {
        Some(Tool::UpdateTodosToolCall(t)) => render(t),
        _ => (NOT_COMPLETED.into(), true),
    };
    ToolOutcome {
        content,
        is_error,
        tool_call,
    }
}

pub(crate) fn apply(
    tool_call: &pb::ToolCall,
    current: &[pb::TodoItem],
    merge: bool,
    items: &[pb::TodoItem],
    now_ms: i64,
) -> (Vec<pb::TodoItem>, ToolOutcome) {
    let fresh = |it: &pb::TodoItem, created: i64| pb::TodoItem {
        status: if it.status == TodoStatus::Unspecified as i32 {
            TodoStatus::Pending as i32
        } else {
            it.status
        },
        created_at: created,
        updated_at: now_ms,
        ..it.clone()
    };
    let mut list: Vec<pb::TodoItem>;
    if merge {
        list = current.to_vec();
        for it in items {
            if let Some(ex) = list.iter_mut().find(|x| x.id == it.id) {
                if !it.content.trim().is_empty() {
                    ex.content = it.content.clone();
                }
                if it.status != TodoStatus::Unspecified as i32 {
                    ex.status = it.status;
                }
                if !it.dependencies.is_empty() {
                    ex.dependencies = it.dependencies.clone();
                }
                ex.updated_at = now_ms;
            } else if it.content.trim().is_empty() {
                let error = format!(
                    "todo `{}` does not exist yet; give its content to add it",
                    it.id
                );
                let o = outcome(with_result(
                    tool_call,
                    pb::update_todos_result::Result::Error(pb::UpdateTodosError { error }),
                ));
                return (current.to_vec(), o);
            } else {
                list.push(fresh(it, now_ms));
            }
        }
    } else {
        // Replacing keeps the creation time of items that survive.
        list = items
            .iter()
            .map(|it| {
                let created = current
                    .iter()
                    .find(|x| x.id == it.id)
                    .map_or(now_ms, |x| x.created_at);
                fresh(it, created)
            })
            .collect();
    }
    let success = pb::UpdateTodosSuccess {
        todos: list.clone(),
        total_count: i32::try_from(list.len()).unwrap_or(i32::MAX),
        was_merge: merge,
    };
    let o = outcome(with_result(
        tool_call,
        pb::update_todos_result::Result::Success(success),
    ));
    (list, o)
}

pub(crate) fn render(t: &pb::UpdateTodosToolCall) -> (String, bool) {
    use pb::update_todos_result::Result as U;
    match t.result.as_ref().and_then(|r| r.result.as_ref()) {
        Some(U::Success(s)) => {
            if s.todos.is_empty() {
                return ("The todo list is now empty.".into(), false);
            }
            let lines: Vec<String> = s
                .todos
                .iter()
                .map(|it| {
                    format!(
                        "- [{}] {} (id: {})",
                        status_name(it.status),
                        it.content,
                        it.id
                    )
                })
                .collect();
            (
                format!(
                    "Todo list updated ({} items):\n{}",
                    s.todos.len(),
                    lines.join("\n")
                ),
                false,
            )
        }
        Some(U::Error(e)) => (e.error.clone(), true),
        None => ("The todo update did not complete.".into(), true),
    }
}

pub(crate) fn items_json(items: &[pb::TodoItem]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|it| {
                let mut v = json!({"id": it.id, "content": it.content});
                if it.status != TodoStatus::Unspecified as i32 {
                    v["status"] = json!(status_name(it.status));
                }
                v
            })
            .collect(),
    )
}

pub(crate) fn history_args(t: &pb::UpdateTodosToolCall) -> Value {
    let a = t.args.clone().unwrap_or_default();
    json!({ "merge": a.merge, "todos": items_json(&a.todos) })
}

pub(crate) fn with_error(mut t: pb::UpdateTodosToolCall, message: &str) -> pb::UpdateTodosToolCall {
    t.result = Some(pb::UpdateTodosResult {
        result: Some(pb::update_todos_result::Result::Error(
            pb::UpdateTodosError {
                error: message.to_string(),
            },
        )),
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, content: &str, status: TodoStatus) -> pb::TodoItem {
        pb::TodoItem {
            id: id.into(),
            content: content.into(),
            status: status as i32,
            ..Default::default()
        }
    }

    #[test]
    fn parses_loose_items() {
        let v = json!([{"id": 1, "content": "a", "status": "in-progress"}, "b", {"content": "c", "status": "done"}]);
        let items = parse_items(&v, false).unwrap();
        assert_eq!(items[0].id, "1");
        assert_eq!(items[0].status, TodoStatus::InProgress as i32);
        assert_eq!(
            (items[1].id.as_str(), items[1].content.as_str()),
            ("2", "b")
        );
        assert_eq!(items[2].status, TodoStatus::Completed as i32);
        assert!(
            parse_items(&json!([{"id": "x", "status": "someday"}]), false)
                .unwrap_err()
                .contains("someday")
        );
        assert!(parse_items(&json!(["no id"]), true)
            .unwrap_err()
            .contains("no `id`"));
    }

    #[test]
    fn merge_updates_by_id_and_appends() {
        let tc = pb::ToolCall::default();
        let current = vec![
            item("1", "write code", TodoStatus::InProgress),
            item("2", "test", TodoStatus::Pending),
        ];
        let updates = vec![
            item("1", "", TodoStatus::Completed),
            item("2", "", TodoStatus::InProgress),
            item("3", "ship", TodoStatus::Unspecified),
        ];
        let (list, _) = apply(&tc, &current, true, &updates, 5);
        let got: Vec<(&str, &str, i32)> = list
            .iter()
            .map(|t| (t.id.as_str(), t.content.as_str(), t.status))
            .collect();
        assert_eq!(
            got,
            vec![
                ("1", "write code", TodoStatus::Completed as i32),
                ("2", "test", TodoStatus::InProgress as i32),
                ("3", "ship", TodoStatus::Pending as i32),
            ]
        );
        assert_eq!((list[2].created_at, list[0].updated_at), (5, 5));
        // An unknown id without content cannot be added.
        let (same, o) = apply(
            &tc,
            &current,
            true,
            &[item("9", "", TodoStatus::Completed)],
            5,
        );
        assert_eq!(same, current);
        assert!(o.is_error);
    }

    #[test]
    fn replace_keeps_creation_times() {
        let mut old = item("1", "a", TodoStatus::Pending);
        old.created_at = 1;
        let (list, _) = apply(
            &pb::ToolCall::default(),
            &[old],
            false,
            &[item("1", "a2", TodoStatus::Unspecified)],
            9,
        );
        assert_eq!(
            (list.len(), list[0].created_at, list[0].updated_at),
            (1, 1, 9)
        );
        assert_eq!(list[0].status, TodoStatus::Pending as i32);
    }
}

/// The `todos:` list of a Markdown document's front matter (`---` … `---`), read as the small
/// YAML subset Cursor writes in plan files: `- key: value` items with `key: value` lines.
pub(crate) fn from_front_matter(doc: &str) -> Vec<pb::TodoItem> {
    let mut lines = doc.lines();
    if lines.next().map(str::trim) != Some("---") {
        return Vec::new();
    }
    let mut items: Vec<serde_json::Map<String, Value>> = Vec::new();
    let mut in_todos = false;
    for line in lines {
        if line.trim() == "---" {
            break;
        }
        if !line.starts_with(' ') && !line.starts_with('-') {
            in_todos = line.trim_end() == "todos:";
            continue;
        }
        if !in_todos {
            continue;
        }
        let t = line.trim();
        let (new_item, rest) = match t.strip_prefix("- ") {
            Some(r) => (true, r),
            None => (false, t),
        };
        if new_item || items.is_empty() {
            items.push(serde_json::Map::new());
        }
        if let (Some((k, v)), Some(item)) = (rest.split_once(':'), items.last_mut()) {
            let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
            item.insert(k.trim().to_string(), Value::String(v.to_string()));
        }
    }
    let value = Value::Array(items.into_iter().map(Value::Object).collect());
    parse_items(&value, false)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.content.trim().is_empty())
        .collect()
}

#[cfg(test)]
mod front_matter_tests {
    use super::*;

    #[test]
    fn plan_front_matter_todos_are_read() {
        let doc = "---\nname: Greeting\ntodos:\n  - id: t1\n    content: \"Write hello.txt\"\n    status: pending\n  - id: t2\n    content: Test it\n    status: completed\n---\n# Plan\n";
        let todos = from_front_matter(doc);
        assert_eq!(todos.len(), 2);
        assert_eq!(todos[0].id, "t1");
        assert_eq!(todos[0].content, "Write hello.txt");
        assert_eq!(todos[1].status, pb::TodoStatus::Completed as i32);
        assert!(from_front_matter("# no front matter").is_empty());
    }
}
