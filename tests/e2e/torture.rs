//! When everything around hydrator misbehaves, each run ends in one of two states: a complete,
//! verified mirror with READY, or a non-zero exit with a clear message, no READY, nothing
//! corrupt under a final name, and a re-run that completes once the cause is gone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::disk::TestMount;
use crate::support::faults::{Fault, Rule};
use crate::support::{
    assert_mirror, content, files, hydrator_command, hydrator_sync, records_durable_parts,
    temp_dest, wait_until, Server, MIB,
};

/// The same with a report and `args`, started and not yet waited for.
fn spawn_sync(
    server: &Server,
    prefix: &str,
    dest: &Path,
    report: &Path,
    args: &[&str],
) -> std::process::Child {
    server
        .sync_command(prefix, dest)
        .arg("--report")
        .arg(report)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for_file(path: &Path) {
    wait_until(
        &format!("{} appears", path.display()),
        Duration::from_secs(20),
        || path.exists(),
    );
}

/// Waits until two of the three 8 MiB parts of `partial` hold their bytes (the third stalls).
fn wait_for_parts_written(partial: &Path, expected: &[u8]) {
    use std::os::unix::fs::FileExt;
    wait_for_file(partial);
    let file = std::fs::File::open(partial).unwrap();
    let mut buf = vec![0u8; 8 * MIB];
    wait_until("two parts written", Duration::from_secs(60), || {
        let written = (0..3).filter(|part| {
            let at = part * 8 * MIB;
            file.read_exact_at(&mut buf, at as u64).is_ok() && buf == expected[at..at + 8 * MIB]
        });
        written.count() >= 2
    });
}

/// A sync of `prefix` (a 24 MiB file whose part 1 stalls for a minute, and a small one) busy
/// with two parts of the big file written: the moment to interrupt it.
fn busy_sync(
    server: &Server,
    prefix: &str,
    seed: u64,
) -> (BTreeMap<String, Vec<u8>>, tempfile::TempDir, PathBuf, Child) {
    let expected = files(&[
        ("big.bin", content(seed, 24 * MIB)),
        ("small.txt", content(seed + 1, 100)),
    ]);
    server.seed(prefix, &expected);
    server
        .faults
        .add(Rule::get("big.bin", Fault::StallBody(MIB, Duration::from_secs(60))).skip(1));
    let (dir, dest) = temp_dest();
    let child = spawn_sync(server, prefix, &dest, &dest.with_extension("json"), &[]);
    wait_for_parts_written(&dest.join(".big.bin.partial"), &expected["big.bin"]);
    (expected, dir, dest, child)
}

fn check_signal_stops_and_resumes(signal: i32) {
    let server = Server::local();
    let (expected, _dir, dest, child) = busy_sync(&server, "sig/", 71);
    let signalled = Instant::now();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, signal) };
    let output = child.wait_with_output().unwrap();
    let took = signalled.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(took < Duration::from_secs(5), "stopped after {took:?}");
    eprintln!("signal {signal}: exit 3 after {took:?}");
    assert!(stderr.contains("stopped before the end"), "{stderr}");
    assert!(!dest.join(".hydrator/READY").exists());
    assert!(
        !dest.join("big.bin").exists(),
        "nothing partial under a final name"
    );

    let rerun = server.sync("sig/", &dest, &[]);
    rerun.assert_resumed(&dest, &expected, 8 * MIB as u64);
}

#[test]
fn sigterm_stops_a_sync_with_exit_3_and_the_next_run_resumes() {
    check_signal_stops_and_resumes(libc::SIGTERM);
}

#[test]
fn sigint_stops_a_sync_with_exit_3_and_the_next_run_resumes() {
    check_signal_stops_and_resumes(libc::SIGINT);
}

