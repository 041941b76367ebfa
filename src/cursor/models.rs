//! The configured models, as Cursor's model-list answers express them, and the merges into
//! upstream's answers.
//!
//! Merges only ever append (protobuf repeated fields merge by concatenation): upstream's entries
//! stay exactly as they came. Only models whose provider has a key are listed
//! ([`Config::usable_models`]): a model that cannot run would only fail later, in the middle of a
//! conversation.

use crate::config::{Config, ModelConfig};
use crate::proto::agent::v1 as ag;
use crate::proto::aiserver::v1 as ai;

use ag::requested_model::ModelParameterValue;
use ai::available_models_response::{
    AvailableModel, FeatureModelConfig, ModelVariantConfig, ModelVendor, ModelVendorId,
};
use ai::model_parameter_definition::{
    boolean_parameter_definition::BooleanParameterValue,
    enum_parameter_definition::EnumParameterValue, BooleanParameterDefinition,
    EnumParameterDefinition, ModelParameterType,
};
use ai::ModelParameterDefinition;

/// Picker parameter carrying the reasoning effort (the id Cursor's own Gemini entries use; the
/// agent also accepts `effort` and `reasoning`).
pub const EFFORT_PARAM: &str = "reasoning_effort";
/// Picker parameter switching extended thinking on and off (`"true"` / `"false"`).
pub const THINKING_PARAM: &str = "thinking";

/// Effort levels offered in the picker besides the configured one, in display order.
const OFFERED_EFFORTS: &[&str] = &["low", "medium", "high"];
/// Every level the configuration accepts, in order (the picker lists them in this order).
const EFFORT_ORDER: &[&str] = &["minimal", "low", "medium", "high", "xhigh"];

/// `upstream` with one entry per usable configured model appended (and our ids appended to
/// `model_names` when upstream fills it). An id already present is not added twice (a second
/// proxy in the chain may have merged it already).
pub fn merge_available_models(
    mut upstream: ai::AvailableModelsResponse,
    config: &Config,
) -> ai::AvailableModelsResponse {
    let ours = available_models_additions(&upstream, config);
    upstream.model_names.extend(ours.model_names);
    upstream.models.extend(ours.models);
    if let Some(cmd_k) = ours.cmd_k_model_config {
        upstream
            .cmd_k_model_config
            .get_or_insert_with(Default::default)
            .default_model = cmd_k.default_model;
    }
    upstream
}

/// What [`merge_available_models`] appends, alone: only repeated fields, so its encoding
/// appended to upstream's bytes is the merge (protobuf concatenates repeated fields), and
/// upstream's bytes stay exactly as they came, fields this build does not know included.
pub fn available_models_additions(
    upstream: &ai::AvailableModelsResponse,
    config: &Config,
) -> ai::AvailableModelsResponse {
    let models: Vec<AvailableModel> = config
        .usable_models()
        .filter(|m| {
            let id = m.cursor_id();
            !upstream.models.iter().any(|u| u.name == id)
        })
        .map(|m| with_cmd_k(available_model(m), config))
        .collect();
    // Older clients read the flat name list; an empty list means "use `models`", so only a
    // list upstream actually filled gets our names.
    let model_names = if upstream.model_names.is_empty() {
        Vec::new()
    } else {
        models
            .iter()
            .map(|m| m.name.clone())
            .filter(|n| !upstream.model_names.contains(n))
            .collect()
    };
    ai::AvailableModelsResponse {
        models,
        model_names,
        // A singular field: appended to upstream's bytes, its default model replaces theirs.
        cmd_k_model_config: cmd_k_model_config(config),
        ..Default::default()
    }
}

/// Cmd+K's default model when `[cmd_k] model` serves Cursor's default: ours, so the surface's
/// default and what serves it agree. Unset: Cursor's own stays.
pub(crate) fn cmd_k_model_config(config: &Config) -> Option<FeatureModelConfig> {
    config.cmd_k_model().map(|m| FeatureModelConfig {
        default_model: m.cursor_id(),
        ..Default::default()
    })
}

