//! What a model turn opens with: its request context and the blobs it refers to, the past
//! chats attached, the todos it starts with, what its tools may do, and the conversation its
//! first model call reads. Assembly only: the client and the blob cache are asked where the
//! request does not carry what the turn needs.

use tracing::{debug, warn};

use super::action::{self, TurnInput};
use super::client::Client;
use super::error::RunError;
use super::pending;
use super::setup::Run;
use super::steer;
use crate::agent::state::{self, RebuiltHistory};
use crate::agent::{context, prompt, tools, transcript};
use crate::proto::agent::v1 as pb;
use crate::provider::{AssistantPart, Message};

/// Where relative paths resolve: the first workspace, else the client's working directory.
pub(super) fn workspace_root(ctx: Option<&pb::RequestContext>) -> Option<String> {
    let env = ctx?.env.as_ref()?;
    env.workspace_paths
        .first()
        .cloned()
        .or_else(|| env.process_working_directory.clone())
        .filter(|p| !p.is_empty())
}

/// Where Cursor keeps its agent transcripts, when it said.
pub(super) fn transcripts_folder(ctx: Option<&pb::RequestContext>) -> Option<String> {
    Some(ctx?.env.as_ref()?.agent_transcripts_folder.clone()).filter(|f| !f.is_empty())
}

/// The transcripts of the past chats the user attached, as far as they are on this machine.
async fn read_past_chats(
    home: &std::path::Path,
    folder: &str,
    user: &pb::UserMessage,
    blobs: &mut context::Blobs,
) {
    let chats = user
        .selected_context
        .as_ref()
        .map_or(&[][..], |s| s.past_chats.as_slice());
    // A few chats at most: each is capped, and the message has its own budget besides.
    for chat in chats.iter().take(4) {
        if let Some(text) = transcript::read(home, folder, &chat.agent_id).await {
            blobs.insert_past_chat(chat.agent_id.clone(), text);
        }
    }
}

/// Where the client writes background shells' output.
pub(super) fn terminals_folder(ctx: Option<&pb::RequestContext>) -> Option<String> {
    Some(ctx?.env.as_ref()?.terminals_folder.clone()).filter(|f| !f.is_empty())
}

/// The turn's request context (the client asked for it when the action carries none) with
/// the request's context parts merged in, and the blobs its context refers to, with the
/// past chats the user attached.
pub(super) async fn turn_context(
    run: &Run,
    client: &mut Client,
    req: &pb::AgentRunRequest,
    input: &mut TurnInput,
) -> Result<(Option<pb::RequestContext>, context::Blobs), RunError> {
    let request_context = match input.request_context.take() {
        Some(ctx) => Some(ctx),
        None => client.fetch_request_context().await?,
    };
    let parts = context::parts(req);
    let mut blobs = context_blobs(run, client, req, Some(&input.user)).await?;
    let request_context = context::merge_parts(request_context, parts, &blobs);
    let home = run.settings.transcripts_home.clone();
    if let (Some(home), Some(folder)) = (home, transcripts_folder(request_context.as_ref())) {
        read_past_chats(&home, &folder, &input.user, &mut blobs).await;
    }
    Ok((request_context, blobs))
}

/// The todos the turn starts with. A Build reads its plan first (when only its file is
/// named) and seeds the todos from it; a goal continuation names the open ones.
pub(super) async fn opening_todos(
    client: &mut Client,
    input: &mut TurnInput,
    history: &RebuiltHistory,
) -> Result<Vec<pb::TodoItem>, RunError> {
    let mut todos = history.todos.clone();
    if let Some(read) = input.plan_to_read.take() {
        let plan = client.read_plan(&read.path).await?;
        input.user.text = action::build_instruction(&plan);
    }
    let build =
        input.user.simulated_msg_reason == Some(pb::SimulatedMsgReason::PlanExecution as i32);
    if build {
        let seeded = build_todos(plan_text(&input.user.text), &history.messages);
        if !seeded.is_empty() {
            todos = seeded;
        }
    }
    if input.goal_continuation {
        input.user.text = goal_prompt(&input.user.text, &todos);
    }
    Ok(todos)
}

