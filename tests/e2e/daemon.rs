//! The node daemon end to end: the real binary, the in-process S3 server (and Garage), real
//! `hydrator warm` clients and plain HTTP on its socket.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::support::daemon::{catalog, daemon_command, dataset, Daemon, DatasetSpec, TOKEN};
use crate::support::faults::{Fault, Rule};
use crate::support::{
    assert_mirror, content, files, read_tree, records_durable_parts, wait_until, Server, MIB,
};

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn assert_ok(output: &std::process::Output, daemon: &Daemon) {
    assert!(
        output.status.success(),
        "warm failed ({:?}):\n{}\ndaemon log:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
}

/// A daemon on the in-process server whose catalog holds one dataset, `name`, of `files`
/// (under the prefix `name/`); `cache_extra` adds lines to `[cache]`.
fn one_dataset(
    name: &str,
    files: &BTreeMap<String, Vec<u8>>,
    cache_extra: &str,
) -> (Daemon, tempfile::TempDir, Server) {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("{name}/");
    server.seed(&prefix, files);
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        cache_extra,
        &[dataset(name, &prefix)],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    (daemon, dir, server)
}

fn dataset_files(seed: u64, count: usize, size: usize) -> BTreeMap<String, Vec<u8>> {
    (0..count)
        .map(|i| {
            (
                format!("part-{i}.bin"),
                content(seed * 100 + i as u64, size),
            )
        })
        .collect()
}

fn total(files: &BTreeMap<String, Vec<u8>>) -> u64 {
    files.values().map(|f| f.len() as u64).sum()
}

fn check_fifty_clients(server: &Server, prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    let names = ["ds0", "ds1", "ds2", "ds3", "ds4"];
    let prefixes: Vec<String> = names.iter().map(|n| format!("{prefix}{n}/")).collect();
    let mut expected = Vec::new();
    for (i, p) in prefixes.iter().enumerate() {
        let files = dataset_files(i as u64, 4, 300 << 10);
        server.seed(p, &files);
        expected.push(files);
    }
    // A client that arrives after its dataset's hydration ended is served from the cache, not
    // by a new listing: on a loaded machine the 50 processes start over several seconds.
    let specs: Vec<DatasetSpec> = names
        .iter()
        .zip(&prefixes)
        .map(|(n, p)| DatasetSpec {
            refresh_seconds: 3600,
            ..dataset(n, p)
        })
        .collect();
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let before = server.faults.object_bytes.load(Relaxed);
    let clients: Vec<_> = (0..50)
        .map(|i| {
            daemon
                .warm_command(names[i % 5], &[])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut paths: Vec<Vec<String>> = vec![vec![]; 5];
    for (i, client) in clients.into_iter().enumerate() {
        let output = client.wait_with_output().unwrap();
        assert_ok(&output, &daemon);
        paths[i % 5].push(stdout(&output));
    }
    for (i, paths) in paths.iter().enumerate() {
        assert!(paths.iter().all(|p| *p == paths[0]), "one path per dataset");
        assert!(Path::new(&paths[0]).join(".hydrator/READY").exists());
        assert_mirror(Path::new(&paths[0]), &expected[i]);
    }
    if server.faults.object_bytes.load(Relaxed) > 0 || before > 0 {
        let fetched = server.faults.object_bytes.load(Relaxed) - before;
        let all: u64 = expected.iter().map(total).sum();
        assert_eq!(fetched, all, "each object fetched once");
    }
    let complete = daemon.metric("hydrator_hydrations_total{result=\"complete\"}");
    assert_eq!(complete, 5.0, "one hydration per dataset");
    assert_eq!(daemon.metric("hydrator_datasets{state=\"ready\"}"), 5.0);
    assert!(!daemon.log().contains("ERROR"), "{}", daemon.log());
}

on_both_servers_and_minio!(
    fifty_warm_clients_share_one_hydration_per_dataset,
    check_fifty_clients,
    "daemon-fifty/"
);

#[test]
fn eviction_under_a_small_quota_spares_leased_snapshots() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b", "c"] {
        let files = files(&[("data.bin", content(name.as_bytes()[0] as u64, MIB))]);
        server.seed(&format!("{name}/"), &files);
    }
    let specs = [dataset("a", "a/"), dataset("b", "b/"), dataset("c", "c/")];
    let text = catalog(dir.path(), &server.target, "2560KiB", "", &specs);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let path_file = dir.path().join("a.path");
    let a = daemon.warm(
        "a",
        &[
            "--lease-holder",
            "pod-a",
            "--path-file",
            path_file.to_str().unwrap(),
        ],
    );
    assert_ok(&a, &daemon);
    assert_eq!(
        std::fs::read_to_string(&path_file).unwrap().trim(),
        stdout(&a)
    );
    std::thread::sleep(Duration::from_millis(1100)); // distinct last-use seconds
    let b = daemon.warm("b", &[]);
    assert_ok(&b, &daemon);
    std::thread::sleep(Duration::from_millis(1100));
    let c = daemon.warm("c", &[]);
    assert_ok(&c, &daemon);
    assert!(Path::new(&stdout(&a)).exists(), "leased a stays");
    assert!(
        !Path::new(&stdout(&b)).exists(),
        "b, unleased and least recently used, went"
    );
    assert_eq!(daemon.status("b")["state"], "absent");
    assert_eq!(
        daemon.metric("hydrator_evictions_total{reason=\"quota\"}"),
        1.0
    );

    let (code, body) = daemon.request("DELETE", "/v1/datasets/a/leases/pod-a", "");
    assert_eq!(code, 204, "{body}");
    std::thread::sleep(Duration::from_millis(1100));
    // b's file is preallocated before its first byte arrives; the stall lets maintenance run
    // meanwhile, and it must not count those bytes twice (on disk and still reserved).
    server.faults.add(Rule {
        ranged_only: false,
        ..Rule::get(
            "b/data.bin",
            Fault::StallBody(0, Duration::from_millis(2500)),
        )
    });
    assert_ok(&daemon.warm("b", &[]), &daemon);
    assert!(!Path::new(&stdout(&a)).exists(), "released a went next");
    assert!(Path::new(&stdout(&c)).exists());
    assert!(daemon.metric("hydrator_cache_used_bytes") <= (2560 << 10) as f64);
}

#[test]
fn expired_leases_are_released() {
    let (daemon, _dir, _server) = one_dataset("e", &files(&[("x", content(7, 1000))]), "");
    assert_ok(
        &daemon.warm("e", &["--lease-holder", "pod-1", "--lease-ttl", "5"]),
        &daemon,
    );
    // The lease runs from the request: 5 s leave a loaded machine time to hydrate and answer.
    assert_eq!(daemon.metric("hydrator_leases"), 1.0);
    wait_until("the lease expires", Duration::from_secs(30), || {
        daemon.metric("hydrator_leases") == 0.0
    });
}

#[test]
fn a_dataset_too_big_for_the_quota_fails_naming_the_numbers() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("big/", &files(&[("big.bin", content(1, 2 * MIB))]));
    let text = catalog(
        dir.path(),
        &server.target,
        "1MiB",
        "",
        &[dataset("big", "big/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let output = daemon.warm("big", &[]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in [
        "not enough space",
        "2.0 MiB of new data needed",
        "quota 1.0 MiB",
    ] {
        assert!(stderr.contains(needle), "{needle} in {stderr}");
    }
    assert!(stdout(&output).is_empty(), "no path printed");
    assert_eq!(daemon.status("big")["state"], "failed");
    assert_eq!(
        server.faults.object_bytes.load(Relaxed),
        0,
        "nothing fetched"
    );
}

fn check_new_snapshot(server: &Server, prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    let old = files(&[
        ("same.bin", content(1, 200 << 10)),
        ("nested/same.txt", content(2, 3000)),
        ("changes.bin", content(3, 100 << 10)),
    ]);
    server.seed(prefix, &old);
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("ds", prefix)],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let first = daemon.warm("ds", &["--lease-holder", "reader"]);
    assert_ok(&first, &daemon);
    let old_path = PathBuf::from(stdout(&first));
    let reader = std::fs::File::open(old_path.join("changes.bin")).unwrap();

    let mut new = old.clone();
    new.insert("changes.bin".into(), content(4, 120 << 10));
    new.insert("added.bin".into(), content(5, 10 << 10));
    server.seed(prefix, &new);
    let before = server.faults.object_bytes.load(Relaxed);
    let second = daemon.warm("ds", &[]);
    assert_ok(&second, &daemon);
    let new_path = PathBuf::from(stdout(&second));
    assert_ne!(new_path, old_path, "a new snapshot gets a new directory");
    assert_mirror(&old_path, &old);
    assert_mirror(&new_path, &new);
    let mut read_back = Vec::new();
    std::io::Read::read_to_end(&mut &reader, &mut read_back).unwrap();
    assert!(
        read_back == old["changes.bin"],
        "the open file kept its bytes"
    );
    for unchanged in ["same.bin", "nested/same.txt"] {
        let (a, b) = (
            std::fs::metadata(old_path.join(unchanged)).unwrap(),
            std::fs::metadata(new_path.join(unchanged)).unwrap(),
        );
        assert_eq!(a.ino(), b.ino(), "{unchanged} is hard-linked");
    }
    if server.faults.object_bytes.load(Relaxed) > 0 {
        let fetched = server.faults.object_bytes.load(Relaxed) - before;
        assert_eq!(
            fetched,
            (130 << 10) as u64,
            "only the changed and added objects"
        );
    }
    let (code, body) = daemon.request("GET", "/v1/leases", "");
    assert_eq!(code, 200);
    assert!(
        body.contains(old_path.file_name().unwrap().to_str().unwrap()),
        "{body}"
    );
}

on_both_servers_and_minio!(
    a_new_snapshot_leaves_the_old_one_alone_and_links_unchanged_files,
    check_new_snapshot,
    "daemon-snapshot/"
);

/// The dataset `name`: one 24 MiB object whose second part stalls for a minute after 1 MiB,
/// so a hydration of it is busy for as long as a test needs. Returns its files and a catalog
/// with the cache's `quota`.
fn stalled_dataset(
    server: &Server,
    dir: &Path,
    name: &str,
    seed: u64,
    quota: &str,
) -> (BTreeMap<String, Vec<u8>>, String) {
    let prefix = format!("{name}/");
    let data = files(&[("big.bin", content(seed, 24 * MIB))]);
    server.seed(&prefix, &data);
    server
        .faults
        .add(Rule::get("big.bin", Fault::StallBody(MIB, Duration::from_secs(60))).skip(1));
    let text = catalog(dir, &server.target, quota, "", &[dataset(name, &prefix)]);
    (data, text)
}

#[test]
fn a_daemon_killed_mid_hydration_resumes_on_restart() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let size = 24 * MIB;
    let (data, text) = stalled_dataset(&server, dir.path(), "k", 9, "1GiB");
    kill_mid_hydration(&server, dir.path(), &text, "k");
    let fetched_first = server.faults.object_bytes.load(Relaxed);

    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert!(
        daemon.log().contains("resuming the hydration"),
        "{}",
        daemon.log()
    );
    let output = daemon.warm("k", &[]);
    assert_ok(&output, &daemon);
    assert_mirror(Path::new(&stdout(&output)), &data);
    let fetched_again = server.faults.object_bytes.load(Relaxed) - fetched_first;
    assert!(
        fetched_again <= (size - 8 * MIB) as u64 && fetched_again >= 8 * MIB as u64,
        "durable parts are not fetched again: {fetched_again} bytes after the restart\n{}",
        daemon.log()
    );
}

