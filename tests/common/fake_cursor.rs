//! Plays Cursor's client side of a run, transport-agnostic: give it each server message, send
//! back what it returns. It runs execs against a real temporary workspace (read, write,
//! delete, ls, shell via `sh -c`), keeps a blob store like the client's KV, answers the request
//! context and questions.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use cursor_byok::proto::agent::v1 as pb;
use pb::agent_client_message::Message as In;
use pb::agent_server_message::Message as Server;
use pb::exec_client_message::Message as R;
use pb::exec_server_message::Message as X;
use sha2::Digest;

pub struct FakeCursor {
    pub workspace: PathBuf,
    /// The client's KV store: blob id → bytes.
    pub blobs: HashMap<Vec<u8>, Bytes>,
    /// Don't ack `set_blob` (to test the missing-ack error).
    pub withhold_acks: bool,
    /// Answer execs with `throw` instead of running them.
    pub throw_execs: bool,
    /// Every exec the server asked for, in order.
    pub execs: Vec<pb::ExecServerMessage>,
    /// Exec ids the server aborted.
    pub aborted: Vec<u32>,
    /// The last checkpoint the server sent.
    pub checkpoint: Option<pb::ConversationStateStructure>,
    /// Shell commands are held until this file exists (to test cancel during a shell exec).
    pub shell_gate: Option<PathBuf>,
    /// How many blobs the server asked for.
    pub gets: usize,
    /// A shell held by `shell_gate` (exec id, client exec id): it has started and not ended.
    pub held_shell: Option<(u32, String)>,
    /// Shell commands and URLs on the user's allow lists (answered in allowlist prechecks).
    pub allowlist: Vec<String>,
    /// URLs the user rejects on a web fetch card (every other one is approved).
    pub reject_fetches: Vec<String>,
    /// Never answer allowlist prechecks (a client that does not know them).
    pub ignore_prechecks: bool,
}

impl FakeCursor {
    pub fn new(workspace: &Path) -> Self {
        FakeCursor {
            workspace: workspace.to_path_buf(),
            blobs: HashMap::new(),
            withhold_acks: false,
            throw_execs: false,
            execs: Vec::new(),
            aborted: Vec::new(),
            checkpoint: None,
            shell_gate: None,
            gets: 0,
            held_shell: None,
            allowlist: Vec::new(),
            reject_fetches: Vec::new(),
            ignore_prechecks: false,
        }
    }

