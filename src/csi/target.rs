//! A volume's target path, reached beneath the kubelet's pods directory without following a
//! symlink anywhere: the plugin mounts, unmounts and removes only what is really there.
//!
//! Why it is built this way: the pods directory holds paths that pods influence (volume
//! subdirectories, emptyDirs), and a symlink planted on a target's way would turn a bind mount,
//! an unmount or an `rmdir` onto a directory outside it (`/etc`, another pod's volume). So the
//! target's parent is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the pods
//! directory and held open; the target itself is created with `mkdirat`, checked with
//! `AT_SYMLINK_NOFOLLOW`, mounted on through its own descriptor (`/proc/self/fd/N` names exactly
//! that directory), unmounted with `UMOUNT_NOFOLLOW` and removed with `unlinkat`.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::mount::UnmountFlags;

use crate::mounts::{self, Mounted, TopMount};

pub(crate) struct Target {
    parent: OwnedFd,
    name: OsString,
    path: PathBuf,
}

/// A directory held open, and the path that names exactly it while held.
pub(crate) struct Pinned {
    fd: OwnedFd,
    path: PathBuf,
}

impl Pinned {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl AsFd for Pinned {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn no_symlinks() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// A target whose way from the pods directory holds a symlink (or leaves it): never followed.
#[derive(Debug, thiserror::Error)]
#[error("{} is reached through a symlink or another mount: refused", .0.display())]
pub(crate) struct ThroughSymlink(PathBuf);

/// Whether `err` is a [`ThroughSymlink`] refusal.
pub(crate) fn through_symlink(err: &io::Error) -> bool {
    err.get_ref()
        .is_some_and(|inner| inner.is::<ThroughSymlink>())
}

fn refused(path: &Path, err: rustix::io::Errno) -> io::Error {
    match err {
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => {
            io::Error::other(ThroughSymlink(path.to_path_buf()))
        }
        err => err.into(),
    }
}

impl Target {
    /// `target`, which lies under `pods_dir` without `.` or `..` components: its parent opened
    /// with every component checked.
    pub(crate) fn open(pods_dir: &Path, target: &Path) -> io::Result<Self> {
        let relative = target
            .strip_prefix(pods_dir)
            .map_err(|_| io::Error::other("not under the pods directory"))?;
        let name = relative
            .file_name()
            .ok_or_else(|| io::Error::other("no final component"))?
            .to_os_string();
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let pods = rustix::fs::open(pods_dir, flags, Mode::empty())?;
        let parent = match relative.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => rustix::fs::openat2(&pods, parent, flags, Mode::empty(), no_symlinks())
                .map_err(|err| refused(target, err))?,
            None => pods,
        };
        Ok(Self {
            parent,
            name,
            path: target.to_path_buf(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What is there: `None` when nothing, else whether it is a real directory.
    fn kind(&self) -> io::Result<Option<FileType>> {
        match rustix::fs::statat(&self.parent, &self.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            // A mount whose server is gone (a lazy view) answers ENOTCONN: a mount point.
            Err(rustix::io::Errno::NOTCONN) => Ok(Some(FileType::Directory)),
            Err(err) => Err(err.into()),
        }
    }

    /// What is mounted on it; a symlink there is never looked through.
    pub(crate) fn mounted(&self) -> io::Result<Mounted> {
        Ok(Mounted::of(self.top_mount()?.as_ref()))
    }

    /// The topmost mount on it; a symlink there is never looked through.
    pub(crate) fn top_mount(&self) -> io::Result<Option<TopMount>> {
        match self.kind()? {
            Some(FileType::Directory) => mounts::top_mount(&self.path),
            _ => Ok(None),
        }
    }

    /// Whether the topmost mount on it is a bind of snapshot `digest` (a ready snapshot bound
    /// over a lazy view, or a plain publish), not a FUSE view.
    pub(crate) fn shows_snapshot(&self, digest: &str) -> io::Result<bool> {
        Ok(self.top_mount()?.is_some_and(|top| {
            !top.fs_type.starts_with("fuse") && top.root.rsplit('/').next() == Some(digest)
        }))
    }

    /// Nothing there yet, or a directory: anything else (a symlink, a file) is refused.
    pub(crate) fn check(&self) -> io::Result<()> {
        match self.kind()? {
            None | Some(FileType::Directory) => Ok(()),
            _ => Err(io::Error::other(format!(
                "{} is not a directory (a symlink or a file): refused",
                self.path.display()
            ))),
        }
    }

    /// Creates the directory if missing; anything else in its place is refused.
    pub(crate) fn create_dir(&self) -> io::Result<()> {
        match rustix::fs::mkdirat(&self.parent, &self.name, Mode::from_raw_mode(0o750)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(err) => return Err(err.into()),
        }
        self.check()
    }

    /// The directory, held open: mounting on [`Pinned::path`] mounts on exactly it.
    pub(crate) fn pin(&self) -> io::Result<Pinned> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.parent, &self.name, flags, Mode::empty())
            .map_err(|err| refused(&self.path, err))?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok(Pinned { fd, path })
    }

    /// Bind-mounts `source` on it (created if missing), read-only. The bind goes on the pinned
    /// directory; the read-only remount on the new mount's root, reached afresh.
    pub(crate) fn bind_read_only(&self, source: &Path) -> io::Result<()> {
        self.create_dir()?;
        rustix::mount::mount_bind(source, self.pin()?.path())?;
        let remounted = self
            .pin()
            .and_then(|top| mounts::remount_read_only(top.path()));
        remounted.inspect_err(|_| {
            // Never leave a writable view of the cache behind.
            let _ = self.unmount();
        })
    }

    /// Unmounts the topmost mount on it, never through a symlink.
    pub(crate) fn unmount(&self) -> io::Result<()> {
        let at = Path::new(&format!("/proc/self/fd/{}", self.parent.as_raw_fd())).join(&self.name);
        Ok(rustix::mount::unmount(&at, UnmountFlags::NOFOLLOW)?)
    }

    /// Removes the (empty, unmounted) directory; a target already gone is fine, and a symlink
    /// or a file in its place is not the plugin's: left alone, never followed.
    pub(crate) fn remove_dir(&self) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.parent, &self.name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }
}
