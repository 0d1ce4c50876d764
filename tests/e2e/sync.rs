//! `sync`: sizes, keys, filters, hostile input, faults, writers.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::faults::{Fault, Rule};
use crate::support::{self, assert_mirror, content, files, report_hashes, temp_dest, Server, MIB};

/// Sizes around the part boundaries, several parts, and the empty and 1-byte objects.
fn boundary_files() -> BTreeMap<String, Vec<u8>> {
    files(&[
        ("empty", vec![]),
        ("one-byte", vec![42]),
        ("part-minus-one.bin", content(1, MIB - 1)),
        ("part-exact.bin", content(2, MIB)),
        ("part-plus-one.bin", content(3, MIB + 1)),
        ("nested/deeper/several-parts.bin", content(4, 5 * MIB + 123)),
    ])
}

fn check_boundaries(server: &Server, prefix: &str) {
    let expected = boundary_files();
    server.seed(prefix, &expected);
    let (_tmp, dest) = temp_dest();
    let run = server.sync(prefix, &dest, &["--part-size", "1MiB"]);
    run.assert_code(0);
    assert_mirror(&dest, &expected);
    let hashes = report_hashes(run.report());
    for (path, data) in &expected {
        assert_eq!(
            hashes[path],
            blake3::hash(data).to_hex().as_str(),
            "report hash of {path}"
        );
    }
    assert_eq!(run.count("objects", "downloaded"), expected.len() as u64);
    assert_eq!(run.report()["result"], "complete");

    // Up to date: a second run downloads nothing and still reports every hash.
    let again = server.sync(prefix, &dest, &["--part-size", "1MiB"]);
    again.assert_code(0);
    assert_eq!(again.count("objects", "downloaded"), 0);
    assert_eq!(again.count("objects", "skipped"), expected.len() as u64);
    assert_eq!(again.count("bytes", "received"), 0);
    assert_eq!(report_hashes(again.report()), hashes);

    // A local file changed behind our back (size differs) is fetched again.
    std::fs::write(dest.join("part-exact.bin"), b"tampered").unwrap();
    let repaired = server.sync(prefix, &dest, &["--part-size", "1MiB"]);
    repaired.assert_code(0);
    assert_eq!(repaired.count("objects", "downloaded"), 1);
    assert_mirror(&dest, &expected);
}

on_every_server!(boundary_sizes, check_boundaries, "sizes/");

fn special_key_files() -> BTreeMap<String, Vec<u8>> {
    files(&[
        ("with space.txt", content(10, 100)),
        ("unicodé/数据/файл.bin", content(11, 200)),
        ("plus+sign=equals.csv", content(12, 300)),
        ("percent%20literal%.txt", content(13, 400)),
        ("a/b/c/d/e/deep.txt", content(14, 500)),
        ("..dots../.hidden", content(15, 600)),
    ])
}

