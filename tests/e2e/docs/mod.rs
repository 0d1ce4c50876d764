//! The documentation, checked against the code. Every fenced block of README.md and docs/*.md
//! is checked by its language: shell lines that run `hydrator` are parsed by the real command
//! line, catalogs (`toml`) are loaded by the real daemon, YAML is loaded and the arguments of
//! its hydrator containers parsed, JSON is parsed, and the documented report, READY, snapshot
//! and log line must have exactly the fields the binary writes. A block of any other language
//! fails: add the language to `LANGUAGES` with how it is checked, or tag the block `text` if it
//! is not meant to run. Links between the pages must resolve and the README must link every
//! page. The tables that state behaviour are run (filters, access denials in the exit codes,
//! metrics), and troubleshooting's headings must quote what the sources print. The behaviour
//! of a first run (empty selections, closed pipes, JSON logs, `warm`'s stdout, files not in the
//! source) is tested in `front_door.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::Value;

use hydrator::cli::Cli;

use crate::support::faults::{Fault, Rule};
use crate::support::{content, files, hydrator_command, temp_dest, Server};

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

/// Programs the examples run beside hydrator. Their lines are not run; a `hydrator` command
/// after their `--` (as in `kubectl exec … -- hydrator …`) is parsed.
const OTHER_COMMANDS: &[&str] = &[
    "base64",
    "bash",
    "cargo",
    "cat",
    "cd",
    "container/build.sh",
    "curl",
    "echo",
    "exit",
    "export",
    "head",
    "kubectl",
    "kustomize",
    "ls",
    "podman",
    "python3",
    "test",
];

/// What a `$VAR`, `${VAR}` or `$(…)` of an example stands for when it is parsed: a value every
/// option takes, numbers included.
const EXPANSION: &str = "1";

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

// ---------------------------------------------------------------------------------------------
// Shell

/// Splits one logical shell line into its simple commands, as sh would for what examples
/// hold: quotes, backslashes, `$VAR`, `${VAR}` and `$(…)` (whose own commands are returned
/// too), comments, `|`, `||`, `&&`, `;`, `&`, subshell parentheses, braces, redirections and
/// `NAME=value` prefixes. Expansions become [`EXPANSION`].
fn shell_commands(line: &str) -> Result<Vec<Vec<String>>, String> {
    let chars: Vec<char> = line.chars().collect();
    let mut commands: Vec<Vec<String>> = Vec::new();
    let mut nested: Vec<Vec<String>> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut redirect_target = false;
    let mut i = 0;
    let end_word = |word: &mut String,
                    in_word: &mut bool,
                    current: &mut Vec<String>,
                    redirect_target: &mut bool| {
        if *in_word {
            match *redirect_target {
                true => *redirect_target = false,
                false => current.push(word.clone()),
            }
        }
        word.clear();
        *in_word = false;
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => {
                end_word(&mut word, &mut in_word, &mut current, &mut redirect_target);
                i += 1;
            }
            '#' if !in_word => break,
            '\'' => {
                in_word = true;
                let close = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '\'')
                    .ok_or("an unclosed '")?;
                word.extend(&chars[i + 1..i + 1 + close]);
                i += close + 2;
            }
            '"' => {
                in_word = true;
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("an unclosed \"".into()),
                        Some('"') => break,
                        Some('\\') if matches!(chars.get(i + 1), Some('"' | '\\' | '$' | '`')) => {
                            word.push(chars[i + 1]);
                            i += 2;
                        }
                        Some('$') => i = expand(&chars, i, &mut word, &mut nested)?,
                        Some(&c) => {
                            word.push(c);
                            i += 1;
                        }
                    }
                }
                i += 1;
            }
            '\\' => {
                in_word = true;
                word.extend(chars.get(i + 1));
                i += 2;
            }
            '$' => {
                in_word = true;
                i = expand(&chars, i, &mut word, &mut nested)?;
            }
            '|' | ';' | '&' | '(' | ')' => {
                end_word(&mut word, &mut in_word, &mut current, &mut redirect_target);
                if !current.is_empty() {
                    commands.push(std::mem::take(&mut current));
                }
                i += 1;
                if matches!(c, '|' | '&') && chars.get(i) == Some(&c) {
                    i += 1;
                }
            }
            '>' | '<' => {
                // `2>&1`, `>&2`, `> file`, `>>file`: the redirection and its target go.
                if in_word && word.chars().all(|d| d.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                } else {
                    end_word(&mut word, &mut in_word, &mut current, &mut redirect_target);
                }
                i += 1;
                while matches!(chars.get(i), Some('>' | '&')) {
                    i += 1;
                }
                if chars[i - 1] == '&' && chars.get(i).is_some_and(char::is_ascii_digit) {
                    while chars.get(i).is_some_and(char::is_ascii_digit) {
                        i += 1;
                    }
                } else {
                    redirect_target = true;
                }
            }
            _ => {
                in_word = true;
                word.push(c);
                i += 1;
            }
        }
    }
    end_word(&mut word, &mut in_word, &mut current, &mut redirect_target);
    if redirect_target {
        return Err("a redirection without a target".into());
    }
    commands.push(current);
    commands.extend(nested);
    Ok(commands
        .into_iter()
        .map(|words| {
            let words = words
                .into_iter()
                .filter(|w| !matches!(w.as_str(), "{" | "}" | "!"));
            words.skip_while(|w| is_assignment(w)).collect::<Vec<_>>()
        })
        .filter(|words| !words.is_empty())
        .collect())
}

