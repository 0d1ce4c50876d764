//! DEST as a directory handle. Every path under it is reached one component at a time through
//! [`fs::Dir`] (`openat(O_NOFOLLOW)`, `mkdirat`), so a symlink planted inside DEST (a shared
//! hostPath cache, say) can never redirect a write outside it: a component that is a symlink
//! or a file is an error for that key, never followed.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::buffer::DIRECT_IO_ALIGN;
use crate::config::DirectIo;
use crate::error::WriteError;
use crate::fs::{self, Dir, FileStat, OFlags};
use crate::plan::keys::{RelPath, STATE_DIR};
use crate::units::human_bytes;

/// An open DEST directory.
pub(crate) struct Dest {
    root: Dir,
    path: PathBuf,
}

/// `ENOTDIR`/`ELOOP` from an `O_NOFOLLOW` open, said plainly.
fn not_followed(path: &Path, err: io::Error) -> io::Error {
    let refused = [rustix::io::Errno::NOTDIR, rustix::io::Errno::LOOP]
        .map(|e| Some(e.raw_os_error()))
        .contains(&err.raw_os_error());
    match refused {
        true => io::Error::new(
            err.kind(),
            format!(
                "{} is a symlink or a file, not a directory: refused",
                path.display()
            ),
        ),
        false => err,
    }
}

fn resumable_size(on_disk: u64, size: u64, direct_io: bool) -> bool {
    on_disk == size || (direct_io && on_disk == size.next_multiple_of(DIRECT_IO_ALIGN as u64))
}

/// Which files a run writes with O_DIRECT: `--direct-io` resolved against DEST's filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirectWrites {
    /// Files larger than a write buffer (written part by part).
    pub large: bool,
    /// Files that fit one write buffer.
    pub small: bool,
}

impl DirectWrites {
    pub(crate) fn resolve(choice: DirectIo, dest: &Dest) -> Self {
        match choice {
            DirectIo::Always => Self {
                large: true,
                small: true,
            },
            DirectIo::Never => Self {
                large: false,
                small: false,
            },
            DirectIo::Auto => Self {
                large: dest.takes_direct_io(),
                small: false,
            },
        }
    }
}

impl std::fmt::Display for DirectWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (self.large, self.small) {
            (true, true) => "O_DIRECT for every file",
            (true, false) => "O_DIRECT for files larger than a write buffer",
            (false, true) => "O_DIRECT for files that fit a write buffer",
            (false, false) => "through the page cache",
        })
    }
}

fn with_direct(flags: OFlags, direct_io: bool) -> OFlags {
    if direct_io {
        flags | OFlags::DIRECT
    } else {
        flags
    }
}

