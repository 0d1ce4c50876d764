//! Rebuilding the registry from the cache root when the daemon starts: a snapshot directory
//! whose READY names its digest is ready; one without READY is an interrupted hydration,
//! resumed from its manifest when its snapshot file is there and its dataset is still in the
//! catalog, and removed otherwise. Leases that have not expired are honoured.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::catalog::Catalog;
use super::evict;
use super::registry::{self, ReadySnapshot, Registry, DAEMON_DIR};
use crate::manifest::ready;
use crate::snapshot::Snapshot;
use crate::write::dest::Dest;

/// Interrupted hydrations to resume: dataset name and its snapshot.
pub(crate) type Resumable = Vec<(String, Arc<Snapshot>)>;

/// The registry found on disk, and the hydrations to resume.
pub(crate) fn scan(root: &Path, catalog: &Catalog) -> io::Result<(Registry, Resumable)> {
    std::fs::create_dir_all(root.join(DAEMON_DIR))?;
    registry::restrict(root, registry::PASSAGE_MODE)?;
    registry::restrict(&root.join(DAEMON_DIR), 0o700)?;
    evict::empty_trash(root)?;
    let mut registry = Registry::default();
    let had_state = registry::state_file_exists(root);
    let loaded = registry::load(root);
    let leases_known = loaded.is_some();
    let persisted = loaded.unwrap_or_default();
    let mut resume = Vec::new();
    for dataset_dir in std::fs::read_dir(root)? {
        let dataset_dir = dataset_dir?;
        let name = dataset_dir.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !dataset_dir.file_type()?.is_dir() {
            continue;
        }
        registry::restrict(&dataset_dir.path(), registry::PASSAGE_MODE)?;
        let mut newest: Option<(String, String)> = None;
        for snapshot_dir in std::fs::read_dir(dataset_dir.path())? {
            let snapshot_dir = snapshot_dir?;
            let digest = snapshot_dir.file_name().to_string_lossy().into_owned();
            if !snapshot_dir.file_type()?.is_dir() || !crate::snapshot::is_digest(&digest) {
                continue;
            }
            match ready_marker(root, &snapshot_dir.path())
                .filter(|r| r.snapshot.as_deref() == Some(&digest))
            {
                Some(marker) => {
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
                None => match resumable(root, catalog, &name, &digest) {
                    Some(snapshot) if !resume.iter().any(|(n, _)| *n == name) => {
                        resume.push((name.clone(), snapshot))
                    }
                    _ => {
                        tracing::info!(dataset = %name, "removing the incomplete snapshot {digest}");
                        evict::remove_snapshot(root, &name, &digest)?;
                    }
                },
            }
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
    let deleted = !had_state && !registry.datasets.is_empty();
    if deleted {
        tracing::error!(
            "no state file beside ready snapshots: their leases are unknown, so nothing is evicted for the longest lease time"
        );
    }
    if !leases_known || deleted {
        registry.leases_unknown_until =
            Some(registry::now_unix() + catalog.cache.max_lease_ttl.as_secs());
    }
    let now = registry::now_unix();
    for lease in persisted.leases {
        // A lazy view's lease pins a snapshot still hydrating: it is resumed.
        let held = registry
            .datasets
            .get(&lease.dataset)
            .is_some_and(|e| e.ready.contains_key(&lease.snapshot))
            || resume
                .iter()
                .any(|(name, s)| *name == lease.dataset && s.digest == lease.snapshot);
        if held && lease.expires_at > now {
            registry
                .leases
                .insert((lease.dataset.clone(), lease.holder.clone()), lease);
        }
    }
    Ok((registry, resume))
}

fn ready_marker(root: &Path, dir: &Path) -> Option<ready::Ready> {
    let dest = Dest::open_beneath(root, dir).ok()?;
    ready::read(&dest.state_dir().ok()?)
}

/// The snapshot an interrupted hydration of a catalog dataset was working on.
fn resumable(root: &Path, catalog: &Catalog, name: &str, digest: &str) -> Option<Arc<Snapshot>> {
    let dataset = catalog.datasets.get(name)?;
    let snapshot = crate::snapshot::read(&registry::snapshot_file(root, name, digest)).ok()?;
    let same_source =
        snapshot.bucket == dataset.source.bucket && snapshot.prefix == dataset.source.prefix;
    (same_source && snapshot.digest == digest).then(|| Arc::new(snapshot))
}
