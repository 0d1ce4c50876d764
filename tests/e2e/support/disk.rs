//! Filesystems made for one test: a small tmpfs or a loop-mounted ext2 image, to fill up.

use std::path::PathBuf;
use std::process::Command;

/// A filesystem mounted for one test, unmounted when dropped. Mounting needs root, which CI
/// and the development machines have; elsewhere the test is skipped.
pub struct TestMount {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestMount {
    /// A tmpfs with these mount options (`size=6m`, `ro`, `nr_inodes=16`...).
    pub fn tmpfs(options: &str) -> Option<Self> {
        Self::mount(&["-t", "tmpfs", "-o", options, "tmpfs"])
    }

    /// A fresh ext2 filesystem of `size` in an image file, loop-mounted.
    pub fn ext2_image(size: &str) -> Option<Self> {
        let image = std::env::temp_dir().join(format!("hydrator-ext2-{}.img", fastrand::u64(..)));
        let made = Command::new("mkfs.ext2")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image)
            .arg(size)
            .status()
            .unwrap();
        assert!(made.success());
        let mounted = Self::mount(&["-o", "loop", image.to_str().unwrap()]);
        // The loop device keeps the image open; the file goes once it is unmounted.
        let _ = std::fs::remove_file(&image);
        mounted
    }

    fn mount(args: &[&str]) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("cannot mount a filesystem (not root): skipping");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).unwrap();
        let status = Command::new("mount")
            .args(args)
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success(), "mount {args:?} failed as root");
        Some(Self { path, _dir: dir })
    }

    pub fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