/// `$VAR`, `${VAR}` or `$(…)` at `chars[i]`: appends [`EXPANSION`] to `word`, adds the
/// commands of a `$(…)` to `nested`, and returns the index after it.
fn expand(
    chars: &[char],
    i: usize,
    word: &mut String,
    nested: &mut Vec<Vec<String>>,
) -> Result<usize, String> {
    let end = match chars.get(i + 1) {
        Some('(') => {
            let (mut depth, mut quote, mut j) = (0, None, i + 1);
            loop {
                let c = *chars.get(j).ok_or("an unclosed $(")?;
                match (quote, c) {
                    (Some(q), c) if c == q => quote = None,
                    (Some(_), _) => {}
                    (None, '\'' | '"') => quote = Some(c),
                    (None, '(') => depth += 1,
                    (None, ')') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            let inner: String = chars[i + 2..j].iter().collect();
            nested.extend(shell_commands(&inner)?);
            j + 1
        }
        Some('{') => {
            let close = chars[i..]
                .iter()
                .position(|&c| c == '}')
                .ok_or("an unclosed ${")?;
            i + close + 1
        }
        Some(c) if c.is_ascii_alphanumeric() || *c == '_' => {
            let mut j = i + 1;
            while chars
                .get(j)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                j += 1;
            }
            j
        }
        _ => {
            word.push('$');
            return Ok(i + 1);
        }
    };
    word.push_str(EXPANSION);
    Ok(end)
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Parses `argv` (starting with `hydrator`) with the real command line.
fn parse_cli(argv: &[String]) -> Result<(), String> {
    use clap::error::ErrorKind;
    match Cli::try_parse_from(argv) {
        Ok(_) => Ok(()),
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) =>
        {
            Ok(())
        }
        Err(err) => Err(err.to_string().trim_end().to_string()),
    }
}

/// Checks one simple command; returns whether it was hydrator's.
fn check_command(words: &[String], at: &str, problems: &mut Vec<String>) -> bool {
    let program = words[0].as_str();
    let hydrator = match program {
        "hydrator" => Some(words),
        _ if OTHER_COMMANDS.contains(&program) => words
            .iter()
            .position(|w| w == "--")
            .map(|dashes| &words[dashes + 1..])
            .filter(|rest| rest.first().is_some_and(|w| w == "hydrator")),
        _ => {
            problems.push(format!(
                "{at}: `{program}` is neither hydrator nor one of OTHER_COMMANDS"
            ));
            return false;
        }
    };
    let Some(argv) = hydrator else {
        return false;
    };
    if let Err(why) = parse_cli(argv) {
        problems.push(format!("{at}: `{}`:\n{why}", argv.join(" ")));
    }
    true
}

/// The logical lines of a shell block (`\` continuations joined) with their line numbers; in a
/// `console` block only the commands after `$ `.
fn shell_lines(block: &Block) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in block.text.lines().enumerate() {
        let number = block.line + 1 + n;
        let line = match (&pending, block.lang.as_str()) {
            (Some(_), _) | (None, "sh") => line,
            (None, _) => match line.strip_prefix("$ ") {
                Some(command) => command,
                None => continue,
            },
        };
        let (start, mut text) = pending.take().unwrap_or((number, String::new()));
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                text.push_str(head);
                text.push(' ');
                pending = Some((start, text));
            }
            None => {
                text.push_str(line);
                lines.push((start, text));
            }
        }
    }
    lines.extend(pending);
    lines
}

