//! Everything Cursor sends about the user's intent and workspace, turned into what the model
//! is told with Cursor's meaning. Pure: the run fetches the blobs this module asks
//! for ([`wanted_blobs`]) and hands them back ([`Blobs`]); nothing here does IO.
//!
//! - [`rules`]: rules by type, skills listed by name and description;
//! - [`selected`]: each kind of `SelectedContext`, tagged, capped;
//! - [`merge_parts`]: `request_context_parts` (rules, skills, subagents, MCP definitions sent
//!   by blob reference) merged into the request context as if they had come inline;
//! - [`ledger`]: every field of the messages that carry intent, used or deliberately not.

mod glob;
pub mod ledger;
pub mod rules;
pub mod selected;
mod text;

use std::collections::HashMap;

use bytes::Bytes;
use prost::Message as _;
use tracing::warn;

use crate::agent::blob_id::{self, BlobId};
use crate::proto::agent::v1 as pb;
use crate::provider::{AssistantPart, Message, UserPart};

pub use text::{cap, TRUNCATED};

/// Blobs fetched for the turn's context, by id (verified against their SHA-256 by whoever put
/// them here), and the transcripts of past chats the user attached, by agent id.
#[derive(Debug, Default, Clone)]
pub struct Blobs(HashMap<BlobId, Bytes>, HashMap<String, String>);

impl Blobs {
    pub fn get(&self, id: &[u8]) -> Option<&Bytes> {
        blob_id::id_from_bytes(id).and_then(|id| self.0.get(&id))
    }

    pub fn insert(&mut self, id: BlobId, data: Bytes) {
        self.0.insert(id, data);
    }

    /// `run_request.pre_fetched_blobs` whose bytes hash to their id.
    pub(crate) fn pre_fetched(req: &pb::AgentRunRequest) -> Blobs {
        let mut b = Blobs::default();
        for p in &req.pre_fetched_blobs {
            match blob_id::id_from_bytes(&p.id) {
                Some(id) if blob_id::verify(&id, &p.value) => b.insert(id, p.value.clone()),
                _ => warn!("a pre-fetched blob does not match its id; ignoring it"),
            }
        }
        b
    }

    pub fn has(&self, id: &BlobId) -> bool {
        self.0.contains_key(id)
    }

    /// What a past chat (by its agent id) said, read from its transcript.
    pub(crate) fn insert_past_chat(&mut self, agent_id: String, text: String) {
        self.1.insert(agent_id, text);
    }

    pub fn past_chat(&self, agent_id: &str) -> Option<&str> {
        self.1.get(agent_id).map(String::as_str)
    }
}

/// `ConversationAction.request_context_parts` of the run request.
pub fn parts(req: &pb::AgentRunRequest) -> Option<&pb::RequestContextPartReferences> {
    req.action.as_ref()?.request_context_parts.as_ref()
}

/// The blobs the turn's context refers to: the request context parts and whatever the user's
/// message gives by blob id.
pub(crate) fn wanted_blobs(
    parts: Option<&pb::RequestContextPartReferences>,
    user: Option<&pb::UserMessage>,
) -> Vec<BlobId> {
    let mut ids: Vec<&[u8]> = Vec::new();
    if let Some(p) = parts {
        ids.extend([
            &p.rules_blob_id[..],
            &p.skills_blob_id[..],
            &p.subagents_blob_id[..],
            &p.mcps_blob_id[..],
        ]);
    }
    if let Some(u) = user {
        if u.text.is_empty() {
            ids.extend(u.text_blob_id.as_deref());
            if u.rich_text.as_deref().unwrap_or_default().is_empty() {
                ids.extend(u.rich_text_blob_id.as_deref());
            }
        }
        if let Some(sel) = &u.selected_context {
            selected_blob_ids(sel, &mut ids);
        }
    }
    let mut out: Vec<BlobId> = Vec::new();
    for id in ids.into_iter().filter(|i| !i.is_empty()) {
        match blob_id::id_from_bytes(id) {
            Some(id) if !out.contains(&id) => out.push(id),
            Some(_) => {}
            None => warn!("a context blob id is not 32 bytes; leaving it out"),
        }
    }
    out
}

