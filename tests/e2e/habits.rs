//! Habits users bring from mc, s5cmd, rclone and Kubernetes: an mc alias as the source, the
//! messages for the usual slips (https:// to a plain-HTTP port, a DEST that is a file, a wrong
//! secret, a typo in a prefix or a catalog name, an empty catalog dataset), lease expiries as
//! dates, the CSI plugin's errors, and `mount`'s exit code after SIGINT.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::csi::{volume, Csi};
use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::faults::{Fault, Rule};
use crate::support::mount::{is_mounted, Mounted};
use crate::support::{
    assert_mirror, content, files, has_ready, hydrator_command, temp_dest, wait_until, S3Target,
    Server,
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

#[test]
fn https_to_a_plain_http_endpoint_says_to_use_http() {
    let server = Server::local();
    server.seed("tls/", &files(&[("a", content(3, 100))]));
    let (_tmp, dest) = temp_dest();
    let https = server.target.endpoint.replace("http://", "https://");
    let mut command = hydrator_command(&server.target);
    command
        .args(["sync", &format!("s3://{}/tls/", server.target.bucket)])
        .arg(&dest)
        .args(["--endpoint-url", &https, "--progress", "none"]);
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the endpoint answers plain HTTP, not HTTPS")
            && stderr.contains("write it with http://, not https://"),
        "{stderr}"
    );
    assert!(!has_ready(&dest));
}

#[test]
fn a_dest_that_is_a_file_says_so() {
    let server = Server::local();
    server.seed("to-a-file/", &files(&[("a", content(4, 100))]));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, b"not a directory").unwrap();

    let run = server.sync("to-a-file/", &file, &[]);
    run.assert_code(2);
    let message = format!(
        "destination {} must be a directory (created if missing), but it is a file",
        file.display()
    );
    assert!(run.stderr().contains(&message), "{}", run.stderr());

    let below = file.join("imagenet");
    let run = server.sync("to-a-file/", &below, &[]);
    run.assert_code(2);
    assert!(
        run.stderr()
            .contains(&format!("but {} is a file", file.display())),
        "{}",
        run.stderr()
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}

fn check_a_wrong_secret_reads_as_a_wrong_secret(server: &Server) {
    let (_tmp, dest) = temp_dest();
    let mut wrong = server.target.clone();
    wrong.secret_key = "definitely-not-the-secret".into();
    let url = format!("s3://{}/x/", wrong.bucket);
    let run = crate::support::hydrator_sync(&wrong, &url, &dest, &[]);
    run.assert_code(2);
    assert!(
        run.stderr().contains("the secret key is wrong"),
        "{}",
        run.stderr()
    );
}

on_both_servers_and_minio!(
    a_wrong_secret_reads_as_a_wrong_secret,
    check_a_wrong_secret_reads_as_a_wrong_secret
);

#[test]
fn a_prefix_that_lists_nothing_names_the_near_one_that_does() {
    let server = Server::local();
    server.seed(
        "jeux/vision-2026/",
        &files(&[("a.jpg", content(5, 100)), ("b/c.jpg", content(6, 100))]),
    );
    server.seed("jeux/audio-2026/", &files(&[("a.wav", content(7, 100))]));
    let bucket = &server.target.bucket;
    let (_tmp, dest) = temp_dest();

    let typo = server.sync("jeux/vison-2026/", &dest, &[]);
    typo.assert_code(2);
    assert!(
        typo.stderr().contains(&format!(
            "s3://{bucket}/jeux/vison-2026/ lists no objects; did you mean s3://{bucket}/jeux/vision-2026/?"
        )),
        "{}",
        typo.stderr()
    );
    // Nothing near: no guess.
    let far = server.sync("jeux/laion-5b/", &dest, &[]);
    far.assert_code(2);
    assert!(!far.stderr().contains("did you mean"), "{}", far.stderr());
    // At the top of the bucket too.
    server.seed("imagenet/", &files(&[("x", content(8, 10))]));
    let top = server.sync("imagnet/", &dest, &[]);
    assert!(
        top.stderr()
            .contains(&format!("did you mean s3://{bucket}/imagenet/?")),
        "{}",
        top.stderr()
    );
}

/// A daemon with `imagenet` (one object) and `typo` (a prefix that lists nothing).
fn daemon_with_a_typo(server: &Server, dir: &Path) -> Daemon {
    server.seed("imagenet/", &files(&[("x", content(9, 10))]));
    let specs = [
        dataset("imagenet", "imagenet/"),
        dataset("typo", "no-such-prefix/"),
    ];
    let text = catalog(dir, &server.target, "1GiB", "", &specs);
    Daemon::start(dir, &server.target, &text)
}

#[test]
fn an_unknown_catalog_name_is_answered_with_the_near_one() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_with_a_typo(&server, dir.path());
    let unknown = daemon.warm("imagnet", &[]);
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("no dataset \"imagnet\" in the catalog; did you mean \"imagenet\"?"),
        "{stderr}"
    );
}

