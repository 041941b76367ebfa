//! Auto-review: with `RequestContextEnv.smart_mode_classifier_auto_mode_enabled`, Cursor's
//! server judges each shell and MCP call before the client runs it — `skip_approval` for a
//! safe one, `smart_mode_approval { reason }` for one the user must approve on the client's
//! card. Here the run's own model judges, with a short strict-JSON verdict.
//!
//! The user's and the project's allow lists live on the client: before a verdict, the client
//! is asked with the matching allowlist precheck exec ([`precheck`]), as Cursor's server does,
//! and a call on them is approved without asking the model. The administrator's deny list (in
//! the request context) wins over both.
//!
//! Sans-IO: [`plan`] says whether a call needs a verdict, [`precheck`] and [`allowlisted`] ask
//! the client's lists and read its answer, [`prompt`] is what the model is asked, [`parse`]
//! reads its answer, [`apply`] writes the decision into the exec. Anything short of a clear
//! "allow" (a deny-listed command, a timeout, an unparsable answer, a provider error) asks the
//! user: never an approval by default.

use std::time::Duration;

use serde::Deserialize;

use crate::proto::agent::v1 as pb;
use pb::exec_server_message::Message as X;

/// How long a verdict may take before the user is asked instead.
pub const VERDICT_TIMEOUT: Duration = Duration::from_secs(20);
/// The verdict is a line of JSON: a small answer budget.
pub const VERDICT_MAX_TOKENS: u32 = 300;
/// How long the client may take to say whether a call is on its allow lists; past it, the
/// call is judged as if it were not (the run goes on).
pub const PRECHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// A call is described to the model in at most this many characters.
const MAX_DESCRIPTION_CHARS: usize = 4_000;

/// What a call needs before it goes to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Not judged here (not a shell or MCP call, or a shell the client confines in its
    /// sandbox): the client decides as it would.
    Leave,
    /// The user must approve, for this reason, without asking the model.
    Ask(String),
    /// The model judges the call described so.
    Judge(String),
}

/// The decision written into the exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Ask(String),
}

/// What `exec` needs. `sandboxed`: the client runs shells in its sandbox. `denylist`: the
/// request context's admin command deny list (it wins over any verdict).
pub fn plan(exec: &X, sandboxed: bool, denylist: &[String]) -> Plan {
    match exec {
        X::ShellArgs(s) | X::ShellStreamArgs(s) => {
            if let Some(entry) = denied(&s.command, denylist) {
                return Plan::Ask(format!(
                    "this command matches `{entry}` on the administrator's deny list"
                ));
            }
            if sandboxed {
                return Plan::Leave;
            }
            let mut d = format!("Shell command:\n{}", s.command);
            if !s.working_directory.is_empty() {
                d.push_str(&format!("\nWorking directory: {}", s.working_directory));
            }
            Plan::Judge(crate::agent::context::cap(&d, MAX_DESCRIPTION_CHARS))
        }
        X::McpArgs(m) => {
            let args: serde_json::Map<String, serde_json::Value> = m
                .args
                .iter()
                .map(|(k, v)| (k.clone(), crate::agent::tools::value_to_json(v)))
                .collect();
            let d = format!(
                "MCP tool `{}` of the server `{}`, with arguments:\n{}",
                m.tool_name,
                m.provider_identifier,
                serde_json::Value::Object(args)
            );
            Plan::Judge(crate::agent::context::cap(&d, MAX_DESCRIPTION_CHARS))
        }
        _ => Plan::Leave,
    }
}

