//! Keeping the cache under its quota and above the free-space floor: space is reserved before
//! a hydration downloads anything, and whole snapshots that are complete, unleased and not in
//! use by a hydration are evicted, least recently used first, when room is needed. Nothing is
//! evicted when evicting everything allowed would still not make enough room; the hydration
//! then fails with the numbers.
//!
//! Reservations and evictions are serialised by one lock, so two hydrations never count the
//! same free bytes.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::SpaceError;
use super::registry::{self, Flight, DAEMON_DIR};
use super::space::{self, Candidate, Pressure};
use super::Daemon;
use crate::units::human_bytes;

const TRASH: &str = "trash";

/// Makes room for `need` bytes and books them to `flight`; `Err` says why it cannot fit.
pub(crate) async fn reserve(
    daemon: &Arc<Daemon>,
    flight: &Flight,
    need: u64,
) -> Result<(), SpaceError> {
    let _space = daemon.space.lock().await;
    make_room(daemon, need).await?;
    flight.info().reserved = need;
    Ok(())
}

/// Expires leases and evicts what the quota and the floor ask for; run periodically.
pub(crate) async fn maintain(daemon: &Arc<Daemon>) {
    let expired = daemon.registry().expire_leases(registry::now_unix());
    if expired > 0 {
        tracing::info!("{expired} leases expired");
        let _ = daemon.save_state(); // logged; the next change writes again
    }
    let _space = daemon.space.lock().await;
    if let Err(why) = make_room(daemon, 0).await {
        tracing::warn!("cannot keep the cache within its limits: {why}");
    }
}

async fn make_room(daemon: &Arc<Daemon>, need: u64) -> Result<(), SpaceError> {
    let cache = daemon.catalog().cache.clone();
    let root = daemon.root.clone();
    let flights = reservations(daemon);
    let (used, free, reserved) = blocking(move || {
        let (dirs, booked): (Vec<PathBuf>, Vec<u64>) = flights.into_iter().unzip();
        let (cache, in_flight) = space::usage_within(&root, &dirs)?;
        let reserved = booked
            .iter()
            .zip(in_flight)
            .map(|(booked, on_disk)| booked.saturating_sub(on_disk.exclusive))
            .sum();
        Ok((cache.shared, space::free_bytes(&root)?, reserved))
    })
    .await
    .map_err(SpaceError::MeasureCache)?;
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
    let candidates = candidates(daemon).await?;
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

/// Each running hydration's snapshot directory with the bytes booked to it. What a directory
/// already holds on disk (preallocated files, resumed parts) is in the cache's use, so only the
/// rest of its booking is still to come.
fn reservations(daemon: &Daemon) -> Vec<(PathBuf, u64)> {
    let registry = daemon.registry();
    registry
        .datasets
        .iter()
        .filter_map(|(name, entry)| {
            let info = entry.flight.as_ref()?.info();
            let digest = info.snapshot.as_ref()?;
            Some((
                registry::snapshot_dir(&daemon.root, name, digest),
                info.reserved,
            ))
        })
        .collect()
}

/// Ready snapshots nothing pins, with what evicting each would free.
async fn candidates(daemon: &Arc<Daemon>) -> Result<Vec<Candidate>, SpaceError> {
    let now = registry::now_unix();
    let listed: Vec<(String, String, u64)> = {
        let registry = daemon.registry();
        registry
            .datasets
            .iter()
            .flat_map(|(name, entry)| {
                entry
                    .ready
                    .iter()
                    .map(move |(digest, ready)| (name.clone(), digest.clone(), ready.last_used))
            })
            .filter(|(name, digest, _)| !registry.pinned(name, digest, now))
            .collect()
    };
    let root = daemon.root.clone();
    blocking(move || {
        listed
            .into_iter()
            .map(|(dataset, digest, last_used)| {
                let frees =
                    space::usage(&registry::snapshot_dir(&root, &dataset, &digest))?.exclusive;
                Ok(Candidate {
                    dataset,
                    digest,
                    last_used,
                    frees,
                })
            })
            .collect()
    })
    .await
    .map_err(SpaceError::MeasureSnapshots)
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
        if entry.current.as_deref() == Some(digest.as_str()) {
            entry.current = entry
                .ready
                .iter()
                .max_by_key(|(_, r)| r.last_used)
                .map(|(d, _)| d.clone());
            entry.checked_at = None;
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
    let _ = daemon.save_state(); // logged; the next change writes again
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