fn selected_blob_ids<'a>(sel: &'a pb::SelectedContext, ids: &mut Vec<&'a [u8]>) {
    use pb::extra_context_entry::DataOrBlobId as E;
    use pb::invocation_context::Data as V;
    use pb::selected_document::DataOrBlobId as D;
    use pb::selected_image::DataOrBlobId as I;
    if let Some(V::BlobId(id)) = sel
        .invocation_context
        .as_ref()
        .and_then(|i| i.data.as_ref())
    {
        ids.push(id);
    }
    for img in &sel.selected_images {
        match &img.data_or_blob_id {
            Some(I::BlobId(id)) => ids.push(id),
            Some(I::BlobIdWithData(b)) if b.data.is_empty() => ids.push(&b.blob_id),
            _ => {}
        }
    }
    for e in &sel.extra_context_entries {
        if let Some(E::BlobId(id)) = &e.data_or_blob_id {
            ids.push(id);
        }
    }
    for d in &sel.selected_documents {
        if let Some(D::BlobId(id)) = &d.data_or_blob_id {
            ids.push(id);
        }
    }
    for l in &sel.external_links {
        if l.pdf_content.as_deref().unwrap_or_default().is_empty() {
            ids.extend(l.blob_id.as_deref());
        }
    }
    for p in &sel.git_pr_diff_selections {
        if p.diff_content.is_none() {
            ids.extend(p.blob_id.as_deref());
        }
    }
    for pr in &sel.selected_pull_requests {
        ids.extend(pr.blob_id.as_deref());
    }
}

/// The request context with `request_context_parts` merged in: `dynamic_context` merged over
/// it field by field (protobuf merge), then the rules, skills, subagents and MCP parts fetched
/// by blob id appended, each rule, skill and subagent path once.
pub(crate) fn merge_parts(
    ctx: Option<pb::RequestContext>,
    parts: Option<&pb::RequestContextPartReferences>,
    blobs: &Blobs,
) -> Option<pb::RequestContext> {
    let Some(p) = parts else { return ctx };
    let mut ctx = ctx.unwrap_or_default();
    if let Some(d) = &p.dynamic_context {
        if let Err(e) = ctx.merge(d.encode_to_vec().as_slice()) {
            warn!("request context parts: cannot merge the dynamic context: {e}");
        }
    }
    if let Some(r) = part::<pb::RequestContextRulesPart>(blobs, &p.rules_blob_id, "rules") {
        ctx.rules.extend(r.rules);
        ctx.non_file_rules.extend(r.non_file_rules);
        if ctx.cloud_rule.is_none() {
            ctx.cloud_rule = r.cloud_rule;
        }
    }
    if let Some(s) = part::<pb::RequestContextSkillsPart>(blobs, &p.skills_blob_id, "skills") {
        ctx.agent_skills.extend(s.agent_skills);
        if ctx.skill_options.is_none() {
            ctx.skill_options = s.skill_options;
        }
    }
    if let Some(s) =
        part::<pb::RequestContextSubagentsPart>(blobs, &p.subagents_blob_id, "subagents")
    {
        ctx.custom_subagents.extend(s.custom_subagents);
    }
    if let Some(m) = part::<pb::RequestContextMcpsPart>(blobs, &p.mcps_blob_id, "MCP") {
        ctx.tools.extend(m.tools);
        ctx.mcp_instructions.extend(m.mcp_instructions);
        if ctx.mcp_file_system_options.is_none() {
            ctx.mcp_file_system_options = m.mcp_file_system_options;
        }
        if ctx.mcp_meta_tool_options.is_none() {
            ctx.mcp_meta_tool_options = m.mcp_meta_tool_options;
        }
    }
    dedup_by(&mut ctx.rules, |r| (r.full_path.clone(), r.content.clone()));
    dedup_by(&mut ctx.non_file_rules, |r| {
        (r.full_path.clone(), r.content.clone())
    });
    dedup_by(&mut ctx.agent_skills, |s| {
        (s.full_path.clone(), String::new())
    });
    dedup_by(&mut ctx.custom_subagents, |s| {
        (s.full_path.clone(), s.name.clone())
    });
    Some(ctx)
}

