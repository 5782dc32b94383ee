//! Durations as users type them, for options and settings alike.

use std::time::Duration;

/// Parses a `--timeout` value: `30s`, `5m`, `1h30m`, `250ms`, or plain seconds.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("timeout must be positive, got {s:?}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// A shutdown's grace (`--grace`): a duration, `0` for none.
pub fn parse_grace(s: &str) -> Result<Duration, String> {
    match s.trim() {
        "0" => Ok(Duration::ZERO),
        s => parse_timeout(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_timeout("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_timeout("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_timeout("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_timeout("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("-3").is_err());
        assert!(parse_timeout("soon").is_err());
    }
}
