//! The CSI node plugin end to end: the real `hydrator csi` beside the real daemon, driven over
//! its socket as the kubelet drives it, with real read-only bind mounts (the suite runs as
//! root).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use crate::support::csi::{mounts_on, volume, Csi};
use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::faults::{Fault, Rule};
use crate::support::{content, files, read_tree, Server, MIB};

/// The daemon's catalog for the plugin: it runs as root, and root may hold leases until
/// released. A listing stays current for an hour, so a ready dataset is served at once.
fn csi_catalog(dir: &Path, server: &Server, quota: &str, names: &[&str]) -> String {
    let specs: Vec<_> = names
        .iter()
        .map(|n| DatasetSpec {
            refresh_seconds: 3600,
            ..dataset(n, n)
        })
        .collect();
    catalog(dir, &server.target, quota, "", &specs)
        .replace("[listen]\n", "[listen]\nadmins = [\"uid:0\"]\n")
}

fn leases(daemon: &Daemon) -> Vec<serde_json::Value> {
    serde_json::from_str(&daemon.request("GET", "/v1/leases", "").1).unwrap()
}

fn check_publish_and_unpublish(server: &Server, prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    let name = prefix.trim_end_matches('/');
    let expected: BTreeMap<String, Vec<u8>> = files(&[
        ("train/a.bin", content(31, 3 * MIB)),
        ("train/b.bin", content(32, 1000)),
        ("labels.csv", content(33, 10)),
    ]);
    server.seed(prefix, &expected);
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &csi_catalog(dir.path(), server, "1GiB", &[name]),
    );
    let csi = Csi::start(dir.path(), &daemon);
    assert_eq!(csi.plugin_info().name, "cache.hydrator.dev");
    assert_eq!(csi.node_info().node_id, "test-node");

    let target = dir.path().join("pods/uid-1/volumes/data/mount");
    let vol = volume("csi-vol-1", "uid-1", name, &target);
    let retried = csi.publish_when_ready(&vol);
    assert!(
        !retried.is_empty(),
        "the first publish starts the hydration and does not wait"
    );
    assert!(
        retried[0]
            .message()
            .contains(&format!("dataset {name} is hydrating on this node")),
        "{:?}",
        retried[0]
    );
    // Exactly the snapshot, read-only.
    assert_eq!(read_tree(&target), expected);
    let snapshot_dir = daemon.status(name)["path"].as_str().unwrap().to_string();
    let inode = |dir: &Path| std::fs::metadata(dir.join("train/a.bin")).unwrap().ino();
    assert_eq!(inode(&target), inode(Path::new(&snapshot_dir)));
    let write = std::fs::write(target.join("new"), b"x").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(libc::EROFS), "{write}");
    // Idempotent: once mounted.
    csi.publish(&vol).unwrap();
    assert_eq!(mounts_on(&target), 1);
    let held = leases(&daemon);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["holder"], "uid-1:csi-vol-1");
    assert_eq!(held[0]["expires_at"], u64::MAX, "held until unpublish");
    assert_eq!(held[0]["snapshot"], daemon.status(name)["snapshot"]);

    csi.unpublish("csi-vol-1", &target).unwrap();
    assert_eq!(mounts_on(&target), 0);
    assert!(!target.exists(), "the target is removed");
    assert!(leases(&daemon).is_empty(), "the lease is released");
    // Unpublishing again, or what was never published, succeeds.
    csi.unpublish("csi-vol-1", &target).unwrap();
    csi.unpublish("csi-never", &dir.path().join("pods/none/mount"))
        .unwrap();
}

on_both_servers!(
    publish_and_unpublish,
    check_publish_and_unpublish,
    "csi-flow/"
);

#[test]
fn bad_requests_unknown_datasets_and_failed_hydrations_are_refused_with_the_reason() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("ok/", &files(&[("x", content(34, 100))]));
    let text = csi_catalog(dir.path(), &server, "1GiB", &["ok"]).replace(
        &format!("s3://{}/ok\"", server.target.bucket),
        "s3://no-such-bucket/ok\"",
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid/volumes/t/mount");

    let unknown = csi
        .publish(&volume("v1", "uid", "imagenet", &target))
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(
        unknown
            .message()
            .contains("no dataset \"imagenet\" in the catalog"),
        "{unknown:?}"
    );
    let writable = csi
        .publish(&crate::support::csi::Volume {
            readonly: false,
            ..volume("v2", "uid", "ok", &target)
        })
        .unwrap_err();
    assert_eq!(writable.code(), tonic::Code::InvalidArgument);
    assert!(writable.message().contains("read-only"), "{writable:?}");
    let no_pod = csi.publish(&volume("v3", "", "ok", &target)).unwrap_err();
    assert_eq!(no_pod.code(), tonic::Code::InvalidArgument);
    assert!(no_pod.message().contains("podInfoOnMount"), "{no_pod:?}");
    let elsewhere = csi.publish(&volume("v5", "uid", "ok", &dir.path().join("etc")));
    assert!(elsewhere.unwrap_err().message().contains("is not under"));
    let unpublish_elsewhere = csi.unpublish("v5", Path::new("/etc")).unwrap_err();
    assert_eq!(unpublish_elsewhere.code(), tonic::Code::InvalidArgument);
    let hostile = csi
        .publish(&volume("../etc", "uid", "ok", &target))
        .unwrap_err();
    assert_eq!(hostile.code(), tonic::Code::InvalidArgument);

    // The bucket does not exist: the hydration fails and the reason reaches the kubelet.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let status = csi
            .publish(&volume("v4", "uid", "ok", &target))
            .unwrap_err();
        if status.message().contains("could not hydrate") {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "{status:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        failed.code(),
        tonic::Code::Unavailable,
        "the kubelet tries again"
    );
    assert!(
        failed
            .message()
            .contains("listing s3://no-such-bucket/ok/: the bucket does not exist"),
        "{failed:?}"
    );
    assert_eq!(mounts_on(&target), 0);
}

