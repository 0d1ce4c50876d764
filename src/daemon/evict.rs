//! Keeping the cache under its quota and above the free-space floor: space is reserved before
//! a hydration downloads anything, and whole snapshots that are complete, unleased and not in
//! use by a hydration are evicted, least recently used first, when room is needed. An
//! incomplete snapshot is never evicted: one whose hydration ended short stays while a lease
//! pins it, and is removed by the first maintenance pass after its lease is gone. Nothing is
//! evicted when evicting everything allowed would still not make enough room; the hydration
//! then fails with the numbers.
//!
//! Reservations and evictions are serialised by one lock, so two hydrations never count the
//! same free bytes.
//!
//! The cache's use is the sum of its datasets' directories (`ROOT/.daemon/` and anything else
//! under the root are not counted); each is walked once after it changed and its figures kept
//! until the next change, so a pass over an idle cache of millions of files stats nothing.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::SpaceError;
use super::registry::{self, DatasetUsage, Flight, DAEMON_DIR};
use super::space::{self, Candidate, Pressure};
use super::Daemon;
use crate::units::human_bytes;

const TRASH: &str = "trash";
/// A dataset's measured disk use is trusted this long even if the daemon saw no change, so a
/// change made behind its back (a person deleting files) is noticed within the hour.
const USAGE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Makes room for the hydration `flight` of `dataset`, of `bytes` in all, and books them to
/// it. Only what its snapshot directory does not hold yet is still to come
/// ([`space::still_to_come`]). `Err` says why it cannot fit.
pub(crate) async fn reserve(
    daemon: &Arc<Daemon>,
    flight: &Flight,
    dataset: &str,
    bytes: u64,
) -> Result<(), SpaceError> {
    let _space = daemon.space.lock().await;
    make_room(daemon, Some((dataset, bytes))).await?;
    flight.info().reserved = bytes;
    Ok(())
}

/// Expires leases and evicts what the quota and the floor ask for; run periodically.
pub(crate) async fn maintain(daemon: &Arc<Daemon>) {
    let expired = daemon.registry().expire_leases(registry::now_unix());
    if expired > 0 {
        tracing::info!("{expired} leases expired");
        daemon.state_changed();
    }
    drop_unfinished(daemon).await;
    let _space = daemon.space.lock().await;
    if let Err(why) = make_room(daemon, None).await {
        tracing::warn!("cannot keep the cache within its limits: {why}");
    }
}

/// Removes the snapshots whose hydration ended short once nothing pins them any more (their
/// lease released or expired): kept only for the view that read them.
async fn drop_unfinished(daemon: &Arc<Daemon>) {
    let now = registry::now_unix();
    let doomed: Vec<(String, String)> = {
        let mut registry = daemon.registry();
        let unpinned: Vec<(String, String)> = (registry.datasets.iter())
            .flat_map(|(name, entry)| entry.unfinished.keys().map(|d| (name.clone(), d.clone())))
            .filter(|(name, digest)| !registry.pinned(name, digest, now))
            .collect();
        for (name, digest) in &unpinned {
            if let Some(entry) = registry.datasets.get_mut(name) {
                entry.unfinished.remove(digest);
                entry.changed_on_disk();
            }
        }
        unpinned
    };
    for (name, digest) in doomed {
        tracing::info!(dataset = %name, "removing the incomplete snapshot {digest}: no lease pins it any more");
        let root = daemon.root.clone();
        let removed = blocking(move || remove_snapshot(&root, &name, &digest)).await;
        if let Err(err) = removed {
            tracing::warn!("removing an incomplete snapshot: {err}");
        }
    }
}