#[test]
fn a_hydration_resumed_after_a_restart_counts_what_its_directory_holds_once() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    // 24 MiB under a 40 MiB quota: the dataset fits once; its preallocated file counted as the
    // cache's use and the whole dataset again as still to come would not (48 MiB).
    let (data, text) = stalled_dataset(&server, dir.path(), "q", 11, "40MiB");
    kill_mid_hydration(&server, dir.path(), &text, "q");
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let output = daemon.warm("q", &[]);
    assert_ok(&output, &daemon);
    assert_mirror(Path::new(&stdout(&output)), &data);
    assert!(
        !daemon.log().contains("not enough space"),
        "{}",
        daemon.log()
    );
}

/// Starts a daemon on `catalog`, has it hydrate the stalled dataset `name` and kills it
/// (SIGKILL) once parts 0 and 2 are in, part 1 stalled after 1 MiB, and a checkpoint recorded
/// durable parts (a loaded machine can take seconds to `syncfs`).
fn kill_mid_hydration(server: &Server, dir: &Path, catalog: &str, name: &str) {
    let daemon = Daemon::start(dir, &server.target, catalog);
    let (code, _) = daemon.request("POST", &format!("/v1/datasets/{name}/warm"), "");
    assert_eq!(code, 202);
    wait_for_progress(&daemon, name, 17 * MIB as u64);
    wait_for_durable_parts(&dir.join("cache").join(name));
}

/// Waits until a manifest under `dataset_dir` records durable parts.
fn wait_for_durable_parts(dataset_dir: &Path) {
    wait_until("durable parts recorded", Duration::from_secs(60), || {
        std::fs::read_dir(dataset_dir).unwrap().any(|snapshot| {
            records_durable_parts(&snapshot.unwrap().path().join(".hydrator/manifest.journal"))
        })
    });
}

/// Waits until the hydration of `name` has received at least `bytes`.
fn wait_for_progress(daemon: &Daemon, name: &str, bytes: u64) {
    wait_until(
        &format!("{name} receives {bytes} bytes"),
        Duration::from_secs(30),
        || {
            daemon.status(name)["progress"]["bytes_done"]
                .as_u64()
                .unwrap_or(0)
                >= bytes
        },
    );
}

