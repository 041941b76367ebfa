//! Whose model a Cmd+K runs on: the model it names, or for Cursor's `"default"` the one
//! `[cmd_k] model` configures. A name that claims to be ours but is not configured is refused,
//! never relayed.

use crate::config::{Config, MODEL_ID_PREFIX};
use crate::connect::{Code, ConnectError, ErrorDetail};
use crate::proto::aiserver::v1 as aiserver;

/// The name the desktop sends unless the user picked a Cmd+K model.
pub const DEFAULT_MODEL: &str = "default";

/// Where a Cmd+K goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whose {
    /// Served here on this configured model (as Cursor names it: `byok-…`).
    Ours { model_id: String },
    /// Cursor's model: passed upstream unchanged.
    Cursor,
}

/// The decision for a request naming `model_name` (`None`: no `model_details` at all, which
/// is Cursor's default too).
pub fn whose(config: &Config, model_name: Option<&str>) -> Result<Whose, ConnectError> {
    let name = model_name.unwrap_or_default();
    if name.is_empty() || name == DEFAULT_MODEL {
        return Ok(match config.cmd_k_model() {
            Some(m) => Whose::Ours {
                model_id: m.cursor_id(),
            },
            None => Whose::Cursor,
        });
    }
    if crate::agent::model::is_ours(config, name) {
        return Ok(Whose::Ours {
            model_id: name.to_string(),
        });
    }
    if name.starts_with(MODEL_ID_PREFIX) {
        return Err(refused(&format!(
            "this Cmd+K asks for `{name}`, which looks like a cursor-byok model but is not in \
             this proxy's configuration"
        )));
    }
    Ok(Whose::Cursor)
}

/// Could a request this proxy cannot read be on the user's model? Only when the user has one.
pub fn could_be_ours(config: &Config) -> bool {
    !config.models.is_empty()
}

/// The error for a Cmd+K that goes nowhere: `why` it cannot be sent to Cursor nor served.
pub fn refused(why: &str) -> ConnectError {
    let message = format!(
        "cursor-byok: {why}, so it was sent neither to your provider nor to Cursor. Pick the \
         model again in the Cmd+K model picker, or check `[cmd_k]` in the cursor-byok config."
    );
    let details = aiserver::ErrorDetails {
        error: aiserver::error_details::Error::CustomMessage as i32,
        details: Some(aiserver::CustomErrorDetails {
            title: "cursor-byok did not send this Cmd+K".to_string(),
            detail: message.clone(),
            is_retryable: Some(false),
            ..Default::default()
        }),
        is_expected: Some(true),
    };
    ConnectError::new(Code::FailedPrecondition, message)
        .with_detail(ErrorDetail::error_details(&details))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(cmd_k: &str) -> Config {
        Config::from_toml(
            &format!(
                "{cmd_k}\n[providers.p]\nkind = \"openai-chat\"\napi_key = \"k\"\n\
                 [[models]]\nid = \"m\"\nprovider = \"p\"\nmodel = \"gpt\"\n"
            ),
            "t",
        )
        .unwrap()
    }

    #[test]
    fn named_default_unknown_and_cursor_models() {
        let plain = config("");
        let served = config("[cmd_k]\nmodel = \"m\"");
        let ours = Whose::Ours {
            model_id: "byok-m".into(),
        };
        assert_eq!(whose(&plain, Some("byok-m")).unwrap(), ours);
        assert_eq!(whose(&plain, Some("default")).unwrap(), Whose::Cursor);
        assert_eq!(whose(&plain, None).unwrap(), Whose::Cursor);
        assert_eq!(whose(&served, Some("default")).unwrap(), ours);
        assert_eq!(whose(&served, Some("")).unwrap(), ours);
        assert_eq!(whose(&served, Some("gpt-4o")).unwrap(), Whose::Cursor);
        let e = whose(&plain, Some("byok-gone")).unwrap_err();
        assert_eq!(e.code, Code::FailedPrecondition);
        assert!(e.message.contains("byok-gone"), "{}", e.message);
    }

    #[test]
    fn cmd_k_model_must_be_configured() {
        let e = Config::from_toml(
            "[cmd_k]\nmodel = \"nope\"\n[providers.p]\nkind = \"openai-chat\"\napi_key = \"k\"\n",
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().contains("cmd_k.model"), "{e}");
        assert!(config("[cmd_k]\nmodel = \"byok-m\"")
            .cmd_k_model()
            .is_some());
    }
}
