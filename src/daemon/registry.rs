//! The daemon's memory of the cache: the ready snapshots of each dataset, the hydration in
//! flight, the last failure, what each dataset's directory holds on disk, and the leases.
//!
//! A lease belongs to the identity that took it ([`super::identity`]): only that identity or
//! an admin renews or releases it, a dataset holds at most the catalog's number of leases, and
//! an expired lease counts as gone even before maintenance drops it.
//!
//! One identity holds at most its share of a dataset's leases. The CSI plugin (an admin) takes
//! a lease for every volume of every pod, so its leases are counted per pod, the pod the plugin
//! names: one pod with hundreds of inline volumes holds its share, not the whole table.
//!
//! The directories are the truth: on start the registry is rebuilt from them (a snapshot is
//! ready exactly when its READY marker says so), and only what the disk cannot tell (leases
//! and when each snapshot was last used) is kept in `ROOT/.daemon/state.json`.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::error::HydrationError;
use super::identity::Caller;
use super::protocol::{Condition, DatasetStatus, Lease, LeaseStatus, Phase, Progress, State};
use super::space::Usage;
use crate::engine::retry::Backoff;
use crate::engine::schedule::{Schedule, Wanted};
use crate::engine::stats::Stats;
use crate::fs;
use crate::snapshot::Snapshot;

/// The daemon's own directory under the cache root.
pub(crate) const DAEMON_DIR: &str = ".daemon";
const STATE_FILE: &str = "state.json";

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// A complete snapshot on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadySnapshot {
    pub objects: u64,
    pub bytes: u64,
    /// Unix seconds: when a caller last got it or leased it.
    pub last_used: u64,
}

/// What a running hydration has found out so far.
#[derive(Clone, Debug, Default)]
pub(crate) struct FlightInfo {
    pub phase: Phase,
    pub snapshot: Option<String>,
    pub objects: u64,
    pub bytes: u64,
    /// The snapshot it links unchanged files from: not evictable meanwhile.
    pub link_source: Option<String>,
    /// Bytes reserved for it before it started downloading.
    pub reserved: u64,
    /// It resumes an older snapshot for the lease that pins it, not the dataset's refresh:
    /// once complete it does not replace the snapshot the dataset serves.
    pub for_lease: bool,
}

/// An interrupted hydration found on disk at start, to resume from its manifest.
pub(crate) struct Resume {
    pub snapshot: Arc<Snapshot>,
    /// An older snapshot resumed for the lease that pins it (a lazy view reads it).
    pub for_lease: bool,
}

/// A snapshot a lease pins whose hydration ended without completing: kept on disk, its
/// landed files served, the others answered with why.
pub(crate) struct Unfinished {
    pub reason: String,
    /// What the ended hydration knew of each object, when it got as far as downloading.
    pub schedule: Option<Arc<Schedule>>,
}

impl Unfinished {
    /// A lazy view opens `key`: local if it landed, else why it cannot be had.
    pub(crate) fn want(&self, key: &str) -> Wanted {
        match &self.schedule {
            Some(schedule) => schedule.want(key),
            None => Wanted::Now(Err(self.reason.as_str().into())),
        }
    }
}

/// One hydration, shared by every request for its dataset.
pub(crate) struct Flight {
    pub stats: Arc<Stats>,
    pub started: Instant,
    pub info: Mutex<FlightInfo>,
    /// Set when it has ended; its outcome is then in the dataset's status.
    pub done: watch::Sender<bool>,
    /// The order its engine fetches in, set once it downloads: lazy views' opens steer it.
    pub schedule: std::sync::OnceLock<Arc<Schedule>>,
}

impl Flight {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            stats: Arc::default(),
            started: Instant::now(),
            info: Mutex::default(),
            done: watch::channel(false).0,
            schedule: std::sync::OnceLock::new(),
        })
    }

    pub(crate) fn info(&self) -> std::sync::MutexGuard<'_, FlightInfo> {
        self.info.lock().expect("flight info lock")
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.info().phase = phase;
    }

    fn progress(&self) -> Progress {
        let info = self.info();
        Progress {
            phase: info.phase,
            objects_done: self.stats.objects_finished(),
            objects_total: info.objects,
            bytes_done: Stats::get(&self.stats.bytes_received)
                + Stats::get(&self.stats.bytes_from_peers)
                + Stats::get(&self.stats.bytes_skipped),
            bytes_total: info.bytes,
        }
    }
}

