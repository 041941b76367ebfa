//! What each `ConversationAction` branch of a run request asks the run to do, the way Cursor's
//! own server answers it. Pure: the run carries the result out. A branch without a handler is
//! an error naming it, never a silent "continue".

use super::error::RunError;
use crate::proto::agent::v1 as pb;
use pb::conversation_action::Action;

/// What the run does for its first request.
pub(super) enum Begin {
    /// A model turn.
    Turn(Box<TurnInput>),
    /// `/summarize`: compact the conversation now; no model turn.
    Summarize,
    /// A command the user ran from the chat: run it through the client (under the client's
    /// `exec_id` when it gave one), record it; no model turn.
    Shell { command: String, exec_id: String },
    /// Stop a subagent (by its id); no model turn.
    CancelSubagent { id: String },
    /// Move a subagent call to the background: nothing runs in the foreground of a run that
    /// starts with it, so there is nothing to move; no model turn.
    BackgroundSubagent { call: String },
}

/// Where a Build's plan text comes from when the action does not carry it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PlanToRead {
    pub path: String,
}

/// The input of one model turn.
#[derive(Default)]
pub(super) struct TurnInput {
    /// The message that opens the turn (recorded as the turn's user message).
    pub user: pb::UserMessage,
    /// Messages that go before `user` (`prepend_user_messages`).
    pub(crate) prepend: Vec<pb::UserMessage>,
    pub request_context: Option<pb::RequestContext>,
    /// A Build whose plan must be read through the client first.
    pub(crate) plan_to_read: Option<PlanToRead>,
    /// A Build: the plan registered in the checkpoint under this id.
    pub plan_id: Option<(String, String)>,
    /// The answer to an earlier ask-question call: (Cursor call id, result for the model).
    pub answer: Option<(String, String)>,
    /// A history the client supplies in place of the rebuilt one.
    pub history: Option<pb::ConversationHistory>,
    /// How tool calls left pending by a cancel were resolved.
    pub resolutions: Vec<pb::InterruptedPendingToolCallResolution>,
    /// Continue toward the goal: the prompt names the open todos.
    pub(crate) goal_continuation: bool,
}

/// Every branch name of `ConversationAction`, as the schema spells it.
pub fn branch_name(a: &Action) -> &'static str {
    match a {
        Action::UserMessageAction(_) => "user_message_action",
        Action::ResumeAction(_) => "resume_action",
        Action::CancelAction(_) => "cancel_action",
        Action::SummarizeAction(_) => "summarize_action",
        Action::ShellCommandAction(_) => "shell_command_action",
        Action::StartPlanAction(_) => "start_plan_action",
        Action::ExecutePlanAction(_) => "execute_plan_action",
        Action::AsyncAskQuestionCompletionAction(_) => "async_ask_question_completion_action",
        Action::CancelSubagentAction(_) => "cancel_subagent_action",
        Action::BackgroundTaskCompletionAction(_) => "background_task_completion_action",
        Action::BackgroundShellAction(_) => "background_shell_action",
        Action::BackgroundSubagentAction(_) => "background_subagent_action",
        Action::SubscriptionNotificationAction(_) => "subscription_notification_action",
        Action::GoalContinuationAction(_) => "goal_continuation_action",
        Action::InjectContextAction(_) => "inject_context_action",
    }
}

/// What the run request's action asks for.
pub(crate) fn begin(req: &pb::AgentRunRequest) -> Result<Begin, RunError> {
    let Some(action) = req.action.as_ref().and_then(|a| a.action.as_ref()) else {
        return Err(RunError::BadClientMessage(
            "the run request carries no conversation action".into(),
        ));
    };
    let turn = |t: TurnInput| Ok(Begin::Turn(Box::new(t)));
    match action {
        Action::UserMessageAction(a) => turn(user_message(a)),
        Action::ResumeAction(a) => turn(TurnInput {
            user: simulated("Continue where you left off.", None),
            request_context: a.request_context.clone(),
            ..Default::default()
        }),
        Action::StartPlanAction(a) => turn(start_plan(a)),
        Action::ExecutePlanAction(a) => turn(execute_plan(a)),
        Action::AsyncAskQuestionCompletionAction(a) => turn(async_answer(a)),
        Action::SubscriptionNotificationAction(a) => turn(notifications(a)),
        Action::GoalContinuationAction(_) => turn(TurnInput {
            user: simulated(
                "Continue working toward the goal of this conversation.",
                Some(pb::SimulatedMsgReason::GoalContinuation),
            ),
            goal_continuation: true,
            ..Default::default()
        }),
        Action::SummarizeAction(_) => Ok(Begin::Summarize),
        Action::ShellCommandAction(a) => shell_command(a),
        Action::CancelAction(_) => Err(RunError::BadClientMessage(
            "a run cannot start with cancel_action: there is nothing running to cancel".into(),
        )),
        Action::InjectContextAction(_) => Err(RunError::BadClientMessage(
            "inject_context_action steers a running run; it cannot start one".into(),
        )),
        Action::BackgroundShellAction(_) => Err(RunError::BadClientMessage(
            "background_shell_action moves a command of a running run to the background; it cannot start a run".into(),
        )),
        Action::BackgroundTaskCompletionAction(a) => turn(TurnInput {
            user: simulated(
                &super::background::completion_note(a),
                Some(pb::SimulatedMsgReason::BackgroundTaskCompletion),
            ),
            ..Default::default()
        }),
        Action::CancelSubagentAction(a) => Ok(Begin::CancelSubagent {
            id: a.subagent_id.clone(),
        }),
        Action::BackgroundSubagentAction(a) => Ok(Begin::BackgroundSubagent {
            call: a.tool_call_id.clone(),
        }),
    }
}