#[test]
fn sigterm_mid_hydration_stops_promptly_and_a_restart_resumes_with_its_leases() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("t/", &files(&[("x", content(3, 5000))]));
    let big = files(&[("big.bin", content(4, 24 * MIB))]);
    server.seed("slow/", &big);
    server
        .faults
        .add(Rule::get("big.bin", Fault::StallBody(MIB, Duration::from_secs(60))).skip(1));
    let specs = [dataset("t", "t/"), dataset("slow", "slow/")];
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert_ok(&daemon.warm("t", &["--lease-holder", "pod-t"]), &daemon);
    let (code, _) = daemon.request("POST", "/v1/datasets/slow/warm", "");
    assert_eq!(code, 202);
    // Parts 0 and 2 in, part 1 stalled after 1 MiB, and durable parts recorded.
    wait_for_progress(&daemon, "slow", 17 * MIB as u64);
    wait_for_durable_parts(&dir.path().join("cache/slow"));
    let socket = daemon.socket.clone();
    let (status, took) = daemon.terminate();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(!socket.exists(), "the socket is removed");
    let fetched_first = server.faults.object_bytes.load(Relaxed);

    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let (_, body) = daemon.request("GET", "/v1/leases", "");
    assert!(body.contains("pod-t"), "{body}");
    assert_eq!(daemon.status("t")["state"], "ready");
    let output = daemon.warm("slow", &[]);
    assert_ok(&output, &daemon);
    assert_mirror(Path::new(&stdout(&output)), &big);
    let fetched_again = server.faults.object_bytes.load(Relaxed) - fetched_first;
    assert!(
        (8 * MIB as u64..=16 * MIB as u64).contains(&fetched_again),
        "the recorded parts are not fetched again: {fetched_again} bytes\n{}",
        daemon.log()
    );
}

#[test]
fn unknown_names_bad_tokens_and_malformed_bodies_are_refused() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("u/", &files(&[("x", content(3, 100))]));
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("u", "u/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);

    let output = daemon.warm("nope", &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no dataset \"nope\" in the catalog"));
    let (code, _) = daemon.request("GET", "/v1/datasets/nope", "");
    assert_eq!(code, 404);

    let (code, body) = daemon.tcp_request("GET", "/v1/datasets", "", "wrong-token-0123456789");
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("bearer token"));
    let (code, body) = daemon.tcp_request("GET", "/v1/datasets", "", TOKEN);
    assert_eq!(code, 200, "{body}");
    let (code, _) = daemon.tcp_request("GET", "/healthz", "", "");
    assert_eq!(code, 200, "probes need no token");

    for (method, path, body) in [
        ("POST", "/v1/datasets/u/warm", "{"),
        ("POST", "/v1/datasets/u/warm", "{\"wait\": \"yes\"}"),
        ("POST", "/v1/datasets/u/warm", "{\"surprise\": 1}"),
        ("PUT", "/v1/datasets/u/leases/pod", "{\"ttl_seconds\": -1}"),
    ] {
        let (code, answer) = daemon.request(method, path, body);
        assert_eq!(code, 400, "{method} {path} {body}: {answer}");
        assert!(answer.contains("malformed request body"), "{answer}");
    }
    let (code, body) = daemon.request("PUT", "/v1/datasets/u/leases/pod", "");
    assert_eq!(code, 409, "not ready yet: {body}");
    assert_eq!(server.faults.object_bytes.load(Relaxed), 0);
}

#[test]
fn a_catalog_with_errors_is_refused_with_every_problem() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("catalog.toml"),
        "[cache]\nroot = \"relative\"\nquota = \"lots\"\n[listen]\n[datasets.\"a/b\"]\nsource = \"s3://x\"\n",
    )
    .unwrap();
    let output = daemon_command(&server.target, dir.path()).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in [
        "catalog.toml",
        "cache.root",
        "cache.quota",
        "give a socket, a tcp address or both",
        "dataset \"a/b\": names are",
        "invalid source URL",
    ] {
        assert!(stderr.contains(needle), "{needle} in {stderr}");
    }
}

#[test]
fn sighup_reloads_the_catalog_and_a_bad_one_is_refused() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("one/", &files(&[("x", content(1, 100))]));
    server.seed("two/", &files(&[("y", content(2, 100))]));
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("one", "one/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert_eq!(daemon.warm("two", &[]).status.code(), Some(2));

    std::fs::write(dir.path().join("catalog.toml"), "[cache\n").unwrap();
    daemon.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_ok(&daemon.warm("one", &[]), &daemon);

    let two = [dataset("one", "one/"), dataset("two", "two/")];
    let text = catalog(dir.path(), &server.target, "1GiB", "", &two);
    std::fs::write(dir.path().join("catalog.toml"), text).unwrap();
    daemon.signal(libc::SIGHUP);
    wait_until("the catalog is reloaded", Duration::from_secs(10), || {
        daemon.log().contains("catalog reloaded")
    });
    assert!(daemon.log().contains("reload refused"), "{}", daemon.log());
    assert_ok(&daemon.warm("two", &[]), &daemon);
}

/// A catalog directory laid out as the kubelet lays out a ConfigMap volume: `catalog.toml` is
/// a symlink to `..data/catalog.toml`, and `..data` a symlink to a timestamped directory.
struct KubeletCatalog {
    dir: PathBuf,
    generation: u32,
}

impl KubeletCatalog {
    fn new(dir: &Path) -> Self {
        let mut catalog = Self {
            dir: dir.to_path_buf(),
            generation: 0,
        };
        catalog.swap_in("");
        std::os::unix::fs::symlink("..data/catalog.toml", dir.join("catalog.toml")).unwrap();
        catalog
    }

    /// As the kubelet's update: the new content in a new directory, `..data` swapped to it
    /// with a rename, the old directory removed. The file the daemon opened is never written.
    fn swap_in(&mut self, text: &str) {
        self.generation += 1;
        let fresh = format!(
            "..2026_12_06_00_00_0{}.{}",
            self.generation, self.generation
        );
        std::fs::create_dir(self.dir.join(&fresh)).unwrap();
        std::fs::write(self.dir.join(&fresh).join("catalog.toml"), text).unwrap();
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        std::os::unix::fs::symlink(&fresh, self.dir.join("..data_tmp")).unwrap();
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }
}

/// The daemon on a kubelet-style catalog of dataset `one` (with `two` seeded but not in it).
fn daemon_on_a_kubelet_catalog(server: &Server, dir: &Path) -> (Daemon, KubeletCatalog) {
    server.seed("one/", &files(&[("x", content(1, 100))]));
    server.seed("two/", &files(&[("y", content(2, 100))]));
    let volume = KubeletCatalog::new(dir);
    let text = catalog(dir, &server.target, "1GiB", "", &[dataset("one", "one/")]);
    // Written through the symlinks, into the timestamped directory.
    let daemon = Daemon::start(dir, &server.target, &text);
    assert!(
        std::fs::symlink_metadata(dir.join("catalog.toml"))
            .unwrap()
            .is_symlink(),
        "the daemon reads the catalog through the kubelet's symlinks"
    );
    (daemon, volume)
}

#[test]
fn a_catalog_swapped_in_by_the_kubelet_is_served_within_seconds_without_sighup() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let (daemon, mut volume) = daemon_on_a_kubelet_catalog(&server, dir.path());
    assert_ok(&daemon.warm("one", &[]), &daemon);
    assert_eq!(daemon.warm("two", &[]).status.code(), Some(2), "not yet");

    let both = [dataset("one", "one/"), dataset("two", "two/")];
    volume.swap_in(&catalog(dir.path(), &server.target, "1GiB", "", &both));
    wait_until("two is in the catalog", Duration::from_secs(10), || {
        daemon.request("GET", "/v1/datasets/two", "").0 == 200
    });
    assert_ok(&daemon.warm("two", &[]), &daemon);
    let log = daemon.log();
    assert!(log.contains("catalog.toml changed"), "{log}");
    assert!(log.contains("catalog reloaded: 2 datasets"), "{log}");
    assert!(log.contains("added=two"), "{log}");
}