/// An entry with the flags the Cmd+K picker reads, when `[cmd_k] model` is set. Only then:
/// with it, every Cmd+K that names our model or Cursor's default runs here, so whatever the
/// client sends after a pick stays the user's. The Cmd+K picker drops entries with
/// `supports_cmd_k: false` or `supports_thinking: true`, so a thinking model says `false`
/// there: its reasoning still streams (the run follows the configuration and the picker's
/// `thinking` parameter, never this flag).
fn with_cmd_k(mut entry: AvailableModel, config: &Config) -> AvailableModel {
    if config.cmd_k_model().is_some() {
        entry.supports_cmd_k = Some(true);
        entry.supports_thinking = Some(false);
    }
    entry
}

/// The answer when upstream is unreachable or refused: our models alone.
pub fn local_available_models(config: &Config) -> ai::AvailableModelsResponse {
    let models: Vec<AvailableModel> = config
        .usable_models()
        .map(|m| with_cmd_k(available_model(m), config))
        .collect();
    ai::AvailableModelsResponse {
        model_names: models.iter().map(|m| m.name.clone()).collect(),
        models,
        cmd_k_model_config: cmd_k_model_config(config),
        ..Default::default()
    }
}

/// `upstream` with a [`ag::ModelDetails`] per usable configured model appended.
pub fn merge_usable_models(
    mut upstream: ag::GetUsableModelsResponse,
    config: &Config,
) -> ag::GetUsableModelsResponse {
    let ours = usable_models_additions(&upstream, config);
    upstream.models.extend(ours.models);
    upstream
}

/// What [`merge_usable_models`] appends, alone (see [`available_models_additions`]).
pub fn usable_models_additions(
    upstream: &ag::GetUsableModelsResponse,
    config: &Config,
) -> ag::GetUsableModelsResponse {
    ag::GetUsableModelsResponse {
        models: config
            .usable_models()
            .filter(|m| {
                let id = m.cursor_id();
                !upstream.models.iter().any(|u| u.model_id == id)
            })
            .map(model_details)
            .collect(),
    }
}

pub fn local_usable_models(config: &Config) -> ag::GetUsableModelsResponse {
    ag::GetUsableModelsResponse {
        models: config.usable_models().map(model_details).collect(),
    }
}

/// The CLI's default when upstream cannot say: the first usable configured model. `None` when
/// there is none (then upstream's failure is the honest answer).
pub fn local_default_model_for_cli(config: &Config) -> Option<ag::GetDefaultModelForCliResponse> {
    let model = config.usable_models().next()?;
    Some(ag::GetDefaultModelForCliResponse {
        model: Some(model_details(model)),
    })
}

/// One configured model as an `AvailableModelsResponse.AvailableModel`, filled the way Cursor's
/// own entries are (see the real capture): name = server name = our id, agent support, and
/// variants with `parameter_values`, `variant_string_representation` and `legacy_slug`; plus
/// the display and capability fields the desktop picker reads.
pub fn available_model(m: &ModelConfig) -> AvailableModel {
    let id = m.cursor_id();
    let display = m.display_name().to_string();
    let params = parameters(m);
    let (vendor, vendor_name) = vendor_of(&m.model);
    AvailableModel {
        name: id.clone(),
        default_on: true,
        supports_agent: Some(true),
        supports_thinking: Some(m.thinks()),
        supports_images: Some(m.supports_images),
        // One context size, no "max" variant (the Cmd+K picker needs non-max mode too).
        supports_max_mode: Some(false),
        supports_non_max_mode: Some(true),
        // Cmd+K is served on our models only where `[cmd_k] model` is set (`with_cmd_k`).
        supports_cmd_k: Some(false),
        context_token_limit: Some(i32::try_from(m.context_window).unwrap_or(i32::MAX)),
        client_display_name: Some(display.clone()),
        server_model_name: Some(id.clone()),
        inputbox_short_model_name: Some(display),
        tagline: Some(format!("{} via cursor-byok", m.model)),
        parameter_definitions: params.iter().map(|p| p.definition()).collect(),
        variants: variants(&id, &params),
        // The routed picker view (Free and some Pro plans) lists only Auto and the entries
        // that set this: without it the user's own models cannot be picked on those plans.
        visible_in_routed_model_view: Some(true),
        // The picker groups and labels models by maker.
        vendor: Some(ModelVendor {
            id: vendor as i32,
            display_name: vendor_name.to_string(),
        }),
        vendor_name: Some(vendor_name.to_string()),
        // The run serves Plan mode (create_plan, StartPlanAction, ExecutePlanAction).
        supports_plan_mode: Some(true),
        // Shells run on the client, which confines them by its own sandbox settings; the run
        // sends no policy of its own, so the user's setting applies as it does for Cursor's
        // models.
        supports_sandboxing: Some(true),
        // Auto-review verdicts come from the run's own model (agent::run::review).
        supports_smart_mode_classifier: Some(true),
        // A model the user may pick for any chat, shown in the list, not only on Cmd-K.
        is_chat_only: Some(false),
        is_long_context_only: Some(false),
        only_supports_cmd_k: Some(false),
        is_hidden: Some(false),
        // The provider keeps whatever the user's account with it says; Cursor stores nothing
        // of these runs, so its zero-data-retention gate has nothing to block.
        requires_data_retention: Some(false),
        // An admin allow-list of Cursor's models says nothing about the user's own ones.
        default_disabled_in_admin_allowlist: Some(false),
        ..Default::default()
    }
}