/// The user's message: the turn, with what the client sent along.
fn user_message(a: &pb::UserMessageAction) -> TurnInput {
    TurnInput {
        user: a.user_message.clone().unwrap_or_default(),
        prepend: a.prepend_user_messages.clone(),
        request_context: a.request_context.clone(),
        history: a.conversation_history.clone(),
        resolutions: resolutions(a.interrupted_pending_tool_call_resolutions.as_ref()),
        ..Default::default()
    }
}

/// A plan-mode turn (plan mode unless the message names one), or a spec.
fn start_plan(a: &pb::StartPlanAction) -> TurnInput {
    let mut user = a.user_message.clone().unwrap_or_default();
    if user.mode == 0 {
        user.mode = pb::AgentMode::Plan as i32;
    }
    if a.is_spec {
        user.text = format!(
            "{}\n\n(Write a specification for this — what to build and the requirements it must meet — not an implementation plan.)",
            user.text
        );
    }
    TurnInput {
        user,
        request_context: a.request_context.clone(),
        ..Default::default()
    }
}

/// A command the user ran from the chat; it must carry one.
fn shell_command(a: &pb::ShellCommandAction) -> Result<Begin, RunError> {
    let command = a
        .shell_command
        .as_ref()
        .map(|c| c.command.clone())
        .unwrap_or_default();
    if command.trim().is_empty() {
        return Err(RunError::BadClientMessage(
            "shell_command_action carries no command".into(),
        ));
    }
    Ok(Begin::Shell {
        command,
        exec_id: a.exec_id.clone(),
    })
}

fn resolutions(
    r: Option<&pb::InterruptedPendingToolCallResolutions>,
) -> Vec<pb::InterruptedPendingToolCallResolution> {
    r.map(|r| r.resolutions.clone()).unwrap_or_default()
}

/// A message the system writes on the user's behalf.
fn simulated(text: &str, reason: Option<pb::SimulatedMsgReason>) -> pb::UserMessage {
    pb::UserMessage {
        text: text.into(),
        is_simulated_msg: Some(true),
        simulated_msg_reason: reason.map(|r| r as i32),
        ..Default::default()
    }
}

/// The Build button: the plan becomes the instruction of the turn.
fn execute_plan(a: &pb::ExecutePlanAction) -> TurnInput {
    let text = a
        .plan
        .as_ref()
        .map(|p| p.plan.clone())
        .filter(|p| !p.trim().is_empty())
        .or_else(|| a.plan_file_content.clone().filter(|p| !p.trim().is_empty()));
    let path = a
        .plan_file_path
        .clone()
        .filter(|p| !p.is_empty())
        .or_else(|| a.plan_file_uri.as_deref().map(uri_path));
    let mode = if a.execution_mode == 0 {
        pb::AgentMode::Agent as i32
    } else {
        a.execution_mode
    };
    let plan_id = a.plan_id.clone().filter(|p| !p.is_empty());
    let mut user = simulated(
        &build_instruction(text.as_deref().unwrap_or_default()),
        Some(pb::SimulatedMsgReason::PlanExecution),
    );
    user.mode = mode;
    user.message_id = a.kickoff_message_id.clone().unwrap_or_default();
    user.execute_plan_info = plan_id.as_ref().map(|id| pb::ExecutePlanInfo {
        plan_id: id.clone(),
        plan_title: String::new(),
    });
    TurnInput {
        user,
        request_context: a.request_context.clone(),
        plan_to_read: match (&text, path.clone()) {
            (None, Some(path)) => Some(PlanToRead { path }),
            _ => None,
        },
        plan_id: plan_id.map(|id| (id, path.unwrap_or_default())),
        ..Default::default()
    }
}