#[test]
fn a_resume_after_kill_9_through_another_endpoint_url_keeps_the_durable_parts() {
    let server = Server::local();
    let (expected, _dir, dest, mut child) = busy_sync(&server, "moved/", 73);
    let journal = dest.join(".hydrator/manifest.journal");
    wait_until("durable parts recorded", Duration::from_secs(20), || {
        records_durable_parts(&journal)
    });
    child.kill().unwrap();
    child.wait().unwrap();

    // The same store and bucket through another address.
    let mut other = server.target.clone();
    other.endpoint = other.endpoint.replace("127.0.0.1", "localhost");
    let url = format!("s3://{}/moved/", other.bucket);
    let rerun = hydrator_sync(&other, &url, &dest, &[]);
    rerun.assert_resumed(&dest, &expected, 8 * MIB as u64);
}

#[test]
fn twenty_thousand_objects_in_2000_directories_under_an_open_file_limit_of_256() {
    let server = Server::local();
    server.seed_many("many/", 20_000, 100);
    let (_dir, dest) = temp_dest();
    let report = dest.with_extension("json");
    let mut command = server.sync_command("many/", &dest);
    command.arg("--report").arg(&report);
    // SAFETY: setrlimit is async-signal-safe, as pre_exec requires.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let limit = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        &stderr[..stderr.len().min(3000)]
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["objects"]["downloaded"], 20_000);
    assert!(dest.join(".hydrator/READY").exists());
    let sample = std::fs::read(dest.join("d0007/f12007")).unwrap();
    assert!(sample == content(12_007, 100));
}

/// Runs `command`, killing it and failing the test if it is not done within `limit`.
fn output_within(command: &mut Command, limit: Duration) -> (std::process::Output, Duration) {
    let started = Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().unwrap(), started.elapsed())
}

#[test]
fn a_listing_that_loops_or_repeats_keys_fails_instead_of_running_forever() {
    let server = Server::local();
    server.seed(
        "loop/",
        &files(&[("a", content(1, 10)), ("b", content(2, 10))]),
    );
    server
        .faults
        .add(Rule::listing(Fault::LoopingToken).times(usize::MAX));
    for (prefix, expected) in [
        (
            "loop/",
            "repeated or reordered keys (\"loop/a\" after \"loop/b\")",
        ),
        ("empty/", "continuation token \"again\" twice"),
    ] {
        let (_dir, dest) = temp_dest();
        let (output, _) = output_within(
            &mut server.sync_command(prefix, &dest),
            Duration::from_secs(60),
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(expected), "{expected} in {stderr}");
        assert!(!dest.join(".hydrator/READY").exists());
    }
}

#[test]
fn ranged_gets_answered_with_the_whole_object_or_a_wrong_range_fail_clearly() {
    let server = Server::local();
    let expected = files(&[
        ("big.bin", content(91, 20 * MIB)),
        ("small", content(92, 10)),
    ]);
    server.seed("range/", &expected);
    for (fault, message) in [
        (Fault::IgnoreRange, "the server ignored the Range header"),
        (
            Fault::LieContentRange("bytes 0-9/20971520"),
            "server sent \"bytes 0-9/20971520\"",
        ),
    ] {
        server
            .faults
            .add(Rule::get("big.bin", fault).times(usize::MAX));
        let (_dir, dest) = temp_dest();
        let run = server.sync("range/", &dest, &[]);
        run.assert_code(1);
        assert!(
            run.stderr().contains(message),
            "{message} in {}",
            run.stderr()
        );
        assert!(
            !dest.join("big.bin").exists(),
            "nothing partial under a final name"
        );
        assert_eq!(
            std::fs::read(dest.join("small")).unwrap(),
            expected["small"]
        );
        server.faults.clear();
        server.sync("range/", &dest, &[]).assert_code(0);
        assert_mirror(&dest, &expected);
    }
}

#[test]
fn a_server_that_accepts_but_never_answers_fails_in_bounded_time() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        // Accepts for a while and never answers; the thread ends with the test process.
        let mut open = Vec::new();
        for stream in listener.incoming().take(64) {
            open.push(stream);
        }
        open
    });
    let server = Server::local();
    let (_dir, dest) = temp_dest();
    let mut command = hydrator_command(&server.target);
    command
        .args(["sync", "s3://silent-bucket/x/"])
        .arg(&dest)
        .args(["--endpoint-url", &endpoint, "--progress", "none"]);
    let (output, took) = output_within(&mut command, Duration::from_secs(150));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("listing failed"), "{stderr}");
    assert!(!dest.join(".hydrator/READY").exists());
    eprintln!("gave up after {took:?}");
    drop(held);
}

