//! The conversation so far: rebuilt from the checkpoint's turn blobs (the local cache first,
//! then the client), and compacted with a summary by the model when it would not fit the
//! model's context window.

use tracing::{debug, warn};

use super::client::Client;
use super::error::RunError;
use super::model_calls::{provider_error, ModelCalls};
use super::setup::Run;
use crate::agent::messages as msg;
use crate::agent::state::{self, HistoryBuilder, HistoryOptions, RebuiltHistory};
use crate::agent::{context, tools};
use crate::proto::agent::v1 as pb;
use crate::provider::{Message, ProviderRequest};

/// The transcript handed to the model for a summary is cut to this many characters.
const SUMMARY_MAX_CHARS: usize = 400_000;

/// The conversation so far, from the checkpoint's turn blobs: the local cache first, the
/// client for the rest.
pub(super) async fn rebuild_history(
    run: &Run,
    client: &mut Client,
    prev: &pb::ConversationStateStructure,
) -> Result<RebuiltHistory, RunError> {
    let opts = HistoryOptions {
        max_bytes: run.settings.max_history_bytes,
        images_allowed: run.model.config.supports_images,
    };
    let mut builder = HistoryBuilder::new(prev, opts);
    loop {
        let missing = builder.missing();
        if missing.is_empty() {
            break;
        }
        let mut ask = Vec::new();
        for (id, data) in run.cache.get_many(missing).await {
            let supplied = data.is_some_and(|d| builder.supply(id, d).is_ok());
            if !supplied {
                ask.push(id);
            }
        }
        if ask.is_empty() {
            continue;
        }
        debug!(
            blobs = ask.len(),
            "asking the client for conversation blobs"
        );
        let mut fresh = Vec::new();
        for (id, data) in client.fetch_blobs(&ask).await? {
            match data {
                Some(d) if builder.supply(id, d.clone()).is_ok() => {
                    fresh.push(state::Blob { id, data: d })
                }
                _ => builder.mark_unavailable(id),
            }
        }
        run.cache.put_many(fresh).await;
    }
    builder
        .finish(&tools::history_from_tool_call)
        .map_err(|e| RunError::Internal(format!("cannot rebuild the conversation: {e}")))
}

/// When the history would not fit the model's context window, summarise the older part
/// with the model itself. Returns the summary and the last turn it covers.
pub(super) async fn compact_if_needed(
    run: &Run,
    client: &mut Client,
    model: &mut ModelCalls,
    messages: &mut Vec<Message>,
    history: &RebuiltHistory,
) -> Result<Option<(String, state::BlobId)>, RunError> {
    let cfg = &run.model.config;
    // Room for the system prompt, tool definitions and the answer.
    let reserve = cfg.max_output_tokens.saturating_add(8_000);
    let Some(plan) = state::plan_compaction(messages, cfg.context_window, reserve) else {
        return Ok(None);
    };
    let Some(through) = history.turn_through(plan.split) else {
        return Ok(None);
    };
    let text = summarize(run, client, model, &plan.older).await?;
    let mut compacted = vec![state::summary_message(&text)];
    compacted.extend(plan.keep);
    *messages = compacted;
    Ok(Some((text, through)))
}

/// Summarise `older` with the model, telling Cursor as it goes.
pub(super) async fn summarize(
    run: &Run,
    client: &mut Client,
    model: &mut ModelCalls,
    older: &[Message],
) -> Result<String, RunError> {
    let out = &client.out;
    out.send(msg::summary_started()).await?;
    let request = summary_request(&run.model.config, older);
    let opened = model.open(&run.chain, request).await?;
    let price = run.chain.targets[opened.target].price;
    let mut builder = crate::provider::TurnBuilder::new();
    builder.push(&opened.first);
    let mut stream = opened.stream;
    if !opened.first.is_terminal() {
        while let Some(e) = stream.recv().await {
            builder.push(&e);
        }
    }
    let turn = builder.finish();
    if let Some(u) = &turn.usage {
        model.record_call(u, price);
    }
    if let Some(e) = turn.error {
        warn!("summary failed: {e}");
        out.send(msg::summary_completed(true)).await?;
        return Err(provider_error(&run.model, e));
    }
    let text = turn.text();
    out.send(msg::summary(text.clone())).await?;
    out.send(msg::summary_completed(false)).await?;
    // The stored summary also names the files touched so far (their globbed rules stay).
    Ok(text + &context::touched_note(older))
}

/// The model call that summarises `older`: no tools, a short answer.
fn summary_request(cfg: &crate::config::ModelConfig, older: &[Message]) -> ProviderRequest {
    ProviderRequest {
        model: cfg.model.clone(),
        system: "You summarise coding-agent conversations so the work can continue. Keep file paths, decisions, open tasks, errors and the user's requests; be concise.".into(),
        messages: state::summary_prompt(older, SUMMARY_MAX_CHARS),
        tools: Vec::new(),
        options: crate::provider::RequestOptions {
            max_output_tokens: Some(4_000.min(cfg.max_output_tokens)),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_asked_for_without_tools_and_with_a_short_answer() {
        let cfg: crate::config::ModelConfig = toml::from_str(
            "id = \"m\"\nprovider = \"p\"\nmodel = \"real-model\"\nmax_output_tokens = 1000\n",
        )
        .expect("a model config");
        let older = [Message::user_text("please refactor src/lib.rs")];
        let request = summary_request(&cfg, &older);
        assert_eq!(request.model, "real-model");
        assert!(request.tools.is_empty());
        assert_eq!(request.options.max_output_tokens, Some(1000));
        let big: crate::config::ModelConfig = toml::from_str(
            "id = \"m\"\nprovider = \"p\"\nmodel = \"real-model\"\nmax_output_tokens = 64000\n",
        )
        .expect("a model config");
        assert_eq!(
            summary_request(&big, &older).options.max_output_tokens,
            Some(4_000)
        );
        assert!(!request.messages.is_empty());
    }
}
