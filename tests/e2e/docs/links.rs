//! Links between the pages resolve, anchors included, and the README links every page.

use std::collections::BTreeSet;
use std::path::Path;

use super::{assert_none, pages, parse_page, Page};

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(path: &Path) -> BTreeSet<String> {
    let page = Page {
        name: path.display().to_string(),
        path: path.to_path_buf(),
        text: std::fs::read_to_string(path).unwrap(),
    };
    let (_, prose) = parse_page(&page, &mut Vec::new());
    prose
        .iter()
        .filter_map(|(_, line)| line.strip_prefix('#'))
        .map(|heading| slug(heading.trim_start_matches('#')))
        .collect()
}

/// The targets of the inline links `[text](target)` of a line, outside code spans.
fn link_targets(line: &str) -> Vec<String> {
    let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    prose
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_string()))
        .collect()
}

#[test]
fn links_between_pages_resolve_and_the_readme_links_every_page() {
    let mut problems = Vec::new();
    let pages = pages();
    let mut from_readme = BTreeSet::new();
    for page in &pages {
        let (_, prose) = parse_page(page, &mut problems);
        let dir = page.path.parent().unwrap();
        for (line, text) in prose {
            for target in link_targets(&text) {
                if target.starts_with("http://") || target.starts_with("https://") {
                    continue;
                }
                let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let path = match file.is_empty() {
                    true => page.path.clone(),
                    false => dir.join(file),
                };
                let at = format!("{}:{line}: ({target})", page.name);
                if !path.exists() {
                    problems.push(format!("{at}: no such file"));
                    continue;
                }
                if page.name == "README.md" {
                    if let Ok(path) = path.canonicalize() {
                        from_readme.insert(path);
                    }
                }
                let markdown = path.extension().is_some_and(|e| e == "md");
                if !anchor.is_empty() && markdown && !anchors(&path).contains(anchor) {
                    problems.push(format!("{at}: no heading with the anchor #{anchor}"));
                }
            }
        }
    }
    for page in pages.iter().filter(|p| p.name != "README.md") {
        if !from_readme.contains(&page.path.canonicalize().unwrap()) {
            problems.push(format!("README.md does not link {}", page.name));
        }
    }
    assert_none("links", &problems);
}