    pub fn request_context(&self) -> pb::RequestContext {
        pb::RequestContext {
            env: Some(pb::RequestContextEnv {
                os_version: "linux-test".into(),
                shell: "sh".into(),
                workspace_paths: vec![self.workspace.display().to_string()],
                time_zone: "UTC".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The client's answer to one server message (possibly several messages, possibly none).
    /// Shell commands run synchronously here; fine for tests.
    pub fn respond(&mut self, m: &pb::AgentServerMessage) -> Vec<pb::AgentClientMessage> {
        match &m.message {
            Some(Server::ExecServerMessage(e)) => self.exec(e),
            Some(Server::KvServerMessage(k)) => self.kv(k),
            Some(Server::ExecServerControlMessage(c)) => {
                if let Some(pb::exec_server_control_message::Message::Abort(a)) = &c.message {
                    self.aborted.push(a.id);
                }
                vec![]
            }
            Some(Server::ConversationCheckpointUpdate(s)) => {
                self.checkpoint = Some(s.clone());
                vec![]
            }
            Some(Server::InteractionQuery(q)) => self.interaction(q),
            _ => vec![],
        }
    }

    fn kv(&mut self, k: &pb::KvServerMessage) -> Vec<pb::AgentClientMessage> {
        use pb::kv_client_message::Message as KvIn;
        use pb::kv_server_message::Message as KvOut;
        let answer = match &k.message {
            Some(KvOut::SetBlobArgs(s)) => {
                self.blobs.insert(s.blob_id.to_vec(), s.blob_data.clone());
                if self.withhold_acks {
                    return vec![];
                }
                KvIn::SetBlobResult(pb::SetBlobResult { error: None })
            }
            // Like the real client: an unknown id is an empty result, not an error.
            Some(KvOut::GetBlobArgs(g)) => {
                self.gets += 1;
                KvIn::GetBlobResult(pb::GetBlobResult {
                    blob_data: self.blobs.get(g.blob_id.as_ref()).cloned(),
                    error: None,
                })
            }
            None => return vec![],
        };
        vec![pb::AgentClientMessage {
            message: Some(In::KvClientMessage(pb::KvClientMessage {
                id: k.id,
                message: Some(answer),
            })),
        }]
    }

    fn interaction(&mut self, q: &pb::InteractionQuery) -> Vec<pb::AgentClientMessage> {
        use pb::interaction_query::Query;
        use pb::interaction_response::Result as Answer;
        let result = match &q.query {
            Some(Query::AskQuestionInteractionQuery(a)) => {
                let answers = a
                    .args
                    .iter()
                    .flat_map(|args| &args.questions)
                    .map(|question| pb::ask_question_success::Answer {
                        question_id: question.id.clone(),
                        selected_option_ids: question
                            .options
                            .first()
                            .map(|o| vec![o.id.clone()])
                            .unwrap_or_default(),
                        freeform_text: "blue".into(),
                    })
                    .collect();
                Answer::AskQuestionInteractionResponse(pb::AskQuestionInteractionResponse {
                    result: Some(pb::AskQuestionResult {
                        result: Some(pb::ask_question_result::Result::Success(
                            pb::AskQuestionSuccess { answers },
                        )),
                    }),
                })
            }
            Some(Query::WebFetchRequestQuery(w)) => {
                use pb::web_fetch_request_response::{Rejected, Result as Web};
                let url = w.args.as_ref().map(|a| a.url.clone()).unwrap_or_default();
                let result = if self.reject_fetches.contains(&url) {
                    Web::Rejected(Rejected {
                        reason: "not this site".into(),
                    })
                } else {
                    Web::Approved(Default::default())
                };
                Answer::WebFetchRequestResponse(pb::WebFetchRequestResponse {
                    result: Some(result),
                })
            }
            // Cursor writes the plan file and names it.
            Some(Query::CreatePlanRequestQuery(_)) => {
                Answer::CreatePlanRequestResponse(pb::CreatePlanRequestResponse {
                    result: Some(pb::CreatePlanResult {
                        result: Some(pb::create_plan_result::Result::Success(
                            pb::CreatePlanSuccess {},
                        )),
                        plan_uri: format!(
                            "file://{}/.cursor/plans/plan.plan.md",
                            self.workspace.display()
                        ),
                    }),
                })
            }
            _ => return vec![],
        };
        vec![pb::AgentClientMessage {
            message: Some(In::InteractionResponse(pb::InteractionResponse {
                id: q.id,
                result: Some(result),
            })),
        }]
    }

    fn exec(&mut self, e: &pb::ExecServerMessage) -> Vec<pb::AgentClientMessage> {
        self.execs.push(e.clone());
        let id = e.id;
        if self.throw_execs && !matches!(e.message, Some(X::RequestContextArgs(_))) {
            return vec![control(pb::exec_client_control_message::Message::Throw(
                pb::ExecClientThrow {
                    id,
                    error: "EACCES: permission denied (test)".into(),
                    ..Default::default()
                },
            ))];
        }
        let precheck = matches!(
            e.message,
            Some(X::ShellAllowlistPrecheckArgs(_) | X::WebFetchAllowlistPrecheckArgs(_))
        );
        if self.ignore_prechecks && precheck {
            return vec![];
        }
        let results: Vec<R> = match &e.message {
            Some(X::RequestContextArgs(_)) => {
                vec![R::RequestContextResult(pb::RequestContextResult {
                    result: Some(pb::request_context_result::Result::Success(
                        pb::RequestContextSuccess {
                            request_context: Some(self.request_context()),
                            served_from_disk_cache: None,
                        },
                    )),
                })]
            }
            Some(X::ReadArgs(r)) => vec![R::ReadResult(self.read(&r.path))],
            Some(X::WriteArgs(w)) => {
                let path = self.path(&w.path);
                let ok = std::fs::write(&path, &w.file_text).is_ok();
                vec![R::WriteResult(pb::WriteResult {
                    result: Some(if ok {
                        pb::write_result::Result::Success(pb::WriteSuccess {
                            path: w.path.clone(),
                            lines_created: w.file_text.lines().count() as i32,
                            file_size: w.file_text.len() as i32,
                            file_content_after_write: None,
                        })
                    } else {
                        pb::write_result::Result::Error(pb::WriteError {
                            path: w.path.clone(),
                            error: "cannot write".into(),
                        })
                    }),
                })]
            }
            Some(X::DeleteArgs(d)) => {
                let path = self.path(&d.path);
                let prev = std::fs::read_to_string(&path).unwrap_or_default();
                let result = match std::fs::remove_file(&path) {
                    Ok(()) => pb::delete_result::Result::Success(pb::DeleteSuccess {
                        path: d.path.clone(),
                        deleted_file: d.path.clone(),
                        file_size: prev.len() as i64,
                        prev_content: prev,
                    }),
                    Err(_) => pb::delete_result::Result::FileNotFound(pb::DeleteFileNotFound {
                        path: d.path.clone(),
                    }),
                };
                vec![R::DeleteResult(pb::DeleteResult {
                    result: Some(result),
                })]
            }
            Some(X::ShellStreamArgs(s)) => {
                let results = self.shell(s);
                if self.shell_gate.as_ref().is_some_and(|g| !g.exists()) {
                    // Held: started, still running; no close until it is backgrounded.
                    self.held_shell = Some((id, e.exec_id.clone()));
                    return results
                        .into_iter()
                        .map(|r| result_message(id, &e.exec_id, r))
                        .collect();
                }
                results
            }
            Some(X::ForceBackgroundShellArgs(_)) => return self.force_background(id, &e.exec_id),
            Some(X::ShellAllowlistPrecheckArgs(p)) => {
                vec![R::ShellAllowlistPrecheckResult(
                    pb::ShellAllowlistPrecheckResult {
                        allowlisted: self.allowlist.contains(&p.command),
                    },
                )]
            }
            Some(X::WebFetchAllowlistPrecheckArgs(p)) => {
                vec![R::WebFetchAllowlistPrecheckResult(
                    pb::WebFetchAllowlistPrecheckResult {
                        allowlisted: self.allowlist.contains(&p.url),
                    },
                )]
            }
            Some(X::FetchArgs(f)) => vec![R::FetchResult(pb::FetchResult {
                result: Some(pb::fetch_result::Result::Success(pb::FetchSuccess {
                    url: f.url.clone(),
                    content: format!("the page at {}", f.url),
                    status_code: 200,
                    ..Default::default()
                })),
            })],
            _ => vec![],
        };
        let mut out: Vec<pb::AgentClientMessage> = results
            .into_iter()
            .map(|r| result_message(id, &e.exec_id, r))
            .collect();
        out.push(control(
            pb::exec_client_control_message::Message::StreamClose(pb::ExecClientStreamClose { id }),
        ));
        out
    }

    /// "Move to background": the held shell ends its exec with `backgrounded` (shell 1000,
    /// pid 4242, as the user asked), and the request is answered accepted.
    fn force_background(&mut self, id: u32, exec_id: &str) -> Vec<pb::AgentClientMessage> {
        use pb::shell_stream::Event;
        let close = |id| {
            control(pb::exec_client_control_message::Message::StreamClose(
                pb::ExecClientStreamClose { id },
            ))
        };
        let Some((shell, shell_exec)) = self.held_shell.take() else {
            let status = pb::ForceBackgroundShellStatus::NotFound as i32;
            let r = R::ForceBackgroundShellResult(pb::ForceBackgroundShellResult {
                status,
                shell_result: None,
            });
            return vec![result_message(id, exec_id, r), close(id)];
        };
        let moved = R::ShellStream(pb::ShellStream {
            event: Some(Event::Backgrounded(pb::ShellStreamBackgrounded {
                shell_id: 1000,
                pid: Some(4242),
                reason: Some(pb::ShellBackgroundReason::UserRequest as i32),
                ..Default::default()
            })),
        });
        let accepted = R::ForceBackgroundShellResult(pb::ForceBackgroundShellResult {
            status: pb::ForceBackgroundShellStatus::Accepted as i32,
            shell_result: None,
        });
        vec![
            result_message(id, exec_id, accepted),
            close(id),
            result_message(shell, &shell_exec, moved),
            close(shell),
        ]
    }

    fn path(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.workspace.join(p)
        }
    }

    fn read(&self, path: &str) -> pb::ReadResult {
        let result = match std::fs::read_to_string(self.path(path)) {
            Ok(content) => pb::read_result::Result::Success(pb::ReadSuccess {
                path: self.path(path).display().to_string(),
                total_lines: content.lines().count() as i32,
                file_size: content.len() as i64,
                output: Some(pb::read_success::Output::Content(content)),
                ..Default::default()
            }),
            Err(_) => {
                pb::read_result::Result::FileNotFound(pb::ReadFileNotFound { path: path.into() })
            }
        };
        pb::ReadResult {
            result: Some(result),
        }
    }

    fn shell(&self, s: &pb::ShellArgs) -> Vec<R> {
        use pb::shell_stream::Event;
        if let Some(gate) = &self.shell_gate {
            // Never answers: the test cancels meanwhile.
            if !gate.exists() {
                return vec![R::ShellStream(pb::ShellStream {
                    event: Some(Event::Start(pb::ShellStreamStart::default())),
                })];
            }
        }
        let dir = if s.working_directory.is_empty() {
            self.workspace.clone()
        } else {
            self.path(&s.working_directory)
        };
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&s.command)
            .current_dir(&dir)
            .output();
        let (stdout, stderr, code) = match out {
            Ok(o) => (
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
                o.status.code().unwrap_or(1) as u32,
            ),
            Err(e) => (String::new(), e.to_string(), 127),
        };
        let ev = |e: Event| R::ShellStream(pb::ShellStream { event: Some(e) });
        let mut v = vec![ev(Event::Start(pb::ShellStreamStart::default()))];
        if !stdout.is_empty() {
            v.push(ev(Event::Stdout(pb::ShellStreamStdout { data: stdout })));
        }
        if !stderr.is_empty() {
            v.push(ev(Event::Stderr(pb::ShellStreamStderr { data: stderr })));
        }
        v.push(ev(Event::Exit(pb::ShellStreamExit {
            code,
            cwd: dir.display().to_string(),
            ..Default::default()
        })));
        v
    }

    /// Every blob the server stored has id = SHA-256(data).
    pub fn blob_ids_are_sha256(&self) -> bool {
        self.blobs
            .iter()
            .all(|(id, data)| sha2::Sha256::digest(data).as_slice() == id.as_slice())
    }
}

fn result_message(id: u32, exec_id: &str, r: R) -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(In::ExecClientMessage(pb::ExecClientMessage {
            id,
            exec_id: exec_id.to_string(),
            message: Some(r),
            ..Default::default()
        })),
    }
}

