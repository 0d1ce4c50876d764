//! The CSI node plugin end to end: the real `hydrator csi` beside the real daemon, driven over
//! its socket as the kubelet drives it, with real read-only bind mounts (the suite runs as
//! root).

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::csi::{volume, Csi, Volume};
use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec, TOKEN};
use crate::support::faults::{Fault, Rule};
use crate::support::{content, files, mounts_on, read_tree, top_fs_type, Server, MIB};

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

on_both_servers_and_minio!(
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

/// The plugin registers itself the way the kubelet's plugin watcher expects of a CSI driver:
/// a socket in the registry directory answering GetInfo with the driver's name, the CSI socket
/// as the host sees it and a CSI version; a restart binds it again; a stop removes it, which
/// is how the kubelet learns the driver is gone.
#[test]
fn the_plugin_registers_with_the_kubelet_and_takes_its_registration_away_when_it_stops() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &csi_catalog(dir.path(), &server, "1GiB", &["r"]),
    );
    let mut csi = Csi::start(dir.path(), &daemon);
    let info = csi.registration_info();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, crate::support::csi::DRIVER);
    assert_eq!(info.name, csi.plugin_info().name, "one name for both");
    assert_eq!(
        info.endpoint,
        format!("/var/lib/kubelet/plugins/{}/csi.sock", info.name)
    );
    assert_eq!(info.supported_versions, ["1.0.0"]);
    csi.notify_registration(true, "");
    csi.notify_registration(false, "driver name taken");
    assert!(
        csi.log()
            .contains("the kubelet refused CSI driver cache.hydrator.dev: driver name taken"),
        "{}",
        csi.log()
    );

    // A killed plugin leaves its socket; the restarted one binds it again.
    csi.restart();
    assert_eq!(csi.registration_info().name, info.name);
    csi.terminate();
    assert!(
        !csi.registration_socket().exists(),
        "a stopped plugin takes its registration away"
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

/// The filesystem type of the topmost mount on `target`, which is mounted.
fn fs_type(target: &Path) -> String {
    top_fs_type(target).expect("mounted")
}

/// `n` shards of 64 KiB under `dir/`, and a daemon whose GETs of them each stall `pause`.
fn slow_shards(
    server: &Server,
    prefix: &str,
    n: usize,
    pause: Duration,
) -> BTreeMap<String, Vec<u8>> {
    let shards: BTreeMap<String, Vec<u8>> = (0..n)
        .map(|i| (format!("s-{i:03}.bin"), content(900 + i as u64, 64 << 10)))
        .collect();
    server.seed(prefix, &shards);
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get(&format!("/{prefix}"), Fault::StallBody(0, pause)).times(usize::MAX)
    });
    shards
}

