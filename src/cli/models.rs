//! `cursor-byok models`: the configured models with the ids Cursor sees.

use crate::config::Config;

/// One line per model: `byok-<id>  <display name>  (<provider>/<model>)  key: set|missing`.
pub fn lines(config: &Config) -> Vec<String> {
    let rows: Vec<[String; 4]> = config
        .models
        .iter()
        .map(|m| {
            let key = config
                .providers
                .get(&m.provider)
                .and_then(|p| p.resolve_api_key())
                .map_or("missing", |_| "set");
            [
                m.cursor_id(),
                m.display_name().to_string(),
                format!("({}/{})", m.provider, m.model),
                format!("key: {key}"),
            ]
        })
        .collect();
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    rows.iter()
        .map(|r| format!("{:w0$}  {:w1$}  {:w2$}  {}", r[0], r[1], r[2], r[3]))
        .collect()
}

pub fn run(config: &Config) {
    if config.models.is_empty() {
        println!(
            "No models configured: add [[models]] entries to the config (see config.example.toml)."
        );
        return;
    }
    for line in lines(config) {
        println!("{line}");
    }
    if config.usable_models().count() < config.models.len() {
        println!();
        println!("Models whose key is missing stay hidden in Cursor: set their provider's api_key_env variable.");
    }
}
