//! `--delete`: after a complete run, remove local files that are not part of the source.
//!
//! Kept: every file this run mirrored or found up to date, and every path the filters exclude
//! (outside the run's scope, like `rclone sync` without `--delete-excluded`). Removed: anything
//! else under DEST (files, symlinks themselves, leftover `.partial` files) and directories left
//! empty. Never followed: symlinks; never touched: `.hydrator/`.
//!
//! It runs after the manifest's fold has dropped the objects in scope that the run did not
//! list, so a file in scope is kept exactly when the base holds its key. DEST is walked in
//! ascending path order, which is the base's key order, and checked against it with a cursor.

use std::io;

use super::dest::Dest;
use super::walk::walk;
use crate::manifest::Manifest;
use crate::plan::filter::KeyFilter;

/// Removes unlisted files; returns how many. `prefix` is the source prefix: a file's key is
/// `prefix` followed by its path.
pub(crate) fn remove_unlisted(
    dest: &Dest,
    manifest: &Manifest,
    filter: &KeyFilter,
    prefix: &str,
) -> io::Result<u64> {
    let mut base = manifest.cursor()?;
    let mut removed = 0;
    walk(dest, true, &mut |entry| {
        if !filter.accepts(entry.path) || base.find(&format!("{prefix}{}", entry.path))?.is_some() {
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
    dest.syncer()?.sync()?;
    Ok(removed)
}