#[test]
fn a_read_only_destination_is_refused_clearly() {
    let Some(fs) = TestMount::tmpfs("size=1m,ro") else {
        return;
    };
    let server = Server::local();
    server.seed("ro/", &files(&[("a", content(1, 10))]));
    let run = server.sync("ro/", &fs.path.join("dest"), &[]);
    run.assert_code(2);
    assert!(
        run.stderr().contains("Read-only file system"),
        "{}",
        run.stderr()
    );
}

#[test]
fn four_processes_on_one_dest_killed_and_restarted_at_random_end_whole() {
    use std::sync::atomic::Ordering::Relaxed;
    let server = Server::local();
    let mut entries: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("shard/{i:02}.bin"), content(100 + i, 512 << 10)))
        .collect();
    entries.push(("big.bin".into(), content(99, 24 * MIB)));
    let expected: std::collections::BTreeMap<String, Vec<u8>> = entries.into_iter().collect();
    let total: u64 = expected.values().map(|v| v.len() as u64).sum();
    server.seed("four/", &expected);
    // Slow bodies keep the work going long enough for kills to land mid-download.
    server.faults.add(
        Rule::get(
            "four/",
            Fault::StallBody(64 << 10, Duration::from_millis(400)),
        )
        .times(60),
    );
    let (_dir, dest) = temp_dest();
    let start = |_: usize| {
        server
            .sync_command("four/", &dest)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut processes: Vec<std::process::Child> = (0..4).map(start).collect();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut kills = 0;
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(rng.u64(50..300)));
        let victim = rng.usize(0..4);
        if processes[victim].try_wait().unwrap().is_none() {
            processes[victim].kill().unwrap();
            processes[victim].wait().unwrap();
            kills += 1;
        }
        processes[victim] = start(victim);
    }
    for mut process in processes {
        let status = process.wait().unwrap();
        assert!(status.success(), "a process ended with {status}");
    }
    assert!(kills > 0, "no process was killed while running");
    assert!(dest.join(".hydrator/READY").exists());
    assert_mirror(&dest, &expected);
    let fetched = server.faults.object_bytes.load(Relaxed);
    eprintln!("{kills} kills; fetched {fetched} bytes for {total}");
    // A killed worker loses what it had in flight since its last checkpoint; starting from
    // zero at each kill could fetch up to 9 × the dataset.
    assert!(
        fetched <= total * 3,
        "each object fetched about once: {fetched} bytes for {total}"
    );
}

#[test]
fn over_long_names_fail_their_object_and_the_rest_completes() {
    let server = Server::local();
    // S3 keys stop at 1,024 bytes, below PATH_MAX, but a segment can pass NAME_MAX (255). The
    // in-process server cannot store such a key on its own filesystem, so it only lists it.
    server.seed("long/", &files(&[("fine", content(3, 10))]));
    let long_key = format!("long/dir/{}", "n".repeat(300));
    server
        .faults
        .add(Rule::listing(Fault::InjectListing(vec![(long_key, 10)])));
    let (_dir, dest) = temp_dest();
    let run = server.sync("long/", &dest, &[]);
    run.assert_code(1);
    assert_eq!(run.count("objects", "failed"), 1, "{}", run.stderr());
    assert!(
        run.stderr()
            .contains("refused: key has a path segment of 300 bytes (the limit is 246)"),
        "{}",
        run.stderr()
    );
    assert_eq!(std::fs::read(dest.join("fine")).unwrap(), content(3, 10));
    assert!(!dest.join(".hydrator/READY").exists());
}