#[test]
fn a_broken_catalog_swapped_in_is_refused_and_the_running_one_serves_on() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let (daemon, mut volume) = daemon_on_a_kubelet_catalog(&server, dir.path());

    volume.swap_in("[cache\n");
    wait_until(
        "the broken catalog is refused",
        Duration::from_secs(10),
        || daemon.log().contains("reload refused"),
    );
    assert_ok(&daemon.warm("one", &[]), &daemon);
    assert_eq!(daemon.status("one")["state"], "ready");
    std::thread::sleep(Duration::from_secs(5)); // two polls more
    let log = daemon.log();
    assert!(!log.contains("catalog reloaded"), "{log}");
    assert_eq!(
        log.matches("reload refused").count(),
        1,
        "refused once, not at every poll: {log}"
    );
}

#[test]
fn warm_falls_back_to_a_direct_sync_when_no_daemon_answers() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let data = files(&[("a", content(1, 1000)), ("b/c", content(2, 2000))]);
    server.seed("f/", &data);
    let dest = dir.path().join("dest");
    let socket = format!("unix://{}", dir.path().join("none.sock").display());
    let url = format!("s3://{}/f/", server.target.bucket);
    let mut command = crate::support::hydrator_command(&server.target);
    command
        .args([
            "warm",
            "f",
            "--wait",
            "--daemon",
            &socket,
            "--daemon-wait",
            "0",
            "--progress",
            "none",
        ])
        .args(["--endpoint-url", &server.target.endpoint])
        .arg("--fallback")
        .arg(&url)
        .arg(&dest);
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout(&output).lines().last().unwrap(),
        dest.to_str().unwrap()
    );
    assert_mirror(&dest, &data);

    // Without a fallback, an absent daemon is asked again for --daemon-wait, then it fails.
    let started = std::time::Instant::now();
    let output = crate::support::hydrator_command(&server.target)
        .args([
            "warm",
            "f",
            "--wait",
            "--daemon",
            &socket,
            "--daemon-wait",
            "2",
        ])
        .output()
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no daemon answers"));
}

#[test]
fn a_ready_dataset_is_served_while_the_store_is_down_and_after_a_restart() {
    let server = Server::local();
    let held = dataset_files(40, 3, 100 << 10);
    server.seed("outage/held/", &held);
    let dir = tempfile::tempdir().unwrap();
    let specs = |refresh_seconds| {
        [
            DatasetSpec {
                refresh_seconds,
                ..dataset("held", "outage/held/")
            },
            dataset("never", "outage/never/"),
        ]
    };
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs(1));
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert_ok(&daemon.warm("held", &[]), &daemon);
    let path = daemon.status("held")["path"].as_str().unwrap().to_string();

    // The store goes down; the refresh interval has passed, so the next warm lists again.
    server
        .faults
        .add(Rule::listing(Fault::DropConnection).times(usize::MAX));
    std::thread::sleep(Duration::from_millis(1100));
    let warm = daemon.warm("held", &[]);
    assert_ok(&warm, &daemon);
    assert!(server.faults.served() > 0, "the refresh did try the store");
    let status = daemon.status("held");
    assert_eq!(status["state"], "ready", "{status}");
    assert_eq!(status["stale"], true, "{status}");
    assert_eq!(status["path"], path.as_str());
    assert!(status["last_error"].as_str().is_some(), "{status}");
    assert!(status["refreshed_at"].as_str().is_some(), "{status}");
    assert_mirror(Path::new(&path), &held);

    // Nothing held: the warm fails with the reason, and a second one within the back-off
    // answers at once without trying the store again.
    let absent = daemon.warm("never", &[]);
    assert!(!absent.status.success(), "{}", stdout(&absent));
    let reason = daemon.status("never")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!reason.is_empty());
    let tried = server.faults.served();
    let again = daemon.warm("never", &[]);
    assert!(!again.status.success());
    assert_eq!(server.faults.served(), tried, "backing off, no new listing");
    // Within its back-off too, the held one is served without a listing.
    assert_ok(&daemon.warm("held", &[]), &daemon);
    assert_eq!(server.faults.served(), tried);

    // A restarted daemon serves what it holds before listing anything.
    let (status, _) = daemon.terminate();
    assert!(status.success());
    let text = catalog(dir.path(), &server.target, "1GiB", "", &specs(3600));
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let served = server.faults.served();
    assert_ok(&daemon.warm("held", &[]), &daemon);
    assert_eq!(server.faults.served(), served, "no listing before serving");
    let status = daemon.status("held");
    assert_eq!(status["state"], "ready", "{status}");
    assert_eq!(status["path"], path.as_str());
}

#[test]
fn warm_rides_through_a_daemon_restart_in_the_middle_of_its_wait() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let (big, text) = stalled_dataset(&server, dir.path(), "roll", 5, "1GiB");
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let waiting = daemon
        .warm_command("roll", &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_progress(&daemon, "roll", 17 * MIB as u64);
    let (status, _) = daemon.terminate();
    assert!(status.success());
    // Cut short by the stop, the hydration is no failure a waiting client could be told of.
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap();
    assert!(log.contains("hydration stopped with the daemon"), "{log}");
    assert!(!log.contains("hydration failed"), "{log}");
    // The socket is gone for a while, as during a rollout.
    std::thread::sleep(Duration::from_secs(2));
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let output = waiting.wait_with_output().unwrap();
    assert_ok(&output, &daemon);
    assert_mirror(Path::new(&stdout(&output)), &big);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("asking again"), "{stderr}");
}

#[test]
fn a_permission_error_is_not_a_missing_daemon_and_a_silent_one_cannot_hang_warm() {
    use std::os::unix::process::CommandExt;
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("p", "p/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let dest = dir.path().join("fallback-dest");
    let url = format!("s3://{}/p/", server.target.bucket);
    // Another user, who may not open the daemon's socket.
    let output = crate::support::hydrator_command(&server.target)
        .args(["warm", "p", "--wait", "--daemon"])
        .arg(format!("unix://{}", daemon.socket.display()))
        .arg("--fallback")
        .arg(&url)
        .arg(&dest)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not allowed"), "{stderr}");
    assert!(!dest.exists(), "no direct download on a permission error");

    // A socket that accepts and never answers.
    let silent = dir.path().join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().take(4) {
            open.push(stream);
        }
        std::thread::sleep(Duration::from_secs(30));
    });
    let started = std::time::Instant::now();
    let output = crate::support::hydrator_command(&server.target)
        .args(["warm", "p", "--wait", "--timeout", "3", "--daemon"])
        .arg(format!("unix://{}", silent.display()))
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(output.status.code(), Some(1));
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no answer within"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    drop(held);
}

