//! What a lease pins survives daemon restarts: an incomplete snapshot a lazy view reads is never
//! removed, even behind a newer one; a kill -9 and a restart resume it; an object replaced
//! upstream since it was frozen fails alone; the lease listing says where each snapshot stands.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::csi::{volume, Csi};
use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::faults::{Fault, Rule};
use crate::support::{
    assert_mirror, content, files, has_ready, records_durable_parts, wait_until, Server, MIB,
};

const PREFIX: &str = "p/";

/// The dataset `p` (`a.txt`, a 24 MiB `big.bin`, `z.txt`) seeded on `server`, every GET of
/// `z.txt` refused for now (it does not land), and a catalog of it: the files and the catalog.
fn seeded(server: &Server, dir: &Path, seed: u64) -> (BTreeMap<String, Vec<u8>>, String) {
    let data = files(&[
        ("a.txt", content(seed, 3000)),
        ("big.bin", content(seed + 1, 24 * MIB)),
        ("z.txt", content(seed + 2, 4000)),
    ]);
    server.seed(PREFIX, &data);
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("z.txt", Fault::Status(403, "AccessDenied")).times(usize::MAX)
    });
    let text = catalog(dir, &server.target, "1GiB", "", &[dataset("p", PREFIX)]);
    (data, text)
}

/// The in-process server acting as a versioned bucket: a replaced object's old version is gone.
fn versioned_server() -> Server {
    let server = Server::local();
    let versioned = &server.faults.versioned;
    versioned.store(true, std::sync::atomic::Ordering::Relaxed);
    server
}

/// `big.bin`'s second ranged GET stalls for `stall` after 1 MiB.
fn stalled_big(stall: Duration) -> Rule {
    Rule::get("big.bin", Fault::StallBody(MIB, stall)).skip(1)
}