#[test]
fn a_mounted_snapshot_is_never_evicted_and_unpublish_makes_it_evictable() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    for (seed, name) in [(41, "a"), (42, "b"), (43, "c")] {
        server.seed(
            &format!("{name}/"),
            &files(&[("data.bin", content(seed, MIB))]),
        );
    }
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &csi_catalog(dir.path(), &server, "2560KiB", &["a", "b", "c"]),
    );
    let csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-a/mount");
    csi.publish_when_ready(&volume("vol-a", "uid-a", "a", &target));
    std::thread::sleep(Duration::from_millis(1100)); // distinct last-use seconds
    for name in ["b", "c"] {
        assert!(daemon.warm(name, &[]).status.success(), "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(1100));
    }
    assert_eq!(daemon.status("a")["state"], "ready", "mounted a stays");
    assert_eq!(daemon.status("b")["state"], "absent", "b went instead");
    assert_eq!(read_tree(&target).len(), 1);

    csi.unpublish("vol-a", &target).unwrap();
    assert!(daemon.warm("b", &[]).status.success(), "{}", daemon.log());
    assert_eq!(
        daemon.status("a")["state"],
        "absent",
        "unmounted a is evictable"
    );
}

#[test]
fn a_restarted_plugin_keeps_serving_and_unmounts_what_it_published_before() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let expected = files(&[("x.bin", content(51, 100_000))]);
    server.seed("r/", &expected);
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &csi_catalog(dir.path(), &server, "1GiB", &["r"]),
    );
    let mut csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-r/mount");
    csi.publish_when_ready(&volume("vol-r", "uid-r", "r", &target));

    // The lease is lost (as with a daemon whose state was damaged); the restarted plugin
    // finds the volume still mounted and takes it again.
    let (code, body) = daemon.request("DELETE", "/v1/datasets/r/leases/uid-r:vol-r", "");
    assert_eq!(code, 204, "{body}");
    csi.restart();
    crate::support::wait_until("the lease is back", Duration::from_secs(10), || {
        leases(&daemon).len() == 1
    });
    assert_eq!(read_tree(&target), expected, "the pod's mount kept working");
    csi.publish(&volume("vol-r", "uid-r", "r", &target))
        .unwrap();
    assert_eq!(mounts_on(&target), 1);

    // A restarted daemon keeps the lease (it is in its state file) and the mount keeps working.
    let text = std::fs::read_to_string(dir.path().join("catalog.toml")).unwrap();
    let (status, _) = daemon.terminate();
    assert!(status.success());
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert_eq!(leases(&daemon).len(), 1);
    assert_eq!(read_tree(&target), expected);

    csi.restart();
    csi.unpublish("vol-r", &target).unwrap();
    assert_eq!(mounts_on(&target), 0);
    assert!(leases(&daemon).is_empty());
}

#[test]
fn a_pod_starting_during_a_refresh_gets_the_snapshot_held_at_once() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let first = files(&[("a.bin", content(81, 1000))]);
    server.seed("h/", &first);
    let text = csi_catalog(dir.path(), &server, "1GiB", &["h"])
        .replace("refresh_seconds = 3600", "refresh_seconds = 1");
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start(dir.path(), &daemon);
    let early = dir.path().join("pods/uid-1/mount");
    csi.publish_when_ready(&volume("vol-1", "uid-1", "h", &early));

    // A new version whose download stalls: the refresh runs for seconds.
    server.seed("h/", &files(&[("b.bin", content(82, MIB))]));
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("h/b.bin", Fault::StallBody(0, Duration::from_secs(4)))
    });
    std::thread::sleep(Duration::from_millis(1100)); // the listing is due again
    let late = dir.path().join("pods/uid-2/mount");
    csi.publish(&volume("vol-2", "uid-2", "h", &late))
        .expect("served at once from the snapshot held");
    assert_eq!(daemon.status("h")["state"], "hydrating");
    assert_eq!(
        read_tree(&late),
        first,
        "the snapshot held, not the one coming"
    );
}
