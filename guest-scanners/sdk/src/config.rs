//! Configuration from environment variables.
//!
//! Why: the host hands each guest its configuration only as WASI environment variables (no args,
//! no files), and a bad value must fail the scan with a message that names the variable, the
//! offending value and what is valid, because that message is all the operator sees in the host's
//! log. The `parse_*` functions take the value as an argument so they can be unit-tested off wasm;
//! the `env_*` wrappers read the variable and call them.

use std::ops::RangeInclusive;

/// The value of environment variable `name`, or None when it is unset (or not UTF-8).
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Shortens `s` to at most `max` characters for an error message, marking the cut with `...`.
pub fn excerpt(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max.saturating_sub(3)).collect();
        format!("{cut}...")
    }
}

/// Reads an integer setting: `value` None (unset) gives `default`; anything that is not a
/// decimal integer within `range` is an error naming `name` and `value`.
pub fn parse_u32(
    name: &str,
    value: Option<&str>,
    default: u32,
    range: RangeInclusive<u32>,
) -> Result<u32, String> {
    let Some(raw) = value else {
        return Ok(default);
    };
    match raw.trim().parse::<u32>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "{name}={:?} is not valid: expected an integer from {} to {} (default {default})",
            excerpt(raw, 80),
            range.start(),
            range.end()
        )),
    }
}

/// [`parse_u32`] on the environment variable `name`.
pub fn env_u32(name: &str, default: u32, range: RangeInclusive<u32>) -> Result<u32, String> {
    parse_u32(name, env_var(name).as_deref(), default, range)
}

/// Reads a setting that must be one of `valid` (unset gives `default`); the error names `name`,
/// `value` and every valid choice.
pub fn parse_choice<'a>(
    name: &str,
    value: Option<&str>,
    default: &'a str,
    valid: &[&'a str],
) -> Result<&'a str, String> {
    let Some(raw) = value else {
        return Ok(default);
    };
    valid
        .iter()
        .copied()
        .find(|v| *v == raw.trim())
        .ok_or_else(|| {
            format!(
                "{name}={:?} is not valid: expected one of {} (default {default})",
                excerpt(raw, 80),
                valid.join(", ")
            )
        })
}

/// [`parse_choice`] on the environment variable `name`.
pub fn env_choice<'a>(name: &str, default: &'a str, valid: &[&'a str]) -> Result<&'a str, String> {
    parse_choice(name, env_var(name).as_deref(), default, valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u32_defaults_and_ranges() {
        assert_eq!(parse_u32("SLOTS", None, 110, 1..=1000), Ok(110));
        assert_eq!(parse_u32("SLOTS", Some(" 7 "), 110, 1..=1000), Ok(7));
        let e = parse_u32("SLOTS", Some("abc"), 110, 1..=1000).unwrap_err();
        assert!(e.contains("SLOTS=\"abc\""), "{e}");
        assert!(e.contains("from 1 to 1000"), "{e}");
        assert!(parse_u32("SLOTS", Some("0"), 110, 1..=1000).is_err());
        assert!(parse_u32("SLOTS", Some("-1"), 110, 1..=1000).is_err());
        assert!(parse_u32("SLOTS", Some(""), 110, 1..=1000).is_err());
    }

    #[test]
    fn choices() {
        let valid = ["a", "b"];
        assert_eq!(parse_choice("M", None, "a", &valid), Ok("a"));
        assert_eq!(parse_choice("M", Some("b"), "a", &valid), Ok("b"));
        let e = parse_choice("M", Some("c"), "a", &valid).unwrap_err();
        assert!(e.contains("M=\"c\"") && e.contains("a, b"), "{e}");
    }

    #[test]
    fn excerpts() {
        assert_eq!(excerpt("short", 10), "short");
        assert_eq!(excerpt("0123456789abc", 8), "01234...");
    }
}
