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

/// The forms [`parse_size`] takes, for its error messages and the docs.
pub(crate) const SIZE_FORMS: &str = "a number of bytes (1048576), binary units Ki Mi Gi Ti Pi \
(also KiB, MiB, ..., and K M G T P: 1024-based as in dd and rclone) or decimal units kB MB GB TB PB \
(1000-based, as MinIO writes them), fractions allowed (1.5GiB, 500Mi, 10GB)";

/// Unix seconds as RFC 3339 in UTC (`2026-12-01T09:30:00Z`).
pub(crate) fn rfc3339_from_unix(seconds: u64) -> String {
    let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
    aws_smithy_types::DateTime::from_secs(seconds)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .unwrap_or_else(|_| format!("unix time {seconds}"))
}

/// A size that [`parse_size`] does not understand.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SizeError {
    #[error("{0:?} is not a size: expected {SIZE_FORMS}")]
    NotASize(String),
    #[error("unknown size unit {unit:?} in {text:?}: expected {SIZE_FORMS}")]
    UnknownUnit { text: String, unit: String },
    #[error("{0:?} is too large (the largest size is 16 EiB)")]
    TooLarge(String),
}

/// Bytes per unit, by the unit's name in lower case: binary for `Ki`, `KiB` and the single
/// letters (as dd, rclone and hydrator's earlier releases read `16M`), decimal for `kB`, `MB`...
/// (as MinIO and most disk vendors write them). Kubernetes' own `M` and `G` are decimal: its
/// users write `Mi` and `Gi`, which mean the same here.
fn unit_bytes(unit: &str) -> Option<u64> {
    const K: u64 = 1024;
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => K,
        "m" | "mi" | "mib" => K.pow(2),
        "g" | "gi" | "gib" => K.pow(3),
        "t" | "ti" | "tib" => K.pow(4),
        "p" | "pi" | "pib" => K.pow(5),
        "kb" => 1000,
        "mb" => 1000u64.pow(2),
        "gb" => 1000u64.pow(3),
        "tb" => 1000u64.pow(4),
        "pb" => 1000u64.pow(5),
        _ => return None,
    })
}

/// Parses sizes as people write them: `8388608`, `8MiB`, `8Mi`, `8M`, `1.5GiB`, `10GB`,
/// `500 kB` (see [`SIZE_FORMS`]). A fraction that does not come to a whole byte is rounded
/// down.
pub(crate) fn parse_size(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    let number_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let fraction = fraction.trim_end_matches('0');
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let not_a_size = || SizeError::NotASize(text.into());
    if whole.is_empty() || !all_digits(fraction) || number.ends_with('.') {
        return Err(not_a_size());
    }
    let unit = unit.trim();
    let per_unit = unit_bytes(unit).ok_or_else(|| SizeError::UnknownUnit {
        text: text.into(),
        unit: unit.into(),
    })?;
    let too_large = || SizeError::TooLarge(text.into());
    // digits × unit ÷ 10^decimals, in 128 bits: exact for any size that fits 64.
    let digits: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| too_large())?;
    let scale = 10u128
        .checked_pow(fraction.len() as u32)
        .ok_or_else(too_large)?;
    let bytes = digits
        .checked_mul(u128::from(per_unit))
        .ok_or_else(too_large)?
        / scale;
    u64::try_from(bytes).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_as_people_write_them() {
        let cases: [(&str, u64); 22] = [
            ("1048576", 1 << 20),
            ("8MiB", 8 << 20),
            ("8M", 8 << 20),
            ("16m", 16 << 20),
            ("2G", 2 << 30),
            ("4k", 4 << 10),
            // Kubernetes.
            ("512Ki", 512 << 10),
            ("500Mi", 500 << 20),
            ("10Gi", 10 << 30),
            ("2Ti", 2 << 40),
            ("1TiB", 1 << 40),
            ("1PiB", 1 << 50),
            // MinIO: decimal.
            ("100kB", 100_000),
            ("100KB", 100_000),
            ("250MB", 250_000_000),
            ("10GB", 10_000_000_000),
            ("3TB", 3_000_000_000_000),
            // Fractions, spaces, any case.
            ("1.5GiB", 3 << 29),
            ("0.5Mi", 1 << 19),
            ("2.5 GB", 2_500_000_000),
            (" 10 gib ", 10 << 30),
            ("1.0000000001B", 1),
        ];
        for (text, bytes) in cases {
            assert_eq!(parse_size(text).unwrap(), bytes, "{text}");
        }
    }

    #[test]
    fn a_size_it_does_not_take_names_the_forms_it_does() {
        let unit = parse_size("8XB").unwrap_err().to_string();
        assert!(
            unit.starts_with("unknown size unit \"XB\" in \"8XB\": expected a number of bytes"),
            "{unit}"
        );
        for form in ["Gi", "GiB", "GB", "kB", "1.5GiB"] {
            assert!(unit.contains(form), "{form}: {unit}");
        }
        for bad in [
            "MiB", "", "-1", "1.", ".5G", "1..5G", "1.5.5G", "ten", "1e9",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            parse_size("16EiB"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_size("16384Pi"), Err(SizeError::TooLarge(_))));
        assert!(matches!(
            parse_size("99999999999999999999999999999999999999999"),
            Err(SizeError::TooLarge(_))
        ));
        assert_eq!(
            parse_size("1.50000000000000000000000000000000000000000KiB").unwrap(),
            1536
        );
    }

    #[test]
    fn dates_from_unix_seconds() {
        assert_eq!(rfc3339_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_from_unix(1_764_714_341), "2025-12-02T22:25:41Z");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
