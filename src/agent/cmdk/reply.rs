//! What Cmd+K streams back, as a machine: text from the model in, response messages out.
//!
//! The editor gets a status first, then `edit_start` / `edit_stream`… / `edit_end` over the
//! selection's range (chat mode: `chat` text); the terminal gets `partial_command` pieces
//! (chat mode: `chat` text). Edits and commands go out line by line with the model's outer
//! Markdown fence taken off, so a fenced reply does not land in the file.

use prost::Message;

use super::call::Surface;
use super::prompt::LineRange;
use crate::proto::aiserver::v1 as pb;

use pb::stream_cmd_k_response::Response as EditorOut;
use pb::stream_cmd_k_response_context_wrapped::Response as EditorWrapped;
use pb::stream_terminal_cmd_k_response::Response as TerminalOut;
use pb::stream_terminal_cmd_k_response_context_wrapped::Response as TerminalWrapped;

/// The one edit of a reply.
const EDIT_ID: i32 = 1;

/// One response message of either surface.
#[derive(Debug, Clone, PartialEq)]
pub enum CmdKResponse {
    Editor(pb::StreamCmdKResponseContextWrapped),
    Terminal(pb::StreamTerminalCmdKResponseContextWrapped),
}

impl CmdKResponse {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            CmdKResponse::Editor(m) => m.encode_to_vec(),
            CmdKResponse::Terminal(m) => m.encode_to_vec(),
        }
    }

    fn editor(r: EditorOut) -> CmdKResponse {
        CmdKResponse::Editor(pb::StreamCmdKResponseContextWrapped {
            response: Some(EditorWrapped::RealResponse(pb::StreamCmdKResponse {
                response: Some(r),
            })),
        })
    }

    fn terminal(r: TerminalOut) -> CmdKResponse {
        CmdKResponse::Terminal(pb::StreamTerminalCmdKResponseContextWrapped {
            response: Some(TerminalWrapped::RealResponse(
                pb::StreamTerminalCmdKResponse { response: Some(r) },
            )),
        })
    }

    /// Ask for the items behind `hashes` again (before any real response).
    pub fn missing(surface: Surface, hashes: Vec<String>) -> CmdKResponse {
        let m = pb::MissingContextItems {
            missing_context_item_hashes: hashes,
        };
        match surface {
            Surface::Editor => CmdKResponse::Editor(pb::StreamCmdKResponseContextWrapped {
                response: Some(EditorWrapped::MissingContextItems(m)),
            }),
            Surface::Terminal => {
                CmdKResponse::Terminal(pb::StreamTerminalCmdKResponseContextWrapped {
                    response: Some(TerminalWrapped::MissingContextItems(m)),
                })
            }
        }
    }

    /// Acknowledge items, so the client may send them as hashes next time.
    pub(crate) fn statuses(surface: Surface, statuses: Vec<pb::ContextItemStatus>) -> CmdKResponse {
        let u = pb::ContextStatusUpdate {
            context_item_statuses: statuses,
        };
        match surface {
            Surface::Editor => CmdKResponse::Editor(pb::StreamCmdKResponseContextWrapped {
                response: Some(EditorWrapped::ContextStatusUpdate(u)),
            }),
            Surface::Terminal => {
                CmdKResponse::Terminal(pb::StreamTerminalCmdKResponseContextWrapped {
                    response: Some(TerminalWrapped::ContextStatusUpdate(u)),
                })
            }
        }
    }
}

/// What the reply is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Edit(LineRange),
    EditorChat,
    Command,
    TerminalChat,
}

impl Shape {
    pub fn of(surface: Surface, chat: bool, range: LineRange) -> Shape {
        match (surface, chat) {
            (Surface::Editor, false) => Shape::Edit(range),
            (Surface::Editor, true) => Shape::EditorChat,
            (Surface::Terminal, false) => Shape::Command,
            (Surface::Terminal, true) => Shape::TerminalChat,
        }
    }
}

/// The reply machine. See the module documentation.
#[derive(Debug)]
pub struct Reply {
    shape: Shape,
    lines: Lines,
    streamed: bool,
}

impl Reply {
    pub fn new(shape: Shape) -> Reply {
        Reply {
            shape,
            lines: Lines::default(),
            streamed: false,
        }
    }

    /// Whether any of the model's text went out (a retry would then repeat it).
    pub fn streamed(&self) -> bool {
        self.streamed
    }

