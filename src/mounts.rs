//! Read-only bind mounts of snapshot directories (and of a hydrated `hydrator mount` cache), and
//! telling what is mounted on a path.
//!
//! A bind mount takes the flags of its source, so making it read-only takes a second call
//! (`MS_REMOUNT | MS_BIND | MS_RDONLY`) that changes this mount only, never the cache's
//! filesystem. That remount does not reach the mount's peers in other namespaces (the host's
//! copy that the container runtime hands the pod), so the plugin's container mounts the cache
//! read-only as well: a bind of a read-only mount is read-only everywhere it propagates.
//! Whether a path is a mount point, and whether it is read-only, is read from
//! `/proc/self/mountinfo`: a bind mount of a directory on the same filesystem has the same
//! device number as its parent, so `stat` cannot tell.

use std::io;
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};

/// Mounts `source` on the directory `target`, read-only.
pub(crate) fn bind_read_only(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount_bind(source, target)?;
    remount_read_only(target).inspect_err(|_| {
        // Never leave a writable view of the cache behind.
        let _ = unmount(target);
    })
}

/// Makes the bind mount whose root `mount_root` names read-only (this mount only, never the
/// filesystem under it).
pub(crate) fn remount_read_only(mount_root: &Path) -> io::Result<()> {
    let read_only = MountFlags::BIND | MountFlags::RDONLY;
    Ok(rustix::mount::mount_remount(mount_root, read_only, "")?)
}

pub(crate) fn unmount(target: &Path) -> io::Result<()> {
    Ok(rustix::mount::unmount(target, UnmountFlags::empty())?)
}

/// What is mounted on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mounted {
    No,
    ReadOnly,
    Writable,
}

impl Mounted {
    /// What the topmost mount on a path (if any) makes of it.
    pub(crate) fn of(top: Option<&TopMount>) -> Self {
        match top {
            None => Mounted::No,
            Some(top) if top.read_only => Mounted::ReadOnly,
            Some(_) => Mounted::Writable,
        }
    }
}

/// The topmost mount on a path.
pub(crate) struct TopMount {
    pub read_only: bool,
    /// As mountinfo names it: `fuse`, `ext4`, ...
    pub fs_type: String,
    /// The directory of its filesystem that is mounted (a bind mount's source, within it).
    pub root: String,
    /// What mountinfo calls its source (a device, or a FUSE filesystem's name).
    pub source: String,
}

impl TopMount {
    /// Whether the CSI plugin made it: a read-only bind of a snapshot directory (named by its
    /// digest), or a lazy view (a FUSE filesystem named `hydrator:DATASET`).
    pub(crate) fn is_hydrators(&self) -> bool {
        let snapshot = (self.root.rsplit('/').next()).is_some_and(crate::snapshot::is_digest);
        let view = self.fs_type.starts_with("fuse") && self.source.starts_with("hydrator:");
        self.read_only && (snapshot || view)
    }
}

/// The topmost mount on `path` in this mount namespace, if any. The path is resolved first
/// (symlinks, `..`), as the kernel names mount points.
pub(crate) fn top_mount(path: &Path) -> io::Result<Option<TopMount>> {
    let path = match std::fs::canonicalize(path) {
        Ok(path) => path,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        // A lazy view whose server is gone answers ENOTCONN: its parent names it.
        Err(err) => match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => std::fs::canonicalize(parent)?.join(name),
            _ => return Err(err),
        },
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = path.to_string_lossy();
    Ok(table.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let root = fields.nth(3)?;
        let mount_point = fields.next()?;
        let options = fields.next()?;
        let mut after = line.split(" - ").nth(1)?.split(' ');
        let (fs_type, source) = (after.next()?, after.next()?);
        (unescape(mount_point) == wanted).then(|| TopMount {
            read_only: options.split(',').any(|o| o == "ro"),
            fs_type: fs_type.to_string(),
            root: unescape(root),
            source: unescape(source),
        })
    }))
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo` (octal).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                out.push(
                    digits
                        .iter()
                        .fold(0u8, |n, d| n.wrapping_mul(8) + (d - b'0')),
                );
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(
            unescape(r"/var/lib/kubelet/pods/a\040b/x"),
            "/var/lib/kubelet/pods/a b/x"
        );
        assert_eq!(unescape(r"/tab\011here\134"), "/tab\there\\");
        assert_eq!(unescape(r"/plain\x"), r"/plain\x");
    }

    #[test]
    fn only_snapshot_binds_and_hydrator_views_count_as_the_plugins() {
        let top = |read_only, fs_type: &str, root: &str, source: &str| TopMount {
            read_only,
            fs_type: fs_type.into(),
            root: root.into(),
            source: source.into(),
        };
        let digest = "ab".repeat(32);
        assert!(top(true, "ext4", &format!("/cache/ds/{digest}"), "/dev/vda").is_hydrators());
        assert!(top(true, "fuse", "/", "hydrator:ds").is_hydrators());
        assert!(!top(false, "ext4", &format!("/cache/ds/{digest}"), "/dev/vda").is_hydrators());
        assert!(!top(true, "tmpfs", "/", "tmpfs").is_hydrators());
        assert!(!top(true, "fuse", "/", "sshfs:host").is_hydrators());
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_fresh_directory_is_not() {
        assert!(top_mount(Path::new("/")).unwrap().is_some());
        let dir = tempfile::tempdir().unwrap();
        assert!(top_mount(dir.path()).unwrap().is_none());
        assert!(top_mount(&dir.path().join("gone")).unwrap().is_none());
    }
}