#[test]
fn an_empty_catalog_dataset_names_its_source_and_allow_empty() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_with_a_typo(&server, dir.path());
    let empty = daemon.warm("typo", &[]);
    assert!(!empty.status.success());
    let reason = daemon.status("typo")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    let source = format!("s3://{}/no-such-prefix/", server.target.bucket);
    assert!(reason.contains("nothing to mirror"), "{reason}");
    assert!(reason.contains(&source), "the source is named: {reason}");
    assert!(
        reason.contains("allow_empty = true in the dataset's catalog entry"),
        "{reason}"
    );
    assert!(!reason.contains("--allow-empty"), "{reason}");
}

#[test]
fn warm_shows_a_leases_expiry_as_a_date() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_with_a_typo(&server, dir.path());
    let leased = daemon.warm(
        "imagenet",
        &["--lease-holder", "pod-1", "--lease-ttl", "600"],
    );
    let stderr = String::from_utf8_lossy(&leased.stderr);
    assert!(leased.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("warm: pod-1 leases imagenet snapshot"))
        .unwrap_or_else(|| panic!("{stderr}"));
    let date = line.rsplit("until ").next().unwrap().trim();
    assert!(
        date.len() == 20 && date.ends_with('Z') && date.as_bytes()[10] == b'T',
        "an RFC 3339 date in UTC: {line}"
    );
}

#[test]
fn the_csi_plugin_checks_the_dataset_first_and_names_the_paths_it_cannot_use() {
    let server = Server::local();
    server.seed("ok/", &files(&[("x", content(10, 100))]));
    let dir = tempfile::tempdir().unwrap();
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[DatasetSpec {
            refresh_seconds: 3600,
            ..dataset("imagenet", "ok/")
        }],
    )
    .replace("[listen]\n", "[listen]\nadmins = [\"uid:0\"]\n");
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start(dir.path(), &daemon);
    std::fs::create_dir_all(dir.path().join("pods")).unwrap();
    // The kubelet has not made the target's directory (or a caller got the path wrong).
    let target = dir.path().join("pods/uid-9/volumes/data/mount");

    let unknown = csi
        .publish_as_is(&volume("v1", "uid-9", "imagnet", &target))
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(
        unknown
            .message()
            .contains("no dataset \"imagnet\" in the catalog; did you mean \"imagenet\"?"),
        "{unknown:?}"
    );

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let missing = loop {
        let status = csi
            .publish_as_is(&volume("v2", "uid-9", "imagenet", &target))
            .unwrap_err();
        if status.code() != tonic::Code::Unavailable {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "{status:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(missing.code(), tonic::Code::Internal, "{missing:?}");
    let parent = target.parent().unwrap();
    assert!(
        missing.message().contains(&format!(
            "target path {}: its directory {}: No such file or directory",
            target.display(),
            parent.display()
        )),
        "{missing:?}"
    );
}

#[test]
fn sigint_ends_a_mount_with_3_before_the_dataset_is_complete_and_0_after() {
    let server = Server::local();
    let dataset = files(&[
        ("a.bin", content(11, 300_000)),
        ("b.bin", content(12, 300_000)),
    ]);
    server.seed("interrupted/", &dataset);
    // b.bin never arrives while the mount runs.
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get(
            "/interrupted/b.bin",
            Fault::StallBody(0, Duration::from_secs(60)),
        )
        .times(usize::MAX)
    });
    let mut mount = Mounted::start(&server, "interrupted/", &[]);
    assert_eq!(mount.stop("INT"), Some(3), "{}", mount.log());
    assert!(!is_mounted(&mount.mountpoint));
    assert!(!has_ready(&mount.cache));

    server.faults.clear();
    server.seed("complete/", &dataset);
    let mut mount = Mounted::start(&server, "complete/", &[]);
    wait_until("READY", Duration::from_secs(30), || has_ready(&mount.cache));
    assert_eq!(mount.stop("INT"), Some(0), "{}", mount.log());
    assert!(!is_mounted(&mount.mountpoint));
}

#[test]
fn the_demo_says_what_it_does_while_it_seeds_and_before_it_cleans_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_hydrator"))
        .args(["demo", "--size", "8MiB", "--progress", "none"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at = |needle: &str| {
        stdout
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in:\n{stdout}"))
    };
    // Each step is announced before it runs, and the run's summary comes before the cleanup.
    assert!(at("demo: S3 server listening on") < at("demo: seeding s3://demo-datasets/"));
    assert!(at("demo: seeding s3://demo-datasets/") < at("demo: seeded s3://"));
    assert!(at("demo: seeded s3://") < at("hydrator: mirrored"));
    assert!(at("hydrator: mirrored") < at("demo: removing "));
    assert!(at("demo: removing ") < at("demo: removed in"));
}

#[test]
fn the_licence_file_is_the_licence_cargo_toml_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("\nlicense = \"Apache-2.0\"\n"),
        "Cargo.toml names another licence"
    );
    let licence = std::fs::read_to_string(root.join("LICENSE")).expect("a LICENSE file");
    for line in [
        "Apache License",
        "Version 2.0, January 2004",
        "http://www.apache.org/licenses/",
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "END OF TERMS AND CONDITIONS",
    ] {
        assert!(licence.contains(line), "LICENSE lacks {line:?}");
    }
}