#[test]
fn a_corrupt_state_file_evicts_nothing_and_over_long_leases_are_capped() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("s/", &files(&[("data.bin", content(8, MIB))]));
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "max_lease_ttl_seconds = 7200",
        &[dataset("s", "s/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert_ok(&daemon.warm("s", &[]), &daemon);
    let path = daemon.status("s")["path"].as_str().unwrap().to_string();
    // A lease for 584 billion years is cut to the catalog's bound.
    let (code, body) = daemon.request(
        "PUT",
        "/v1/datasets/s/leases/forever",
        r#"{"ttl_seconds": 18446744073709551615}"#,
    );
    assert_eq!(code, 200, "{body}");
    let lease: serde_json::Value = serde_json::from_str(&body).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        lease["expires_at"].as_u64().unwrap() <= now + 7200,
        "{body}"
    );
    let (status, _) = daemon.terminate();
    assert!(status.success());

    // state.json is damaged; the restarted daemon has a quota that its snapshot exceeds.
    let state = dir.path().join("cache/.daemon/state.json");
    std::fs::write(&state, b"{\"leases\": [tor").unwrap();
    let text = catalog(
        dir.path(),
        &server.target,
        "1KiB",
        "",
        &[dataset("s", "s/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    std::thread::sleep(Duration::from_secs(3)); // maintenance runs every second
    assert!(
        Path::new(&path).exists(),
        "nothing evicted:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.status("s")["state"], "ready");
    let aside: Vec<_> = std::fs::read_dir(dir.path().join("cache/.daemon"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("state.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "set aside, not overwritten");
    assert!(
        daemon.log().contains("leases are unknown"),
        "{}",
        daemon.log()
    );

    // A state file that is gone while snapshots are on disk is as unknown as a damaged one.
    let (status, _) = daemon.terminate();
    assert!(status.success());
    std::fs::remove_file(&state).unwrap();
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        Path::new(&path).exists(),
        "nothing evicted:\n{}",
        daemon.log()
    );
    assert!(daemon.log().contains("no state file"), "{}", daemon.log());
}

#[test]
fn a_thousand_idle_and_half_sent_connections_are_closed_by_the_header_timeout() {
    use std::io::{Read, Write};
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("h", "h/")],
    )
    .replace("[listen]\n", "[listen]\nheader_timeout_seconds = 1\n");
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    raise_open_file_limit(4096);
    let mut connections: Vec<std::os::unix::net::UnixStream> = (0..1000)
        .map(|i| {
            let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
            if i % 2 == 0 {
                // Half a request, without a token and never finished. The daemon may have
                // closed the connection already: one caller's connections beyond its cap are
                // closed as they are accepted, and that is what the test wants of every one.
                let sent = stream.write_all(b"GET /v1/datasets HTTP/1.1\r\nHost: x\r\n");
                if let Err(err) = sent {
                    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
                    assert!(matches!(err.kind(), BrokenPipe | ConnectionReset), "{err}");
                }
            }
            stream
        })
        .collect();
    for stream in &connections {
        stream.set_nonblocking(true).unwrap();
    }
    let mut buf = [0u8; 64];
    wait_until(
        "every connection is closed",
        Duration::from_secs(30),
        || {
            connections.iter_mut().all(|stream| {
            !matches!(stream.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        },
    );
    let open = std::fs::read_dir(format!("/proc/{}/fd", daemon.child.id()))
        .unwrap()
        .count();
    assert!(open < 200, "the daemon still holds {open} descriptors");
    assert_eq!(daemon.request("GET", "/readyz", "").0, 200);
}

fn raise_open_file_limit(want: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_cur.max(want.min(limit.rlim_max));
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

/// Writes a token file in `dir`; returns its path as TOML-ready text.
fn token_file(dir: &Path, name: &str, secret: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, secret).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    format!("{:?}", path.display().to_string())
}

#[test]
fn a_lease_belongs_to_its_taker_and_only_an_admin_may_take_it_away() {
    const TEAM: &str = "team-a-token-0123456789";
    const OTHER: &str = "team-b-token-0123456789";
    const OPS: &str = "operations-token-0123456789";
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("o/", &files(&[("x", content(21, 1000))]));
    server.seed("p/", &files(&[("y", content(22, 1000))]));
    let tokens = format!(
        "\n[[listen.tokens]]\nname = \"team-a\"\nfile = {}\ndatasets = [\"o\"]\n\
         [[listen.tokens]]\nname = \"team-b\"\nfile = {}\ndatasets = [\"p\"]\n\
         [[listen.tokens]]\nname = \"ops\"\nfile = {}\n",
        token_file(dir.path(), "team-a", TEAM),
        token_file(dir.path(), "team-b", OTHER),
        token_file(dir.path(), "ops", OPS),
    );
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("o", "o/"), dataset("p", "p/")],
    )
    .replace(
        "[listen]\n",
        "[listen]\nadmins = [\"token:ops\"]\nsocket_mode = \"0666\"\n",
    ) + &tokens;
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert_ok(&daemon.warm("o", &["--lease-holder", "pod-1"]), &daemon);
    let me = format!("uid:{}", std::fs::metadata("/proc/self").unwrap().uid());
    // The default token file is written 0644 by the harness, the named ones 0600.
    let log = daemon.log();
    let warned = |file: &str| log.contains(&format!("{file} is readable by every user"));
    assert!(warned(&format!("{}/token", dir.path().display())), "{log}");
    assert!(!warned("team-a"), "{log}");

    // Another identity can neither renew nor release the socket caller's lease.
    let path = "/v1/datasets/o/leases/pod-1";
    for method in ["PUT", "DELETE"] {
        let (code, body) = daemon.tcp_request(method, path, "", TEAM);
        assert_eq!(code, 403, "{method}: {body}");
        assert!(body.contains(&format!("belongs to {me}")), "{body}");
    }
    // A token's own lease is its own; a token limited to other datasets sees none of this one.
    let (code, body) = daemon.tcp_request("PUT", "/v1/datasets/o/leases/job-7", "", TEAM);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"owner\":\"token:team-a\""), "{body}");
    let (code, _) = daemon.tcp_request("DELETE", "/v1/datasets/o/leases/job-7", "", TOKEN);
    assert_eq!(code, 403, "the default token is another identity");
    let (code, body) = daemon.tcp_request("GET", "/v1/datasets/o", "", OTHER);
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"token:team-b may not use dataset \"o\""#),
        "{body}"
    );
    let (_, body) = daemon.tcp_request("GET", "/v1/datasets", "", OTHER);
    assert!(body.contains("\"p\"") && !body.contains("\"o\""), "{body}");
    // The admin may release anyone's lease.
    let (code, body) = daemon.tcp_request("DELETE", "/v1/datasets/o/leases/job-7", "", OPS);
    assert_eq!(code, 204, "{body}");

    // On the socket, another uid is another owner: the same holder name does not make it one.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    if me == "uid:0" {
        let output = std::os::unix::process::CommandExt::uid(
            &mut daemon.warm_command("o", &["--lease-holder", "pod-1"]),
            65534,
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("belongs to uid:0"), "{stderr}");
    } else {
        eprintln!("not root: the other-uid half of this test needs to run as root");
    }
    let (code, _) = daemon.request("DELETE", path, "");
    assert_eq!(code, 204, "the owner releases its own lease");
}

#[test]
fn a_lease_flood_stops_at_the_cap_and_state_is_saved_in_batches() {
    let (daemon, dir, _server) = one_dataset(
        "f",
        &files(&[("x", content(23, 1000))]),
        "max_leases_per_dataset = 50",
    );
    assert_ok(&daemon.warm("f", &[]), &daemon);
    let saves_before = daemon.metric("hydrator_state_saves_total");
    let codes: Vec<u16> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..20)
            .map(|worker| {
                let daemon = &daemon;
                scope.spawn(move || {
                    (0..10)
                        .map(|i| {
                            let path = format!("/v1/datasets/f/leases/pod-{worker}-{i}");
                            daemon.request("PUT", &path, "").0
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let granted = codes.iter().filter(|&&c| c == 200).count();
    let refused = codes.iter().filter(|&&c| c == 429).count();
    // A caller that is not an admin gets three quarters of the cap: 38 of 50.
    assert_eq!((granted, refused), (38, 162), "{codes:?}");
    let saves = daemon.metric("hydrator_state_saves_total") - saves_before;
    eprintln!("{saves} writes of state.json for 38 leases granted and 162 refused");
    assert!(
        (1.0..=19.0).contains(&saves),
        "{saves} state writes for 38 leases"
    );
    let (_, body) = daemon.request("PUT", "/v1/datasets/f/leases/pod-0-0", "");
    assert!(body.contains("pod-0-0"), "a renewal passes the cap: {body}");
    let (status, _) = daemon.terminate();
    assert!(status.success());
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("cache/.daemon/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["leases"].as_array().unwrap().len(), 38);
}

#[test]
fn an_idle_cache_is_measured_once_not_at_every_maintenance_pass() {
    let (daemon, dir, server) = one_dataset("w", &files(&[("x", content(24, MIB))]), "");
    assert_ok(&daemon.warm("w", &[]), &daemon);
    wait_until(
        "a pass measures the new snapshot",
        Duration::from_secs(10),
        || daemon.metric("hydrator_cache_used_bytes") >= MIB as f64,
    );
    let walks = daemon.metric("hydrator_cache_walks_total");
    std::thread::sleep(Duration::from_secs(4)); // four maintenance passes
    assert_eq!(daemon.metric("hydrator_cache_walks_total"), walks);
    // .daemon/ is the daemon's own: what is written there is not counted against the quota.
    let used = daemon.metric("hydrator_cache_used_bytes");
    std::fs::write(dir.path().join("cache/.daemon/junk"), vec![1u8; 4 * MIB]).unwrap();
    server.seed(
        "w/",
        &files(&[("x", content(24, MIB)), ("y", content(25, 1000))]),
    );
    assert_ok(&daemon.warm("w", &[]), &daemon);
    wait_until(
        "the changed dataset is measured again",
        Duration::from_secs(10),
        || daemon.metric("hydrator_cache_walks_total") > walks,
    );
    let after = daemon.metric("hydrator_cache_used_bytes");
    assert!(
        after < used + MIB as f64,
        "{used} -> {after}: .daemon/ is not counted"
    );
}

#[test]
fn the_lease_sidecar_renews_while_it_runs_and_releases_on_sigterm() {
    let (daemon, dir, server) = one_dataset("l", &files(&[("x", content(26, 1000))]), "");
    let path_file = dir.path().join("l.path");
    let path_arg = path_file.to_str().unwrap();
    let warm = daemon.warm(
        "l",
        &[
            "--lease-holder",
            "pod-9",
            "--lease-ttl",
            "3",
            "--path-file",
            path_arg,
        ],
    );
    assert_ok(&warm, &daemon);
    let snapshot = daemon.status("l")["snapshot"].as_str().unwrap().to_string();
    // The source moves on: a new current snapshot must not move the pod's lease.
    server.seed("l/", &files(&[("x", content(27, 1000))]));
    assert_ok(&daemon.warm("l", &[]), &daemon);
    assert_ne!(daemon.status("l")["snapshot"], snapshot.as_str());

    let mut sidecar = crate::support::hydrator_command(&server.target)
        .args(["lease", "l", "--holder", "pod-9", "--ttl", "3"])
        .arg("--daemon")
        .arg(format!("unix://{}", daemon.socket.display()))
        .args(["--path-file", path_arg])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(6)); // twice the TTL
    let (_, body) = daemon.request("GET", "/v1/leases", "");
    let leases: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(leases.len(), 1, "renewed, not expired: {body}");
    assert_eq!(
        leases[0]["snapshot"],
        snapshot.as_str(),
        "the pod's snapshot"
    );
    assert!(Path::new(&stdout(&warm)).exists());

    // SAFETY: signalling our own child process.
    unsafe { libc::kill(sidecar.id() as i32, libc::SIGTERM) };
    let status = sidecar.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut sidecar.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("released l"), "{stderr}");
    assert_eq!(daemon.request("GET", "/v1/leases", "").1.trim(), "[]");
}

#[test]
fn a_lease_or_a_release_that_cannot_be_saved_answers_500_is_not_in_effect_and_the_next_save_recovers(
) {
    let (daemon, dir, _server) = one_dataset("v", &files(&[("x", content(28, 1000))]), "");
    assert_ok(&daemon.warm("v", &[]), &daemon);
    // A directory where the state's temporary file goes makes every save fail.
    let blocker = dir.path().join("cache/.daemon/state.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let (code, body) = daemon.request("PUT", "/v1/datasets/v/leases/pod", "");
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("saving the daemon state failed"), "{body}");
    assert_eq!(
        daemon.request("GET", "/v1/leases", "").1.trim(),
        "[]",
        "the lease that could not be saved is not in effect"
    );
    std::fs::remove_dir(&blocker).unwrap();
    let (code, body) = daemon.request("PUT", "/v1/datasets/v/leases/pod", "");
    assert_eq!(code, 200, "{body}");
    let state = std::fs::read_to_string(dir.path().join("cache/.daemon/state.json")).unwrap();
    assert!(state.contains("\"holder\":\"pod\""), "{state}");

    // A release that cannot be saved is not in effect either: a restart would bring it back.
    std::fs::create_dir(&blocker).unwrap();
    let (code, body) = daemon.request("DELETE", "/v1/datasets/v/leases/pod", "");
    assert_eq!(code, 500, "{body}");
    let (_, held) = daemon.request("GET", "/v1/leases", "");
    assert!(held.contains("\"holder\":\"pod\""), "still held: {held}");
    std::fs::remove_dir(&blocker).unwrap();
    let (code, body) = daemon.request("DELETE", "/v1/datasets/v/leases/pod", "");
    assert_eq!(code, 204, "{body}");
    assert_eq!(daemon.request("GET", "/v1/leases", "").1.trim(), "[]");
}

#[test]
fn the_catalogs_bandwidth_cap_paces_hydrations_and_the_metrics_say_so() {
    let (daemon, _dir, _server) = one_dataset(
        "capped",
        &files(&[("x.bin", content(24, 16 * MIB))]),
        "max_bandwidth = \"8MiB\"",
    );
    assert_eq!(daemon.metric("hydrator_rate_limited_seconds_total"), 0.0);
    let started = std::time::Instant::now();
    assert_ok(&daemon.warm("capped", &[]), &daemon);
    let took = started.elapsed();
    // 16 MiB at 8 MiB/s: at least about 1.5 s after the first burst, never faster.
    assert!(took >= Duration::from_millis(1400), "took {took:?}");
    let waited = daemon.metric("hydrator_rate_limited_seconds_total");
    assert!(waited > 0.5, "rate-limited seconds {waited}");
    eprintln!("16 MiB at 8MiB: {took:?}, {waited:.2} s waited (summed over requests)");
}

/// Opens `count` connections and holds them for a minute, printing `ready` once they are open.
/// `unix:PATH`: each sends a whole header announcing a body that never comes. `tcp:HOST:PORT`
/// (from the address in the third argument): each pipelines GET /metrics and never reads an
/// answer.
const HOLDER: &str = r#"
import socket, sys, time
target, count, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
held = []
for _ in range(count):
    try:
        if target.startswith("unix:"):
            s = socket.socket(socket.AF_UNIX)
            s.connect(target[5:])
            s.sendall(b"POST /v1/datasets/h/warm HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        else:
            host, port = target[4:].rsplit(":", 1)
            s = socket.socket()
            s.bind((source, 0))
            s.connect((host, int(port)))
            s.setblocking(False)
            try:
                s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 3000)
            except BlockingIOError:
                pass
        held.append(s)
    except OSError:
        pass
print("ready", len(held), flush=True)
time.sleep(60)
"#;

/// Runs the holder (as `uid`, through setpriv; over TCP from 127.0.0.2) until it says it holds
/// its connections.
fn hold(target: &str, count: usize, uid: Option<u32>) -> std::process::Child {
    hold_from(target, count, uid, "127.0.0.2")
}

fn hold_from(target: &str, count: usize, uid: Option<u32>, source: &str) -> std::process::Child {
    use std::io::BufRead;
    let mut command = match uid {
        Some(uid) => {
            let mut command = std::process::Command::new("setpriv");
            command.args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                // Debian's: the uid may not reach a per-user Python.
                "/usr/bin/python3",
            ]);
            command
        }
        None => std::process::Command::new("python3"),
    };
    let mut child = command
        .args(["-c", HOLDER, target, &count.to_string(), source])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready"), "{line:?}");
    child
}

/// The answer to `ask` within `limit`, or `None` (a daemon that is held answers no one).
fn within<T: Send + 'static>(
    limit: Duration,
    ask: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tell, told) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tell.send(ask());
    });
    told.recv_timeout(limit).ok()
}