#[test]
fn a_hard_link_planted_at_a_final_name_is_replaced_and_its_target_untouched() {
    let server = Server::local();
    let expected = files(&[("victim.txt", content(5, 1000))]);
    server.seed("hardlink/", &expected);
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("precious");
    std::fs::write(&target, b"do not overwrite").unwrap();
    let (_dir, dest) = temp_dest();
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::hard_link(&target, dest.join("victim.txt")).unwrap();
    server.sync("hardlink/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
    assert_eq!(std::fs::read(&target).unwrap(), b"do not overwrite");
}

#[test]
fn throttling_past_the_retry_budget_exits_non_zero_and_the_run_resumes_later() {
    let server = Server::local();
    let expected = files(&[("hot.bin", content(6, 3 * MIB)), ("cold", content(7, 10))]);
    server.seed("throttle/", &expected);
    server
        .faults
        .add(Rule::get("hot.bin", Fault::Status(503, "SlowDown")).times(usize::MAX));
    let (_dir, dest) = temp_dest();
    let run = server.sync("throttle/", &dest, &["--part-size", "1MiB"]);
    run.assert_code(1);
    assert!(
        run.stderr().contains("throttle/hot.bin"),
        "{}",
        run.stderr()
    );
    assert!(!dest.join("hot.bin").exists());
    server.faults.clear();
    let rerun = server.sync("throttle/", &dest, &["--part-size", "1MiB"]);
    rerun.assert_code(0);
    assert_eq!(rerun.count("objects", "skipped"), 1, "cold was kept");
    assert_mirror(&dest, &expected);
}

/// Runs `command` and returns its output and peak RSS in bytes: the last `VmHWM` (the kernel's
/// high-water mark) read from `/proc` while it ran. (`wait4`'s `ru_maxrss` cannot be used: a
/// child spawned with `CLONE_VM` inherits this big test process's high-water mark.)
fn output_and_peak_rss(command: &mut Command) -> (std::process::Output, u64) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        let status = std::fs::read_to_string(&status_file).unwrap_or_default();
        let hwm = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        peak = peak.max(hwm.unwrap_or(0) * 1024);
        std::thread::sleep(Duration::from_millis(5));
    }
    (child.wait_with_output().unwrap(), peak)
}

