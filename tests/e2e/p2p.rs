//! The peer path of the node daemon (`[p2p]`, `p2p = true`): the real binary against the
//! in-process S3 server, with the dfdaemon stand-in (`support::dfdaemon`) on its socket.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::dfdaemon::{Dfdaemon, Mode};
use crate::support::{content, files, read_tree, Server, MIB};

/// Two objects for the peers (≥ 16 MiB), one just under, and small ones.
fn fleet_files() -> BTreeMap<String, Vec<u8>> {
    files(&[
        ("shards/000.tar", content(300, 20 * MIB + 17)),
        ("shards/001.tar", content(301, 17 * MIB)),
        ("meta/index.bin", content(302, 16 * MIB - 1)),
        ("meta/labels.txt", content(303, 1000)),
        ("README", content(304, 10)),
    ])
}

const PEER_BYTES: usize = 20 * MIB + 17 + 17 * MIB;

/// The store seeded with [`fleet_files`] under `fleet/`, and its sealed snapshot in `dir`.
struct Fleet {
    server: Server,
    all: BTreeMap<String, Vec<u8>>,
    dir: tempfile::TempDir,
    sealed: PathBuf,
}

impl Fleet {
    fn seeded() -> Self {
        let server = Server::local();
        let all = fleet_files();
        server.seed("fleet/", &all);
        let dir = tempfile::tempdir().unwrap();
        let sealed = sealed_snapshot(&server, "fleet/", dir.path());
        Self {
            server,
            all,
            dir,
            sealed,
        }
    }
}

/// A sealed snapshot of `prefix`: listed, synced once, sealed from that sync.
pub fn sealed_snapshot(server: &Server, prefix: &str, dir: &Path) -> PathBuf {
    let (lock, sealed) = (dir.join("listed.lock"), dir.join("sealed.lock"));
    server.snapshot(prefix, &lock);
    let sealer = dir.join("sealer");
    let run = |args: &[&OsStr]| {
        let output = server.hydrator(args);
        assert!(output.status.success(), "{output:?}");
    };
    run(&[
        "sync".as_ref(),
        "--snapshot".as_ref(),
        lock.as_os_str(),
        sealer.as_os_str(),
        "--progress".as_ref(),
        "none".as_ref(),
    ]);
    let url = format!("s3://{}/{prefix}", server.target.bucket);
    run(&[
        "snapshot".as_ref(),
        url.as_ref(),
        "--from".as_ref(),
        lock.as_os_str(),
        "--seal".as_ref(),
        sealer.as_os_str(),
        "-o".as_ref(),
        sealed.as_os_str(),
    ]);
    sealed
}

/// A daemon in `dir` whose datasets `names` are `prefix` through the peers at `socket`.
fn node(server: &Server, dir: &Path, socket: &Path, sealed: &Path, names: &[&str]) -> Daemon {
    let extra = format!("p2p = true\nsnapshot = {sealed:?}");
    let specs: Vec<DatasetSpec> = names
        .iter()
        .map(|name| DatasetSpec {
            extra: &extra,
            ..dataset(name, "fleet/")
        })
        .collect();
    let mut text = catalog(dir, &server.target, "1GiB", "", &specs);
    text += &format!("\n[p2p]\nsocket = {socket:?}\n");
    Daemon::start(dir, &server.target, &text)
}

fn ready(daemon: &Daemon, name: &str) -> BTreeMap<String, Vec<u8>> {
    let warmed = daemon.warm(name, &[]);
    assert!(
        warmed.status.success(),
        "warm {name}: {}\n{}",
        String::from_utf8_lossy(&warmed.stderr),
        daemon.log()
    );
    let path = PathBuf::from(daemon.status(name)["path"].as_str().unwrap());
    assert!(path.join(".hydrator/READY").exists());
    read_tree(&path)
}

