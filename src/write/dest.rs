//! DEST as a directory handle. Every path under it is reached one component at a time with
//! `openat(O_NOFOLLOW)` and created with `mkdirat`, so a symlink planted inside DEST (a shared
//! hostPath cache, say) can never redirect a write outside it: a component that is a symlink
//! or a file is an error for that key, never followed.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::plan::keys::RelPath;

const DIR_MODE: libc::mode_t = 0o755;
const FILE_MODE: libc::mode_t = 0o644;
/// Extended attribute holding a committed file's BLAKE3, so an unchanged file that is skipped
/// on a later run can still be reported with its hash.
pub const HASH_XATTR: &str = "user.hydrator.blake3";

/// An open DEST directory.
pub struct Dest {
    root: OwnedFd,
    path: PathBuf,
}

/// What is at a file's final name.
pub struct FinalStat {
    pub size: u64,
    pub modified: SystemTime,
}

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

    /// Size and mtime of the regular file at `rel`'s final name, if there is one.
    pub fn stat_final(&self, rel: &RelPath) -> io::Result<Option<(FinalStat, OwnedFd)>> {
        let Some(dir) = self.open_parent(rel, false)? else {
            return Ok(None);
        };
        let name = cstring(rel.file_name())?;
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
        if rc != 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::NotFound => Ok(None),
                _ => Err(err),
            };
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(None);
        }
        let modified = SystemTime::UNIX_EPOCH
            + std::time::Duration::new(st.st_mtime as u64, st.st_mtime_nsec as u32);
        Ok(Some((
            FinalStat {
                size: st.st_size as u64,
                modified,
            },
            dir,
        )))
    }

    /// Creates `.NAME.partial` next to `rel`'s final name, replacing whatever was there
    /// (an earlier run's leftover, or a planted symlink) without following it.
    pub fn create_partial(&self, rel: &RelPath, direct_io: bool) -> io::Result<(OwnedFd, File)> {
        let dir = self
            .open_parent(rel, true)?
            .expect("open_parent with create returns a directory");
        let name = cstring(&rel.partial_name())?;
        unlink_at(&dir, &name)?;
        let mut flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if direct_io {
            flags |= libc::O_DIRECT;
        }
        // SAFETY: valid dirfd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags,
                FILE_MODE as libc::c_uint,
            )
        };
        if fd < 0 {
            let err = io::Error::last_os_error();
            if direct_io && err.raw_os_error() == Some(libc::EINVAL) {
                return Err(io::Error::new(
                    err.kind(),
                    "this filesystem does not support O_DIRECT (--direct-io)",
                ));
            }
            return Err(err);
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok((dir, unsafe { File::from_raw_fd(fd) }))
    }

    /// Flushes every dirty page and inode of DEST's filesystem.
    pub fn sync_filesystem(&self) -> io::Result<()> {
        // SAFETY: valid fd.
        check(unsafe { libc::syncfs(self.root.as_raw_fd()) })
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
        other => other,
    }
}

/// Stores the file's BLAKE3 in an extended attribute; filesystems without user xattrs skip it.
pub fn set_hash_xattr(file: &File, hash: &blake3::Hash) -> io::Result<()> {
    let name = cstring(HASH_XATTR)?;
    let value = hash.to_hex();
    // SAFETY: valid fd, NUL-terminated name, value pointer and length from a live buffer.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    match check(rc) {
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::EPERM)) => Ok(()),
        other => other,
    }
}

/// Reads the hash stored by `set_hash_xattr` from `name` in `dir`, if any.
pub fn hash_xattr_at(dir: &OwnedFd, name: &str) -> Option<String> {
    let file = open_at(
        dir,
        &cstring(name).ok()?,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
    .ok()?;
    let attr = cstring(HASH_XATTR).ok()?;
    let mut value = [0u8; 64];
    // SAFETY: valid fd, NUL-terminated name, writable buffer of the given length.
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            attr.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    (n == 64).then(|| String::from_utf8_lossy(&value).into_owned())
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

fn open_at(dir: &OwnedFd, name: &CString, flags: libc::c_int) -> io::Result<File> {
    // SAFETY: valid dirfd and NUL-terminated name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
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
        let (stat, _) = dest.stat_final(&path).unwrap().unwrap();
        assert_eq!(stat.size, 5);
        assert!(dest.stat_final(&rel("a/none")).unwrap().is_none());
    }
}
