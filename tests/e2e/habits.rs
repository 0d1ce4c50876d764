//! Habits users bring from mc, s5cmd, rclone and Kubernetes: an mc alias as the source, the
//! messages for the usual slips (https:// to a plain-HTTP port, a DEST that is a file, a wrong
//! secret, a typo in a prefix or a catalog name, an empty catalog dataset), lease expiries as
//! dates, the CSI plugin's errors, and `mount`'s exit code after SIGINT.

use std::path::Path;
use std::process::Command;

use crate::support::{
    assert_mirror, content, files, has_ready, hydrator_command, temp_dest, S3Target, Server,
};

/// `hydrator sync SOURCE DEST` with no AWS keys in the environment: the source says where the
/// server and keys are.
fn sync_without_aws_keys(target: &S3Target, source: &str, dest: &Path) -> Command {
    let mut command = hydrator_command(target);
    command
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("MC_HOST_depot")
        .env("MC_CONFIG_DIR", "/nonexistent")
        .args(["sync", source])
        .arg(dest)
        .args(["--progress", "none", "-vv"]);
    command
}

/// `http://ACCESS:SECRET@HOST:PORT` for the server.
fn mc_host(target: &S3Target) -> String {
    let host = target.endpoint.trim_start_matches("http://");
    format!("http://{}:{}@{host}", target.access_key, target.secret_key)
}

#[test]
fn an_mc_alias_names_the_server_and_keys_as_mc_mirror_takes_them() {
    let server = Server::local();
    let expected = files(&[("a.jpg", content(1, 1000)), ("b/c.jpg", content(2, 70_000))]);
    server.seed("vision-2026/", &expected);
    let source = format!("depot/{}/vision-2026/", server.target.bucket);
    let secret = &server.target.secret_key;

    // MC_HOST_depot, as a pod gets it from a Secret.
    let (_tmp, dest) = temp_dest();
    let out = sync_without_aws_keys(&server.target, &source, &dest)
        .env("MC_HOST_depot", mc_host(&server.target))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_mirror(&dest, &expected);
    assert!(has_ready(&dest));
    assert!(
        !stderr.contains(secret.as_str()),
        "the secret is never logged: {stderr}"
    );

    // mc's own config file, as `mc alias set` writes it.
    let mc = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "version": "10",
        "aliases": {"depot": {
            "url": server.target.endpoint,
            "accessKey": server.target.access_key,
            "secretKey": secret,
            "api": "s3v4",
            "path": "auto"
        }}
    });
    std::fs::write(mc.path().join("config.json"), config.to_string()).unwrap();
    let (_tmp, dest) = temp_dest();
    let out = sync_without_aws_keys(&server.target, &source, &dest)
        .env("MC_CONFIG_DIR", mc.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_mirror(&dest, &expected);
    assert!(!stderr.contains(secret.as_str()), "{stderr}");

    // Keys given otherwise come first: here wrong ones, so the run is refused.
    let (_tmp, dest) = temp_dest();
    let out = sync_without_aws_keys(&server.target, &source, &dest)
        .env("MC_HOST_depot", mc_host(&server.target))
        .env("AWS_ACCESS_KEY_ID", "AKIAOTHERKEY")
        .env("AWS_SECRET_ACCESS_KEY", "another-secret")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // Neither s3:// nor a known alias: both forms are named, exit 2.
    let out = sync_without_aws_keys(&server.target, &source.replace("depot", "dépôt"), &dest)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("expected s3://BUCKET/PREFIX/, or ALIAS/BUCKET/PREFIX/"),
        "{stderr}"
    );
    let out = sync_without_aws_keys(&server.target, &source.replace("depot", "nowhere"), &dest)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"nowhere\" is no mc alias (MC_HOST_nowhere is not set"),
        "{stderr}"
    );

    // A malformed MC_HOST_ is named, its value (a secret) never quoted.
    let out = sync_without_aws_keys(&server.target, &source, &dest)
        .env("MC_HOST_depot", format!("minio:9000@{secret}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("MC_HOST_depot is not of the form"),
        "{stderr}"
    );
    assert!(!stderr.contains(secret.as_str()), "{stderr}");
}