#[test]
fn two_nodes_take_the_large_objects_from_peers_and_the_store_serves_them_once() {
    let Fleet {
        server,
        all,
        dir,
        sealed,
    } = Fleet::seeded();
    let dfdaemon = Dfdaemon::start(dir.path());
    let nodes: Vec<Daemon> = (0..2)
        .map(|n| {
            let home = dir.path().join(format!("node{n}"));
            std::fs::create_dir(&home).unwrap();
            node(&server, &home, &dfdaemon.socket, &sealed, &["fleet"])
        })
        .collect();

    let served_before = server.faults.object_bytes.load(Relaxed);
    for node in &nodes {
        assert_eq!(ready(node, "fleet"), all);
        assert_eq!(
            node.metric("hydrator_bytes_from_peers_total"),
            PEER_BYTES as f64
        );
        assert_eq!(node.metric("hydrator_peer_fallbacks_total"), 0.0);
    }
    // The large objects left the store once (the first node's task); the rest once per node.
    let direct: usize = all.values().map(Vec::len).sum::<usize>() - PEER_BYTES;
    let served = server.faults.object_bytes.load(Relaxed) - served_before;
    assert_eq!(served as usize, PEER_BYTES + 2 * direct);

    // The dfdaemon hard-linked its storage's files to the outputs; each node published files
    // of its own, which a later write to the dfdaemon's copy leaves as sealed.
    let stored: Vec<PathBuf> = std::fs::read_dir(&dfdaemon.storage)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(stored.len(), 2, "{stored:?}");
    let stored_inodes: Vec<u64> = stored
        .iter()
        .map(|path| std::fs::metadata(path).unwrap().ino())
        .collect();
    for path in &stored {
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(b"written by the dfdaemon later", 0)
            .unwrap();
    }
    for node in &nodes {
        let snapshot = PathBuf::from(node.status("fleet")["path"].as_str().unwrap());
        assert!(
            read_tree(&snapshot) == all,
            "changed by the dfdaemon's write"
        );
        for key in ["shards/000.tar", "shards/001.tar"] {
            let published = std::fs::metadata(snapshot.join(key)).unwrap();
            assert_eq!(published.nlink(), 1, "{key}");
            assert!(!stored_inodes.contains(&published.ino()), "{key}");
        }
    }

    let requests = dfdaemon.requests();
    assert_eq!(requests.len(), 4, "two objects per node");
    let secret = &server.target.secret_key;
    for request in &requests {
        assert!(request.url.contains("X-Amz-Signature="), "{}", request.url);
        assert!(request.url.contains("/fleet/shards/00"), "{}", request.url);
        let headers = format!("{:?}", request.request_header);
        assert!(!request.url.contains(secret.as_str()) && !headers.contains(secret.as_str()));
        assert!(request.request_header.contains_key("if-match"), "{headers}");
        assert!(request.tag.as_deref().is_some_and(|tag| tag.contains('"')));
        assert_eq!(request.application.as_deref(), Some("hydrator"));
        assert!(request.disable_back_to_source);
        let output = request.output_path.as_deref().unwrap();
        assert!(output.contains("/.hydrator/peers/"), "{output}");
    }
}

#[test]
fn bytes_from_peers_that_are_not_as_sealed_are_never_published_and_come_from_the_store() {
    let Fleet {
        server,
        all,
        dir,
        sealed,
    } = Fleet::seeded();
    let dfdaemon = Dfdaemon::start(dir.path());
    let home = dir.path().join("node");
    std::fs::create_dir(&home).unwrap();
    let names = ["corrupt", "short", "failing"];
    let daemon = node(&server, &home, &dfdaemon.socket, &sealed, &names);
    let mut fallbacks = 0.0;
    for (name, mode) in names.iter().zip([Mode::Corrupt, Mode::Short, Mode::Fail]) {
        dfdaemon.set_mode(mode);
        let served_before = server.faults.object_bytes.load(Relaxed);
        assert_eq!(ready(&daemon, name), all, "{mode:?}");
        // Both large objects were fetched again from the store.
        let served = server.faults.object_bytes.load(Relaxed) - served_before;
        assert!(served as usize >= PEER_BYTES, "{mode:?}: {served}");
        fallbacks += 2.0;
        assert_eq!(daemon.metric("hydrator_peer_fallbacks_total"), fallbacks);
        // Nothing of what the peers delivered is left in the snapshot's staging directory.
        let snapshot = PathBuf::from(daemon.status(name)["path"].as_str().unwrap());
        let leftovers: Vec<_> = std::fs::read_dir(snapshot.join(".hydrator/peers"))
            .unwrap()
            .flatten()
            .map(|entry| entry.path())
            .collect();
        assert!(leftovers.is_empty(), "{mode:?}: {leftovers:?}");
    }
    let log = daemon.log();
    assert!(log.contains("not the sealed"), "{log}");
    assert!(
        log.contains("delivered 17825791 bytes of 17825792"),
        "{log}"
    );
    assert!(log.contains("the scheduler cannot be reached"), "{log}");
    assert_eq!(daemon.metric("hydrator_bytes_from_peers_total"), 0.0);
}

