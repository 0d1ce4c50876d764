//! Walks DEST without ever following a symlink: directories are opened with
//! `openat(O_NOFOLLOW | O_DIRECTORY)` relative to their parent and read through their own
//! descriptor, so a symlink swapped in mid-walk is seen as an entry, never entered. The state
//! directory `.hydrator/` is not visited.
//!
//! Entries come in ascending byte order of their paths (a directory's entries sorted with a
//! `/` after each directory's name), the manifest's key order, so a walk can be checked
//! against the manifest's base with a forward cursor.

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

/// Calls `visit` for every non-directory entry under DEST (files, symlinks, others), in
/// ascending path order. With
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
    let mut entries = dir.entries()?;
    entries.sort_unstable_by(|(a, a_dir), (b, b_dir)| {
        path_order(a, *a_dir).cmp(path_order(b, *b_dir))
    });
    for (name, is_dir) in entries {
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

/// The bytes by which an entry sorts among its siblings: a directory's paths all continue
/// with `/`.
fn path_order(name: &str, is_dir: bool) -> impl Iterator<Item = u8> + '_ {
    name.bytes().chain(is_dir.then_some(b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_come_in_byte_order() {
        let root = tempfile::tempdir().unwrap();
        let files = [
            "a-b", "a.b", "a/x", "a/x.y", "a0", "b/c/d", "b/c-d", "b0", "é",
        ];
        for file in files {
            let path = root.path().join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"").unwrap();
        }
        let dest = Dest::open(root.path()).unwrap();
        let mut walked = Vec::new();
        walk(&dest, false, &mut |entry| {
            walked.push(entry.path.to_string());
            Ok(())
        })
        .unwrap();
        let mut sorted = files.map(String::from).to_vec();
        sorted.sort();
        assert_eq!(walked, sorted);
    }
}
