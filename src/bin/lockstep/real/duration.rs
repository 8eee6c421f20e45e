//! Durations on the command line: a number and a unit, `500ms`, `2s`, `1.5s`, `5m`, `1h`.

use std::time::Duration;

/// Parses `text` as a duration (clap value parser). Errors name the rule and an example.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds_per_unit = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("{text:?}: expected a number and a unit of ms, s, m or h (e.g. 500ms, 30s)")),
    };
    let value: f64 = number.parse().map_err(|_| format!("{text:?}: {number:?} is not a number"))?;
    Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_their_units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn a_duration_without_a_known_unit_is_refused_with_the_rule() {
        for bad in ["30", "5x", "s", "1..2s", ""] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains("unit") || error.contains("not a number"), "{bad:?}: {error}");
        }
    }
}
