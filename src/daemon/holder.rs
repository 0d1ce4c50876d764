//! Lease holder names. A holder is shown in the lease list, the state file and the logs, and
//! compared byte for byte, so it must read as what it is: a name that holds an invisible or a
//! reordering character could pose as another holder, or hide part of a log line.
//!
//! The rule is by Unicode general category (`unicode-general-category`, kept up to date with
//! the standard) rather than a list of code points written here: every control (Cc), every
//! format character (Cf: the bidi marks, embeddings, overrides and isolates, the zero-width
//! space, joiners and word joiner, the byte order mark, soft hyphens, the invisible tag
//! characters), the line and paragraph separators (Zl, Zp), surrogates, private-use and
//! unassigned code points (a character assigned later may be a format character) are refused.

use unicode_general_category::{get_general_category, GeneralCategory};

/// Longest holder name in bytes (a pod UID is 36 characters).
pub(crate) const MAX_LEN: usize = 253;

/// Why a holder name is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadHolder {
    #[error("a lease holder is 1 to {MAX_LEN} bytes, not {0}")]
    Length(usize),
    #[error(
        "a lease holder is printable characters: U+{:04X} at byte {at} is a control, format, \
         separator, private-use or unassigned character",
        u32::from(*.character)
    )]
    Unprintable { character: char, at: usize },
}

/// Checks a holder name.
pub(crate) fn check(holder: &str) -> Result<(), BadHolder> {
    if holder.is_empty() || holder.len() > MAX_LEN {
        return Err(BadHolder::Length(holder.len()));
    }
    match holder.char_indices().find(|&(_, c)| !printable(c)) {
        Some((at, character)) => Err(BadHolder::Unprintable { character, at }),
        None => Ok(()),
    }
}

fn printable(c: char) -> bool {
    use GeneralCategory::*;
    !matches!(
        get_general_category(c),
        Control | Format | LineSeparator | ParagraphSeparator | Surrogate | PrivateUse | Unassigned
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_pods_jobs_and_people_pass() {
        for name in [
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "job-7:vol-1",
            "équipe été",
            "研究-3",
            "a",
        ] {
            assert_eq!(check(name), Ok(()), "{name}");
        }
        assert_eq!(check(&"x".repeat(MAX_LEN)), Ok(()));
        assert_eq!(check(""), Err(BadHolder::Length(0)));
        assert_eq!(check(&"x".repeat(MAX_LEN + 1)), Err(BadHolder::Length(254)));
    }

    #[test]
    fn every_format_bidi_and_zero_width_character_is_refused() {
        let hidden = [
            '\u{00AD}',  // soft hyphen
            '\u{061C}',  // Arabic letter mark (bidi)
            '\u{180E}',  // Mongolian vowel separator
            '\u{200B}',  // zero-width space
            '\u{200C}',  // zero-width non-joiner
            '\u{200D}',  // zero-width joiner
            '\u{200E}',  // left-to-right mark
            '\u{202E}',  // right-to-left override
            '\u{2028}',  // line separator
            '\u{2029}',  // paragraph separator
            '\u{2060}',  // word joiner
            '\u{2066}',  // left-to-right isolate
            '\u{206A}',  // inhibit symmetric swapping
            '\u{FEFF}',  // byte order mark
            '\u{FFF9}',  // interlinear annotation anchor
            '\u{110BD}', // Kaithi number sign
            '\u{1D173}', // musical symbol begin beam
            '\u{E0001}', // language tag
            '\u{E0041}', // tag latin capital letter A (invisible)
            '\u{E000}',  // private use
            '\u{0007}',  // bell
            '\u{0378}',  // unassigned
        ];
        for c in hidden {
            let name = format!("pod{c}x");
            assert_eq!(
                check(&name),
                Err(BadHolder::Unprintable {
                    character: c,
                    at: 3
                }),
                "U+{:04X}",
                u32::from(c)
            );
        }
        let message = check("a\u{202E}b").unwrap_err().to_string();
        assert!(message.contains("U+202E at byte 1"), "{message}");
    }
}