#[test]
fn a_lazy_volume_starts_while_the_dataset_hydrates_and_the_next_pod_after_ready_gets_the_bind_mount(
) {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    // 120 GETs of 300 ms, 8 at a time: the hydration takes about 4.5 s.
    let shards = slow_shards(&server, "lazy/", 120, Duration::from_millis(300));
    let specs = [DatasetSpec {
        refresh_seconds: 3600,
        extra: "start = \"lazy\"",
        ..dataset("lazy", "lazy/")
    }];
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs)
        .replace("[listen]\n", "[listen]\nadmins = [\"uid:0\"]\n");
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start(dir.path(), &daemon);

    // A pod that asks to wait for the whole dataset still waits.
    let patient = dir.path().join("pods/uid-0/mount");
    let waits = csi
        .publish(&Volume {
            attributes: &[("start", "ready")],
            ..volume("vol-0", "uid-0", "lazy", &patient)
        })
        .unwrap_err();
    assert_eq!(waits.code(), tonic::Code::Unavailable, "{waits:?}");
    assert!(waits.message().contains("hydrating"), "{waits:?}");

    // The catalog's default: the pod starts as soon as the dataset is listed.
    let early = dir.path().join("pods/uid-1/mount");
    csi.publish_when_ready(&volume("vol-1", "uid-1", "lazy", &early));
    assert_eq!(daemon.status("lazy")["state"], "hydrating");
    assert!(fs_type(&early).starts_with("fuse"), "{}", fs_type(&early));
    // The view itself, as a pod without HostToContainer propagation keeps it.
    let view = std::fs::File::open(&early).unwrap();
    let names: Vec<String> = {
        let mut names: Vec<_> = std::fs::read_dir(&early)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name != ".hydrator")
            .collect();
        names.sort();
        names
    };
    assert_eq!(names, shards.keys().cloned().collect::<Vec<_>>());
    // The gate a trainer can start on: the view's marker, naming the snapshot; READY is the
    // complete dataset's.
    let snapshot = daemon.status("lazy")["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        std::fs::read_to_string(early.join(".hydrator/LAZY")).unwrap(),
        format!("dataset=lazy\nsnapshot={snapshot}\n")
    );
    assert!(!early.join(".hydrator/READY").exists());
    assert_eq!(
        std::fs::metadata(early.join("s-077.bin")).unwrap().len(),
        64 << 10
    );
    // The last shard is read long before the hydration ends, byte for byte.
    let opened = Instant::now();
    let last = std::fs::read(early.join("s-119.bin")).unwrap();
    let waited = opened.elapsed();
    assert!(last == shards["s-119.bin"]);
    assert_eq!(
        daemon.status("lazy")["state"],
        "hydrating",
        "read in {waited:?}, before the end"
    );
    let write = std::fs::write(early.join("new"), b"x").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(libc::EROFS), "{write}");
    // Leased like a bind mount: the snapshot being hydrated, until unpublished.
    let held = leases(&daemon);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["holder"], "uid-1:vol-1");
    assert_eq!(held[0]["snapshot"], daemon.status("lazy")["snapshot"]);
    assert_eq!(held[0]["expires_at"], u64::MAX);
    let stats = csi.volume_stats("vol-1", &early).unwrap();
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    assert!(condition.message.contains("lazy view"), "{condition:?}");
    assert_eq!(stats.usage.len(), 2, "bytes and inodes");
    let unknown = csi.volume_stats("vol-9", &early).unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");

    assert_eq!(read_tree(&early), shards, "every file, as it arrives");
    crate::support::wait_until("ready", Duration::from_secs(30), || {
        daemon.status("lazy")["state"] == "ready"
    });
    // The next pod gets the plain bind mount of the same snapshot.
    let late = dir.path().join("pods/uid-2/mount");
    csi.publish(&volume("vol-2", "uid-2", "lazy", &late))
        .expect("ready: published at once");
    assert!(!fs_type(&late).starts_with("fuse"), "{}", fs_type(&late));
    let bound = csi.volume_stats("vol-2", &late).unwrap();
    assert!(!bound.volume_condition.as_ref().unwrap().abnormal);
    assert!(bound.usage[0].total > 0, "{bound:?}");
    assert_eq!(read_tree(&late), shards);
    // The ready snapshot is bound over the first pod's view too: a pod that mounts it with
    // HostToContainer propagation sees the plain files from then on.
    crate::support::wait_until(
        "the snapshot over the view",
        Duration::from_secs(10),
        || !fs_type(&early).starts_with("fuse"),
    );
    assert_eq!(mounts_on(&early), 2, "the view stays underneath");
    assert_eq!(read_tree(&early), shards, "the first pod reads on");
    // The view underneath settles: the kernel opens its files without asking the plugin.
    let in_view = PathBuf::from(format!("/proc/self/fd/{}", view.as_raw_fd()));
    for _ in 0..2 {
        assert_eq!(read_tree(&in_view), shards, "through the view, once whole");
    }
    let said = "the kernel opens its files without asking";
    assert_eq!(csi.log().matches(said).count(), 1, "{}", csi.log());
    drop(view);
    csi.publish(&volume("vol-1", "uid-1", "lazy", &early))
        .expect("idempotent");
    // A restart of the plugin ends the view underneath, not the snapshot bound over it: the
    // volume reads on and is reported normal.
    csi.kill_and_restart(Duration::ZERO);
    assert_eq!(read_tree(&early), shards, "the first pod reads on");
    let condition = csi
        .volume_stats("vol-1", &early)
        .unwrap()
        .volume_condition
        .unwrap();
    assert!(!condition.abnormal, "{condition:?}");

    for (id, target) in [("vol-1", &early), ("vol-2", &late)] {
        csi.unpublish(id, target).unwrap();
        assert_eq!(mounts_on(target), 0);
        assert!(!target.exists());
    }
    assert!(leases(&daemon).is_empty(), "{:?}", leases(&daemon));
}