/// A daemon whose socket any uid may reach, with `listen` lines added to `[listen]`.
fn daemon_open_to_all(listen: &str) -> (std::sync::Arc<Daemon>, tempfile::TempDir, Server) {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("h", "h/")],
    )
    .replace(
        "[listen]\n",
        &format!("[listen]\nsocket_mode = \"0666\"\n{listen}\n"),
    );
    let daemon = std::sync::Arc::new(Daemon::start(dir.path(), &server.target, &text));
    raise_open_file_limit(4096);
    // The socket's directory is opened to the other uids.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    (daemon, dir, server)
}

#[test]
fn one_uid_or_one_address_cannot_hold_the_api_with_bodies_that_never_come_or_answers_never_read() {
    let (daemon, _dir, _server) = daemon_open_to_all("header_timeout_seconds = 2");

    // 520 connections of uid 65534, each with a header and a body that never comes.
    let socket = format!("unix:{}", daemon.socket.display());
    let mut holder = hold(&socket, 520, Some(65534));
    let asker = daemon.clone();
    let answer = within(Duration::from_secs(5), move || {
        asker.request("GET", "/v1/datasets", "").0
    });
    assert_eq!(answer, Some(200), "another caller is answered at once");
    let _ = holder.kill();
    let _ = holder.wait();

    // 520 TCP connections from one address, pipelining requests and never reading.
    let tcp = format!("tcp:{}", daemon.tcp_addr());
    let mut holder = hold(&tcp, 520, None);
    let asker = daemon.clone();
    let answer = within(Duration::from_secs(5), move || {
        asker.tcp_request("GET", "/healthz", "", TOKEN).0
    });
    assert_eq!(answer, Some(200), "the probe is answered");
    // The connections that never read are cut off once their answers wait past the timeout.
    let pid = daemon.child.id();
    wait_until(
        "the held connections are closed",
        Duration::from_secs(20),
        || {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .count()
                < 200
        },
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

/// Asks `GET /v1/datasets` on the daemon's socket as `uid` (through setpriv): the status line,
/// or `None` when no answer came within `limit`.
fn ask_as(uid: u32, socket: &Path, limit: Duration) -> Option<String> {
    const ASKER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(float(sys.argv[2]))
try:
    s.connect(sys.argv[1])
    s.sendall(b"GET /v1/datasets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    print(s.recv(64).split(b"\r\n")[0].decode())
except OSError as e:
    print("no answer:", e)
"#;
    let output = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            ASKER,
        ])
        .arg(socket)
        .arg(limit.as_secs_f64().to_string())
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&output.stdout).trim().to_string();
    line.starts_with("HTTP/").then_some(line)
}