/// The allowlist precheck that asks the client whether `exec` is on the user's or project's
/// allow lists; `None` for calls that have none.
pub fn precheck(exec: &X) -> Option<X> {
    let call_id = |id: &str| Some(id.to_string()).filter(|id| !id.is_empty());
    match exec {
        X::ShellArgs(s) | X::ShellStreamArgs(s) => Some(X::ShellAllowlistPrecheckArgs(
            pb::ShellAllowlistPrecheckArgs {
                command: s.command.clone(),
                working_directory: s.working_directory.clone(),
                parsing_result: s.parsing_result.clone(),
                classifier_result: s.classifier_result.clone(),
                tool_call_id: call_id(&s.tool_call_id),
            },
        )),
        X::McpArgs(m) => Some(X::McpAllowlistPrecheckArgs(pb::McpAllowlistPrecheckArgs {
            provider_identifier: m.provider_identifier.clone(),
            tool_name: m.tool_name.clone(),
            tool_call_id: call_id(&m.tool_call_id),
            annotations_json: None,
        })),
        X::FetchArgs(f) => Some(X::WebFetchAllowlistPrecheckArgs(
            pb::WebFetchAllowlistPrecheckArgs {
                url: f.url.clone(),
                tool_call_id: call_id(&f.tool_call_id),
            },
        )),
        _ => None,
    }
}

/// Whether the client's answer to a [`precheck`] says the call is allowlisted (anything else,
/// a thrown error included, says it is not).
pub fn allowlisted(results: &[pb::exec_client_message::Message]) -> bool {
    use pb::exec_client_message::Message as R;
    results.iter().any(|r| match r {
        R::ShellAllowlistPrecheckResult(r) => r.allowlisted,
        R::McpAllowlistPrecheckResult(r) => r.allowlisted,
        R::WebFetchAllowlistPrecheckResult(r) => r.allowlisted,
        _ => false,
    })
}

/// A web fetch as the model is asked to judge it.
pub fn describe_fetch(f: &pb::FetchArgs) -> String {
    crate::agent::context::cap(
        &format!("Web fetch (HTTP GET) of the URL:\n{}", f.url),
        MAX_DESCRIPTION_CHARS,
    )
}

/// The question a web fetch goes to the client with under Auto-review, carrying the decision
/// (`request_id` names the review for the client's card): approved at once, or the card.
pub fn fetch_query(
    f: &pb::FetchArgs,
    decision: Verdict,
    request_id: &str,
) -> pb::interaction_query::Query {
    let (skip_approval, smart_mode_approval) = match decision {
        Verdict::Allow => (true, None),
        Verdict::Ask(reason) => (
            false,
            Some(pb::SmartModeApproval {
                request_id: request_id.to_string(),
                reason,
            }),
        ),
    };
    pb::interaction_query::Query::WebFetchRequestQuery(pb::WebFetchRequestQuery {
        args: Some(pb::WebFetchArgs {
            url: f.url.clone(),
            tool_call_id: f.tool_call_id.clone(),
        }),
        skip_approval,
        smart_mode_approval,
    })
}

/// The user's answer to a [`fetch_query`]: `None` to fetch, else why not. Anything but an
/// approval is a refusal: nothing is fetched that the user did not let through.
pub fn fetch_refusal(response: &pb::InteractionResponse) -> Option<String> {
    use pb::interaction_response::Result as Answer;
    use pb::web_fetch_request_response::Result as Web;
    match &response.result {
        Some(Answer::WebFetchRequestResponse(r)) => match &r.result {
            Some(Web::Approved(_)) => None,
            Some(Web::Rejected(r)) if !r.reason.trim().is_empty() => Some(format!(
                "the user rejected this web fetch: {}",
                r.reason.trim()
            )),
            _ => Some("the user rejected this web fetch".into()),
        },
        _ => Some("the client did not approve this web fetch".into()),
    }
}

/// The deny-list entry a command (or one of its `;`, `&&`, `||`, `|` parts) starts with.
fn denied<'a>(command: &str, denylist: &'a [String]) -> Option<&'a str> {
    let parts = command.split(['\n', ';', '&', '|']).map(str::trim);
    for part in parts.filter(|p| !p.is_empty()) {
        let hit = denylist
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .find(|e| part == *e || part.starts_with(&format!("{e} ")));
        if hit.is_some() {
            return hit;
        }
    }
    None
}