/// Publishes `lz` lazily at `target` (volume vol-1 of pod uid-1) and reads its first shard.
fn publish_lz(csi: &Csi, target: &Path, shards: &BTreeMap<String, Vec<u8>>) {
    let lazy = Volume {
        attributes: &[("start", "lazy")],
        ..volume("vol-1", "uid-1", "lz", target)
    };
    csi.publish_when_ready(&lazy);
    assert!(std::fs::read(target.join("s-000.bin")).unwrap() == shards["s-000.bin"]);
}

/// The lazy dataset `lz` (120 shards, about 15 s of hydration: still incomplete when a test
/// restarts the plugin), its catalog and its daemon.
fn slowly_hydrating(server: &Server, dir: &Path) -> (BTreeMap<String, Vec<u8>>, String, Daemon) {
    let shards = slow_shards(server, "lz/", 120, Duration::from_secs(1));
    let text = csi_catalog(dir, server, "1GiB", &["lz"]);
    let daemon = Daemon::start(dir, &server.target, &text);
    (shards, text, daemon)
}

#[test]
fn a_restart_of_the_plugin_fails_lazy_reads_with_enotconn_and_a_restart_of_the_daemon_does_not() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let (shards, text, daemon) = slowly_hydrating(&server, dir.path());
    let mut csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-1/mount");
    publish_lz(&csi, &target, &shards);

    // The daemon restarts mid-hydration: an open waits for it, resumes, and reads right.
    let (status, _) = daemon.terminate();
    assert!(status.success());
    let reader = {
        let path = target.join("s-100.bin");
        std::thread::spawn(move || std::fs::read(path))
    };
    std::thread::sleep(Duration::from_millis(500));
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let read = reader
        .join()
        .unwrap()
        .expect("the open waited for the daemon");
    assert!(read == shards["s-100.bin"]);
    assert_eq!(leases(&daemon).len(), 1, "the lazy volume's lease survived");

    // The plugin restarts: its view is gone. A file open before reads on (its reads were the
    // kernel's, through passthrough); a new open gets ENOTCONN, never zeros.
    let mut open = std::fs::File::open(target.join("s-000.bin")).unwrap();
    assert_eq!(
        daemon.status("lz")["state"],
        "hydrating",
        "still the view, not the bind"
    );
    csi.restart();
    let mut kept = Vec::new();
    std::io::Read::read_to_end(&mut open, &mut kept).unwrap();
    assert!(kept == shards["s-000.bin"]);
    let err = std::fs::read(target.join("s-001.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    // What the kubelet (with volume health on) puts in the pod's events.
    let condition = csi
        .volume_stats("vol-1", &target)
        .unwrap()
        .volume_condition
        .unwrap();
    assert!(condition.abnormal, "{condition:?}");
    assert!(
        condition
            .message
            .contains("ended with a restart of the CSI plugin"),
        "{condition:?}"
    );
    crate::support::wait_until("the dead view is reported", Duration::from_secs(10), || {
        csi.log().contains("ended with the plugin's previous run")
    });
    // Once its pod is gone, it is unpublished cleanly, and its lease released.
    drop(open);
    csi.unpublish("vol-1", &target).unwrap();
    assert_eq!(mounts_on(&target), 0);
    assert!(leases(&daemon).is_empty());
}

#[test]
fn a_lazy_view_held_by_the_keeper_outlives_kill_9_of_the_plugin_and_a_restart_of_the_keeper() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let (shards, _, daemon) = slowly_hydrating(&server, dir.path());
    let csi = Csi::start_with_keeper(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-1/mount");
    publish_lz(&csi, &target, &shards);
    let mut open = std::fs::File::open(target.join("s-000.bin")).unwrap();
    let read_in_thread = |name: &str| {
        let path = target.join(name);
        std::thread::spawn(move || std::fs::read(path))
    };

    // An open waiting for its file when the plugin is killed, and one made while no plugin
    // runs: both wait for the next plugin, and get their file whole.
    let in_flight = read_in_thread("s-110.bin");
    std::thread::sleep(Duration::from_millis(500));
    csi.kill();
    assert_eq!(daemon.status("lz")["state"], "hydrating", "still the view");
    let while_down = read_in_thread("s-005.bin");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !while_down.is_finished(),
        "an open waits for the next plugin"
    );
    csi.kill_and_restart(Duration::ZERO);
    let in_flight = in_flight
        .join()
        .unwrap()
        .expect("the open in flight is answered");
    assert!(in_flight == shards["s-110.bin"]);
    let while_down = while_down
        .join()
        .unwrap()
        .expect("the open made meanwhile is answered");
    assert!(while_down == shards["s-005.bin"]);
    assert!(
        csi.log().contains("serving again the lazy view"),
        "{}",
        csi.log()
    );

    // A rollout ends the plugin with SIGTERM: an open waiting then is answered by the next one,
    // never failed on the way out.
    let at_sigterm = read_in_thread("s-119.bin");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!at_sigterm.is_finished(), "the open waits for its file");
    csi.terminate_and_restart();
    let at_sigterm =
        (at_sigterm.join().unwrap()).expect("the open in flight at SIGTERM is answered");
    assert!(at_sigterm == shards["s-119.bin"]);
    // A file open all along reads on, and every file reads whole through the view.
    let mut kept = Vec::new();
    std::io::Read::read_to_end(&mut open, &mut kept).unwrap();
    assert!(kept == shards["s-000.bin"]);
    for (name, expected) in &shards {
        let read = std::fs::read(target.join(name))
            .unwrap_or_else(|err| panic!("{name}: {err}\n{}", csi.log()));
        assert!(&read == expected, "{name} differs");
    }
    let condition = csi
        .volume_stats("vol-1", &target)
        .unwrap()
        .volume_condition
        .unwrap();
    assert!(!condition.abnormal, "{condition:?}");

    // The keeper restarts alone and is handed the view again; then the plugin dies once more.
    csi.restart_keeper();
    crate::support::wait_until("the view is kept again", Duration::from_secs(20), || {
        csi.keeper_log().matches("keeping the lazy view").count() >= 2
    });
    csi.kill_and_restart(Duration::ZERO);
    assert!(std::fs::read(target.join("s-007.bin")).unwrap() == shards["s-007.bin"]);

    // Once its pod is gone, it is unpublished cleanly: the keeper lets the connection go.
    drop(open);
    csi.unpublish("vol-1", &target).unwrap();
    assert_eq!(mounts_on(&target), 0);
    assert!(leases(&daemon).is_empty());
    crate::support::wait_until("the keeper drops the view", Duration::from_secs(10), || {
        csi.keeper_log().contains("the lazy view ended")
    });
}