#[test]
fn root_on_the_socket_is_a_caller_like_any_other_and_cannot_hold_another_uid_out() {
    let (daemon, _dir, _server) = daemon_open_to_all("header_timeout_seconds = 30");
    // A root container that mounts the socket's hostPath opens more connections than there are
    // places, each with a body that never comes.
    let socket = format!("unix:{}", daemon.socket.display());
    let mut root = hold(&socket, 600, None);
    let asked = std::time::Instant::now();
    let answer = ask_as(65534, &daemon.socket, Duration::from_secs(5));
    assert_eq!(
        answer.as_deref(),
        Some("HTTP/1.1 200 OK"),
        "another uid is answered at once, after {:?}",
        asked.elapsed()
    );
    // Root has its share and no more: its next connection is closed at once.
    let asked = std::time::Instant::now();
    let more = daemon.request_within("GET", "/v1/datasets", Duration::from_secs(5));
    assert_eq!(more, None);
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    let _ = root.kill();
    let _ = root.wait();
}

#[test]
fn when_many_callers_fill_every_connection_an_admin_uid_loopback_and_the_probes_listener_are_still_answered(
) {
    use std::io::{Read, Write};
    let (daemon, _dir, _server) = daemon_open_to_all(
        "header_timeout_seconds = 30\nprobes = \"127.0.0.1:0\"\nadmins = [\"uid:0\"]",
    );
    // Nine callers with their 64 connections each, more than the 512 counted ones, held for
    // the 30 s timeout: on the socket (nine uids) and over TCP (nine addresses).
    let socket = format!("unix:{}", daemon.socket.display());
    let tcp = format!("tcp:{}", daemon.tcp_addr());
    let mut holders: Vec<_> = (0..9)
        .flat_map(|n| {
            [
                hold(&socket, 64, Some(65525 + n)),
                hold_from(&tcp, 64, None, &format!("127.0.0.{}", n + 2)),
            ]
        })
        .collect();
    let asker = daemon.clone();
    let answer = within(Duration::from_secs(5), move || {
        asker.request("GET", "/v1/datasets", "").0
    });
    assert_eq!(
        answer,
        Some(200),
        "an admin uid on the socket finds a reserved place"
    );
    let asker = daemon.clone();
    let answer = within(Duration::from_secs(5), move || {
        asker.tcp_request("GET", "/v1/datasets", "", TOKEN).0
    });
    assert_eq!(answer, Some(200), "loopback TCP finds a reserved place");
    let log = daemon.log();
    let probes = log
        .lines()
        .find_map(|l| l.split("probes and metrics on http://").nth(1))
        .expect("the probes listener is logged")
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    for (path, code) in [
        ("/healthz", 200),
        ("/readyz", 200),
        ("/metrics", 200),
        ("/v1/datasets", 404),
    ] {
        let probes = probes.clone();
        let answer = within(Duration::from_secs(5), move || {
            let mut stream = std::net::TcpStream::connect(probes).unwrap();
            write!(
                stream,
                "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut text = String::new();
            stream.read_to_string(&mut text).unwrap();
            text
        });
        let text = answer.expect("the probes listener answers");
        assert!(
            text.starts_with(&format!("HTTP/1.1 {code}")),
            "{path}: {text}"
        );
    }
    for holder in &mut holders {
        let _ = holder.kill();
        let _ = holder.wait();
    }
}

#[test]
fn no_one_but_root_lists_the_cache_yet_a_snapshot_reads_by_its_path() {
    use std::os::unix::fs::PermissionsExt;
    let expected = files(&[("x.bin", content(41, 1000))]);
    let (daemon, dir, _server) = one_dataset("m", &expected, "");
    assert_ok(&daemon.warm("m", &[]), &daemon);
    let root = dir.path().join("cache");
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o711);
    assert_eq!(mode(&root.join("m")), 0o711);
    assert_eq!(mode(&root.join(".daemon")), 0o700);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |program: &str, path: &Path| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", program])
            .arg(path)
            .output()
            .unwrap()
    };
    assert!(
        !as_nobody("/usr/bin/ls", &root).status.success(),
        "the root is not listed"
    );
    assert!(!as_nobody("/usr/bin/ls", &root.join("m")).status.success());
    let snapshot = PathBuf::from(daemon.status("m")["path"].as_str().unwrap());
    let read = as_nobody("/usr/bin/cat", &snapshot.join("x.bin"));
    assert!(read.status.success(), "{read:?}");
    assert!(read.stdout == expected["x.bin"]);
}

