//! docs/troubleshooting.md: each heading quotes a message that hydrator's sources print.

use std::path::Path;

use super::behaviour::spans;
use super::{assert_none, root};

/// Words of messages that come from dependencies (clap, hyper's status texts, toml), not from
/// hydrator's sources.
const DEPENDENCY_WORDS: &[&str] = &[
    "unexpected argument",
    "invalid value",
    "Not Found",
    "Unauthorized",
    "Forbidden",
];

/// All of hydrator's sources, with Rust's `\`-continued string lines joined as the compiler
/// joins them.
fn source_text() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let mut lines = text.split("\\\n");
                out.push_str(lines.next().unwrap_or_default());
                for line in lines {
                    out.push_str(line.trim_start());
                }
            }
        }
    }
    let mut out = String::new();
    walk(&root().join("src"), &mut out);
    out
}

/// The literal pieces of a quoted message that hydrator's sources must hold: runs of two words
/// or more between placeholders (`…`, `KEY`, numbers, paths and URLs), brackets, quotes, `;`
/// and `:` (where messages are joined from parts).
fn message_fragments(message: &str) -> Vec<String> {
    let is_placeholder = |token: &str| {
        let bare = token.trim_matches(|c: char| !c.is_alphanumeric());
        token.contains('…')
            || token.contains("://")
            || token.starts_with('/')
            || bare.is_empty()
            || bare.chars().all(|c| c.is_ascii_digit() || c == '.')
            || bare
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    };
    let mut runs = vec![String::new()];
    for token in message.split_whitespace() {
        match is_placeholder(token) {
            true => runs.push(String::new()),
            false => {
                let run = runs.last_mut().unwrap();
                if !run.is_empty() {
                    run.push(' ');
                }
                run.push_str(token);
            }
        }
    }
    runs.iter()
        .flat_map(|run| run.split(['(', ')', '"', ';', ':']))
        .map(|piece| piece.trim_matches(|c: char| c.is_whitespace() || ",:.'".contains(c)))
        .filter(|piece| piece.split_whitespace().count() >= 2)
        .map(str::to_string)
        .collect()
}

/// docs/troubleshooting.md is keyed by the lines hydrator prints: each heading's quoted message
/// must still be made of words the sources print.
#[test]
fn troubleshooting_headings_quote_what_the_code_prints() {
    let sources = source_text();
    let text = std::fs::read_to_string(root().join("docs/troubleshooting.md")).unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (n, line) in text.lines().enumerate() {
        let Some(heading) = line.strip_prefix("### ") else {
            continue;
        };
        for message in spans(heading) {
            for fragment in message_fragments(&message) {
                checked += 1;
                let foreign = DEPENDENCY_WORDS.iter().any(|w| fragment.contains(w));
                if !foreign && !sources.contains(&fragment) {
                    problems.push(format!(
                        "docs/troubleshooting.md:{}: {fragment:?} is printed nowhere in src/",
                        n + 1
                    ));
                }
            }
        }
    }
    assert_none("troubleshooting headings", &problems);
    assert!(checked > 50, "only {checked} fragments checked");
}