fn check_special_keys(server: &Server, prefix: &str) {
    let expected = special_key_files();
    server.seed(prefix, &expected);
    let (_tmp, dest) = temp_dest();
    server.sync(prefix, &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}

on_every_server!(special_keys, check_special_keys, "special-keys/");

fn check_thousand_small_files_and_filters(server: &Server, prefix: &str) {
    let all: BTreeMap<String, Vec<u8>> = (0..1000)
        .map(|i| {
            let ext = if i % 10 == 0 { "txt" } else { "jpg" };
            (
                format!("img/{:02}/{i:04}.{ext}", i % 7),
                content(i, 1 + (i as usize * 37) % 3000),
            )
        })
        .collect();
    server.seed(prefix, &all);
    let (_tmp, dest) = temp_dest();
    let run = server.sync(prefix, &dest, &["--concurrency", "32"]);
    run.assert_code(0);
    assert_mirror(&dest, &all);

    let (_tmp2, filtered) = temp_dest();
    let run = server.sync(
        prefix,
        &filtered,
        &["--include", "**/*.jpg", "--exclude", "img/03/**"],
    );
    run.assert_code(0);
    let expected: BTreeMap<_, _> = all
        .into_iter()
        .filter(|(k, _)| k.ends_with(".jpg") && !k.starts_with("img/03/"))
        .collect();
    assert_mirror(&filtered, &expected);
    assert_eq!(
        run.count("objects", "filtered_out"),
        1000 - expected.len() as u64
    );
}

on_every_server!(
    a_thousand_small_files_and_filters,
    check_thousand_small_files_and_filters,
    "thousand/"
);

#[test]
fn hostile_keys_are_refused_and_nothing_escapes() {
    let server = Server::local();
    let good = files(&[("good.bin", content(20, 1000))]);
    server.seed("hostile/", &good);
    let hostile: Vec<(String, u64)> = [
        "hostile/../escape.txt",
        "hostile/a/../../escape2.txt",
        "hostile//absolute.txt",
        "hostile/a//b.txt",
        "hostile/.hydrator/READY",
        "hostile/dir-with-data/",
    ]
    .iter()
    .map(|k| (k.to_string(), 5))
    .collect();
    server
        .faults
        .add(Rule::listing(Fault::InjectListing(hostile.clone())));
    let (tmp, dest) = temp_dest();
    let run = server.sync("hostile/", &dest, &[]);
    run.assert_code(1);
    assert_mirror(&dest, &good);
    let failures: Vec<String> = run.report()["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap().to_string())
        .collect();
    for (key, _) in &hostile {
        assert!(
            failures.contains(key),
            "{key} must be reported; got {failures:?}"
        );
        assert!(
            run.stderr().contains(key.as_str()),
            "{key} must be named in the log"
        );
    }
    // Nothing beside DEST but its report.
    let beside: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside.len(), 2, "{beside:?}");
}

#[test]
fn planted_symlink_in_dest_is_not_followed() {
    let server = Server::local();
    let source = files(&[
        ("shared/x.bin", content(21, 5000)),
        ("ok.bin", content(22, 10)),
    ]);
    server.seed("planted/", &source);
    let outside = tempfile::tempdir().unwrap();
    let (_tmp, dest) = temp_dest();
    std::fs::create_dir_all(&dest).unwrap();
    std::os::unix::fs::symlink(outside.path(), dest.join("shared")).unwrap();
    let run = server.sync("planted/", &dest, &[]);
    run.assert_code(1);
    assert!(
        run.stderr().contains("planted/shared/x.bin"),
        "{}",
        run.stderr()
    );
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing written through the symlink"
    );
    assert_eq!(
        std::fs::read(dest.join("ok.bin")).unwrap(),
        source["ok.bin"]
    );
}

#[test]
fn symlink_planted_at_a_partial_name_is_replaced_not_followed() {
    let server = Server::local();
    let source = files(&[("dir/x.bin", content(23, 5000))]);
    server.seed("partial-link/", &source);
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("victim");
    std::fs::write(&target, b"keep").unwrap();
    let (_tmp, dest) = temp_dest();
    std::fs::create_dir_all(dest.join("dir")).unwrap();
    std::os::unix::fs::symlink(&target, dest.join("dir/.x.bin.partial")).unwrap();
    server.sync("partial-link/", &dest, &[]).assert_code(0);
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"keep",
        "nothing written through the link"
    );
    assert_eq!(
        std::fs::read(dest.join("dir/x.bin")).unwrap(),
        source["dir/x.bin"]
    );
    assert!(
        !dest.join("dir/.x.bin.partial").exists(),
        "the link is gone"
    );
}

/// The failures of a run: (key, reason).
fn failures(run: &support::Run) -> Vec<(String, String)> {
    run.report()["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let text = |field: &str| f[field].as_str().unwrap().to_string();
            (text("key"), text("reason"))
        })
        .collect()
}