#[derive(Default)]
pub(crate) struct DatasetEntry {
    pub ready: BTreeMap<String, ReadySnapshot>,
    /// The newest ready snapshot: what warm requests get.
    pub current: Option<String>,
    /// When `current` was last confirmed against the source's listing.
    pub checked_at: Option<Instant>,
    /// When `current` was last listed successfully (RFC 3339).
    pub refreshed_at: Option<String>,
    pub flight: Option<Arc<Flight>>,
    /// Why the last hydration failed, until one succeeds.
    pub failure: Option<HydrationError>,
    /// Hydrations failed in a row, and when the last one ended: the back-off before the next.
    pub failures: u32,
    pub failed_at: Option<Instant>,
    /// What its directory held on disk when last measured; `None` once it changed since.
    pub usage: Option<Arc<DatasetUsage>>,
    /// Bumped whenever its directory changes (a hydration ended, a snapshot was evicted), so a
    /// measurement taken before is not stored.
    pub disk_generation: u64,
    /// Whether the log said that its server does not list object versions (once is enough).
    pub unversioned_said: bool,
    /// Interrupted hydrations waiting for the running one to end (leased ones first).
    pub queued: VecDeque<Resume>,
    /// Leased snapshots whose hydration ended without completing, by digest.
    pub unfinished: BTreeMap<String, Unfinished>,
}

/// A dataset directory's disk use, measured in one walk.
#[derive(Debug)]
pub(crate) struct DatasetUsage {
    pub measured_at: Instant,
    /// All of it, hard-linked files shared among their links.
    pub total: Usage,
    /// Each snapshot directory in it (ready or being hydrated).
    pub snapshots: BTreeMap<String, Usage>,
}

/// The wait before a failed hydration is tried again: 5 s, doubling with each failure.
const HYDRATION_RETRY: Backoff = Backoff {
    first: Duration::from_secs(5),
    cap: Duration::from_secs(300),
};

impl DatasetEntry {
    /// Its directory changed: the next maintenance pass measures it again.
    pub(crate) fn changed_on_disk(&mut self) {
        self.usage = None;
        self.disk_generation += 1;
    }

    /// Whether a failed hydration is still in its back-off, so a warm request must not start
    /// another.
    pub(crate) fn backing_off(&self) -> bool {
        let wait = HYDRATION_RETRY.ceiling(self.failures.saturating_sub(1));
        self.failed_at.is_some_and(|at| at.elapsed() < wait)
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    pub datasets: BTreeMap<String, DatasetEntry>,
    /// By (dataset, holder).
    pub leases: BTreeMap<(String, String), Lease>,
    /// Unix seconds: `state.json` could not be read at start, so the leases it held are
    /// unknown and nothing is evicted before this (the longest lease a caller can take).
    pub leases_unknown_until: Option<u64>,
}

/// Why a lease cannot be taken, renewed or released.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LeaseRefused {
    NotReady,
    NoSuchSnapshot(String),
    /// Another identity holds it.
    NotOwner {
        owner: String,
    },
    /// The dataset holds the most leases the catalog allows (to this caller).
    TooMany {
        cap: usize,
    },
    /// The caller holds the most leases of this dataset one identity may.
    TooManyOfYours {
        cap: usize,
    },
    /// The pod holds the most leases of this dataset one pod may (through the CSI plugin).
    TooManyForPod {
        pod: String,
        cap: usize,
    },
    NotHeld,
}

/// Who asks for a lease change, when, and within which bound.
pub(crate) struct LeaseAsk<'a> {
    pub caller: &'a Caller,
    /// The caller may renew or release any lease.
    pub admin: bool,
    /// The most leases one dataset may hold.
    pub cap: usize,
    /// The most leases of one dataset one identity, or one pod, may hold (admins are not bound
    /// by it for leases of their own).
    pub per_identity: usize,
    /// The pod an admin asks for (the CSI plugin): a new lease counts against its share.
    pub pod: Option<&'a str>,
    /// Unix seconds: leases that expired by then count as gone.
    pub now: u64,
}

/// Whose share of a dataset's leases a lease counts against: its pod's when an admin took it
/// for one, else its owner's.
fn share(pod: Option<&str>, owner: &str) -> String {
    match pod {
        Some(pod) => format!("pod:{pod}"),
        None => owner.to_string(),
    }
}

