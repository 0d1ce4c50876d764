//! Walks DEST without ever following a symlink: directories are opened with
//! `openat(O_NOFOLLOW | O_DIRECTORY)` relative to their parent and read through their own
//! descriptor, so a symlink swapped in mid-walk is seen as an entry, never entered. The state
//! directory `.hydrator/` is not visited.

use std::io;

use super::dest::Dest;
use crate::fs::Dir;
use crate::plan::keys::STATE_DIR;

/// An entry that is not a directory.
pub(crate) struct Entry<'a> {
    /// The directory holding it.
    pub dir: &'a Dir,
    pub name: &'a str,
    /// Path relative to DEST.
    pub path: &'a str,
}

/// Calls `visit` for every non-directory entry under DEST (files, symlinks, others). With
/// `remove_empty_dirs`, directories left empty afterwards are removed.
pub(crate) fn walk(
    dest: &Dest,
    remove_empty_dirs: bool,
    visit: &mut dyn FnMut(Entry<'_>) -> io::Result<()>,
) -> io::Result<()> {
    walk_dir(dest.root(), "", remove_empty_dirs, visit)
}

fn walk_dir(
    dir: &Dir,
    prefix: &str,
    remove_empty_dirs: bool,
    visit: &mut dyn FnMut(Entry<'_>) -> io::Result<()>,
) -> io::Result<()> {
    for (name, is_dir) in dir.entries()? {
        if prefix.is_empty() && name == STATE_DIR {
            continue;
        }
        let path = format!("{prefix}{name}");
        // A directory replaced by something else since it was read is visited as an entry.
        match is_dir.then(|| dir.open_dir(&name)) {
            Some(Ok(child)) => {
                walk_dir(&child, &format!("{path}/"), remove_empty_dirs, visit)?;
                if remove_empty_dirs {
                    // Fails harmlessly when not empty.
                    let _ = dir.remove_dir(&name);
                }
            }
            _ => visit(Entry {
                dir,
                name: &name,
                path: &path,
            })?,
        }
    }
    Ok(())
}