/// A key that is both a file and a prefix (`a` and `a/b`): the file keeps the path and the keys
/// below it are refused, the same way every run and in the dry run, whatever the downloads'
/// timing. s3s-fs cannot store both, so the keys below are added to its listing.
#[test]
fn a_file_keeps_its_path_and_the_keys_below_it_are_refused_every_run() {
    let server = Server::local();
    let stored = files(&[("a", content(25, 10)), ("c", content(26, 10))]);
    server.seed("placed/", &stored);
    let below = ["placed/a/b", "placed/a/c/d"];
    let injected = below.iter().map(|k| (k.to_string(), 5)).collect();
    server
        .faults
        .add(Rule::listing(Fault::InjectListing(injected)).times(usize::MAX));
    let (_tmp, dest) = temp_dest();
    for attempt in ["first", "again"] {
        let run = server.sync("placed/", &dest, &[]);
        run.assert_code(1);
        assert_mirror(&dest, &stored);
        let failed = failures(&run);
        let keys: Vec<&str> = failed.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(keys, below, "{attempt}");
        for (key, reason) in &failed {
            assert!(
                reason.contains("key conflict: \"a\" is a file"),
                "{attempt}: {key}: {reason}"
            );
        }
    }
    let planned = server.sync("placed/", &dest, &["--dry-run"]);
    let keys: Vec<String> = failures(&planned).into_iter().map(|(key, _)| key).collect();
    assert_eq!(keys, below, "the dry run predicts it");
}

/// The same on a server that stores both keys (Garage).
#[test]
fn file_and_prefix_conflict_fails_and_names_the_key_garage() {
    let Some(server) = Server::garage() else {
        return;
    };
    server.seed(
        "conflict/",
        &files(&[("a", content(23, 10)), ("a/b", content(24, 10))]),
    );
    let (_tmp, dest) = temp_dest();
    let run = server.sync("conflict/", &dest, &[]);
    run.assert_code(1);
    assert_eq!(run.count("objects", "failed"), 1);
    assert_eq!(run.count("objects", "downloaded"), 1);
    let failed = failures(&run);
    assert_eq!(failed[0].0, "conflict/a/b", "{failed:?}");
    assert!(run.stderr().contains("conflict/a/b"), "{}", run.stderr());
    assert_eq!(std::fs::read(dest.join("a")).unwrap(), content(23, 10));
}

fn check_usage_errors(server: &Server) {
    let (_tmp, dest) = temp_dest();
    let mut wrong = server.target.clone();
    wrong.secret_key = "definitely-not-the-secret".into();
    let run = support::hydrator_sync(&wrong, &format!("s3://{}/x/", wrong.bucket), &dest, &[]);
    run.assert_code(2);
    assert!(
        run.stderr().contains("the secret key is wrong") || run.stderr().contains("access denied"),
        "{}",
        run.stderr()
    );

    let run = support::hydrator_sync(&server.target, "s3://no-such-bucket-here/x/", &dest, &[]);
    run.assert_code(2);
    assert!(
        run.stderr().contains("does not exist") || run.stderr().contains("access denied"),
        "{}",
        run.stderr()
    );
}

on_both_servers_and_minio!(wrong_credentials_and_missing_bucket, check_usage_errors);

#[test]
fn malformed_input_is_a_usage_error() {
    let server = Server::local();
    let (_tmp, dest) = temp_dest();
    for (url, args, needle) in [
        ("not-a-url", vec![], "expected s3://"),
        ("s3://x/", vec![], "3 to 63"),
        (
            "s3://fine-bucket/",
            vec!["--part-size", "3MiB"],
            "power of two",
        ),
        (
            "s3://fine-bucket/",
            vec!["--part-size", "512KiB"],
            "at least 1 MiB",
        ),
        ("s3://fine-bucket/", vec!["--include", "a["], "--include"),
    ] {
        let run = support::hydrator_sync(&server.target, url, &dest, &args);
        run.assert_code(2);
        assert!(
            run.stderr().contains(needle),
            "{url} {args:?}: {}",
            run.stderr()
        );
    }
}