    /// The first messages, before the model says anything: a status (the client drops a
    /// stream silent for about 10 s), and for an edit its start.
    pub fn opening(&mut self, status: &str) -> Vec<CmdKResponse> {
        let messages = vec![status.to_string()];
        match self.shape {
            Shape::Edit(r) => vec![
                CmdKResponse::editor(EditorOut::StatusUpdate(
                    pb::stream_cmd_k_response::StatusUpdate { messages },
                )),
                CmdKResponse::editor(EditorOut::EditStart(pb::stream_cmd_k_response::EditStart {
                    start_line_number: r.start,
                    edit_id: EDIT_ID,
                    max_end_line_number_exclusive: Some(r.end),
                    file_path: None,
                })),
            ],
            Shape::EditorChat => vec![CmdKResponse::editor(EditorOut::StatusUpdate(
                pb::stream_cmd_k_response::StatusUpdate { messages },
            ))],
            Shape::Command | Shape::TerminalChat => {
                vec![CmdKResponse::terminal(TerminalOut::StatusUpdate(
                    pb::stream_terminal_cmd_k_response::StatusUpdate { messages },
                ))]
            }
        }
    }

    /// A piece of the model's text.
    pub fn text(&mut self, delta: &str) -> Vec<CmdKResponse> {
        let out = match self.shape {
            Shape::EditorChat | Shape::TerminalChat => delta.to_string(),
            Shape::Edit(_) | Shape::Command => self.lines.push(delta),
        };
        self.emit(out)
    }

    /// The model finished: the rest of the text, and for an edit its end.
    pub fn finish(&mut self) -> Vec<CmdKResponse> {
        let rest = match self.shape {
            Shape::Edit(_) | Shape::Command => self.lines.finish(),
            Shape::EditorChat | Shape::TerminalChat => String::new(),
        };
        let mut out = self.emit(rest);
        if let Shape::Edit(r) = self.shape {
            out.push(CmdKResponse::editor(EditorOut::EditEnd(
                pb::stream_cmd_k_response::EditEnd {
                    end_line_number_exclusive: r.end,
                    edit_id: EDIT_ID,
                    file_path: None,
                },
            )));
        }
        out
    }

    fn emit(&mut self, text: String) -> Vec<CmdKResponse> {
        if text.is_empty() {
            return Vec::new();
        }
        self.streamed = true;
        vec![match self.shape {
            Shape::Edit(_) => CmdKResponse::editor(EditorOut::EditStream(
                pb::stream_cmd_k_response::EditStream {
                    text,
                    edit_id: EDIT_ID,
                    file_path: None,
                },
            )),
            Shape::EditorChat => {
                CmdKResponse::editor(EditorOut::Chat(pb::stream_cmd_k_response::Chat { text }))
            }
            Shape::Command => CmdKResponse::terminal(TerminalOut::TerminalCommand(
                pb::stream_terminal_cmd_k_response::TerminalCommand {
                    partial_command: text,
                },
            )),
            Shape::TerminalChat => CmdKResponse::terminal(TerminalOut::Chat(
                pb::stream_terminal_cmd_k_response::Chat { text },
            )),
        }]
    }
}

/// Splits the model's text into lines and takes off an outer Markdown fence: an opening fence
/// as the first non-blank line, and the closing fence (with blank lines after it) at the end.
/// A complete line goes out as soon as its newline arrives, unless it is blank or a bare fence
/// (held until a line with content follows, dropped at the end); lines are joined with `\n`
/// and the reply ends without one.
#[derive(Debug, Default)]
struct Lines {
    partial: String,
    /// Blank lines and bare fences waiting for a line with content.
    held: Vec<String>,
    /// A line went out already.
    started: bool,
    /// The reply opened with a fence (its closing one is dropped at the end).
    fenced: bool,
}

impl Lines {
    fn push(&mut self, delta: &str) -> String {
        self.partial.push_str(delta);
        let mut out = String::new();
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            let line = line.trim_end_matches(['\n', '\r']).to_string();
            self.line(line, &mut out);
        }
        out
    }

    fn finish(&mut self) -> String {
        let mut out = String::new();
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(line, &mut out);
        }
        // What is still held is blank lines or a closing fence: nothing of the edit.
        self.held.clear();
        out
    }

    fn line(&mut self, line: String, out: &mut String) {
        if line.trim().is_empty() {
            self.held.push(line);
            return;
        }
        if is_fence(&line) {
            if !self.started && !self.fenced {
                // The opening fence: it and the blank lines before it go.
                self.fenced = true;
                self.held.clear();
            } else {
                self.held.push(line);
            }
            return;
        }
        for held in std::mem::take(&mut self.held) {
            self.put(&held, out);
        }
        self.put(&line, out);
    }

    fn put(&mut self, line: &str, out: &mut String) {
        if self.started {
            out.push('\n');
        }
        out.push_str(line);
        self.started = true;
    }
}