#[test]
fn a_large_file_on_a_lazy_volume_reads_while_it_downloads_and_through_a_kill_9_of_the_plugin() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    // Five parts of 8 MiB; the GETs of all but the first stall (within the daemon's patience
    // for a stalled body): the file cannot be whole for a while.
    let big = content(31, 40 << 20);
    server.seed(
        "big/",
        &BTreeMap::from([("big.bin".to_string(), big.clone())]),
    );
    let stall = Duration::from_millis(4500);
    server.faults.add(
        Rule::get("/big/", Fault::StallBody(0, stall))
            .ranges_from(8 << 20)
            .times(4),
    );
    let text = csi_catalog(dir.path(), &server, "1GiB", &["big"]);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start_with_keeper(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-1/mount");
    let lazy = Volume {
        attributes: &[("start", "lazy")],
        ..volume("vol-1", "uid-1", "big", &target)
    };
    csi.publish_when_ready(&lazy);

    let opened = Instant::now();
    let mut file = std::fs::File::open(target.join("big.bin")).unwrap();
    let mut head = vec![0; 8 << 20];
    std::io::Read::read_exact(&mut file, &mut head).unwrap();
    let waited = opened.elapsed();
    assert!(head == big[..8 << 20], "the first part as in the store");
    assert!(
        waited < stall,
        "the read waited {waited:?} for parts it does not hold"
    );
    assert_eq!(
        daemon.status("big")["state"],
        "hydrating",
        "read before the file was whole"
    );

    // The plugin dies with the file open: the rest reads through the next plugin.
    csi.kill_and_restart(Duration::ZERO);
    let mut rest = Vec::new();
    let read = std::io::Read::read_to_end(&mut file, &mut rest);
    assert!(read.is_ok(), "{read:?}\n{}", csi.log());
    assert!(rest == big[8 << 20..], "the rest as in the store");
    crate::support::wait_until("ready", Duration::from_secs(30), || {
        daemon.status("big")["state"] == "ready"
    });
    assert!(std::fs::read(target.join("big.bin")).unwrap() == big);
    drop(file);
    csi.unpublish("vol-1", &target).unwrap();
    assert_eq!(mounts_on(&target), 0);
}