impl LeaseAsk<'_> {
    /// The share a new lease of this ask counts against, and its cap; `None` for an admin's
    /// own lease, which is bound by the dataset's cap alone.
    fn share(&self) -> Option<(String, LeaseRefused)> {
        match (self.admin, self.pod) {
            (true, None) => None,
            (_, Some(pod)) => Some((
                share(Some(pod), ""),
                LeaseRefused::TooManyForPod {
                    pod: pod.to_string(),
                    cap: self.per_identity,
                },
            )),
            (false, None) => Some((
                share(None, &self.caller.identity),
                LeaseRefused::TooManyOfYours {
                    cap: self.per_identity,
                },
            )),
        }
    }

    /// Whether this caller may renew `lease`: its owner, an admin, or anyone for a lease from
    /// before owners (whose renewal then adopts it).
    fn may_renew(&self, lease: &Lease) -> Result<(), LeaseRefused> {
        self.allowed(lease.owner.is_empty(), lease)
    }

    /// Whether this caller may release `lease`: its owner or an admin.
    fn may_release(&self, lease: &Lease) -> Result<(), LeaseRefused> {
        self.allowed(false, lease)
    }

    fn allowed(&self, unowned_ok: bool, lease: &Lease) -> Result<(), LeaseRefused> {
        let owner = !lease.owner.is_empty() && lease.owner == self.caller.identity;
        match self.admin || owner || unowned_ok {
            true => Ok(()),
            false => Err(LeaseRefused::NotOwner {
                owner: match lease.owner.is_empty() {
                    true => "nobody (an admin may release it)".into(),
                    false => lease.owner.clone(),
                },
            }),
        }
    }
}

impl Registry {
    /// The status of `name`, whose snapshots live under `root/name/`.
    pub(crate) fn status(&self, root: &Path, name: &str) -> DatasetStatus {
        let mut status = DatasetStatus {
            name: name.to_string(),
            state: State::Absent,
            snapshot: None,
            path: None,
            objects: None,
            bytes: None,
            progress: None,
            reason: None,
            stale: false,
            last_error: None,
            held_snapshot: None,
            held_path: None,
            refreshed_at: None,
            partial_path: None,
            lazy: false,
            shard: None,
            p2p: false,
            beyond_quota: false,
        };
        let Some(entry) = self.datasets.get(name) else {
            return status;
        };
        if let Some(flight) = &entry.flight {
            status.state = State::Hydrating;
            status.snapshot = flight.info().snapshot.clone();
            status.partial_path = (status.snapshot.as_ref())
                .filter(|_| flight.schedule.get().is_some())
                .map(|digest| snapshot_dir(root, name, digest).display().to_string());
            status.progress = Some(flight.progress());
            if let Some(held) = &entry.current {
                status.held_path = Some(snapshot_dir(root, name, held).display().to_string());
                status.held_snapshot = Some(held.clone());
            }
        } else if let Some(digest) = &entry.current {
            // What is held is served even when the source cannot be reached.
            let ready = &entry.ready[digest];
            status.state = State::Ready;
            status.path = Some(snapshot_dir(root, name, digest).display().to_string());
            status.snapshot = Some(digest.clone());
            status.objects = Some(ready.objects);
            status.bytes = Some(ready.bytes);
            status.stale = entry.failure.is_some();
            status.last_error = entry.failure.as_ref().map(ToString::to_string);
            status.refreshed_at = entry.refreshed_at.clone();
        } else if let Some(reason) = &entry.failure {
            status.state = State::Failed;
            status.reason = Some(reason.to_string());
            status.beyond_quota = reason.beyond_quota();
        }
        status
    }

    /// Whether the snapshot must stay: leased, being hydrated, or linked from.
    pub(crate) fn pinned(&self, name: &str, digest: &str, now: u64) -> bool {
        if self.leases_unknown_until.is_some_and(|until| until > now) {
            return true;
        }
        let leased = self.leased(name, digest, now);
        let in_flight = self
            .datasets
            .get(name)
            .and_then(|e| e.flight.as_ref())
            .is_some_and(|f| {
                let info = f.info();
                info.snapshot.as_deref() == Some(digest)
                    || info.link_source.as_deref() == Some(digest)
            });
        leased || in_flight
    }

    /// Whether a lease that has not expired by `now` pins snapshot `digest` of `name`.
    pub(crate) fn leased(&self, name: &str, digest: &str, now: u64) -> bool {
        self.live_leases_of(name, now)
            .any(|lease| lease.snapshot == digest)
    }

    /// The condition of snapshot `digest` of `name`, as a view of it sees it.
    pub(crate) fn condition(&self, name: &str, digest: &str) -> Condition {
        let Some(entry) = self.datasets.get(name) else {
            return Condition::Gone;
        };
        let hydrating = (entry.flight.as_ref())
            .is_some_and(|f| f.info().snapshot.as_deref() == Some(digest))
            || entry.queued.iter().any(|r| r.snapshot.digest == digest);
        if entry.ready.contains_key(digest) {
            Condition::Ready
        } else if hydrating {
            Condition::Hydrating
        } else if let Some(unfinished) = entry.unfinished.get(digest) {
            Condition::Failed {
                reason: unfinished.reason.clone(),
            }
        } else {
            Condition::Gone
        }
    }

