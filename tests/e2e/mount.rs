//! `hydrator mount`: a lazy view on a real FUSE mount (root, /dev/fuse), hydrated behind it.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

use crate::support::faults::{Fault, Rule};
use crate::support::mount::{cache_on_top, is_mounted, Mounted};
use crate::support::{content, has_ready, mounts_on, wait_until, Server};

/// `n` files of `size` bytes named `shard-NNN.bin` under `dir/` (listing order = name order).
fn shards(dir: &str, n: usize, size: usize) -> BTreeMap<String, Vec<u8>> {
    (0..n)
        .map(|i| {
            (
                format!("{dir}shard-{i:03}.bin"),
                content(i as u64 + 7, size),
            )
        })
        .collect()
}

/// Every GET of `prefix` stalls for `pause` before its first byte.
fn slow_gets(server: &Server, prefix: &str, pause: Duration) {
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get(prefix, Fault::StallBody(0, pause)).times(usize::MAX)
    });
}

/// Files present in the cache directory (published ones; partials are hidden names).
fn local_files(cache: &std::path::Path, dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cache.join(dir))
        .map(|entries| {
            entries
                .map(|e| e.unwrap())
                .filter(|e| e.file_type().unwrap().is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| !name.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn names_and_sizes_show_before_data_and_reads_match_the_store() {
    let server = Server::local();
    let mut dataset = shards("d/", 12, 100_000);
    dataset.insert("top.txt".into(), content(1, 5));
    dataset.insert("d/e/deep.bin".into(), content(2, 3 << 20));
    dataset.insert("empty".into(), Vec::new());
    server.seed("names/", &dataset);
    slow_gets(&server, "/names/", Duration::from_secs(2));
    let mount = Mounted::start(&server, "names/", &[]);

    // Names, sizes and directories, with no data local yet.
    let started = Instant::now();
    for (path, data) in &dataset {
        let meta = std::fs::metadata(mount.path(path)).unwrap();
        assert_eq!(meta.len(), data.len() as u64, "{path}");
        assert_eq!(meta.mode() & 0o777, 0o444, "{path}");
    }
    let mut top: Vec<String> = std::fs::read_dir(&mount.mountpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, [".hydrator", "d", "empty", "top.txt"]);
    assert!(std::fs::metadata(mount.path("d/e")).unwrap().is_dir());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "stat waited for data"
    );
    let local = local_files(&mount.cache, "d");
    assert!(
        local.is_empty(),
        "nothing fetched yet: {local:?} {:?}",
        started.elapsed()
    );

    // Read-only.
    let write = std::fs::OpenOptions::new()
        .write(true)
        .open(mount.path("top.txt"));
    assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
    assert!(std::fs::File::create(mount.path("new")).is_err());

    // Every byte as in the store, then the cache is complete and READY.
    server.faults.clear();
    for (path, data) in &dataset {
        assert!(std::fs::read(mount.path(path)).unwrap() == *data, "{path}");
    }
    wait_until("READY in the cache", Duration::from_secs(30), || {
        has_ready(&mount.cache)
    });
    let log = mount.log();
    assert!(log.contains("mounted s3://"), "{log}");
    assert!(
        !log.contains("passthrough"),
        "passthrough is on here: {log}"
    );

    // Hydrated: the cache itself is bound over the view, so opens no longer come to hydrator.
    wait_until("the cache over the view", Duration::from_secs(10), || {
        cache_on_top(&mount.mountpoint)
    });
    assert!(mount.path(".hydrator/READY").exists());
    for (path, data) in &dataset {
        assert!(std::fs::read(mount.path(path)).unwrap() == *data, "{path}");
    }
    assert!(
        std::fs::File::create(mount.path("new")).is_err(),
        "read-only"
    );
    let mut mount = mount;
    assert_eq!(mount.stop("TERM"), Some(0), "{}", mount.log());
    assert_eq!(mounts_on(&mount.mountpoint), 0, "both unmounted");
}

#[test]
fn the_lazy_marker_shows_at_once_naming_the_snapshot_and_ready_only_once_complete() {
    let server = Server::local();
    let dataset = shards("m/", 4, 100_000);
    server.seed("marked/", &dataset);
    let dir = tempfile::tempdir().unwrap();
    let digest = server.snapshot("marked/", &dir.path().join("snap.json"))["digest"]
        .as_str()
        .unwrap()
        .to_string();
    slow_gets(&server, "/marked/", Duration::from_secs(2));
    let mount = Mounted::start(&server, "marked/", &[]);

    // At once, from memory: no GET has ended, nothing is local, READY is not there.
    let started = Instant::now();
    let marker = std::fs::read_to_string(mount.path(".hydrator/LAZY")).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the marker waited {:?}",
        started.elapsed()
    );
    let url = format!("s3://{}/marked/", server.target.bucket);
    assert_eq!(marker, format!("dataset={url}\nsnapshot={digest}\n"));
    assert!(
        local_files(&mount.cache, "m").is_empty(),
        "nothing local yet"
    );
    assert!(!mount.path(".hydrator/READY").exists(), "not complete");
    let meta = std::fs::metadata(mount.path(".hydrator/LAZY")).unwrap();
    assert_eq!(
        (meta.len(), meta.mode() & 0o777),
        (marker.len() as u64, 0o444)
    );
    let write = std::fs::OpenOptions::new()
        .write(true)
        .open(mount.path(".hydrator/LAZY"));
    assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
    // A read at an offset, as the kernel may ask.
    let mut tail = String::new();
    let mut file = std::fs::File::open(mount.path(".hydrator/LAZY")).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(8)).unwrap();
    file.read_to_string(&mut tail).unwrap();
    assert_eq!(tail, marker[8..]);

    // Complete: the cache over the view has READY, and no marker.
    server.faults.clear();
    wait_until("the cache over the view", Duration::from_secs(60), || {
        cache_on_top(&mount.mountpoint)
    });
    assert!(mount.path(".hydrator/READY").exists());
    assert!(!mount.path(".hydrator/LAZY").exists());
}

