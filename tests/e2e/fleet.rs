//! The fleet: 8 simulated nodes on loopback addresses (127.0.B.1–8), each a real `dfdaemon`
//! and a real `hydrator daemon`, the store (the in-process server, counting GETs, HEADs,
//! listings and bytes) and Dragonfly's own scheduler, standalone (`support::dragonfly_scheduler`,
//! built by tests/install-dragonfly-scheduler.sh), or the scheduler stand-in
//! (`support::scheduler`) where that is not installed (a SKIP line says so) or
//! `HYDRATOR_FLEET_SCHEDULER=stand-in`. It runs through `tests/fleet.sh` (`HYDRATOR_FLEET=1`),
//! which installs `dfdaemon` first; in the suite it prints a SKIP line. One run, in phases: the
//! 8 nodes warm one sealed dataset at once (the figures); a ninth node without a dfdaemon warms
//! it beside them; the scheduler goes down (the stand-in refuses every call, the real one is
//! killed and started again after); an object is replaced while the nodes fetch it.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::dragonfly_scheduler::{self, RealScheduler};
use crate::support::faults::{Fault, Faults, Rule};
use crate::support::scheduler::SchedulerDouble;
use crate::support::{content, read_tree, Server, MIB};

const NODES: usize = 8;

/// The installed dfdaemon, as `tests/install-dragonfly.sh` leaves it.
fn dfdaemon_bin() -> Option<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(std::env::var_os("HOME")?).join(".cargo")))?;
    let installed = cargo_home.join("bin/dfdaemon");
    installed.exists().then_some(installed)
}

/// The scheduler the dfdaemons use.
enum Scheduler {
    StandIn(SchedulerDouble),
    /// Dragonfly's, and what the install script built.
    Real(RealScheduler, String),
}

impl Scheduler {
    /// Dragonfly's where it is installed, unless `HYDRATOR_FLEET_SCHEDULER=stand-in`;
    /// `HYDRATOR_FLEET_SCHEDULER=real` requires it.
    fn choose(dir: &Path) -> Self {
        let wanted = std::env::var("HYDRATOR_FLEET_SCHEDULER").unwrap_or_default();
        let installed = dragonfly_scheduler::installed();
        match (wanted.as_str(), installed) {
            ("stand-in", _) => Self::StandIn(SchedulerDouble::start()),
            (_, Some(bin)) => Self::Real(
                RealScheduler::start(&bin, &dir.join("scheduler")),
                dragonfly_scheduler::version(&bin),
            ),
            ("real", None) => panic!(
                "HYDRATOR_FLEET_SCHEDULER=real but the scheduler is not installed \
                 (bash tests/install-dragonfly-scheduler.sh)"
            ),
            (_, None) => {
                eprintln!(
                    "SKIP fleet with Dragonfly's scheduler: not installed \
                     (bash tests/install-dragonfly-scheduler.sh, ~21 min); the stand-in schedules"
                );
                Self::StandIn(SchedulerDouble::start())
            }
        }
    }

    fn addr(&self) -> std::net::SocketAddr {
        match self {
            Self::StandIn(double) => double.addr,
            Self::Real(real, _) => real.addr,
        }
    }

    fn name(&self) -> String {
        match self {
            Self::StandIn(_) => "the stand-in".into(),
            Self::Real(_, version) => format!("Dragonfly's {version}"),
        }
    }

    /// Down (`true`) or up again.
    fn down(&self, down: bool) {
        match (self, down) {
            (Self::StandIn(double), _) => double.fail(down),
            (Self::Real(real, _), true) => real.down(),
            (Self::Real(real, _), false) => real.up(),
        }
    }
}

/// Objects this large go through the peers (the catalog's default `min_object_size`).
const PEER_MIN: usize = 16 * MIB;

