//! Durations as people write them, in scenario files and on the command line: one or more `<number><unit>` parts
//! (`"500ms"`, `"1.5s"`, `"1m30s"`), exact to the nanosecond; and as people read them in messages ([`format()`]:
//! `21.311s`, not `Duration`'s Debug `21.311136s`).

use std::time::Duration;

/// As [`parse`], refusing zero: for a pause between polls, which at zero would spin (`submit --poll-interval`).
///
/// # Errors
/// As [`parse`], and a zero duration.
pub fn parse_nonzero(text: &str) -> Result<Duration, String> {
    match parse(text)? {
        span if span.is_zero() => Err(format!("\"{text}\" must not be zero")),
        span => Ok(span),
    }
}

/// Parses a duration: one or more `<number><unit>` parts (`"90s"`, `"1.5s"`, `"1m30s"`), units `us`, `ms`,
/// `s`, `m`, `h`. Exact to the nanosecond.
///
/// # Errors
/// A message naming the text and the accepted form.
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!(
            "invalid duration \"{text}\": {why}; write a number and a unit (us, ms, s, m, h), e.g. \"500ms\", \"90s\", \"2m\""
        )
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() {
            return Err(match rest.chars().next() {
                Some('-') => bad("a duration cannot be negative"),
                Some(c) if c.is_ascii_alphabetic() => bad("expected a number before the unit"),
                Some(c) => bad(&format!("unexpected {c:?}")),
                None => bad("it is empty"),
            });
        }
        let after = after.trim_start();
        let unit_len = after.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "us" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad("a number without a unit")),
            _ => return Err(bad(&format!("unknown unit \"{unit}\""))),
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let digits_ok = |part: &str| part.chars().all(|c| c.is_ascii_digit());
        if whole.is_empty() || number.ends_with('.') || !digits_ok(fraction) || fraction.len() > 9 {
            return Err(bad("expected a number before the unit"));
        }
        let whole: u128 = whole.parse().map_err(|_| bad("the number is too large"))?;
        let fraction_nanos = if fraction.is_empty() {
            0
        } else {
            fraction.parse::<u128>().expect("digits") * unit_nanos / 10u128.pow(fraction.len() as u32)
        };
        total = whole
            .checked_mul(unit_nanos)
            .and_then(|nanos| nanos.checked_add(fraction_nanos))
            .and_then(|nanos| nanos.checked_add(total))
            .ok_or_else(|| bad("too large"))?;
        rest = after.trim_start();
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| bad("too large"))?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Formats a duration for people to read, in a form [`parse`] reads back: seconds to the millisecond from one
/// second up (`2s`, `1.5s`, `21.311s`), milliseconds to a tenth below that (`500ms`, `51.5ms`), microseconds to
/// a tenth below a millisecond (`250us`, `0.5us`), and `0s`. Digits past those are cut, not rounded, so a span
/// never reads as longer than it is; trailing zeros are dropped. Whole values print as `Duration`'s Debug does
/// (`60s`, `500ms`), so messages about round spans read the same.
pub fn format(span: Duration) -> String {
    // (whole units, tenths of the unit's 1/10^decimals, unit): seconds keep 3 decimals, ms and us keep 1.
    let nanos = span.as_nanos();
    let (value, scale, unit) = if nanos >= 1_000_000_000 {
        (nanos / 1_000_000, 1_000, "s")
    } else if nanos >= 1_000_000 {
        (nanos / 100_000, 10, "ms")
    } else if nanos > 0 {
        (nanos / 100, 10, "us")
    } else {
        return "0s".to_string();
    };
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return format!("{whole}{unit}");
    }
    let width = scale.ilog10() as usize;
    let digits = format!("{fraction:0width$}");
    format!("{whole}.{}{unit}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonzero_duration_refuses_zero_only() {
        assert_eq!(parse_nonzero("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_nonzero("0s").unwrap_err(), "\"0s\" must not be zero");
        assert!(parse_nonzero("abc").unwrap_err().contains("invalid duration"));
    }

    #[test]
    fn durations_read_with_their_units_exactly() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
    }

    #[test]
    fn a_duration_without_a_number_and_a_known_unit_is_refused_with_the_rule() {
        for bad in ["30", "5x", "s", "1..2s", "", "-2s", "1.s", ".5s", "1.2.3s", "99999999999999999999999h"] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains("write a number and a unit"), "{bad:?}: {error}");
            assert!(error.contains(&format!("\"{bad}\"")), "the message quotes the text: {error}");
        }
        assert!(parse("-2s").unwrap_err().contains("cannot be negative"));
    }

    #[test]
    fn durations_format_as_people_read_them_and_parse_back() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(60), "60s"),
            (Duration::from_secs(3600), "3600s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_nanos(21_311_136_000), "21.311s"),
            (Duration::from_nanos(51_545_375), "51.5ms"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_nanos(500), "0.5us"),
            (Duration::from_nanos(1_000_999_999), "1s"),
            (Duration::from_nanos(1_020_000_000), "1.02s"),
        ];
        for (span, text) in cases {
            assert_eq!(format(span), text, "{span:?}");
            let back = parse(text).unwrap_or_else(|error| panic!("{text}: {error}"));
            assert!(back <= span, "{text} reads back as {back:?}, longer than {span:?}");
        }
        for span in [Duration::from_secs(2), Duration::from_millis(500)] {
            assert_eq!(format(span), format!("{span:?}"), "a whole value prints as Debug does");
        }
    }
}
