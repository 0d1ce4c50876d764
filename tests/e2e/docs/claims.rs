//! Sentences of the pages that state a fact about the binary or the manifests, checked against
//! them: the size forms the parser takes, what a restart of the CSI plugin does to a lazy view
//! now that `k8s/` deploys the keeper, the token files the examples read, the trees the
//! Kubernetes page lists, and the kustomize version the renders are made with.

use std::process::Command;

use super::{assert_none, pages, root, yaml_files};

/// Prose with its line breaks and runs of spaces made one space, so a sentence matches
/// whatever its wrapping.
fn flattened(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

#[test]
fn the_size_forms_the_pages_state_are_the_ones_the_parser_takes() {
    let output = Command::new(env!("CARGO_BIN_EXE_hydrator"))
        .args(["sync", "s3://bucket/prefix/", "/nonexistent-dest"])
        .args(["--part-size", "lots"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "a bad size is a usage error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let forms = stderr
        .split_once("expected ")
        .map(|(_, rest)| {
            rest.lines()
                .next()
                .unwrap_or_default()
                .trim_end_matches('.')
        })
        .unwrap_or_else(|| panic!("no `expected …` in the size error: {stderr}"));
    let limitations = flattened(&read("docs/limitations.md"));
    assert!(
        limitations.contains(&flattened(forms)),
        "docs/limitations.md must state the size forms the parser takes: {forms}"
    );
}

/// Claims that a restart of the CSI plugin fails a lazy view's reads, with no word of the
/// keeper: true only without it, and every tree of `k8s/` deploys it.
fn says_a_plugin_restart_fails_reads(sentence: &str) -> bool {
    let lower = sentence.to_lowercase();
    ["restart", "plugin", "fail", "reads"]
        .iter()
        .all(|word| lower.contains(word))
        && !lower.contains("keeper")
}

#[test]
fn no_page_says_a_plugin_restart_fails_lazy_reads_while_the_keeper_is_deployed() {
    let daemonset = read("k8s/node-cache/daemonset.yaml");
    let keeper = read("k8s/node-cache/keeper.yaml");
    assert!(
        daemonset.contains("--keeper-socket=") && keeper.contains("csi-keeper"),
        "k8s/ no longer deploys the keeper: this test's premise is gone"
    );
    let mut texts: Vec<(String, String)> = pages().into_iter().map(|p| (p.name, p.text)).collect();
    texts.push((
        "k8s/node-cache/catalog.toml".into(),
        read("k8s/node-cache/catalog.toml"),
    ));
    let mut wrong = Vec::new();
    for (name, text) in texts {
        let prose: String = text
            .lines()
            .map(|l| l.trim_start_matches('#'))
            .collect::<Vec<_>>()
            .join("\n");
        for sentence in flattened(&prose).split(". ") {
            if says_a_plugin_restart_fails_reads(sentence) {
                wrong.push(format!("{name}: {sentence}"));
            }
        }
    }
    assert_none("claims that a plugin restart fails lazy reads", &wrong);
}

/// Where the Secret `hydrator-api-token` is mounted in the shipped pods (a directory: one file
/// per key).
const TOKEN_SECRET_DIR: &str = "/etc/hydrator/token";

#[test]
fn every_token_file_named_is_a_key_of_the_token_secret() {
    let daemonset = read("k8s/node-cache/daemonset.yaml");
    assert!(
        daemonset.contains(&format!("mountPath: {TOKEN_SECRET_DIR}\n")),
        "the token Secret is no longer mounted at {TOKEN_SECRET_DIR}"
    );
    // The keys, as the install steps create them (`--from-literal=KEY=`).
    let install = read("k8s/kustomization.yaml");
    let (_, after) = install
        .split_once("create secret generic hydrator-api-token")
        .expect("k8s/kustomization.yaml creates hydrator-api-token");
    let keys: Vec<&str> = after
        .split("--from-literal=")
        .skip(1)
        .map_while(|rest| rest.split_once('=').map(|(key, _)| key))
        .take_while(|key| !key.contains(char::is_whitespace))
        .collect();
    assert!(
        keys.contains(&"csi"),
        "keys of hydrator-api-token: {keys:?}"
    );
    let mut files: Vec<(String, String)> = pages().into_iter().map(|p| (p.name, p.text)).collect();
    for path in yaml_files(&root().join("k8s")) {
        let name = path.strip_prefix(root()).unwrap().display().to_string();
        files.push((name, std::fs::read_to_string(&path).unwrap()));
    }
    let mut wrong = Vec::new();
    for (name, text) in &files {
        let words: Vec<&str> = text.split_whitespace().collect();
        for (i, word) in words.iter().enumerate() {
            let value = match word.strip_prefix("--token-file=") {
                Some(value) => value,
                None if *word == "--token-file" => words.get(i + 1).copied().unwrap_or_default(),
                None => continue,
            };
            let value = value.trim_matches(|c| c == '"' || c == '\'' || c == '`');
            if let Some(key) = value
                .strip_prefix(TOKEN_SECRET_DIR)
                .map(|rest| rest.trim_start_matches('/'))
            {
                if !keys.contains(&key) {
                    wrong.push(format!(
                        "{name}: --token-file {value} is not a file of the Secret (keys {keys:?})"
                    ));
                }
            }
        }
    }
    assert_none("token files", &wrong);
}

#[test]
fn the_kubernetes_page_lists_every_tree_and_every_image_to_set() {
    let page = read("docs/kubernetes.md");
    let layout = page
        .split("```text\nk8s/\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/kubernetes.md opens with the layout of k8s/");
    // Every directory below `k8s/` with a kustomization.yaml, relative to `k8s/`.
    let k8s = root().join("k8s");
    let trees: Vec<String> = yaml_files(&k8s)
        .iter()
        .filter(|path| path.ends_with("kustomization.yaml"))
        .filter_map(|path| path.parent()?.strip_prefix(&k8s).ok())
        .map(|tree| tree.display().to_string())
        .filter(|tree| !tree.is_empty())
        .collect();
    assert!(trees.len() > 5, "trees of k8s/: {trees:?}");
    let images_step = page
        .split("Do the same in each overlay or example you apply.")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .map(flattened)
        .expect("docs/kubernetes.md's install steps list the trees with an images: entry");
    let mut missing = Vec::new();
    for tree in &trees {
        let leaf = tree.rsplit('/').next().unwrap();
        if !layout.contains(&format!("── {leaf}/")) {
            missing.push(format!("the layout does not show k8s/{tree}"));
        }
        let kustomization = read(&format!("k8s/{tree}/kustomization.yaml"));
        if kustomization.contains("\nimages:") && !images_step.contains(&format!("`k8s/{tree}`")) {
            missing.push(format!(
                "the install steps do not name k8s/{tree}, which sets the image"
            ));
        }
    }
    assert_none("docs/kubernetes.md's trees", &missing);
}

#[test]
fn the_pages_name_the_kustomize_version_the_renders_are_checked_with() {
    let validate = read("k8s/validate.sh");
    let pinned = validate
        .lines()
        .find_map(|l| l.strip_prefix("KUSTOMIZE_VERSION="))
        .expect("k8s/validate.sh pins KUSTOMIZE_VERSION");
    let install = read("tests/install-kustomize.sh");
    assert!(
        install.contains(&format!("version={pinned}")),
        "tests/install-kustomize.sh installs another kustomize than {pinned}"
    );
    let page = read("docs/kubernetes.md");
    assert!(
        page.contains(&format!("kustomize {pinned}")),
        "docs/kubernetes.md must name kustomize {pinned}"
    );
}