fn part<M: prost::Message + Default>(blobs: &Blobs, id: &[u8], what: &str) -> Option<M> {
    if id.is_empty() {
        return None;
    }
    let Some(data) = blobs.get(id) else {
        warn!(
            "request context parts: the client did not supply the {what} part; going on without it"
        );
        return None;
    };
    M::decode(data.as_ref())
        .map_err(|e| warn!("request context parts: the {what} part does not decode: {e}"))
        .ok()
}

fn dedup_by<T>(v: &mut Vec<T>, key: impl Fn(&T) -> (String, String)) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(key(x)));
}

/// Tools whose `path` argument names a file the model read or changed.
const FILE_TOOLS: [&str; 9] = [
    "read_file",
    "read",
    "search_replace",
    "edit",
    "edit_file",
    "write",
    "write_file",
    "delete_file",
    "delete",
];

/// The files in play in the conversation so far: attached to a user message or read, edited,
/// written by a tool; workspace-relative when under `root`. They select the file-globbed rules,
/// which then stay for the rest of the conversation (the history carries these paths).
/// Files named in a summary's note, at most: the newest are kept.
const TOUCHED_NOTE_MAX: usize = 200;

/// A note a conversation summary keeps: the files the summarised part touched, so the
/// file-globbed rules they brought in stay for the rest of the conversation (found again by
/// [`touched_paths`] in the summary message).
pub(crate) fn touched_note(older: &[Message]) -> String {
    // In order of last touch: a file touched again counts as recent, so the cap keeps it.
    let mut paths: Vec<String> = Vec::new();
    scan_touched(older, &mut |p| {
        if p.is_empty() {
            return;
        }
        if let Some(i) = paths.iter().position(|q| q == p) {
            paths.remove(i);
        }
        paths.push(p.to_string());
    });
    if paths.is_empty() {
        return String::new();
    }
    let mut note = String::from("\n\nFiles touched before this summary:");
    for p in &paths[paths.len().saturating_sub(TOUCHED_NOTE_MAX)..] {
        note.push_str(&format!("\n<touched_file path=\"{p}\"/>"));
    }
    note
}

pub(crate) fn touched_paths(messages: &[Message], root: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    scan_touched(messages, &mut |p| {
        let rel = relative(p, root);
        if !rel.is_empty() && !out.contains(&rel) {
            out.push(rel);
        }
    });
    out
}

/// Every path `messages` attach or hand to a file tool, as written.
fn scan_touched(messages: &[Message], add: &mut impl FnMut(&str)) {
    for m in messages {
        match m {
            Message::User { parts } => {
                for p in parts {
                    if let UserPart::Text { text } = p {
                        // Our own rendering of attached files (see `selected::render`), and
                        // the files a summary says were touched before it (`touched_note`).
                        for marker in ["<attached_file path=\"", "<touched_file path=\""] {
                            for chunk in text.split(marker).skip(1) {
                                if let Some((path, _)) = chunk.split_once('"') {
                                    add(path);
                                }
                            }
                        }
                    }
                }
            }
            Message::Assistant { parts } => {
                for p in parts {
                    if let AssistantPart::ToolCall {
                        name, arguments, ..
                    } = p
                    {
                        if FILE_TOOLS.contains(&name.to_ascii_lowercase().as_str()) {
                            for key in ["path", "file_path", "target_file"] {
                                if let Some(path) = arguments.get(key).and_then(|v| v.as_str()) {
                                    add(path);
                                }
                            }
                        }
                    }
                }
            }
            Message::ToolResult { .. } => {}
        }
    }
}

fn relative(path: &str, root: Option<&str>) -> String {
    let path = path.replace('\\', "/");
    let rel = root
        .map(|r| r.replace('\\', "/"))
        .and_then(|r| {
            path.strip_prefix(r.trim_end_matches('/'))
                .map(str::to_string)
        })
        .unwrap_or_else(|| path.clone());
    rel.trim_start_matches('/').to_string()
}

#[cfg(test)]
mod tests;
