//! A string that never prints: API keys, bearer tokens, credentials; and the scrubber that
//! takes their values out of text that leaves the process (a provider may echo a header back
//! in its error body).

use std::borrow::Cow;
use std::fmt;
use std::sync::RwLock;

use base64::Engine;

/// A secret value. `Debug` and `Display` print `<redacted>`; the value is reachable only through
/// [`Secret::expose`], so every use of the raw value is visible in review.
#[derive(Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The raw value, for putting on the wire. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

/// What a scrubbed value is replaced with.
pub(crate) const REDACTED: &str = "[redacted]";
/// Shorter values are not scrubbed: they would mask ordinary words, and are no real secret.
const MIN_SECRET_LEN: usize = 6;
/// Bound on the process-wide registry (each value brings a handful of encodings).
const MAX_NEEDLES: usize = 4096;

/// Replaces every occurrence of known secret values in a text with [`REDACTED`], as written
/// and in the simple encodings a provider might echo them in: percent-encoded, base64
/// (standard and URL-safe, with or without padding) and JSON-escaped.
#[derive(Debug, Clone, Default)]
pub struct Scrubber {
    /// Longest first, so a value is masked whole before any shorter one inside it.
    needles: Vec<String>,
}

impl Scrubber {
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let mut scrubber = Scrubber::default();
        scrubber.add(values);
        scrubber
    }

    /// Add `values` (and their encodings); values under 6 bytes are ignored.
    pub fn add<'a>(&mut self, values: impl IntoIterator<Item = &'a str>) {
        for value in values {
            for needle in encodings(value) {
                if self.needles.len() < MAX_NEEDLES && !self.needles.contains(&needle) {
                    self.needles.push(needle);
                }
            }
        }
        self.needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
    }

    pub fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        replace_all(text, self.needles.iter().map(String::as_str))
    }
}

/// `text` with each of `needles` (longest first) replaced by [`REDACTED`].
fn replace_all<'t, 'n>(text: &'t str, needles: impl Iterator<Item = &'n str>) -> Cow<'t, str> {
    let mut out = Cow::Borrowed(text);
    for needle in needles {
        if out.contains(needle) {
            out = Cow::Owned(out.replace(needle, REDACTED));
        }
    }
    out
}

/// `value` as written and as it may be echoed back.
fn encodings(value: &str) -> Vec<String> {
    let value = value.trim();
    if value.len() < MIN_SECRET_LEN {
        return Vec::new();
    }
    let mut out = vec![value.to_string()];
    let bytes = value.as_bytes();
    let engines = [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    out.extend(engines.iter().map(|e| e.encode(bytes)));
    let percent = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    out.push(percent.to_ascii_lowercase());
    out.push(percent);
    if let Ok(json) = serde_json::to_string(value) {
        out.push(json.trim_matches('"').to_string());
    }
    out.dedup();
    out
}

/// The process-wide registry, so every error text leaving the process can be scrubbed without
/// being handed the config: the configured secrets (added when a server starts, for good), and
/// the secrets a client sent with a run (its bearer token, model credentials), held while the
/// run lives.
struct Registry {
    fixed: Scrubber,
    /// Bounded by the runs alive at once: each run takes its values out when it ends.
    scoped: Vec<Scoped>,
}

/// One value registered for a while, by `count` holders.
struct Scoped {
    value: String,
    count: usize,
    needles: Vec<String>,
}

static REGISTRY: RwLock<Registry> = RwLock::new(Registry {
    fixed: Scrubber {
        needles: Vec::new(),
    },
    scoped: Vec::new(),
});

fn registry_mut() -> std::sync::RwLockWriteGuard<'static, Registry> {
    // A poisoned lock only means a panic elsewhere; the needles are still whole.
    REGISTRY.write().unwrap_or_else(|e| e.into_inner())
}

