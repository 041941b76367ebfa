use super::*;

#[test]
fn embedded_default_is_valid() {
    let c = Config::embedded_default();
    assert!(c.listen.ip().is_loopback());
    assert_eq!(c.intercept, vec!["*.cursor.sh"]);
    // A model for each key a user may already have set, each on its own provider.
    let keys: Vec<(&str, &str)> = c
        .models
        .iter()
        .map(|m| {
            let p = &c.providers[&m.provider];
            (m.provider.as_str(), p.api_key_env.as_deref().unwrap_or(""))
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("openai", "OPENAI_API_KEY"),
            ("anthropic", "ANTHROPIC_API_KEY"),
            ("gemini", "GEMINI_API_KEY"),
            ("openrouter", "OPENROUTER_API_KEY"),
            ("deepseek", "DEEPSEEK_API_KEY"),
        ]
    );
    assert_eq!(c.providers["gemini"].kind, ProviderKind::Gemini);
}

#[test]
fn example_is_valid() {
    let text = include_str!("../../config.example.toml");
    let c = Config::from_toml(text, "config.example.toml").unwrap();
    assert_eq!(c.models[0].cursor_id(), "byok-gpt-5.1");
    assert_eq!(c.providers["anthropic"].auth(), AuthMode::XApiKey);
    assert_eq!(c.providers["openai"].auth(), AuthMode::Bearer);
}

#[test]
fn wrong_type_names_file_key_and_reason() {
    let text = "listen = \"127.0.0.1:1\"\n[agent]\nmax_tool_rounds = \"many\"\n";
    let err = Config::from_toml(text, "c.toml").unwrap_err().to_string();
    assert!(err.contains("c.toml"), "{err}");
    assert!(err.contains("agent.max_tool_rounds"), "{err}");
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("invalid type"), "{err}");
}

#[test]
fn secret_values_are_never_echoed() {
    let text = "[providers.x]\nkind = \"openai-chat\"\napi_key = \"sk-SECRET\"\n[providers.x.headers]\nh = [\"sk-SECRET2\"]\n";
    let err = Config::from_toml(text, "c.toml").unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("sk-SECRET"), "{shown}");
    assert!(shown.contains("providers.x.headers"), "{shown}");

    let c = Config::from_toml(
        "[providers.x]\nkind = \"anthropic\"\napi_key = \"sk-SECRET\"\n",
        "c",
    )
    .unwrap();
    assert!(!format!("{c:?}").contains("sk-SECRET"));
}

#[test]
fn unknown_keys_and_references_fail() {
    let err = Config::from_toml("lisen = \"x\"", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field"), "{err}");
    let err = Config::from_toml(
        "[[models]]\nid = \"a\"\nprovider = \"nope\"\nmodel = \"m\"\n",
        "c.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("models[0].provider") && err.contains("nope"),
        "{err}"
    );
    let err = Config::from_toml(
        "[providers.p]\nkind = \"bedrock\"\napi_key_env = \"X\"\n",
        "c.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("providers.p.kind"), "{err}");
}

#[test]
fn gemini_kind_defaults() {
    let c = Config::from_toml(
        "[providers.g]\nkind = \"gemini\"\napi_key_env = \"GEMINI_API_KEY\"\n",
        "c.toml",
    )
    .unwrap();
    let g = &c.providers["g"];
    assert_eq!(g.kind, ProviderKind::Gemini);
    assert_eq!(g.auth(), AuthMode::XGoogApiKey);
    assert_eq!(g.base_url(), "https://generativelanguage.googleapis.com");
}

#[test]
fn host_patterns() {
    let p = vec!["*.cursor.sh".to_string()];
    assert!(host_matches(&p, "api2.cursor.sh"));
    assert!(host_matches(&p, "agent.api5.cursor.sh"));
    assert!(host_matches(&p, "API2.Cursor.SH."));
    assert!(!host_matches(&p, "cursor.sh"));
    assert!(!host_matches(&p, "evilcursor.sh"));
    assert!(!host_matches(&p, "cursor.sh.evil.com"));
    assert!(host_matches(&["example.com".to_string()], "example.com"));
}

#[test]
fn direct_doors_stay_on_loopback_without_a_credential() {
    let auth = "[proxy_auth]\nusername = \"u\"\npassword = \"p\"\n";
    for key in ["tls_listen", "http_listen"] {
        for addr in ["0.0.0.0:8443", "192.168.1.5:8443", "[::]:8443"] {
            let text = format!("[direct]\n{key} = \"{addr}\"\n");
            let err = Config::from_toml(&text, "c.toml").unwrap_err().to_string();
            assert!(err.contains(&format!("direct.{key}")), "{err}");
            assert!(err.contains("spends your provider key"), "{err}");
            // With a credential the doors check, any address is allowed.
            let token = "token = \"door-token-0123456789\"\n";
            let with_token = format!("[direct]\n{key} = \"{addr}\"\n{token}");
            assert!(Config::from_toml(&with_token, "c.toml")
                .unwrap()
                .direct
                .exposed());
            Config::from_toml(&format!("{auth}{text}"), "c.toml").unwrap();
        }
        for addr in ["127.0.0.1:8443", "[::1]:8443"] {
            let text = format!("[direct]\n{key} = \"{addr}\"\n");
            assert!(!Config::from_toml(&text, "c.toml").unwrap().direct.exposed());
        }
    }
    let short = "[direct]\ntoken = \"short\"\n";
    let err = Config::from_toml(short, "c.toml").unwrap_err().to_string();
    assert!(
        err.contains("direct.token") && !err.contains("short"),
        "{err}"
    );
}

#[test]
fn fallbacks_and_prices_are_checked() {
    let base = "[providers.p]\nkind = \"openai-chat\"\napi_key = \"k\"\n[[models]]\nid = \"m\"\nprovider = \"p\"\nmodel = \"gpt-5.1\"\n";
    let c = Config::from_toml(base, "c.toml").unwrap();
    assert_eq!(c.models[0].price(), Price::list("gpt-5.1"));
    assert_eq!(c.fallback.on.len(), 5);
    let bad = |extra: &str| {
        Config::from_toml(&format!("{base}{extra}"), "c.toml")
            .unwrap_err()
            .to_string()
    };
    let err = bad("[[models.fallback]]\nprovider = \"nope\"\nmodel = \"x\"\n");
    assert!(err.contains("models[0].fallback[0].provider"), "{err}");
    let err = bad("[models.price]\ninput = -1.0\noutput = 1.0\n");
    assert!(err.contains("models[0].price"), "{err}");
    let err =
        bad("[[models.fallback]]\nprovider = \"p\"\nmodel = \"x\"\nreasoning_effort = \"max\"\n");
    assert!(err.contains("reasoning_effort"), "{err}");
    let ok = Config::from_toml(
        &format!("[fallback]\non = [\"rate-limit\"]\n{base}[[models.fallback]]\nprovider = \"p\"\nmodel = \"claude-sonnet-4-5\"\n"),
        "c.toml",
    )
    .unwrap();
    assert_eq!(ok.fallback.on, [FailoverOn::RateLimit]);
    assert_eq!(
        ok.models[0].fallback[0].price(),
        Price::list("claude-sonnet-4-5")
    );
}
