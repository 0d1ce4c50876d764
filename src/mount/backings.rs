//! Which passthrough backing file the kernel holds for each inode of a view, written down as it
//! changes, so that a later process serving the same view (the CSI plugin after a restart,
//! [`super::resume`]) answers each inode with the backing the kernel already holds.
//!
//! Why it is needed: the kernel binds a backing file to an inode for as long as a file of that
//! inode is open through passthrough, and fails (EIO) any open of the inode answered with
//! another backing. Backing ids belong to the connection, not to the process that registered
//! them, so they outlive a killed plugin; only the plugin's memory of them does not. So every
//! id registered is appended here (inode, id), and every id closed is appended as id 0 before
//! it is closed: a record lost to a kill in between leaves an id registered that nothing names,
//! which costs a little kernel memory and nothing else.
//!
//! Twelve bytes a record, written with one `write` to a file opened for appending: a kill -9
//! loses nothing written (the page cache is the kernel's). A later process reads the records,
//! keeps the last of each inode, and starts the file again with just those.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use crate::fs::write_atomic_path;

const RECORD: usize = 12;

pub(crate) struct BackingJournal {
    path: PathBuf,
    file: Mutex<File>,
    /// Backing ids of earlier processes, by inode, not yet taken by an open of this one.
    inherited: Mutex<HashMap<u64, u32>>,
    /// Whether a failed write was said (once).
    told: AtomicBool,
}

impl BackingJournal {
    /// The journal of a view mounted afresh: nothing inherited.
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        write_atomic_path(path, |_| Ok(()))?;
        Self::open(path, HashMap::new())
    }

    /// The journal of a view served again: what earlier processes registered and did not close.
    pub(crate) fn reopen(path: &Path) -> io::Result<Self> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(err),
        };
        let inherited = replay(&bytes);
        write_atomic_path(path, |file| {
            inherited
                .iter()
                .try_for_each(|(&ino, &id)| file.write_all(&record(ino, id)))
        })?;
        Self::open(path, inherited)
    }

    fn open(path: &Path, inherited: HashMap<u64, u32>) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new().append(true).open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            inherited: Mutex::new(inherited),
            told: AtomicBool::new(false),
        })
    }

    /// The backing id an earlier process registered for `ino`, now this process's to use (and
    /// to close).
    pub(crate) fn take_inherited(&self, ino: u64) -> Option<u32> {
        (self.inherited.lock())
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&ino)
    }

    /// Whether an earlier process left backings that this one has not taken: files may be open
    /// through them that this process knows nothing of.
    pub(crate) fn has_inherited(&self) -> bool {
        !(self.inherited.lock())
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_empty()
    }

    /// `id` was registered for `ino`.
    pub(crate) fn registered(&self, ino: u64, id: u32) {
        self.append(ino, id);
    }

    /// The backing of `ino` is about to be closed.
    pub(crate) fn closing(&self, ino: u64) {
        self.append(ino, 0);
    }

    fn append(&self, ino: u64, id: u32) {
        let written = (self.file.lock())
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .write_all(&record(ino, id));
        if let Err(err) = written {
            if !self.told.swap(true, Relaxed) {
                tracing::warn!(
                    "writing {}: {err}; after a restart of the plugin, a file open meanwhile may fail its next opens (EIO)",
                    self.path.display()
                );
            }
        }
    }
}

fn record(ino: u64, id: u32) -> [u8; RECORD] {
    let mut record = [0; RECORD];
    record[..8].copy_from_slice(&ino.to_le_bytes());
    record[8..].copy_from_slice(&id.to_le_bytes());
    record
}

/// The last id of each inode, without the closed ones (a torn last record is ignored).
fn replay(bytes: &[u8]) -> HashMap<u64, u32> {
    let mut ids = HashMap::new();
    for record in bytes.chunks_exact(RECORD) {
        let ino = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
        let id = u32::from_le_bytes(record[8..].try_into().expect("4 bytes"));
        match id {
            0 => ids.remove(&ino),
            id => ids.insert(ino, id),
        };
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_process_inherits_the_last_open_id_of_each_inode_and_no_closed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol.backings");
        let first = BackingJournal::create(&path).unwrap();
        first.registered(7, 1);
        first.registered(9, 2);
        first.closing(7);
        first.registered(7, 3);
        first.registered(11, 4);
        first.closing(11);
        drop(first);
        // A torn record at the end, as a kill in the middle of a write could leave.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&[1, 2, 3])
            .unwrap();
        let second = BackingJournal::reopen(&path).unwrap();
        assert_eq!(second.take_inherited(7), Some(3));
        assert_eq!(second.take_inherited(7), None, "taken once");
        assert_eq!(second.take_inherited(11), None, "closed");
        second.registered(12, 5);
        drop(second);
        // Compacted, then appended to: a third process sees what the second left.
        let third = BackingJournal::reopen(&path).unwrap();
        assert_eq!(third.take_inherited(9), Some(2));
        assert_eq!(third.take_inherited(12), Some(5));
        assert_eq!(third.take_inherited(7), Some(3), "not closed by the second");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * RECORD as u64);
    }

    #[test]
    fn a_view_mounted_afresh_inherits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol.backings");
        std::fs::write(&path, record(7, 1)).unwrap();
        let fresh = BackingJournal::create(&path).unwrap();
        assert_eq!(fresh.take_inherited(7), None);
    }
}