/// The system prompt and the user message asking for a verdict on `description`.
pub fn prompt(description: &str) -> (String, String) {
    let system = "You review actions a coding agent is about to take on the user's machine. \
        Answer with one line of JSON and nothing else: {\"decision\": \"allow\" | \"ask\", \"reason\": \"...\"}. \
        \"allow\" only for actions that are clearly safe: reading, listing, searching, building, testing, \
        formatting inside the project. \"ask\" for anything that deletes or overwrites data outside the \
        project, touches credentials, changes system settings, installs software, pushes or publishes, \
        sends data to the network, or that you are unsure about. The reason is one short sentence for the user."
        .to_string();
    (system, format!("Action:\n{description}"))
}

#[derive(Deserialize)]
struct ReviewAnswer {
    decision: String,
    #[serde(default)]
    reason: String,
}

/// The model's answer as a decision; `None` when it is not the JSON asked for.
pub fn parse(text: &str) -> Option<Verdict> {
    let t = text.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .map(|r| r.trim_end().trim_end_matches("```"))
        .unwrap_or(t)
        .trim();
    let v: ReviewAnswer = serde_json::from_str(t).ok()?;
    let reason = v.reason.trim().to_string();
    match v.decision.trim().to_ascii_lowercase().as_str() {
        "allow" => Some(Verdict::Allow),
        "ask" | "deny" => Some(Verdict::Ask(if reason.is_empty() {
            "Auto-review asks you to approve this call".to_string()
        } else {
            reason
        })),
        _ => None,
    }
}

