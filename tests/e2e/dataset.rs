//! A dataset as a unit: manifest, resume after `kill -9`, READY, verify and repair, `--delete`,
//! locking, snapshots.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::support::faults::{Fault, Rule};
use crate::support::{
    assert_mirror, content, corrupt_keeping_mtime, files, read_tree, temp_dest, Server, MIB,
    VERSIONED_BUCKET,
};

fn ready(dest: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read(dest.join(".hydrator/READY")).ok()?;
    Some(serde_json::from_slice(&text).expect("READY is JSON"))
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn verify(server: &Server, dest: &Path, repair: bool) -> Output {
    let mut args = vec![OsStr::new("verify"), dest.as_os_str()];
    if repair {
        args.push(OsStr::new("--repair"));
        args.push(OsStr::new("--progress"));
        args.push(OsStr::new("none"));
    }
    server.hydrator(&args)
}

fn resume_dataset() -> BTreeMap<String, Vec<u8>> {
    let mut data = files(&[("small.txt", content(80, 1000)), ("empty", vec![])]);
    for i in 0..4 {
        data.insert(
            format!("shards/{i}.bin"),
            content(81 + i, 12 * MIB + i as usize * 4097),
        );
    }
    data
}

/// Kills the real binary with SIGKILL at random points of a multi-part download; after each
/// kill a re-run completes, verifies, and re-fetches no more than what was in flight.
#[test]
fn kill_9_at_random_points_then_resume() {
    let rounds: usize = std::env::var("HYDRATOR_KILL_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let server = Server::local();
    let expected = resume_dataset();
    let total: u64 = expected.values().map(|d| d.len() as u64).sum();
    server.seed("resume/", &expected);
    let args = ["--part-size", "1MiB", "--concurrency", "4"];
    let (concurrency, part_size) = (4u64, MIB as u64);
    // In flight at a kill: the parts being fetched, plus what the checkpointer had not yet made
    // durable (at most 32 MiB or 100 ms), plus what sat in loopback socket buffers.
    let bound = concurrency * part_size + (32 << 20) + concurrency * (4 << 20);

    // A whole run's length, to aim the kills inside it: the quicker of two runs (the first pays
    // for cold caches), shortened below whenever a kill comes too late, since a loaded machine
    // can make a calibration run far slower than the rounds that follow it.
    let mut full_run = Duration::MAX;
    for _ in 0..2 {
        let started = Instant::now();
        let (_tmp, calibration) = temp_dest();
        server.sync("resume/", &calibration, &args).assert_code(0);
        full_run = full_run.min(started.elapsed());
    }
    let mut resumed_total = 0;
    let mut killed = 0;
    for round in 0..rounds {
        let (_tmp, dest) = temp_dest();
        let before = server.faults.object_bytes.load(Relaxed);
        let mut child = crate::support::hydrator_command(&server.target)
            .args(["sync", "s3://hydrator-test/resume/"])
            .arg(&dest)
            .args([
                "--endpoint-url",
                &server.target.endpoint,
                "--progress",
                "none",
            ])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let kill_at = full_run.mul_f64(0.1 + 0.8 * fastrand::f64());
        std::thread::sleep(kill_at);
        let _ = child.kill();
        let _ = child.wait();
        if ready(&dest).is_some() {
            // The kill came after READY: READY must then be telling the truth.
            eprintln!("round {round}: the run had finished before the kill at {kill_at:?}");
            assert_mirror(&dest, &expected);
            full_run = kill_at.mul_f64(0.8);
            continue;
        }
        killed += 1;
        let run = server.sync("resume/", &dest, &args);
        run.assert_code(0);
        assert_mirror(&dest, &expected);
        assert!(
            ready(&dest).is_some(),
            "round {round}: READY after the resumed run"
        );
        let served = server.faults.object_bytes.load(Relaxed) - before;
        let wasted = served.saturating_sub(total);
        assert!(
            wasted <= bound,
            "round {round}: re-fetched {wasted} bytes, more than the {bound} in flight"
        );
        let resumed = run.count("bytes", "resumed");
        eprintln!(
            "round {round}: killed after {kill_at:?}; resumed {resumed} bytes, re-fetched {wasted}"
        );
        resumed_total += resumed;
        let checked = verify(&server, &dest, false);
        assert_eq!(code(&checked), 0, "round {round}: {}", text(&checked));
    }
    assert!(
        killed >= rounds / 2,
        "only {killed} of {rounds} kills landed mid-run"
    );
    assert!(
        resumed_total > 0,
        "no round resumed a part: the kills never landed mid-download"
    );
}

fn check_verify_and_repair(server: &Server, prefix: &str) {
    let expected = files(&[
        ("a.bin", content(90, 3 * MIB + 1)),
        ("dir/b.txt", content(91, 100)),
        ("c", content(92, 10)),
    ]);
    server.seed(prefix, &expected);
    let (_tmp, dest) = temp_dest();
    server
        .sync(prefix, &dest, &["--part-size", "1MiB"])
        .assert_code(0);
    let digest = ready(&dest).unwrap()["digest"].clone();
    assert_eq!(code(&verify(server, &dest, false)), 0);

    // A flipped byte, a deleted file and a stray file.
    corrupt_keeping_mtime(&dest.join("a.bin"), 2 * MIB + 5);
    std::fs::remove_file(dest.join("c")).unwrap();
    std::fs::write(dest.join("stray.tmp"), b"x").unwrap();
    let found = verify(server, &dest, false);
    assert_eq!(code(&found), 1, "{}", text(&found));
    let out = text(&found);
    assert!(
        out.contains("corrupt: a.bin")
            && out.contains("missing: c")
            && out.contains("not in the source: stray.tmp"),
        "{out}"
    );
    assert!(
        ready(&dest).is_some(),
        "a plain verify only reads (--repair removes READY before it fetches)"
    );

    let repaired = verify(server, &dest, true);
    assert_eq!(code(&repaired), 0, "{}", text(&repaired));
    std::fs::remove_file(dest.join("stray.tmp")).unwrap();
    assert_mirror(&dest, &expected);
    assert_eq!(
        ready(&dest).unwrap()["digest"],
        digest,
        "the same dataset, the same digest"
    );
    assert_eq!(code(&verify(server, &dest, false)), 0);
}

on_every_server!(
    verify_finds_damage_and_repair_fixes_it,
    check_verify_and_repair,
    "verify/"
);

/// A run that failed an object leaves DEST without READY: `verify` fails it and says how much
/// of the listing's selection it holds, in text and in JSON. hydrator's own `.partial` files
/// are never files "not in the source", for `verify` or for `sync`'s count; `--delete` removes
/// a leftover one.
#[test]
fn verify_without_ready_says_how_incomplete_and_partial_files_are_not_foreign() {
    let server = Server::local();
    let expected = files(&[
        ("a.txt", content(95, 1000)),
        ("dir/b.txt", content(96, 2000)),
        ("bad.bin", content(97, 3 * MIB)),
    ]);
    server.seed("incomplete/", &expected);
    server
        .faults
        .add(Rule::get("bad.bin", Fault::TruncateBody(10)).times(usize::MAX));
    let (_tmp, dest) = temp_dest();
    server
        .sync("incomplete/", &dest, &["--part-size", "1MiB"])
        .assert_code(1);
    assert!(ready(&dest).is_none());
    // What a run cut short leaves of an object the source has since dropped.
    std::fs::write(dest.join("dir/.gone.bin.partial"), b"half").unwrap();

    let found = verify(&server, &dest, false);
    assert_eq!(code(&found), 1, "{}", text(&found));
    let out = text(&found);
    assert!(
        out.contains("READY missing: the manifest records 2 of 3 objects (2.9 KiB of 3.0 MiB)"),
        "{out}"
    );
    assert!(!out.contains(".partial"), "{out}");
    assert!(out.contains("0 files not in the source"), "{out}");
    let json = server.hydrator(&[
        OsStr::new("verify"),
        dest.as_os_str(),
        OsStr::new("--log-format"),
        OsStr::new("json"),
    ]);
    let finding = String::from_utf8_lossy(&json.stderr)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["fields"]["finding"] == "ready_missing")
        .unwrap_or_else(|| panic!("{}", text(&json)));
    assert_eq!(finding["level"], "ERROR");
    assert_eq!(finding["fields"]["recorded_objects"], 2);
    assert_eq!(finding["fields"]["selected_objects"], 3);
    assert_eq!(finding["fields"]["selected_bytes"], 3 * MIB as u64 + 3000);

    server.faults.clear();
    let repaired = verify(&server, &dest, true);
    assert_eq!(code(&repaired), 0, "{}", text(&repaired));
    assert!(ready(&dest).is_some());
    assert_eq!(code(&verify(&server, &dest, false)), 0);
    for args in [&["--dry-run"][..], &[]] {
        let again = server.sync("incomplete/", &dest, args);
        again.assert_code(0);
        assert_eq!(
            again.count("objects", "foreign"),
            0,
            "{args:?}: {}",
            again.stderr()
        );
    }
    server
        .sync("incomplete/", &dest, &["--delete"])
        .assert_code(0);
    assert!(!dest.join("dir/.gone.bin.partial").exists());
    assert_mirror(&dest, &expected);
}

#[test]
fn warm_rerun_reads_nothing_and_refetches_what_was_removed() {
    let server = Server::local();
    let expected = files(&[
        ("x.bin", content(100, 2 * MIB)),
        ("y.bin", content(101, 5000)),
    ]);
    server.seed("warm/", &expected);
    let (_tmp, dest) = temp_dest();
    server.sync("warm/", &dest, &[]).assert_code(0);
    let before = server.faults.object_bytes.load(Relaxed);
    let again = server.sync("warm/", &dest, &[]);
    again.assert_code(0);
    assert_eq!(again.count("objects", "skipped"), 2);
    assert_eq!(
        server.faults.object_bytes.load(Relaxed),
        before,
        "a warm run fetches no object data"
    );
    std::fs::remove_file(dest.join("y.bin")).unwrap();
    let refetch = server.sync("warm/", &dest, &[]);
    refetch.assert_code(0);
    assert_eq!(refetch.count("objects", "downloaded"), 1);
    assert_mirror(&dest, &expected);
}

#[test]
fn torn_and_corrupt_manifest_tails_are_ignored() {
    let server = Server::local();
    let expected = files(&[("one", content(110, 700)), ("two", content(111, 800))]);
    server.seed("journal/", &expected);
    let (_tmp, dest) = temp_dest();
    server.sync("journal/", &dest, &[]).assert_code(0);
    let journal = dest.join(".hydrator/manifest.journal");

    // A torn tail: half a record's header at the end.
    let mut bytes = std::fs::read(&journal).unwrap();
    bytes.extend_from_slice(&[0x40, 0, 0]);
    std::fs::write(&journal, &bytes).unwrap();
    let torn = server.sync("journal/", &dest, &[]);
    torn.assert_code(0);
    assert_eq!(
        torn.count("objects", "downloaded"),
        0,
        "nothing lost to a torn tail"
    );

    // A corrupt last record in the base (the last file's Complete): that file is fetched again.
    let base = dest.join(".hydrator/manifest.base");
    let mut bytes = std::fs::read(&base).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0xff;
    std::fs::write(&base, &bytes).unwrap();
    let corrupt = server.sync("journal/", &dest, &[]);
    corrupt.assert_code(0);
    assert_eq!(
        corrupt.count("objects", "downloaded"),
        1,
        "only the record that failed its checksum is lost"
    );
    assert_mirror(&dest, &expected);
    assert_eq!(code(&verify(&server, &dest, false)), 0);
}

fn check_delete(server: &Server, prefix: &str) {
    let expected = files(&[
        ("keep/a.txt", content(120, 50)),
        ("b.txt", content(121, 60)),
    ]);
    server.seed(prefix, &expected);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"do not touch").unwrap();
    let (_tmp, dest) = temp_dest();
    std::fs::create_dir_all(dest.join("old/deeper")).unwrap();
    std::fs::write(dest.join("old/deeper/gone.txt"), b"stale").unwrap();
    std::fs::write(dest.join("stale.txt"), b"stale").unwrap();
    std::os::unix::fs::symlink(outside.path(), dest.join("link-to-dir")).unwrap();
    std::fs::create_dir_all(dest.join("keep")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("precious"),
        dest.join("keep/link-to-file"),
    )
    .unwrap();
    std::fs::write(dest.join("excluded.log"), b"outside the filters").unwrap();

    // Without --delete, nothing local is removed.
    let run = server.sync(prefix, &dest, &["--exclude", "*.log"]);
    run.assert_code(0);
    assert!(dest.join("stale.txt").exists());

    let run = server.sync(prefix, &dest, &["--delete", "--exclude", "*.log"]);
    run.assert_code(0);
    let mut kept = expected.clone();
    kept.insert("excluded.log".into(), b"outside the filters".to_vec());
    assert_mirror(&dest, &kept);
    assert!(
        !dest.join("old").exists(),
        "emptied directories are removed"
    );
    assert_eq!(run.count("objects", "deleted"), 4);
    assert_eq!(
        std::fs::read(outside.path().join("precious")).unwrap(),
        b"do not touch"
    );
    assert!(ready(&dest).is_some());
    assert!(dest.join(".hydrator/manifest.journal").exists());
}