#[test]
fn unreachable_endpoint_fails_clearly() {
    let mut target = Server::local().target.clone();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    target.endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (_tmp, dest) = temp_dest();
    let run = support::hydrator_sync(&target, "s3://some-bucket/p/", &dest, &[]);
    assert_ne!(run.code(), 0);
    assert!(
        run.stderr().contains("connection failed") || run.stderr().contains("endpoint"),
        "{}",
        run.stderr()
    );
    assert_eq!(run.report()["result"], "failed");
}

/// Runs a multi-part mirror under `rules` and checks the result is complete and identical.
fn survives(rules: Vec<Rule>) -> serde_json::Value {
    let server = Server::local();
    let expected = files(&[
        ("big.bin", content(30, 6 * MIB + 7)),
        ("small.bin", content(31, 3000)),
        ("mid.bin", content(32, 2 * MIB)),
    ]);
    server.seed("faults/", &expected);
    for rule in rules {
        server.faults.add(rule);
    }
    let (_tmp, dest) = temp_dest();
    let run = server.sync(
        "faults/",
        &dest,
        &["--part-size", "1MiB", "--concurrency", "4"],
    );
    run.assert_code(0);
    assert_mirror(&dest, &expected);
    assert!(server.faults.served() > 0, "the faults were injected");
    run.report().clone()
}

#[test]
fn slowdown_storm_is_ridden_out() {
    survives(vec![Rule::get("", Fault::Status(503, "SlowDown")).times(30)]);
}

#[test]
fn the_report_and_the_closing_line_say_what_bounded_the_run() {
    let server = Server::local();
    let expected = files(&[
        ("big.bin", content(33, 6 * MIB + 7)),
        ("small.bin", content(34, 3000)),
    ]);
    server.seed("bound/", &expected);
    let sync = |args: &[&str]| {
        let (tmp, dest) = temp_dest();
        let run = server.sync("bound/", &dest, args);
        run.assert_code(0);
        assert_mirror(&dest, &expected);
        let bound = run.report()["bound"].clone();
        let stdout = String::from_utf8_lossy(&run.output.stdout).into_owned();
        let detail = bound["detail"].as_str().unwrap().to_string();
        assert!(
            stdout.trim_end().ends_with(&format!(": {detail})")),
            "the closing line names the bound and its figure: {stdout}"
        );
        drop(tmp);
        bound
    };

    let bound = sync(&["--part-size", "1MiB", "--concurrency", "4"]);
    assert_ne!(bound["by"], "server", "{bound}");
    assert_eq!(bound["throttled_answers"], 0, "{bound}");
    // One GET a part (7 + 1), the listing and a HEAD or so: answers are counted.
    assert!(bound["answers"].as_u64().unwrap() >= 8, "{bound}");
    assert_eq!(bound["request_ceiling"], 4, "a fixed limit is the ceiling");
    assert!(bound["cores"].as_f64().unwrap() >= 1.0, "{bound}");
    assert!(bound["cores_busy"].as_f64().unwrap() > 0.0, "{bound}");
    assert!(
        bound["received_mbit_per_second"].as_f64().unwrap() > 0.0,
        "{bound}"
    );
    let auto = sync(&["--part-size", "1MiB"])["request_ceiling"]
        .as_u64()
        .unwrap();
    assert!((4..=64).contains(&auto), "auto's ceiling: {auto}");

    server
        .faults
        .add(Rule::get("", Fault::Status(503, "SlowDown")).times(30));
    let bound = sync(&["--part-size", "1MiB", "--concurrency", "4"]);
    assert_eq!(bound["by"], "server", "{bound}");
    let throttled = bound["throttled_answers"].as_u64().unwrap();
    assert_eq!(
        throttled as usize,
        server.faults.served(),
        "every 503 counted"
    );
    assert!(
        bound["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{throttled} of ")),
        "{bound}"
    );
}

#[test]
fn internal_errors_are_retried() {
    survives(vec![
        Rule::get("big.bin", Fault::Status(500, "InternalError")).times(8),
        Rule::listing(Fault::Status(500, "InternalError")).times(2),
    ]);
}