#[test]
fn only_the_namespaces_and_service_accounts_a_dataset_allows_may_mount_it() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let expected = files(&[("x.bin", content(71, 1000))]);
    for prefix in ["team/", "shared/", "closed/"] {
        server.seed(prefix, &expected);
    }
    let specs = [
        DatasetSpec {
            refresh_seconds: 3600,
            extra: "namespaces = [\"team-a\"]\nservice_accounts = [\"research/trainer\"]",
            ..dataset("team", "team/")
        },
        DatasetSpec {
            refresh_seconds: 3600,
            ..dataset("shared", "shared/")
        },
    ];
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs).replace(
        "[listen]\n",
        "[access]\nnamespaces = [\"shared-ns\"]\n\n[listen]\nadmins = [\"uid:0\"]\n",
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start(dir.path(), &daemon);
    let publish = |id: &str, dataset: &str, namespace: &str, account: &str| {
        let target = dir.path().join(format!("pods/{id}/mount"));
        let attributes = [
            ("csi.storage.k8s.io/pod.namespace", namespace),
            ("csi.storage.k8s.io/serviceAccount.name", account),
        ];
        let vol = Volume {
            attributes: &attributes,
            ..volume(id, id, dataset, &target)
        };
        let mut answer = csi.publish(&vol);
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(&answer, Err(s) if s.code() == tonic::Code::Unavailable) {
            assert!(Instant::now() < deadline, "{answer:?}");
            std::thread::sleep(Duration::from_millis(200));
            answer = csi.publish(&vol);
        }
        (answer, target)
    };
    let denied = |answer: Result<(), tonic::Status>, needles: &[&str]| {
        let status = answer.unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        for needle in needles {
            assert!(status.message().contains(needle), "{needle}: {status:?}");
        }
    };

    // The dataset's own rule: by namespace, or by service account.
    let (allowed, target) = publish("v1", "team", "team-a", "default");
    allowed.unwrap();
    assert_eq!(read_tree(&target), expected);
    let (by_account, _) = publish("v2", "team", "research", "trainer");
    by_account.unwrap();
    let (other, target) = publish("v3", "team", "team-c", "default");
    denied(
        other,
        &[
            "dataset team",
            "\"team-c\"",
            "team's rule",
            "team-a",
            "research/trainer",
        ],
    );
    assert_eq!(mounts_on(&target), 0);
    let (wrong_account, _) = publish("v4", "team", "research", "default");
    denied(wrong_account, &["\"research\"", "\"default\""]);

    // A dataset without rules falls back on [access].
    let (shared, _) = publish("v5", "shared", "shared-ns", "default");
    shared.unwrap();
    let (not_shared, _) = publish("v6", "shared", "team-a", "default");
    denied(
        not_shared,
        &["dataset shared", "[access] default", "shared-ns"],
    );
    assert_eq!(
        leases(&daemon).len(),
        3,
        "only the allowed pods hold leases"
    );
    // Tokens and uids keep their scopes: the daemon's own clients are not pods.
    let warmed = daemon.warm("team", &[]);
    assert!(warmed.status.success(), "{warmed:?}");
}