#[test]
fn a_dataset_directory_replaced_by_a_symlink_is_never_written_through() {
    let (daemon, dir, server) = one_dataset("s", &files(&[("a.bin", content(61, 1000))]), "");
    assert_ok(&daemon.warm("s", &[]), &daemon);
    // The dataset's directory becomes a symlink to a directory outside the cache.
    let dataset_dir = dir.path().join("cache/s");
    let outside = dir.path().join("outside");
    std::fs::rename(&dataset_dir, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &dataset_dir).unwrap();
    let before: Vec<_> = std::fs::read_dir(&outside).unwrap().collect();

    server.seed("s/", &files(&[("b.bin", content(62, 1000))]));
    // The held snapshot is served while the new listing is hydrated, which fails.
    assert_ok(&daemon.warm("s", &[]), &daemon);
    wait_until("the refresh fails", Duration::from_secs(10), || {
        daemon.status("s")["last_error"].is_string()
    });
    let error = daemon.status("s")["last_error"].to_string();
    assert!(
        error.contains("cache/s is a symlink or a file, not a directory: refused"),
        "{error}"
    );
    let after: Vec<_> = std::fs::read_dir(&outside).unwrap().collect();
    assert_eq!(
        after.len(),
        before.len(),
        "no snapshot made through the symlink"
    );
}

#[test]
fn a_catalog_shard_hydrates_that_share_only() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let all = dataset_files(7, 12, 100);
    server.seed("half/", &all);
    let spec = DatasetSpec {
        extra: "shard = \"1/2\"",
        ..dataset("half", "half/")
    };
    let text = catalog(dir.path(), &server.target, "1GiB", "", &[spec]);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    let warmed = daemon.warm("half", &[]);
    assert_ok(&warmed, &daemon);
    let path = PathBuf::from(daemon.status("half")["path"].as_str().unwrap());
    let held = read_tree(&path);
    assert!(!held.is_empty() && held.len() < all.len(), "{}", held.len());
    assert!(held.iter().all(|(name, data)| all[name] == *data));
    let ready: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path.join(".hydrator/READY")).unwrap()).unwrap();
    assert_eq!(ready["shard"], "1/2");
    // A pod that asks for that share gets it; one that asks for another is told they disagree.
    assert_ok(&daemon.warm("half", &["--shard", "1/2"]), &daemon);
    let other = daemon.warm("half", &["--shard", "0/2"]);
    let said = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(2), "{said}");
    assert!(
        said.contains("the daemon's half is shard 1/2 of the dataset, not --shard 0/2"),
        "{said}"
    );
}

#[test]
fn a_dataset_whose_last_snapshot_was_evicted_hydrates_at_once_whatever_its_refreshes_failed() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        let files = files(&[("data.bin", content(name.as_bytes()[0] as u64, MIB))]);
        server.seed(&format!("{name}/"), &files);
    }
    let specs = [dataset("a", "a/"), dataset("b", "b/")];
    let text = catalog(dir.path(), &server.target, "1536KiB", "", &specs);
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    assert_ok(&daemon.warm("a", &[]), &daemon);
    // A refresh of a fails (every listing is refused): a is served as it is, and backs off.
    server
        .faults
        .add(Rule::listing(Fault::Status(503, "SlowDown")).times(usize::MAX));
    assert_ok(&daemon.warm("a", &[]), &daemon);
    wait_until("the refresh fails", Duration::from_secs(20), || {
        daemon.status("a")["last_error"].is_string()
    });
    server.faults.clear();
    // b needs the room: a, served no more, is evicted.
    assert_ok(&daemon.warm("b", &[]), &daemon);
    assert_eq!(daemon.status("a")["state"], "absent");
    // Nothing of a is left to serve, so its refreshes' back-off does not hold it back.
    let again = daemon.warm("a", &[]);
    assert_ok(&again, &daemon);
}

#[test]
fn a_server_that_lists_no_versions_is_said_once_per_dataset_and_metrics_name_the_dataset() {
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    server.seed("nv-a/", &files(&[("x.bin", content(30, 100))]));
    server.seed("nv-b/", &files(&[("y.bin", content(31, 200))]));
    // Listed again at every warm: three refreshes of each.
    let text = catalog(
        dir.path(),
        &server.target,
        "1GiB",
        "",
        &[dataset("nv-a", "nv-a/"), dataset("nv-b", "nv-b/")],
    );
    let daemon = Daemon::start(dir.path(), &server.target, &text);
    for _ in 0..3 {
        for name in ["nv-a", "nv-b"] {
            assert_ok(&daemon.warm(name, &[]), &daemon);
        }
    }
    let log = daemon.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("does not list object versions"))
        .collect();
    assert_eq!(said.len(), 2, "once per dataset:\n{log}");
    assert!(said.iter().any(|l| l.contains("nv-a")), "{said:?}");
    assert!(said.iter().any(|l| l.contains("nv-b")), "{said:?}");
    // Each dataset's own series.
    let fetched = |name: &str| {
        daemon.metric(&format!(
            "hydrator_bytes_fetched_total{{dataset=\"{name}\"}}"
        ))
    };
    assert_eq!((fetched("nv-a"), fetched("nv-b")), (100.0, 200.0));
    let complete = daemon.metric("hydrator_hydrations_total{dataset=\"nv-b\",result=\"complete\"}");
    assert_eq!(complete, 3.0);
    assert_eq!(
        daemon.metric("hydrator_datasets{dataset=\"nv-a\",state=\"ready\"}"),
        1.0
    );
}
