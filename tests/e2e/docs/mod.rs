//! The documentation, checked against the code. Every fenced block of README.md and docs/*.md
//! is checked by its language: shell lines that run `hydrator` are parsed by the real command
//! line (`shell`), catalogs (`toml`) are loaded by the real daemon (`catalogs`), YAML is loaded
//! and the arguments of its hydrator containers parsed (`yaml`), JSON is parsed, and the
//! documented report, READY, snapshot and log line must have exactly the fields the binary
//! writes (`outputs`). A block of any other language fails: add the language to `LANGUAGES`
//! with how it is checked, or tag the block `text` if it is not meant to run. Links between the
//! pages must resolve and the README must link every page (`links`). The tables that state
//! behaviour are run (filters, access denials in the exit codes, metrics: `behaviour`), and
//! troubleshooting's headings must quote what the sources print (`troubleshooting`). The
//! behaviour of a first run (empty selections, closed pipes, JSON logs, `warm`'s stdout, files
//! not in the source) is tested in `tests/e2e/front_door.rs`.
//!
//! This module holds the model of the pages (pages, their fenced blocks, their prose) that the
//! others check.

use std::path::{Path, PathBuf};

mod behaviour;
mod catalogs;
mod claims;
mod links;
mod outputs;
mod shell;
mod troubleshooting;
mod yaml;

/// The languages a block may be tagged with, and how each is checked.
const LANGUAGES: &[(&str, &str)] = &[
    (
        "sh",
        "each command: `hydrator` parsed by the real CLI, the others named in OTHER_COMMANDS",
    ),
    (
        "console",
        "as `sh`, for the lines after `$ `; the other lines are output",
    ),
    ("toml", "a catalog, loaded by `hydrator daemon`"),
    (
        "yaml",
        "loaded; the containers of the hydrator image have their arguments parsed",
    ),
    (
        "json",
        "parsed; the report, READY, snapshot and log line compared with real ones",
    ),
    ("text", "not run: synopses, sample output and diagrams"),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A page of the documentation.
struct Page {
    /// Relative to the repository.
    name: String,
    path: PathBuf,
    text: String,
}

/// README.md and every page in docs/.
fn pages() -> Vec<Page> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "docs/ holds no page");
    paths.insert(0, root().join("README.md"));
    paths
        .into_iter()
        .map(|path| Page {
            name: path
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            text: std::fs::read_to_string(&path).unwrap(),
            path,
        })
        .collect()
}

/// A fenced code block.
struct Block {
    page: String,
    /// The line of the opening fence (1-based).
    line: usize,
    lang: String,
    text: String,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{} ({})", self.page, self.line, self.lang)
    }
}

/// The fenced blocks of `page` (``` or ~~~, indented ones in lists included), and the lines
/// outside them; an unclosed fence is a problem.
fn parse_page(page: &Page, problems: &mut Vec<String>) -> (Vec<Block>, Vec<(usize, String)>) {
    let lines: Vec<&str> = page.text.lines().collect();
    let (mut blocks, mut prose) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let fence = trimmed.chars().next().filter(|c| matches!(c, '`' | '~'));
        let width = fence.map_or(0, |f| trimmed.chars().take_while(|&c| c == f).count());
        let Some(fence) = fence.filter(|_| width >= 3) else {
            prose.push((i + 1, line.to_string()));
            i += 1;
            continue;
        };
        let lang = trimmed[width..].split_whitespace().next().unwrap_or("");
        let opening = i + 1;
        let mut body = Vec::new();
        i += 1;
        loop {
            let Some(line) = lines.get(i) else {
                problems.push(format!(
                    "{}:{opening}: the fence is never closed",
                    page.name
                ));
                break;
            };
            let t = line.trim();
            if t.chars().take_while(|&c| c == fence).count() >= width
                && t.chars().all(|c| c == fence)
            {
                break;
            }
            let spaces = line.len() - line.trim_start_matches(' ').len();
            body.push(&line[spaces.min(indent)..]);
            i += 1;
        }
        blocks.push(Block {
            page: page.name.clone(),
            line: opening,
            lang: lang.to_string(),
            text: body.join("\n") + "\n",
        });
        i += 1;
    }
    (blocks, prose)
}

fn all_blocks(problems: &mut Vec<String>) -> Vec<Block> {
    pages()
        .iter()
        .flat_map(|page| parse_page(page, problems).0)
        .collect()
}

/// Every `.yaml` file under `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files.sort();
    files
}

fn assert_none(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problems:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

#[test]
fn every_block_has_a_checked_language() {
    let mut problems = Vec::new();
    let blocks = all_blocks(&mut problems);
    assert!(blocks.len() > 20, "only {} blocks found", blocks.len());
    let known: Vec<&str> = LANGUAGES.iter().map(|(lang, _)| *lang).collect();
    for block in &blocks {
        if block.lang.is_empty() {
            problems.push(format!(
                "{}: an untagged block: tag it with one of {known:?}",
                block.at()
            ));
        } else if !known.contains(&block.lang.as_str()) {
            problems.push(format!(
                "{}: no check for blocks tagged {:?}: use one of {known:?}, or add the tag to LANGUAGES with its check",
                block.at(),
                block.lang
            ));
        }
    }
    assert_none("blocks", &problems);
}
