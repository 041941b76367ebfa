//! Which configured model a run asks for, and the parameters the picker attached.

use crate::config::{Config, ModelConfig, MODEL_ID_PREFIX};
use crate::proto::agent::v1 as pb;

/// A configured model with the per-run parameters Cursor sent.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    pub config: ModelConfig,
    /// Effort from a `:variant` suffix or an `effort` / `reasoning` parameter.
    pub reasoning_effort: Option<String>,
    /// `thinking=false` in the picker turns extended thinking off.
    pub thinking: bool,
}

/// The model id a run names: `requested_model.model_id`, else `model_details.model_id`.
pub fn requested_model_id(req: &pb::AgentRunRequest) -> Option<&str> {
    model_id_of(req.requested_model.as_ref(), req.model_details.as_ref())
}

/// Same for a prewarm request.
pub(crate) fn prewarm_model_id(req: &pb::PrewarmRequest) -> Option<&str> {
    model_id_of(req.requested_model.as_ref(), req.model_details.as_ref())
}

/// The credential values the client sent with the model (`requested_model.credentials`,
/// `model_details.credentials`: Cursor's own BYOK keys). Never used to call a provider (ours
/// come from the config), only kept out of every text that leaves the process.
pub(crate) fn credential_values(req: &pb::AgentRunRequest) -> Vec<&str> {
    use pb::model_details::Credentials as D;
    use pb::requested_model::Credentials as R;
    let mut out = Vec::new();
    match req
        .requested_model
        .as_ref()
        .and_then(|m| m.credentials.as_ref())
    {
        Some(R::ApiKeyCredentials(k)) => out.push(k.api_key.as_str()),
        Some(R::AzureCredentials(a)) => out.push(a.api_key.as_str()),
        Some(R::BedrockCredentials(b)) => out.extend(bedrock(b)),
        None => {}
    }
    match req
        .model_details
        .as_ref()
        .and_then(|m| m.credentials.as_ref())
    {
        Some(D::ApiKeyCredentials(k)) => out.push(k.api_key.as_str()),
        Some(D::AzureCredentials(a)) => out.push(a.api_key.as_str()),
        Some(D::BedrockCredentials(b)) => out.extend(bedrock(b)),
        None => {}
    }
    out
}

fn bedrock(b: &pb::BedrockCredentials) -> Vec<&str> {
    let mut v = vec![b.access_key.as_str(), b.secret_key.as_str()];
    v.extend(b.session_token.as_deref());
    v
}

fn model_id_of<'a>(
    requested: Option<&'a pb::RequestedModel>,
    details: Option<&'a pb::ModelDetails>,
) -> Option<&'a str> {
    let non_empty = |id: &'a str| (!id.is_empty()).then_some(id);
    requested
        .and_then(|m| non_empty(&m.model_id))
        .or_else(|| details.and_then(|m| non_empty(&m.model_id)))
}

/// Split `byok-x:high` into (`byok-x`, Some(`high`)). The bracket form Cursor also sends,
/// `byok-x[reasoning_effort=high]`, gives its base here; its parameters come from
/// [`bracket_params`].
pub(crate) fn split_variant(model_id: &str) -> (&str, Option<&str>) {
    if let Some((base, _)) = crate::cursor::parse_variant_string(model_id)
        .filter(|(_, p)| !p.is_empty() || model_id.ends_with("[]"))
    {
        return (base, None);
    }
    match model_id.split_once(':') {
        Some((base, variant)) if !variant.is_empty() => (base, Some(variant)),
        Some((base, _)) => (base, None),
        None => (model_id, None),
    }
}

/// Parameters of a `model[k=v,…]` variant string.
fn bracket_params(model_id: &str) -> Vec<(String, String)> {
    crate::cursor::parse_variant_string(model_id)
        .map(|(_, p)| {
            p.into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Is this id one of ours? (Cheap check before a config lookup.)
pub(crate) fn is_ours(config: &Config, model_id: &str) -> bool {
    let (base, _) = split_variant(model_id);
    base.starts_with(MODEL_ID_PREFIX) && config.model_by_cursor_id(base).is_some()
}

/// Does this id carry our prefix (`byok-`), configured or not? Such an id is never Cursor's:
/// a run naming it is ours or refused, never relayed.
pub(crate) fn has_our_prefix(model_id: &str) -> bool {
    let (base, _) = split_variant(model_id.trim());
    base.get(..MODEL_ID_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(MODEL_ID_PREFIX))
}

/// Resolve a run's model against the configuration; `None` when it is not ours.
pub fn resolve(
    config: &Config,
    model_id: &str,
    params: &[pb::requested_model::ModelParameterValue],
) -> Option<ResolvedModel> {
    let (base, variant) = split_variant(model_id);
    let model = config.model_by_cursor_id(base)?.clone();
    let mut effort = model.reasoning_effort.clone();
    let mut thinking = model.thinking_budget.is_some();
    if let Some(v) = variant {
        effort = Some(v.to_string());
    }
    let all = bracket_params(model_id)
        .into_iter()
        .chain(params.iter().map(|p| (p.id.clone(), p.value.clone())));
    for (id, value) in all {
        match id.as_str() {
            "effort" | "reasoning" | "reasoning_effort" if !value.is_empty() => {
                effort = Some(value);
            }
            "thinking" => thinking = value == "true",
            _ => {}
        }
    }
    Some(ResolvedModel {
        config: model,
        reasoning_effort: effort,
        thinking,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_toml(
            "[providers.p]\nkind = \"openai-chat\"\napi_key = \"k\"\n[[models]]\nid = \"m\"\nprovider = \"p\"\nmodel = \"gpt\"\nreasoning_effort = \"low\"\n",
            "t",
        )
        .unwrap()
    }

    #[test]
    fn variants_and_parameters() {
        let c = config();
        assert!(is_ours(&c, "byok-m"));
        assert!(is_ours(&c, "byok-m:high"));
        assert!(!is_ours(&c, "m"));
        assert!(!is_ours(&c, "gpt-5"));
        assert!(!is_ours(&c, "byok-gone"));
        for id in [
            "byok-gone",
            "byok-gone:high",
            "BYOK-m",
            " byok-x[effort=low]",
        ] {
            assert!(has_our_prefix(id), "{id}");
        }
        assert!(!has_our_prefix("gpt-5") && !has_our_prefix("byo"));
        assert_eq!(
            resolve(&c, "byok-m", &[])
                .unwrap()
                .reasoning_effort
                .as_deref(),
            Some("low")
        );
        assert_eq!(
            resolve(&c, "byok-m:high", &[])
                .unwrap()
                .reasoning_effort
                .as_deref(),
            Some("high")
        );
        let b = resolve(&c, "byok-m[reasoning_effort=high,thinking=false]", &[]).unwrap();
        assert_eq!(b.reasoning_effort.as_deref(), Some("high"));
        assert!(is_ours(&c, "byok-m[reasoning_effort=high]"));
        let p = pb::requested_model::ModelParameterValue {
            id: "effort".into(),
            value: "medium".into(),
        };
        assert_eq!(
            resolve(&c, "byok-m", &[p])
                .unwrap()
                .reasoning_effort
                .as_deref(),
            Some("medium")
        );
    }
}
