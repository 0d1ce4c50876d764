//! Memory does not grow with the object count: the real binary mirrors a small and a large set
//! of tiny objects from the in-process origin (`support::origin`, which keeps nothing per
//! object), and its peak RSS may grow by no more than a fixed margin between the two, and stays
//! within the bound the README promises. A run that kept a few KiB per object (a connection, a
//! head buffer, a task) would grow by hundreds of MiB between them.
//!
//! The peak is the child's own high-water mark (`VmHWM` in `/proc/PID/status`), read while it
//! runs. `wait4`'s `ru_maxrss` cannot be used: Linux carries the parent's high-water mark
//! across `fork` and `exec`, so a child of this test process, which holds every other test's
//! servers and data, would report the parent's peak (589 MiB for both runs once).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::support::origin::{self, Origin, Set};
use crate::support::{hydrator_command, temp_dest, S3Target};

/// The objects of the small and the large run.
const SMALL: u64 = 20_000;
const LARGE: u64 = 120_000;
/// What the large run may hold beyond the small one: nothing per object, so only noise (the
/// manifest's and listing's fixed buffers, allocator slack). 100,000 objects more at even
/// 1 KiB each would be 98 MiB.
const MARGIN_MIB: u64 = 40;
/// The README's promise: ImageNet's 1.28 million objects in a 256 MiB pod limit.
const BOUND_MIB: u64 = 256;

#[test]
fn peak_memory_does_not_grow_with_the_object_count() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let sets = vec![
        Set::parse(&format!("small={SMALL}x16")).unwrap(),
        Set::parse(&format!("large={LARGE}x16")).unwrap(),
    ];
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
        .unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    runtime.spawn(origin::serve(Arc::new(Origin::new(sets)), listener, None));
    let target = S3Target {
        endpoint,
        region: "us-east-1".into(),
        access_key: "unchecked".into(),
        secret_key: "unchecked".into(),
        bucket: origin::BUCKET.into(),
    };
    let small = peak_rss_mib(&target, "small", SMALL);
    let large = peak_rss_mib(&target, "large", LARGE);
    eprintln!("peak RSS: {small} MiB for {SMALL} objects, {large} MiB for {LARGE}");
    assert!(
        large <= small + MARGIN_MIB,
        "peak RSS grew from {small} MiB ({SMALL} objects) to {large} MiB ({LARGE} objects)"
    );
    assert!(
        large <= BOUND_MIB,
        "peak RSS {large} MiB is over {BOUND_MIB} MiB"
    );
}

/// The peak RSS in MiB of a cold `sync` of set `name`, which must mirror all `count` objects.
fn peak_rss_mib(target: &S3Target, name: &str, count: u64) -> u64 {
    let (_dir, dest) = temp_dest();
    let mut command: Command = hydrator_command(target);
    command
        .arg("sync")
        .arg(format!("s3://{}/{name}/", target.bucket))
        .arg(&dest)
        .args(["--endpoint-url", &target.endpoint, "--progress", "none"])
        .env("HYDRATOR_PATH_STYLE", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("run hydrator");
    let mut stderr = child.stderr.take().expect("piped");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).map(|_| text)
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0;
    let status = loop {
        // The high-water mark only grows: the last reading before the exit is the peak, to
        // within what the last 20 ms added.
        if let Some(kib) = high_water_kib(&status_file) {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = stderr.join().unwrap().unwrap();
    assert!(status.success(), "{name}: {status}\n{stderr}");
    assert!(peak_kib > 0, "{name}: no reading of {status_file}");
    let files = walk_count(&dest);
    assert_eq!(files, count, "{name}: files mirrored");
    peak_kib / 1024
}

/// `VmHWM` of a running process, in KiB; `None` once it has exited.
fn high_water_kib(status_file: &str) -> Option<u64> {
    let status = std::fs::read_to_string(status_file).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Regular files under `dir`, hydrator's state directory left out.
fn walk_count(dir: &std::path::Path) -> u64 {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() == ".hydrator" {
            continue;
        }
        match entry.file_type().unwrap().is_dir() {
            true => count += walk_count(&entry.path()),
            false => count += 1,
        }
    }
    count
}