on_every_server!(
    delete_removes_only_what_is_not_in_the_source,
    check_delete,
    "delete/"
);

#[test]
fn two_syncs_on_one_dest_fetch_each_object_once() {
    let server = Server::local();
    let expected = files(&[
        ("a.bin", content(130, 6 * MIB)),
        ("b.bin", content(131, 3 * MIB)),
    ]);
    let total: u64 = expected.values().map(|d| d.len() as u64).sum();
    server.seed("twice/", &expected);
    let (_tmp, dest) = temp_dest();
    let before = server.faults.object_bytes.load(Relaxed);
    let spawn = |report: &str| {
        crate::support::hydrator_command(&server.target)
            .args(["sync", "s3://hydrator-test/twice/"])
            .arg(&dest)
            .args([
                "--endpoint-url",
                &server.target.endpoint,
                "--progress",
                "none",
                "--report",
            ])
            .arg(dest.with_extension(report))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (first, second) = (spawn("1.json"), spawn("2.json"));
    let (first, second) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    assert_eq!(
        (code(&first), code(&second)),
        (0, 0),
        "{}\n{}",
        text(&first),
        text(&second)
    );
    assert!(
        text(&first).contains("waiting") || text(&second).contains("waiting"),
        "one of them waited for the lock"
    );
    assert_mirror(&dest, &expected);
    let served = server.faults.object_bytes.load(Relaxed) - before;
    assert_eq!(served, total, "every object was fetched exactly once");
    assert!(ready(&dest).is_some());
}

#[test]
fn lock_timeout_bounds_the_wait() {
    let server = Server::local();
    let (_tmp, dest) = temp_dest();
    std::fs::create_dir_all(dest.join(".hydrator")).unwrap();
    let holder = std::fs::File::create(dest.join(".hydrator/lock")).unwrap();
    // SAFETY: valid fd.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&holder), libc::LOCK_EX) },
        0
    );
    let run = server.sync("none/", &dest, &["--lock-timeout", "1"]);
    run.assert_code(1);
    assert!(run.stderr().contains("timed out"), "{}", run.stderr());
}