#[test]
fn shell_examples_parse_with_the_real_command_line() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for block in all_blocks(&mut problems) {
        if !matches!(block.lang.as_str(), "sh" | "console") {
            continue;
        }
        for (line, text) in shell_lines(&block) {
            let at = format!("{}:{line}", block.page);
            match shell_commands(&text) {
                Err(why) => problems.push(format!("{at}: cannot read the line ({why}): {text}")),
                Ok(commands) => {
                    for words in commands {
                        checked += usize::from(check_command(&words, &at, &mut problems));
                    }
                }
            }
        }
    }
    assert_none("shell examples", &problems);
    assert!(checked > 20, "only {checked} hydrator commands found");
}

#[test]
fn the_shell_reader_splits_commands_as_sh_does() {
    let commands = |line: &str| shell_commands(line).unwrap();
    assert_eq!(
        commands(r#"dir=$(hydrator warm x --wait) && ls "$dir" # listed"#),
        [vec!["ls", "1"], vec!["hydrator", "warm", "x", "--wait"]]
    );
    assert_eq!(
        commands(r#"test -f "$D/READY" || { echo "not READY" >&2; exit 1; }"#),
        [
            vec!["test", "-f", "1/READY"],
            vec!["echo", "not READY"],
            vec!["exit", "1"]
        ]
    );
    assert_eq!(
        commands("(cd k8s && kustomize edit) 2>&1 | tee log"),
        [
            vec!["cd", "k8s"],
            vec!["kustomize", "edit"],
            vec!["tee", "log"]
        ]
    );
    assert_eq!(
        commands(r"X='a b' hydrator sync --include '*.jpg' s3://b/\$x/ /d > out"),
        [vec![
            "hydrator",
            "sync",
            "--include",
            "*.jpg",
            "s3://b/$x/",
            "/d"
        ]]
    );
    assert!(shell_commands("echo 'open").is_err());
}

// ---------------------------------------------------------------------------------------------
// YAML

/// Every document of a YAML block, as JSON, loaded by PyYAML.
fn load_yaml(text: &str) -> Result<Value, String> {
    let script =
        "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin)), default=str))";
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3 (with PyYAML) is needed to load YAML blocks: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_string());
    }
    serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())
}

/// Whether a container image is hydrator's (`hydrator`, `registry/hydrator:tag`).
fn is_hydrator_image(image: &str) -> bool {
    let name = image.rsplit('/').next().unwrap_or(image);
    name.split([':', '@']).next() == Some("hydrator")
}

/// The command line of every container of the hydrator image in `value`.
fn hydrator_containers(value: &Value, out: &mut Vec<Result<Vec<String>, String>>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| hydrator_containers(v, out)),
        Value::Object(map) => {
            if map
                .get("image")
                .and_then(Value::as_str)
                .is_some_and(is_hydrator_image)
            {
                out.push(container_argv(map));
            }
            map.values().for_each(|v| hydrator_containers(v, out));
        }
        _ => {}
    }
}

