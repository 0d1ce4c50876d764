//! YAML blocks: loaded, the arguments of their hydrator containers parsed, and the Secrets
//! they name the ones `k8s/` uses.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use super::shell::parse_cli;
use super::{all_blocks, assert_none, root, yaml_files};

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
    let mut used = BTreeSet::new();
    for file in yaml_files(&root().join("k8s")) {
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
