//! The soak: the real daemon and CSI plugin through a busy node's day, squeezed into minutes
//! (`HYDRATOR_SOAK_SECONDS`, default 120, so it runs in every CI run; `tests/soak/run.sh` runs
//! the long one). `HYDRATOR_SOAK_SEED` picks another course of events; the report prints it.
//!
//! How it is built:
//! - The in-process S3 server holds five small datasets. Every file's first line names its key
//!   and generation and seeds the rest, so any file a pod reads is checked to be exactly one
//!   complete version. Two datasets admit one namespace each; the pods of the other
//!   namespaces must be refused (`PERMISSION_DENIED`) every time and never get a mount.
//! - The real `hydrator daemon` (listings current for 3 s; a quota that holds the current
//!   snapshots and a few superseded ones, so refreshes keep evicting what no pod has mounted)
//!   and the real `hydrator csi`, driven over gRPC as the kubelet drives it.
//! - 200 pods, a thread each, in a loop: pick a dataset, publish a new volume (retrying what
//!   the kubelet retries), read and check every file, hold it a while, read it again (nothing
//!   may change or go under a reader), unpublish (retrying until it succeeds). Every call is
//!   timed; none may outlast the kubelet's two minutes.
//! - A refresher changes, adds and deletes objects every few seconds: new snapshots appear and
//!   old ones become evictable.
//! - Chaos: store outages (connections dropped, bodies stalled, 5xx) for a few seconds, and a
//!   kill -9 of the daemon or of the plugin, in turn, every 15–30 s, each started again after
//!   0.5–3 s. After a daemon kill its state file must parse and hold exactly the leases it
//!   must.
//! - A checker compares the daemon's leases with what the pods have mounted: a volume that
//!   stays mounted holds a lease on the snapshot its mount shows; a volume unpublished (or
//!   refused) never holds one again. Each pod's phase has a generation, read before and after
//!   the leases, so a volume that changed phase meanwhile is not judged.
//! - A sampler reads both processes' RSS and open fds every second, and notices one that exits
//!   by itself.
//! - At the end the chaos stops and the pods finish their volumes (a publish still failing
//!   20 s later is given up and unpublished, as for a deleted pod); then no mount, lease or
//!   volume record may be left, nor fds piling up.
//!
//! A broken invariant is recorded with its context and stops the soak; the report is printed
//! either way, and the test fails with every failure and the processes' log tails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use tonic::{Code, Status};

use crate::support::csi::{mounted_snapshot, mounts_under, volume, Csi, Volume, CALL_BUDGET};
use crate::support::daemon::{catalog, dataset, Daemon, DatasetSpec};
use crate::support::faults::{Fault, Rule};
use crate::support::{content, mounts_on, Server};

const PODS: usize = 200;
/// What a pod of each namespace may mount: the datasets without a rule of their own fall back
/// on `[access]`, which admits all three.
const NAMESPACES: [&str; 3] = ["team-a", "team-b", "default"];
/// Holds the five datasets' current snapshots (about 1.2 MiB) and a few superseded ones: every
/// refresh evicts what no pod has mounted any more, least recently used first.
const QUOTA: &str = "2MiB";
/// Once the chaos stops: how long a publish may go on failing before its pod is deleted (the
/// kubelet then unpublishes what it may have half-published), and how long an unpublish may.
const GIVE_UP: Duration = Duration::from_secs(20);
const DRAIN: Duration = Duration::from_secs(60);
/// The longest a publish may wait: the daemon's longest back-off before it tries a failed
/// hydration again (5 minutes), and a minute.
const LONGEST_WAIT: Duration = Duration::from_secs(360);
/// Open fds a process may hold at the end beyond its first sample.
const FD_SLACK: usize = 16;
const RSS_LIMIT_MIB: u64 = 300;

struct DatasetDef {
    name: &'static str,
    /// How often pods pick it, of 100.
    weight: u32,
    /// Objects it starts with.
    objects: usize,
    /// The one namespace its rule admits (`None`: `[access]`, every namespace).
    namespace: Option<&'static str>,
}

const DATASETS: [DatasetDef; 5] = [
    dataset_def("ds0", 40, 5, None),
    dataset_def("ds1", 20, 6, Some("team-a")),
    dataset_def("ds2", 15, 7, None),
    dataset_def("ds3", 15, 8, Some("team-b")),
    dataset_def("ds4", 10, 9, None),
];

const fn dataset_def(
    name: &'static str,
    weight: u32,
    objects: usize,
    namespace: Option<&'static str>,
) -> DatasetDef {
    DatasetDef {
        name,
        weight,
        objects,
        namespace,
    }
}

#[test]
fn the_daemon_and_plugin_keep_every_invariant_under_pods_refreshes_evictions_outages_and_crashes() {
    let seconds: u64 = env_number("HYDRATOR_SOAK_SECONDS", 120);
    let seed = env_number("HYDRATOR_SOAK_SEED", 0x5eed);
    let started = Instant::now();
    let server = Server::local();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::seeded(&server);
    let daemon = Daemon::start(
        dir.path(),
        &server.target,
        &soak_catalog(dir.path(), &server),
    );
    let csi = Csi::start(dir.path(), &daemon);
    let soak = Soak::new(dir.path(), &server, csi, daemon, seed);
    soak.run(Duration::from_secs(seconds), store);
    eprintln!("{}", soak.report(seconds, started.elapsed()));
    soak.assert_all_well(seconds);
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => {
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{name}={text}: {e}"))
        }
        Err(_) => default,
    }
}