#[test]
fn a_node_without_a_dfdaemon_hydrates_from_the_store() {
    let Fleet {
        server,
        all,
        dir,
        sealed,
    } = Fleet::seeded();
    let absent = dir.path().join("no-dfdaemon.sock");
    let daemon = node(&server, dir.path(), &absent, &sealed, &["fleet"]);
    assert_eq!(ready(&daemon, "fleet"), all);
    assert_eq!(daemon.metric("hydrator_peer_fallbacks_total"), 2.0);
    assert!(
        daemon.log().contains("no-dfdaemon.sock"),
        "{}",
        daemon.log()
    );
}

#[test]
fn a_fifo_from_the_dfdaemon_is_refused_the_objects_come_from_the_store_and_sigterm_ends_the_daemon()
{
    let Fleet {
        server,
        all,
        dir,
        sealed,
    } = Fleet::seeded();
    let dfdaemon = Dfdaemon::start(dir.path());
    dfdaemon.set_mode(Mode::Fifo);
    let home = dir.path().join("node");
    std::fs::create_dir(&home).unwrap();
    let daemon = node(&server, &home, &dfdaemon.socket, &sealed, &["fleet"]);
    // Opening a FIFO plainly waits for a writer that never comes, and the thread stuck there
    // keeps the daemon from exiting after SIGTERM: both bounded here, so that such a hang
    // fails the test instead of hanging it.
    let warmed = daemon.warm("fleet", &["--timeout", "30"]);
    let ready = warmed.status.success().then(|| {
        let snapshot = PathBuf::from(daemon.status("fleet")["path"].as_str().unwrap());
        let fallbacks = daemon.metric("hydrator_peer_fallbacks_total");
        let from_peers = daemon.metric("hydrator_bytes_from_peers_total");
        (snapshot, fallbacks, from_peers)
    });
    let log_path = daemon.dir.join("daemon.log");
    let (status, took) = terminate_within(daemon, Duration::from_secs(30));
    assert!(
        status.success() && took < Duration::from_secs(10),
        "{status} after {took:?}"
    );
    let log = std::fs::read_to_string(log_path).unwrap();
    let Some((snapshot, fallbacks, from_peers)) = ready else {
        panic!("warm: {}\n{log}", String::from_utf8_lossy(&warmed.stderr));
    };
    assert!(read_tree(&snapshot) == all, "files differ from the seal");
    assert_eq!((fallbacks, from_peers), (2.0, 0.0));
    assert!(
        log.contains("the peers delivered a FIFO, not a regular file"),
        "{log}"
    );
    let leftovers = std::fs::read_dir(snapshot.join(".hydrator/peers"))
        .unwrap()
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn sigterm_ends_the_daemon_within_its_grace_while_the_dfdaemon_never_answers() {
    let Fleet {
        server,
        dir,
        sealed,
        ..
    } = Fleet::seeded();
    let dfdaemon = Dfdaemon::start(dir.path());
    dfdaemon.set_mode(Mode::Hang);
    let home = dir.path().join("node");
    std::fs::create_dir(&home).unwrap();
    let daemon = node(&server, &home, &dfdaemon.socket, &sealed, &["fleet"]);
    let (code, body) = daemon.request("POST", "/v1/datasets/fleet/warm", "");
    assert_eq!(code, 202, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while dfdaemon.requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no download asked:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, took) = terminate_within(daemon, Duration::from_secs(30));
    assert!(
        status.success() && took < Duration::from_secs(10),
        "{status} after {took:?}"
    );
}

/// SIGTERM, then the exit status and how long the daemon took to go; a daemon still running
/// after `limit` is killed and fails the test.
fn terminate_within(mut daemon: Daemon, limit: Duration) -> (ExitStatus, Duration) {
    let started = Instant::now();
    daemon.signal(libc::SIGTERM);
    loop {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            return (status, started.elapsed());
        }
        if started.elapsed() > limit {
            daemon.kill();
            panic!("still running {limit:?} after SIGTERM:\n{}", daemon.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
