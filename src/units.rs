//! Units and clocks: byte sizes for people (printed and parsed) and timestamps.

use std::time::SystemTime;

/// `1536` → `1.5 KiB`.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Nanoseconds since the Unix epoch (0 before it).
pub(crate) fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Now, as RFC 3339.
pub(crate) fn now_rfc3339() -> String {
    aws_smithy_types::DateTime::from(std::time::SystemTime::now())
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .unwrap_or_default()
}

/// A size that [`parse_size`] does not understand.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SizeError {
    #[error("{0:?} is not a size (examples: 8MiB, 16M, 1048576)")]
    NotASize(String),
    #[error("unknown size unit {0:?} (use KiB, MiB or GiB)")]
    UnknownUnit(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Parses sizes such as `8388608`, `8MiB`, `8M`, `1GiB`.
pub(crate) fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: u64 = number
        .parse()
        .map_err(|_| SizeError::NotASize(text.into()))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        other => return Err(SizeError::UnknownUnit(other.into())),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| SizeError::TooLarge(text.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(
            parse_size("8XB").unwrap_err().to_string(),
            "unknown size unit \"XB\" (use KiB, MiB or GiB)"
        );
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