/// `large` objects for the peers (`large[n]` MiB each) and `small` ones from the store.
fn dataset_of(seed: u64, large: &[usize], small: usize) -> BTreeMap<String, Vec<u8>> {
    let large = large.iter().zip(0..).map(|(mib, n): (&usize, u64)| {
        (format!("shards/{n:03}.tar"), content(seed + n, mib * MIB))
    });
    let small = (0..small as u64).map(|n| {
        let key = format!("meta/{n:02}.json");
        (key, content(seed + 100 + n, 3000))
    });
    large.chain(small).collect()
}

/// The bytes of the objects large enough for the peers, and how many there are.
fn large_part(all: &BTreeMap<String, Vec<u8>>) -> (u64, u64) {
    let large = all.values().filter(|v| v.len() >= PEER_MIN);
    (
        large.clone().map(|v| v.len() as u64).sum(),
        large.count() as u64,
    )
}

/// The B of the nodes' addresses 127.0.B.N, new for each run: the connections of a run that
/// just ended linger in TIME_WAIT on the dfdaemons' fixed ports, and a dfdaemon does not
/// start on a port that has them ("Address already in use").
fn subnet() -> u32 {
    1 + std::process::id() % 250
}

/// One node's dfdaemon, killed when dropped.
struct Peer {
    child: Child,
    socket: PathBuf,
    home: PathBuf,
}