    /// The live leases, each with the condition of the snapshot it pins.
    pub(crate) fn lease_statuses(&self, now: u64) -> impl Iterator<Item = LeaseStatus> + '_ {
        self.live_leases(now).map(|lease| LeaseStatus {
            condition: self.condition(&lease.dataset, &lease.snapshot),
            lease: lease.clone(),
        })
    }

    /// Takes or renews `holder`'s lease on `name`. A new lease pins the dataset's current
    /// snapshot unless one is named; a renewal keeps the snapshot it pins unless another is
    /// named, so a pod's files never move under it.
    pub(crate) fn lease(
        &mut self,
        name: &str,
        holder: &str,
        snapshot: Option<&str>,
        expires_at: u64,
        ask: &LeaseAsk,
    ) -> Result<Lease, LeaseRefused> {
        let key = (name.to_string(), holder.to_string());
        let held = self.leases.get(&key).filter(|l| l.expires_at > ask.now);
        if let Some(lease) = held {
            ask.may_renew(lease)?;
        } else {
            // The last quarter of a dataset's leases is kept for admins (the CSI plugin), and
            // one identity (one pod, for the plugin's leases) holds at most its share: no one
            // tenant can lock the others out.
            let share = ask.share();
            let wanted = share.as_ref().map(|(share, _)| share.as_str());
            let live = self.live_leases_of(name, ask.now);
            let (all, mine) = live.fold((0, 0), |(all, mine), lease| {
                let theirs = self::share(lease.pod.as_deref(), &lease.owner);
                (all + 1, mine + usize::from(Some(theirs.as_str()) == wanted))
            });
            let cap = match ask.admin {
                true => ask.cap,
                false => ask.cap - ask.cap / 4,
            };
            if all >= cap {
                return Err(LeaseRefused::TooMany { cap });
            }
            if let Some((_, full)) = share.filter(|_| mine >= ask.per_identity) {
                return Err(full);
            }
        }
        // An admin renewing keeps the owner, unless it makes the lease last until released
        // (the CSI plugin pinning a mount: nobody else may then shorten or drop it); an unowned
        // lease is adopted.
        let owner = held
            .map(|lease| lease.owner.clone())
            .filter(|owner| !owner.is_empty())
            .filter(|_| !(ask.admin && expires_at == super::protocol::UNTIL_RELEASED))
            .unwrap_or_else(|| ask.caller.identity.clone());
        let entry = self.datasets.get_mut(name).ok_or(LeaseRefused::NotReady)?;
        let digest = match (snapshot, held) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(lease)) => lease.snapshot.clone(),
            (None, None) => entry.current.clone().ok_or(LeaseRefused::NotReady)?,
        };
        let on_disk = entry
            .flight
            .as_ref()
            .is_some_and(|f| f.info().snapshot.as_deref() == Some(&digest))
            || entry.queued.iter().any(|r| r.snapshot.digest == digest)
            || entry.unfinished.contains_key(&digest);
        match entry.ready.get_mut(&digest) {
            Some(ready) => ready.last_used = now_unix(),
            // A lazy view reads the snapshot while it hydrates (or its landed files once the
            // hydration ended short): leased like a ready one.
            None if on_disk => {}
            None => return Err(LeaseRefused::NoSuchSnapshot(digest)),
        }
        let pod = match ask.pod {
            Some(pod) => Some(pod.to_string()),
            None => held.and_then(|lease| lease.pod.clone()),
        };
        let lease = Lease {
            dataset: name.to_string(),
            holder: holder.to_string(),
            owner,
            snapshot: digest,
            expires_at,
            pod,
        };
        self.leases.insert(key, lease.clone());
        Ok(lease)
    }

    /// Releases `holder`'s lease on `name`.
    pub(crate) fn release(
        &mut self,
        name: &str,
        holder: &str,
        ask: &LeaseAsk,
    ) -> Result<Lease, LeaseRefused> {
        let key = (name.to_string(), holder.to_string());
        let held = self.leases.get(&key).filter(|l| l.expires_at > ask.now);
        ask.may_release(held.ok_or(LeaseRefused::NotHeld)?)?;
        Ok(self.leases.remove(&key).expect("checked above"))
    }

    /// The leases that have not expired by `now`: an expired one is gone at once for every
    /// reader, before maintenance drops it.
    pub(crate) fn live_leases(&self, now: u64) -> impl Iterator<Item = &Lease> {
        self.leases
            .values()
            .filter(move |lease| lease.expires_at > now)
    }

    /// The leases on `name` that have not expired by `now`.
    fn live_leases_of<'a>(
        &'a self,
        name: &'a str,
        now: u64,
    ) -> impl Iterator<Item = &'a Lease> + 'a {
        self.leases
            .range((name.to_string(), String::new())..)
            .take_while(move |((dataset, _), _)| dataset == name)
            .map(|(_, lease)| lease)
            .filter(move |lease| lease.expires_at > now)
    }

    /// Drops leases that ran out; returns how many.
    pub(crate) fn expire_leases(&mut self, now: u64) -> usize {
        let before = self.leases.len();
        self.leases.retain(|_, lease| lease.expires_at > now);
        before - self.leases.len()
    }

    /// What goes into `state.json`.
    pub(crate) fn persisted(&self) -> Persisted {
        let mut last_used = BTreeMap::new();
        for (name, entry) in &self.datasets {
            for (digest, ready) in &entry.ready {
                last_used.insert(format!("{name}/{digest}"), ready.last_used);
            }
        }
        let now = now_unix();
        Persisted {
            leases: self.live_leases(now).cloned().collect(),
            last_used,
        }
    }
}