/// A bare Markdown fence line (```, ```rust, ~~~).
fn is_fence(line: &str) -> bool {
    let t = line.trim();
    (t.starts_with("```") && !t[3..].contains('`')) || t.starts_with("~~~")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(frames: &[CmdKResponse]) -> String {
        frames
            .iter()
            .filter_map(|f| match f {
                CmdKResponse::Editor(w) => match &w.response {
                    Some(EditorWrapped::RealResponse(r)) => match &r.response {
                        Some(EditorOut::EditStream(s)) => Some(s.text.clone()),
                        Some(EditorOut::Chat(c)) => Some(c.text.clone()),
                        _ => None,
                    },
                    _ => None,
                },
                CmdKResponse::Terminal(w) => match &w.response {
                    Some(TerminalWrapped::RealResponse(r)) => match &r.response {
                        Some(TerminalOut::TerminalCommand(c)) => Some(c.partial_command.clone()),
                        Some(TerminalOut::Chat(c)) => Some(c.text.clone()),
                        _ => None,
                    },
                    _ => None,
                },
            })
            .collect()
    }

    /// The edit text for `model` fed in pieces cut at every split point.
    fn edit_text_at_every_split(model: &str) -> String {
        let range = LineRange { start: 3, end: 6 };
        let mut whole: Option<String> = None;
        for cut in 0..=model.len() {
            if !model.is_char_boundary(cut) {
                continue;
            }
            let mut r = Reply::new(Shape::Edit(range));
            let mut frames = r.text(&model[..cut]);
            frames.extend(r.text(&model[cut..]));
            frames.extend(r.finish());
            let got = texts(&frames);
            if let Some(w) = &whole {
                assert_eq!(&got, w, "split at {cut}");
            }
            whole = Some(got);
        }
        whole.unwrap()
    }

    #[test]
    fn an_outer_fence_comes_off_at_every_split_point() {
        assert_eq!(
            edit_text_at_every_split("```rust\nfn a() {}\n\nfn b() {}\n```\n"),
            "fn a() {}\n\nfn b() {}"
        );
        assert_eq!(edit_text_at_every_split("\n```\nx\n```"), "x");
        assert_eq!(edit_text_at_every_split("a\nb\n"), "a\nb");
        // A fence inside the reply stays.
        assert_eq!(
            edit_text_at_every_split("/// ```\n/// x\n/// ```\nfn f() {}"),
            "/// ```\n/// x\n/// ```\nfn f() {}"
        );
    }

    #[test]
    fn an_edit_opens_with_a_status_and_the_selection_range_and_ends_on_it() {
        let mut r = Reply::new(Shape::Edit(LineRange { start: 2, end: 5 }));
        let open = r.opening("Generating");
        let CmdKResponse::Editor(w) = &open[1] else {
            panic!()
        };
        let Some(EditorWrapped::RealResponse(pb::StreamCmdKResponse {
            response: Some(EditorOut::EditStart(s)),
        })) = &w.response
        else {
            panic!("{w:?}")
        };
        assert_eq!(
            (
                s.start_line_number,
                s.max_end_line_number_exclusive,
                s.edit_id
            ),
            (2, Some(5), 1)
        );
        assert!(!r.streamed());
        let first = r.text("let x = 1;\nlet");
        assert_eq!(
            texts(&first),
            "let x = 1;",
            "a complete line goes out at once"
        );
        assert!(r.streamed());
        let end = r.finish();
        assert_eq!(texts(&end), "\nlet");
        assert!(matches!(
            &end[1],
            CmdKResponse::Editor(pb::StreamCmdKResponseContextWrapped {
                response: Some(EditorWrapped::RealResponse(pb::StreamCmdKResponse {
                    response: Some(EditorOut::EditEnd(pb::stream_cmd_k_response::EditEnd {
                        end_line_number_exclusive: 5,
                        edit_id: 1,
                        ..
                    }))
                }))
            })
        ));
    }

    #[test]
    fn chat_passes_text_through_and_commands_lose_their_fence() {
        let mut chat = Reply::new(Shape::EditorChat);
        assert_eq!(texts(&chat.text("It `adds`\n")), "It `adds`\n");
        let mut cmd = Reply::new(Shape::Command);
        let mut frames = cmd.text("```bash\nls -la\n");
        frames.extend(cmd.text("```"));
        frames.extend(cmd.finish());
        assert_eq!(texts(&frames), "ls -la");
    }
}