impl Peer {
    fn start(bin: &Path, home: &Path, n: usize, scheduler: std::net::SocketAddr) -> Self {
        let ip = format!("127.0.{}.{}", subnet(), n + 1);
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

/// Copies the nodes' logs (and the real scheduler's) to `$HYDRATOR_FLEET_LOGS` when dropped.
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
        let scheduler = self.0.join("scheduler/scheduler.log");
        let _ = std::fs::copy(scheduler, keep.join("scheduler.log"));
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

/// `hydrator warm NAME` on every node at once, each with its own name: each one's output.
fn warm_each(warms: &[(&Daemon, &str)]) -> Vec<Output> {
    std::thread::scope(|scope| {
        let warms: Vec<_> = warms
            .iter()
            .map(|&(node, name)| scope.spawn(move || node.warm(name, &[])))
            .collect();
        warms.into_iter().map(|w| w.join().unwrap()).collect()
    })
}

/// `hydrator warm NAME` on every node at once: each one's output.
fn warm_on(nodes: &[&Daemon], name: &str) -> Vec<Output> {
    let warms: Vec<(&Daemon, &str)> = nodes.iter().map(|&node| (node, name)).collect();
    warm_each(&warms)
}

/// Each node ready with exactly `all`: the snapshot digests.
fn ready_everywhere(
    nodes: &[&Daemon],
    outputs: &[Output],
    name: &str,
    all: &BTreeMap<String, Vec<u8>>,
) -> Vec<String> {
    nodes
        .iter()
        .zip(outputs)
        .map(|(node, output)| {
            assert!(
                output.status.success(),
                "warm {name}: {}\n{}",
                String::from_utf8_lossy(&output.stderr),
                node.log()
            );
            let status = node.status(name);
            let path = PathBuf::from(status["path"].as_str().unwrap());
            assert!(path.join(".hydrator/READY").exists());
            assert!(
                read_tree(&path) == *all,
                "{name}: files differ from the seal"
            );
            status["snapshot"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Every large file of `name` on `node` is an inode of hydrator's own, not the dfdaemon's
/// copy: a later write to the dfdaemon's storage cannot change a sealed snapshot.
fn inodes_of_its_own(node: &Daemon, peer: &Peer, name: &str) -> bool {
    let path = PathBuf::from(node.status(name)["path"].as_str().unwrap());
    let stored: Vec<u64> = walk(&peer.home.join("storage"))
        .iter()
        .map(|m| m.ino())
        .collect();
    walk(&path)
        .iter()
        .filter(|m| m.len() >= PEER_MIN as u64)
        .all(|m| !stored.contains(&m.ino()))
}

fn walk(dir: &Path) -> Vec<std::fs::Metadata> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let meta = entry.metadata().unwrap();
        match meta.is_dir() {
            true => found.extend(walk(&entry.path())),
            false => found.push(meta),
        }
    }
    found
}

/// The daemon lines that say why a node went to the store, and the first dfdaemon's errors.
fn why(nodes: &[&Daemon], peer: &Peer) -> String {
    let fallbacks = nodes
        .iter()
        .flat_map(|node| node.log().lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|line| line.contains("fetching it from the store"))
        .take(4);
    let log = peer.log();
    let errors = log
        .lines()
        .filter(|line| line.contains("ERROR"))
        .take(12)
        .map(str::to_string);
    fallbacks.chain(errors).collect::<Vec<_>>().join("\n")
}

fn metric_sum(nodes: &[&Daemon], series: &str) -> f64 {
    nodes.iter().map(|n| n.metric(series)).sum()
}

/// A dataset's prefix in the store, its files and its sealed snapshot.
struct Sealed {
    prefix: &'static str,
    all: BTreeMap<String, Vec<u8>>,
    lock: PathBuf,
}

impl Sealed {
    fn seed(
        server: &Server,
        dir: &Path,
        prefix: &'static str,
        all: BTreeMap<String, Vec<u8>>,
    ) -> Self {
        server.seed(prefix, &all);
        let home = dir.join(prefix.trim_end_matches('/'));
        std::fs::create_dir(&home).unwrap();
        let lock = crate::p2p::sealed_snapshot(server, prefix, &home);
        Self { prefix, all, lock }
    }

    fn spec<'a>(&'a self, name: &'a str, extra: &'a str) -> DatasetSpec<'a> {
        DatasetSpec {
            extra,
            ..dataset(name, self.prefix)
        }
    }

    fn extra(&self) -> String {
        format!("p2p = true\nsnapshot = {:?}", self.lock)
    }
}

/// The per-node budget for what comes from the store directly (`[cache] max_bandwidth`).
const DIRECT_BUDGET: &str = "max_bandwidth = \"256MiB\"";

/// A node's catalog: `fleet` (and `again`, the same data under another name), `outage` and
/// `replaced`, all through the peers at `socket`.
fn node_catalog(home: &Path, server: &Server, socket: &Path, sets: &[(&str, &Sealed)]) -> String {
    let extras: Vec<String> = sets.iter().map(|(_, sealed)| sealed.extra()).collect();
    let specs: Vec<DatasetSpec> = sets
        .iter()
        .zip(&extras)
        .map(|((name, sealed), extra)| sealed.spec(name, extra))
        .collect();
    let mut text = catalog(home, &server.target, "2GiB", DIRECT_BUDGET, &specs);
    text += &format!("\n[p2p]\nsocket = {socket:?}\ntimeout_seconds = 120\n");
    text
}

#[test]
fn eight_nodes_take_a_sealed_dataset_with_the_store_serving_each_large_byte_once() {
    if std::env::var_os("HYDRATOR_FLEET").is_none() {
        eprintln!("SKIP fleet: runs through bash tests/fleet.sh (HYDRATOR_FLEET=1)");
        return;
    }
    let bin = dfdaemon_bin().expect("dfdaemon installed by tests/install-dragonfly.sh");
    let server = Server::local();
    // The prefix lets tests/fleet.sh find the dfdaemons of a run that was killed.
    let dir = tempfile::Builder::new()
        .prefix("hydrator-fleet-")
        .tempdir()
        .unwrap();
    let fleet = Sealed::seed(
        &server,
        dir.path(),
        "fleet/",
        dataset_of(400, &[64, 64, 64, 20], 50),
    );
    let outage = Sealed::seed(&server, dir.path(), "outage/", dataset_of(600, &[20], 5));
    let replaced = Sealed::seed(&server, dir.path(), "replaced/", dataset_of(700, &[64], 5));
    let sets = [
        ("fleet", &fleet),
        ("again", &fleet),
        ("outage", &outage),
        ("replaced", &replaced),
    ];
    let scheduler = Scheduler::choose(dir.path());

    let mut peers = Vec::new();
    let mut nodes = Vec::new();
    for n in 0..NODES {
        let home = dir.path().join(format!("node{n}"));
        std::fs::create_dir(&home).unwrap();
        let peer = Peer::start(&bin, &home, n, scheduler.addr());
        let text = node_catalog(&home, &server, &peer.socket, &sets);
        nodes.push(Daemon::start(&home, &server.target, &text));
        peers.push(peer);
    }
    // A ninth node whose dfdaemon is not there.
    let lone_home = dir.path().join(format!("node{NODES}"));
    std::fs::create_dir(&lone_home).unwrap();
    let absent = lone_home.join("no-dfdaemon.sock");
    let lone = Daemon::start(
        &lone_home,
        &server.target,
        &node_catalog(&lone_home, &server, &absent, &sets),
    );
    let fleet_nodes: Vec<&Daemon> = nodes.iter().collect();
    // HYDRATOR_FLEET_LOGS=DIR keeps every node's logs there when the test ends, pass or fail.
    let _logs = KeepLogs(dir.path().to_path_buf());

    // 1. The 8 nodes warm `fleet` at once: its large objects leave the store once.
    let (large, large_objects) = large_part(&fleet.all);
    let total: u64 = fleet.all.values().map(|v| v.len() as u64).sum();
    let before = Served::now(&server.faults);
    let started = Instant::now();
    let outputs = warm_on(&fleet_nodes, "fleet");
    let took = started.elapsed();
    let served = Served::now(&server.faults).since(before);
    let digests = ready_everywhere(&fleet_nodes, &outputs, "fleet", &fleet.all);
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let line = format!(
        "fleet: {NODES} nodes ready; store GET bytes {} of {} ({:.2}×); HEAD {}; LIST {}; scheduler {}",
        served.bytes,
        total,
        served.bytes as f64 / total as f64,
        served.heads + served.stats,
        served.lists,
        scheduler.name(),
    );
    // Printed now too: the figures stand even if a later check fails.
    eprintln!("{line}");
    let from_peers = metric_sum(&fleet_nodes, "hydrator_bytes_from_peers_total");
    let context = format!(
        "{line}\n  {served:?}; from peers {from_peers} bytes over all nodes in {took:.1?}\n{}",
        why(&fleet_nodes, &peers[0])
    );
    let small = total - large;
    // Each dfdaemon's stat of a task is a GET of one byte.
    assert!(
        served.bytes <= large + NODES as u64 * small + served.stats,
        "the store served large objects more than once: {context}"
    );
    assert!(
        served.heads + served.stats <= NODES as u64 * large_objects,
        "{context}"
    );
    assert_eq!(served.lists, 0, "{context}");
    assert_eq!(from_peers, (NODES as u64 * large) as f64, "{context}");
    // The stand-in counts what it decided; Dragonfly's scheduler is seen by the store only.
    if let Scheduler::StandIn(double) = &scheduler {
        let (to_source, with_parents) = double.decisions();
        assert_eq!(double.hosts(), NODES);
        assert_eq!(
            to_source, large_objects,
            "one peer of each task reads the store"
        );
        assert!(
            with_parents >= (NODES as u64 - 1) * large_objects,
            "{with_parents}"
        );
    }
    for (node, peer) in nodes.iter().zip(&peers) {
        assert!(
            inodes_of_its_own(node, peer, "fleet"),
            "a file shared with the dfdaemon's storage on {}",
            node.dir.display()
        );
    }

    // 2. A node without a dfdaemon takes the same data from the store, while the 8 take it
    // again (as `again`) from their dfdaemons, unaffected.
    let before = Served::now(&server.faults);
    let mut warms: Vec<(&Daemon, &str)> = fleet_nodes.iter().map(|&n| (n, "again")).collect();
    warms.push((&lone, "fleet"));
    let outputs = warm_each(&warms);
    let served = Served::now(&server.faults).since(before);
    ready_everywhere(&fleet_nodes, &outputs[..NODES], "again", &fleet.all);
    let lone_digest = ready_everywhere(&[&lone], &outputs[NODES..], "fleet", &fleet.all);
    assert_eq!(lone_digest[0], digests[0]);
    assert_eq!(
        lone.metric("hydrator_peer_fallbacks_total"),
        large_objects as f64
    );
    assert_eq!(lone.metric("hydrator_bytes_from_peers_total"), 0.0);
    assert_eq!(
        metric_sum(&fleet_nodes, "hydrator_peer_fallbacks_total"),
        0.0
    );
    assert_eq!(
        metric_sum(&fleet_nodes, "hydrator_bytes_from_peers_total"),
        (2 * NODES as u64 * large) as f64
    );
    assert_eq!(served.bytes, total + NODES as u64 * small, "{served:?}");

    // 3. The scheduler goes down: every node still gets `outage`, from the store directly,
    // under its budget.
    scheduler.down(true);
    let outputs = warm_on(&fleet_nodes, "outage");
    ready_everywhere(&fleet_nodes, &outputs, "outage", &outage.all);
    let (_, outage_objects) = large_part(&outage.all);
    assert_eq!(
        metric_sum(&fleet_nodes, "hydrator_peer_fallbacks_total"),
        (NODES as u64 * outage_objects) as f64,
        "{}",
        why(&fleet_nodes, &peers[0])
    );
    scheduler.down(false);

    // 4. `replaced`'s large object is overwritten in the store at its third ranged GET (a
    // dfdaemon's stat or a piece): a node is ready only with the sealed bytes (those that got
    // them before the replacement, from the store or a peer); any other fails naming the
    // object. Which nodes got them first is a race, so both outcomes are allowed.
    let key = format!("{}shards/000.tar", replaced.prefix);
    let fired = server.faults.served();
    server
        .faults
        .add(Rule::get(&key, Fault::ReplaceObject(content(799, 64 * MIB))).skip(2));
    let outputs = warm_on(&fleet_nodes, "replaced");
    assert_eq!(
        server.faults.served(),
        fired + 1,
        "the object was not replaced"
    );
    let mut failed = 0;
    for (node, output) in fleet_nodes.iter().zip(&outputs) {
        if node.status("replaced")["state"] == "ready" {
            let output = std::slice::from_ref(output);
            ready_everywhere(&[node], output, "replaced", &replaced.all);
            continue;
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        failed += 1;
        assert!(!output.status.success(), "{stderr}");
        assert!(stderr.contains("shards/000.tar"), "{stderr}");
    }
    eprintln!("replaced mid-fetch: {failed} of {NODES} nodes failed, the others ready as sealed");
    eprintln!("{context}");
    drop(peers);
}

/// Dragonfly's scheduler as the fleet test runs it: standalone (it writes its local dynconfig
/// file), serving by its gRPC health check (which a dfdaemon asks before it uses a scheduler),
/// refusing connections once killed, and serving again once started again.
#[test]
fn dragonfly_scheduler_runs_standalone_and_serves_again_after_a_kill() {
    let Some(bin) = dragonfly_scheduler::installed() else {
        eprintln!(
            "SKIP Dragonfly's scheduler: not installed \
             (bash tests/install-dragonfly-scheduler.sh, ~21 min)"
        );
        return;
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let dir = tempfile::tempdir().unwrap();
    let scheduler = RealScheduler::start(&bin, &dir.path().join("scheduler"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = format!("http://{}", scheduler.addr);
    let serving = || {
        runtime.block_on(async {
            let endpoint = tonic::transport::Endpoint::from_shared(url.clone()).unwrap();
            let mut client = HealthClient::new(endpoint.connect().await.ok()?);
            let request = HealthCheckRequest {
                service: String::new(),
            };
            let answer = client.check(request).await.ok()?.into_inner();
            Some(answer.status == ServingStatus::Serving as i32)
        })
    };
    assert_eq!(serving(), Some(true), "{}", scheduler.log());
    assert!(dir.path().join("scheduler/dynconfig.yaml").exists());
    scheduler.down();
    assert_eq!(serving(), None, "killed, it takes no connection");
    scheduler.up();
    assert_eq!(serving(), Some(true), "{}", scheduler.log());
}