#[test]
fn symlinks_in_the_pods_directory_never_lead_a_mount_an_unmount_or_a_removal_outside_it() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("s/", &files(&[("x.bin", content(91, 100))]));
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &csi_catalog(dir.path(), &server, "1GiB", &["s"]),
    );
    let csi = Csi::start(dir.path(), &daemon);
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(outside.join("etc")).unwrap();
    std::fs::write(outside.join("etc/passwd"), b"keep").unwrap();
    let pods = dir.path().join("pods");
    std::fs::create_dir_all(pods.join("uid-1/volumes")).unwrap();
    let refused = |answer: Result<(), tonic::Status>| {
        let status = answer.expect_err("refused");
        assert_ne!(status.code(), tonic::Code::Ok);
        status
    };

    // The target itself is a symlink to a directory outside.
    let linked = pods.join("uid-1/volumes/mount");
    std::os::unix::fs::symlink(outside.join("etc"), &linked).unwrap();
    let status = refused(csi.publish(&volume("vol-1", "uid-1", "s", &linked)));
    assert!(status.message().contains("symlink"), "{status:?}");
    assert_eq!(
        mounts_on(&outside.join("etc")),
        0,
        "nothing mounted over it"
    );

    // A directory on the way is a symlink.
    std::os::unix::fs::symlink(&outside, pods.join("uid-2")).unwrap();
    let through = pods.join("uid-2/etc");
    let status = refused(csi.publish(&volume("vol-2", "uid-2", "s", &through)));
    assert!(status.message().contains("symlink"), "{status:?}");
    assert_eq!(mounts_on(&outside.join("etc")), 0);

    // Unpublishing through symlinks unmounts nothing and removes nothing outside.
    let tmpfs = outside.join("tmpfs");
    std::fs::create_dir(&tmpfs).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&tmpfs)
        .status()
        .unwrap();
    assert!(mounted.success());
    std::os::unix::fs::symlink(&tmpfs, pods.join("uid-1/volumes/tmp")).unwrap();
    // Volume ids the plugin never published: answered OK (unpublish is idempotent), on every
    // retry, and nothing is followed.
    for _retry in 0..3 {
        for (id, target) in [
            ("vol-1", linked.clone()),
            ("vol-3", pods.join("uid-1/volumes/tmp")),
            ("vol-4", pods.join("uid-2/tmpfs")),
            ("vol-5", through.clone()),
        ] {
            let answer = csi.unpublish(id, &target);
            assert!(answer.is_ok(), "{id} at {}: {answer:?}", target.display());
        }
    }
    assert_eq!(mounts_on(&tmpfs), 1, "the tmpfs outside stays mounted");
    assert!(
        outside.join("etc/passwd").exists(),
        "nothing removed outside"
    );
    let _ = std::process::Command::new("umount").arg(&tmpfs).status();

    // A volume id the plugin never published: what someone else mounted there stays.
    let foreign = pods.join("uid-3/mount");
    std::fs::create_dir_all(&foreign).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&foreign)
        .status()
        .unwrap();
    assert!(mounted.success());
    let status = csi.unpublish("vol-unknown", &foreign).unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert_eq!(mounts_on(&foreign), 1, "left alone");
    let _ = std::process::Command::new("umount").arg(&foreign).status();
}

#[test]
fn one_volume_id_is_published_at_one_target_and_keeps_its_lease() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let expected = files(&[("x.bin", content(95, 1000))]);
    server.seed("one/", &expected);
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &csi_catalog(dir.path(), &server, "1GiB", &["one"]),
    );
    let csi = Csi::start(dir.path(), &daemon);
    let first = dir.path().join("pods/uid-1/a/mount");
    let second = dir.path().join("pods/uid-1/b/mount");
    csi.publish_when_ready(&volume("vol-1", "uid-1", "one", &first));
    std::fs::create_dir_all(second.parent().unwrap()).unwrap();
    let status = csi
        .publish(&volume("vol-1", "uid-1", "one", &second))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
    assert!(
        status.message().contains("already published at"),
        "{status:?}"
    );
    assert_eq!(mounts_on(&second), 0);
    // Unpublishing the target it was refused at leaves the first mount and its lease alone.
    let wrong = csi.unpublish("vol-1", &second).unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::FailedPrecondition, "{wrong:?}");
    assert_eq!(leases(&daemon).len(), 1);
    assert_eq!(read_tree(&first), expected);
    csi.unpublish("vol-1", &first).unwrap();
    assert!(leases(&daemon).is_empty());
}

