//! What the user attached to a message (`SelectedContext`), tagged so the model knows what each
//! piece is, with content given by blob id taken from the fetched blobs, and bounded: each item
//! and the whole message have a cap, and a cut shows as "[truncated]".

use std::fmt::Write;

use base64::Engine;

use super::rules;
use super::text::{cap, MAX_ITEM_CHARS, MAX_TURN_CHARS, TRUNCATED};
use super::Blobs;
use crate::proto::agent::v1 as pb;
use crate::provider::UserPart;

/// Builds the attached text within the message's budget.
struct Out {
    text: String,
    left: usize,
}

impl Out {
    /// `<tag attrs>body</tag>`, the body capped per item and by what is left of the budget.
    fn item(&mut self, tag: &str, attrs: &str, body: &str) {
        let room = self.left.min(MAX_ITEM_CHARS);
        let body = cap(body.trim_end(), room);
        self.left = self.left.saturating_sub(body.chars().count());
        let _ = writeln!(self.text, "<{tag}{attrs}>\n{body}\n</{tag}>");
    }

    fn line(&mut self, line: &str) {
        self.left = self.left.saturating_sub(line.chars().count());
        let _ = writeln!(self.text, "{line}");
    }
}

fn attr(name: &str, value: &str) -> String {
    if value.is_empty() {
        return String::new();
    }
    format!(" {name}=\"{}\"", value.replace('"', "'"))
}