/// Runs `hydrator snapshot` of `prefix` into a new directory; returns it, the snapshot file and
/// its content.
fn make_snapshot(server: &Server, prefix: &str) -> (tempfile::TempDir, PathBuf, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("dataset.lock");
    let snapshot = server.snapshot(prefix, &lock);
    (dir, lock, snapshot)
}

/// `hydrator sync --snapshot LOCK DEST ARGS... --progress none`.
fn sync_snapshot(server: &Server, lock: &Path, dest: &Path, args: &[&str]) -> Output {
    let mut all = vec![
        OsStr::new("sync"),
        OsStr::new("--snapshot"),
        lock.as_os_str(),
        dest.as_os_str(),
        OsStr::new("--progress"),
        OsStr::new("none"),
    ];
    all.extend(args.iter().map(OsStr::new));
    server.hydrator(&all)
}

fn check_snapshot(server: &Server, prefix: &str) {
    let expected = files(&[
        ("m.bin", content(140, 2 * MIB + 3)),
        ("n.txt", content(141, 10)),
    ]);
    server.seed(prefix, &expected);
    let (dir, lock, snapshot) = make_snapshot(server, prefix);
    assert_eq!(snapshot["objects"], 2);

    let dest = dir.path().join("dest");
    let sync = |dest: &Path| sync_snapshot(server, &lock, dest, &[]);
    let first = sync(&dest);
    assert_eq!(code(&first), 0, "{}", text(&first));
    assert_mirror(&dest, &expected);
    assert_eq!(ready(&dest).unwrap()["snapshot"], snapshot["digest"]);

    // Already there: no S3 request at all.
    let requests = server.faults.requests.load(Relaxed);
    let started = Instant::now();
    let again = sync(&dest);
    let took = started.elapsed();
    assert_eq!(code(&again), 0, "{}", text(&again));
    assert_eq!(
        server.faults.requests.load(Relaxed),
        requests,
        "no request when DEST holds the snapshot"
    );
    assert!(took < Duration::from_secs(5));
    assert!(text(&again).contains("nothing written"), "{}", text(&again));
    // The same against an endpoint where nothing listens (meaningful on every server: any
    // request would fail the run).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let offline = server.hydrator(&[
        OsStr::new("sync"),
        OsStr::new("--snapshot"),
        lock.as_os_str(),
        dest.as_os_str(),
        OsStr::new("--endpoint-url"),
        OsStr::new(&nowhere),
    ]);
    assert_eq!(code(&offline), 0, "{}", text(&offline));

    // The object changes on the server. Where the bucket keeps versions (moto, MinIO), the snapshot
    // pinned them and hydrating it elsewhere still gets the old bytes; elsewhere it fails and
    // names the object.
    server.seed(prefix, &files(&[("m.bin", content(142, 100))]));
    let other = dir.path().join("other");
    let changed = sync(&other);
    let entries = snapshot["entries"].as_array().unwrap();
    if server.target.bucket == VERSIONED_BUCKET {
        assert!(
            entries.iter().all(|e| e["version_id"].is_string()),
            "{snapshot}"
        );
        assert_eq!(code(&changed), 0, "{}", text(&changed));
        assert_mirror(&other, &expected);
        return;
    }
    assert!(entries.iter().all(|e| e["version_id"].is_null()));
    assert_eq!(code(&changed), 1, "{}", text(&changed));
    assert!(
        text(&changed).contains(&format!("{prefix}m.bin")) && text(&changed).contains("changed"),
        "{}",
        text(&changed)
    );
    assert!(ready(&other).is_none());
}

