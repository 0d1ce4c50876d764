//! JSON blocks: parsed, and the documented report, READY, snapshot and log line compared with
//! what the binary really writes.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::support::{content, files, temp_dest, Server};

use super::{all_blocks, assert_none};

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