/// The catalog: every dataset relisted after 3 s, two of them with a rule of their own, and
/// the plugin (root) an admin that holds leases until released.
fn soak_catalog(dir: &Path, server: &Server) -> String {
    let rules: Vec<String> = DATASETS
        .iter()
        .map(|d| match d.namespace {
            Some(namespace) => format!("namespaces = [{namespace:?}]"),
            None => String::new(),
        })
        .collect();
    let prefixes: Vec<String> = DATASETS.iter().map(|d| prefix(d.name)).collect();
    let specs: Vec<DatasetSpec> = (DATASETS.iter().zip(&prefixes).zip(&rules))
        .map(|((d, prefix), rule)| DatasetSpec {
            refresh_seconds: 3,
            extra: rule,
            ..dataset(d.name, prefix)
        })
        .collect();
    let access = format!("[access]\nnamespaces = {NAMESPACES:?}\n\n");
    catalog(dir, &server.target, QUOTA, "", &specs).replace(
        "[listen]\n",
        &format!("{access}[listen]\nadmins = [\"uid:0\"]\n"),
    )
}

fn prefix(dataset: &str) -> String {
    format!("{dataset}/")
}

/// One version of an object: a first line naming it, then bytes that line seeds; 4–64 KiB.
fn object(dataset: &str, key: &str, generation: u64) -> Vec<u8> {
    let head = format!("{dataset}/{key} generation {generation}\n");
    let hash = blake3::hash(head.as_bytes());
    let seed = u64::from_le_bytes(hash.as_bytes()[..8].try_into().unwrap());
    let len = (4 << 10) + (seed % (60 << 10)) as usize;
    let mut data = head.into_bytes();
    data.extend(content(seed, len - data.len()));
    data
}

/// Checks that `data`, read at `key` of `dataset`, is one complete version of that object.
fn check_object(dataset: &str, key: &str, data: &[u8]) -> Result<(), String> {
    let line = data.split(|b| *b == b'\n').next().unwrap_or_default();
    let generation = std::str::from_utf8(line)
        .ok()
        .and_then(|line| line.strip_prefix(&format!("{dataset}/{key} generation ")))
        .and_then(|generation| generation.parse().ok());
    match generation {
        Some(generation) if object(dataset, key, generation) == data => Ok(()),
        Some(generation) => Err(format!(
            "{dataset}/{key} is not generation {generation} whole ({} bytes)",
            data.len()
        )),
        None => Err(format!(
            "{dataset}/{key} is no version of that object: it starts {:?}",
            String::from_utf8_lossy(&line[..line.len().min(80)])
        )),
    }
}

/// What the store holds: key → generation, per dataset.
struct Store {
    datasets: Vec<BTreeMap<String, u64>>,
    next_key: usize,
}

impl Store {
    fn seeded(server: &Server) -> Self {
        let datasets = DATASETS
            .iter()
            .map(|d| {
                (0..d.objects)
                    .map(|i| (format!("f{i:02}.bin"), 0))
                    .collect()
            })
            .collect();
        let store = Self {
            datasets,
            next_key: 10,
        };
        for index in 0..DATASETS.len() {
            let keys: Vec<String> = store.datasets[index].keys().cloned().collect();
            store.put(server, index, &keys);
        }
        store
    }

    fn put(&self, server: &Server, index: usize, keys: &[String]) {
        let name = DATASETS[index].name;
        let files = keys
            .iter()
            .map(|key| {
                let generation = self.datasets[index][key];
                (key.clone(), object(name, key, generation))
            })
            .collect();
        server.seed(&prefix(name), &files);
    }

    /// One change to one dataset: new generations of a few objects, or an object added or
    /// deleted; which.
    fn change(&mut self, server: &Server, rng: &mut fastrand::Rng) -> &'static str {
        let index = rng.usize(..DATASETS.len());
        let name = DATASETS[index].name;
        let objects = &mut self.datasets[index];
        match rng.u8(..8) {
            0 if objects.len() < 10 => {
                let key = format!("f{:02}.bin", self.next_key);
                self.next_key += 1;
                objects.insert(key.clone(), 0);
                self.put(server, index, std::slice::from_ref(&key));
                "objects added"
            }
            1 if objects.len() > 4 => {
                let key = objects
                    .keys()
                    .nth(rng.usize(..objects.len()))
                    .unwrap()
                    .clone();
                objects.remove(&key);
                let deleted = server.runtime.block_on(
                    server
                        .client
                        .delete_object()
                        .bucket(&server.target.bucket)
                        .key(format!("{name}/{key}"))
                        .send(),
                );
                deleted.unwrap_or_else(|e| panic!("deleting {name}/{key}: {e:?}"));
                "objects deleted"
            }
            _ => {
                let keys: Vec<String> = (0..rng.usize(1..=3))
                    .map(|_| {
                        objects
                            .keys()
                            .nth(rng.usize(..objects.len()))
                            .unwrap()
                            .clone()
                    })
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                for key in &keys {
                    *objects.get_mut(key).unwrap() += 1;
                }
                self.put(server, index, &keys);
                "objects rewritten"
            }
        }
    }
}

/// Where a pod's current volume stands. The daemon may hold a lease for a volume being
/// published or unpublished; it must hold one for a mounted volume, and none for a volume
/// that is done (unpublished or refused) or older.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Done,
    Publishing,
    Mounted,
    Unpublishing,
}

#[derive(Clone, Debug)]
struct PodState {
    /// The number of its current volume (0: none yet).
    seq: u64,
    phase: Phase,
    /// Bumped at every change, so a checker sees whether the state held while it looked.
    generation: u64,
    dataset: usize,
    /// The snapshot its mount shows (`Mounted`).
    snapshot: String,
}

