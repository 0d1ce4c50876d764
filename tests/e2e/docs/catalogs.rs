//! TOML blocks: catalogs, each loaded by a real `hydrator daemon`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{all_blocks, assert_none};

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
    let sealed = table.get("p2p") == Some(&toml::Value::Boolean(true));
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
                        std::fs::write(&path, empty_snapshot(source, sealed)).unwrap();
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

/// A valid snapshot file of `source` (`s3://BUCKET/PREFIX/`) with no objects, sealed (format
/// 2) if asked.
fn empty_snapshot(source: &str, sealed: bool) -> String {
    let rest = source.strip_prefix("s3://").unwrap_or(source);
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = match prefix.is_empty() || prefix.ends_with('/') {
        true => prefix.to_string(),
        false => format!("{prefix}/"),
    };
    serde_json::json!({
        "version": if sealed { 2 } else { 1 }, "endpoint": null, "bucket": bucket, "prefix": prefix,
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

#[test]
fn the_catalogs_of_k8s_are_catalogs_the_daemon_loads() {
    for path in [
        "k8s/node-cache/catalog.toml",
        "k8s/overlays/p2p/catalog.toml",
    ] {
        let text = std::fs::read_to_string(super::root().join(path)).unwrap();
        if let Err(why) = load_catalog(&text) {
            panic!("{path}: {why}");
        }
    }
}
