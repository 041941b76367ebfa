//! Cursor's agent transcripts for BYOK turns: `@`-mentioning a past chat and Cursor's history
//! search read `<agent_transcripts_folder>/<conversation>/<conversation>.jsonl`, one
//! `{"role", "message": {"content": [text | tool_use]}}` per line. For a run served here Cursor
//! writes only status lines there, so a turn that ended is appended in that format (never
//! mid-turn: rows would repeat or vanish), and a past chat is read back for the model.
//!
//! The line building and reading are pure; [`append`] and [`read`] are the thin IO, each one
//! blocking call off the runtime, so a write is whole or absent.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::agent::state::StepRecord;

/// A transcript file is not grown past this; a turn that would cross it is not written.
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// Each text in a line is capped to this many characters.
const MAX_TEXT_CHARS: usize = 16_000;
/// A tool call's input longer than this (as JSON) is replaced by a note.
const MAX_INPUT_CHARS: usize = 4_000;
/// What of a past chat reaches the model: its last this-many characters.
pub const MAX_PAST_CHAT_CHARS: usize = 60_000;
/// At most this much of a transcript file is read back (its end).
const MAX_READ_BYTES: u64 = 2 * 1024 * 1024;

/// The JSON lines of one ended turn: the user's message, then the answer's text and tool calls
/// in order. Thinking and our own notes to the model are not part of Cursor's transcript.
/// Secrets the process knows are scrubbed from every text.
pub fn turn_lines(user_text: &str, steps: &[StepRecord]) -> String {
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

/// `<folder>/<conversation>/<conversation>.jsonl`, or `None` when the conversation id could
/// name anything but one file in one folder under `folder`.
pub fn path_for(folder: &str, conversation: &str) -> Option<PathBuf> {
    let safe = !conversation.is_empty()
        && conversation.len() <= 128
        && conversation
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !folder.is_empty();
    safe.then(|| {
        Path::new(folder)
            .join(conversation)
            .join(format!("{conversation}.jsonl"))
    })
}

/// What a transcript says, for the model: `User:` / `Assistant:` paragraphs, tool calls named,
/// lines that are not messages (Cursor's status lines) left out; the last
/// [`MAX_PAST_CHAT_CHARS`] characters when longer.
pub fn render(jsonl: &str) -> String {
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

/// Whether `folder` is a transcripts folder of this machine: it exists, or it is where Cursor
/// keeps a project's transcripts (`<home>/.cursor/projects/<project>/agent-transcripts`) under
/// a home that exists here. Clients that do not write status lines (the SDK) never create it.
fn on_this_machine(folder: &Path) -> bool {
    use std::path::Component;
    if folder.is_dir() {
        return true;
    }
    let plain = folder.is_absolute()
        && folder.components().all(|c| {
            matches!(
                c,
                Component::RootDir | Component::Prefix(_) | Component::Normal(_)
            )
        });
    let names: Vec<_> = folder.iter().rev().take(4).collect();
    let layout = names.len() == 4
        && names[0] == "agent-transcripts"
        && names[2] == "projects"
        && names[3] == ".cursor";
    let home = folder.ancestors().nth(4);
    plain && layout && home.is_some_and(Path::is_dir)
}

/// Appends `lines` to the conversation's transcript when `folder` is on this machine
/// ([`on_this_machine`]). `Ok(false)`: not written (no such folder here, an unusable id,
/// nothing to write, or the file would grow past [`MAX_FILE_BYTES`]).
pub async fn append(folder: &str, conversation: &str, lines: String) -> std::io::Result<bool> {
    let Some(path) = path_for(folder, conversation) else {
        return Ok(false);
    };
    if lines.is_empty() {
        return Ok(false);
    }
    let root = PathBuf::from(folder);
    // One blocking task, one write: it finishes even if the turn's task is dropped meanwhile.
    tokio::task::spawn_blocking(move || {
        if !on_this_machine(&root) {
            return Ok(false);
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
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
/// with messages in it.
pub async fn read(folder: &str, conversation: &str) -> Option<String> {
    let path = path_for(folder, conversation)?;
    let text = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut file = std::fs::File::open(&path)?;
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
    fn paths_stay_inside_the_folder() {
        assert_eq!(
            path_for("/t", "conv-1"),
            Some(PathBuf::from("/t/conv-1/conv-1.jsonl"))
        );
        for bad in ["", "..", "a/b", "../x", "a\\b", "a.b"] {
            assert_eq!(path_for("/t", bad), None, "{bad}");
        }
        assert_eq!(path_for("", "conv"), None);
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

    #[tokio::test]
    async fn append_keeps_existing_lines_and_needs_the_folder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let folder = dir.path().to_str().expect("utf-8").to_string();
        let file = dir.path().join("c1/c1.jsonl");
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, "{\"cursor\":\"status\"}\n").expect("write");
        assert!(append(&folder, "c1", turn_lines("hi", &[]))
            .await
            .expect("io"));
        let text = std::fs::read_to_string(&file).expect("read");
        assert!(text.starts_with("{\"cursor\":\"status\"}\n"));
        assert_eq!(text.lines().count(), 2);
        assert_eq!(read(&folder, "c1").await.as_deref(), Some("User: hi"));

        let missing = dir.path().join("not-here");
        let missing = missing.to_str().expect("utf-8");
        assert!(!append(missing, "c1", turn_lines("hi", &[]))
            .await
            .expect("io"));
        assert!(!Path::new(missing).exists(), "no folder is created");
        assert_eq!(read(missing, "c1").await, None);
    }

    #[test]
    fn cursors_own_transcripts_folder_under_a_home_here_counts_as_this_machines() {
        let home = tempfile::tempdir().expect("tempdir");
        let folder = home
            .path()
            .join(".cursor/projects/tmp-ws/agent-transcripts");
        assert!(
            on_this_machine(&folder),
            "Cursor's layout under an existing home"
        );
        let elsewhere = Path::new("/no/such/home/.cursor/projects/ws/agent-transcripts");
        assert!(
            !on_this_machine(elsewhere),
            "the home is not on this machine"
        );
        let other = home.path().join("notes/agent-transcripts");
        assert!(!on_this_machine(&other), "not Cursor's layout");
        let sneaky = home.path().join(".cursor/projects/../agent-transcripts");
        assert!(!on_this_machine(&sneaky), "no `..` in the path");
    }

    #[tokio::test]
    async fn the_file_is_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let folder = dir.path().to_str().expect("utf-8").to_string();
        let file = dir.path().join("c2/c2.jsonl");
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, vec![b' '; MAX_FILE_BYTES as usize - 10]).expect("write");
        assert!(!append(&folder, "c2", turn_lines("hello there", &[]))
            .await
            .expect("io"));
        assert_eq!(
            std::fs::metadata(&file).expect("meta").len(),
            MAX_FILE_BYTES - 10
        );
    }
}
