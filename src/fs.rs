//! The filesystem floor: a directory handle whose operations never follow a symlink, and the one
//! way a small file is replaced atomically. Imports nothing from the crate.
//!
//! Why it is built this way:
//! - A tree the user does not fully control (DEST, a shared hostPath cache) may hold a planted
//!   symlink. Every name is resolved relative to an open [`Dir`], one component at a time, with
//!   `openat(O_NOFOLLOW)` and `AT_SYMLINK_NOFOLLOW`: a symlink is an entry or an error, never a
//!   way out. Only [`Dir::open`], for a path the user gave, follows links. A handle keeps naming
//!   the directory it opened even when its path is later replaced.
//! - [`write_atomic`] writes `NAME.tmp`, fsyncs it, renames it over `NAME` and fsyncs the
//!   directory: a crash leaves the old or the new content, never a torn file, and the rename
//!   itself survives a power cut.
//! - Syscalls go through `rustix`, so this module needs no `unsafe`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FallocateFlags, FileType, Mode, Stat, CWD};

pub(crate) use rustix::fs::OFlags;

const DIR_MODE: u32 = 0o755;
pub(crate) const FILE_MODE: u32 = 0o644;

/// An open directory. Names given to its methods are single entries of it.
#[derive(Debug)]
pub(crate) struct Dir(OwnedFd);

impl std::os::fd::AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Size, mtime, inode and link count of a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileStat {
    pub size: u64,
    pub mtime_ns: u64,
    pub inode: u64,
    pub links: u64,
}

impl FileStat {
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    fn of(st: &Stat) -> Self {
        Self {
            size: st.st_size as u64,
            mtime_ns: st.st_mtime as u64 * 1_000_000_000 + st.st_mtime_nsec as u64,
            inode: st.st_ino as u64,
            links: st.st_nlink as u64,
        }
    }
}

impl Dir {
    /// Opens the directory at `path`, following symlinks in it: the path is the user's choice.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        Ok(Self(rustix::fs::openat(CWD, path, flags, Mode::empty())?))
    }

    /// Opens the directory `name`; a symlink or a file there is an error (`ENOTDIR`/`ELOOP`).
    pub(crate) fn open_dir(&self, name: impl AsRef<Path>) -> io::Result<Self> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(Self(rustix::fs::openat(
            &self.0,
            name.as_ref(),
            flags,
            Mode::empty(),
        )?))
    }

    /// Creates the directory `name` (mode 0755) unless something is already there.
    pub(crate) fn create_dir(&self, name: impl AsRef<Path>) -> io::Result<()> {
        match rustix::fs::mkdirat(&self.0, name.as_ref(), Mode::from_raw_mode(DIR_MODE)) {
            Err(rustix::io::Errno::EXIST) => Ok(()),
            other => Ok(other?),
        }
    }

    /// Opens the file `name` with `flags`; `O_NOFOLLOW` and `O_CLOEXEC` are added, and a created
    /// file gets mode 0644.
    pub(crate) fn open_file(&self, name: impl AsRef<Path>, flags: OFlags) -> io::Result<File> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(
            &self.0,
            name.as_ref(),
            flags,
            Mode::from_raw_mode(FILE_MODE),
        )?;
        Ok(File::from(fd))
    }

    /// Stat of the regular file `name`; `None` if absent or not a regular file (a symlink is
    /// not followed).
    pub(crate) fn stat_regular(&self, name: impl AsRef<Path>) -> io::Result<Option<FileStat>> {
        Ok(self
            .lstat(name.as_ref())?
            .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
            .map(|st| FileStat::of(&st)))
    }

    /// Whether a directory is at `name` (a symlink is not followed).
    pub(crate) fn is_dir(&self, name: impl AsRef<Path>) -> io::Result<bool> {
        let stat = self.lstat(name.as_ref())?;
        Ok(stat.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory))
    }

    /// Whether anything is at `name` (a symlink is not followed).
    pub(crate) fn exists(&self, name: impl AsRef<Path>) -> io::Result<bool> {
        Ok(self.lstat(name.as_ref())?.is_some())
    }

    fn lstat(&self, name: &Path) -> io::Result<Option<Stat>> {
        match rustix::fs::statat(&self.0, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) => Ok(None),
            other => Ok(Some(other?)),
        }
    }

    /// Renames `from` to `to`, both in this directory; replaces what is at `to` (a symlink
    /// there is replaced, not followed).
    pub(crate) fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        Ok(rustix::fs::renameat(
            &self.0,
            from.as_ref(),
            &self.0,
            to.as_ref(),
        )?)
    }

    /// Hard-links `name` here to the same name in `to`, never following a symlink.
    pub(crate) fn link_to(&self, name: impl AsRef<Path>, to: &Dir) -> io::Result<()> {
        let name = name.as_ref();
        Ok(rustix::fs::linkat(
            &self.0,
            name,
            &to.0,
            name,
            AtFlags::empty(),
        )?)
    }

    /// Removes the non-directory `name` if present; a symlink is removed, not followed.
    pub(crate) fn unlink(&self, name: impl AsRef<Path>) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.0, name.as_ref(), AtFlags::empty()) {
            Err(rustix::io::Errno::NOENT) => Ok(()),
            other => Ok(other?),
        }
    }

    /// Removes the directory `name`; fails when it is not empty.
    pub(crate) fn remove_dir(&self, name: impl AsRef<Path>) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(
            &self.0,
            name.as_ref(),
            AtFlags::REMOVEDIR,
        )?)
    }

    /// The names in this directory (without `.` and `..`) and whether each is a real directory
    /// (a symlink to one is not).
    pub(crate) fn entries(&self) -> io::Result<Vec<(String, bool)>> {
        let mut entries = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.0)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                FileType::Unknown => self.lstat(name.as_ref()).is_ok_and(|st| {
                    st.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
                }),
                _ => false,
            };
            entries.push((name, is_dir));
        }
        Ok(entries)
    }

    /// Makes this directory's entries (creations, renames, removals) durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::fsync(&self.0)?)
    }

    /// Flushes every dirty page and inode of the filesystem holding this directory.
    pub(crate) fn sync_fs(&self) -> io::Result<()> {
        Ok(rustix::fs::syncfs(&self.0)?)
    }

    /// A second handle on the same open directory.
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(Self(self.0.try_clone()?))
    }
}