/// `AvailableModel` fields [`available_model`] leaves unset, each with the reason. A test walks
/// the schema: a field neither set nor listed here fails it.
pub const UNSET_PICKER_FIELDS: &[(&str, &str)] = &[
    (
        "degradation_status",
        "no degradation is known; the provider's errors reach the run",
    ),
    (
        "price",
        "Cursor's price per request; the user pays the provider, the run reports costs itself",
    ),
    (
        "tooltip_data",
        "the tagline names the provider's model; no second tooltip",
    ),
    (
        "supports_auto_context",
        "auto context is a Cursor server feature the run does not serve",
    ),
    ("auto_context_max_tokens", "auto context is not served"),
    (
        "auto_context_extended_max_tokens",
        "auto context is not served",
    ),
    (
        "context_token_limit_for_max_mode",
        "no Max mode: one context size",
    ),
    ("tooltip_data_for_max_mode", "no Max mode"),
    (
        "is_recommended_for_background_composer",
        "background (cloud) agents run on Cursor's servers, not here",
    ),
    (
        "is_user_added",
        "not shown that it leaves Cursor's routing of the model unchanged",
    ),
    (
        "background_composer_sort_order",
        "background (cloud) agents run on Cursor's servers",
    ),
    (
        "cloud_agent_effort_mode",
        "cloud agents run on Cursor's servers",
    ),
    (
        "cloud_migrate_to_model",
        "cloud agents run on Cursor's servers",
    ),
    (
        "upgrade_model_id",
        "no newer model to suggest: the user configures the model",
    ),
    ("legacy_slugs", "each variant carries its own legacy slug"),
    (
        "id_aliases",
        "a short alias could shadow one of Cursor's model names",
    ),
    (
        "named_model_section_index",
        "no named section: the entries follow Cursor's in the list",
    ),
    (
        "cloud_agent_effort_modes",
        "cloud agents run on Cursor's servers",
    ),
    (
        "reason_for_zdr_consent_block",
        "requires_data_retention is false: nothing to explain",
    ),
];

/// The maker of a provider's model, from its name, as Cursor's picker groups vendors.
fn vendor_of(model: &str) -> (ModelVendorId, &'static str) {
    let m = model.to_ascii_lowercase();
    let m = m.rsplit('/').next().unwrap_or(&m);
    let starts = |prefixes: &[&str]| prefixes.iter().any(|p| m.starts_with(p));
    if starts(&["claude"]) {
        (ModelVendorId::Anthropic, "Anthropic")
    } else if starts(&["gpt", "o1", "o3", "o4", "codex", "chatgpt"]) {
        (ModelVendorId::Openai, "OpenAI")
    } else if starts(&["gemini", "gemma"]) {
        (ModelVendorId::Google, "Google")
    } else if starts(&["grok"]) {
        (ModelVendorId::Xai, "xAI")
    } else if starts(&["kimi", "moonshot"]) {
        (ModelVendorId::Moonshot, "Moonshot")
    } else if starts(&["nemotron", "nvidia"]) {
        (ModelVendorId::Nvidia, "NVIDIA")
    } else if starts(&["glm", "zai"]) {
        (ModelVendorId::Zai, "Z.ai")
    } else {
        (ModelVendorId::Unspecified, "cursor-byok")
    }
}

