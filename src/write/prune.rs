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
use super::walk::{walk, Entry};
use crate::manifest::Manifest;
use crate::plan::filter::KeyFilter;
use crate::plan::keys::is_partial_name;

/// Removes unlisted files; returns how many. `prefix` is the source prefix: a file's key is
/// `prefix` followed by its path.
pub(crate) fn remove_unlisted(
    dest: &Dest,
    manifest: &Manifest,
    filter: &KeyFilter,
    prefix: &str,
) -> io::Result<u64> {
    let removed = walk_unlisted(dest, manifest, filter, prefix, true, &mut |entry| {
        tracing::info!(
            path = entry.path,
            "--delete: removing a file that is not in the source"
        );
        entry.dir.unlink(entry.name)
    })?;
    dest.syncer()?.sync()?;
    Ok(removed)
}

/// Counts the files in scope that are not part of the source (put into DEST by something else,
/// or left by another dataset): what `--delete` would remove, but for hydrator's own leftover
/// `.partial` files, which it removes too and which are no one else's.
pub(crate) fn count_unlisted(
    dest: &Dest,
    manifest: &Manifest,
    filter: &KeyFilter,
    prefix: &str,
) -> io::Result<u64> {
    let mut foreign = 0;
    walk_unlisted(dest, manifest, filter, prefix, false, &mut |entry| {
        foreign += u64::from(!is_partial_name(entry.name));
        Ok(())
    })?;
    Ok(foreign)
}

/// Calls `each` on every file in scope whose key the manifest's base does not hold; removes
/// directories left empty when `remove_empty_dirs`.
fn walk_unlisted(
    dest: &Dest,
    manifest: &Manifest,
    filter: &KeyFilter,
    prefix: &str,
    remove_empty_dirs: bool,
    each: &mut dyn FnMut(&Entry) -> io::Result<()>,
) -> io::Result<u64> {
    let mut base = manifest.cursor()?;
    let mut found = 0;
    walk(dest, remove_empty_dirs, &mut |entry| {
        if !filter.accepts(entry.path) || base.find(&format!("{prefix}{}", entry.path))?.is_some() {
            return Ok(());
        }
        each(&entry)?;
        found += 1;
        Ok(())
    })?;
    Ok(found)
}