on_every_server!(snapshot_pins_the_dataset, check_snapshot, "snap/");

/// In a versioned bucket a snapshot records version ids and every GET asks for that version; a
/// version that no longer exists is an error that names the object.
#[test]
fn snapshot_of_a_versioned_bucket_pins_versions() {
    let server = Server::local();
    server.faults.versioned.store(true, Relaxed);
    let expected = files(&[
        ("v.bin", content(160, 3 * MIB)),
        ("w.txt", content(161, 10)),
    ]);
    server.seed("versioned/", &expected);
    let (dir, lock, snapshot) = make_snapshot(&server, "versioned/");
    let versions: Vec<&str> = snapshot["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["version_id"].as_str().unwrap())
        .collect();
    assert_eq!(versions.len(), 2);
    assert!(versions.iter().all(|v| v.starts_with('v')), "{versions:?}");

    let sync = |dest: &Path| sync_snapshot(&server, &lock, dest, &[]);
    let dest = dir.path().join("dest");
    let first = sync(&dest);
    assert_eq!(code(&first), 0, "{}", text(&first));
    assert_mirror(&dest, &expected);
    assert!(
        server.faults.versioned_gets.load(Relaxed) >= 2,
        "GETs ask for the recorded versions"
    );

    server.seed("versioned/", &files(&[("w.txt", content(162, 10))]));
    let other = dir.path().join("other");
    let gone = sync(&other);
    assert_eq!(code(&gone), 1, "{}", text(&gone));
    assert!(text(&gone).contains("versioned/w.txt"), "{}", text(&gone));
}

/// On a real server that keeps versions (moto, MinIO): a snapshot pins every object's version
/// id, a multipart object (a composite CRC32) is hydrated and checked, an object overwritten or
/// deleted after the snapshot is hydrated at its pinned version, and a pinned version that was
/// itself deleted is an error naming the object and the version.
fn check_pinned_versions(server: &Server) {
    let prefix = "pinned/";
    let mut expected = files(&[("a.txt", content(170, 100)), ("b.txt", content(171, 200))]);
    server.seed(prefix, &expected);
    expected.insert("big.bin".into(), content(172, 11 * MIB + 7));
    let uploaded = server.seed_multipart("pinned/big.bin", &expected["big.bin"], 5 * MIB);
    assert!(uploaded.is_some(), "the bucket keeps versions");
    let (dir, lock, snapshot) = make_snapshot(server, prefix);
    let pinned: BTreeMap<&str, &str> = snapshot["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["key"].as_str().unwrap(),
                e["version_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(pinned.len(), 3, "{snapshot}");
    assert_eq!(pinned["pinned/big.bin"], uploaded.as_deref().unwrap());

    server.seed(prefix, &files(&[("a.txt", content(173, 50))]));
    server.runtime.block_on(async {
        let deleted = server.client.delete_object().bucket(&server.target.bucket);
        deleted.key("pinned/b.txt").send().await.unwrap();
    });
    let sync = |dest: &Path| sync_snapshot(server, &lock, dest, &["--part-size", "1MiB"]);
    let dest = dir.path().join("dest");
    let hydrated = sync(&dest);
    assert_eq!(code(&hydrated), 0, "{}", text(&hydrated));
    assert_mirror(&dest, &expected);

    let version = pinned["pinned/a.txt"];
    server.runtime.block_on(async {
        let deleted = server.client.delete_object().bucket(&server.target.bucket);
        deleted
            .key("pinned/a.txt")
            .version_id(version)
            .send()
            .await
            .unwrap();
    });
    let lost = sync(&dir.path().join("other"));
    assert_eq!(code(&lost), 1, "{}", text(&lost));
    assert!(
        text(&lost).contains(&format!("pinned/a.txt (version {version})")),
        "{}",
        text(&lost)
    );
}

#[test]
fn a_snapshot_on_moto_hydrates_pinned_versions_after_overwrites_and_deletes() {
    if let Some(server) = Server::moto() {
        check_pinned_versions(&server);
    }
}

#[test]
fn a_snapshot_on_minio_hydrates_pinned_versions_after_overwrites_and_deletes() {
    if let Some(server) = Server::minio() {
        check_pinned_versions(&server);
    }
}

/// MinIO's bucket that keeps no versions lists every version id as "null": the snapshot pins
/// ETags instead, and a changed object is an error.
#[test]
fn a_snapshot_on_a_minio_bucket_without_versions_pins_etags() {
    if let Some(server) = Server::minio_plain() {
        check_snapshot(&server, "snap-plain/");
    }
}

/// A snapshot hydrated with filters is not the whole snapshot: a later unfiltered sync of it
/// fetches the rest. A repair of a snapshot DEST stays pinned to the snapshot.
#[test]
fn snapshot_shortcut_respects_filters_and_repair_stays_pinned() {
    let server = Server::local();
    let expected = files(&[
        ("keep/a.bin", content(180, 1000)),
        ("rest/b.bin", content(181, 2000)),
    ]);
    server.seed("snapfilter/", &expected);
    let (dir, lock, _) = make_snapshot(&server, "snapfilter/");
    let dest = dir.path().join("dest");
    let sync = |extra: &[&str]| {
        let mut args = vec![
            OsStr::new("sync"),
            OsStr::new("--snapshot"),
            lock.as_os_str(),
            dest.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        server.hydrator(&args)
    };
    assert_eq!(code(&sync(&["--include", "keep/**"])), 0);
    assert!(!dest.join("rest/b.bin").exists());
    let whole = sync(&[]);
    assert_eq!(code(&whole), 0, "{}", text(&whole));
    assert_mirror(&dest, &expected);

    std::fs::remove_file(dest.join("rest/b.bin")).unwrap();
    let unpinned = verify(&server, &dest, true);
    assert_eq!(code(&unpinned), 2, "{}", text(&unpinned));
    assert!(
        text(&unpinned).contains("--snapshot"),
        "{}",
        text(&unpinned)
    );
    let pinned = server.hydrator(&[
        OsStr::new("verify"),
        dest.as_os_str(),
        OsStr::new("--repair"),
        OsStr::new("--snapshot"),
        lock.as_os_str(),
    ]);
    assert_eq!(code(&pinned), 0, "{}", text(&pinned));
    assert_mirror(&dest, &expected);
    assert!(ready(&dest).unwrap()["snapshot"].is_string());
}

#[test]
fn delete_keeps_local_copies_when_objects_failed() {
    let server = Server::local();
    server.seed(
        "delfail/",
        &files(&[
            ("ok.txt", content(190, 10)),
            ("bad.bin", content(191, 3 * MIB)),
        ]),
    );
    let (_tmp, dest) = temp_dest();
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("stale.txt"), b"old").unwrap();
    server.faults.add(
        crate::support::faults::Rule::get(
            "bad.bin",
            crate::support::faults::Fault::TruncateBody(10),
        )
        .times(usize::MAX),
    );
    let run = server.sync("delfail/", &dest, &["--delete", "--part-size", "1MiB"]);
    run.assert_code(1);
    assert!(
        dest.join("stale.txt").exists(),
        "nothing is deleted by a run that failed"
    );
}

/// A snapshot sealed from a DEST that hydrated it records each object's BLAKE3; a hydration of
/// the sealed snapshot whose bytes differ from the seal (here a byte flipped in transit, which
/// no checksum of the server covers) publishes nothing of that object and names it.
#[test]
fn a_sealed_snapshot_publishes_no_byte_that_differs_from_the_seal() {
    let server = Server::local();
    let expected = files(&[
        ("big.bin", content(150, 3 * MIB)),
        ("small.txt", content(151, 100)),
    ]);
    server.seed_without_checksum("sealed/", &expected);
    let (dir, lock, _) = make_snapshot(&server, "sealed/");
    let sealer = dir.path().join("sealer");
    let first = sync_snapshot(&server, &lock, &sealer, &[]);
    assert_eq!(code(&first), 0, "{}", text(&first));

    let sealed_lock = dir.path().join("sealed.lock");
    let url = format!("s3://{}/sealed/", server.target.bucket);
    let seal = |from: &Path, dest: &Path| {
        server.hydrator(&[
            OsStr::new("snapshot"),
            OsStr::new(&url),
            OsStr::new("--from"),
            from.as_os_str(),
            OsStr::new("--seal"),
            dest.as_os_str(),
            OsStr::new("-o"),
            sealed_lock.as_os_str(),
        ])
    };
    let made = seal(&lock, &sealer);
    assert_eq!(code(&made), 0, "{}", text(&made));
    assert!(
        text(&made).contains("sealed with the BLAKE3"),
        "{}",
        text(&made)
    );
    let sealed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&sealed_lock).unwrap()).unwrap();
    assert_eq!(sealed["version"], 2);
    for entry in sealed["entries"].as_array().unwrap() {
        let key = entry["key"].as_str().unwrap().trim_start_matches("sealed/");
        let hash = blake3::hash(&expected[key]).to_hex().to_string();
        assert_eq!(entry["blake3"], hash.as_str(), "{key}");
    }
    // An empty DEST seals nothing: the error says what to do.
    let refused = seal(&lock, &dir.path().join("empty"));
    assert_eq!(code(&refused), 2, "{}", text(&refused));
    assert!(
        text(&refused).contains("sync the snapshot into it first"),
        "{}",
        text(&refused)
    );

    // A byte flipped on the way, in an object the server sends without a checksum.
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("sealed/big.bin", Fault::CorruptBody(MIB + 7)).times(usize::MAX)
    });
    let node = dir.path().join("node");
    let run = sync_snapshot(&server, &sealed_lock, &node, &[]);
    assert_ne!(code(&run), 0, "{}", text(&run));
    assert!(
        text(&run).contains("sealed/big.bin")
            && text(&run).contains("do not match the sealed snapshot"),
        "{}",
        text(&run)
    );
    assert!(ready(&node).is_none());
    assert!(!node.join("big.bin").exists(), "not published");
    let leftovers: Vec<_> = std::fs::read_dir(&node)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name.to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(
        std::fs::read(node.join("small.txt")).unwrap(),
        expected["small.txt"]
    );

    // The same bytes, unsealed, would have been published: the seal is what caught them.
    let unsealed_dest = dir.path().join("unsealed");
    let unsealed = sync_snapshot(&server, &lock, &unsealed_dest, &[]);
    assert_eq!(code(&unsealed), 0, "{}", text(&unsealed));
    assert_ne!(
        std::fs::read(unsealed_dest.join("big.bin")).unwrap(),
        expected["big.bin"]
    );
    server.faults.clear();
    let again = sync_snapshot(&server, &sealed_lock, &node, &[]);
    assert_eq!(code(&again), 0, "{}", text(&again));
    assert_mirror(&node, &expected);
}