/// Text of a blob the client gave us, if it is text.
fn blob_text(blobs: &Blobs, id: &[u8]) -> Option<String> {
    blobs
        .get(id)
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

/// The user's text: inline, else from `text_blob_id`, else the rich text (inline or by blob).
pub fn user_text(msg: &pb::UserMessage, blobs: &Blobs) -> String {
    if !msg.text.is_empty() {
        return msg.text.clone();
    }
    let by_blob = |id: &Option<bytes::Bytes>| id.as_deref().and_then(|i| blob_text(blobs, i));
    by_blob(&msg.text_blob_id)
        .or_else(|| msg.rich_text.clone().filter(|t| !t.is_empty()))
        .or_else(|| by_blob(&msg.rich_text_blob_id))
        .unwrap_or_default()
}

/// The attached context as text (before the user's text), in a fixed order.
pub(crate) fn render(sel: &pb::SelectedContext, blobs: &Blobs) -> String {
    let mut o = Out {
        text: String::new(),
        left: MAX_TURN_CHARS,
    };
    if let Some(inv) = &sel.invocation_context {
        invocation(&mut o, inv, blobs);
    }
    files_and_terminals(&mut o, sel);
    diffs_and_git(&mut o, sel, blobs);
    links_and_docs(&mut o, sel, blobs);
    ui_and_console(&mut o, sel);
    past_chats(&mut o, sel, blobs);
    rules_and_picks(&mut o, sel);
    extra_and_commands(&mut o, sel, blobs);
    if o.left == 0 {
        o.line(&format!(
            "{TRUNCATED} (the attached context exceeded {MAX_TURN_CHARS} characters)"
        ));
    }
    o.text
}

/// Files, code selections, terminals and folders the user attached.
fn files_and_terminals(o: &mut Out, sel: &pb::SelectedContext) {
    for f in &sel.files {
        let path = f.relative_path.as_deref().unwrap_or(&f.path);
        o.item("attached_file", &attr("path", path), &f.content);
    }
    for c in &sel.code_selections {
        let path = c.relative_path.as_deref().unwrap_or(&c.path);
        o.item("selection", &attr("path", path), &c.content);
    }
    for t in &sel.terminals {
        let attrs = attr("title", t.title.as_deref().unwrap_or_default());
        o.item("terminal", &attrs, &t.content);
    }
    for t in &sel.terminal_selections {
        let attrs = attr("title", t.title.as_deref().unwrap_or_default());
        o.item("terminal_selection", &attrs, &t.content);
    }
    for folder in &sel.folders {
        o.line(&format!("<attached_folder path=\"{}\" />", folder.path));
    }
}

/// Browser UI elements and console logs the user picked.
fn ui_and_console(o: &mut Out, sel: &pb::SelectedContext) {
    for ui in &sel.ui_elements {
        let mut body = format!("element: {}\nxpath: {}", ui.element, ui.xpath);
        for (k, v) in [
            ("text", ui.text_content.as_str()),
            ("component", ui.component.as_deref().unwrap_or_default()),
            (
                "props",
                ui.component_props_json.as_deref().unwrap_or_default(),
            ),
            ("extra", ui.extra.as_str()),
        ] {
            if !v.is_empty() {
                let _ = write!(body, "\n{k}: {v}");
            }
        }
        o.item("ui_element", "", &body);
    }
    for log in &sel.console_logs {
        let mut body = log.message.clone();
        if let Some(j) = log.object_data_json.as_deref().filter(|j| !j.is_empty()) {
            let _ = write!(body, "\n{j}");
        }
        let attrs = format!(
            "{}{}",
            attr("level", &log.level),
            attr("source", &log.client_name)
        );
        o.item("console_log", &attrs, &body);
    }
}

/// Past chats: their transcripts when they are on this machine, else their names.
fn past_chats(o: &mut Out, sel: &pb::SelectedContext, blobs: &Blobs) {
    for chat in &sel.past_chats {
        let name = if chat.name.is_empty() {
            "(untitled)"
        } else {
            &chat.name
        };
        match blobs.past_chat(&chat.agent_id) {
            // A chat whose transcript is on this machine: what was said in it.
            Some(text) => {
                let attrs = format!("{}{}", attr("id", &chat.agent_id), attr("name", name));
                o.item("past_chat", &attrs, text);
            }
            None => o.line(&format!(
                "<past_chat id=\"{}\">{name}</past_chat>",
                chat.agent_id
            )),
        }
    }
}

/// Rules and skills the user attached, and the subagents, browser tabs and videos picked.
fn rules_and_picks(o: &mut Out, sel: &pb::SelectedContext) {
    for r in &sel.cursor_rules {
        if let Some(rule) = &r.rule {
            o.item("rule", &attr("path", &rule.full_path), &rules::body(rule));
        }
    }
    for skill in &sel.selected_skills {
        let e = rules::skill_entry(skill);
        let attrs = format!("{}{}", attr("name", &e.name), attr("path", &e.path));
        let body = super::text::strip_frontmatter(&skill.content);
        o.item("skill", &attrs, body);
    }
    for sub in &sel.selected_subagents {
        o.line(&format!(
            "<selected_subagent name=\"{}\">The user wants this subagent used for the task.</selected_subagent>",
            sub.name
        ));
    }
    for b in &sel.selected_browsers {
        let title = b.page_title.as_deref().unwrap_or_default();
        o.line(&format!(
            "<browser_tab url=\"{}\"{} />",
            b.url,
            attr("title", title)
        ));
    }
    for v in &sel.selected_videos {
        let name = if v.filename.is_empty() {
            &v.path
        } else {
            &v.filename
        };
        o.line(&format!(
            "<video{} /> (videos are not passed to the model)",
            attr("name", name)
        ));
    }
}

/// Extra context (inline or by blob) and the slash commands the user ran.
fn extra_and_commands(o: &mut Out, sel: &pb::SelectedContext, blobs: &Blobs) {
    for extra in &sel.extra_context {
        o.item("context", "", extra);
    }
    for entry in &sel.extra_context_entries {
        use pb::extra_context_entry::DataOrBlobId as E;
        match &entry.data_or_blob_id {
            Some(E::Data(d)) => o.item("context", "", d),
            Some(E::BlobId(id)) => match blob_text(blobs, id) {
                Some(d) => o.item("context", "", &d),
                None => o.line(
                    "<context>(attached by reference; the client did not supply it)</context>",
                ),
            },
            None => {}
        }
    }
    for cmd in &sel.cursor_commands {
        let name = cmd.display_name.as_deref().unwrap_or(&cmd.name);
        o.item(
            "command",
            &attr("name", name),
            &format!(
                "The user ran the /{} command. Its instructions are the task for this turn:\n{}",
                cmd.name, cmd.content
            ),
        );
    }
}

fn invocation(o: &mut Out, inv: &pb::InvocationContext, blobs: &Blobs) {
    use pb::invocation_context::Data;
    use prost::Message as _;
    match &inv.data {
        Some(Data::IdeState(ide)) => {
            let files = |fs: &[pb::invocation_context::ide_state::File]| {
                fs.iter()
                    .map(|f| f.relative_path.as_deref().unwrap_or(&f.path).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut body = String::new();
            if !ide.visible_files.is_empty() {
                let _ = writeln!(body, "open files: {}", files(&ide.visible_files));
            }
            if !ide.recently_viewed_files.is_empty() {
                let _ = writeln!(
                    body,
                    "recently viewed: {}",
                    files(&ide.recently_viewed_files)
                );
            }
            for pr in &ide.currently_viewed_prs {
                let _ = writeln!(body, "viewing PR #{} {}", pr.number, pr.url);
            }
            if !body.is_empty() {
                o.item("editor_state", "", &body);
            }
        }
        Some(Data::GithubPr(pr)) => o.item(
            "pull_request",
            &attr("title", &pr.title),
            &format!(
                "{}\n\ncomments:\n{}\n{}",
                pr.description,
                pr.comments,
                pr.ci_failures.as_deref().unwrap_or_default()
            ),
        ),
        Some(Data::SlackThread(t)) => o.item(
            "slack_thread",
            &attr("channel", t.channel_name.as_deref().unwrap_or_default()),
            &t.thread,
        ),
        Some(Data::MicrosoftTeamsThread(t)) => o.item(
            "teams_thread",
            &attr("channel", t.channel_name.as_deref().unwrap_or_default()),
            &t.thread,
        ),
        Some(Data::BlobId(id)) => {
            // The same message, sent by reference; one level only (a reference to a reference
            // is not followed).
            match blobs
                .get(id)
                .map(|b| pb::InvocationContext::decode(b.as_ref()))
            {
                Some(Ok(inner)) if !matches!(inner.data, Some(Data::BlobId(_))) => {
                    invocation(o, &inner, blobs)
                }
                _ => o.line(
                    "<invocation_context>(sent by reference; not available)</invocation_context>",
                ),
            }
        }
        None => {}
    }
}

fn diffs_and_git(o: &mut Out, sel: &pb::SelectedContext, blobs: &Blobs) {
    if let Some(d) = &sel.git_diff {
        o.item("git_diff", &attr("of", "uncommitted changes"), &d.content);
    }
    if let Some(d) = &sel.git_diff_from_branch_to_main {
        o.item(
            "git_diff",
            &attr("of", "this branch against main"),
            &d.content,
        );
    }
    for c in &sel.git_commits {
        let mut body = c.message.clone();
        if let Some(d) = c.description.as_deref().filter(|d| !d.is_empty()) {
            let _ = write!(body, "\n{d}");
        }
        let _ = write!(body, "\n\n{}", c.diff);
        o.item("git_commit", &attr("sha", &c.sha), &body);
    }
    for p in &sel.git_pr_diff_selections {
        let diff = p
            .diff_content
            .clone()
            .or_else(|| p.blob_id.as_deref().and_then(|i| blob_text(blobs, i)))
            .unwrap_or_default();
        let attrs = format!(
            "{}{}{}",
            attr("pr", &p.pr_url),
            attr("path", &p.file_path),
            attr("lines", &format!("{}-{}", p.start_line, p.end_line))
        );
        o.item("pr_diff", &attrs, &diff);
    }
    for pr in &sel.selected_pull_requests {
        let mut body = pr.description.clone().unwrap_or_default();
        for extra in [
            pr.summary_json.clone(),
            pr.blob_id.as_deref().and_then(|i| blob_text(blobs, i)),
        ]
        .into_iter()
        .flatten()
        {
            let _ = write!(body, "\n{extra}");
        }
        let attrs = format!(
            "{}{}{}",
            attr("number", &pr.number.to_string()),
            attr("url", &pr.url),
            attr("title", pr.title.as_deref().unwrap_or_default())
        );
        o.item("pull_request", &attrs, &body);
    }
}

fn links_and_docs(o: &mut Out, sel: &pb::SelectedContext, blobs: &Blobs) {
    for l in &sel.external_links {
        let content = l
            .pdf_content
            .clone()
            .filter(|c| !c.is_empty())
            .or_else(|| l.blob_id.as_deref().and_then(|i| blob_text(blobs, i)));
        let kind = if l.is_pdf == Some(true) {
            "pdf"
        } else {
            "web page"
        };
        let attrs = format!("{}{}", attr("url", &l.url), attr("kind", kind));
        match content {
            Some(c) => o.item("link", &attrs, &c),
            None => o.line(&format!(
                "<link{attrs} /> (fetch it with the web fetch tool if you need its content)"
            )),
        }
    }
    for d in &sel.documentations {
        o.line(&format!(
            "<documentation name=\"{}\" id=\"{}\" /> (indexed docs are not available through this proxy; use web fetch if needed)",
            d.name, d.doc_id
        ));
    }
    for d in &sel.selected_documents {
        use pb::selected_document::DataOrBlobId as D;
        let data = match &d.data_or_blob_id {
            Some(D::Data(b)) => Some(b.clone()),
            Some(D::BlobIdWithData(b)) => Some(b.data.clone()),
            Some(D::BlobId(id)) => blobs.get(id).cloned(),
            Some(D::PromptUploadRef(_)) | None => None,
        };
        let name = if d.filename.is_empty() {
            &d.path
        } else {
            &d.filename
        };
        let attrs = format!("{}{}", attr("name", name), attr("type", &d.mime_type));
        match data.as_deref().and_then(|b| std::str::from_utf8(b).ok()) {
            Some(text) => o.item("document", &attrs, text),
            None => o.line(&format!(
                "<document{attrs} /> ({})",
                if d.path.is_empty() {
                    "binary or not supplied; not readable here".to_string()
                } else {
                    format!("read it at {}", d.path)
                }
            )),
        }
    }
}

/// The media type from the image's first bytes (PNG, JPEG, GIF, WebP), else the label.
pub(crate) fn sniff_image(data: &[u8], label: &str) -> String {
    let kind = if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if data.starts_with(&[0xff, 0xd8, 0xff]) {
        "image/jpeg"
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        "image/gif"
    } else if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        "image/webp"
    } else if label.is_empty() {
        "image/png"
    } else {
        label
    };
    kind.to_string()
}

/// The attached images: as image parts for a vision model, else a short note each.
pub(crate) fn images(
    sel: &pb::SelectedContext,
    blobs: &Blobs,
    vision: bool,
) -> (Vec<UserPart>, String) {
    use pb::selected_image::DataOrBlobId;
    let mut parts = Vec::new();
    let mut notes = String::new();
    for img in &sel.selected_images {
        let data = match &img.data_or_blob_id {
            Some(DataOrBlobId::Data(d)) => Some(d.clone()),
            Some(DataOrBlobId::BlobIdWithData(b)) if !b.data.is_empty() => Some(b.data.clone()),
            Some(DataOrBlobId::BlobIdWithData(b)) => blobs.get(&b.blob_id).cloned(),
            Some(DataOrBlobId::BlobId(id)) => blobs.get(id).cloned(),
            Some(DataOrBlobId::PromptUploadRef(_)) | None => None,
        };
        let name = if img.path.is_empty() {
            "image"
        } else {
            &img.path
        };
        let Some(data) = data.filter(|d| !d.is_empty()) else {
            let _ = writeln!(
                notes,
                "[An image ({name}) was attached but its data was not supplied.]"
            );
            continue;
        };
        let mime_type = sniff_image(&data, &img.mime_type);
        if vision {
            parts.push(UserPart::Image {
                mime_type,
                data: base64::engine::general_purpose::STANDARD.encode(&data),
            });
        } else {
            let _ = writeln!(
                notes,
                "[An image ({name}, {mime_type}, {} bytes) was attached; this model cannot see images.]",
                data.len()
            );
        }
    }
    (parts, notes)
}