#[test]
fn one_identity_cannot_take_the_leases_the_csi_plugin_needs() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let expected = files(&[("x.bin", content(97, 1000))]);
    server.seed("full/", &expected);
    let text = csi_catalog(dir.path(), &server, "1GiB", &["full"])
        .replace("[cache]\n", "[cache]\nmax_leases_per_dataset = 8\n");
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert!(
        daemon.warm("full", &[]).status.success(),
        "{}",
        daemon.log()
    );
    // A token takes every lease it can: three quarters of the cap.
    let taken = (0..10)
        .map(|i| {
            let path = format!("/v1/datasets/full/leases/job-{i}");
            daemon.tcp_request("PUT", &path, "", TOKEN).0
        })
        .collect::<Vec<_>>();
    assert_eq!(taken, [200, 200, 200, 200, 200, 200, 429, 429, 429, 429]);
    // The CSI plugin (an admin) still leases what it mounts.
    let csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-1/mount");
    csi.publish(&volume("vol-1", "uid-1", "full", &target))
        .expect("the admin's quarter is free");
    assert_eq!(read_tree(&target), expected);
    // Holder names that print as something else are refused: bidi, zero-width and every other
    // format character (an Arabic letter mark, an invisible tag letter, a soft hyphen).
    for hidden in [
        "job%E2%80%AEevil",
        "job%E2%80%8B",
        "job%EF%BB%BF",
        "job%D8%9C",
        "job%F3%A0%81%81",
        "job%C2%AD",
    ] {
        let path = format!("/v1/datasets/full/leases/{hidden}");
        assert_eq!(
            daemon.tcp_request("PUT", &path, "", TOKEN).0,
            400,
            "{hidden}"
        );
    }
}

#[test]
fn one_pod_with_many_volumes_holds_its_share_of_the_leases_and_other_pods_still_mount() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let expected = files(&[("x.bin", content(101, 1000))]);
    server.seed("many/", &expected);
    let text = csi_catalog(dir.path(), &server, "1GiB", &["many"]).replace(
        "[cache]\n",
        "[cache]\nmax_leases_per_dataset = 8\nmax_leases_per_identity = 2\n",
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert!(
        daemon.warm("many", &[]).status.success(),
        "{}",
        daemon.log()
    );
    let csi = Csi::start(dir.path(), &daemon);
    // One pod with eight inline volumes of the dataset: its share is two.
    let ids: Vec<String> = (0..8).map(|i| format!("vol-a{i}")).collect();
    let published: Vec<_> = ids
        .iter()
        .map(|id| {
            let target = dir.path().join(format!("pods/uid-a/volumes/{id}/mount"));
            csi.publish(&volume(id, "uid-a", "many", &target))
                .map_err(|status| status.code())
        })
        .collect();
    let exhausted = Err(tonic::Code::ResourceExhausted);
    assert_eq!(published[..2], [Ok(()), Ok(())]);
    assert!(
        published[2..].iter().all(|p| *p == exhausted),
        "{published:?}"
    );
    // Another pod mounts the dataset all the same.
    let other = dir.path().join("pods/uid-b/volumes/vol-b/mount");
    csi.publish(&volume("vol-b", "uid-b", "many", &other))
        .expect("the first pod holds its share, not the table");
    assert_eq!(read_tree(&other), expected);
    let held = leases(&daemon);
    let pods: Vec<_> = held.iter().map(|l| l["pod"].as_str().unwrap()).collect();
    assert_eq!(pods, ["uid-a", "uid-a", "uid-b"], "{held:?}");
}