/// `--shard I/4` on four nodes: shares that are disjoint, whose union is the dataset, the same
/// in every run, each READY and verified on its own.
#[test]
fn four_shards_are_disjoint_stable_and_together_the_dataset() {
    let server = Server::local();
    let expected: BTreeMap<String, Vec<u8>> = (0..40)
        .map(|i| {
            (
                format!("train/{i:03}.tar"),
                content(160 + i, 1000 + i as usize),
            )
        })
        .collect();
    server.seed("shards/", &expected);
    let dir = tempfile::tempdir().unwrap();
    let hydrate = |index: usize, round: &str| {
        let dest = dir.path().join(format!("{round}-{index}"));
        let run = server.sync("shards/", &dest, &["--shard", &format!("{index}/4")]);
        run.assert_code(0);
        let share = read_tree(&dest);
        (dest, share)
    };
    let mut union = BTreeMap::new();
    for index in 0..4 {
        let (dest, share) = hydrate(index, "first");
        assert!(
            !share.is_empty() && share.len() < expected.len(),
            "{index}: {}",
            share.len()
        );
        let ready = ready(&dest).unwrap();
        assert_eq!(ready["shard"], format!("{index}/4"));
        assert_eq!(ready["objects"], share.len());
        let checked = verify(&server, &dest, false);
        assert_eq!(code(&checked), 0, "{}", text(&checked));
        let (_, again) = hydrate(index, "second");
        assert_eq!(again, share, "the same share in every run");
        for (path, data) in share {
            assert!(
                union.insert(path.clone(), data).is_none(),
                "{path} in two shares"
            );
        }
    }
    assert_eq!(union, expected, "together the dataset");
    let refused = server.sync("shards/", &dir.path().join("bad"), &["--shard", "4/4"]);
    refused.assert_code(2);
    assert!(
        refused.stderr().contains("INDEX/COUNT"),
        "{}",
        refused.stderr()
    );
}