/// A GET of `key` that stalls for a minute: the dataset stays incomplete through a test.
fn never_complete(server: &Server, key: &str) {
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get(key, Fault::StallBody(0, Duration::from_secs(60))).times(usize::MAX)
    });
}

#[test]
fn an_opened_file_jumps_the_queue_and_the_files_after_it_follow() {
    let server = Server::local();
    let dataset = shards("q/", 160, 64 << 10);
    server.seed("queue/", &dataset);
    slow_gets(&server, "/queue/", Duration::from_millis(100));
    let mount = Mounted::start(&server, "queue/", &["--concurrency", "2"]);

    let opened = Instant::now();
    let data = std::fs::read(mount.path("q/shard-150.bin")).unwrap();
    let waited = opened.elapsed();
    assert!(data == dataset["q/shard-150.bin"]);
    let local = local_files(&mount.cache, "q");
    assert!(local.contains(&"shard-150.bin".to_string()));
    // At 2 GETs of 100 ms at a time, the 150 files listed before it would take 7.5 s.
    assert!(
        local.len() < 100,
        "{} files were fetched first (in {waited:?})",
        local.len()
    );

    // Read-ahead: the files after the opened one come next.
    wait_until(
        "read-ahead after shard-150",
        Duration::from_secs(20),
        || {
            let local = local_files(&mount.cache, "q");
            (151..=155).all(|i| local.contains(&format!("shard-{i:03}.bin")))
        },
    );
    let local = local_files(&mount.cache, "q");
    assert!(
        local.len() < 140,
        "read-ahead, not the whole listing: {local:?}"
    );
}