impl Dest {
    /// Creates DEST if needed and opens it. DEST itself may be a symlink the user chose.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(path)?;
        Ok(Self {
            root: Dir::open(path)?,
            path: path.to_path_buf(),
        })
    }

    /// Creates DEST if needed and opens it, where DEST lies in `anchor`: each directory between
    /// them is made and opened with `mkdirat` and `O_NOFOLLOW`, so none of them can be a
    /// symlink (`ELOOP`/`ENOTDIR`). `anchor` itself may be one.
    pub(crate) fn open_beneath(anchor: &Path, path: &Path) -> io::Result<Self> {
        let below = path.strip_prefix(anchor).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not in {}", path.display(), anchor.display()),
            )
        })?;
        let mut dir = Dir::open(anchor)?;
        let mut reached = anchor.to_path_buf();
        for part in below.components() {
            let std::path::Component::Normal(name) = part else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: only plain names below {}",
                        path.display(),
                        anchor.display()
                    ),
                ));
            };
            reached.push(name);
            dir.create_dir(name)?;
            dir = dir
                .open_dir(name)
                .map_err(|err| not_followed(&reached, err))?;
        }
        Ok(Self {
            root: dir,
            path: path.to_path_buf(),
        })
    }

    /// Opens DEST if it exists, creating nothing (`--dry-run`).
    pub(crate) fn open_existing(path: &Path) -> io::Result<Option<Self>> {
        match Dir::open(path) {
            Ok(root) => Ok(Some(Self {
                root,
                path: path.to_path_buf(),
            })),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (and with `create`, makes) the directory holding `rel`. `Ok(None)` when it does not
    /// exist and `create` is false.
    pub(crate) fn open_parent(&self, rel: &RelPath, create: bool) -> io::Result<Option<Dir>> {
        let mut dir = self.root.try_clone()?;
        for segment in rel.parents() {
            let next = match dir.open_dir(segment) {
                Err(err) if err.kind() == io::ErrorKind::NotFound && create => {
                    dir.create_dir(segment)?;
                    dir.open_dir(segment)
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
                other => other,
            };
            dir = next.map_err(|err| in_the_way(err, segment))?;
        }
        Ok(Some(dir))
    }

    /// Size, mtime and inode of the regular file at `rel`'s final name, if there is one.
    pub(crate) fn stat_final(&self, rel: &RelPath) -> io::Result<Option<FileStat>> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(None);
        };
        dir.stat_regular(rel.file_name())
    }

    /// Opens the file at `rel`'s final name for reading, never through a symlink.
    pub(crate) fn open_final(&self, rel: &RelPath) -> io::Result<Option<File>> {
        self.open_beside(rel, rel.file_name())
    }

    /// Opens `rel`'s `.NAME.partial` for reading (a lazy view's read of a file still
    /// downloading), never through a symlink.
    pub(crate) fn open_partial(&self, rel: &RelPath) -> io::Result<Option<File>> {
        self.open_beside(rel, &rel.partial_name())
    }

    /// Opens `name` in `rel`'s directory for reading, if it is there.
    fn open_beside(&self, rel: &RelPath, name: &str) -> io::Result<Option<File>> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(None);
        };
        match dir.open_file(name, OFlags::RDONLY) {
            Ok(file) => Ok(Some(file)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Reopens an earlier run's `.NAME.partial` to resume it, if it exists with `size` bytes.
    pub(crate) fn reopen_partial(
        &self,
        rel: &RelPath,
        direct_io: bool,
        size: u64,
    ) -> io::Result<Option<(Dir, File)>> {
        let Some(dir) = self.resumable_partial(rel, direct_io, size)? else {
            return Ok(None);
        };
        let file = dir.open_file(rel.partial_name(), with_direct(OFlags::WRONLY, direct_io))?;
        Ok(Some((dir, file)))
    }

    /// The directory holding `rel`'s `.NAME.partial` when that file can be resumed: it has
    /// `size` bytes and no other link.
    pub(crate) fn resumable_partial(
        &self,
        rel: &RelPath,
        direct_io: bool,
        size: u64,
    ) -> io::Result<Option<Dir>> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(None);
        };
        match dir.stat_regular(rel.partial_name())? {
            // A hard link planted at the partial name would make writes land in another file;
            // under O_DIRECT the last block may already be written padded.
            Some(stat) if stat.links == 1 && resumable_size(stat.size, size, direct_io) => {
                Ok(Some(dir))
            }
            _ => Ok(None),
        }
    }

    /// What would keep a file from being published at `rel`: a file or symlink where one of its
    /// directories should be, or a directory at its name.
    pub(crate) fn check_in_the_way(&self, rel: &RelPath) -> io::Result<()> {
        match self.open_parent(rel, false)? {
            Some(dir) if dir.is_dir(rel.file_name())? => Err(directory_in_the_way(rel.file_name())),
            _ => Ok(()),
        }
    }

    /// Whether `rel`'s `.NAME.partial` exists (as anything).
    pub(crate) fn has_partial(&self, rel: &RelPath) -> io::Result<bool> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(false);
        };
        dir.exists(rel.partial_name())
    }

    /// DEST's `.hydrator` state directory if there is one, creating nothing.
    pub(crate) fn existing_state_dir(&self) -> io::Result<Option<Dir>> {
        match self.root.open_dir(STATE_DIR) {
            Ok(dir) => Ok(Some(dir)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(in_the_way(err, STATE_DIR)),
        }
    }

    /// Opens (creating it if needed) DEST's `.hydrator` state directory, never through a symlink.
    pub(crate) fn state_dir(&self) -> io::Result<Dir> {
        self.root.create_dir(STATE_DIR)?;
        self.root
            .open_dir(STATE_DIR)
            .map_err(|err| in_the_way(err, STATE_DIR))
    }

    /// Whether DEST's filesystem takes O_DIRECT writes: an unnamed file (`O_TMPFILE`, gone
    /// when closed) is opened with it and written one aligned block.
    fn takes_direct_io(&self) -> bool {
        let probe = || -> io::Result<()> {
            let flags = OFlags::WRONLY | OFlags::TMPFILE | OFlags::DIRECT;
            let file = self.root.open_file(".", flags)?;
            let block = vec![0u8; 2 * DIRECT_IO_ALIGN];
            let start = block.as_ptr().align_offset(DIRECT_IO_ALIGN);
            file.write_all_at(&block[start..start + DIRECT_IO_ALIGN], 0)
        };
        probe()
            .inspect_err(|err| {
                let path = self.path.display();
                tracing::info!(
                    "{path} does not take O_DIRECT writes ({err}): writing through the page cache"
                );
            })
            .is_ok()
    }

    /// The DEST directory itself.
    pub(crate) fn root(&self) -> &Dir {
        &self.root
    }

    /// Creates `.NAME.partial` next to `rel`'s final name, replacing whatever was there
    /// (an earlier run's leftover, or a planted symlink) without following it. It is open for
    /// reading too: a file made from the peers' is hashed through this descriptor.
    pub(crate) fn create_partial(&self, rel: &RelPath, direct_io: bool) -> io::Result<(Dir, File)> {
        let dir = self
            .open_parent(rel, true)?
            .expect("open_parent with create returns a directory");
        let name = rel.partial_name();
        let flags = with_direct(OFlags::RDWR | OFlags::CREATE | OFlags::EXCL, direct_io);
        // O_EXCL never follows what is at the name; only when something is there (rare) does
        // it cost an unlink and a second open.
        let created = match dir.open_file(&name, flags) {
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                dir.unlink(&name)?;
                dir.open_file(&name, flags)
            }
            other => other,
        };
        let file = created.map_err(|err| {
            if direct_io && err.raw_os_error() == Some(libc::EINVAL) {
                io::Error::new(
                    err.kind(),
                    "this filesystem does not support O_DIRECT (--direct-io)",
                )
            } else {
                err
            }
        })?;
        Ok((dir, file))
    }

    /// A handle of its own for `syncfs` on DEST's filesystem.
    pub(crate) fn syncer(&self) -> io::Result<Syncer> {
        self.root.open_dir(".").map(Syncer)
    }
}

