//! `docs/configuration.md` describes every key of `config.example.toml`, commented-out ones
//! included, so the reference cannot fall behind the example.

use std::collections::BTreeSet;

/// A table header (`[a.b]`, `[[a]]`, possibly commented out) as a dotted path.
fn header(line: &str) -> Option<String> {
    let inner = line
        .strip_prefix("[[")
        .and_then(|l| l.strip_suffix("]]"))
        .or_else(|| line.strip_prefix('[').and_then(|l| l.strip_suffix(']')))?;
    Some(inner.trim().to_string())
}

/// A `key = value` line's bare key (quoted keys name hosts or headers, not settings).
fn key(line: &str) -> Option<&str> {
    let (k, _) = line.split_once(" = ")?;
    let k = k.trim();
    let bare = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    bare.then_some(k)
}

/// Provider tables are named by the user: `providers.openai` is `providers.<name>`.
fn generic(path: &str) -> String {
    let mut parts: Vec<&str> = path.split('.').collect();
    if parts.first() == Some(&"providers") && parts.len() > 1 {
        parts[1] = "<name>";
    }
    parts.join(".")
}

fn example_keys(example: &str) -> BTreeSet<String> {
    let mut table = String::new();
    let mut keys = BTreeSet::new();
    for raw in example.lines() {
        let line = raw.trim().trim_start_matches('#').trim();
        if let Some(h) = header(line) {
            table = h;
            keys.insert(generic(&table));
        } else if let Some(k) = key(line) {
            let path = if table.is_empty() {
                k.to_string()
            } else {
                format!("{table}.{k}")
            };
            keys.insert(generic(&path));
        }
    }
    keys
}

#[test]
fn every_example_key_is_described() {
    let root = env!("CARGO_MANIFEST_DIR");
    let example = std::fs::read_to_string(format!("{root}/config.example.toml")).unwrap();
    let docs = std::fs::read_to_string(format!("{root}/docs/configuration.md")).unwrap();
    let keys = example_keys(&example);
    assert!(keys.len() > 40, "too few keys read: {keys:?}");
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| !docs.contains(&format!("`{k}`")) && !docs.contains(&format!("`[{k}]`")))
        .filter(|k| !docs.contains(&format!("`[[{k}]]`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not describe: {missing:?}"
    );
}

#[test]
fn keys_are_read_from_headers_and_commented_lines() {
    let keys = example_keys(
        "listen = \"x\"\n# [proxy_auth]\n# username = \"me\"\n[providers.openai]\nkind = \"a\"\n\
         [upstream.resolve]\n# \"api2.cursor.sh\" = \"127.0.0.1:1\"\n",
    );
    let want: BTreeSet<String> = [
        "listen",
        "proxy_auth",
        "proxy_auth.username",
        "providers.<name>",
        "providers.<name>.kind",
        "upstream.resolve",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(keys, want);
}