/// Add `values` to the process-wide registry for good (see [`scrub`]).
pub fn register<'a>(values: impl IntoIterator<Item = &'a str>) {
    registry_mut().fixed.add(values);
}

/// Values in the registry for as long as this lives (a run's client credentials).
#[derive(Default)]
#[must_use = "the values leave the registry when this is dropped"]
pub struct Registration {
    values: Vec<String>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registration({} values)", self.values.len())
    }
}

/// Add `values` to the process-wide registry until the returned [`Registration`] is dropped.
pub fn register_while<'a>(values: impl IntoIterator<Item = &'a str>) -> Registration {
    let mut registry = registry_mut();
    let mut held = Vec::new();
    for value in values {
        let value = value.trim();
        let needles = encodings(value);
        if needles.is_empty() || held.iter().any(|h| h == value) {
            continue;
        }
        match registry.scoped.iter_mut().find(|s| s.value == value) {
            Some(s) => s.count += 1,
            None => registry.scoped.push(Scoped {
                value: value.to_string(),
                count: 1,
                needles,
            }),
        }
        held.push(value.to_string());
    }
    Registration { values: held }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.values.is_empty() {
            return;
        }
        let mut registry = registry_mut();
        for value in &self.values {
            if let Some(i) = registry.scoped.iter().position(|s| &s.value == value) {
                registry.scoped[i].count -= 1;
                if registry.scoped[i].count == 0 {
                    registry.scoped.swap_remove(i);
                }
            }
        }
    }
}

/// `text` with every registered secret replaced by [`REDACTED`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    if registry.scoped.is_empty() {
        return registry.fixed.scrub(text);
    }
    // Longest first across both lists, so a value is masked whole before any inside it.
    let mut needles: Vec<&str> = registry
        .fixed
        .needles
        .iter()
        .chain(registry.scoped.iter().flat_map(|s| &s.needles))
        .map(String::as_str)
        .collect();
    needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
    replace_all(text, needles.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubs_values_and_their_encodings() {
        let s = Scrubber::new(["sek-org/tok en+1", "short", "p@ss:w%rd"]);
        let b64 = base64::engine::general_purpose::STANDARD.encode("sek-org/tok en+1");
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("sek-org/tok en+1");
        for text in [
            "echo: sek-org/tok en+1 end".to_string(),
            format!("b64 {b64} end"),
            format!("b64url {url} end"),
            "pct sek%2Dorg%2Ftok%20en%2B1 end".to_string(),
            "pct sek%2dorg%2ftok%20en%2b1 end".to_string(),
            "pw p@ss:w%rd and p%40ss%3Aw%25rd end".to_string(),
        ] {
            let out = s.scrub(&text);
            assert!(out.contains(REDACTED), "{text} -> {out}");
            assert!(!out.contains("sek-org") && !out.contains("w%rd"), "{out}");
            assert!(out.ends_with(" end"), "{out}");
        }
        // Short values are left alone; a clean text is not copied.
        assert!(matches!(s.scrub("a short text"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_registry_scrubs_what_was_registered() {
        register(["registered-secret-42"]);
        assert_eq!(
            scrub("key registered-secret-42 was refused"),
            "key [redacted] was refused"
        );
    }

    #[test]
    fn a_registration_scrubs_while_it_lives() {
        let value = "run-scoped-secret-9f2e";
        let a = register_while([value, value]);
        let b = register_while([value]);
        assert_eq!(scrub(&format!("echo {value}")), "echo [redacted]");
        drop(a);
        assert_eq!(scrub(value), REDACTED, "still held by the other run");
        drop(b);
        assert_eq!(scrub(value), value, "gone with its last holder");
        assert!(format!("{:?}", register_while([value])).ends_with("(1 values)"));
    }

    #[test]
    fn never_prints() {
        let s = Secret::new("sk-live-123");
        assert_eq!(format!("{s:?} {s}"), "<redacted> <redacted>");
        assert_eq!(s.expose(), "sk-live-123");
    }
}
