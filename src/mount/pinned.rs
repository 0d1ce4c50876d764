//! A lazy view mounted on a directory held open, for the CSI plugin, whose targets lie under
//! the kubelet's pods directory where pods influence paths.
//!
//! Why not fuser's own mount: it takes a path, makes it canonical, mounts on that text, and
//! unmounts that text again when the session ends. Each is a fresh walk of the path, so a
//! symlink planted on the way after the plugin checked the target moves the view, or the
//! unmount at the session's end, onto another directory (another pod's volume, a node mount).
//! Here this process opens `/dev/fuse` and mounts it itself on `/proc/self/fd/N` of the target
//! held open (the kernel resolves that to exactly the directory held, as for the plugin's bind
//! mounts), then builds the session on the descriptor (`Session::from_fd`), so fuser holds no
//! path and unmounts nothing: the view ends when the plugin unmounts its target, which it does
//! without following a symlink ([`crate::csi`]'s target module).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use fuser::{Config, SessionACL};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, UnmountFlags};
use tokio::sync::oneshot;

use super::view::LazyView;

/// Why a view could not be mounted on the directory held.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PinnedMountError {
    #[error("opening /dev/fuse: {0}")]
    Device(#[source] std::io::Error),
    #[error("reading the mountpoint's mode: {0}")]
    Mode(#[source] std::io::Error),
    #[error("mounting FUSE: {0}")]
    Mount(#[source] std::io::Error),
    #[error("starting the FUSE session: {0}")]
    Session(#[source] std::io::Error),
    #[error("the mounting task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A view being served: when its session ends (unmounted), a duplicate of its connection to
/// hand to the keeper, and whether the kernel took passthrough.
pub(crate) struct Served {
    pub ended: oneshot::Receiver<()>,
    pub fuse: OwnedFd,
    pub passthrough: bool,
}

/// Mounts `view` read-only on the directory `dir` (held open: an `O_PATH` descriptor) and
/// serves it on threads of its own.
pub(crate) async fn serve(
    view: LazyView,
    dir: BorrowedFd<'_>,
    fsname: String,
    allow_other: bool,
) -> Result<Served, PinnedMountError> {
    let mountpoint = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let stat = rustix::fs::fstat(dir).map_err(|err| PinnedMountError::Mode(err.into()))?;
    let mode = stat.st_mode;
    let taken = view.taken();
    let (session, fuse) = tokio::task::spawn_blocking(move || {
        let fuse = mount(&mountpoint, mode, &fsname, allow_other)?;
        let acl = match allow_other {
            true => SessionACL::All,
            false => SessionACL::Owner,
        };
        // Never leave a view that nobody serves.
        let unmount = |err| {
            let _ = rustix::mount::unmount(&mountpoint, UnmountFlags::DETACH);
            PinnedMountError::Session(err)
        };
        let kept = fuse.try_clone().map_err(unmount)?;
        let session = fuser::Session::from_fd(view, fuse, acl, config(acl)).map_err(unmount)?;
        Ok::<_, PinnedMountError>((session, kept))
    })
    .await??;
    let ended = super::run_session(session).map_err(PinnedMountError::Session)?;
    Ok(Served {
        ended,
        fuse,
        passthrough: taken.passthrough(),
    })
}

/// How a view's session runs. Its threads share the one descriptor the keeper holds a
/// duplicate of (no `clone_fd`): requests read from a clone would be failed by the kernel when
/// the clone closes with a killed process, while those read from a descriptor still held
/// elsewhere wait there for the next process ([`super::resume`]).
pub(crate) fn config(acl: SessionACL) -> Config {
    let mut config = Config::default();
    config.acl = acl;
    config.n_threads = Some(super::FUSE_THREADS);
    config.clone_fd = false;
    config
}

/// Opens `/dev/fuse` and mounts it on `mountpoint` (whose mode is `mode`), read-only.
fn mount(
    mountpoint: &std::path::Path,
    mode: u32,
    fsname: &str,
    allow_other: bool,
) -> Result<OwnedFd, PinnedMountError> {
    let fuse = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        .map_err(|err| PinnedMountError::Device(err.into()))?;
    let mut options = format!(
        "fd={},rootmode={mode:o},user_id={},group_id={},default_permissions",
        fuse.as_fd().as_raw_fd(),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    if allow_other {
        options.push_str(",allow_other");
    }
    let options = std::ffi::CString::new(options).expect("no NUL in mount options");
    let flags = MountFlags::RDONLY | MountFlags::NODEV | MountFlags::NOSUID | MountFlags::NOATIME;
    rustix::mount::mount(
        fsname,
        mountpoint,
        "fuse.hydrator",
        flags,
        options.as_c_str(),
    )
    .map_err(|err| PinnedMountError::Mount(err.into()))?;
    Ok(fuse)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::schedule::Schedule;
    use crate::mount::tree::Tree;
    use crate::mounts::top_mount;
    use crate::write::dest::Dest;

    /// Mounting needs root and /dev/fuse; elsewhere the test says so and passes.
    fn can_mount() -> bool {
        let able =
            rustix::process::geteuid().is_root() && std::path::Path::new("/dev/fuse").exists();
        if !able {
            eprintln!("SKIP: mounting FUSE needs root and /dev/fuse");
        }
        able
    }

    fn mount_tmpfs(at: &std::path::Path) {
        rustix::mount::mount("tmpfs", at, "tmpfs", MountFlags::empty(), None).unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_view_is_on_the_directory_held_and_its_end_unmounts_no_path() {
        if !can_mount() {
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let cache = base.path().join("cache");
        let target = base.path().join("pods/uid-1/mount");
        let elsewhere = base.path().join("elsewhere");
        for dir in [&cache, &target, &elsewhere] {
            std::fs::create_dir_all(dir).unwrap();
        }
        mount_tmpfs(&elsewhere);
        let view = LazyView::new(
            Arc::new(Tree::build(Vec::new()).0),
            Arc::new(Schedule::new(Vec::<String>::new())),
            Dest::open(&cache).unwrap(),
            false,
        );
        let held = rustix::fs::open(
            &target,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let served = serve(view, held.as_fd(), "hydrator:test".into(), false)
            .await
            .unwrap();
        drop(held);
        let top = top_mount(&target).unwrap().expect("mounted");
        assert!(top.fs_type.starts_with("fuse"), "{}", top.fs_type);
        assert!(top.is_hydrators(), "{}", top.source);

        // The way to it changes under the view: its pod's directory moves, and a symlink to
        // another mount takes the target's name.
        let moved = base.path().join("pods/uid-1-moved");
        std::fs::rename(base.path().join("pods/uid-1"), &moved).unwrap();
        std::fs::create_dir(base.path().join("pods/uid-1")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &target).unwrap();
        // The view ends where it really is; nothing is unmounted by path after it.
        rustix::mount::unmount(moved.join("mount"), UnmountFlags::NOFOLLOW).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), served.ended)
            .await
            .expect("the session ends")
            .unwrap();
        let other = top_mount(&elsewhere).unwrap();
        let still = other.as_ref().is_some_and(|top| top.fs_type == "tmpfs");
        let _ = rustix::mount::unmount(&elsewhere, UnmountFlags::DETACH);
        assert!(still, "the mount the symlink leads to is left alone");
    }
}