/// Writes `decision` into the exec (`request_id` names the review for the client's card).
pub fn apply(exec: &mut X, decision: Verdict, request_id: &str) {
    let (skip, approval) = match decision {
        Verdict::Allow => (true, None),
        Verdict::Ask(reason) => (
            false,
            Some(pb::SmartModeApproval {
                request_id: request_id.to_string(),
                reason,
            }),
        ),
    };
    match exec {
        X::ShellArgs(s) | X::ShellStreamArgs(s) => {
            s.skip_approval = skip;
            s.smart_mode_approval = approval;
        }
        X::McpArgs(m) => {
            m.skip_approval = skip;
            m.smart_mode_approval = approval;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(command: &str) -> X {
        X::ShellStreamArgs(pb::ShellArgs {
            command: command.into(),
            working_directory: "/ws".into(),
            ..Default::default()
        })
    }

    #[test]
    fn what_is_judged() {
        let deny = vec!["rm -rf".to_string(), "curl".to_string()];
        assert!(
            matches!(plan(&shell("cargo test"), false, &deny), Plan::Judge(d) if d.contains("cargo test") && d.contains("/ws"))
        );
        assert!(
            matches!(plan(&shell("ls && curl x"), false, &deny), Plan::Ask(r) if r.contains("`curl`"))
        );
        assert!(
            matches!(plan(&shell("rm -rf /"), true, &deny), Plan::Ask(_)),
            "the deny list wins even in the sandbox"
        );
        assert_eq!(
            plan(&shell("curly"), false, &deny),
            Plan::Judge("Shell command:\ncurly\nWorking directory: /ws".into())
        );
        assert_eq!(
            plan(&shell("make"), true, &deny),
            Plan::Leave,
            "the sandbox confines it"
        );
        let mcp = X::McpArgs(pb::McpArgs {
            tool_name: "create_issue".into(),
            provider_identifier: "github".into(),
            ..Default::default()
        });
        assert!(
            matches!(plan(&mcp, true, &deny), Plan::Judge(d) if d.contains("create_issue") && d.contains("github"))
        );
        assert_eq!(
            plan(&X::ReadArgs(Default::default()), false, &deny),
            Plan::Leave
        );
    }

    #[test]
    fn the_clients_allow_lists_are_asked_with_the_calls_own_words() {
        use pb::exec_client_message::Message as R;
        let Some(X::ShellAllowlistPrecheckArgs(p)) = precheck(&shell("cargo test")) else {
            panic!("a shell call is prechecked")
        };
        assert_eq!(
            (p.command.as_str(), p.working_directory.as_str()),
            ("cargo test", "/ws")
        );
        let mcp = X::McpArgs(pb::McpArgs {
            tool_name: "create_issue".into(),
            provider_identifier: "github".into(),
            tool_call_id: "t1".into(),
            ..Default::default()
        });
        let Some(X::McpAllowlistPrecheckArgs(p)) = precheck(&mcp) else {
            panic!("an MCP call is prechecked")
        };
        assert_eq!(p.tool_name, "create_issue");
        assert_eq!(p.tool_call_id.as_deref(), Some("t1"));
        assert_eq!(precheck(&X::ReadArgs(Default::default())), None);
        let yes =
            R::ShellAllowlistPrecheckResult(pb::ShellAllowlistPrecheckResult { allowlisted: true });
        let no =
            R::McpAllowlistPrecheckResult(pb::McpAllowlistPrecheckResult { allowlisted: false });
        assert!(allowlisted(&[yes]));
        assert!(!allowlisted(&[no]));
        assert!(!allowlisted(&[]), "no answer is no approval");
    }

    #[test]
    fn a_web_fetch_asks_with_its_decision_and_only_an_approval_fetches() {
        use pb::interaction_response::Result as Answer;
        use pb::web_fetch_request_response::Result as Web;
        let f = pb::FetchArgs {
            url: "https://example.com/x".into(),
            tool_call_id: "t1".into(),
        };
        assert!(describe_fetch(&f).contains("https://example.com/x"));
        let pb::interaction_query::Query::WebFetchRequestQuery(q) =
            fetch_query(&f, Verdict::Ask("sends data".into()), "r1")
        else {
            panic!("a web fetch query")
        };
        assert!(!q.skip_approval);
        assert_eq!(
            q.smart_mode_approval.map(|a| a.reason).as_deref(),
            Some("sends data")
        );
        assert_eq!(q.args.map(|a| a.tool_call_id).as_deref(), Some("t1"));
        let pb::interaction_query::Query::WebFetchRequestQuery(q) =
            fetch_query(&f, Verdict::Allow, "r2")
        else {
            panic!("a web fetch query")
        };
        assert!(q.skip_approval && q.smart_mode_approval.is_none());
        let answer = |r| pb::InteractionResponse {
            id: 1,
            result: Some(Answer::WebFetchRequestResponse(
                pb::WebFetchRequestResponse { result: r },
            )),
        };
        assert_eq!(
            fetch_refusal(&answer(Some(Web::Approved(Default::default())))),
            None
        );
        let no = fetch_refusal(&answer(Some(Web::Rejected(
            pb::web_fetch_request_response::Rejected {
                reason: "not that site".into(),
            },
        ))));
        assert!(no.is_some_and(|r| r.contains("not that site")));
        assert!(fetch_refusal(&pb::InteractionResponse::default()).is_some());
    }

    #[test]
    fn verdicts_parse_strictly() {
        assert_eq!(
            parse(r#"{"decision":"allow","reason":"runs tests"}"#),
            Some(Verdict::Allow)
        );
        assert_eq!(
            parse("```json\n{\"decision\": \"ask\", \"reason\": \"deletes files\"}\n```"),
            Some(Verdict::Ask("deletes files".into()))
        );
        assert!(matches!(
            parse(r#"{"decision":"deny"}"#),
            Some(Verdict::Ask(_))
        ));
        assert_eq!(parse("Sure, allow it."), None);
        assert_eq!(parse(r#"{"decision":"maybe"}"#), None);
    }

    #[test]
    fn decisions_land_in_the_exec() {
        let mut s = shell("ls");
        apply(&mut s, Verdict::Allow, "r1");
        let X::ShellStreamArgs(a) = &s else {
            unreachable!()
        };
        assert!(a.skip_approval && a.smart_mode_approval.is_none());
        let mut m = X::McpArgs(Default::default());
        apply(&mut m, Verdict::Ask("sends mail".into()), "r2");
        let X::McpArgs(a) = &m else { unreachable!() };
        assert!(!a.skip_approval);
        assert_eq!(
            a.smart_mode_approval,
            Some(pb::SmartModeApproval {
                request_id: "r2".into(),
                reason: "sends mail".into()
            })
        );
    }
}