/// `syncfs` through a descriptor of its own: the kernel reports a write-back error once to each
/// open file description, so each party that must not miss one (the checkpointer, the
/// committer) keeps its own handle.
pub(crate) struct Syncer(Dir);

impl Syncer {
    /// Flushes every dirty page and inode of DEST's filesystem.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.0.sync_fs()
    }
}

/// Reserves `len` bytes for a file: fails fast on a full disk and avoids fragmentation.
/// Filesystems without fallocate (some network and overlay setups) just skip it.
pub(crate) fn preallocate(file: &File, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    match fs::allocate(file, len) {
        Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "the destination's filesystem is full: {} needed, {} free",
                human_bytes(len),
                fs::free_bytes(file).map_or_else(|e| format!("? ({e})"), human_bytes)
            ),
        )),
        other => other,
    }
}

/// A failed write, with the room left when the filesystem is full.
pub(crate) fn write_error(err: io::Error, file: &File) -> WriteError {
    match err.raw_os_error() {
        Some(libc::ENOSPC) => WriteError::Full {
            free: fs::free_bytes(file).ok(),
            source: err,
        },
        _ => WriteError::Io(err),
    }
}

/// Renames `.NAME.partial` to NAME inside `dir`. A directory at NAME is a key conflict.
pub(crate) fn publish(dir: &Dir, partial: &str, name: &str) -> io::Result<()> {
    dir.rename(partial, name)
        .map_err(|err| match err.raw_os_error() {
            Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST) => directory_in_the_way(name),
            _ => err,
        })
}

fn directory_in_the_way(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::IsADirectory,
        format!("a directory named {name:?} is in the way (another key uses it as a prefix)"),
    )
}

fn in_the_way(err: io::Error, segment: &str) -> io::Error {
    match err.raw_os_error() {
        Some(libc::ENOTDIR | libc::ELOOP) => io::Error::new(
            err.kind(),
            format!(
                "{segment:?} is a file or a symlink where a directory is needed (not followed)"
            ),
        ),
        _ => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::keys::{plan_key, KeyPlan};

    fn rel(key: &str) -> RelPath {
        match plan_key("", key, 1) {
            KeyPlan::File(p) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn direct_io_is_resolved_against_dest() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = Dest::open(tmp.path()).unwrap();
        let resolved = |choice| DirectWrites::resolve(choice, &dest);
        // ext4 and tmpfs (Linux ≥ 6.6) take O_DIRECT: the probe must say so.
        let auto = DirectWrites {
            large: true,
            small: false,
        };
        assert_eq!(resolved(DirectIo::Auto), auto);
        assert_eq!(
            resolved(DirectIo::Always).to_string(),
            "O_DIRECT for every file"
        );
        assert_eq!(
            resolved(DirectIo::Never).to_string(),
            "through the page cache"
        );
        assert!(
            std::fs::read_dir(tmp.path()).unwrap().next().is_none(),
            "the probe leaves nothing in DEST"
        );
    }

    #[test]
    fn planted_symlink_is_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("evil")).unwrap();
        let dest = Dest::open(root.path()).unwrap();
        let err = dest.create_partial(&rel("evil/x.bin"), false).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_hard_linked_partial_is_not_resumed() {
        let root = tempfile::tempdir().unwrap();
        let dest = Dest::open(root.path()).unwrap();
        let path = rel("x.bin");
        let (_, file) = dest.create_partial(&path, false).unwrap();
        file.set_len(10).unwrap();
        assert!(dest.reopen_partial(&path, false, 10).unwrap().is_some());
        let elsewhere = root.path().join("elsewhere");
        std::fs::hard_link(root.path().join(".x.bin.partial"), &elsewhere).unwrap();
        assert!(dest.reopen_partial(&path, false, 10).unwrap().is_none());
    }

    #[test]
    fn partial_then_publish() {
        let root = tempfile::tempdir().unwrap();
        let dest = Dest::open(root.path()).unwrap();
        let path = rel("a/b/c.bin");
        // A symlink planted at the partial name is replaced, not followed.
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.path().join("a/b/.c.bin.partial"))
            .unwrap();
        let (dir, file) = dest.create_partial(&path, false).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"hello", 0).unwrap();
        publish(&dir, &path.partial_name(), path.file_name()).unwrap();
        assert_eq!(
            std::fs::read(root.path().join("a/b/c.bin")).unwrap(),
            b"hello"
        );
        let stat = dest.stat_final(&path).unwrap().unwrap();
        assert_eq!(stat.size, 5);
        assert!(dest.stat_final(&rel("a/none")).unwrap().is_none());
    }
}