/// Evicts what the quota and the floor ask for, with room for `booking` (a dataset whose
/// hydration asks for its bytes) on top.
async fn make_room(daemon: &Arc<Daemon>, booking: Option<(&str, u64)>) -> Result<(), SpaceError> {
    let cache = daemon.catalog().cache.clone();
    let measured = measure(daemon).await.map_err(SpaceError::MeasureCache)?;
    let free = blocking({
        let root = daemon.root.clone();
        move || space::free_bytes(&root)
    })
    .await
    .map_err(SpaceError::MeasureCache)?;
    let used = measured.iter().map(|m| m.usage.total.shared).sum();
    // What a hydration's snapshot directory already holds (preallocated files, parts written
    // before a restart, linked files) is in the cache's use, or adds nothing to it: only the
    // rest of its bytes is still to come, for the running ones as for the one asking.
    let to_come = |m: &Measured, bytes: u64| {
        let held = m
            .flight
            .as_ref()
            .and_then(|(digest, _)| m.usage.snapshots.get(digest));
        held.map_or(bytes, |usage| space::still_to_come(bytes, usage.held))
    };
    let reserved = measured
        .iter()
        .filter_map(|m| Some(to_come(m, m.flight.as_ref()?.1)))
        .sum();
    let need = booking.map_or(0, |(dataset, bytes)| {
        let flight = measured.iter().find(|m| m.name == dataset);
        flight.map_or(bytes, |m| to_come(m, bytes))
    });
    daemon.metrics.cache_measured(used, free);
    let budget = space::Budget {
        quota: cache.quota,
        free_space_floor: cache.free_space_floor,
        used,
        free,
        reserved,
    };
    let Some((deficit, pressure)) = budget.deficit(need) else {
        return Ok(());
    };
    let candidates = candidates(daemon, &measured);
    let evictable: u64 = candidates.iter().map(|c| c.frees).sum();
    let Some(chosen) = space::choose(candidates, deficit) else {
        return Err(SpaceError::NotEnough {
            need,
            budget,
            deficit,
            evictable,
        });
    };
    for candidate in chosen {
        evict(daemon, &candidate, pressure)
            .await
            .map_err(|source| SpaceError::Evict {
                dataset: candidate.dataset.clone(),
                digest: candidate.digest.clone(),
                source,
            })?;
    }
    Ok(())
}

/// One dataset's directory as measured for a maintenance pass.
struct Measured {
    name: String,
    usage: Arc<DatasetUsage>,
    /// The snapshot a running hydration writes, and the bytes booked to it.
    flight: Option<(String, u64)>,
    /// Walked in this pass, at this disk generation of the dataset (else remembered figures).
    walked: Option<u64>,
}

/// The disk use of every dataset directory. Only a directory that changed since it was last
/// measured (a hydration running or ended, an eviction), or was last measured an hour ago, is
/// walked again; the others keep the figures recorded then, so an idle cache costs a walk an
/// hour, not one per pass.
async fn measure(daemon: &Arc<Daemon>) -> io::Result<Vec<Measured>> {
    struct Plan {
        name: String,
        cached: Option<Arc<DatasetUsage>>,
        generation: u64,
        snapshots: Vec<String>,
        flight: Option<(String, u64)>,
    }
    let plans: Vec<Plan> = {
        let registry = daemon.registry();
        registry
            .datasets
            .iter()
            .map(|(name, entry)| {
                let flight = entry.flight.as_ref().and_then(|flight| {
                    let info = flight.info();
                    Some((info.snapshot.clone()?, info.reserved))
                });
                Plan {
                    name: name.clone(),
                    cached: entry.usage.clone().filter(|usage| {
                        entry.flight.is_none() && usage.measured_at.elapsed() < USAGE_MAX_AGE
                    }),
                    generation: entry.disk_generation,
                    snapshots: entry
                        .ready
                        .keys()
                        .cloned()
                        .chain(flight.iter().map(|f| f.0.clone()))
                        .collect(),
                    flight,
                }
            })
            .collect()
    };
    let root = daemon.root.clone();
    let measured = blocking(move || {
        plans
            .into_iter()
            .map(|plan| {
                let walked = plan.cached.is_none().then_some(plan.generation);
                let usage = match plan.cached {
                    Some(usage) => usage,
                    None => Arc::new(measure_dataset(&root, &plan.name, &plan.snapshots)?),
                };
                Ok(Measured {
                    name: plan.name,
                    usage,
                    flight: plan.flight,
                    walked,
                })
            })
            .collect::<io::Result<Vec<_>>>()
    })
    .await?;
    let mut registry = daemon.registry();
    for m in &measured {
        let Some(generation) = m.walked else {
            continue;
        };
        daemon.metrics.dataset_walked();
        if let Some(entry) = registry.datasets.get_mut(&m.name) {
            if entry.flight.is_none() && entry.disk_generation == generation {
                entry.usage = Some(m.usage.clone());
            }
        }
    }
    Ok(measured)
}

