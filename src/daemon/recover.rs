//! Rebuilding the registry from the cache root when the daemon starts: a snapshot directory
//! whose READY names its digest is ready; one without READY is an interrupted hydration.
//!
//! An interrupted hydration that an unexpired lease pins (a lazy view reads it) is never
//! removed, however many newer snapshots its dataset has: it is resumed from its manifest and
//! snapshot file, pinned to the versions and ETags frozen there, and when it cannot be resumed
//! (its dataset left the catalog, its snapshot file is unreadable) it stays on disk, its
//! landed files served and its condition `failed` with why. The newest one (by its snapshot
//! file), leased or not, is the dataset's refresh and resumes last; older unleased ones are
//! removed. While the leases are unknown (no readable state file), none is removed. Leases that
//! have not expired are honoured.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use super::catalog::Catalog;
use super::evict;
use super::protocol::Condition;
use super::registry::{
    self, DatasetEntry, ReadySnapshot, Registry, Resume, Unfinished, DAEMON_DIR,
};
use crate::error::UsageError;
use crate::manifest::ready;
use crate::snapshot::Snapshot;
use crate::write::dest::Dest;

/// The registry found on disk; the hydrations to resume wait in each dataset's `queued`.
pub(crate) fn scan(root: &Path, catalog: &Catalog) -> io::Result<Registry> {
    std::fs::create_dir_all(root.join(DAEMON_DIR))?;
    registry::restrict(root, registry::PASSAGE_MODE)?;
    registry::restrict(&root.join(DAEMON_DIR), 0o700)?;
    evict::empty_trash(root)?;
    let mut registry = Registry::default();
    let had_state = registry::state_file_exists(root);
    let loaded = registry::load(root);
    let leases_known = loaded.is_some();
    let persisted = loaded.unwrap_or_default();
    let now = registry::now_unix();
    let leased: BTreeSet<(&str, &str)> = (persisted.leases.iter())
        .filter(|lease| lease.expires_at > now)
        .map(|lease| (lease.dataset.as_str(), lease.snapshot.as_str()))
        .collect();
    let maybe_leased =
        |name: &str, digest: &str| !leases_known || !had_state || leased.contains(&(name, digest));
    for dataset_dir in std::fs::read_dir(root)? {
        let dataset_dir = dataset_dir?;
        let name = dataset_dir.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !dataset_dir.file_type()?.is_dir() {
            continue;
        }
        registry::restrict(&dataset_dir.path(), registry::PASSAGE_MODE)?;
        let mut newest: Option<(String, String)> = None;
        let mut incomplete = Vec::new();
        for snapshot_dir in std::fs::read_dir(dataset_dir.path())? {
            let snapshot_dir = snapshot_dir?;
            let digest = snapshot_dir.file_name().to_string_lossy().into_owned();
            if !snapshot_dir.file_type()?.is_dir() || !crate::snapshot::is_digest(&digest) {
                continue;
            }
            let Some(marker) = ready_marker(root, &snapshot_dir.path())
                .filter(|r| r.snapshot.as_deref() == Some(&digest))
            else {
                incomplete.push(digest);
                continue;
            };
            let last_used = persisted
                .last_used
                .get(&format!("{name}/{digest}"))
                .copied()
                .unwrap_or_else(registry::now_unix);
            let entry = registry.datasets.entry(name.clone()).or_default();
            entry.ready.insert(
                digest.clone(),
                ReadySnapshot {
                    objects: marker.objects,
                    bytes: marker.bytes,
                    last_used,
                },
            );
            if newest
                .as_ref()
                .is_none_or(|(at, _)| *at < marker.completed_at)
            {
                newest = Some((marker.completed_at, digest));
            }
        }
        if !incomplete.is_empty() {
            let entry = registry.datasets.entry(name.clone()).or_default();
            sort_incomplete(root, catalog, entry, &name, incomplete, |digest| {
                maybe_leased(&name, digest)
            })?;
        }
        if let Some((completed_at, digest)) = newest {
            // Served at once, before any listing (the store may be down): it counts as checked
            // now, so the source is listed again one refresh interval from now.
            let entry = registry.datasets.entry(name).or_default();
            entry.current = Some(digest);
            entry.checked_at = Some(std::time::Instant::now());
            entry.refreshed_at = Some(completed_at);
        }
    }
    // No readable state, or none at all beside ready snapshots (it was deleted): the leases that
    // pin them, a mounted volume's among them, are unknown, so nothing is evicted for the
    // longest lease time (the CSI plugin renews its own meanwhile).
    let deleted = !had_state && registry.datasets.values().any(|e| !e.ready.is_empty());
    if deleted {
        tracing::error!(
            "no state file beside ready snapshots: their leases are unknown, so nothing is evicted for the longest lease time"
        );
    }
    if !leases_known || deleted {
        registry.leases_unknown_until =
            Some(registry::now_unix() + catalog.cache.max_lease_ttl.as_secs());
    }
    for lease in persisted.leases {
        let held = registry.condition(&lease.dataset, &lease.snapshot) != Condition::Gone;
        if held && lease.expires_at > now {
            registry
                .leases
                .insert((lease.dataset.clone(), lease.holder.clone()), lease);
        }
    }
    Ok(registry)
}

