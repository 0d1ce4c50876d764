//! Read-only bind mounts of snapshot directories, and telling whether a path is mounted.
//!
//! A bind mount takes the flags of its source, so making it read-only takes a second call
//! (`MS_REMOUNT | MS_BIND | MS_RDONLY`) that changes this mount only, never the cache's
//! filesystem. Whether a path is a mount point is read from `/proc/self/mountinfo`: a bind
//! mount of a directory on the same filesystem has the same device number as its parent, so
//! `stat` cannot tell.

use std::io;
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};

/// Mounts `source` on `target` (created if missing), read-only.
pub(crate) fn bind_read_only(source: &Path, target: &Path) -> io::Result<()> {
    std::fs::create_dir_all(target)?;
    rustix::mount::mount_bind(source, target)?;
    let read_only = MountFlags::BIND | MountFlags::RDONLY;
    if let Err(err) = rustix::mount::mount_remount(target, read_only, "") {
        // Never leave a writable view of the cache behind.
        let _ = unmount(target);
        return Err(err.into());
    }
    Ok(())
}

pub(crate) fn unmount(target: &Path) -> io::Result<()> {
    Ok(rustix::mount::unmount(target, UnmountFlags::empty())?)
}

/// Whether something is mounted on `path` in this mount namespace.
pub(crate) fn is_mount_point(path: &Path) -> io::Result<bool> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = path.to_string_lossy();
    Ok(table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mount_point| unescape(mount_point) == wanted))
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
    fn the_root_is_a_mount_point_and_a_fresh_directory_is_not() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()).unwrap());
    }
}