/// What the turn's tools may do and need to know.
pub(super) fn tool_context(
    run: &Run,
    req: &pb::AgentRunRequest,
    ctx: Option<&pb::RequestContext>,
    input: &TurnInput,
    mode: i32,
) -> tools::ToolContext {
    let env = ctx.and_then(|c| c.env.as_ref());
    let child = run.child.as_ref();
    tools::ToolContext {
        workspace_root: workspace_root(ctx),
        mcp_tools: tools::merge_mcp_tools(&[
            req.mcp_tools
                .as_ref()
                .map_or(&[][..], |t| t.mcp_tools.as_slice()),
            ctx.map_or(&[][..], |c| c.tools.as_slice()),
        ]),
        web_fetch: ctx.and_then(|c| c.web_fetch_enabled).unwrap_or(false),
        mode,
        command_denylist: ctx
            .map(|c| c.admin_command_denylist.clone())
            .unwrap_or_default(),
        terminals_folder: terminals_folder(ctx),
        shell_block_ms: Some(run.settings.shell_block_ms),
        subagents: subagent_options(run, req, ctx, input.user.selected_context.clone()),
        readonly: child.is_some_and(|c| c.readonly),
        allowed_tools: child.map(|c| c.tools.clone()).filter(|t| !t.is_empty()),
        auto_review: env.is_some_and(|e| e.smart_mode_classifier_auto_mode_enabled == Some(true)),
        sandboxed: env.is_some_and(|e| e.sandbox_enabled),
    }
}

/// What the subagent tool needs: offered below the nesting bound.
fn subagent_options(
    run: &Run,
    req: &pb::AgentRunRequest,
    ctx: Option<&pb::RequestContext>,
    selected_context: Option<pb::SelectedContext>,
) -> tools::SubagentOptions {
    let depth = run.child.as_ref().map_or(0, |c| c.depth);
    tools::SubagentOptions {
        enabled: depth < crate::agent::subagents::MAX_DEPTH,
        custom: ctx.map(|c| c.custom_subagents.clone()).unwrap_or_default(),
        parent_model_id: crate::agent::model::requested_model_id(req)
            .unwrap_or_default()
            .to_string(),
        overrides: req.subagent_model_overrides.clone(),
        selected_models: req
            .selected_subagent_models
            .iter()
            .map(|m| m.model_id.clone())
            .filter(|m| !m.is_empty())
            .collect(),
        parent_conversation_id: req.conversation_id.clone().unwrap_or_default(),
        selected_context,
        model_names: run.settings.model_names.clone(),
    }
}

/// The blobs the turn's context refers to (request context parts, the user's content given
/// by blob id): pre-fetched ones, the local cache, then the client.
async fn context_blobs(
    run: &Run,
    client: &mut Client,
    req: &pb::AgentRunRequest,
    user: Option<&pb::UserMessage>,
) -> Result<context::Blobs, RunError> {
    let mut blobs = context::Blobs::pre_fetched(req);
    let wanted: Vec<state::BlobId> = context::wanted_blobs(context::parts(req), user)
        .into_iter()
        .filter(|id| !blobs.has(id))
        .collect();
    if wanted.is_empty() {
        return Ok(blobs);
    }
    let mut ask = Vec::new();
    for (id, data) in run.cache.get_many(wanted).await {
        match data {
            Some(d) => blobs.insert(id, d),
            None => ask.push(id),
        }
    }
    if !ask.is_empty() {
        debug!(blobs = ask.len(), "asking the client for context blobs");
        let mut fresh = Vec::new();
        for (id, data) in client.fetch_blobs(&ask).await? {
            match data {
                Some(d) => {
                    blobs.insert(id, d.clone());
                    fresh.push(state::Blob { id, data: d });
                }
                None => warn!("the client does not have a context blob; going on without it"),
            }
        }
        // Later turns replay this message from the cache.
        run.cache.put_many(fresh).await;
    }
    Ok(blobs)
}