fn control(m: pb::exec_client_control_message::Message) -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(In::ExecClientControlMessage(pb::ExecClientControlMessage {
            message: Some(m),
        })),
    }
}

/// The action of a user typing `text` (message id `m1`), with the request context, if any.
pub fn user_message_action(
    text: &str,
    request_context: Option<pb::RequestContext>,
) -> pb::ConversationAction {
    pb::ConversationAction {
        action: Some(pb::conversation_action::Action::UserMessageAction(
            pb::UserMessageAction {
                user_message: Some(pb::UserMessage {
                    text: text.into(),
                    message_id: "m1".into(),
                    ..Default::default()
                }),
                request_context,
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// Plays `client` for the run `handle` up to its first `subagent_args`, which it returns.
pub async fn first_subagent_args(
    handle: &mut cursor_byok::agent::RunHandle,
    client: &mut FakeCursor,
) -> pb::SubagentArgs {
    use cursor_byok::agent::RunOutput;
    loop {
        let out = tokio::time::timeout(std::time::Duration::from_secs(20), handle.output.recv())
            .await
            .expect("the run must not hang")
            .expect("the run must send subagent_args");
        let m = match out {
            RunOutput::Message(m) | RunOutput::Encoded(m, _) => m,
            RunOutput::End(end) => panic!("the run ended first: {:?}", end.error),
        };
        if let Some(Server::ExecServerMessage(pb::ExecServerMessage {
            message: Some(X::SubagentArgs(a)),
            ..
        })) = &m.message
        {
            return a.clone();
        }
        for reply in client.respond(&m) {
            let _ = handle.input.send(Box::new(reply)).await;
        }
    }
}