/// One configured model as `agent.v1.ModelDetails` (GetUsableModels, GetDefaultModelForCli).
pub fn model_details(m: &ModelConfig) -> ag::ModelDetails {
    let id = m.cursor_id();
    let display = m.display_name().to_string();
    ag::ModelDetails {
        model_id: id.clone(),
        thinking_details: m.thinks().then(ag::ThinkingDetails::default),
        display_model_id: id,
        display_name: display.clone(),
        display_name_short: display,
        // One context size: no Max mode to switch on.
        max_mode: Some(false),
        // No aliases: a short alias could shadow one of Cursor's model names. Credentials stay
        // unset: the key never leaves the proxy.
        ..Default::default()
    }
}

/// A picker parameter of one model: its values (with display names) and the configured default.
struct Param {
    id: &'static str,
    name: &'static str,
    boolean: bool,
    values: Vec<(&'static str, &'static str)>,
    default: &'static str,
}

impl Param {
    fn definition(&self) -> ModelParameterDefinition {
        let parameter_type = if self.boolean {
            ModelParameterType {
                boolean_parameter: Some(BooleanParameterDefinition {
                    values: self
                        .values
                        .iter()
                        .map(|(value, display)| BooleanParameterValue {
                            value: (*value).to_string(),
                            display_name: Some((*display).to_string()),
                            ..Default::default()
                        })
                        .collect(),
                }),
                enum_parameter: None,
            }
        } else {
            ModelParameterType {
                boolean_parameter: None,
                enum_parameter: Some(EnumParameterDefinition {
                    values: self
                        .values
                        .iter()
                        .map(|(value, display)| EnumParameterValue {
                            value: (*value).to_string(),
                            display_name: Some((*display).to_string()),
                            ..Default::default()
                        })
                        .collect(),
                }),
            }
        };
        ModelParameterDefinition {
            id: self.id.to_string(),
            name: self.name.to_string(),
            parameter_type: Some(parameter_type),
            ..Default::default()
        }
    }
}

fn effort_display(level: &str) -> &'static str {
    match level {
        "minimal" => "Minimal",
        "low" => "Low",
        "medium" => "Medium",
        "high" => "High",
        "xhigh" => "Extra High",
        _ => "Default",
    }
}

/// The parameters a model offers: reasoning effort when configured (low/medium/high plus the
/// configured level), and thinking on/off when a thinking budget is configured.
fn parameters(m: &ModelConfig) -> Vec<Param> {
    let mut out = Vec::new();
    if let Some(configured) = m.reasoning_effort.as_deref() {
        // Config validation admits only EFFORT_ORDER levels; an unknown one (older config)
        // simply gets no picker parameter and runs at its configured level.
        if let Some(default) = EFFORT_ORDER.iter().copied().find(|l| *l == configured) {
            let values = EFFORT_ORDER
                .iter()
                .copied()
                .filter(|l| *l == default || OFFERED_EFFORTS.contains(l))
                .map(|l| (l, effort_display(l)))
                .collect();
            out.push(Param {
                id: EFFORT_PARAM,
                name: "Reasoning effort",
                boolean: false,
                values,
                default,
            });
        }
    }
    if m.thinking_budget.is_some() {
        out.push(Param {
            id: THINKING_PARAM,
            name: "Thinking",
            boolean: true,
            values: vec![("true", "On"), ("false", "Off")],
            default: "true",
        });
    }
    out
}

