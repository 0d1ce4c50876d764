//! DEST as a directory handle. Every path under it is reached one component at a time with
//! `openat(O_NOFOLLOW)` and created with `mkdirat`, so a symlink planted inside DEST (a shared
//! hostPath cache, say) can never redirect a write outside it: a component that is a symlink
//! or a file is an error for that key, never followed.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::buffer::DIRECT_IO_ALIGN;
use crate::error::WriteError;
use crate::plan::keys::{RelPath, STATE_DIR};
use crate::units::human_bytes;

const DIR_MODE: libc::mode_t = 0o755;
const FILE_MODE: libc::mode_t = 0o644;

/// An open DEST directory.
pub struct Dest {
    root: OwnedFd,
    path: PathBuf,
}

/// What is at a file's final name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FinalStat {
    pub size: u64,
    pub mtime_ns: u64,
    pub inode: u64,
    pub links: u64,
}

impl FinalStat {
    #[allow(clippy::unnecessary_cast)] // st_nlink is u32 on some targets
    fn of(st: &libc::stat) -> Self {
        Self {
            size: st.st_size as u64,
            mtime_ns: st.st_mtime as u64 * 1_000_000_000 + st.st_mtime_nsec as u64,
            inode: st.st_ino,
            links: st.st_nlink as u64,
        }
    }
}

fn resumable_size(on_disk: u64, size: u64, direct_io: bool) -> bool {
    on_disk == size || (direct_io && on_disk == size.next_multiple_of(DIRECT_IO_ALIGN as u64))
}