/// `ROOT/.daemon/state.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Persisted {
    pub leases: Vec<Lease>,
    /// `name/digest` → unix seconds.
    pub last_used: BTreeMap<String, u64>,
}

pub(crate) fn snapshot_dir(root: &Path, name: &str, digest: &str) -> PathBuf {
    root.join(name).join(digest)
}

/// The mode of the cache root and of each dataset's directory: passage only. A snapshot
/// directory is reached by its path (a bind mount, or a path the API handed out) and read by
/// its own mode; no one but root lists what the node caches.
pub(crate) const PASSAGE_MODE: u32 = 0o711;

/// Sets `dir`'s mode to `mode` (a directory of the daemon's own).
pub(crate) fn restrict(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// The frozen listing a snapshot directory was hydrated from.
pub(crate) fn snapshot_file(root: &Path, name: &str, digest: &str) -> PathBuf {
    root.join(name).join(format!("{digest}.snapshot"))
}

/// Writes `state` atomically.
pub(crate) fn save(root: &Path, state: &Persisted) -> io::Result<()> {
    let path = root.join(DAEMON_DIR).join(STATE_FILE);
    fs::write_atomic_path(&path, |file| Ok(serde_json::to_writer(file, state)?))
}

/// Whether `state.json` is there (readable or not).
pub(crate) fn state_file_exists(root: &Path) -> bool {
    root.join(DAEMON_DIR).join(STATE_FILE).exists()
}

/// Reads `state.json`; a missing one is an empty state. One that cannot be read or parsed is
/// `None`: the leases it held are unknown. An unparsable one is renamed to
/// `state.json.corrupt-<unix seconds>`, for a person to look at, and never overwritten.
pub(crate) fn load(root: &Path) -> Option<Persisted> {
    let path = root.join(DAEMON_DIR).join(STATE_FILE);
    let why = match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(persisted) => return Some(persisted),
            Err(err) => {
                let aside = path.with_file_name(format!("{STATE_FILE}.corrupt-{}", now_unix()));
                match std::fs::rename(&path, &aside) {
                    Ok(()) => format!("{err}; set aside as {}", aside.display()),
                    Err(rename) => format!("{err}; setting it aside failed: {rename}"),
                }
            }
        },
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Some(Persisted::default()),
        Err(err) => err.to_string(),
    };
    tracing::error!(
        "{}: {why}; its leases are unknown, so nothing is evicted for the longest lease time",
        path.display()
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry_with_ready() -> Registry {
        let mut registry = Registry::default();
        let entry = registry.datasets.entry("ds".into()).or_default();
        entry.ready.insert(
            "old".into(),
            ReadySnapshot {
                objects: 1,
                bytes: 10,
                last_used: 0,
            },
        );
        entry.current = Some("old".into());
        registry
    }

    fn ask(caller: &Caller) -> LeaseAsk<'_> {
        LeaseAsk {
            caller,
            admin: false,
            cap: 2,
            per_identity: 2,
            pod: None,
            now: 0,
        }
    }

    #[test]
    fn a_failure_for_want_of_space_says_whether_any_eviction_could_help() {
        use crate::daemon::error::{HydrationError, SpaceError};
        use crate::daemon::space::Budget;
        let short = |need: u64| {
            HydrationError::Space(SpaceError::NotEnough {
                need,
                budget: Budget {
                    quota: 1000,
                    free_space_floor: 0,
                    used: 600,
                    free: 10_000,
                    reserved: 0,
                },
                deficit: need.saturating_sub(400),
                evictable: 0,
            })
        };
        let mut registry = Registry::default();
        let entry = registry.datasets.entry("ds".into()).or_default();
        entry.failure = Some(short(1500));
        let status = registry.status(Path::new("/cache"), "ds");
        assert_eq!(status.state, State::Failed);
        assert!(status.beyond_quota, "1500 bytes never fit a quota of 1000");
        registry.datasets.get_mut("ds").unwrap().failure = Some(short(900));
        assert!(
            !registry.status(Path::new("/cache"), "ds").beyond_quota,
            "900 bytes fit once leased snapshots go"
        );
    }

    #[test]
    fn a_quarter_of_a_datasets_leases_is_kept_for_admins_and_one_identity_holds_its_share() {
        let mut registry = registry_with_ready();
        let (tenant, other, plugin) = (Caller::uid(1000), Caller::uid(2000), Caller::uid(0));
        let ask = |caller, admin| LeaseAsk {
            caller,
            admin,
            cap: 8,
            per_identity: 4,
            pod: None,
            now: 0,
        };
        for i in 0..4 {
            registry
                .lease("ds", &format!("t{i}"), None, 9, &ask(&tenant, false))
                .unwrap();
        }
        assert_eq!(
            registry.lease("ds", "t4", None, 9, &ask(&tenant, false)),
            Err(LeaseRefused::TooManyOfYours { cap: 4 })
        );
        for i in 0..2 {
            registry
                .lease("ds", &format!("o{i}"), None, 9, &ask(&other, false))
                .unwrap();
        }
        assert_eq!(
            registry.lease("ds", "o2", None, 9, &ask(&other, false)),
            Err(LeaseRefused::TooMany { cap: 6 }),
            "the last quarter is for admins"
        );
        registry
            .lease("ds", "csi-1", None, 9, &ask(&plugin, true))
            .unwrap();
        registry
            .lease("ds", "csi-2", None, 9, &ask(&plugin, true))
            .unwrap();
        assert_eq!(
            registry.lease("ds", "csi-3", None, 9, &ask(&plugin, true)),
            Err(LeaseRefused::TooMany { cap: 8 })
        );
    }

    #[test]
    fn the_plugins_leases_count_per_pod_so_one_pod_holds_its_share_not_the_table() {
        let mut registry = registry_with_ready();
        let plugin = Caller::token(&super::super::identity::Token {
            name: "csi".into(),
            secret: String::new(),
            datasets: None,
        });
        let for_pod = |pod| LeaseAsk {
            caller: &plugin,
            admin: true,
            cap: 8,
            per_identity: 2,
            pod: Some(pod),
            now: 0,
        };
        // One pod with many inline volumes of the dataset.
        let taken: Vec<_> = (0..8)
            .map(|i| {
                let holder = format!("pod-a:vol-{i}");
                registry.lease("ds", &holder, None, u64::MAX, &for_pod("pod-a"))
            })
            .collect();
        assert!(taken[..2].iter().all(Result::is_ok), "{taken:?}");
        for refused in &taken[2..] {
            assert_eq!(
                refused,
                &Err(LeaseRefused::TooManyForPod {
                    pod: "pod-a".into(),
                    cap: 2
                })
            );
        }
        // Every other pod still gets its volumes; renewals pass.
        for pod in ["pod-b", "pod-c"] {
            for i in 0..2 {
                let holder = format!("{pod}:vol-{i}");
                registry
                    .lease("ds", &holder, None, u64::MAX, &for_pod(pod))
                    .unwrap();
            }
        }
        let renewed = registry.lease("ds", "pod-a:vol-0", None, u64::MAX, &for_pod("pod-a"));
        assert_eq!(renewed.unwrap().pod.as_deref(), Some("pod-a"));
        // The plugin's own leases (no pod) are bound by the dataset's cap alone.
        let own = LeaseAsk {
            pod: None,
            ..for_pod("")
        };
        registry
            .lease("ds", "csi-own", None, u64::MAX, &own)
            .unwrap();
        registry
            .lease("ds", "csi-own-2", None, u64::MAX, &own)
            .unwrap();
        assert_eq!(
            registry.lease("ds", "csi-own-3", None, u64::MAX, &own),
            Err(LeaseRefused::TooMany { cap: 8 })
        );
    }

    #[test]
    fn an_expired_lease_is_neither_listed_nor_saved() {
        let mut registry = registry_with_ready();
        let me = Caller::uid(1000);
        let now = now_unix();
        let ask = LeaseAsk { now, ..ask(&me) };
        registry.lease("ds", "gone", None, now + 1, &ask).unwrap();
        registry
            .lease("ds", "kept", None, now + 3600, &ask)
            .unwrap();
        let later = now + 2;
        let live: Vec<_> = registry
            .live_leases(later)
            .map(|l| l.holder.clone())
            .collect();
        assert_eq!(live, ["kept"]);
        registry
            .leases
            .get_mut(&("ds".into(), "gone".into()))
            .unwrap()
            .expires_at = now - 1;
        let saved: Vec<_> = registry
            .persisted()
            .leases
            .into_iter()
            .map(|l| l.holder)
            .collect();
        assert_eq!(saved, ["kept"]);
    }

    #[test]
    fn the_snapshot_being_hydrated_may_be_leased_once_listed_and_pins_it() {
        let mut registry = registry_with_ready();
        let flight = Flight::new();
        registry.datasets.get_mut("ds").unwrap().flight = Some(flight.clone());
        let me = Caller::uid(1000);
        let lease =
            |registry: &mut Registry| registry.lease("ds", "pod", Some("new"), 9, &ask(&me));
        assert_eq!(
            lease(&mut registry),
            Err(LeaseRefused::NoSuchSnapshot("new".into())),
            "not listed yet"
        );
        flight.info().snapshot = Some("new".into());
        assert_eq!(lease(&mut registry).unwrap().snapshot, "new");
        registry.datasets.get_mut("ds").unwrap().flight = None;
        assert!(
            registry.pinned("ds", "new", 1),
            "leased, even once the flight is over"
        );
    }

    #[test]
    fn a_lease_pins_its_snapshot_until_it_expires() {
        let mut registry = registry_with_ready();
        let me = Caller::uid(1000);
        assert!(!registry.pinned("ds", "old", 100));
        registry.lease("ds", "pod-1", None, 200, &ask(&me)).unwrap();
        assert!(registry.pinned("ds", "old", 100));
        assert!(!registry.pinned("ds", "old", 200), "expired at 200");
        assert_eq!(registry.expire_leases(200), 1);
        assert!(registry.leases.is_empty());
    }

    #[test]
    fn leases_need_a_ready_snapshot() {
        let mut registry = registry_with_ready();
        let me = Caller::uid(1000);
        assert_eq!(
            registry.lease("other", "pod", None, 1, &ask(&me)),
            Err(LeaseRefused::NotReady)
        );
        assert_eq!(
            registry.lease("ds", "pod", Some("gone"), 1, &ask(&me)),
            Err(LeaseRefused::NoSuchSnapshot("gone".into()))
        );
        let status = registry.status(Path::new("/cache"), "ds");
        assert_eq!(status.state, State::Ready);
        assert_eq!(status.path.as_deref(), Some("/cache/ds/old"));
    }

    #[test]
    fn only_the_owner_or_an_admin_renews_or_releases_a_lease() {
        let mut registry = registry_with_ready();
        let (owner, other) = (Caller::uid(1000), Caller::uid(2000));
        registry.lease("ds", "pod", None, 10, &ask(&owner)).unwrap();
        let not_owner = Err(LeaseRefused::NotOwner {
            owner: "uid:1000".into(),
        });
        assert_eq!(
            registry.lease("ds", "pod", None, 99, &ask(&other)),
            not_owner
        );
        assert_eq!(registry.release("ds", "pod", &ask(&other)), not_owner);
        assert_eq!(registry.leases[&("ds".into(), "pod".into())].expires_at, 10);
        let renewed = registry.lease("ds", "pod", None, 20, &ask(&owner)).unwrap();
        assert_eq!(renewed.expires_at, 20);
        let admin = LeaseAsk {
            admin: true,
            ..ask(&other)
        };
        assert!(registry.release("ds", "pod", &admin).is_ok());
        assert_eq!(
            registry.release("ds", "pod", &ask(&owner)),
            Err(LeaseRefused::NotHeld)
        );
    }

    #[test]
    fn an_admin_renewal_keeps_the_owner_and_unowned_leases_are_adopted_not_released() {
        let mut registry = registry_with_ready();
        let (owner, admin) = (Caller::uid(1000), Caller::uid(0));
        registry.lease("ds", "pod", None, 10, &ask(&owner)).unwrap();
        let as_admin = LeaseAsk {
            admin: true,
            ..ask(&admin)
        };
        let renewed = registry.lease("ds", "pod", None, 20, &as_admin).unwrap();
        assert_eq!(
            renewed.owner, "uid:1000",
            "the owner's sidecar keeps renewing"
        );
        // A lease saved before owners existed.
        registry
            .leases
            .get_mut(&("ds".into(), "pod".into()))
            .unwrap()
            .owner = String::new();
        let stranger = Caller::uid(4242);
        assert!(matches!(
            registry.release("ds", "pod", &ask(&stranger)),
            Err(LeaseRefused::NotOwner { .. })
        ));
        let adopted = registry
            .lease("ds", "pod", None, 30, &ask(&stranger))
            .unwrap();
        assert_eq!(adopted.owner, "uid:4242");
    }

    #[test]
    fn expired_leases_count_as_gone() {
        let mut registry = registry_with_ready();
        let (first, second) = (Caller::uid(1), Caller::uid(2));
        registry.lease("ds", "a", None, 10, &ask(&first)).unwrap();
        registry.lease("ds", "b", None, 10, &ask(&first)).unwrap();
        let later = |caller| LeaseAsk {
            now: 10,
            ..ask(caller)
        };
        let taken = registry
            .lease("ds", "a", None, 99, &later(&second))
            .unwrap();
        assert_eq!(taken.owner, "uid:2", "not refused as another's, not capped");
        assert_eq!(
            registry.release("ds", "b", &later(&first)),
            Err(LeaseRefused::NotHeld)
        );
    }

    #[test]
    fn a_renewal_keeps_its_snapshot_and_new_leases_stop_at_the_cap() {
        let mut registry = registry_with_ready();
        let me = Caller::uid(0);
        registry.lease("ds", "a", None, 10, &ask(&me)).unwrap();
        let entry = registry.datasets.get_mut("ds").unwrap();
        entry.ready.insert("new".into(), entry.ready["old"].clone());
        entry.current = Some("new".into());
        let renewed = registry.lease("ds", "a", None, 20, &ask(&me)).unwrap();
        assert_eq!(renewed.snapshot, "old", "the pod's files stay pinned");
        assert_eq!(
            registry
                .lease("ds", "b", None, 20, &ask(&me))
                .unwrap()
                .snapshot,
            "new"
        );
        assert_eq!(
            registry.lease("ds", "c", None, 20, &ask(&me)),
            Err(LeaseRefused::TooMany { cap: 2 })
        );
        assert!(
            registry.lease("ds", "b", None, 30, &ask(&me)).is_ok(),
            "renewals pass"
        );
        let other = registry.datasets.entry("zz".into()).or_default();
        other.ready.insert(
            "d".into(),
            registry_with_ready().datasets["ds"].ready["old"].clone(),
        );
        other.current = Some("d".into());
        assert!(
            registry.lease("zz", "a", None, 20, &ask(&me)).is_ok(),
            "caps are per dataset"
        );
    }

    #[test]
    fn a_leased_snapshot_that_ended_short_keeps_its_lease_and_says_why() {
        let mut registry = registry_with_ready();
        let me = Caller::uid(1000);
        let entry = registry.datasets.get_mut("ds").unwrap();
        let unfinished = Unfinished {
            reason: "1 objects failed; first: k: gone".into(),
            schedule: None,
        };
        entry.unfinished.insert("short".into(), unfinished);
        let lease = registry.lease("ds", "pod", Some("short"), 9, &ask(&me));
        assert_eq!(
            lease.unwrap().snapshot,
            "short",
            "renewable, not NoSuchSnapshot"
        );
        assert!(registry.pinned("ds", "short", 1));
        let conditions: Vec<_> = ["old", "short", "none"]
            .map(|digest| registry.condition("ds", digest))
            .into();
        assert_eq!(
            conditions,
            [
                Condition::Ready,
                Condition::Failed {
                    reason: "1 objects failed; first: k: gone".into()
                },
                Condition::Gone
            ]
        );
        let listed: Vec<_> = registry.lease_statuses(1).map(|l| l.condition).collect();
        assert_eq!(listed, [conditions[1].clone()]);
        match registry.datasets["ds"].unfinished["short"].want("k") {
            Wanted::Now(Err(why)) => assert!(why.contains("k: gone"), "{why}"),
            _ => panic!("answered at once, with why"),
        }
    }

    #[test]
    fn a_flight_pins_its_link_source() {
        let mut registry = registry_with_ready();
        let flight = Flight::new();
        flight.info().link_source = Some("old".into());
        registry.datasets.get_mut("ds").unwrap().flight = Some(flight);
        assert!(registry.pinned("ds", "old", 0));
        assert_eq!(
            registry.status(Path::new("/c"), "ds").state,
            State::Hydrating
        );
    }
}