#[test]
fn forged_records_are_dropped_and_symlinked_snapshots_are_not_served() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let expected = files(&[("x.bin", content(99, 1000))]);
    server.seed("rec/", &expected);
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &csi_catalog(dir.path(), &server, "1GiB", &["rec"]),
    );
    assert!(daemon.warm("rec", &[]).status.success(), "{}", daemon.log());
    let mut csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-1/mount");
    csi.publish(&volume("vol-1", "uid-1", "rec", &target))
        .unwrap();
    let lease = leases(&daemon);

    // Records written by someone else: another volume's holder, a target outside the pods
    // directory, an id that is not the file's name.
    let records = dir.path().join("csi-state/volumes");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let snapshot = daemon.status("rec")["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let forged = [
        ("holder", "uid-1:vol-1", target.display().to_string()),
        ("outside", "uid-9:outside", outside.display().to_string()),
        ("renamed", "uid-9:other", target.display().to_string()),
    ];
    for (file, holder, at) in &forged {
        let id = if *file == "renamed" { "other" } else { *file };
        let record = serde_json::json!({
            "id": id, "dataset": "rec", "snapshot": snapshot, "holder": holder, "target": at,
        });
        std::fs::write(records.join(format!("{file}.json")), record.to_string()).unwrap();
    }
    csi.restart();
    crate::support::wait_until(
        "the forged records are dropped",
        Duration::from_secs(10),
        || {
            forged
                .iter()
                .all(|(file, ..)| !records.join(format!("{file}.json")).exists())
        },
    );
    assert_eq!(
        leases(&daemon),
        lease,
        "no lease taken, changed or released"
    );
    assert_eq!(read_tree(&target), expected, "the real volume is untouched");
    assert!(outside.exists());

    // A snapshot directory replaced by a symlink is not handed to a pod.
    let snapshot_dir = std::path::PathBuf::from(daemon.status("rec")["path"].as_str().unwrap());
    let moved = snapshot_dir.with_extension("moved");
    std::fs::rename(&snapshot_dir, &moved).unwrap();
    std::os::unix::fs::symlink(&outside, &snapshot_dir).unwrap();
    let other = dir.path().join("pods/uid-2/mount");
    let refused = csi
        .publish(&volume("vol-2", "uid-2", "rec", &other))
        .unwrap_err();
    assert!(refused.message().contains("symlink"), "{refused:?}");
    assert_eq!(mounts_on(&other), 0);
    std::fs::remove_file(&snapshot_dir).unwrap();
    std::fs::rename(&moved, &snapshot_dir).unwrap();
}

#[test]
fn a_lazy_volume_fails_the_handles_that_read_bytes_the_checksum_rejected_and_says_so() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    // Three parts of 8 MiB: the first GET of the first part has a byte flipped, which only the
    // server's full-object checksum catches, once the stalled others are in.
    let big = content(32, 24 << 20);
    server.seed(
        "flip/",
        &BTreeMap::from([("big.bin".to_string(), big.clone())]),
    );
    server.faults.add(
        Rule::get("/flip/", Fault::StallBody(0, Duration::from_secs(3)))
            .ranges_from(8 << 20)
            .times(2),
    );
    server
        .faults
        .add(Rule::get("/flip/", Fault::CorruptBody(4321)));
    let text = csi_catalog(dir.path(), &server, "1GiB", &["flip"]);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-1/mount");
    let lazy = Volume {
        attributes: &[("start", "lazy")],
        ..volume("vol-1", "uid-1", "flip", &target)
    };
    csi.publish_when_ready(&lazy);

    let file = std::fs::File::open(target.join("big.bin")).unwrap();
    let mut head = vec![0; 1 << 20];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0).unwrap();
    assert_ne!(head[4321], big[4321], "the first attempt's byte was served");
    crate::support::wait_until("ready", Duration::from_secs(60), || {
        daemon.status("flip")["state"] == "ready"
    });
    let again = std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0).unwrap_err();
    assert_eq!(again.raw_os_error(), Some(libc::EIO), "{again}");
    assert!(std::fs::read(target.join("big.bin")).unwrap() == big);
    let condition = csi
        .volume_stats("vol-1", &target)
        .unwrap()
        .volume_condition
        .unwrap();
    assert!(condition.abnormal, "{condition:?}");
    assert!(
        condition.message.contains("flip/big.bin") && condition.message.contains("rejected"),
        "{condition:?}"
    );
    drop(file);
    csi.unpublish("vol-1", &target).unwrap();
}