struct Pod {
    index: usize,
    uid: String,
    namespace: &'static str,
    state: Mutex<PodState>,
}

impl Pod {
    fn new(index: usize) -> Self {
        Self {
            index,
            uid: format!("pod-{index:03}"),
            namespace: NAMESPACES[index % NAMESPACES.len()],
            state: Mutex::new(PodState {
                seq: 0,
                phase: Phase::Done,
                generation: 0,
                dataset: 0,
                snapshot: String::new(),
            }),
        }
    }

    fn volume_id(&self, seq: u64) -> String {
        format!("vol-{:03}-{seq}", self.index)
    }

    fn state(&self) -> PodState {
        self.state.lock().unwrap().clone()
    }

    /// A new volume of `dataset`, being published; its number.
    fn begin(&self, dataset: usize) -> u64 {
        let mut state = self.state.lock().unwrap();
        state.seq += 1;
        state.dataset = dataset;
        state.snapshot.clear();
        state.phase = Phase::Publishing;
        state.generation += 1;
        state.seq
    }

    fn set(&self, phase: Phase, snapshot: Option<String>) {
        let mut state = self.state.lock().unwrap();
        state.phase = phase;
        if let Some(snapshot) = snapshot {
            state.snapshot = snapshot;
        }
        state.generation += 1;
    }
}

/// The `(pod index, volume number)` of a plugin lease holder, `POD_UID:VOLUME_ID`.
fn parse_holder(holder: &str) -> Option<(usize, u64)> {
    let (_, id) = holder.split_once(':')?;
    let (pod, seq) = id.strip_prefix("vol-")?.split_once('-')?;
    Some((pod.parse().ok()?, seq.parse().ok()?))
}

/// What a publish came to, once it stopped being retried.
enum Published {
    Mounted,
    Denied(Status),
    /// Still failing when the soak stopped: the pod is deleted.
    Abandoned,
}

/// Why a pod stopped early: an invariant it saw broken, or another thread's.
enum Halt {
    Broken(String),
    Aborted,
}

impl From<String> for Halt {
    fn from(why: String) -> Self {
        Halt::Broken(why)
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    pid: u32,
    rss_kib: u64,
    fds: usize,
}

/// The daemon or the plugin, as the chaos and the sampler see it.
struct Watched {
    name: &'static str,
    /// Bumped before a kill and after the restart: odd while it is down or coming up.
    lives: AtomicU64,
    samples: Mutex<Vec<Sample>>,
}

impl Watched {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            lives: AtomicU64::new(0),
            samples: Mutex::default(),
        }
    }

    fn kills(&self) -> u64 {
        self.lives.load(Relaxed) / 2
    }

    /// One sample of process `pid`, unless it was being killed meanwhile; an `Err` when it
    /// exited by itself.
    fn sample(&self, pid: u32) -> Result<(), String> {
        let lives = self.lives.load(Relaxed);
        let read = read_proc(pid);
        if lives % 2 == 1 || self.lives.load(Relaxed) != lives {
            return Ok(());
        }
        match read {
            Some((_, true)) => Err(format!("the {} (pid {pid}) exited by itself", self.name)),
            Some((sample, false)) => {
                self.samples.lock().unwrap().push(sample);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn peak(&self, of: impl Fn(&Sample) -> u64) -> u64 {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .map(of)
            .max()
            .unwrap_or(0)
    }

    /// The first and the last sample of its last life.
    fn last_life(&self) -> Option<(Sample, Sample)> {
        let samples = self.samples.lock().unwrap();
        let last = *samples.last()?;
        let first = *samples.iter().find(|s| s.pid == last.pid)?;
        Some((first, last))
    }
}

/// A process's RSS and open fds, and whether it is a zombie (it exited, nobody reaped it).
fn read_proc(pid: u32) -> Option<(Sample, bool)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let zombie = field("State:").is_some_and(|s| s.starts_with('Z'));
    let rss_kib = field("VmRSS:")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((Sample { pid, rss_kib, fds }, zombie))
}

#[derive(Default)]
struct Counters {
    publishes: AtomicU64,
    denied: AtomicU64,
    abandoned: AtomicU64,
    unpublishes: AtomicU64,
    files_read: AtomicU64,
    calls: AtomicU64,
    outages: AtomicU64,
    lease_reads: AtomicU64,
    lease_reads_missed: AtomicU64,
    state_files: AtomicU64,
    checks: AtomicU64,
}

struct Soak<'a> {
    dir: &'a Path,
    server: &'a Server,
    seed: u64,
    // The plugin goes first: its drop unmounts what is left.
    csi: Csi,
    daemon: RwLock<Daemon>,
    daemon_watch: Watched,
    plugin_watch: Watched,
    pods: Vec<Pod>,
    counters: Counters,
    /// The refresher's changes to the store, by kind.
    changes: Mutex<BTreeMap<&'static str, u64>>,
    /// Retried answers, by what they said: how many, and the first.
    retried: Mutex<BTreeMap<&'static str, (u64, String)>>,
    /// The slowest call, and which.
    slowest: Mutex<(Duration, String)>,
    /// The longest a publish took to succeed, retries included, and which.
    longest_publish: Mutex<(Duration, String)>,
    /// Successful publishes per dataset, and the snapshots mounted.
    mounted: Mutex<(BTreeMap<String, u64>, BTreeSet<String>)>,
    /// When the chaos stopped; the pods then finish their volumes.
    stopping: OnceLock<Instant>,
    /// How long the pods took to finish once the chaos stopped.
    drained_in: OnceLock<Duration>,
    /// Set once the pods are done and the quiet has been sampled.
    finished: AtomicBool,
    failures: Mutex<Vec<String>>,
}