/// The instruction of a Build turn for `plan` (its Markdown, todos front matter and all).
pub(super) fn build_instruction(plan: &str) -> String {
    format!(
        "Implement the plan below. Follow it step by step, keep the todo list up to date as you go, and do not stop until every step is done.\n\n<plan>\n{}\n</plan>",
        plan.trim()
    )
}

/// `file:///a/b.md` → `/a/b.md` (percent-escapes left alone: plan paths rarely need them).
fn uri_path(uri: &str) -> String {
    uri.strip_prefix("file://").unwrap_or(uri).to_string()
}

/// The answer to an asynchronous ask-question call: delivered as that call's result.
fn async_answer(a: &pb::AsyncAskQuestionCompletionAction) -> TurnInput {
    let rendered =
        crate::agent::tools::render_ask_result(a.original_args.clone(), a.result.clone());
    let text = format!(
        "The user answered the question you asked earlier (tool call {}).\n{rendered}",
        a.original_tool_call_id
    );
    TurnInput {
        user: simulated(&text, None),
        answer: Some((a.original_tool_call_id.clone(), rendered)),
        ..Default::default()
    }
}

/// Notifications from subscriptions: simulated user messages the model answers.
fn notifications(a: &pb::SubscriptionNotificationAction) -> TurnInput {
    let mut notes = a.notifications.clone();
    for n in &mut notes {
        n.is_simulated_msg = Some(true);
        n.simulated_msg_reason
            .get_or_insert(pb::SimulatedMsgReason::Subscription as i32);
    }
    let user = notes.pop().unwrap_or_else(|| {
        simulated(
            "(A subscription notification arrived without content.)",
            Some(pb::SimulatedMsgReason::Subscription),
        )
    });
    TurnInput {
        user,
        prepend: notes,
        request_context: a.request_context.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(a: Action) -> pb::AgentRunRequest {
        pb::AgentRunRequest {
            action: Some(pb::ConversationAction {
                action: Some(a),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_build_with_only_a_path_reads_the_plan_and_defaults_to_agent_mode() {
        let Ok(Begin::Turn(t)) = begin(&req(Action::ExecutePlanAction(pb::ExecutePlanAction {
            plan_file_uri: Some("file:///ws/.cursor/plans/x.plan.md".into()),
            plan_id: Some("p1".into()),
            ..Default::default()
        }))) else {
            panic!("a turn")
        };
        assert_eq!(t.user.mode, pb::AgentMode::Agent as i32);
        assert_eq!(t.plan_to_read.unwrap().path, "/ws/.cursor/plans/x.plan.md");
        assert_eq!(t.plan_id.unwrap().0, "p1");
        assert_eq!(t.user.execute_plan_info.unwrap().plan_id, "p1");
    }

    #[test]
    fn background_actions_that_cannot_start_a_run_say_so() {
        let e = begin(&req(Action::BackgroundShellAction(Default::default())))
            .err()
            .unwrap();
        assert!(e.to_string().contains("cannot start a run"), "{e}");
        assert!(matches!(
            begin(&req(Action::BackgroundSubagentAction(Default::default()))),
            Ok(Begin::BackgroundSubagent { .. })
        ));
        assert!(matches!(
            begin(&req(Action::CancelSubagentAction(Default::default()))),
            Ok(Begin::CancelSubagent { .. })
        ));
    }

    #[test]
    fn a_completion_starts_a_turn_that_tells_the_model() {
        let Ok(Begin::Turn(t)) = begin(&req(Action::BackgroundTaskCompletionAction(
            pb::BackgroundTaskCompletionAction {
                completions: vec![pb::BackgroundTaskCompletion {
                    task_id: "1000".into(),
                    kind: pb::BackgroundTaskKind::Shell as i32,
                    output_path: Some("/t/1000.txt".into()),
                    ..Default::default()
                }],
                system_reminder: None,
            },
        ))) else {
            panic!("a turn")
        };
        assert!(
            t.user.text.contains("Background shell 1000 ended"),
            "{}",
            t.user.text
        );
        assert_eq!(
            t.user.simulated_msg_reason,
            Some(pb::SimulatedMsgReason::BackgroundTaskCompletion as i32)
        );
    }
}
