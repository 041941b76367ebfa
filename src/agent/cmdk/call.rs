//! One Cmd+K call as decoded: the editor's (`StreamCmdK`, `StreamHypermode`) or the terminal's
//! (`StreamTerminalCmdK`), with what the rest of Cmd+K asks of either.

use crate::proto::aiserver::v1 as pb;

/// Where the Cmd+K was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The inline edit in the editor.
    Editor,
    /// The prompt bar in the terminal.
    Terminal,
}

/// A decoded Cmd+K stream request.
#[derive(Debug, Clone)]
pub enum CmdKCall {
    Editor(Box<pb::StreamCmdKRequest>),
    Terminal(Box<pb::StreamTerminalCmdKRequest>),
}

impl CmdKCall {
    /// `StreamHypermode` is `StreamCmdK` with a `hyper_model` the server may pick; the model
    /// that serves it here is the one `cmd_k_options` names, so it is served as `StreamCmdK`.
    pub(crate) fn from_hypermode(h: pb::StreamHypermodeRequest) -> CmdKCall {
        CmdKCall::Editor(Box::new(pb::StreamCmdKRequest {
            context_items: h.context_items,
            cmd_k_options: h.cmd_k_options,
            cmd_k_debug_info: h.cmd_k_debug_info,
            legacy_context: h.legacy_context,
            session_id: h.session_id,
            previous_edit: h.previous_edit,
            previous_edits: h.previous_edits,
            use_big_cmdk_for_multi_file_edit: h.use_big_cmdk_for_multi_file_edit,
            images: h.images,
            links: h.links,
            upcoming_edits: h.upcoming_edits,
            diff_history: h.diff_history,
            timing_info: h.timing_info,
            ..Default::default()
        }))
    }

    pub fn surface(&self) -> Surface {
        match self {
            CmdKCall::Editor(_) => Surface::Editor,
            CmdKCall::Terminal(_) => Surface::Terminal,
        }
    }

    /// `cmd_k_options.model_details.model_name`, as sent (`None` when absent).
    pub fn model_name(&self) -> Option<&str> {
        let details = match self {
            CmdKCall::Editor(r) => r.cmd_k_options.as_ref()?.model_details.as_ref(),
            CmdKCall::Terminal(r) => r.cmd_k_options.as_ref()?.model_details.as_ref(),
        };
        details?.model_name.as_deref()
    }

    /// Chat mode: a question answered in text, no edit and no command.
    pub fn chat_mode(&self) -> bool {
        match self {
            CmdKCall::Editor(r) => r.cmd_k_options.as_ref().is_some_and(|o| o.chat_mode),
            CmdKCall::Terminal(r) => r.cmd_k_options.as_ref().is_some_and(|o| o.chat_mode),
        }
    }

    /// A request that only warms the server's cache of context items.
    pub(crate) fn for_caching(&self) -> bool {
        match self {
            CmdKCall::Editor(r) => r
                .cmd_k_options
                .as_ref()
                .is_some_and(|o| o.request_is_for_caching == Some(true)),
            CmdKCall::Terminal(_) => false,
        }
    }

    /// The prompt bar's id: a Cmd+K's conversation, for the provider's templated headers.
    pub fn session_id(&self) -> &str {
        match self {
            CmdKCall::Editor(r) => &r.session_id,
            CmdKCall::Terminal(r) => &r.session_id,
        }
    }

    pub fn context_items(&self) -> &[pb::PotentiallyCachedContextItem] {
        match self {
            CmdKCall::Editor(r) => &r.context_items,
            CmdKCall::Terminal(r) => &r.context_items,
        }
    }

    pub fn legacy_context(&self) -> Option<&pb::CmdKLegacyContext> {
        match self {
            CmdKCall::Editor(r) => r.legacy_context.as_ref(),
            CmdKCall::Terminal(r) => r.legacy_context.as_ref(),
        }
    }

    /// The credentials Cursor's own "use my key" setting may put in `model_details`: never
    /// used, only kept out of every text that leaves the process.
    pub(crate) fn credential_values(&self) -> Vec<String> {
        let details = match self {
            CmdKCall::Editor(r) => r
                .cmd_k_options
                .as_ref()
                .and_then(|o| o.model_details.as_ref()),
            CmdKCall::Terminal(r) => r
                .cmd_k_options
                .as_ref()
                .and_then(|o| o.model_details.as_ref()),
        };
        let Some(d) = details else {
            return Vec::new();
        };
        let mut out: Vec<String> = d.api_key.iter().cloned().collect();
        if let Some(a) = &d.azure_state {
            out.push(a.api_key.clone());
        }
        if let Some(b) = &d.bedrock_state {
            out.push(b.access_key.clone());
            out.push(b.secret_key.clone());
        }
        out.retain(|s| !s.is_empty());
        out
    }
}