/// Sorts the interrupted hydrations `digests` of `name` into `entry`: the newest one that can
/// be resumed (by its snapshot file) is the dataset's refresh, resumed last; the older leased
/// ones are resumed before it, oldest first, for their leases alone; a leased one that cannot be
/// resumed is kept as unfinished; the others are removed.
fn sort_incomplete(
    root: &Path,
    catalog: &Catalog,
    entry: &mut DatasetEntry,
    name: &str,
    digests: Vec<String>,
    leased: impl Fn(&str) -> bool,
) -> io::Result<()> {
    let mut found: Vec<(SystemTime, Arc<Snapshot>)> = Vec::new();
    for digest in digests {
        match resumable(root, catalog, name, &digest) {
            Ok(snapshot) => {
                let file = registry::snapshot_file(root, name, &digest);
                let at = std::fs::metadata(file).and_then(|m| m.modified());
                found.push((at.unwrap_or(SystemTime::UNIX_EPOCH), snapshot));
            }
            Err(why) if leased(&digest) => {
                let reason = format!("its hydration cannot be resumed: {why}");
                tracing::error!(dataset = %name, "keeping the leased snapshot {digest}: {reason}");
                let unfinished = Unfinished {
                    reason,
                    schedule: None,
                };
                entry.unfinished.insert(digest, unfinished);
            }
            Err(_) => remove(root, name, &digest)?,
        }
    }
    found.sort_by_key(|(at, _)| *at);
    let newest = found.pop();
    for (_, snapshot) in found {
        match leased(&snapshot.digest) {
            true => entry.queued.push_back(Resume {
                snapshot,
                for_lease: true,
            }),
            false => remove(root, name, &snapshot.digest)?,
        }
    }
    if let Some((_, snapshot)) = newest {
        entry.queued.push_back(Resume {
            snapshot,
            for_lease: false,
        });
    }
    Ok(())
}

fn remove(root: &Path, name: &str, digest: &str) -> io::Result<()> {
    tracing::info!(dataset = %name, "removing the incomplete snapshot {digest}");
    evict::remove_snapshot(root, name, digest)
}

fn ready_marker(root: &Path, dir: &Path) -> Option<ready::Ready> {
    let dest = Dest::open_beneath(root, dir).ok()?;
    ready::read(&dest.state_dir().ok()?)
}

/// Why an interrupted hydration cannot be resumed.
#[derive(Debug, thiserror::Error)]
enum NotResumable {
    #[error("the dataset is not in the catalog any more")]
    NotInCatalog,
    #[error("its snapshot file: {0}")]
    SnapshotFile(#[from] UsageError),
    #[error("its snapshot file is of another source or digest")]
    Mismatch,
}

/// The snapshot an interrupted hydration of a catalog dataset was working on.
fn resumable(
    root: &Path,
    catalog: &Catalog,
    name: &str,
    digest: &str,
) -> Result<Arc<Snapshot>, NotResumable> {
    let dataset = catalog
        .datasets
        .get(name)
        .ok_or(NotResumable::NotInCatalog)?;
    let snapshot = crate::snapshot::read(&registry::snapshot_file(root, name, digest))?;
    let same_source =
        snapshot.bucket == dataset.source.bucket && snapshot.prefix == dataset.source.prefix;
    match same_source && snapshot.digest == digest {
        true => Ok(Arc::new(snapshot)),
        false => Err(NotResumable::Mismatch),
    }
}
