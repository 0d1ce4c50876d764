//! Shell blocks (`sh`, `console`): a reader of sh's words and commands, and every `hydrator`
//! command parsed by the real command line.

use clap::Parser;

use hydrator::cli::Cli;

use super::{all_blocks, assert_none, Block};

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

/// Splits one logical shell line into its simple commands, as sh would for what examples
/// hold: quotes, backslashes, `$VAR`, `${VAR}` and `$(…)` (whose own commands are returned
/// too), comments, `|`, `||`, `&&`, `;`, `&`, subshell parentheses, braces, redirections and
/// `NAME=value` prefixes. Expansions become [`EXPANSION`].
pub(super) fn shell_commands(line: &str) -> Result<Vec<Vec<String>>, String> {
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
pub(super) fn parse_cli(argv: &[String]) -> Result<(), String> {
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