/// Walks `ROOT/<name>/` once, with each of `snapshots` measured on the way.
fn measure_dataset(root: &Path, name: &str, snapshots: &[String]) -> io::Result<DatasetUsage> {
    let dirs: Vec<PathBuf> = snapshots
        .iter()
        .map(|digest| registry::snapshot_dir(root, name, digest))
        .collect();
    let (total, of_snapshots) = space::usage_within(&root.join(name), &dirs)?;
    Ok(DatasetUsage {
        measured_at: std::time::Instant::now(),
        total,
        snapshots: snapshots.iter().cloned().zip(of_snapshots).collect(),
    })
}

/// Ready snapshots nothing pins, with what evicting each would free.
fn candidates(daemon: &Daemon, measured: &[Measured]) -> Vec<Candidate> {
    let now = registry::now_unix();
    let registry = daemon.registry();
    measured
        .iter()
        .flat_map(|m| {
            let entry = registry.datasets.get(&m.name);
            entry.into_iter().flat_map(move |entry| {
                entry.ready.iter().map(move |(digest, ready)| Candidate {
                    dataset: m.name.clone(),
                    digest: digest.clone(),
                    last_used: ready.last_used,
                    frees: m.usage.snapshots.get(digest).map_or(0, |u| u.exclusive),
                })
            })
        })
        .filter(|c| !registry.pinned(&c.dataset, &c.digest, now))
        .collect()
}

/// Removes one snapshot, unless something pinned it since it was chosen.
async fn evict(daemon: &Arc<Daemon>, candidate: &Candidate, pressure: Pressure) -> io::Result<()> {
    let (name, digest) = (&candidate.dataset, &candidate.digest);
    {
        let mut registry = daemon.registry();
        if registry.pinned(name, digest, registry::now_unix()) {
            return Ok(());
        }
        let Some(entry) = registry.datasets.get_mut(name) else {
            return Ok(());
        };
        entry.ready.remove(digest);
        entry.changed_on_disk();
        if entry.current.as_deref() == Some(digest.as_str()) {
            entry.current = entry
                .ready
                .iter()
                .max_by_key(|(_, r)| r.last_used)
                .map(|(d, _)| d.clone());
            entry.checked_at = None;
        }
        // A failure and its back-off were a refresh's, while a snapshot was served; with
        // nothing left to serve, the dataset is absent and the next request hydrates at once.
        if entry.current.is_none() {
            (entry.failure, entry.failures, entry.failed_at) = (None, 0, None);
        }
    }
    tracing::info!(
        dataset = %name,
        "evicting snapshot {digest} ({}, {}): least recently used",
        human_bytes(candidate.frees),
        pressure.label()
    );
    let root = daemon.root.clone();
    let (name, digest) = (name.clone(), digest.clone());
    blocking(move || remove_snapshot(&root, &name, &digest)).await?;
    daemon.metrics.evicted(pressure);
    daemon.state_changed();
    Ok(())
}

/// Moves a snapshot directory out of the way (so it vanishes at once and whole), then deletes it.
pub(crate) fn remove_snapshot(root: &Path, name: &str, digest: &str) -> io::Result<()> {
    let trash = root.join(DAEMON_DIR).join(TRASH);
    std::fs::create_dir_all(&trash)?;
    let doomed = trash.join(format!("{name}.{digest}.{:08x}", fastrand::u32(..)));
    match std::fs::rename(registry::snapshot_dir(root, name, digest), &doomed) {
        Ok(()) => std::fs::remove_dir_all(&doomed)?,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    match std::fs::remove_file(registry::snapshot_file(root, name, digest)) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// Empties the trash a killed daemon may have left.
pub(crate) fn empty_trash(root: &Path) -> io::Result<()> {
    let trash = root.join(DAEMON_DIR).join(TRASH);
    match std::fs::remove_dir_all(&trash) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    std::fs::create_dir_all(trash)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(io::Error::other)?
}