#[test]
fn a_read_waits_for_the_parts_holding_its_bytes_not_for_the_whole_file() {
    let server = Server::local();
    let big = content(5, 12 << 20);
    server.seed(
        "ranges/",
        &BTreeMap::from([("big.bin".to_string(), big.clone())]),
    );
    // Each GET from the fifth MiB on stalls (within the client's patience for a stalled
    // body): the file cannot be whole for a while.
    let stall = Duration::from_secs(3);
    server.faults.add(
        Rule::get("big.bin", Fault::StallBody(0, stall))
            .ranges_from(4 << 20)
            .times(8),
    );
    let mount = Mounted::start(&server, "ranges/", &["--part-size", "1Mi"]);

    let opened = Instant::now();
    let mut file = std::fs::File::open(mount.path("big.bin")).unwrap();
    let mut head = vec![0; 4 << 20];
    file.read_exact(&mut head).unwrap();
    let waited = opened.elapsed();
    assert!(head == big[..4 << 20], "the first 4 MiB as in the store");
    assert!(
        waited < stall,
        "the read waited {waited:?} for parts it does not hold"
    );
    assert!(
        local_files(&mount.cache, "").is_empty() && !has_ready(&mount.cache),
        "the file is not whole yet: the bytes came from its written parts"
    );

    // Reading on waits for the stalled parts, and every byte is the store's.
    let mut rest = Vec::new();
    let read = file.read_to_end(&mut rest);
    assert!(read.is_ok(), "{read:?}: {}", mount.log());
    assert!(rest == big[4 << 20..], "the rest as in the store");
    assert!(opened.elapsed() >= stall, "the rest waited for its parts");
    // Whole now: a new open reads the local file, and the handle open before reads on.
    let whole = std::fs::read(mount.path("big.bin"));
    assert!(
        whole.as_ref().is_ok_and(|whole| *whole == big),
        "{whole:?} {}",
        mount.log()
    );
    let mut again = vec![0; 1 << 20];
    file.read_exact_at(&mut again, 11 << 20).unwrap();
    assert!(again == big[11 << 20..]);
    wait_until("READY in the cache", Duration::from_secs(30), || {
        has_ready(&mount.cache)
    });
}

#[test]
fn once_whole_the_view_opens_its_files_without_asking_and_reads_them_right() {
    use std::os::fd::AsRawFd;
    let server = Server::local();
    let dataset = shards("s/", 16, 200 << 10);
    server.seed("settled/", &dataset);
    // Not whole before the first open below.
    server
        .faults
        .add(Rule::get("shard-015.bin", Fault::StallBody(0, Duration::from_secs(1))).times(1));
    let mount = Mounted::start(&server, "settled/", &[]);
    // The view itself, as a pod without HostToContainer propagation keeps it.
    let view = std::fs::File::open(&mount.mountpoint).unwrap();
    let in_view = |name: &str| format!("/proc/self/fd/{}/{name}", view.as_raw_fd());
    // Opened while it may still hydrate, and kept open: a passthrough handle, or one read here.
    let mut kept = std::fs::File::open(in_view("s/shard-000.bin")).unwrap();
    wait_until("READY", Duration::from_secs(30), || has_ready(&mount.cache));
    let said = "the kernel opens its files without asking";
    let read_all = |round: u32| {
        for (name, bytes) in &dataset {
            let read = std::fs::read(in_view(name));
            assert!(
                read.as_ref().is_ok_and(|read| read == bytes),
                "{name}, round {round}: {:?} {}",
                read.map(|read| read.len()),
                mount.log()
            );
        }
    };
    read_all(0);
    // Not while a handle of this process is open.
    assert!(!mount.log().contains(said), "{}", mount.log());
    let mut whole = Vec::new();
    kept.read_to_end(&mut whole).unwrap();
    assert!(whole == dataset["s/shard-000.bin"]);
    drop(kept);
    // The release reaches the view after the close returns.
    std::thread::sleep(Duration::from_millis(200));
    read_all(1);
    read_all(2);
    assert_eq!(mount.log().matches(said).count(), 1, "{}", mount.log());
    // Pages the kernel keeps and pages it asks for again are the same bytes.
    let dropped = std::process::Command::new("sh")
        .args(["-c", "echo 1 > /proc/sys/vm/drop_caches"])
        .status()
        .unwrap();
    assert!(dropped.success(), "drop_caches: {dropped}");
    let mut at = vec![0; 4096];
    let last = std::fs::File::open(in_view("s/shard-015.bin")).unwrap();
    last.read_exact_at(&mut at, 100_000).unwrap();
    assert!(at == dataset["s/shard-015.bin"][100_000..104_096]);
}

