//! `--delete`: after a complete run, remove local files that are not part of the source.
//!
//! Kept: every file this run mirrored or found up to date, and every path the filters exclude
//! (outside the run's scope, like `rclone sync` without `--delete-excluded`). Removed: anything
//! else under DEST (files, symlinks themselves, leftover `.partial` files) and directories left
//! empty. Never followed: symlinks; never touched: `.hydrator/`.

use std::collections::HashSet;
use std::io;

use super::dest::Dest;
use super::walk::walk;
use crate::manifest::Manifest;
use crate::plan::filter::KeyFilter;

/// Removes unlisted files; returns how many. Manifest entries of objects in the run's scope
/// that it did not list are forgotten.
pub(crate) fn remove_unlisted(
    dest: &Dest,
    manifest: &Manifest,
    filter: &KeyFilter,
) -> io::Result<u64> {
    let (keep, stale): (HashSet<String>, Vec<String>) = {
        let state = manifest.state();
        let keep = state
            .objects
            .values()
            .filter(|o| o.seen)
            .map(|o| o.path.clone())
            .collect();
        let stale = state
            .objects
            .iter()
            .filter(|(_, o)| !o.seen && filter.accepts(&o.path))
            .map(|(k, _)| k.clone())
            .collect();
        (keep, stale)
    };
    for key in stale {
        manifest.forget(&key)?;
    }
    let mut removed = 0;
    walk(dest, true, &mut |entry| {
        if keep.contains(entry.path) || !filter.accepts(entry.path) {
            return Ok(());
        }
        tracing::info!(
            path = entry.path,
            "--delete: removing a file that is not in the source"
        );
        entry.dir.unlink(entry.name)?;
        removed += 1;
        Ok(())
    })?;
    manifest.sync()?;
    dest.syncer()?.sync()?;
    Ok(removed)
}
