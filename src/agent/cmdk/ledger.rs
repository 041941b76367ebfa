//! The Cmd+K field ledger: every field of the request messages Cmd+K reads, and what becomes
//! of it — used (by which function, how the model sees it) or deliberately not used (why). A
//! test walks the compiled descriptors: a field in neither list fails it.

use crate::agent::context::ledger::Use;
use Use::{By, No};

/// The messages the ledger covers (`aiserver.v1.` names).
pub const MESSAGES: &[&str] = &[
    "StreamCmdKRequest",
    "StreamHypermodeRequest",
    "StreamTerminalCmdKRequest",
    "RerankCmdKContextRequest",
    "RerankTerminalCmdKContextRequest",
    "ReportCmdKFateRequest",
    "CmdKOptions",
    "TerminalCmdKOptions",
    "ModelDetails",
    "CmdKLegacyContext",
    "ExplicitContext",
    "PotentiallyCachedContextItem",
    "ContextItem",
    "ContextItem.CmdKSelection",
    "ContextItem.CmdKImmediateContext",
    "ContextItem.CmdKQuery",
    "ContextItem.CmdKQueryHistory",
    "ContextItem.ChatHistory",
    "ContextItem.TerminalHistory",
    "ContextItem.TerminalCmdKQuery",
    "ContextItem.TerminalCmdKQueryHistory",
    "CmdKPreviousEdit",
    "CmdKUpcomingEdit",
];

const OLD_CONTEXT: &str = "older prompt-bar context the client does not fill (cmdk.md)";
const NO_IMAGES: &str = "images are not sent to the model on Cmd+K";