#[test]
fn a_file_mapped_while_it_downloads_reads_right_and_opens_of_it_go_on_once_whole() {
    use std::os::fd::AsRawFd;
    let server = Server::local();
    let big = content(8, 12 << 20);
    server.seed(
        "mapped/",
        &BTreeMap::from([("big.bin".to_string(), big.clone())]),
    );
    server.faults.add(
        Rule::get("big.bin", Fault::StallBody(0, Duration::from_secs(2)))
            .ranges_from(4 << 20)
            .times(8),
    );
    let mount = Mounted::start(&server, "mapped/", &["--part-size", "1Mi"]);
    // The view itself, even once the cache is bound over the mountpoint (as a pod without
    // HostToContainer propagation keeps it).
    let view = std::fs::File::open(&mount.mountpoint).unwrap();
    let in_view = format!("/proc/self/fd/{}/big.bin", view.as_raw_fd());

    let file = std::fs::File::open(&in_view).unwrap();
    let len = big.len();
    // SAFETY: a read-only shared mapping of a file open for reading, unmapped below and read
    // only in between.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: `map` is `len` readable bytes until the munmap below.
    let mapped = unsafe { std::slice::from_raw_parts(map as *const u8, len) };
    assert!(
        mapped[..1 << 20] == big[..1 << 20],
        "the first MiB as in the store"
    );
    assert!(
        local_files(&mount.cache, "").is_empty(),
        "read before the file is whole"
    );
    assert!(mapped == &big[..], "every page as in the store");
    wait_until("the file whole", Duration::from_secs(30), || {
        !local_files(&mount.cache, "").is_empty()
    });
    // The mapping keeps the inode in the kernel's cached mode: a new open of it through the
    // view is still answered (the kernel refuses passthrough beside it).
    let again = std::fs::read(&in_view);
    assert!(again.as_ref().is_ok_and(|again| *again == big), "{again:?}");
    // SAFETY: `map` was mapped above with `len` bytes and is not used after this.
    assert_eq!(unsafe { libc::munmap(map, len) }, 0);
    drop(file);
    assert!(std::fs::read(&in_view).unwrap() == big, "passthrough again");
}

#[test]
fn a_read_at_the_end_of_a_large_file_is_fetched_before_the_parts_ahead_of_it() {
    let server = Server::local();
    let big = content(6, 32 << 20);
    server.seed(
        "tail/",
        &BTreeMap::from([("big.bin".to_string(), big.clone())]),
    );
    // 32 parts, two GETs of 300 ms at a time: about 5 s for the whole file in order.
    slow_gets(&server, "/tail/", Duration::from_millis(300));
    let mount = Mounted::start(
        &server,
        "tail/",
        &["--part-size", "1Mi", "--concurrency", "2"],
    );

    let opened = Instant::now();
    let file = std::fs::File::open(mount.path("big.bin")).unwrap();
    let mut tail = vec![0; 1 << 20];
    file.read_exact_at(&mut tail, 31 << 20).unwrap();
    let waited = opened.elapsed();
    assert!(tail == big[31 << 20..], "the last MiB as in the store");
    assert!(
        waited < Duration::from_millis(2500),
        "the last part waited {waited:?} behind the parts ahead of it"
    );
    assert!(local_files(&mount.cache, "").is_empty(), "not whole yet");
}

