//! `hydrator mount` as a child process: mounted, watched, stopped by a signal, and never left
//! mounted behind a failed test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{hydrator_command, mounts_on, top_fs_type, wait_until, Server};

/// A running `hydrator mount` of one prefix, with its cache and mountpoint in one temp dir.
pub struct Mounted {
    pub child: Child,
    pub mountpoint: PathBuf,
    pub cache: PathBuf,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

/// Whether a FUSE filesystem is mounted at `path`.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_string_lossy();
    mounts
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(&*path) && line.contains(" - fuse"))
}

/// Whether the top mount on `path` is the cache's bind mount (the dataset was hydrated), not
/// the FUSE view.
pub fn cache_on_top(path: &Path) -> bool {
    top_fs_type(path).is_some_and(|fs| !fs.starts_with("fuse"))
}

impl Mounted {
    /// Mounts s3://BUCKET/PREFIX with `args` and waits until the view is there.
    pub fn start(server: &Server, prefix: &str, args: &[&str]) -> Self {
        Self::spawn(args, |mountpoint, cache| {
            Self::command(server, prefix, mountpoint, cache)
        })
    }

    /// Mounts the objects of the snapshot file `snapshot` with `args`, the same way.
    pub fn start_snapshot(server: &Server, snapshot: &Path, args: &[&str]) -> Self {
        Self::spawn(args, |mountpoint, cache| {
            Self::mount_command(
                server,
                &["--snapshot".as_ref(), snapshot.as_os_str()],
                mountpoint,
                cache,
            )
        })
    }

    fn spawn(args: &[&str], command: impl FnOnce(&Path, &Path) -> Command) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (mountpoint, cache, log) = (
            dir.path().join("view"),
            dir.path().join("cache"),
            dir.path().join("mount.log"),
        );
        std::fs::create_dir(&mountpoint).unwrap();
        let mut command = command(&mountpoint, &cache);

        command.args(args);

        command.stderr(std::fs::File::create(&log).unwrap());
        let mut mounted = Self {
            child: command.spawn().expect("hydrator mount starts"),
            mountpoint,
            cache,
            log,
            _dir: dir,
        };
        let at = mounted.mountpoint.clone();
        let mut exited = None;
        wait_until("the view is mounted", Duration::from_secs(30), || {
            exited = mounted.child.try_wait().unwrap();
            exited.is_some() || is_mounted(&at)
        });
        assert!(
            exited.is_none(),
            "mount exited {exited:?}: {}",
            mounted.log()
        );
        mounted
    }

    /// `hydrator mount s3://BUCKET/PREFIX MOUNTPOINT --cache CACHE` against `server`.
    pub fn command(server: &Server, prefix: &str, mountpoint: &Path, cache: &Path) -> Command {
        let source = format!("s3://{}/{prefix}", server.target.bucket);
        Self::mount_command(server, &[source.as_ref()], mountpoint, cache)
    }

    /// `hydrator mount SOURCE... MOUNTPOINT --cache CACHE` against `server`.
    fn mount_command(
        server: &Server,
        source: &[&std::ffi::OsStr],
        mountpoint: &Path,
        cache: &Path,
    ) -> Command {
        let mut command = hydrator_command(&server.target);
        command
            .arg("mount")
            .args(source)
            .arg(mountpoint)
            .arg("--cache")
            .arg(cache)
            .args(["--endpoint-url", &server.target.endpoint])
            .args(["--progress", "none"])
            .stdout(Stdio::piped());
        command
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits for the exit code.
    pub fn stop(&mut self, signal: &str) -> Option<i32> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-s", signal, &pid]).status();
        assert!(sent.unwrap().success());
        let status = self.child.wait().unwrap();
        status.code()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for _ in 0..mounts_on(&self.mountpoint) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
    }
}
