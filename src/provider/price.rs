//! What a call costs: a price per million tokens for each kind of token, and the cost of a
//! [`Usage`] at those prices.

use serde::{Deserialize, Serialize};

use super::types::Usage;

/// US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Prompt tokens not served from or written to the cache.
    pub input: f64,
    pub output: f64,
    /// Prompt tokens served from the cache; defaults to `input`.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the cache; defaults to `input`.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

/// List prices as of 2026, by the provider's model name. They change: a model's `[models.price]`
/// in the config overrides them, and models not listed here show tokens only.
const LIST_PRICES: &[(&str, Price)] = &[
    ("gpt-5.1", price(1.25, 10.0, 0.125, 1.25)),
    ("gpt-5", price(1.25, 10.0, 0.125, 1.25)),
    ("gpt-5-mini", price(0.25, 2.0, 0.025, 0.25)),
    ("claude-sonnet-4-5", price(3.0, 15.0, 0.30, 3.75)),
    ("claude-opus-4-5", price(5.0, 25.0, 0.50, 6.25)),
    ("claude-haiku-4-5", price(1.0, 5.0, 0.10, 1.25)),
    ("deepseek-reasoner", price(0.28, 0.42, 0.028, 0.28)),
    ("deepseek-chat", price(0.28, 0.42, 0.028, 0.28)),
];

const fn price(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Price {
    Price {
        input,
        output,
        cache_read: Some(cache_read),
        cache_write: Some(cache_write),
    }
}

impl Price {
    /// The list price of a provider model name, if we know one.
    pub fn list(model: &str) -> Option<Price> {
        LIST_PRICES
            .iter()
            .find(|(name, _)| *name == model)
            .map(|(_, p)| *p)
    }

    /// Dollars for `u` (whose `input` includes its cache reads and writes).
    pub fn cost(&self, u: &Usage) -> f64 {
        let fresh = u.input.saturating_sub(u.cache_read + u.cache_write);
        let per_token = |tokens: u64, per_million: f64| tokens as f64 * per_million / 1e6;
        per_token(fresh, self.input)
            + per_token(u.cache_read, self.cache_read.unwrap_or(self.input))
            + per_token(u.cache_write, self.cache_write.unwrap_or(self.input))
            + per_token(u.output, self.output)
    }

    /// Every figure is finite and not negative.
    pub fn is_valid(&self) -> bool {
        [
            Some(self.input),
            Some(self.output),
            self.cache_read,
            self.cache_write,
        ]
        .into_iter()
        .flatten()
        .all(|p| p.is_finite() && p >= 0.0)
    }
}

/// The share of prompt tokens served from the cache (0 when there were none).
pub fn cache_read_share(input: u64, cache_read: u64) -> f64 {
    if input == 0 {
        0.0
    } else {
        cache_read as f64 / input as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_counts_each_kind_of_token_at_its_price() {
        let p = Price::list("claude-sonnet-4-5").unwrap();
        let u = Usage {
            input: 1_000_000 + 2_000_000 + 100_000,
            cache_read: 2_000_000,
            cache_write: 100_000,
            output: 10_000,
            reasoning: 5_000,
        };
        // 1M fresh × $3 + 2M read × $0.30 + 0.1M written × $3.75 + 0.01M out × $15.
        let want = 3.0 + 0.6 + 0.375 + 0.15;
        assert!((p.cost(&u) - want).abs() < 1e-9, "{}", p.cost(&u));
        let plain = Price {
            input: 2.0,
            output: 8.0,
            cache_read: None,
            cache_write: None,
        };
        assert!((plain.cost(&u) - (3.1 * 2.0 + 0.08)).abs() < 1e-9);
        assert_eq!(Price::list("no-such-model"), None);
        assert!(LIST_PRICES.iter().all(|(_, p)| p.is_valid()));
    }

    #[test]
    fn cache_share() {
        assert_eq!(cache_read_share(0, 0), 0.0);
        assert!((cache_read_share(200, 150) - 0.75).abs() < 1e-12);
    }
}