#[test]
fn a_file_that_cannot_be_fetched_fails_its_open_with_eio_and_the_rest_read() {
    let server = Server::local();
    let dataset = shards("f/", 4, 10_000);
    server.seed("failing/", &dataset);
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("shard-002", Fault::Status(403, "AccessDenied")).times(usize::MAX)
    });
    let mount = Mounted::start(&server, "failing/", &[]);

    let denied = std::fs::read(mount.path("f/shard-002.bin")).unwrap_err();
    assert_eq!(denied.raw_os_error(), Some(libc::EIO), "{denied}");
    assert!(std::fs::read(mount.path("f/shard-001.bin")).unwrap() == dataset["f/shard-001.bin"]);
    let log = mount.log();
    assert!(
        log.contains("failing/f/shard-002.bin") && log.contains("EIO"),
        "the log names the key: {log}"
    );
    // Failed for good: a second open fails at once too.
    let again = std::fs::File::open(mount.path("f/shard-002.bin")).unwrap_err();
    assert_eq!(again.raw_os_error(), Some(libc::EIO));
    assert!(!has_ready(&mount.cache));
}

#[test]
fn a_reader_never_sees_unverified_bytes_of_a_changed_or_truncated_object() {
    let server = Server::local();
    let dataset = shards("c/", 3, 3 << 20);
    server.seed("changing/", &dataset);
    // Replaced on the server when its GET comes: the listing's ETag no longer matches.
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("shard-000", Fault::ReplaceObject(content(99, 3 << 20)))
    });
    // A body cut short once: retried, and the reader gets the whole file.
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get("shard-001", Fault::TruncateBody(1 << 20))
    });
    let mount = Mounted::start(&server, "changing/", &[]);

    match std::fs::read(mount.path("c/shard-000.bin")) {
        Err(err) => assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}"),
        Ok(data) => panic!("a changed object was served ({} bytes)", data.len()),
    }
    assert!(std::fs::read(mount.path("c/shard-001.bin")).unwrap() == dataset["c/shard-001.bin"]);
    assert!(std::fs::read(mount.path("c/shard-002.bin")).unwrap() == dataset["c/shard-002.bin"]);
    let log = mount.log();
    assert!(log.contains("changing/c/shard-000.bin"), "{log}");
}

#[test]
fn sigterm_unmounts_and_leaves_the_cache_resumable() {
    let server = Server::local();
    let dataset = shards("r/", 40, 256 << 10);
    server.seed("resume/", &dataset);
    slow_gets(&server, "/resume/", Duration::from_millis(100));
    let mut mount = Mounted::start(&server, "resume/", &["--concurrency", "2"]);
    let first = std::fs::read(mount.path("r/shard-010.bin")).unwrap();
    assert!(first == dataset["r/shard-010.bin"]);

    let code = mount.stop("TERM");
    assert_eq!(code, Some(3), "stopped before complete: {}", mount.log());
    assert!(!is_mounted(&mount.mountpoint), "unmounted");
    assert!(!has_ready(&mount.cache));

    server.faults.clear();
    let resumed = server.sync("resume/", &mount.cache, &[]);
    resumed.assert_code(0);
    assert!(
        resumed.count("objects", "skipped") >= 1,
        "the mount's files count"
    );
    assert!(has_ready(&mount.cache));
}

#[test]
fn an_unmount_from_outside_ends_the_process() {
    let server = Server::local();
    server.seed("outside/", &shards("o/", 2, 1000));
    let mut mount = Mounted::start(&server, "outside/", &[]);
    wait_until("READY", Duration::from_secs(20), || has_ready(&mount.cache));
    let unmounted = std::process::Command::new("umount")
        .arg(&mount.mountpoint)
        .status()
        .unwrap();
    assert!(unmounted.success());
    let status = mount.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", mount.log());
    assert_eq!(mounts_on(&mount.mountpoint), 0, "the view went too");
}