/// A container's argv: its `command` (or the image's entrypoint, `hydrator`) and `args`.
fn container_argv(container: &serde_json::Map<String, Value>) -> Result<Vec<String>, String> {
    let strings = |field: &str| -> Result<Option<Vec<String>>, String> {
        match container.get(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or(format!("{field} holds {v}, not a string"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(format!("{field} is {other}, not a list")),
        }
    };
    let mut argv = match strings("command")? {
        None => vec!["hydrator".to_string()],
        Some(command) if command.first().is_some_and(|c| c.ends_with("hydrator")) => command,
        Some(command) => {
            return Err(format!(
                "command {command:?}: the image holds nothing but hydrator (no shell)"
            ))
        }
    };
    argv.extend(strings("args")?.unwrap_or_default());
    Ok(argv)
}

#[test]
fn yaml_examples_load_and_their_hydrator_containers_parse() {
    let mut problems = Vec::new();
    let (mut blocks, mut containers) = (0, 0);
    for block in all_blocks(&mut problems) {
        if block.lang != "yaml" {
            continue;
        }
        blocks += 1;
        let documents = match load_yaml(&block.text) {
            Ok(documents) => documents,
            Err(why) => {
                problems.push(format!("{}: not YAML: {why}", block.at()));
                continue;
            }
        };
        let mut found = Vec::new();
        hydrator_containers(&documents, &mut found);
        for argv in found {
            containers += 1;
            if let Err(why) = argv.and_then(|argv| {
                parse_cli(&argv).map_err(|why| format!("`{}`:\n{why}", argv.join(" ")))
            }) {
                problems.push(format!("{}: a hydrator container: {why}", block.at()));
            }
        }
    }
    assert_none("YAML examples", &problems);
    assert!(
        blocks > 5 && containers >= 3,
        "{blocks} blocks, {containers} containers"
    );
}

// ---------------------------------------------------------------------------------------------
// TOML: catalogs

/// Makes a documented catalog loadable here, and changes nothing else: absolute paths move
/// under `dir`, with the files the catalog reads made there (token files, a CA bundle, a
/// snapshot of the dataset's prefix); `tcp` becomes an ephemeral loopback port; the variables
/// named by `*_env` keys are set in `env`; `prewarm` is turned off, so the check does not wait
/// on an object store that is not there.
fn stand_in(
    table: &mut toml::Table,
    dir: &Path,
    env: &mut BTreeMap<String, String>,
    made: &mut u32,
) -> Result<(), String> {
    let source = table
        .get("source")
        .and_then(|s| s.as_str())
        .map(str::to_string);
    for (key, value) in table.iter_mut() {
        match value {
            toml::Value::Table(inner) => stand_in(inner, dir, env, made)?,
            toml::Value::Array(items) => {
                for item in items {
                    if let toml::Value::Table(inner) = item {
                        stand_in(inner, dir, env, made)?;
                    }
                }
            }
            toml::Value::String(text) if key == "tcp" => *text = "127.0.0.1:0".into(),
            toml::Value::String(name) if key.ends_with("_env") => {
                env.insert(name.clone(), "a-value-for-the-documentation".into());
            }
            toml::Value::Boolean(on) if key == "prewarm" => *on = false,
            toml::Value::String(text) if text.starts_with('/') => {
                let path = dir.join(text.trim_start_matches('/'));
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                match key.as_str() {
                    "token_file" | "file" => {
                        *made += 1;
                        std::fs::write(&path, format!("documentation-token-{made:04}\n")).unwrap();
                        use std::os::unix::fs::PermissionsExt;
                        let private = std::fs::Permissions::from_mode(0o600);
                        std::fs::set_permissions(&path, private).unwrap();
                    }
                    "ca_bundle" => std::fs::write(&path, self_signed_pem()).unwrap(),
                    "snapshot" => {
                        let source = source.as_deref().ok_or("a snapshot without a source")?;
                        std::fs::write(&path, empty_snapshot(source)).unwrap();
                    }
                    _ => {}
                }
                *text = path.to_str().unwrap().to_string();
            }
            _ => {}
        }
    }
    Ok(())
}

fn self_signed_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.self_signed(&key).unwrap().pem()
}

/// A valid snapshot file of `source` (`s3://BUCKET/PREFIX/`) with no objects.
fn empty_snapshot(source: &str) -> String {
    let rest = source.strip_prefix("s3://").unwrap_or(source);
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = match prefix.is_empty() || prefix.ends_with('/') {
        true => prefix.to_string(),
        false => format!("{prefix}/"),
    };
    serde_json::json!({
        "version": 1, "endpoint": null, "bucket": bucket, "prefix": prefix,
        "digest": blake3::Hasher::new().finalize().to_hex().to_string(),
        "objects": 0, "bytes": 0, "created_at": "2026-01-01T00:00:00Z", "entries": [],
    })
    .to_string()
}

/// Starts `hydrator daemon` on the catalog `text` (with [`stand_in`]'s changes) and stops it
/// once it is ready; `Err` with its log when it refuses the catalog or does not start.
fn load_catalog(text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut table: toml::Table = toml::from_str(text).map_err(|e| format!("not TOML: {e}"))?;
    let (mut env, mut made) = (BTreeMap::new(), 0);
    stand_in(&mut table, dir.path(), &mut env, &mut made)?;
    let config = dir.path().join("catalog.toml");
    std::fs::write(&config, toml::to_string(&table).unwrap()).unwrap();
    let log_path = dir.path().join("daemon.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_hydrator"));
    for (key, _) in std::env::vars() {
        if key.starts_with("AWS_") || key.starts_with("HYDRATOR_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .envs(&env)
        .arg("daemon")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("the daemon exited ({status}):\n{}", log()));
        }
        if log().contains("daemon ready") {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the daemon did not start within 30 s:\n{}", log()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    match status.success() {
        true => Ok(()),
        false => Err(format!("the daemon stopped with {status}:\n{}", log())),
    }
}

