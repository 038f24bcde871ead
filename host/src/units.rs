//! Parsing the quantities operators write: memory sizes and durations.

use std::time::Duration;

/// A malformed quantity; the message says what would be valid.
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    #[error(
        "{value:?} is not a memory size: use bytes or a number with Ki, Mi, Gi (or K, M, G), e.g. 64Mi"
    )]
    /// Not a size (`64Mi`, `512M`, bytes).
    Size {
        /// The offending value, as given.
        value: String,
    },
    #[error("{value:?} is not a duration: use a number with a unit, e.g. 500ms, 5s, 1m")]
    /// Not a duration (`5s`, `500ms`).
    Duration {
        /// The offending value, as given.
        value: String,
    },
}

/// Parses a Kubernetes-style memory quantity ("64Mi", "1G", "4096") into bytes.
pub fn parse_size(value: &str) -> Result<u64, UnitError> {
    let err = || UnitError::Size {
        value: value.to_string(),
    };
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, suffix) = v.split_at(split);
    let n: u64 = digits.parse().map_err(|_| err())?;
    let mult: u64 = match suffix {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(err()),
    };
    n.checked_mul(mult).ok_or_else(err)
}

/// Parses a duration with a unit ("500ms", "5s", "1m 30s").
pub fn parse_duration(value: &str) -> Result<Duration, UnitError> {
    humantime::parse_duration(value.trim()).map_err(|_| UnitError::Duration {
        value: value.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "Mi", "64MB", "-1", "1.5Gi", "99999999999999999999Gi"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
