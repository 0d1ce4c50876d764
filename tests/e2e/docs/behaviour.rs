//! Behaviour the pages state in tables, run against a server: the filtering tables, access
//! denials in the exit codes, and the daemon's metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Output;

use serde_json::Value;

use crate::support::faults::{Fault, Rule};
use crate::support::{content, files, has_ready, hydrator_command, temp_dest, Server};

use super::shell::shell_commands;
use super::{assert_none, root};

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
pub(super) fn spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The paths a dry run with `filters` takes from `server`'s `filtering/` prefix: those it would
/// download, and those it refuses only because a file of the listing holds their directory
/// (`tmp/a` beside `tmp`), which the filters took all the same.
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
    let files = report["files"].as_array().unwrap().iter();
    let placed_below_a_file = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|failure| failure["reason"].as_str().unwrap().contains("key conflict"));
    files
        .map(|file| file["path"].as_str().unwrap().to_string())
        .chain(placed_below_a_file.map(|failure| {
            let key = failure["key"].as_str().unwrap();
            key.strip_prefix("filtering/").unwrap().to_string()
        }))
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
    // Listed only: a dry run fetches nothing, so `train` and `train/a.tar` can both be keys (the
    // second is refused as below a file, after the filters took it).
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
    assert!(dest.join("open.bin").exists() && !has_ready(&dest));

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