#[test]
fn toml_examples_are_catalogs_the_daemon_loads() {
    let mut problems = Vec::new();
    let mut catalogs = 0;
    for block in all_blocks(&mut problems) {
        if block.lang != "toml" {
            continue;
        }
        catalogs += 1;
        if let Err(why) = load_catalog(&block.text) {
            problems.push(format!("{}: {why}", block.at()));
        }
    }
    assert_none("catalog examples", &problems);
    assert!(catalogs > 0, "no catalog example found");
}

#[test]
fn a_broken_catalog_is_caught() {
    let catalog = "[cache]\nroot = \"/var/cache/hydrator\"\nquota = \"1GiB\"\n\
                   [listen]\nsocket = \"/run/hydrator/hydrator.sock\"\n";
    load_catalog(catalog).unwrap();
    let why = load_catalog(&format!("{catalog}admins = [\"token:csi\"]\n")).unwrap_err();
    assert!(why.contains("listen.admins \"token:csi\""), "{why}");
}

// ---------------------------------------------------------------------------------------------
// JSON, and what the binary really writes

/// The dotted paths of every field of `value` (`objects.listed`, `files[].path`).
fn shape(value: &Value) -> BTreeSet<String> {
    fn walk(value: &Value, at: &str, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    let here = match at.is_empty() {
                        true => key.clone(),
                        false => format!("{at}.{key}"),
                    };
                    out.insert(here.clone());
                    walk(value, &here, out);
                }
            }
            Value::Array(items) => {
                if let Some(first) = items.first() {
                    walk(first, &format!("{at}[]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(value, "", &mut out);
    out
}

/// What kind of documented output a JSON example is, if any.
fn kind_of(value: &Value) -> Option<&'static str> {
    /// Each kind, by the fields that tell it from the others (in this order).
    const KINDS: &[(&str, &[&str])] = &[
        ("the report", &["files", "dry_run"]),
        ("a snapshot file", &["entries", "digest"]),
        ("READY", &["digest", "completed_at"]),
        ("a JSON log line", &["fields", "level"]),
    ];
    KINDS
        .iter()
        .find(|(_, keys)| keys.iter().all(|key| value.get(key).is_some()))
        .map(|(kind, _)| *kind)
}

/// A sync's report, READY and summary log line, and a snapshot file, made by the binary.
fn real_outputs() -> BTreeMap<&'static str, Value> {
    let server = Server::local();
    let data = files(&[
        ("a.bin", content(71, 1000)),
        ("d/b.bin", content(72, 70_000)),
    ]);
    server.seed("documented/", &data);
    let (tmp, dest) = temp_dest();
    let run = server.sync("documented/", &dest, &["--log-format", "json"]);
    run.assert_code(0);
    let stderr = run.stderr();
    let lines: Vec<Value> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| {
                panic!("--log-format json wrote a line that is not JSON ({e}): {line}")
            })
        })
        .collect();
    let summary = lines
        .into_iter()
        .find(|line| line["fields"].get("result").is_some())
        .unwrap_or_else(|| panic!("no summary line on stderr:\n{stderr}"));
    let ready = std::fs::read(dest.join(".hydrator/READY")).unwrap();
    let snapshot = server.snapshot("documented/", &tmp.path().join("documented.lock"));
    BTreeMap::from([
        ("the report", run.report().clone()),
        ("READY", serde_json::from_slice(&ready).unwrap()),
        ("a snapshot file", snapshot),
        ("a JSON log line", summary),
    ])
}

#[test]
fn json_examples_parse_and_documented_outputs_have_the_real_fields() {
    let mut problems = Vec::new();
    let real = real_outputs();
    let mut documented: BTreeSet<&str> = BTreeSet::new();
    for block in all_blocks(&mut problems) {
        if block.lang != "json" {
            continue;
        }
        let value: Value = match serde_json::from_str(&block.text) {
            Ok(value) => value,
            Err(e) => {
                problems.push(format!("{}: not JSON: {e}", block.at()));
                continue;
            }
        };
        let Some(kind) = kind_of(&value) else {
            continue;
        };
        documented.insert(kind);
        let (shown, written) = (shape(&value), shape(&real[kind]));
        let missing: Vec<_> = written.difference(&shown).collect();
        let unknown: Vec<_> = shown.difference(&written).collect();
        if !missing.is_empty() || !unknown.is_empty() {
            problems.push(format!(
                "{}: {kind}: fields the binary writes and the example leaves out: {missing:?}; fields of the example the binary does not write: {unknown:?}",
                block.at()
            ));
        }
    }
    for kind in real.keys() {
        if !documented.contains(kind) {
            problems.push(format!("no JSON example documents {kind}"));
        }
    }
    assert_none("JSON examples", &problems);
}