impl<'a> Soak<'a> {
    fn new(dir: &'a Path, server: &'a Server, csi: Csi, daemon: Daemon, seed: u64) -> Self {
        Self {
            dir,
            server,
            seed,
            csi,
            daemon: RwLock::new(daemon),
            daemon_watch: Watched::new("daemon"),
            plugin_watch: Watched::new("plugin"),
            pods: (0..PODS).map(Pod::new).collect(),
            counters: Counters::default(),
            changes: Mutex::default(),
            retried: Mutex::default(),
            slowest: Mutex::default(),
            longest_publish: Mutex::default(),
            mounted: Mutex::default(),
            stopping: OnceLock::new(),
            drained_in: OnceLock::new(),
            finished: AtomicBool::new(false),
            failures: Mutex::default(),
        }
    }

    fn rng(&self, stream: u64) -> fastrand::Rng {
        fastrand::Rng::with_seed(self.seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn run(&self, duration: Duration, store: Store) {
        std::thread::scope(|scope| {
            let pods: Vec<_> = (self.pods.iter())
                .map(|pod| scope.spawn(move || self.guarded(|| self.pod(pod))))
                .collect();
            let refresher = scope.spawn(move || self.guarded(|| self.refresher(store)));
            let chaos = scope.spawn(|| self.guarded(|| self.chaos()));
            scope.spawn(|| self.guarded(|| self.checker()));
            scope.spawn(|| self.guarded(|| self.sampler()));
            let end = Instant::now() + duration;
            while Instant::now() < end && !self.failed() {
                std::thread::sleep(Duration::from_millis(200));
            }
            self.stop();
            let stopped = Instant::now();
            for handle in pods.into_iter().chain([refresher, chaos]) {
                let _ = handle.join();
            }
            let _ = self.drained_in.set(stopped.elapsed());
            // The quiet after: the sampler sees the processes idle, the checker sees no lease
            // come back.
            std::thread::sleep(Duration::from_secs(3));
            self.finished.store(true, Relaxed);
        });
    }

    /// Runs one thread's work; a panic in it fails the soak and stops the others.
    fn guarded(&self, work: impl FnOnce()) {
        struct Guard<'s, 'a>(&'s Soak<'a>);
        impl Drop for Guard<'_, '_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0
                        .fail("a soak thread panicked (its message is above)".into());
                }
            }
        }
        let _guard = Guard(self);
        work();
    }

    fn stop(&self) {
        let _ = self.stopping.set(Instant::now());
    }

    fn stopping(&self) -> bool {
        self.stopping.get().is_some()
    }

    fn fail(&self, why: String) {
        let mut failures = self.failures.lock().unwrap();
        if failures.len() < 20 {
            failures.push(why);
        }
        drop(failures);
        self.stop();
    }

    fn failed(&self) -> bool {
        !self.failures.lock().unwrap().is_empty()
    }

    /// Sleeps `pause`, or less when the soak stops.
    fn nap(&self, pause: Duration) {
        let end = Instant::now() + pause;
        while !self.stopping() && Instant::now() < end {
            std::thread::sleep((end - Instant::now()).min(Duration::from_millis(100)));
        }
    }

    fn pod(&self, pod: &Pod) {
        let mut rng = self.rng(pod.index as u64);
        self.nap(Duration::from_millis(rng.u64(..5000)));
        while !self.stopping() {
            match self.cycle(pod, &mut rng) {
                Ok(()) => {}
                Err(Halt::Broken(why)) => return self.fail(format!("{}: {why}", pod.uid)),
                Err(Halt::Aborted) => return,
            }
            self.nap(Duration::from_millis(rng.u64(2000..8000)));
        }
    }

    /// One volume of `pod`: published, read, held, read again, unpublished; or refused.
    fn cycle(&self, pod: &Pod, rng: &mut fastrand::Rng) -> Result<(), Halt> {
        let index = pick_dataset(rng);
        let name = DATASETS[index].name;
        let allowed = DATASETS[index]
            .namespace
            .is_none_or(|only| only == pod.namespace);
        let seq = pod.begin(index);
        let id = pod.volume_id(seq);
        let target = self
            .dir
            .join(format!("pods/{}/volumes/{id}/mount", pod.uid));
        let attributes = [("csi.storage.k8s.io/pod.namespace", pod.namespace)];
        let vol = Volume {
            attributes: &attributes,
            ..volume(&id, &pod.uid, name, &target)
        };
        let what = format!("{id} ({name}, namespace {})", pod.namespace);
        match self.publish(&vol, &what)? {
            Published::Mounted if allowed => self.use_volume(pod, &vol, &what, rng),
            Published::Denied(_) if !allowed => self.refused(pod, &vol, &what),
            Published::Abandoned => {
                self.counters.abandoned.fetch_add(1, Relaxed);
                self.take_down(pod, &vol, &what)
            }
            Published::Denied(status) => {
                Err(format!("{what} was refused, though its namespace may: {status:?}").into())
            }
            Published::Mounted => Err(format!(
                "{what} was published, though the dataset's rule leaves its namespace out"
            )
            .into()),
        }
    }

    /// A refused volume: nothing may be mounted for it.
    fn refused(&self, pod: &Pod, vol: &Volume, what: &str) -> Result<(), Halt> {
        if mounts_on(vol.target) > 0 {
            let at = vol.target.display();
            return Err(format!("{what} was refused, yet mounted at {at}").into());
        }
        self.counters.denied.fetch_add(1, Relaxed);
        pod.set(Phase::Done, None);
        remove_volume_dirs(vol.target);
        Ok(())
    }

    /// A published volume: every file read and checked, held a while, read again (nothing
    /// may have changed or gone), unpublished.
    fn use_volume(
        &self,
        pod: &Pod,
        vol: &Volume,
        what: &str,
        rng: &mut fastrand::Rng,
    ) -> Result<(), Halt> {
        let snapshot = mounted_snapshot(vol.target).ok_or_else(|| {
            format!(
                "{what}: published, but nothing is mounted at {}",
                vol.target.display()
            )
        })?;
        pod.set(Phase::Mounted, Some(snapshot.clone()));
        self.note_mounted(vol.dataset, &snapshot);
        let read = || {
            let files = self.read_volume(vol.target, vol.dataset);
            files.map_err(|e| Halt::Broken(format!("{what}: {e}")))
        };
        let first = read()?;
        self.nap(Duration::from_millis(rng.u64(500..3000)));
        let again = read()?;
        let now = mounted_snapshot(vol.target);
        if again != first || now.as_deref() != Some(&snapshot) {
            return Err(format!(
                "{what}: snapshot {snapshot} changed under its reader: {:?} then {:?} (now mounted: {now:?})",
                first.keys().collect::<Vec<_>>(),
                again.keys().collect::<Vec<_>>(),
            )
            .into());
        }
        self.take_down(pod, vol, what)?;
        self.counters.unpublishes.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Unpublishes the pod's volume; then nothing may be mounted or left at its target.
    fn take_down(&self, pod: &Pod, vol: &Volume, what: &str) -> Result<(), Halt> {
        pod.set(Phase::Unpublishing, None);
        self.unpublish(vol.id, vol.target, what)?;
        if mounts_on(vol.target) > 0 || vol.target.exists() {
            return Err(format!(
                "{what}: unpublished, yet {} is still mounted or there",
                vol.target.display()
            )
            .into());
        }
        pod.set(Phase::Done, None);
        remove_volume_dirs(vol.target);
        Ok(())
    }

    fn note_mounted(&self, dataset: &str, snapshot: &str) {
        self.counters.publishes.fetch_add(1, Relaxed);
        let mut mounted = self.mounted.lock().unwrap();
        *mounted.0.entry(dataset.to_string()).or_default() += 1;
        mounted.1.insert(snapshot.to_string());
    }

    /// Every file of the volume at `target`, each checked to be one complete version: name →
    /// BLAKE3.
    fn read_volume(
        &self,
        target: &Path,
        dataset: &str,
    ) -> Result<BTreeMap<String, blake3::Hash>, String> {
        let entries = std::fs::read_dir(target).map_err(|e| format!("listing the volume: {e}"))?;
        let mut files = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(|e| format!("listing the volume: {e}"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == ".hydrator" {
                continue;
            }
            let data = std::fs::read(entry.path()).map_err(|e| format!("reading {name}: {e}"))?;
            check_object(dataset, &name, &data)?;
            files.insert(name, blake3::hash(&data));
            self.counters.files_read.fetch_add(1, Relaxed);
        }
        match files.is_empty() {
            true => Err(format!("{} holds no file", target.display())),
            false => Ok(files),
        }
    }

    /// One call, timed; one slower than the kubelet allows fails the soak.
    fn timed<T>(&self, call: &str, what: &str, work: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let answer = work();
        let took = started.elapsed();
        self.counters.calls.fetch_add(1, Relaxed);
        let mut slowest = self.slowest.lock().unwrap();
        if took > slowest.0 {
            *slowest = (took, format!("{call} of {what}"));
        }
        drop(slowest);
        if took > CALL_BUDGET {
            self.fail(format!(
                "{call} of {what} took {took:?}, over the kubelet's {CALL_BUDGET:?}"
            ));
        }
        answer
    }

    /// Publishes `vol`, retrying as the kubelet does, until it is mounted or refused (or the
    /// soak stopped a while ago).
    fn publish(&self, vol: &Volume, what: &str) -> Result<Published, Halt> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(250);
        let published = loop {
            match self.timed("NodePublishVolume", what, || self.csi.publish(vol)) {
                Ok(()) => break Published::Mounted,
                Err(status) if status.code() == Code::PermissionDenied => {
                    break Published::Denied(status)
                }
                Err(status) => {
                    if !self.retry_after(&status, &mut pause, "publishing", what, GIVE_UP)? {
                        break Published::Abandoned;
                    }
                }
            }
        };
        let waited = started.elapsed();
        let mut longest = self.longest_publish.lock().unwrap();
        if waited > longest.0 {
            *longest = (waited, what.to_string());
        }
        Ok(published)
    }

    /// Unpublishes, retrying as the kubelet does until it succeeds.
    fn unpublish(&self, id: &str, target: &Path, what: &str) -> Result<(), Halt> {
        let mut pause = Duration::from_millis(250);
        loop {
            let status = match self.timed("NodeUnpublishVolume", what, || {
                self.csi.unpublish(id, target)
            }) {
                Ok(()) => return Ok(()),
                Err(status) => status,
            };
            if !self.retry_after(&status, &mut pause, "unpublishing", what, DRAIN)? {
                return Err(format!(
                    "unpublishing {what} still fails {DRAIN:?} after the chaos stopped: {status:?}"
                )
                .into());
            }
        }
    }

    /// Whether to try again a call that answered `status`, as the kubelet would: after a
    /// pause; not once the soak stopped `patience` ago.
    fn retry_after(
        &self,
        status: &Status,
        pause: &mut Duration,
        doing: &str,
        what: &str,
        patience: Duration,
    ) -> Result<bool, Halt> {
        if self.failed() {
            return Err(Halt::Aborted);
        }
        let Some(reason) = retried_because(status) else {
            return Err(format!("{doing} {what}: {status:?}").into());
        };
        if self
            .stopping
            .get()
            .is_some_and(|at| at.elapsed() > patience)
        {
            return Ok(false);
        }
        let mut retried = self.retried.lock().unwrap();
        let (count, first) = retried.entry(reason).or_default();
        if first.is_empty() {
            *first = format!("{:?}: {}", status.code(), status.message());
        }
        *count += 1;
        drop(retried);
        std::thread::sleep(*pause);
        *pause = (*pause * 2).min(Duration::from_secs(4));
        Ok(true)
    }

    fn refresher(&self, mut store: Store) {
        let mut rng = self.rng(1 << 32);
        self.nap(Duration::from_secs(5));
        while !self.stopping() {
            let change = store.change(self.server, &mut rng);
            *self.changes.lock().unwrap().entry(change).or_default() += 1;
            self.nap(Duration::from_millis(rng.u64(2000..5000)));
        }
    }

    /// Store outages every 8–20 s, and a kill of the daemon or the plugin, in turn, every
    /// 15–30 s.
    fn chaos(&self) {
        let mut rng = self.rng(2 << 32);
        let now = Instant::now();
        let mut next_outage = now + Duration::from_millis(rng.u64(5000..15000));
        let mut outage_ends = None;
        let mut next_kill = now + Duration::from_millis(rng.u64(15000..30000));
        let mut kills = 0;
        while !self.stopping() {
            std::thread::sleep(Duration::from_millis(100));
            let now = Instant::now();
            if outage_ends.is_some_and(|end| now >= end) {
                self.server.faults.clear();
                outage_ends = None;
                next_outage = now + Duration::from_millis(rng.u64(8000..20000));
            }
            if outage_ends.is_none() && now >= next_outage {
                self.start_outage(&mut rng);
                outage_ends = Some(now + Duration::from_millis(rng.u64(2000..6000)));
            }
            if now >= next_kill {
                let down = Duration::from_millis(rng.u64(500..3000));
                match kills % 2 {
                    0 => {
                        if let Err(why) = self.crash_daemon(down) {
                            self.fail(why);
                        }
                    }
                    _ => self.crash_plugin(down),
                }
                kills += 1;
                next_kill = Instant::now() + Duration::from_millis(rng.u64(15000..30000));
            }
        }
        self.server.faults.clear();
    }

    fn start_outage(&self, rng: &mut fastrand::Rng) {
        let every_get = |fault| Rule {
            ranged_only: false,
            ..Rule::get("", fault).times(usize::MAX)
        };
        match rng.u8(..3) {
            // The store is unreachable.
            0 => self.server.faults.add(every_get(Fault::DropConnection)),
            // Bodies stop midway for seconds.
            1 => self
                .server
                .faults
                .add(every_get(Fault::StallBody(1000, Duration::from_secs(4)))),
            // The store is overloaded.
            _ => {
                let slow_down = Fault::Status(503, "SlowDown");
                self.server
                    .faults
                    .add(Rule::listing(slow_down.clone()).times(usize::MAX));
                self.server.faults.add(every_get(slow_down));
            }
        }
        self.counters.outages.fetch_add(1, Relaxed);
    }

    /// kill -9 of the daemon; its state file must parse and hold the leases it must; after
    /// `down`, it is started again on the same catalog and cache.
    fn crash_daemon(&self, down: Duration) -> Result<(), String> {
        let mut daemon = self.daemon.write().unwrap();
        self.daemon_watch.lives.fetch_add(1, Relaxed);
        daemon.kill();
        let kill = self.daemon_watch.kills() + 1;
        let before = self.phases();
        let saved = self.saved_leases();
        let after = self.phases();
        saved
            .and_then(|leases| self.judge(&before, &leases, &after))
            .map_err(|e| format!("the state file after daemon kill {kill}: {e}"))?;
        self.counters.state_files.fetch_add(1, Relaxed);
        std::thread::sleep(down);
        daemon.start_again();
        self.daemon_watch.lives.fetch_add(1, Relaxed);
        Ok(())
    }

    /// The leases in the daemon's state file (none before it first saved one).
    fn saved_leases(&self) -> Result<Vec<Value>, String> {
        let path = self.dir.join("cache/.daemon/state.json");
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        let state: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
        let leases = state["leases"].as_array().cloned();
        leases.ok_or_else(|| format!("{} holds no list of leases: {state}", path.display()))
    }

    /// kill -9 of the plugin, started again after `down`.
    fn crash_plugin(&self, down: Duration) {
        self.plugin_watch.lives.fetch_add(1, Relaxed);
        self.csi.kill_and_restart(down);
        self.plugin_watch.lives.fetch_add(1, Relaxed);
    }

    fn phases(&self) -> Vec<PodState> {
        self.pods.iter().map(Pod::state).collect()
    }

    /// Compares the daemon's leases with the pods, all along.
    fn checker(&self) {
        while !self.finished.load(Relaxed) && !self.failed() {
            std::thread::sleep(Duration::from_millis(300));
            if let Err(why) = self.check_leases() {
                self.fail(why);
            }
        }
    }

    fn check_leases(&self) -> Result<(), String> {
        let daemon = self.daemon.read().unwrap();
        let before = self.phases();
        let answer = daemon.request_within("GET", "/v1/leases", Duration::from_secs(30));
        let after = self.phases();
        drop(daemon);
        let Some((200, body)) = answer else {
            self.counters.lease_reads_missed.fetch_add(1, Relaxed);
            return Ok(());
        };
        let leases: Vec<Value> =
            serde_json::from_str(&body).map_err(|e| format!("GET /v1/leases: {e}: {body}"))?;
        self.counters.lease_reads.fetch_add(1, Relaxed);
        self.judge(&before, &leases, &after)
            .map_err(|e| format!("the daemon's leases: {e}"))
    }

    /// Judges `leases` against the pods' states before and after they were read: every lease
    /// is a plugin lease held until released, of a volume still being published, mounted or
    /// unpublished, on its dataset; every volume mounted all along holds one, on the snapshot
    /// its mount shows.
    fn judge(
        &self,
        before: &[PodState],
        leases: &[Value],
        after: &[PodState],
    ) -> Result<(), String> {
        let mut checks = 0;
        let mut held = BTreeMap::new();
        for lease in leases {
            let holder = lease["holder"].as_str().unwrap_or_default();
            let Some((pod, seq)) = parse_holder(holder).filter(|(pod, _)| *pod < PODS) else {
                return Err(format!("a lease no pod holds: {lease}"));
            };
            let (was, now) = (&before[pod], &after[pod]);
            if seq < was.seq || (seq == was.seq && was.phase == Phase::Done) {
                return Err(format!("{holder} was unpublished (or refused), yet holds {lease}; the pod is at {was:?}"));
            }
            if seq > now.seq {
                return Err(format!(
                    "{holder} holds {lease} before it was published; the pod is at {now:?}"
                ));
            }
            if lease["expires_at"].as_u64() != Some(u64::MAX) {
                return Err(format!(
                    "{holder}'s lease is not held until released: {lease}"
                ));
            }
            if seq == was.seq && lease["dataset"] != DATASETS[was.dataset].name {
                return Err(format!(
                    "{holder} published {}, yet holds {lease}",
                    DATASETS[was.dataset].name
                ));
            }
            held.insert((pod, seq), lease);
            checks += 1;
        }
        for (pod, (was, now)) in before.iter().zip(after).enumerate() {
            if was.phase != Phase::Mounted || now.generation != was.generation {
                continue;
            }
            let holder = format!(
                "{}:{}",
                self.pods[pod].uid,
                self.pods[pod].volume_id(was.seq)
            );
            match held.get(&(pod, was.seq)) {
                None => {
                    return Err(format!(
                        "{holder} is mounted (snapshot {}), yet holds no lease",
                        was.snapshot
                    ))
                }
                Some(lease) if lease["snapshot"] != was.snapshot.as_str() => {
                    return Err(format!(
                        "{holder} has snapshot {} mounted, yet its lease is {lease}",
                        was.snapshot
                    ))
                }
                Some(_) => checks += 1,
            }
        }
        self.counters.checks.fetch_add(checks, Relaxed);
        Ok(())
    }

    /// Both processes' RSS and open fds, every second.
    fn sampler(&self) {
        while !self.finished.load(Relaxed) && !self.failed() {
            let daemon_pid = self.daemon.read().unwrap().child.id();
            let sampled = self
                .daemon_watch
                .sample(daemon_pid)
                .and_then(|()| self.plugin_watch.sample(self.csi.pid()));
            if let Err(why) = sampled {
                self.fail(why);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn report(&self, seconds: u64, wall: Duration) -> String {
        use std::fmt::Write;
        let c = &self.counters;
        let n = |counter: &AtomicU64| counter.load(Relaxed);
        let drained = self.drained_in.get().copied().unwrap_or_default();
        let (mounted, snapshots) = &*self.mounted.lock().unwrap();
        let (slowest, slowest_call) = self.slowest.lock().unwrap().clone();
        let (longest, longest_publish) = self.longest_publish.lock().unwrap().clone();
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(w, "soak report: {seconds} s of chaos, seed {:#x}, {PODS} pods, {} datasets, quota {QUOTA}", self.seed, DATASETS.len());
        let _ = writeln!(
            w,
            "  wall time {wall:.1?}; the pods finished {drained:.1?} after the chaos stopped"
        );
        let _ = writeln!(w, "  publishes {} {mounted:?}, unpublishes {}, denied {}, given up when the soak stopped {}", n(&c.publishes), n(&c.unpublishes), n(&c.denied), n(&c.abandoned));
        let _ = writeln!(
            w,
            "  files read and checked {}, snapshots mounted {}",
            n(&c.files_read),
            snapshots.len()
        );
        let _ = writeln!(
            w,
            "  gRPC calls {}, the slowest {slowest:.2?} ({slowest_call})",
            n(&c.calls)
        );
        let _ = writeln!(
            w,
            "  longest wait for a publish {longest:.1?} ({longest_publish}); retried:"
        );
        for (reason, (count, first)) in self.retried.lock().unwrap().iter() {
            let _ = writeln!(
                w,
                "    {reason}: {count}, the first: {}",
                first_chars(first, 160)
            );
        }
        let _ = writeln!(
            w,
            "  store: {:?}, outages {}; evictions {}",
            self.changes.lock().unwrap(),
            n(&c.outages),
            self.daemon_log().matches("evicting snapshot").count()
        );
        let _ = writeln!(w, "  invariants: {} checks passed, over {} lease reads ({} unanswered) and {} state files after kills", n(&c.checks), n(&c.lease_reads), n(&c.lease_reads_missed), n(&c.state_files));
        for watched in [&self.daemon_watch, &self.plugin_watch] {
            let life = watched
                .last_life()
                .map_or("no samples".into(), |(first, last)| {
                    format!(
                        "its last life had {} fds at first, {} at the end",
                        first.fds, last.fds
                    )
                });
            let _ = writeln!(
                w,
                "  {}: killed {}, peak RSS {} MiB, peak fds {}; {life}",
                watched.name,
                watched.kills(),
                watched.peak(|s| s.rss_kib) / 1024,
                watched.peak(|s| s.fds as u64)
            );
        }
        out
    }

    fn tails(&self) -> String {
        format!(
            "daemon log (tail):\n{}\nplugin log (tail):\n{}",
            tail(&self.daemon_log(), 40),
            tail(&self.csi.log(), 40)
        )
    }

    fn assert_all_well(&self, seconds: u64) {
        let failures = self.failures.lock().unwrap().clone();
        assert!(
            failures.is_empty(),
            "the soak failed:\n- {}\n{}",
            failures.join("\n- "),
            self.tails()
        );
        let (longest, which) = self.longest_publish.lock().unwrap().clone();
        assert!(
            longest <= LONGEST_WAIT,
            "{which} waited {longest:?} to be published\n{}",
            self.tails()
        );
        self.assert_nothing_left();
        self.assert_no_growth();
        if seconds >= 60 {
            self.assert_everything_happened();
        }
    }

    /// Once every pod is gone: no mount, lease, volume record or damaged state file.
    fn assert_nothing_left(&self) {
        let c = &self.counters;
        let published = c.publishes.load(Relaxed);
        assert_eq!(
            published,
            c.unpublishes.load(Relaxed),
            "every published volume was unpublished"
        );
        let left = mounts_under(&self.dir.join("pods"));
        assert!(
            left.is_empty(),
            "mounts left under the pods directory: {left:?}\n{}",
            self.tails()
        );
        let (code, leases) = self.daemon.read().unwrap().request("GET", "/v1/leases", "");
        assert_eq!(
            (code, leases.as_str()),
            (200, "[]"),
            "leases left\n{}",
            self.tails()
        );
        let names = |dir: &str| -> Vec<String> {
            let entries = std::fs::read_dir(self.dir.join(dir)).unwrap();
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        };
        let records = names("csi-state/volumes");
        assert!(
            records.is_empty(),
            "volume records left: {records:?}\n{}",
            self.tails()
        );
        let set_aside: Vec<_> = (names("cache/.daemon").into_iter())
            .filter(|name| name.contains("corrupt"))
            .collect();
        assert!(
            set_aside.is_empty(),
            "state files set aside as corrupt: {set_aside:?}\n{}",
            self.tails()
        );
    }

    /// Both processes, idle at the end, hold no more fds than when they started (but a few),
    /// and never took much memory.
    fn assert_no_growth(&self) {
        for watched in [&self.daemon_watch, &self.plugin_watch] {
            let (first, last) = watched.last_life().expect("sampled");
            let name = watched.name;
            assert!(
                last.fds <= first.fds + FD_SLACK,
                "the {name}'s fds grew from {} to {}",
                first.fds,
                last.fds
            );
            let peak = watched.peak(|s| s.rss_kib) / 1024;
            assert!(peak < RSS_LIMIT_MIB, "the {name}'s RSS reached {peak} MiB");
        }
    }

    /// A soak long enough to see each kind of event saw it: otherwise it proved less than it
    /// says.
    fn assert_everything_happened(&self) {
        let c = &self.counters;
        let mounted = self.mounted.lock().unwrap().0.clone();
        let happened = [
            (
                "a publish of every dataset",
                mounted.len() == DATASETS.len(),
            ),
            ("a denied publish", c.denied.load(Relaxed) > 0),
            ("a store change", !self.changes.lock().unwrap().is_empty()),
            ("an outage", c.outages.load(Relaxed) > 0),
            ("a daemon kill", self.daemon_watch.kills() > 0),
            ("a plugin kill", self.plugin_watch.kills() > 0),
            (
                "an eviction",
                self.daemon_log().contains("evicting snapshot"),
            ),
            ("a lease check", c.checks.load(Relaxed) > 0),
        ];
        for (what, seen) in happened {
            assert!(seen, "the soak saw no {what}");
        }
    }
}

/// A dataset, as often as its weight says.
fn pick_dataset(rng: &mut fastrand::Rng) -> usize {
    let mut left = rng.u32(..DATASETS.iter().map(|d| d.weight).sum::<u32>());
    DATASETS
        .iter()
        .position(|d| match left.checked_sub(d.weight) {
            Some(rest) => {
                left = rest;
                false
            }
            None => true,
        })
        .unwrap()
}

/// The reason a call that answered `status` is tried again, as the kubelet would; `None`
/// when it must not fail that way.
fn retried_because(status: &Status) -> Option<&'static str> {
    let message = status.message();
    match status.code() {
        Code::Unavailable if message.contains("is hydrating on this node") => Some("hydrating"),
        Code::Unavailable if message.contains("not enough space") => Some("no room to hydrate"),
        Code::Unavailable if message.contains("could not hydrate") => Some("could not hydrate"),
        Code::Unavailable if message.contains("the node daemon") => Some("daemon down"),
        Code::Unavailable if message.contains("transport error") => Some("plugin down"),
        Code::Unavailable => Some("unavailable, other"),
        Code::Unknown | Code::Cancelled => Some("cut off"),
        Code::Aborted => Some("aborted"),
        _ => None,
    }
}

/// Removes what the kubelet made for a volume (the plugin removed its target).
fn remove_volume_dirs(target: &Path) {
    let _ = std::fs::remove_dir(target);
    if let Some(volume_dir) = target.parent() {
        let _ = std::fs::remove_dir(volume_dir);
    }
}

fn first_chars(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