#[test]
fn a_hydrated_view_reads_through_passthrough_even_after_the_process_is_killed() {
    let server = Server::local();
    let dataset = shards("k/", 2, 4 << 20);
    server.seed("killed/", &dataset);
    server.seed("killed/", &shards("z/", 1, 10));
    never_complete(&server, "/killed/z/");
    let mut mount = Mounted::start(&server, "killed/", &[]);
    let mut file = std::fs::File::open(mount.path("k/shard-000.bin")).unwrap();
    let mut head = vec![0; 1 << 20];
    file.read_exact(&mut head).unwrap();

    mount.child.kill().unwrap();
    mount.child.wait().unwrap();
    let mut rest = Vec::new();
    let after = file.read_to_end(&mut rest);
    let other = std::fs::read(mount.path("k/shard-001.bin"));
    // An open file reads on from its backing file, in the kernel: the bytes are the verified
    // ones, never zeros.
    after.expect("a passthrough file reads on after its server is gone");
    head.extend_from_slice(&rest);
    assert!(head == dataset["k/shard-000.bin"]);
    let other = other.unwrap_err();
    assert_eq!(other.raw_os_error(), Some(libc::ENOTCONN), "{other}");
}

#[test]
fn hostile_keys_stay_out_of_the_view_and_out_of_the_filesystem() {
    let server = Server::local();
    let good = shards("ok/", 2, 1000);
    server.seed("hostile-view/", &good);
    let hostile = [
        "hostile-view/../escape.txt",
        "hostile-view/a/../../escape2.txt",
        "hostile-view//absolute.txt",
        "hostile-view/.hydrator/READY",
    ];
    let injected = hostile.iter().map(|k| (k.to_string(), 5)).collect();
    server
        .faults
        .add(Rule::listing(Fault::InjectListing(injected)).times(usize::MAX));
    let mount = Mounted::start(&server, "hostile-view/", &[]);

    let mut seen = Vec::new();
    let mut dirs = vec![mount.mountpoint.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            match entry.file_type().unwrap().is_dir() {
                true => dirs.push(entry.path()),
                false => seen.push(
                    entry
                        .path()
                        .strip_prefix(&mount.mountpoint)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                ),
            }
        }
    }
    seen.sort();
    // The view's own marker, never the listed `.hydrator/READY`.
    assert_eq!(
        seen,
        [".hydrator/LAZY", "ok/shard-000.bin", "ok/shard-001.bin"]
    );
    assert!(std::fs::metadata(mount.path("../escape.txt")).is_err());
    assert!(std::fs::metadata(mount.path(".hydrator/READY")).is_err());
    for (path, data) in &good {
        assert!(std::fs::read(mount.path(path)).unwrap() == *data);
    }
    // Nothing written beside the cache: the temp dir holds the view, the cache and the log.
    let parent = mount.cache.parent().unwrap();
    let mut beside: Vec<String> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    beside.sort();
    assert_eq!(beside, ["cache", "mount.log", "view"]);
}

#[test]
fn a_directory_of_100_000_entries_lists_in_a_second_once_cached() {
    let server = Server::local();
    server.seed("wide/", &shards("", 1, 10));
    // Entries only in the listing: the engine, held to one GET a second, fetches almost none.
    let wide: Vec<(String, u64)> = (0..100_000)
        .map(|i| (format!("wide/many/f{i:06}"), 4096))
        .collect();
    server
        .faults
        .add(Rule::listing(Fault::InjectListing(wide)).times(usize::MAX));
    let mount = Mounted::start(&server, "wide/", &["--max-requests-per-second", "1"]);

    let list = || {
        let started = Instant::now();
        let count = std::fs::read_dir(mount.path("many"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().metadata().unwrap().len() == 4096)
            .count();
        (count, started.elapsed())
    };
    let (first, cold) = list();
    assert_eq!(first, 100_000);
    let (again, cached) = list();
    assert_eq!(again, 100_000);
    assert!(
        cached < Duration::from_secs(1),
        "100,000 entries with their sizes: {cold:?} cold, {cached:?} cached"
    );
    eprintln!("readdir + stat of 100,000 entries: {cold:?} cold, {cached:?} cached");
}

#[test]
fn without_passthrough_the_view_reads_through_hydrator_and_says_so_once() {
    let server = Server::local();
    let dataset = shards("p/", 3, 3 << 20);
    server.seed("no-passthrough/", &dataset);
    server.seed("no-passthrough/", &shards("z/", 1, 10));
    never_complete(&server, "/no-passthrough/z/");
    let mount = Mounted::start(&server, "no-passthrough/", &["--no-passthrough"]);
    for (path, data) in &dataset {
        assert!(std::fs::read(mount.path(path)).unwrap() == *data, "{path}");
        // Random reads, served by hydrator's pread.
        let file = std::fs::File::open(mount.path(path)).unwrap();
        let mut buf = vec![0; 4096];
        for offset in [0, 12_345, (3 << 20) - 4096] {
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, offset).unwrap();
            assert!(
                buf == data[offset as usize..offset as usize + 4096],
                "{path} at {offset}"
            );
        }
    }
    let log = mount.log();
    assert_eq!(log.matches("passthrough off").count(), 1, "{log}");
    drop(mount);
}