// ---------------------------------------------------------------------------------------------
// Links

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

// ---------------------------------------------------------------------------------------------
// Behaviour the pages state in tables and prose

/// The rows of the Markdown table of `text` whose header row starts with `header`, header
/// first, as cells.
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = text.lines().skip_while(|line| !line.starts_with(header));
    let head = lines
        .next()
        .unwrap_or_else(|| panic!("no table {header:?}"));
    std::iter::once(head)
        .chain(lines.skip(1).take_while(|line| line.starts_with('|')))
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().to_string())
                .collect()
        })
        .collect()
}

/// The code spans of a table cell.
fn spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The paths a dry run with `filters` would download from `server`'s `filtering/` prefix.
fn selected(server: &Server, filters: &[String]) -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let output: Output = hydrator_command(&server.target)
        .arg("sync")
        .arg(format!("s3://{}/filtering/", server.target.bucket))
        .arg(dir.path().join("dest"))
        .args(["--endpoint-url", &server.target.endpoint])
        .args([
            "--dry-run",
            "--allow-empty",
            "--progress",
            "none",
            "--report",
        ])
        .arg(&report)
        .args(filters)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{filters:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| file["path"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_filtering_tables_hold() {
    let text = std::fs::read_to_string(root().join("docs/filtering.md")).unwrap();
    let globs = table(&text, "| glob |");
    let combinations = table(&text, "| options |");
    let columns: Vec<String> = combinations[0][1..].iter().flat_map(|c| spans(c)).collect();
    assert_eq!(
        columns.len(),
        combinations[0].len() - 1,
        "one path per column"
    );
    let mut paths: BTreeSet<String> = columns.iter().cloned().collect();
    for row in &globs[1..] {
        paths.extend(spans(&row[1]).into_iter().chain(spans(&row[2])));
    }
    // Listed only: a dry run fetches nothing, so `train` and `train/a.tar` can both be keys.
    let server = Server::local();
    let listing = paths
        .iter()
        .map(|path| (format!("filtering/{path}"), 5))
        .collect();
    server
        .faults
        .add(Rule::listing(Fault::InjectListing(listing)).times(usize::MAX));
    let mut problems = Vec::new();
    for row in &globs[1..] {
        let glob = &spans(&row[0])[0];
        let taken = selected(&server, &["--include".to_string(), glob.clone()]);
        for path in spans(&row[1]) {
            if !taken.contains(&path) {
                problems.push(format!("--include {glob:?} does not take {path:?}"));
            }
        }
        for path in spans(&row[2]) {
            if taken.contains(&path) {
                problems.push(format!("--include {glob:?} takes {path:?}"));
            }
        }
    }
    for row in &combinations[1..] {
        let filters = match spans(&row[0]).first() {
            None => vec![],
            Some(options) => shell_commands(options).unwrap().concat(),
        };
        let taken = selected(&server, &filters);
        for (path, cell) in columns.iter().zip(&row[1..]) {
            let expected = match cell.as_str() {
                "taken" => true,
                "left out" => false,
                other => panic!("a cell says {other:?}"),
            };
            if taken.contains(path) != expected {
                problems.push(format!("{filters:?}: {path:?} is not {cell}"));
            }
        }
    }
    assert_none("docs/filtering.md", &problems);
}

fn ready(dest: &Path) -> bool {
    dest.join(".hydrator/READY").exists()
}

/// The exit-code table: a 403 on a GET fails that object (1); a 403 on the listing is a
/// usage error (2).
#[test]
fn access_denied_exits_as_documented() {
    let server = Server::local();
    let data = files(&[
        ("open.bin", content(73, 2000)),
        ("closed.bin", content(74, 2000)),
    ]);
    server.seed("denied/", &data);
    let refuse = Rule {
        ranged_only: false,
        times: usize::MAX,
        ..Rule::get("denied/closed.bin", Fault::Status(403, "AccessDenied"))
    };
    server.faults.add(refuse);
    let (_tmp, dest) = temp_dest();
    let run = server.sync("denied/", &dest, &[]);
    run.assert_code(1);
    assert_eq!(run.report()["failures"][0]["key"], "denied/closed.bin");
    assert!(run.stderr().contains("access denied"), "{}", run.stderr());
    assert!(dest.join("open.bin").exists() && !ready(&dest));

    server.faults.clear();
    server
        .faults
        .add(Rule::listing(Fault::Status(403, "AccessDenied")).times(usize::MAX));
    let (_tmp, dest) = temp_dest();
    let run = server.sync("denied/", &dest, &[]);
    run.assert_code(2);
    assert!(run.stderr().contains("access denied"), "{}", run.stderr());
}

/// docs/daemon.md, "Metrics": every family a real daemon exposes, with its type and help text,
/// is in the table; a family of the table that it does not expose yet has labels and no series
/// (no eviction yet), as the page says.
#[test]
fn the_metrics_table_is_what_the_daemon_exposes() {
    use crate::support::daemon::{catalog, dataset, Daemon};
    let text = std::fs::read_to_string(root().join("docs/daemon.md")).unwrap();
    let rows = table(&text, "| name | type |");
    let documented: BTreeMap<(String, String, String), bool> = rows[1..]
        .iter()
        .map(|row| {
            let family = (spans(&row[0])[0].clone(), row[1].clone(), row[3].clone());
            (family, !row[2].is_empty())
        })
        .collect();
    let server = Server::local();
    server.seed("metrics/", &files(&[("m.bin", content(77, 5000))]));
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("m", "metrics/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &catalog);
    let warmed = daemon.warm("m", &[]);
    assert!(warmed.status.success(), "{warmed:?}\n{}", daemon.log());
    let (code, exposition) = daemon.request("GET", "/metrics", "");
    assert_eq!(code, 200, "{exposition}");
    let header = |kind: &str| -> BTreeMap<String, String> {
        exposition
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("# {kind} ")))
            .filter_map(|rest| rest.split_once(' '))
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    };
    let (helps, types) = (header("HELP"), header("TYPE"));
    let exposed: BTreeSet<(String, String, String)> = types
        .iter()
        .map(|(name, kind)| (name.clone(), kind.clone(), helps[name].clone()))
        .collect();
    let undocumented: Vec<_> = exposed
        .iter()
        .filter(|family| !documented.contains_key(*family))
        .collect();
    let unexposed: Vec<_> = documented
        .iter()
        .filter(|(family, labelled)| !exposed.contains(*family) && !**labelled)
        .map(|(family, _)| family)
        .collect();
    assert!(
        undocumented.is_empty() && unexposed.is_empty(),
        "exposed, not documented as such: {undocumented:#?}\n\
         documented without labels, not exposed as such: {unexposed:#?}\n{exposition}"
    );
}

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

/// The Secret names of every `secretKeyRef` in `value`.
fn secret_refs(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| secret_refs(v, out)),
        Value::Object(map) => {
            if let Some(name) = map.get("secretKeyRef").and_then(|r| r["name"].as_str()) {
                out.insert(name.to_string());
            }
            map.values().for_each(|v| secret_refs(v, out));
        }
        _ => {}
    }
}

/// One name for each Secret: the examples of the pages name only Secrets that `k8s/` uses.
#[test]
fn the_pages_name_the_secrets_k8s_uses() {
    fn manifests(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                manifests(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    manifests(&root().join("k8s"), &mut files);
    let mut used = BTreeSet::new();
    for file in files {
        let documents = load_yaml(&std::fs::read_to_string(&file).unwrap())
            .unwrap_or_else(|why| panic!("{}: {why}", file.display()));
        secret_refs(&documents, &mut used);
    }
    assert!(!used.is_empty(), "k8s/ names no Secret");
    let mut problems = Vec::new();
    for block in all_blocks(&mut problems) {
        if block.lang != "yaml" {
            continue;
        }
        let mut named = BTreeSet::new();
        secret_refs(&load_yaml(&block.text).unwrap(), &mut named);
        for name in named.difference(&used) {
            problems.push(format!(
                "{}: the Secret {name:?}, which k8s/ does not use ({used:?})",
                block.at()
            ));
        }
    }
    assert_none("Secret names", &problems);
}
