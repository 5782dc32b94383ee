//! What a turn cost, from list prices per million tokens. Models not in the
//! table (local servers, new names) have no price: the cost is reported as
//! unknown rather than guessed.

use crate::message::Usage;

/// US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Prompt tokens written to the cache.
    pub cache_write: f64,
    /// Prompt tokens read from the cache.
    pub cache_read: f64,
}

const fn p(input: f64, output: f64, cache_write: f64, cache_read: f64) -> Price {
    Price {
        input,
        output,
        cache_write,
        cache_read,
    }
}

/// Prefixes of model names, most specific first: dated and aliased names
/// (`claude-sonnet-4-5-20250929`, `gpt-4o-2024-08-06`) match their family.
const TABLE: &[(&str, Price)] = &[
    ("claude-opus-4-5", p(5.0, 25.0, 6.25, 0.50)),
    ("claude-opus-4", p(15.0, 75.0, 18.75, 1.50)),
    ("claude-3-opus", p(15.0, 75.0, 18.75, 1.50)),
    ("claude-sonnet-4", p(3.0, 15.0, 3.75, 0.30)),
    ("claude-3-7-sonnet", p(3.0, 15.0, 3.75, 0.30)),
    ("claude-3-5-sonnet", p(3.0, 15.0, 3.75, 0.30)),
    ("claude-haiku-4-5", p(1.0, 5.0, 1.25, 0.10)),
    ("claude-3-5-haiku", p(0.80, 4.0, 1.0, 0.08)),
    ("claude-3-haiku", p(0.25, 1.25, 0.30, 0.03)),
    ("gpt-5-nano", p(0.05, 0.40, 0.05, 0.005)),
    ("gpt-5-mini", p(0.25, 2.0, 0.25, 0.025)),
    ("gpt-5", p(1.25, 10.0, 1.25, 0.125)),
    ("gpt-4.1-nano", p(0.10, 0.40, 0.10, 0.025)),
    ("gpt-4.1-mini", p(0.40, 1.60, 0.40, 0.10)),
    ("gpt-4.1", p(2.0, 8.0, 2.0, 0.50)),
    ("gpt-4o-mini", p(0.15, 0.60, 0.15, 0.075)),
    ("gpt-4o", p(2.50, 10.0, 2.50, 1.25)),
    ("o4-mini", p(1.10, 4.40, 1.10, 0.275)),
    ("o3-mini", p(1.10, 4.40, 1.10, 0.55)),
    ("o3", p(2.0, 8.0, 2.0, 0.50)),
];

/// The list price of `model`, if known. A provider prefix such as
/// `anthropic/` (LiteLLM, OpenRouter) is ignored.
pub fn price(model: &str) -> Option<Price> {
    let name = model.rsplit('/').next().unwrap_or(model);
    TABLE
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, price)| *price)
}

/// Dollars for `usage` on `model`, if its price is known.
pub fn cost(model: &str, usage: &Usage) -> Option<f64> {
    let p = price(model)?;
    let m = 1_000_000.0;
    Some(
        usage.input_tokens as f64 * p.input / m
            + usage.output_tokens as f64 * p.output / m
            + usage.cache_write_tokens as f64 * p.cache_write / m
            + usage.cache_read_tokens as f64 * p.cache_read / m,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_and_prefixed_names_find_their_family() {
        assert_eq!(price("claude-sonnet-4-5-20250929").unwrap().input, 3.0);
        assert_eq!(price("claude-opus-4-5").unwrap().output, 25.0);
        assert_eq!(price("claude-opus-4-1-20250805").unwrap().output, 75.0);
        assert_eq!(price("anthropic/claude-haiku-4-5").unwrap().input, 1.0);
        assert_eq!(price("gpt-4o-mini-2024-07-18").unwrap().input, 0.15);
        assert_eq!(price("gpt-4o-2024-08-06").unwrap().input, 2.50);
        assert_eq!(price("llama3.1:8b"), None);
    }

    #[test]
    fn cost_counts_every_kind_of_token() {
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cache_read_tokens: 1_000_000,
            cache_write_tokens: 200_000,
        };
        // 3 + 1.5 + 0.3 + 0.75
        let c = cost("claude-sonnet-4-5", &usage).unwrap();
        assert!((c - 5.55).abs() < 1e-9, "{c}");
        assert_eq!(cost("qwen2.5-coder", &usage), None);
    }
}