/// MinIO throttles with 429 `TooManyRequests` (where AWS says 503 `SlowDown`): a listing page
/// and the GETs it answers so are asked again, after a back-off.
#[test]
fn too_many_requests_as_minio_answers_them_are_retried() {
    survives(vec![
        Rule::get("big.bin", Fault::Status(429, "TooManyRequests")).times(8),
        Rule::listing(Fault::Status(429, "TooManyRequests")).times(2),
    ]);
}

#[test]
fn dropped_connections_are_retried() {
    survives(vec![Rule::get("", Fault::DropConnection).times(10)]);
}

#[test]
fn truncated_bodies_are_retried_per_part() {
    let report = survives(vec![
        Rule::get("mid.bin", Fault::TruncateBody(100_000)).times(5)
    ]);
    assert!(report["part_retries"].as_u64().unwrap() >= 5, "{report}");
}

#[test]
fn stalled_body_is_detected_and_retried() {
    let report = survives(vec![Rule::get(
        "mid.bin",
        Fault::StallBody(64 * 1024, Duration::from_secs(60)),
    )]);
    assert!(report["part_retries"].as_u64().unwrap() >= 1, "{report}");
}

#[test]
fn object_replaced_between_parts_is_restarted_whole() {
    let server = Server::local();
    let old = content(40, 4 * MIB + 5);
    let new = content(41, 3 * MIB + 1);
    server.seed("replaced/", &files(&[("model.bin", old)]));
    // The third ranged GET finds the object replaced: parts of two versions must never mix.
    server
        .faults
        .add(Rule::get("model.bin", Fault::ReplaceObject(new.clone())).skip(2));
    let (_tmp, dest) = temp_dest();
    let run = server.sync(
        "replaced/",
        &dest,
        &["--part-size", "1MiB", "--concurrency", "1"],
    );
    run.assert_code(0);
    run.assert_restarted_into(&dest, "model.bin", &new);
}

#[test]
fn persistent_errors_fail_the_object_and_publish_nothing_partial() {
    let server = Server::local();
    let source = files(&[
        ("broken.bin", content(50, 3 * MIB)),
        ("fine.bin", content(51, 100)),
    ]);
    server.seed("persistent/", &source);
    server
        .faults
        .add(Rule::get("broken.bin", Fault::TruncateBody(1000)).times(usize::MAX));
    let (_tmp, dest) = temp_dest();
    let run = server.sync("persistent/", &dest, &["--part-size", "1MiB"]);
    run.assert_code(1);
    assert!(
        run.stderr().contains("persistent/broken.bin"),
        "{}",
        run.stderr()
    );
    assert_eq!(run.report()["failures"][0]["key"], "persistent/broken.bin");
    assert_mirror(&dest, &files(&[("fine.bin", source["fine.bin"].clone())]));
}

#[test]
fn broken_listing_never_exits_zero() {
    let server = Server::local();
    let many: BTreeMap<String, Vec<u8>> = (0..1100)
        .map(|i| (format!("f{i:05}"), vec![i as u8]))
        .collect();
    server.seed("paged/", &many);
    server.faults.add(Rule {
        query_contains: Some("continuation-token"),
        ..Rule::listing(Fault::Status(500, "InternalError")).times(usize::MAX)
    });
    let (_tmp, dest) = temp_dest();
    let run = server.sync("paged/", &dest, &[]);
    run.assert_code(1);
    assert!(run.stderr().contains("listing failed"), "{}", run.stderr());
    assert_eq!(run.report()["result"], "failed");
    // What it mirrored of the first page is no dataset, and its size is not known.
    let verify = server.hydrator(&["verify".as_ref(), dest.as_os_str()]);
    let said = String::from_utf8_lossy(&verify.stderr);
    assert_eq!(verify.status.code(), Some(1), "{said}");
    assert!(
        said.contains("the last run did not finish listing, so the total is not known"),
        "{said}"
    );
}

