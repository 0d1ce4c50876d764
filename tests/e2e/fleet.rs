//! The fleet: 8 simulated nodes on loopback addresses (127.0.1.1–8), each a real `dfdaemon`
//! and a real `hydrator daemon`, the store (the in-process server, counting GETs, HEADs,
//! listings and bytes) and the scheduler stand-in (`support::scheduler`). It runs through
//! `tests/fleet.sh` (`HYDRATOR_FLEET=1`), which installs `dfdaemon` first; in the suite it
//! prints a SKIP line. Its downloads through the peers do not finish yet (README.md, "fleet test").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::faults::Faults;
use crate::support::scheduler::SchedulerDouble;
use crate::support::{content, files, read_tree, Server, MIB};

const NODES: usize = 8;

/// The installed dfdaemon, as `tests/install-dragonfly.sh` leaves it.
fn dfdaemon_bin() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let installed = home.join(".cargo/bin/dfdaemon");
    installed.exists().then_some(installed)
}

/// A few 64 MiB objects and one of 20 MiB for the peers; 50 small ones from the store.
fn fleet_dataset() -> BTreeMap<String, Vec<u8>> {
    let mut all: Vec<(String, Vec<u8>)> = (0..3)
        .map(|n| (format!("shards/{n:03}.tar"), content(400 + n, 64 * MIB)))
        .collect();
    all.push(("shards/tail.tar".into(), content(410, 20 * MIB)));
    all.extend((0..50).map(|n| (format!("meta/{n:02}.json"), content(500 + n, 3000))));
    let refs: Vec<(&str, Vec<u8>)> = all.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    files(&refs)
}

/// One node's dfdaemon, killed when dropped.
struct Peer {
    child: Child,
    socket: PathBuf,
    home: PathBuf,
}