/// Reads `len` bytes at `at` through `file`: the bytes, or the errno.
fn read_at(file: &std::fs::File, at: u64, len: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0; len];
    match file.read_exact_at(&mut buf, at) {
        Ok(()) => Ok(buf),
        Err(err) => Err(err.raw_os_error().unwrap_or(0)),
    }
}

const MIB: usize = 1 << 20;
/// Where the first GET of `big.bin`'s first part has a byte flipped in
/// [`rejected_then_fetched_again`].
const FLIPPED: usize = 12_345;

/// A 4 MiB `big.bin` under `prefix` whose first attempt (parts of 1 MiB) has a byte of its
/// first part flipped in transit, which only the server's full-object checksum catches once the
/// other parts are in (each stalls `stall`); the second attempt's parts stall `stall` too, so a
/// file opened meanwhile waits for it.
fn rejected_then_fetched_again(server: &Server, prefix: &str, stall: Duration) -> Vec<u8> {
    let big = content(77, 4 * MIB);
    server.seed(
        prefix,
        &BTreeMap::from([("big.bin".to_string(), big.clone())]),
    );
    let faults = &server.faults;
    faults.add(
        Rule::get("big.bin", Fault::StallBody(0, stall))
            .ranges_from(MIB as u64)
            .times(3),
    );
    faults.add(Rule::get("big.bin", Fault::CorruptBody(FLIPPED)));
    faults.add(Rule::get("big.bin", Fault::StallBody(0, stall)).times(4));
    big
}

#[test]
fn a_handle_that_read_bytes_the_checksum_then_rejected_gets_eio_and_never_those_bytes_again() {
    let server = Server::local();
    let stall = Duration::from_secs(3);
    let big = rejected_then_fetched_again(&server, "rejected/", stall);
    let mount = Mounted::start(&server, "rejected/", &["--part-size", "1Mi"]);

    // Opened while the first attempt downloads: one reads its first part (the flipped byte
    // among it: no check can know yet), one reads nothing before the rejection.
    let reader = std::fs::File::open(mount.path("big.bin")).unwrap();
    let idle = std::fs::File::open(mount.path("big.bin")).unwrap();
    let head = read_at(&reader, 0, 64 << 10).unwrap();
    assert_ne!(
        head[FLIPPED], big[FLIPPED],
        "the first attempt's byte was served"
    );
    assert!(head[..FLIPPED] == big[..FLIPPED]);

    // The full-object checksum rejects the attempt; a file opened during the refetch waits
    // for the new attempt and reads the store's bytes.
    wait_until("the attempt rejected", Duration::from_secs(30), || {
        mount.log().contains("fetching it again")
    });
    assert!(
        local_files(&mount.cache, "").is_empty(),
        "refetching: {}",
        mount.log()
    );
    let during = std::fs::File::open(mount.path("big.bin")).unwrap();
    let fresh = read_at(&during, 0, 64 << 10);
    assert!(
        fresh.as_ref().is_ok_and(|fresh| *fresh == big[..64 << 10]),
        "{:?}: {}",
        fresh.map(|f| f[FLIPPED]),
        mount.log()
    );
    wait_until("READY in the cache", Duration::from_secs(30), || {
        has_ready(&mount.cache)
    });

    // After READY, the handle that read rejected bytes gets EIO, where they were and beyond;
    // the one that read nothing of them reads the verified file.
    assert_eq!(read_at(&reader, 0, 64 << 10), Err(libc::EIO));
    assert_eq!(read_at(&reader, 2 * MIB as u64, 4096), Err(libc::EIO));
    let mut whole = Vec::new();
    (&idle).read_to_end(&mut whole).unwrap();
    assert!(whole == big, "the idle handle reads the verified file");
    assert!(std::fs::read(mount.path("big.bin")).unwrap() == big);
    let log = mount.log();
    assert!(
        log.contains("rejected/big.bin") && log.contains("discarded before its whole-file checks"),
        "{log}"
    );
}