fn check_writers_produce_identical_files(server: &Server, prefix: &str) {
    let expected = files(&[
        ("w/a.bin", content(60, 3 * MIB + 17)),
        ("b.bin", content(61, 4097)),
    ]);
    server.seed(prefix, &expected);
    for (backend, direct, writes) in [
        ("pwrite", "--direct-io=never", "through the page cache"),
        ("io-uring", "--direct-io=never", "through the page cache"),
        ("pwrite", "--direct-io", "O_DIRECT for every file"),
        ("io-uring", "--direct-io=always", "O_DIRECT for every file"),
        (
            "pwrite",
            "--direct-io=auto",
            "O_DIRECT for files larger than a write buffer",
        ),
    ] {
        let (_tmp, dest) = temp_dest();
        let args = ["--io-backend", backend, "--part-size", "1MiB", direct];
        let run = server.sync(prefix, &dest, &args);
        run.assert_code(0);
        assert_mirror(&dest, &expected);
        let used = run.report()["io_backend"].as_str().unwrap().to_string();
        assert_eq!(used.replace('_', "-"), backend);
        let stderr = run.stderr();
        assert!(stderr.contains(writes), "{direct}: {stderr}");
    }
}

on_every_server!(
    writers_produce_identical_files,
    check_writers_produce_identical_files,
    "writers/"
);

/// Garage stores keys that no filesystem path should be made of; the listing really carries them.
#[test]
fn hostile_keys_stored_on_garage_are_refused() {
    let Some(server) = Server::garage() else {
        return;
    };
    let good = files(&[("good.bin", content(25, 100))]);
    let hostile = [
        "../escape.txt",
        "a/../../escape2.txt",
        "a//b.txt",
        ".hydrator/READY",
        "sub/.x.partial",
    ];
    let mut all = good.clone();
    for key in hostile {
        all.insert(key.to_string(), b"evil".to_vec());
    }
    server.seed("garage-hostile/", &all);
    let (tmp, dest) = temp_dest();
    let run = server.sync("garage-hostile/", &dest, &[]);
    run.assert_code(1);
    assert_eq!(
        run.count("objects", "failed"),
        hostile.len() as u64,
        "{}",
        run.report()
    );
    assert_mirror(&dest, &good);
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        2,
        "nothing beside DEST but its report"
    );
}

#[test]
fn auto_falls_back_to_pwrite_when_seccomp_refuses_io_uring() {
    let server = Server::local();
    let expected = files(&[("x.bin", content(70, 2 * MIB + 3))]);
    server.seed("seccomp/", &expected);
    let (_tmp, dest) = temp_dest();
    let report = dest.with_extension("report.json");
    let mut command = support::hydrator_command(&server.target);
    command
        .args(["sync", "s3://hydrator-test/seccomp/"])
        .arg(&dest)
        .args([
            "--endpoint-url",
            &server.target.endpoint,
            "--progress",
            "none",
            "--report",
        ])
        .arg(&report);
    support::seccomp::refuse_io_uring(&mut command);
    let output = command.output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_mirror(&dest, &expected);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["io_backend"], "pwrite");
    assert!(report["io_backend_fallback_reason"]
        .as_str()
        .unwrap()
        .contains("io_uring"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("io_uring is not available"));

    let mut forced = support::hydrator_command(&server.target);
    forced
        .args(["sync", "s3://hydrator-test/seccomp/"])
        .arg(&dest)
        .args([
            "--endpoint-url",
            &server.target.endpoint,
            "--io-backend",
            "io-uring",
        ]);
    support::seccomp::refuse_io_uring(&mut forced);
    let output = forced.output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn bytes_corrupted_in_transit_are_caught_by_the_end_to_end_checksum() {
    let server = Server::local();
    let expected = files(&[
        ("multi.bin", content(150, 3 * MIB)),
        ("single.bin", content(151, 70_000)),
    ]);
    server.seed("crc/", &expected);
    // One flipped byte in a ranged part of the multi-part object (BLAKE3 cannot know: it hashes
    // what arrives), and one in the whole-object GET of the small one. Every part is 1 MiB, so
    // whichever part is served first holds the offset.
    server
        .faults
        .add(Rule::get("multi.bin", Fault::CorruptBody(12_345)));
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("single.bin", Fault::CorruptBody(777))
    });
    let (_tmp, dest) = temp_dest();
    let run = server.sync("crc/", &dest, &["--part-size", "1MiB"]);
    run.assert_code(0);
    assert_eq!(server.faults.served(), 2);
    assert_mirror(&dest, &expected);
    assert!(
        run.report()["object_restarts"].as_u64().unwrap() >= 1,
        "{}",
        run.report()
    );
    assert!(
        run.report()["part_retries"].as_u64().unwrap() >= 1,
        "{}",
        run.report()
    );

    // A server that corrupts every time: the object fails, named, and nothing is published.
    server
        .faults
        .add(Rule::get("multi.bin", Fault::CorruptBody(5)).times(usize::MAX));
    let (_tmp, other) = temp_dest();
    let run = server.sync("crc/", &other, &["--part-size", "1MiB"]);
    run.assert_code(1);
    assert!(
        run.stderr().contains("crc/multi.bin") && run.stderr().contains("do not match"),
        "{}",
        run.stderr()
    );
    assert!(!other.join("multi.bin").exists());
}