/// Nanoseconds since the epoch, as kept in the manifest.
impl Dest {
    /// Creates DEST if needed and opens it. DEST itself may be a symlink the user chose.
    pub fn open(path: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(path)?;
        let root = File::open(path)?;
        if !root.metadata()?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            ));
        }
        Ok(Self {
            root: root.into(),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (and with `create`, makes) the directory holding `rel`. `Ok(None)` when it does not
    /// exist and `create` is false.
    pub fn open_parent(&self, rel: &RelPath, create: bool) -> io::Result<Option<OwnedFd>> {
        let mut dir = dup(&self.root)?;
        for segment in rel.parents() {
            let name = cstring(segment)?;
            let next = match open_dir_at(&dir, &name) {
                Err(err) if err.kind() == io::ErrorKind::NotFound && create => {
                    mkdir_at(&dir, &name)?;
                    open_dir_at(&dir, &name)
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
                other => other,
            };
            dir = next.map_err(|err| in_the_way(err, segment))?;
        }
        Ok(Some(dir))
    }

    /// Size, mtime and inode of the regular file at `rel`'s final name, if there is one.
    pub fn stat_final(&self, rel: &RelPath) -> io::Result<Option<FinalStat>> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(None);
        };
        stat_regular_at(&dir, rel.file_name())
    }

    /// Opens the file at `rel`'s final name for reading, never through a symlink.
    pub fn open_final(&self, rel: &RelPath) -> io::Result<Option<File>> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(None);
        };
        match open_at(
            &dir,
            &cstring(rel.file_name())?,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        ) {
            Ok(file) => Ok(Some(file)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Reopens an earlier run's `.NAME.partial` to resume it, if it exists with `size` bytes.
    pub fn reopen_partial(
        &self,
        rel: &RelPath,
        direct_io: bool,
        size: u64,
    ) -> io::Result<Option<(OwnedFd, File)>> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(None);
        };
        let partial = rel.partial_name();
        match stat_regular_at(&dir, &partial)? {
            // A hard link planted at the partial name would make writes land in another file;
            // under O_DIRECT the last block may already be written padded.
            Some(stat) if stat.links == 1 && resumable_size(stat.size, size, direct_io) => {}
            _ => return Ok(None),
        }
        let mut flags = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if direct_io {
            flags |= libc::O_DIRECT;
        }
        let file = open_at(&dir, &cstring(&partial)?, flags)?;
        Ok(Some((dir, file)))
    }

    /// Opens (creating it if needed) DEST's `.hydrator` state directory, never through a symlink.
    pub fn state_dir(&self) -> io::Result<OwnedFd> {
        let name = cstring(STATE_DIR)?;
        mkdir_at(&self.root, &name)?;
        open_dir_at(&self.root, &name).map_err(|err| in_the_way(err, STATE_DIR))
    }

    /// The DEST directory itself.
    pub fn root(&self) -> &OwnedFd {
        &self.root
    }
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)` of `name` in `dir`; `None` if it does not exist.
pub fn lstat_at(dir: &OwnedFd, name: &str) -> io::Result<Option<libc::stat>> {
    let name = cstring(name)?;
    // SAFETY: an all-zero stat is a valid value for fstatat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid dirfd, NUL-terminated name, writable stat.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        return Ok(Some(st));
    }
    let err = io::Error::last_os_error();
    match err.kind() {
        io::ErrorKind::NotFound => Ok(None),
        _ => Err(err),
    }
}

/// Stat of the regular file `name` in `dir` (not following symlinks); `None` if absent or not
/// a regular file.
pub fn stat_regular_at(dir: &OwnedFd, name: &str) -> io::Result<Option<FinalStat>> {
    Ok(lstat_at(dir, name)?
        .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
        .map(|st| FinalStat::of(&st)))
}

impl Dest {
    /// Creates `.NAME.partial` next to `rel`'s final name, replacing whatever was there
    /// (an earlier run's leftover, or a planted symlink) without following it.
    pub fn create_partial(&self, rel: &RelPath, direct_io: bool) -> io::Result<(OwnedFd, File)> {
        let dir = self
            .open_parent(rel, true)?
            .expect("open_parent with create returns a directory");
        let name = cstring(&rel.partial_name())?;
        let mut flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if direct_io {
            flags |= libc::O_DIRECT;
        }
        // O_EXCL never follows what is at the name; only when something is there (rare) does
        // it cost an unlink and a second open.
        let created = match open_at(&dir, &name, flags) {
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                unlink_at(&dir, &name)?;
                open_at(&dir, &name, flags)
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
    pub fn syncer(&self) -> io::Result<Syncer> {
        open_dir_at(&self.root, &cstring(".")?).map(Syncer)
    }
}

/// `syncfs` through a descriptor of its own: the kernel reports a write-back error once to each
/// open file description, so each party that must not miss one (the checkpointer, the
/// committer) keeps its own handle.
pub struct Syncer(OwnedFd);

impl Syncer {
    /// Flushes every dirty page and inode of DEST's filesystem.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: valid fd.
        check(unsafe { libc::syncfs(self.0.as_raw_fd()) })
    }
}

/// Reserves `len` bytes for a file: fails fast on a full disk and avoids fragmentation.
/// Filesystems without fallocate (some network and overlay setups) just skip it.
pub fn preallocate(file: &File, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: valid fd.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    match check(rc) {
        Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "the destination's filesystem is full: {} needed, {} free",
                human_bytes(len),
                free_bytes(file).map_or_else(|e| format!("? ({e})"), human_bytes)
            ),
        )),
        other => other,
    }
}

/// A failed write, with the room left when the filesystem is full.
pub fn write_error(err: io::Error, file: &File) -> WriteError {
    match err.raw_os_error() {
        Some(libc::ENOSPC) => WriteError::Full {
            free: free_bytes(file).ok(),
            source: err,
        },
        _ => WriteError::Io(err),
    }
}

/// Bytes an unprivileged writer can still use on `file`'s filesystem.
pub fn free_bytes(file: &File) -> io::Result<u64> {
    // SAFETY: an all-zero statvfs is a valid value for fstatvfs to overwrite.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a writable statvfs.
    check(unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) })?;
    Ok(st.f_bavail * st.f_frsize)
}

/// Renames `.NAME.partial` to NAME inside `dir`. A directory at NAME is a key conflict.
pub fn publish(dir: &OwnedFd, partial: &str, name: &str) -> io::Result<()> {
    let (from, to) = (cstring(partial)?, cstring(name)?);
    // SAFETY: valid dirfd and NUL-terminated names.
    let rc =
        unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) };
    check(rc).map_err(|err| match err.raw_os_error() {
        Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST) => io::Error::new(
            err.kind(),
            format!("a directory named {name:?} is in the way (another key uses it as a prefix)"),
        ),
        _ => err,
    })
}

/// Removes `name` from `dir` if present; never follows a symlink.
pub fn unlink_at(dir: &OwnedFd, name: &CString) -> io::Result<()> {
    // SAFETY: valid dirfd and NUL-terminated name.
    match check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

pub fn cstring(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))
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

fn open_dir_at(dir: &OwnedFd, name: &CString) -> io::Result<OwnedFd> {
    open_at(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
    .map(OwnedFd::from)
}

/// Opens `name` in `dir` with `flags` (`O_NOFOLLOW` and `O_CLOEXEC` are added; created files get
/// mode 0644).
pub fn open_in(dir: &OwnedFd, name: &str, flags: libc::c_int) -> io::Result<File> {
    open_at(
        dir,
        &cstring(name)?,
        flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
}

/// Renames `from` to `to` inside `dir`.
pub fn rename_in(dir: &OwnedFd, from: &str, to: &str) -> io::Result<()> {
    let (from, to) = (cstring(from)?, cstring(to)?);
    // SAFETY: valid dirfd and NUL-terminated names.
    check(unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) })
}

/// Hard-links `name` in `from` to the same name in `to` (never following a symlink).
pub fn link_at(from: &OwnedFd, to: &OwnedFd, name: &str) -> io::Result<()> {
    let name = cstring(name)?;
    // SAFETY: valid dirfds and a NUL-terminated name; flags 0 do not follow symlinks.
    check(unsafe {
        libc::linkat(
            from.as_raw_fd(),
            name.as_ptr(),
            to.as_raw_fd(),
            name.as_ptr(),
            0,
        )
    })
}

/// Makes the entries of `dir` (creations, renames, removals) durable.
pub fn sync_dir(dir: &OwnedFd) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::fsync(dir.as_raw_fd()) })
}

fn open_at(dir: &OwnedFd, name: &CString, flags: libc::c_int) -> io::Result<File> {
    // SAFETY: valid dirfd and NUL-terminated name; the mode is used only with O_CREAT.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags,
            FILE_MODE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn mkdir_at(dir: &OwnedFd, name: &CString) -> io::Result<()> {
    // SAFETY: valid dirfd and NUL-terminated name.
    match check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), DIR_MODE) }) {
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

fn dup(fd: &OwnedFd) -> io::Result<OwnedFd> {
    fd.try_clone()
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
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