/// Asks for a hydration of `p` and leases the snapshot it lists as `holder` (a lazy volume's
/// lease): its digest.
fn warm_and_lease(daemon: &Daemon, holder: &str, not: Option<&str>) -> String {
    let mut digest = String::new();
    wait_until(
        "a new snapshot listed and leased",
        Duration::from_secs(60),
        || {
            daemon.request("POST", "/v1/datasets/p/warm", "");
            let status = daemon.status("p");
            let Some(listed) = status["snapshot"]
                .as_str()
                .filter(|_| status["state"] == "hydrating")
            else {
                return false;
            };
            if Some(listed) == not {
                return false;
            }
            let body = format!(r#"{{"snapshot": "{listed}", "ttl_seconds": 3600}}"#);
            let (code, _) =
                daemon.request("PUT", &format!("/v1/datasets/p/leases/{holder}"), &body);
            digest = listed.to_string();
            code == 200
        },
    );
    digest
}

/// `POST .../want` for `key` of `snapshot`, asked again while the daemon answers 202 or 409 (as
/// the plugin's view does): the final code and body.
fn want(daemon: &Daemon, snapshot: &str, key: &str) -> (u16, String) {
    let body = format!(r#"{{"snapshot": "{snapshot}", "key": "{key}"}}"#);
    let mut answer = (0, String::new());
    wait_until(
        &format!("an answer for {key}"),
        Duration::from_secs(120),
        || {
            answer = daemon.request("POST", "/v1/datasets/p/want", &body);
            !matches!(answer.0, 202 | 409)
        },
    );
    answer
}

/// The condition the lease listing gives `holder`'s snapshot.
fn condition(daemon: &Daemon, holder: &str) -> serde_json::Value {
    let (code, body) = daemon.request("GET", "/v1/leases", "");
    assert_eq!(code, 200, "{body}");
    let leases: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let lease = leases.iter().find(|l| l["holder"] == holder);
    lease.unwrap_or_else(|| panic!("no lease of {holder}: {body}"))["condition"].clone()
}

fn snapshot_dir(dir: &Path, digest: &str) -> PathBuf {
    dir.join("cache/p").join(digest)
}

fn wait_for_durable_parts(dir: &Path) {
    let journal = dir.join(".hydrator/manifest.journal");
    wait_until("durable parts recorded", Duration::from_secs(60), || {
        records_durable_parts(&journal)
    });
}

#[test]
fn a_leased_incomplete_snapshot_behind_a_newer_one_survives_a_kill_and_completes() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    // The first snapshot ends short (z.txt refused) after its lazy pod leased it.
    let (first, text) = seeded(&server, dir.path(), 1);
    server.faults.add(stalled_big(Duration::from_secs(3)));
    let mut daemon = Daemon::start(dir.path(), &server.target, &text);
    let older = warm_and_lease(&daemon, "pod-a:vol", None);
    wait_until("the first hydration ends", Duration::from_secs(60), || {
        daemon.status("p")["state"] != "hydrating"
    });
    // The dataset changes; a newer snapshot, leased by another pod, is cut short by a kill -9.
    server.faults.clear();
    let mut second = first.clone();
    second.insert("new.txt".into(), content(4, 5000));
    server.seed(PREFIX, &files(&[("new.txt", second["new.txt"].clone())]));
    server.faults.add(stalled_big(Duration::from_secs(60)));
    let newer = warm_and_lease(&daemon, "pod-b:vol", Some(&older));
    wait_for_durable_parts(&snapshot_dir(dir.path(), &newer));
    daemon.kill();
    server.faults.clear();

    daemon.start_again();
    for digest in [&older, &newer] {
        assert!(
            snapshot_dir(dir.path(), digest).is_dir(),
            "the leased snapshot {digest} was removed at start\n{}",
            daemon.log()
        );
    }
    let (code, body) = want(&daemon, &older, "p/z.txt");
    assert_eq!(code, 200, "{body}\n{}", daemon.log());
    let (code, body) = want(&daemon, &newer, "p/new.txt");
    assert_eq!(code, 200, "{body}\n{}", daemon.log());
    wait_until("both snapshots ready", Duration::from_secs(120), || {
        has_ready(&snapshot_dir(dir.path(), &older)) && has_ready(&snapshot_dir(dir.path(), &newer))
    });
    assert_mirror(&snapshot_dir(dir.path(), &older), &first);
    assert_mirror(&snapshot_dir(dir.path(), &newer), &second);
    for holder in ["pod-a:vol", "pod-b:vol"] {
        assert_eq!(condition(&daemon, holder)["state"], "ready");
    }
    assert_eq!(
        daemon.status("p")["snapshot"],
        newer,
        "the newer snapshot is served"
    );
}

#[test]
fn an_object_replaced_upstream_fails_alone_in_a_leased_snapshot_resumed_after_a_kill() {
    let server = versioned_server();
    let dir = tempfile::tempdir().unwrap();
    let (frozen, text) = seeded(&server, dir.path(), 11);
    server.faults.add(stalled_big(Duration::from_secs(60)));
    let mut daemon = Daemon::start(dir.path(), &server.target, &text);
    let digest = warm_and_lease(&daemon, "pod-a:vol", None);
    let snapshot = snapshot_dir(dir.path(), &digest);
    wait_for_durable_parts(&snapshot);
    daemon.kill();
    // z.txt is replaced: its frozen version is gone from the versioned bucket.
    server.faults.clear();
    server.seed(PREFIX, &files(&[("z.txt", content(14, 4000))]));

    daemon.start_again();
    let (code, body) = want(&daemon, &digest, "p/z.txt");
    assert_eq!(code, 422, "{body}\n{}", daemon.log());
    assert!(body.contains("p/z.txt"), "{body}");
    let (code, body) = want(&daemon, &digest, "p/big.bin");
    assert_eq!(code, 200, "{body}\n{}", daemon.log());
    wait_until(
        "the resumed hydration ends",
        Duration::from_secs(60),
        || condition(&daemon, "pod-a:vol")["state"] == "failed",
    );
    let failed = condition(&daemon, "pod-a:vol");
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("p/z.txt"), "{failed}");
    assert!(!has_ready(&snapshot), "READY on an incomplete snapshot");
    for name in ["a.txt", "big.bin"] {
        assert_eq!(
            std::fs::read(snapshot.join(name)).unwrap(),
            frozen[name],
            "{name}"
        );
    }
    assert!(!snapshot.join("z.txt").exists());
    // After the hydration ended, what landed is still answered, and what did not fails.
    let (code, body) = want(&daemon, &digest, "p/big.bin");
    assert_eq!(code, 200, "{body}");
    let (code, body) = want(&daemon, &digest, "p/z.txt");
    assert_eq!(code, 422, "{body}");
    // The snapshot stays pinned through another restart, its condition the same.
    daemon.kill();
    daemon.start_again();
    assert!(snapshot.is_dir(), "{}", daemon.log());
    wait_until("resumed again and ended", Duration::from_secs(60), || {
        condition(&daemon, "pod-a:vol")["state"] == "failed"
    });
    // Once its lease is released, nothing keeps it.
    let (code, body) = daemon.request("DELETE", "/v1/datasets/p/leases/pod-a:vol", "");
    assert_eq!(code, 204, "{body}");
    wait_until(
        "the unleased snapshot removed",
        Duration::from_secs(30),
        || !snapshot.exists(),
    );
}

