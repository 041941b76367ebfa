//! Titles and overviews: asked of the user's model (short, bounded prompt, token cap, time
//! limit), or made here from the text's first words when there is no model to ask or it fails.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::base::text::cut_chars;
use crate::provider::{Message, ProviderEvent, ProviderRequest, RequestOptions};

/// Words in a title made here.
const TITLE_WORDS: usize = 6;
/// Characters in any title (ours or the model's).
const MAX_TITLE_CHARS: usize = 80;
/// Characters of an overview.
const MAX_OVERVIEW_CHARS: usize = 2_000;
/// Characters of the user's message sent to name a chat.
const MAX_NAME_INPUT: usize = 4_000;
/// Characters of a transcript sent for an overview: its start and its end.
const OVERVIEW_HEAD: usize = 16_000;
const OVERVIEW_TAIL: usize = 8_000;
const TITLE_TOKENS: u32 = 32;
const OVERVIEW_TOKENS: u32 = 400;
/// A side call waits this long for the model; the first-words answer follows.
pub(super) const MODEL_TIMEOUT: Duration = Duration::from_secs(10);

const TITLE_SYSTEM: &str = "You name chats. Reply with a title of at most six words for a \
     chat that starts with the user's message. Reply with the title only: no quotes, no \
     punctuation at the end.";
const OVERVIEW_SYSTEM: &str = "You summarise chats between a user and a coding assistant. \
     Reply with a short overview (two to four sentences) of what the user asked and what was \
     done. Reply with the overview only.";

/// The text's first words, as a title; never empty.
pub(super) fn first_words(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    let words: Vec<&str> = line.split_whitespace().take(TITLE_WORDS).collect();
    let title = cut_chars(&words.join(" "), MAX_TITLE_CHARS, "…");
    if title.is_empty() {
        "New chat".to_string()
    } else {
        title
    }
}

/// An overview made here: the transcript's first words; never empty.
pub(super) fn local_overview(transcript: &str) -> String {
    format!("Conversation: {}", first_words(transcript))
}

/// A title for a chat starting with `prompt`, from `model_id` when given, else (or when it
/// fails) the prompt's first words.
pub(super) async fn title(agent: &Agent, model_id: Option<&str>, prompt: &str) -> String {
    let asked = match model_id {
        Some(m) => {
            let input = cut_chars(prompt, MAX_NAME_INPUT, "…");
            ask(agent, m, TITLE_SYSTEM, input, TITLE_TOKENS).await
        }
        None => None,
    };
    asked
        .map(|t| tidy_title(&t))
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| first_words(prompt))
}

/// An overview of `transcript`, from `model_id` when given, else made here.
pub(super) async fn overview(agent: &Agent, model_id: Option<&str>, transcript: &str) -> String {
    let asked = match model_id {
        Some(m) => {
            ask(
                agent,
                m,
                OVERVIEW_SYSTEM,
                head_and_tail(transcript),
                OVERVIEW_TOKENS,
            )
            .await
        }
        None => None,
    };
    asked
        .map(|o| cut_chars(o.trim(), MAX_OVERVIEW_CHARS, "…"))
        .filter(|o| !o.is_empty())
        .unwrap_or_else(|| local_overview(transcript))
}

/// The model's first line, unquoted, cut to a title's length.
fn tidy_title(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    let line = line.trim_matches(|c| matches!(c, '"' | '\'' | '`' | '*' | '#'));
    cut_chars(line.trim(), MAX_TITLE_CHARS, "…")
}

fn head_and_tail(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= OVERVIEW_HEAD + OVERVIEW_TAIL {
        return text.to_string();
    }
    let head: String = text.chars().take(OVERVIEW_HEAD).collect();
    let tail: String = text.chars().skip(chars - OVERVIEW_TAIL).collect();
    format!("{head}\n[…]\n{tail}")
}

/// One short answer from `model_id`: its text, or `None` on any failure or after
/// [`MODEL_TIMEOUT`]. Dropping the future cancels the provider call.
async fn ask(
    agent: &Agent,
    model_id: &str,
    system: &str,
    input: String,
    max_tokens: u32,
) -> Option<String> {
    let (client, model) = agent.provider_of(model_id)?;
    let req = ProviderRequest {
        model,
        system: system.to_string(),
        messages: vec![Message::user_text(input)],
        options: RequestOptions {
            max_output_tokens: Some(max_tokens),
            ..RequestOptions::default()
        },
        ..ProviderRequest::default()
    };
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let mut stream = client.stream_once(req, cancel);
    let read = async {
        let mut text = String::new();
        while let Some(event) = stream.recv().await {
            match event {
                ProviderEvent::TextDelta(d) => text.push_str(&d),
                ProviderEvent::Error(e) => {
                    tracing::info!(model_id, "side call: the model failed ({e}); answered here");
                    return None;
                }
                _ => {}
            }
        }
        Some(text)
    };
    match tokio::time::timeout(MODEL_TIMEOUT, read).await {
        Ok(text) => text,
        Err(_) => {
            tracing::info!(
                model_id,
                "side call: the model did not answer in time; answered here"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_words_are_a_short_non_empty_title() {
        assert_eq!(
            first_words("\n  Refactor the parser so that it streams input lines\nmore"),
            "Refactor the parser so that it"
        );
        assert_eq!(first_words("   \n "), "New chat");
        assert!(first_words(&"x".repeat(500)).chars().count() <= MAX_TITLE_CHARS + 1);
        assert!(!local_overview("").is_empty());
    }

    #[test]
    fn model_titles_are_tidied() {
        assert_eq!(
            tidy_title("\n\"Parser streaming\"\nextra"),
            "Parser streaming"
        );
        assert_eq!(tidy_title("   "), "");
    }

    #[test]
    fn long_transcripts_keep_their_head_and_tail() {
        let t = format!(
            "{}{}",
            "a".repeat(OVERVIEW_HEAD),
            "b".repeat(OVERVIEW_TAIL * 2)
        );
        let cut = head_and_tail(&t);
        assert!(cut.starts_with('a') && cut.ends_with('b'));
        assert!(cut.chars().count() < OVERVIEW_HEAD + OVERVIEW_TAIL + 10);
    }
}