#[test]
fn without_streaming_of_unchecked_bytes_a_file_opens_only_once_whole_and_verified() {
    let server = Server::local();
    let stall = Duration::from_secs(3);
    let big = rejected_then_fetched_again(&server, "whole/", stall);
    let mount = Mounted::start(
        &server,
        "whole/",
        &["--part-size", "1Mi", "--no-stream-unchecked"],
    );

    let opened = Instant::now();
    let file = std::fs::File::open(mount.path("big.bin"));
    let waited = opened.elapsed();
    let file = file.unwrap_or_else(|err| panic!("{err}: {}", mount.log()));
    assert!(
        waited >= 2 * stall - Duration::from_millis(500),
        "opened after {waited:?}, before both attempts were in"
    );
    assert!(mount.log().contains("fetching it again"), "{}", mount.log());
    let mut whole = Vec::new();
    (&file).read_to_end(&mut whole).unwrap();
    assert!(whole == big, "only the verified attempt's bytes");
}

#[test]
fn a_file_of_a_sealed_snapshot_opens_only_once_whole_and_as_sealed() {
    let server = Server::local();
    let dataset = BTreeMap::from([
        ("big.bin".to_string(), content(78, 4 * MIB)),
        ("bad.bin".to_string(), content(79, 4 * MIB)),
    ]);
    // Sent without a checksum: the seal is the only check of the bytes.
    server.seed_without_checksum("sealedview/", &dataset);
    let dir = tempfile::tempdir().unwrap();
    let sealed = crate::p2p::sealed_snapshot(&server, "sealedview/", dir.path());
    let stall = Duration::from_secs(3);
    server.faults.add(
        Rule::get("big.bin", Fault::StallBody(0, stall))
            .ranges_from(MIB as u64)
            .times(3),
    );
    server
        .faults
        .add(Rule::get("bad.bin", Fault::CorruptBody(FLIPPED)).times(usize::MAX));
    let mount = Mounted::start_snapshot(&server, &sealed, &["--part-size", "1Mi"]);

    // No byte before the whole file matched its seal: the open waits for every part.
    let opened = Instant::now();
    let file = std::fs::File::open(mount.path("big.bin"));
    let waited = opened.elapsed();
    let mut big = Vec::new();
    let read = file.and_then(|mut file| file.read_to_end(&mut big));
    assert!(
        read.is_ok() && big == dataset["big.bin"],
        "{read:?}: {}",
        mount.log()
    );
    assert!(
        waited >= stall - Duration::from_millis(500),
        "opened after {waited:?}, before the whole file was in"
    );
    // Bytes that differ from the seal never reach a reader: the open fails.
    match std::fs::File::open(mount.path("bad.bin")) {
        Err(err) => assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}"),
        Ok(file) => panic!(
            "a file not as sealed was opened: {:?}",
            read_at(&file, FLIPPED as u64, 1)
        ),
    }
    let log = mount.log();
    assert!(log.contains("do not match the sealed snapshot"), "{log}");
}