#[test]
fn a_lazy_pod_reads_on_through_a_daemon_kill_and_its_volume_names_the_object_that_changed() {
    let server = versioned_server();
    let dir = tempfile::tempdir().unwrap();
    let shards: BTreeMap<String, Vec<u8>> = (0..120)
        .map(|i| (format!("s-{i:03}.bin"), content(700 + i as u64, 64 << 10)))
        .collect();
    server.seed("lv/", &shards);
    // 120 GETs of a second each, 8 at a time: still hydrating when the daemon is killed.
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("/lv/", Fault::StallBody(0, Duration::from_secs(1))).times(usize::MAX)
    });
    let specs = [DatasetSpec {
        refresh_seconds: 3600,
        extra: "start = \"lazy\"",
        ..dataset("lv", "lv/")
    }];
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs)
        .replace("[listen]\n", "[listen]\nadmins = [\"uid:0\"]\n");
    let mut daemon = Daemon::start(dir.path(), &server.target, &text);
    let csi = Csi::start(dir.path(), &daemon);
    let target = dir.path().join("pods/uid-1/mount");
    csi.publish_when_ready(&volume("vol-1", "uid-1", "lv", &target));
    assert!(std::fs::read(target.join("s-000.bin")).unwrap() == shards["s-000.bin"]);
    let digest = daemon.status("lv")["snapshot"]
        .as_str()
        .unwrap()
        .to_string();

    // The daemon is killed; meanwhile the last shard is replaced upstream (its frozen version
    // is gone) and the store speeds up.
    daemon.kill();
    server.faults.clear();
    server.seed("lv/", &files(&[("s-119.bin", content(1, 64 << 10))]));
    daemon.start_again();

    let snapshot = dir.path().join("cache/lv").join(&digest);
    assert!(snapshot.is_dir(), "{}", daemon.log());
    let err = std::fs::read(target.join("s-119.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    for (name, bytes) in shards.iter().filter(|(name, _)| *name != "s-119.bin") {
        assert!(
            std::fs::read(target.join(name)).unwrap() == *bytes,
            "{name}"
        );
    }
    // What the kubelet (with volume health on) puts in the pod's events.
    let mut condition = None;
    wait_until(
        "the volume reported abnormal",
        Duration::from_secs(60),
        || {
            let stats = csi.volume_stats("vol-1", &target).unwrap();
            condition = stats.volume_condition.filter(|c| c.abnormal);
            condition.is_some()
        },
    );
    let condition = condition.unwrap();
    assert!(condition.message.contains("lv/s-119.bin"), "{condition:?}");
    assert!(!has_ready(&snapshot), "READY on an incomplete snapshot");
    csi.unpublish("vol-1", &target).unwrap();
}