/// Every combination of parameter values, as Cursor lists variants: `id[k=v,…]` strings, the
/// configured combination flagged as the default. The legacy slug is `id` for the default and
/// `id:<effort>` for other efforts (the `:variant` form the agent resolves).
fn variants(id: &str, params: &[Param]) -> Vec<ModelVariantConfig> {
    let mut combos: Vec<Vec<(&Param, &'static str)>> = vec![Vec::new()];
    for p in params {
        combos = combos
            .into_iter()
            .flat_map(|combo| {
                p.values.iter().map(move |(value, _)| {
                    let mut next = combo.clone();
                    next.push((p, *value));
                    next
                })
            })
            .collect();
    }
    combos
        .into_iter()
        .map(|combo| {
            let is_default = combo.iter().all(|(p, v)| *v == p.default);
            let repr = combo
                .iter()
                .map(|(p, v)| format!("{}={v}", p.id))
                .collect::<Vec<_>>()
                .join(",");
            let effort = combo
                .iter()
                .find(|(p, v)| p.id == EFFORT_PARAM && *v != p.default)
                .map(|(_, v)| *v);
            let legacy_slug = match effort {
                Some(level) => format!("{id}:{level}"),
                None => id.to_string(),
            };
            ModelVariantConfig {
                parameter_values: combo
                    .iter()
                    .map(|(p, v)| ModelParameterValue {
                        id: p.id.to_string(),
                        value: (*v).to_string(),
                    })
                    .collect(),
                // Cursor's own variants leave this empty; the picker labels them from the
                // parameter definitions.
                display_name: String::new(),
                is_max_mode: false,
                is_default_max_config: is_default.then_some(true),
                is_default_non_max_config: is_default.then_some(true),
                variant_string_representation: Some(format!("{id}[{repr}]")),
                legacy_slug: Some(legacy_slug),
                ..Default::default()
            }
        })
        .collect()
}

/// Splits a variant string as Cursor writes them, `model[k=v,k2=v2]`, into the model id and its
/// parameters. A plain id (no brackets) has no parameters; malformed brackets give `None`.
pub fn parse_variant_string(s: &str) -> Option<(&str, Vec<(&str, &str)>)> {
    let Some(open) = s.find('[') else {
        return Some((s, Vec::new()));
    };
    let inner = s.get(open + 1..)?.strip_suffix(']')?;
    let base = s.get(..open)?;
    if inner.contains('[') || inner.contains(']') {
        return None;
    }
    let mut params = Vec::new();
    for pair in inner.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=')?;
        params.push((k, v));
    }
    Some((base, params))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::test_support::{capture_models_raw, test_config};
    use prost::Message;

    #[test]
    fn cmd_k_is_advertised_only_where_cmd_k_serves_it() {
        let plain = test_config();
        let local = local_available_models(&plain);
        assert!(local.models.iter().all(|m| m.supports_cmd_k == Some(false)));
        assert!(local.cmd_k_model_config.is_none(), "Cursor's default stays");

        let mut served = test_config();
        served.cmd_k.model = Some("claude".into());
        let local = local_available_models(&served);
        for m in &local.models {
            // What the Cmd+K picker needs to show the entry (a thinking model included).
            assert_eq!(
                (
                    m.supports_cmd_k,
                    m.supports_thinking,
                    m.supports_non_max_mode,
                    m.default_on
                ),
                (Some(true), Some(false), Some(true), true),
                "{}",
                m.name
            );
        }
        // Upstream's own default is replaced on the wire: our bytes are appended to theirs.
        let upstream = ai::AvailableModelsResponse {
            cmd_k_model_config: Some(FeatureModelConfig {
                default_model: "cursor-small".into(),
                fallback_models: vec!["gpt-4o".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let wire = [
            upstream.encode_to_vec(),
            available_models_additions(&upstream, &served).encode_to_vec(),
        ]
        .concat();
        let merged = ai::AvailableModelsResponse::decode(&wire[..]).unwrap();
        let config = merged.cmd_k_model_config.unwrap();
        assert_eq!(config.default_model, "byok-claude");
        assert_eq!(config.fallback_models, ["gpt-4o"]);
        let decoded = merge_available_models(upstream, &served);
        assert_eq!(
            decoded.cmd_k_model_config.unwrap().default_model,
            "byok-claude"
        );
    }

    #[test]
    fn merge_appends_to_the_real_capture_and_keeps_upstream_intact() {
        let Some(raw) =
            capture_models_raw("merge_appends_to_the_real_capture_and_keeps_upstream_intact")
        else {
            return;
        };
        let original = ai::AvailableModelsResponse::decode(&raw[..]).expect("capture decodes");
        let n = original.models.len();
        let config = test_config();

        let merged = merge_available_models(original.clone(), &config);
        let bytes = merged.encode_to_vec();
        // The capture holds only field 2, so appending to it appends bytes: upstream's part of
        // the answer is byte-for-byte the original.
        assert!(bytes.starts_with(&raw), "upstream's bytes changed");

        let back = ai::AvailableModelsResponse::decode(&bytes[..]).expect("merged decodes");
        assert_eq!(back.models.len(), n + 2, "two usable models appended");
        assert_eq!(&back.models[..n], &original.models[..]);
        assert!(
            back.model_names.is_empty(),
            "an empty name list stays empty"
        );

        let gpt = &back.models[n];
        assert_eq!(gpt.name, "byok-gpt");
        assert_eq!(gpt.client_display_name.as_deref(), Some("My GPT"));
        assert_eq!(gpt.server_model_name.as_deref(), Some("byok-gpt"));
        assert_eq!(gpt.supports_agent, Some(true));
        assert_eq!(gpt.supports_thinking, Some(true));
        assert_eq!(gpt.supports_images, Some(false));
        assert_eq!(gpt.context_token_limit, Some(400_000));
        assert!(gpt.default_on);
        assert_eq!(gpt.parameter_definitions.len(), 1);
        assert_eq!(gpt.parameter_definitions[0].id, EFFORT_PARAM);
        let reprs: Vec<_> = gpt
            .variants
            .iter()
            .map(|v| v.variant_string_representation.clone().unwrap_or_default())
            .collect();
        assert_eq!(
            reprs,
            [
                "byok-gpt[reasoning_effort=minimal]",
                "byok-gpt[reasoning_effort=low]",
                "byok-gpt[reasoning_effort=medium]",
                "byok-gpt[reasoning_effort=high]",
            ]
        );
        let defaults: Vec<_> = gpt
            .variants
            .iter()
            .filter(|v| v.is_default_non_max_config == Some(true))
            .collect();
        assert_eq!(defaults.len(), 1);
        assert_eq!(defaults[0].parameter_values[0].value, "minimal");
        assert_eq!(defaults[0].legacy_slug.as_deref(), Some("byok-gpt"));
        assert_eq!(
            gpt.variants[3].legacy_slug.as_deref(),
            Some("byok-gpt:high")
        );

        let claude = &back.models[n + 1];
        assert_eq!(claude.name, "byok-claude");
        assert_eq!(
            claude.client_display_name.as_deref(),
            Some("claude"),
            "id when unnamed"
        );
        assert_eq!(claude.supports_thinking, Some(true));
        assert_eq!(claude.supports_images, Some(true));
        assert_eq!(claude.variants.len(), 2, "thinking on / off");
        assert!(claude.parameter_definitions[0]
            .parameter_type
            .as_ref()
            .is_some_and(|t| t.boolean_parameter.is_some()));

        // Merging twice adds nothing more.
        let again = merge_available_models(back, &config);
        assert_eq!(again.models.len(), n + 2);
    }

    #[test]
    fn plain_model_has_one_default_variant_like_cursors_default() {
        let config = test_config();
        let plain = config
            .models
            .iter()
            .find(|m| m.id == "plain")
            .expect("configured");
        let entry = available_model(plain);
        assert_eq!(entry.supports_thinking, Some(false));
        assert!(entry.parameter_definitions.is_empty());
        assert_eq!(entry.variants.len(), 1);
        let v = &entry.variants[0];
        assert!(v.parameter_values.is_empty());
        assert_eq!(
            v.variant_string_representation.as_deref(),
            Some("byok-plain[]")
        );
        assert_eq!(v.is_default_max_config, Some(true));
        assert_eq!(v.is_default_non_max_config, Some(true));
    }

    #[test]
    fn names_list_is_extended_only_when_upstream_fills_it() {
        let config = test_config();
        let upstream = ai::AvailableModelsResponse {
            model_names: vec!["gpt-5".into()],
            ..Default::default()
        };
        let merged = merge_available_models(upstream, &config);
        assert_eq!(merged.model_names, ["gpt-5", "byok-gpt", "byok-claude"]);
    }

    #[test]
    fn local_answers_hold_only_usable_models() {
        let config = test_config();
        let local = local_available_models(&config);
        let names: Vec<_> = local.models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["byok-gpt", "byok-claude"], "`plain` has no key");
        assert_eq!(local.model_names, names);

        let usable = local_usable_models(&config);
        assert_eq!(usable.models.len(), 2);
        let default = local_default_model_for_cli(&config).and_then(|r| r.model);
        assert_eq!(default.map(|m| m.model_id).as_deref(), Some("byok-gpt"));
    }

    #[test]
    fn usable_models_merge_appends_details() {
        let config = test_config();
        let upstream = ag::GetUsableModelsResponse {
            models: vec![ag::ModelDetails {
                model_id: "composer-2.5".into(),
                ..Default::default()
            }],
        };
        let merged = merge_usable_models(upstream.clone(), &config);
        assert_eq!(merged.models.len(), 3);
        assert_eq!(merged.models[0], upstream.models[0]);
        let gpt = &merged.models[1];
        assert_eq!(gpt.model_id, "byok-gpt");
        assert_eq!(gpt.display_model_id, "byok-gpt");
        assert_eq!(gpt.display_name, "My GPT");
        assert_eq!(gpt.display_name_short, "My GPT");
        assert!(gpt.thinking_details.is_some());
        assert!(merged.models.iter().all(|m| m.credentials.is_none()));
        assert_eq!(merge_usable_models(merged.clone(), &config), merged);
    }

    #[test]
    fn every_picker_field_is_filled_or_left_unset_with_a_reason() {
        use prost_reflect::{DescriptorPool, DynamicMessage};
        let pool = DescriptorPool::decode(crate::proto::DESCRIPTOR_SET).expect("descriptors");
        let desc = pool
            .get_message_by_name("aiserver.v1.AvailableModelsResponse.AvailableModel")
            .expect("in the schema");
        let config = test_config();
        let gpt = config.models.iter().find(|m| m.id == "gpt").expect("gpt");
        let bytes = available_model(gpt).encode_to_vec();
        let entry = DynamicMessage::decode(desc.clone(), &bytes[..]).expect("decodes");
        let mut problems = Vec::new();
        for field in desc.fields() {
            let set = entry.has_field(&field);
            let unset_reason = UNSET_PICKER_FIELDS
                .iter()
                .find(|(name, _)| *name == field.name());
            match (set, unset_reason) {
                (true, Some(_)) => problems.push(format!("{} set and listed unset", field.name())),
                (false, None) => problems.push(format!("{} neither set nor listed", field.name())),
                _ => {}
            }
        }
        for (name, why) in UNSET_PICKER_FIELDS {
            if desc.get_field_by_name(name).is_none() {
                problems.push(format!("{name} is listed but not in the schema"));
            }
            assert!(!why.trim().is_empty(), "{name} needs a reason");
        }
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn vendors_follow_the_model_maker() {
        assert_eq!(vendor_of("claude-sonnet-4-5").0, ModelVendorId::Anthropic);
        assert_eq!(vendor_of("gpt-5").0, ModelVendorId::Openai);
        assert_eq!(vendor_of("openai/o3-mini").0, ModelVendorId::Openai);
        assert_eq!(vendor_of("Gemini-2.5-pro").0, ModelVendorId::Google);
        assert_eq!(vendor_of("grok-4").0, ModelVendorId::Xai);
        assert_eq!(vendor_of("moonshotai/kimi-k2").0, ModelVendorId::Moonshot);
        assert_eq!(vendor_of("glm-4.6").0, ModelVendorId::Zai);
        assert_eq!(
            vendor_of("qwen3-coder"),
            (ModelVendorId::Unspecified, "cursor-byok")
        );
    }

    #[test]
    fn variant_strings_parse() {
        assert_eq!(
            parse_variant_string("byok-gpt[reasoning_effort=high,thinking=false]"),
            Some((
                "byok-gpt",
                vec![("reasoning_effort", "high"), ("thinking", "false")]
            ))
        );
        assert_eq!(
            parse_variant_string("byok-gpt[]"),
            Some(("byok-gpt", vec![]))
        );
        assert_eq!(parse_variant_string("byok-gpt"), Some(("byok-gpt", vec![])));
        assert_eq!(parse_variant_string("byok-gpt[x"), None);
        assert_eq!(parse_variant_string("byok-gpt[x]"), None);
    }
}