impl Peer {
    fn start(bin: &Path, home: &Path, n: usize, scheduler: std::net::SocketAddr) -> Self {
        let ip = format!("127.0.1.{}", n + 1);
        let socket = home.join("dfdaemon.sock");
        let config = format!(
            "host:\n  hostname: node{n}\n  ip: {ip}\n\
             server:\n  pluginDir: {home}/plugins\n  cacheDir: {home}/cache-dir\n\
             download:\n  server:\n    socketPath: {socket}\n\
             upload:\n  server:\n    ip: {ip}\n\
             storage:\n  dir: {home}/storage\n  keep: true\n  server:\n    ip: {ip}\n\
             health:\n  server:\n    ip: {ip}\n\
             metrics:\n  server:\n    ip: {ip}\n\
             stats:\n  server:\n    ip: {ip}\n\
             proxy:\n  server:\n    ip: {ip}\n",
            home = home.display(),
            socket = socket.display(),
        );
        std::fs::write(home.join("dfdaemon.yaml"), config).unwrap();
        std::fs::write(
            home.join("dynconfig.yaml"),
            format!("scheduler:\n  addrs: [\"{scheduler}\"]\n"),
        )
        .unwrap();
        let log = std::fs::File::create(home.join("dfdaemon.log")).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(home.join("dfdaemon.yaml"))
            .arg("--dynconfig")
            .arg(home.join("dynconfig.yaml"))
            .arg("--log-dir")
            .arg(home.join("logs"))
            .arg("--console")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let peer = Self {
            child,
            socket,
            home: home.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !peer.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "dfdaemon {n} not up:\n{}",
                peer.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        peer
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("dfdaemon.log")).unwrap_or_default()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Copies the nodes' logs to `$HYDRATOR_FLEET_LOGS` when dropped.
struct KeepLogs(PathBuf);

impl Drop for KeepLogs {
    fn drop(&mut self) {
        let Some(keep) = std::env::var_os("HYDRATOR_FLEET_LOGS").map(PathBuf::from) else {
            return;
        };
        for n in 0..NODES {
            let home = self.0.join(format!("node{n}"));
            for log in ["dfdaemon.log", "daemon.log"] {
                let _ = std::fs::create_dir_all(&keep);
                let _ = std::fs::copy(home.join(log), keep.join(format!("node{n}-{log}")));
            }
        }
    }
}

/// What the store served since `before`.
#[derive(Clone, Copy, Debug, Default)]
struct Served {
    bytes: u64,
    gets: u64,
    stats: u64,
    heads: u64,
    lists: u64,
}

impl Served {
    fn now(faults: &Faults) -> Self {
        Self {
            bytes: faults.object_bytes.load(Relaxed),
            gets: faults.object_gets.load(Relaxed),
            stats: faults.stat_gets.load(Relaxed),
            heads: faults.heads.load(Relaxed),
            lists: faults.lists.load(Relaxed),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            bytes: self.bytes - before.bytes,
            gets: self.gets - before.gets,
            stats: self.stats - before.stats,
            heads: self.heads - before.heads,
            lists: self.lists - before.lists,
        }
    }
}

/// Warms `name` on every node at once; each must be ready with exactly `all`.
fn warm_everywhere(nodes: &[Daemon], name: &str, all: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let digests: Vec<String> = std::thread::scope(|scope| {
        let warms: Vec<_> = nodes
            .iter()
            .map(|node| scope.spawn(move || (node.warm(name, &[]), node)))
            .collect();
        warms
            .into_iter()
            .map(|warm| {
                let (output, node) = warm.join().unwrap();
                assert!(
                    output.status.success(),
                    "warm {name}: {}\n{}",
                    String::from_utf8_lossy(&output.stderr),
                    node.log()
                );
                let status = node.status(name);
                let path = PathBuf::from(status["path"].as_str().unwrap());
                assert!(
                    read_tree(&path) == *all,
                    "{name}: files differ from the seal"
                );
                status["snapshot"].as_str().unwrap().to_string()
            })
            .collect()
    });
    digests
}

#[test]
fn eight_nodes_take_a_sealed_dataset_with_the_store_serving_each_large_byte_once() {
    if std::env::var_os("HYDRATOR_FLEET").is_none() {
        eprintln!("SKIP fleet: runs through bash tests/fleet.sh (HYDRATOR_FLEET=1)");
        return;
    }
    let bin = dfdaemon_bin().expect("dfdaemon installed by tests/install-dragonfly.sh");
    let server = Server::local();
    let all = fleet_dataset();
    server.seed("fleet/", &all);
    let dir = tempfile::tempdir().unwrap();
    let sealed = crate::p2p::sealed_snapshot(&server, "fleet/", dir.path());
    let scheduler = SchedulerDouble::start();
    let large: u64 = all
        .values()
        .filter(|v| v.len() >= 16 * MIB)
        .map(|v| v.len() as u64)
        .sum();
    let large_objects = all.values().filter(|v| v.len() >= 16 * MIB).count() as u64;
    let total: u64 = all.values().map(|v| v.len() as u64).sum();

    let mut peers = Vec::new();
    let mut nodes = Vec::new();
    for n in 0..NODES {
        let home = dir.path().join(format!("node{n}"));
        std::fs::create_dir(&home).unwrap();
        let peer = Peer::start(&bin, &home, n, scheduler.addr);
        let extra = format!("p2p = true\nsnapshot = {sealed:?}");
        let specs: Vec<DatasetSpec> = ["fleet", "outage"]
            .iter()
            .map(|name| DatasetSpec {
                extra: &extra,
                ..dataset(name, "fleet/")
            })
            .collect();
        let mut text = catalog(&home, &server.target, "2GiB", "", &specs);
        text += &format!(
            "\n[p2p]\nsocket = {:?}\ntimeout_seconds = 120\n",
            peer.socket
        );
        nodes.push(Daemon::start(&home, &server.target, &text));
        peers.push(peer);
    }

    // HYDRATOR_FLEET_LOGS=DIR keeps every node's logs there when the test ends, pass or fail.
    let _logs = KeepLogs(dir.path().to_path_buf());
    let before = Served::now(&server.faults);
    let digests = warm_everywhere(&nodes, "fleet", &all);
    let served = Served::now(&server.faults).since(before);
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let from_peers: f64 = nodes
        .iter()
        .map(|n| n.metric("hydrator_bytes_from_peers_total"))
        .sum();
    let line = format!(
        "fleet: {NODES} nodes ready; store GET bytes {} of {} ({:.2}×); HEAD {}; LIST {}",
        served.bytes,
        total,
        served.bytes as f64 / total as f64,
        served.heads + served.stats,
        served.lists,
    );
    eprintln!("{line}\n  {served:?}; from peers {from_peers} bytes over all nodes");
    // Why a node went to the store instead: its daemon logs each fallback with the reason.
    let why: Vec<String> = nodes
        .iter()
        .flat_map(|node| node.log().lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|line| line.contains("fetching it from the store"))
        .take(4)
        .collect();
    let peer_errors: Vec<String> = peers[0]
        .log()
        .lines()
        .filter(|line| line.contains("ERROR"))
        .take(12)
        .map(str::to_string)
        .collect();
    let line = format!("{line}\n{}\n{}", why.join("\n"), peer_errors.join("\n"));
    let small = total - large;
    assert!(
        served.bytes <= large + NODES as u64 * small,
        "the store served large objects more than once: {line}"
    );
    assert!(
        served.heads + served.stats <= NODES as u64 * large_objects,
        "{line}"
    );
    assert_eq!(served.lists, 0, "{line}");
    assert_eq!(from_peers, (NODES as u64 * large) as f64, "{line}");
    let (to_source, with_parents) = scheduler.decisions();
    assert_eq!(scheduler.hosts(), NODES);
    assert_eq!(
        to_source, large_objects,
        "one peer of each task reads the store"
    );
    assert!(
        with_parents >= (NODES as u64 - 1) * large_objects,
        "{with_parents}"
    );

    // The scheduler goes down: every node still gets the dataset, from the store directly.
    scheduler.fail(true);
    warm_everywhere(&nodes, "outage", &all);
    for node in &nodes {
        assert!(node.metric("hydrator_peer_fallbacks_total") >= large_objects as f64);
    }
    drop(peers);
}