#[test]
fn a_listing_that_cannot_be_continued_is_never_complete() {
    let server = Server::local();
    server.seed("cut/", &files(&[("a", content(170, 10))]));
    server
        .faults
        .add(Rule::listing(Fault::TruncatedWithoutToken));
    let (_tmp, dest) = temp_dest();
    let run = server.sync("cut/", &dest, &[]);
    run.assert_code(1);
    assert!(
        run.stderr().contains("no continuation token"),
        "{}",
        run.stderr()
    );
    assert!(!dest.join(".hydrator/READY").exists());
}

#[test]
fn missing_credentials_are_a_usage_error() {
    let server = Server::local();
    let (_tmp, dest) = temp_dest();
    let output = support::hydrator_command(&server.target)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .args(["sync", "s3://hydrator-test/x/"])
        .arg(&dest)
        .args([
            "--endpoint-url",
            &server.target.endpoint,
            "--progress",
            "none",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no usable credentials"), "{stderr}");
}

#[test]
fn bandwidth_and_request_rate_caps_hold_the_pace_they_name() {
    let server = Server::local();
    server.seed("capped/", &files(&[("big.bin", content(71, 256 * MIB))]));
    let (_dir, dest) = temp_dest();
    let url = format!("s3://{}/capped/", server.target.bucket);
    let run = support::hydrator_sync(&server.target, &url, &dest, &["--max-bandwidth", "64MiB"]);
    run.assert_code(0);
    let seconds = run.report()["duration_seconds"].as_f64().unwrap();
    eprintln!("256 MiB at --max-bandwidth 64MiB: {seconds:.2} s");
    // 4 s of paced transfer, plus the run's own start, listing and final syncfs (4.5 s alone on
    // this machine). Only the floor is asserted: beside the rest of the suite on two cores a
    // run can be slower than its cap, never faster.
    assert!(seconds >= 3.4, "{seconds} s: faster than 64 MiB/s");
    let waited = run.report()["rate_limited_seconds"].as_f64().unwrap();
    assert!(waited > 0.0, "the report says the cap held the run back");
    assert_eq!(run.report()["bound"]["by"], "rate_cap", "{}", run.report());

    let small: BTreeMap<String, Vec<u8>> = (0..40)
        .map(|i| (format!("f{i:02}"), content(i, 1000)))
        .collect();
    server.seed("paced/", &small);
    let (_dir, dest) = temp_dest();
    let url = format!("s3://{}/paced/", server.target.bucket);
    let run = support::hydrator_sync(
        &server.target,
        &url,
        &dest,
        &["--max-requests-per-second", "20"],
    );
    run.assert_code(0);
    let seconds = run.report()["duration_seconds"].as_f64().unwrap();
    eprintln!("40 GETs at --max-requests-per-second 20: {seconds:.2} s");
    assert!(seconds >= 1.65, "{seconds} s: faster than 20 GETs a second");
    assert_mirror(&dest, &small);
}