#[test]
fn memory_stays_within_the_formula_whatever_the_object_sizes() {
    let server = Server::local();
    server.seed("mem-tiny/", &files(&[("one", content(1, 10))]));
    let big = files(&[
        ("a.bin", content(11, 48 * MIB)),
        ("b.bin", content(12, 48 * MIB)),
        ("c.bin", content(13, 48 * MIB)),
    ]);
    server.seed("mem-big/", &big);
    let (_d1, tiny_dest) = temp_dest();
    let (tiny, baseline) = output_and_peak_rss(
        server
            .sync_command("mem-tiny/", &tiny_dest)
            .args(["--concurrency", "4"]),
    );
    assert!(tiny.status.success());
    let (_d2, dest) = temp_dest();
    let (run, peak) = output_and_peak_rss(
        server
            .sync_command("mem-big/", &dest)
            .args(["--concurrency", "4"]),
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_mirror(&dest, &big);
    // docs/internals.md, "Memory": (2 × 4 + 4) × 1 MiB of buffers over the runtime's own; the manifest of
    // three objects is negligible. 8 MiB of slack for allocator and HTTP buffers.
    let bound = baseline + (2 * 4 + 4) * MIB as u64 + 8 * MIB as u64;
    eprintln!("peak RSS {peak} bytes for 144 MiB, baseline {baseline}, bound {bound}");
    assert!(
        peak <= bound,
        "peak RSS {peak} > {bound} (baseline {baseline})"
    );
}

#[test]
fn keys_that_differ_only_in_case_are_distinct_files() {
    let server = Server::local();
    let expected = files(&[
        ("Data/Train.txt", content(1, 10)),
        ("data/train.txt", content(2, 10)),
        ("data/TRAIN.txt", content(3, 10)),
    ]);
    server.seed("case/", &expected);
    let (_dir, dest) = temp_dest();
    server.sync("case/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}

#[test]
fn a_slow_loris_body_is_abandoned_and_the_part_fetched_again() {
    let server = Server::local();
    let expected = files(&[("slow.bin", content(8, 2 * MIB))]);
    server.seed("loris/", &expected);
    // 4 KiB every 100 ms: 40 KiB/s, never stalled long enough for the SDK to notice.
    server.faults.add(Rule::get(
        "slow.bin",
        Fault::TrickleBody(4 << 10, Duration::from_millis(100)),
    ));
    let (_dir, dest) = temp_dest();
    let started = Instant::now();
    let run = server.sync("loris/", &dest, &["--part-size", "1MiB"]);
    run.assert_code(0);
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    assert!(
        run.report()["part_retries"].as_u64() >= Some(1),
        "{}",
        run.report()
    );
    assert_mirror(&dest, &expected);
}

/// The listing's ETags are noise; a restart pins the object to the ETag the server answers
/// with, so the mirror completes, each file from one version.
#[test]
fn an_etag_that_changes_at_every_listing_never_mixes_versions() {
    let server = Server::local();
    let expected = files(&[("moving.bin", content(9, 3 * MIB)), ("x", content(10, 10))]);
    server.seed("etags/", &expected);
    server
        .faults
        .add(Rule::listing(Fault::RandomListingEtags).times(usize::MAX));
    let (_dir, dest) = temp_dest();
    let run = server.sync("etags/", &dest, &["--part-size", "1MiB"]);
    run.assert_code(0);
    assert_eq!(run.report()["object_restarts"], 2, "{}", run.report());
    assert_mirror(&dest, &expected);
}

#[test]
fn a_key_that_is_not_utf8_fails_the_listing_clearly() {
    let server = Server::local();
    server.seed("utf8/", &files(&[("name", content(11, 10))]));
    server.faults.add(Rule::listing(Fault::InvalidUtf8Key));
    let (_dir, dest) = temp_dest();
    let run = server.sync("utf8/", &dest, &[]);
    run.assert_code(1);
    assert!(run.stderr().contains("listing failed"), "{}", run.stderr());
    assert!(!dest.join(".hydrator/READY").exists());
}

#[test]
fn symlinks_planted_during_a_run_are_never_followed() {
    let server = Server::local();
    let expected: std::collections::BTreeMap<String, Vec<u8>> = (0..4)
        .map(|i| (format!("a/{i}"), content(300 + i, 40)))
        .chain((0..4).map(|i| (format!("b/{i}"), content(400 + i, 10))))
        .collect();
    server.seed("planted-live/", &expected);
    // a/0 lands at once and creates a/; a/1 then trickles for 10 s (never stalling long enough
    // to be retried), and with one request slot everything after it waits. The test plants its
    // symlinks inside that window, however loaded the machine.
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get(
            "planted-live/a/",
            Fault::TrickleBody(1, Duration::from_millis(250)),
        )
        .skip(1)
    });
    let (outside_a, outside_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_dir, dest) = temp_dest();
    let report = dest.with_extension("json");
    let child = spawn_sync(
        &server,
        "planted-live/",
        &dest,
        &report,
        &["--concurrency", "1"],
    );
    wait_for_file(&dest.join("a"));
    std::fs::rename(dest.join("a"), dest.join("a.moved")).unwrap();
    std::os::unix::fs::symlink(outside_a.path(), dest.join("a")).unwrap();
    std::os::unix::fs::symlink(outside_b.path(), dest.join("b")).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for outside in [&outside_a, &outside_b] {
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing written through a planted symlink"
        );
    }
    assert!(!dest.join(".hydrator/READY").exists());
    for link in ["a", "b"] {
        std::fs::remove_file(dest.join(link)).unwrap();
    }
    std::fs::remove_dir_all(dest.join("a.moved")).unwrap();
    server.sync("planted-live/", &dest, &[]).assert_code(0);
    assert_mirror(&dest, &expected);
}