/// The conversation the turn's first model call reads: the rebuilt history (or the one the
/// client supplies), an asked question's answer delivered, pending calls closed, then the
/// turn's own messages.
pub(super) fn opening_messages(
    history: &mut RebuiltHistory,
    input: &TurnInput,
    images: bool,
    blobs: &context::Blobs,
) -> Vec<Message> {
    let mut messages = std::mem::take(&mut history.messages);
    if let Some(h) = &input.history {
        messages = client_history(h, images);
        history.turn_starts.clear();
    }
    if let Some((call_id, answer)) = &input.answer {
        deliver_answer(&mut messages, call_id, answer);
    }
    pending::close_pending(&mut messages, &input.resolutions);
    steer::drop_carried_copies(&mut messages, &input.user.text);
    for m in &input.prepend {
        messages.push(prompt::user_message_with(m, images, blobs));
    }
    messages.push(prompt::user_message_with(&input.user, images, blobs));
    messages
}

/// A Build instruction's plan (the part inside `<plan>`), or the whole text.
pub(super) fn plan_text(instruction: &str) -> &str {
    instruction
        .split_once("<plan>\n")
        .and_then(|(_, rest)| rest.rsplit_once("\n</plan>"))
        .map_or(instruction, |(plan, _)| plan)
}

/// The todos a Build starts with: the plan's front matter lists them (Cursor's `.plan.md`), else
/// the `create_plan` call that wrote this plan carried them (`CreatePlanArgs.todos`; the
/// action's `ConversationPlan` holds only the text). The latest such call whose plan is this
/// one wins.
pub(super) fn build_todos(plan: &str, history: &[Message]) -> Vec<pb::TodoItem> {
    let listed = tools::plan_todos(plan);
    if !listed.is_empty() {
        return listed;
    }
    let plan = plan.trim();
    let same = |created: &str| {
        let created = created.trim();
        !created.is_empty() && (plan.contains(created) || created.contains(plan))
    };
    history
        .iter()
        .rev()
        .filter_map(|m| match m {
            Message::Assistant { parts } => Some(parts),
            _ => None,
        })
        .flat_map(|parts| parts.iter().rev())
        .find_map(|p| match p {
            AssistantPart::ToolCall {
                name, arguments, ..
            } if name == "create_plan" => {
                let created = ["plan", "content", "markdown", "body", "text"]
                    .iter()
                    .find_map(|k| arguments.get(*k).and_then(|v| v.as_str()))?;
                same(created).then(|| tools::created_plan_todos(arguments))
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// The goal-continuation prompt: `base`, then the todos still open.
pub(super) fn goal_prompt(base: &str, todos: &[pb::TodoItem]) -> String {
    use pb::TodoStatus;
    let open: Vec<String> = todos
        .iter()
        .filter(|t| {
            !matches!(
                TodoStatus::try_from(t.status),
                Ok(TodoStatus::Completed | TodoStatus::Cancelled)
            )
        })
        .map(|t| format!("- {}", t.content))
        .collect();
    if open.is_empty() {
        format!("{base} The todo list has no open items: check the work is complete and say what remains, if anything.")
    } else {
        format!("{base} Open todos:\n{}", open.join("\n"))
    }
}

/// A history the client supplies (`conversation_history`), in the provider's form.
pub(super) fn client_history(h: &pb::ConversationHistory, images: bool) -> Vec<Message> {
    use pb::conversation_history_assistant_content::Content as A;
    use pb::conversation_history_message::Message as M;
    use pb::conversation_history_tool_result_content::Content as R;
    use pb::conversation_history_user_content::Content as U;
    let mut out = Vec::new();
    for m in &h.messages {
        match &m.message {
            Some(M::User(u)) => {
                let text = joined(&u.content, |c| match &c.content {
                    Some(U::Text(t)) => Some(t.text.as_str()),
                    _ => None,
                });
                let user = pb::UserMessage {
                    text,
                    ..Default::default()
                };
                out.push(prompt::user_message_with(
                    &user,
                    images,
                    &context::Blobs::default(),
                ));
            }
            Some(M::Assistant(a)) => {
                let parts: Vec<AssistantPart> = a
                    .content
                    .iter()
                    .filter_map(|c| match &c.content {
                        Some(A::Text(t)) => Some(AssistantPart::Text {
                            text: t.text.clone(),
                        }),
                        Some(A::ToolCall(t)) => Some(AssistantPart::ToolCall {
                            id: t.tool_call_id.clone(),
                            name: t.tool_name.clone(),
                            arguments: serde_json::from_str(&t.args_json)
                                .unwrap_or_else(|_| serde_json::Value::String(t.args_json.clone())),
                            extra: None,
                        }),
                        // Reasoning without the provider's signature cannot be replayed.
                        _ => None,
                    })
                    .collect();
                if !parts.is_empty() {
                    out.push(Message::Assistant { parts });
                }
            }
            Some(M::Tool(t)) => {
                let content = joined(&t.content, |c| match &c.content {
                    Some(R::Text(t)) => Some(t.text.as_str()),
                    _ => None,
                });
                out.push(Message::ToolResult {
                    call_id: t.tool_call_id.clone(),
                    name: t.tool_name.clone(),
                    content,
                    is_error: t.is_error.unwrap_or(false),
                });
            }
            None => {}
        }
    }
    out
}

/// The text parts of client-history content, one per line.
fn joined<'a, T>(items: &'a [T], text: impl Fn(&'a T) -> Option<&'a str>) -> String {
    items.iter().filter_map(text).collect::<Vec<_>>().join("\n")
}

/// An asynchronous question's answer becomes the result of the call that asked it.
fn deliver_answer(messages: &mut [Message], cursor_call_id: &str, answer: &str) {
    for m in messages.iter_mut() {
        if let Message::ToolResult {
            call_id, content, ..
        } = m
        {
            let ours = cursor_call_id == call_id.as_str()
                || cursor_call_id
                    .strip_prefix(call_id.as_str())
                    .is_some_and(|r| r.starts_with("#s"));
            if ours {
                *content = answer.to_string();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(workspaces: &[&str], cwd: &str) -> pb::RequestContext {
        pb::RequestContext {
            env: Some(pb::RequestContextEnv {
                workspace_paths: workspaces.iter().map(|w| w.to_string()).collect(),
                process_working_directory: Some(cwd.into()),
                terminals_folder: "/t".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn todo(content: &str, status: pb::TodoStatus) -> pb::TodoItem {
        pb::TodoItem {
            content: content.into(),
            status: status as i32,
            ..Default::default()
        }
    }

    fn text_of(m: &Message) -> String {
        match m {
            Message::User { parts } => parts
                .iter()
                .filter_map(|p| match p {
                    crate::provider::UserPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect(),
            Message::ToolResult { content, .. } => content.clone(),
            _ => String::new(),
        }
    }

    #[test]
    fn relative_paths_resolve_in_the_first_workspace_else_the_working_directory() {
        assert_eq!(
            workspace_root(Some(&ctx(&["/w1", "/w2"], "/cwd"))).as_deref(),
            Some("/w1")
        );
        assert_eq!(
            workspace_root(Some(&ctx(&[], "/cwd"))).as_deref(),
            Some("/cwd")
        );
        assert_eq!(workspace_root(Some(&ctx(&[], ""))), None);
        assert_eq!(workspace_root(None), None);
        assert_eq!(terminals_folder(Some(&ctx(&[], ""))).as_deref(), Some("/t"));
        assert_eq!(transcripts_folder(Some(&ctx(&[], ""))), None);
    }

    #[test]
    fn a_build_instruction_yields_its_plan() {
        assert_eq!(
            plan_text("Do this:\n<plan>\nstep one\n</plan>\nthanks"),
            "step one"
        );
        assert_eq!(plan_text("no plan here"), "no plan here");
    }

    #[test]
    fn a_goal_continuation_names_the_open_todos_only() {
        let todos = [
            todo("done already", pb::TodoStatus::Completed),
            todo("write tests", pb::TodoStatus::Pending),
            todo("dropped", pb::TodoStatus::Cancelled),
        ];
        assert_eq!(
            goal_prompt("Continue.", &todos),
            "Continue. Open todos:\n- write tests"
        );
        assert!(goal_prompt("Continue.", &todos[..1]).contains("no open items"));
    }

    #[test]
    fn a_build_takes_its_todos_from_the_create_plan_call_that_wrote_the_plan() {
        let call = |plan: &str, todo: &str| Message::Assistant {
            parts: vec![AssistantPart::ToolCall {
                id: "p".into(),
                name: "create_plan".into(),
                arguments: serde_json::json!({ "plan": plan, "todos": [todo] }),
                extra: None,
            }],
        };
        let history = [call("the plan", "first"), call("another plan", "other")];
        let todos = build_todos("the plan", &history);
        assert_eq!(todos.len(), 1);
        assert_eq!(todos[0].content, "first");
        assert!(build_todos("unrelated", &history).is_empty());
    }

    #[test]
    fn a_client_history_becomes_the_providers_messages() {
        use pb::conversation_history_message::Message as M;
        let user = pb::ConversationHistoryUserMessage {
            content: vec![pb::ConversationHistoryUserContent {
                content: Some(pb::conversation_history_user_content::Content::Text(
                    pb::ConversationHistoryTextContent { text: "hi".into() },
                )),
            }],
        };
        let h = pb::ConversationHistory {
            messages: vec![
                pb::ConversationHistoryMessage {
                    message: Some(M::User(user)),
                },
                pb::ConversationHistoryMessage { message: None },
            ],
            replace_user_info: None,
        };
        let messages = client_history(&h, false);
        assert_eq!(messages.len(), 1);
        assert!(text_of(&messages[0]).contains("hi"));
    }

    #[test]
    fn an_answer_goes_to_the_call_that_asked_including_its_step_suffix() {
        let result = |id: &str| Message::ToolResult {
            call_id: id.into(),
            name: "ask_question".into(),
            content: "pending".into(),
            is_error: false,
        };
        let mut messages = vec![result("q1"), result("q2")];
        deliver_answer(&mut messages, "q1#s3", "yes");
        assert_eq!(text_of(&messages[0]), "yes");
        assert_eq!(text_of(&messages[1]), "pending");
    }

    #[test]
    fn the_first_call_reads_the_history_then_the_prepended_then_the_users_message() {
        let mut history = RebuiltHistory {
            messages: vec![Message::user_text("earlier")],
            turns: 1,
            omitted_turns: 0,
            approx_tokens: 0,
            todos: Vec::new(),
            todo_ids: Vec::new(),
            turn_starts: Vec::new(),
            summarized_through: None,
        };
        let input = TurnInput {
            user: pb::UserMessage {
                text: "now".into(),
                ..Default::default()
            },
            prepend: vec![pb::UserMessage {
                text: "before".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let messages = opening_messages(&mut history, &input, false, &context::Blobs::default());
        let texts: Vec<String> = messages.iter().map(text_of).collect();
        assert_eq!(texts.len(), 3);
        assert_eq!(texts[0], "earlier");
        assert!(
            texts[1].contains("before") && texts[2].contains("now"),
            "{texts:?}"
        );
    }
}
