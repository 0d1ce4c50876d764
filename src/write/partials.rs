//! The partial files this run holds allocated, so that a run stopped by a full disk gives back
//! the room it reserved and never wrote: a node's shared disk is then not left 100 % full by a
//! run that cannot finish anyway.
//!
//! Large files are preallocated whole when their download starts (`fallocate`), so a stopped
//! run would otherwise keep every in-flight file's full size. On release, the ranges of parts
//! this run neither resumed nor received are punched out (`FALLOC_FL_PUNCH_HOLE`, the size
//! kept); parts already written keep their bytes, whether the checkpointer has recorded them
//! as durable yet or not, so the next run resumes them. A file with no part written is removed.
//!
//! Only ranges nothing was written to are punched, and only once the object's task has ended
//! (aborted or failed): no later write or durability record can then name a punched range.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use rustix::fs::FallocateFlags;

use crate::fs::Dir;

/// Partial files held by object downloads, by registration.
#[derive(Default)]
pub(crate) struct Partials {
    held: Mutex<HashMap<u64, Held>>,
    next: AtomicU64,
}

struct Held {
    dir: Arc<Dir>,
    name: String,
    file: Arc<File>,
    size: u64,
    part_size: u64,
    /// Parts that hold their bytes: resumed, or received by this run.
    written: BTreeSet<u32>,
}

/// One download's partial file, registered until [`Holding::done`].
pub(crate) struct Holding {
    partials: Arc<Partials>,
    id: u64,
}

/// What [`Partials::release_unwritten`] gave back.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Released {
    pub files: u64,
    pub bytes: u64,
}

impl Partials {
    /// Registers `name` in `dir`, open as `file`, `size` bytes in parts of `part_size`, of
    /// which `written` already hold their bytes.
    pub(crate) fn hold(
        self: &Arc<Self>,
        dir: Arc<Dir>,
        name: String,
        file: Arc<File>,
        (size, part_size): (u64, u64),
        written: impl IntoIterator<Item = u32>,
    ) -> Holding {
        let id = self.next.fetch_add(1, Relaxed);
        let held = Held {
            dir,
            name,
            file,
            size,
            part_size,
            written: written.into_iter().collect(),
        };
        self.lock().insert(id, held);
        Holding {
            partials: self.clone(),
            id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.held.lock().expect("partials lock")
    }

    /// Gives back the room of every registered file's unwritten parts. Call it only once the
    /// downloads holding them have ended.
    pub(crate) fn release_unwritten(&self) -> Released {
        let held: Vec<Held> = self.lock().drain().map(|(_, held)| held).collect();
        let mut released = Released::default();
        for held in held {
            match held.release() {
                Ok(0) => {}
                Ok(bytes) => {
                    released.files += 1;
                    released.bytes += bytes;
                }
                Err(err) => tracing::warn!("giving back the room of {}: {err}", held.name),
            }
        }
        released
    }
}

impl Holding {
    /// Part `index` holds its bytes.
    pub(crate) fn written(&self, index: u32) {
        if let Some(held) = self.partials.lock().get_mut(&self.id) {
            held.written.insert(index);
        }
    }

    /// The download no longer holds the file: it is whole, or its task removed or kept it as
    /// it should be.
    pub(crate) fn done(self) {
        self.partials.lock().remove(&self.id);
    }
}

impl Held {
    /// Punches the unwritten parts out of the file, or removes it when none is written;
    /// returns the bytes given back.
    fn release(&self) -> io::Result<u64> {
        if self.written.is_empty() {
            let allocated = allocated_bytes(&self.file)?;
            match self.dir.unlink(&self.name) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(0),
                Err(err) => return Err(err),
            }
            // Its descriptor here keeps the blocks until it is closed; punching frees them now.
            punch(&self.file, 0, self.size)?;
            return Ok(allocated);
        }
        let before = allocated_bytes(&self.file)?;
        let parts = self.size.div_ceil(self.part_size.max(1));
        for index in 0..parts {
            if self.written.contains(&(index as u32)) {
                continue;
            }
            let start = index * self.part_size;
            let len = self.part_size.min(self.size - start);
            punch(&self.file, start, len)?;
        }
        Ok(before.saturating_sub(allocated_bytes(&self.file)?))
    }
}

/// Deallocates `len` bytes at `offset`, keeping the size; a filesystem without holes (it did
/// not preallocate either) has nothing to give back.
fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    match rustix::fs::fallocate(file, flags, offset, len) {
        Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
        other => Ok(other?),
    }
}

/// Bytes allocated to `file` on disk.
fn allocated_bytes(file: &File) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(file.metadata()?.blocks() * 512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::OFlags;

    #[test]
    fn unwritten_parts_are_punched_and_written_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open(root.path()).unwrap());
        let (part, size) = (64u64 << 10, 4 * (64u64 << 10));
        let file = dir
            .open_file("x.partial", OFlags::RDWR | OFlags::CREATE)
            .unwrap();
        crate::fs::allocate(&file, size).unwrap();
        let data = vec![7u8; part as usize];
        std::os::unix::fs::FileExt::write_all_at(&file, &data, part).unwrap();
        let before = allocated_bytes(&file).unwrap();
        let partials = Arc::new(Partials::default());
        let held = partials.hold(
            dir.clone(),
            "x.partial".into(),
            Arc::new(file),
            (size, part),
            [],
        );
        held.written(1);
        let released = partials.release_unwritten();
        let path = root.path().join("x.partial");
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(after.len(), size, "the size is kept for a resume");
        if before >= size {
            assert_eq!(released.bytes, 3 * part, "{released:?}");
        }
        let back = std::fs::read(&path).unwrap();
        assert!(back[part as usize..2 * part as usize]
            .iter()
            .all(|&b| b == 7));
        assert!(back[..part as usize].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_file_with_no_part_written_is_removed_and_a_done_one_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open(root.path()).unwrap());
        let partials = Arc::new(Partials::default());
        for name in ["empty.partial", "whole.partial"] {
            let file = dir.open_file(name, OFlags::RDWR | OFlags::CREATE).unwrap();
            crate::fs::allocate(&file, 1 << 20).unwrap();
            let held = partials.hold(
                dir.clone(),
                name.into(),
                Arc::new(file),
                (1 << 20, 1 << 18),
                [],
            );
            if name == "whole.partial" {
                held.done();
            }
        }
        let released = partials.release_unwritten();
        assert_eq!(released.files, 1);
        assert!(!root.path().join("empty.partial").exists());
        assert!(root.path().join("whole.partial").exists());
        assert_eq!(partials.release_unwritten(), Released::default());
    }
}