/// (message, field, use), message by message in schema order.
pub const LEDGER: &[(&str, &str, Use)] = &[
    ("StreamCmdKRequest", "context_items", By("cmdk::cache::resolve then cmdk::prompt: the selection, the file around it, the instruction and the other items")),
    ("StreamCmdKRequest", "cmd_k_options", By("cmdk::decide (the model) and cmdk::reply (chat mode)")),
    ("StreamCmdKRequest", "cmd_k_debug_info", No("debugging data for Cursor's servers (git patch, unsaved files): never sent to the model")),
    ("StreamCmdKRequest", "legacy_context", By("cmdk::prompt: rules and @-mentioned code blocks")),
    ("StreamCmdKRequest", "session_id", By("CmdK::job: the conversation id of the provider's templated headers and fallback stickiness")),
    ("StreamCmdKRequest", "previous_edit", By("cmdk::prompt::dependent_edits: an edit already made")),
    ("StreamCmdKRequest", "previous_edits", By("cmdk::prompt::dependent_edits: edits already made")),
    ("StreamCmdKRequest", "use_big_cmdk_for_multi_file_edit", No("multi-file edits: one edit over the selection is served")),
    ("StreamCmdKRequest", "images", No(NO_IMAGES)),
    ("StreamCmdKRequest", "links", No("@links would need a fetch the proxy does not make")),
    ("StreamCmdKRequest", "upcoming_edits", By("cmdk::prompt::dependent_edits: lines another edit will change")),
    ("StreamCmdKRequest", "diff_history", No("empty in the clients observed")),
    ("StreamCmdKRequest", "diff_to_base_branch", No("unset in the clients observed")),
    ("StreamCmdKRequest", "timing_info", No("Cursor's latency telemetry")),
    ("StreamCmdKRequest", "rules", By("cmdk::prompt::rules: rules to follow")),
    ("StreamHypermodeRequest", "context_items", By("CmdKCall::from_hypermode: as StreamCmdK")),
    ("StreamHypermodeRequest", "cmd_k_options", By("CmdKCall::from_hypermode: as StreamCmdK")),
    ("StreamHypermodeRequest", "cmd_k_debug_info", No("debugging data for Cursor's servers")),
    ("StreamHypermodeRequest", "legacy_context", By("CmdKCall::from_hypermode: as StreamCmdK")),
    ("StreamHypermodeRequest", "session_id", By("CmdKCall::from_hypermode: as StreamCmdK")),
    ("StreamHypermodeRequest", "previous_edit", By("CmdKCall::from_hypermode: as StreamCmdK")),
    ("StreamHypermodeRequest", "previous_edits", By("CmdKCall::from_hypermode: as StreamCmdK")),
    ("StreamHypermodeRequest", "use_big_cmdk_for_multi_file_edit", No("as StreamCmdK")),
    ("StreamHypermodeRequest", "images", No(NO_IMAGES)),
    ("StreamHypermodeRequest", "links", No("as StreamCmdK")),
    ("StreamHypermodeRequest", "upcoming_edits", By("CmdKCall::from_hypermode: as StreamCmdK")),
    ("StreamHypermodeRequest", "diff_history", No("as StreamCmdK")),
    ("StreamHypermodeRequest", "hyper_model", No("Cursor's choice of its own larger model; the configured model serves")),
    ("StreamHypermodeRequest", "timing_info", No("Cursor's latency telemetry")),
    ("StreamTerminalCmdKRequest", "context_items", By("cmdk::cache::resolve then cmdk::prompt: the instruction, terminal history and cwd")),
    ("StreamTerminalCmdKRequest", "cmd_k_options", By("cmdk::decide (the model) and cmdk::reply (chat mode)")),
    ("StreamTerminalCmdKRequest", "legacy_context", By("cmdk::prompt::rules: the explicit context")),
    ("StreamTerminalCmdKRequest", "session_id", By("CmdK::job: the conversation id of the provider's templated headers and fallback stickiness")),
    ("RerankCmdKContextRequest", "context_items", By("transport::cmdk::rerank: kept and acknowledged by hash")),
    ("RerankCmdKContextRequest", "cmd_k_options", By("cmdk::decide: answered here only for a model of ours")),
    ("RerankCmdKContextRequest", "legacy_context", No("ranking needs only the items; the stream sends it again")),
    ("RerankTerminalCmdKContextRequest", "context_items", By("transport::cmdk::rerank: kept and acknowledged by hash")),
    ("RerankTerminalCmdKContextRequest", "cmd_k_options", By("cmdk::decide: answered here only for a model of ours")),
    ("ReportCmdKFateRequest", "request_id", By("transport::cmdk::fate: answered here for a Cmd+K served here")),
    ("ReportCmdKFateRequest", "fate", No("accepted or rejected: nothing here learns from it")),
    ("CmdKOptions", "chat_mode", By("cmdk::reply::Shape: chat text instead of an edit")),
    ("CmdKOptions", "ada_cmd_k_context", No("a Cursor server-side context mode")),
    ("CmdKOptions", "model_details", By("cmdk::decide: the model asked for")),
    ("CmdKOptions", "use_reranker", No("ranking is not done: every item goes to the prompt")),
    ("CmdKOptions", "use_web", No("no web search on Cmd+K")),
    ("CmdKOptions", "request_is_for_caching", By("CmdK::start: items kept and acknowledged, no model call")),
    ("TerminalCmdKOptions", "chat_mode", By("cmdk::reply::Shape: chat text instead of a command")),
    ("TerminalCmdKOptions", "ada_cmd_k_context", No("a Cursor server-side context mode")),
    ("TerminalCmdKOptions", "model_details", By("cmdk::decide: the model asked for")),
    ("TerminalCmdKOptions", "use_web", No("no web search on Cmd+K")),
    ("ModelDetails", "model_name", By("cmdk::decide: ours, Cursor's default or Cursor's")),
    ("ModelDetails", "api_key", No("Cursor's own key setting: never used, only scrubbed from what leaves")),
    ("ModelDetails", "enable_ghost_mode", No("Cursor's privacy mode for its servers; nothing here is sent to Cursor")),
    ("ModelDetails", "azure_state", No("Cursor's own Azure setting: never used, its key only scrubbed")),
    ("ModelDetails", "enable_slow_pool", No("Cursor's request queue")),
    ("ModelDetails", "openai_api_base_url", No("Cursor's own key setting: the configured provider serves")),
    ("ModelDetails", "bedrock_state", No("Cursor's own Bedrock setting: never used, its keys only scrubbed")),
    ("ModelDetails", "max_mode", No("no Max mode: one context size")),
    ("CmdKLegacyContext", "explicit_context", By("cmdk::prompt::rules: the rules text")),
    ("CmdKLegacyContext", "documentation_identifiers", No("@docs would need Cursor's docs index")),
    ("CmdKLegacyContext", "prompt_code_blocks", By("cmdk::prompt::mentioned: @-mentioned code")),
    ("ExplicitContext", "context", By("cmdk::prompt::rules")),
    ("ExplicitContext", "repo_context", By("cmdk::prompt::rules")),
    ("ExplicitContext", "rules", By("cmdk::prompt::rules")),
    ("ExplicitContext", "mode_specific_context", By("cmdk::prompt::rules")),
    ("ExplicitContext", "mcp_instructions", No("no MCP tools on Cmd+K")),
    ("PotentiallyCachedContextItem", "context_item", By("cmdk::cache: kept and acknowledged")),
    ("PotentiallyCachedContextItem", "context_item_hash", By("cmdk::cache: looked up, else asked for again")),
    ("ContextItem", "intent", No("the item's kind says enough")),
    ("ContextItem", "file_chunk", By("cmdk::prompt::other_items")),
    ("ContextItem", "outline_chunk", By("cmdk::prompt::other_items")),
    ("ContextItem", "cmd_k_selection", By("cmdk::prompt: the selected lines and the edit's range")),
    ("ContextItem", "cmd_k_immediate_context", By("cmdk::prompt::editor_focus: the numbered lines around the selection")),
    ("ContextItem", "cmd_k_query", By("cmdk::prompt::query: the instruction")),
    ("ContextItem", "cmd_k_query_history", By("cmdk::prompt::history: earlier turns")),
    ("ContextItem", "custom_instructions", By("cmdk::prompt::rules")),
    ("ContextItem", "go_to_definition_result", No("not filled for Cmd+K by the clients observed")),
    ("ContextItem", "documentation_chunk", By("cmdk::prompt::other_items")),
    ("ContextItem", "lints", By("cmdk::prompt::other_items: lint messages")),
    ("ContextItem", "chat_history", By("cmdk::prompt::history: earlier questions and answers")),
    ("ContextItem", "notebook_cell_output", No(OLD_CONTEXT)),
    ("ContextItem", "terminal_history", By("cmdk::prompt::terminal_focus: cwd and recent output")),
    ("ContextItem", "terminal_cmd_k_query", By("cmdk::prompt::query: the instruction")),
    ("ContextItem", "terminal_cmd_k_query_history", By("cmdk::prompt::history: earlier instructions and commands")),
    ("ContextItem", "sparse_file_chunk", No(OLD_CONTEXT)),
    ("ContextItem", "lsp_subgraph_chunk", No(OLD_CONTEXT)),
    ("ContextItem", "commit_note_chunk", No(OLD_CONTEXT)),
    ("ContextItem", "file_diff_history", No(OLD_CONTEXT)),
    ("ContextItem", "cmd_k_query_history_in_diff_session", No(OLD_CONTEXT)),
    ("ContextItem", "project_rule", By("cmdk::prompt::rules")),
    ("ContextItem.CmdKSelection", "lines", By("cmdk::prompt: the selected lines")),
    ("ContextItem.CmdKSelection", "start_line_number", By("cmdk::prompt::selection_range: the edit's 1-based start")),
    ("ContextItem.CmdKImmediateContext", "relative_workspace_path", By("cmdk::prompt::editor_focus")),
    ("ContextItem.CmdKImmediateContext", "lines", By("cmdk::prompt::editor_focus")),
    ("ContextItem.CmdKImmediateContext", "total_number_of_lines_in_file", No("the numbered lines say where the selection is")),
    ("ContextItem.CmdKImmediateContext", "cell_number", No("notebook cells are edited like files")),
    ("ContextItem.CmdKQuery", "query", By("cmdk::prompt::query")),
    ("ContextItem.CmdKQueryHistory", "query", By("cmdk::prompt::history")),
    ("ContextItem.CmdKQueryHistory", "immediate_context", No("the current immediate context supersedes it")),
    ("ContextItem.CmdKQueryHistory", "selection", No("the current selection supersedes it")),
    ("ContextItem.CmdKQueryHistory", "query_history", By("cmdk::prompt::history: the turn before")),
    ("ContextItem.CmdKQueryHistory", "context_item_hashes", No("the items come with the request")),
    ("ContextItem.CmdKQueryHistory", "timestamp", No("order is the nesting")),
    ("ContextItem.CmdKQueryHistory", "timestamp_double", No("order is the nesting")),
    ("ContextItem.ChatHistory", "user_message", By("cmdk::prompt::history")),
    ("ContextItem.ChatHistory", "assistant_response", By("cmdk::prompt::history")),
    ("ContextItem.ChatHistory", "chat_history", By("cmdk::prompt::history: the turn before")),
    ("ContextItem.ChatHistory", "active_for_cmd_k", No("every chat item sent is used")),
    ("ContextItem.ChatHistory", "timestamp", No("order is the nesting")),
    ("ContextItem.ChatHistory", "timestamp_double", No("order is the nesting")),
    ("ContextItem.TerminalHistory", "history", By("cmdk::prompt::terminal_focus")),
    ("ContextItem.TerminalHistory", "active_for_cmd_k", No("every terminal item sent is used")),
    ("ContextItem.TerminalHistory", "cwd_full", By("cmdk::prompt::terminal_focus")),
    ("ContextItem.TerminalHistory", "cwd_relative_workspace_path", No("cwd_full says it")),
    ("ContextItem.TerminalHistory", "timestamp", No("one terminal per request")),
    ("ContextItem.TerminalHistory", "timestamp_double", No("one terminal per request")),
    ("ContextItem.TerminalCmdKQuery", "query", By("cmdk::prompt::query")),
    ("ContextItem.TerminalCmdKQueryHistory", "query", By("cmdk::prompt::history")),
    ("ContextItem.TerminalCmdKQueryHistory", "query_history", By("cmdk::prompt::history: the turn before")),
    ("ContextItem.TerminalCmdKQueryHistory", "context_item_hashes", No("the items come with the request")),
    ("ContextItem.TerminalCmdKQueryHistory", "suggested_command", By("cmdk::prompt::history")),
    ("CmdKPreviousEdit", "original_lines", By("cmdk::prompt::dependent_edits")),
    ("CmdKPreviousEdit", "new_lines", By("cmdk::prompt::dependent_edits")),
    ("CmdKPreviousEdit", "relative_path", By("cmdk::prompt::dependent_edits")),
    ("CmdKPreviousEdit", "extra_context_above", No("the immediate context covers the lines around")),
    ("CmdKPreviousEdit", "extra_context_below", No("the immediate context covers the lines around")),
    ("CmdKUpcomingEdit", "original_lines", By("cmdk::prompt::dependent_edits")),
    ("CmdKUpcomingEdit", "relative_path", By("cmdk::prompt::dependent_edits")),
    ("CmdKUpcomingEdit", "extra_context_above", No("the immediate context covers the lines around")),
    ("CmdKUpcomingEdit", "extra_context_below", No("the immediate context covers the lines around")),
];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use prost_reflect::DescriptorPool;

    use super::*;

    #[test]
    fn every_cmd_k_field_has_a_decision() {
        let pool = DescriptorPool::decode(crate::proto::DESCRIPTOR_SET).expect("descriptors");
        let listed: HashSet<(&str, &str)> = LEDGER.iter().map(|(m, f, _)| (*m, *f)).collect();
        assert_eq!(listed.len(), LEDGER.len(), "a field is listed twice");
        let mut undecided = Vec::new();
        let mut known = HashSet::new();
        for name in MESSAGES {
            let desc = pool
                .get_message_by_name(&format!("aiserver.v1.{name}"))
                .unwrap_or_else(|| panic!("aiserver.v1.{name} is not in the schema"));
            for field in desc.fields() {
                known.insert((*name, field.name().to_string()));
                if !listed.contains(&(*name, field.name())) {
                    undecided.push(format!("{name}.{}", field.name()));
                }
            }
        }
        assert!(
            undecided.is_empty(),
            "Cmd+K fields with no decision: {undecided:?}"
        );
        let stale: Vec<String> = LEDGER
            .iter()
            .filter(|(m, f, _)| !known.contains(&(*m, f.to_string())))
            .map(|(m, f, _)| format!("{m}.{f}"))
            .collect();
        assert!(stale.is_empty(), "ledger rows for no field: {stale:?}");
        for (m, f, u) in LEDGER {
            let (By(why) | No(why)) = u;
            assert!(!why.trim().is_empty(), "{m}.{f} needs a reason");
        }
    }
}