/// Bytes an unprivileged writer can still use on the filesystem holding `fd`.
pub(crate) fn free_bytes(fd: impl AsFd) -> io::Result<u64> {
    let st = rustix::fs::fstatvfs(fd)?;
    Ok(st.f_bavail * st.f_frsize)
}

/// Reserves the first `len` bytes of `file` (`fallocate`).
pub(crate) fn allocate(file: &File, len: u64) -> io::Result<()> {
    Ok(rustix::fs::fallocate(
        file,
        FallocateFlags::empty(),
        0,
        len,
    )?)
}

/// Replaces `name` in `dir` with what `write` puts into a new file: `NAME.tmp` is created
/// (whatever was at that name is removed first, never written through), written, fsynced and
/// renamed over `name`, then the directory is fsynced. On failure the temp file is removed and
/// `name` keeps its old content.
pub(crate) fn write_atomic(
    dir: &Dir,
    name: impl AsRef<Path>,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let name = name.as_ref();
    let mut tmp = name.as_os_str().to_owned();
    tmp.push(".tmp");
    dir.unlink(&tmp)?;
    let mut file = dir.open_file(&tmp, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL)?;
    let written = write(&mut file)
        .and_then(|()| file.sync_all())
        .and_then(|()| dir.rename(&tmp, name));
    if let Err(err) = written {
        let _ = dir.unlink(&tmp);
        return Err(err);
    }
    dir.sync()
}

/// [`write_atomic`] for a path the user gave: its directory is opened as [`Dir::open`] does.
pub(crate) fn write_atomic_path(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} does not name a file", path.display()),
        )
    })?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    write_atomic(&Dir::open(parent)?, name, write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::symlink;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn put(dir: &Dir, name: &str, text: &str) -> io::Result<()> {
        write_atomic(dir, name, |file| file.write_all(text.as_bytes()))
    }

    /// A directory holding only `f`, with "old" in it.
    fn holding_old_f() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f"), "old").unwrap();
        root
    }

    /// `root` holds only `f`, a regular file with `text` in it.
    fn only_f(root: &Path, text: &str) {
        let f = root.join("f");
        assert!(f.symlink_metadata().unwrap().file_type().is_file());
        assert_eq!(std::fs::read_to_string(f).unwrap(), text);
        assert_eq!(names(root), ["f"]);
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temp() {
        let root = holding_old_f();
        // A leftover temp file of a killed writer is replaced.
        std::fs::write(root.path().join("f.tmp"), "leftover").unwrap();
        put(&Dir::open(root.path()).unwrap(), "f", "new").unwrap();
        only_f(root.path(), "new");
    }

    #[test]
    fn a_failed_writer_keeps_the_old_content_and_no_temp() {
        let root = holding_old_f();
        let err = write_atomic(&Dir::open(root.path()).unwrap(), "f", |file| {
            file.write_all(b"half")?;
            Err(io::Error::other("writer failed"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "writer failed");
        only_f(root.path(), "old");
    }

    #[test]
    fn write_atomic_never_follows_a_planted_symlink() {
        let (outside, root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for name in ["target", "tmp-target"] {
            std::fs::write(outside.path().join(name), "outside").unwrap();
        }
        symlink(outside.path().join("target"), root.path().join("f")).unwrap();
        symlink(outside.path().join("tmp-target"), root.path().join("f.tmp")).unwrap();
        put(&Dir::open(root.path()).unwrap(), "f", "new").unwrap();
        only_f(root.path(), "new");
        for name in ["target", "tmp-target"] {
            assert_eq!(
                std::fs::read_to_string(outside.path().join(name)).unwrap(),
                "outside"
            );
        }
    }

    #[test]
    fn a_handle_keeps_its_directory_when_a_symlink_takes_its_place() {
        let (outside, root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::create_dir(root.path().join("d")).unwrap();
        let dir = Dir::open(root.path()).unwrap().open_dir("d").unwrap();
        std::fs::rename(root.path().join("d"), root.path().join("moved")).unwrap();
        symlink(outside.path(), root.path().join("d")).unwrap();
        put(&dir, "f", "new").unwrap();
        assert_eq!(names(outside.path()), Vec::<String>::new());
        assert_eq!(names(&root.path().join("moved")), ["f"]);
    }

    #[test]
    fn open_dir_refuses_a_symlink_or_a_file() {
        let (outside, root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        symlink(outside.path(), root.path().join("link")).unwrap();
        std::fs::write(root.path().join("file"), "").unwrap();
        let dir = Dir::open(root.path()).unwrap();
        for name in ["link", "file"] {
            let err = dir.open_dir(name).unwrap_err();
            // Linux says ENOTDIR for a symlink under O_DIRECTORY | O_NOFOLLOW.
            assert!(
                matches!(err.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)),
                "{name}: {err}"
            );
        }
        // Creating over the symlink neither fails nor creates anything behind it.
        dir.create_dir("link").unwrap();
        assert_eq!(names(outside.path()), Vec::<String>::new());
        assert_eq!(dir.entries().unwrap().len(), 2);
    }
}
