//! Reloads the catalog when its file changes, as a SIGHUP would ([`Daemon::reload`]).
//!
//! Why it polls: in Kubernetes the catalog is a ConfigMap mounted as a directory, and the
//! kubelet refreshes it by writing a new timestamped directory and swapping the `..data`
//! symlink to it atomically; `catalog.toml` is itself a symlink through `..data`. The file that
//! was opened is never written, so inotify on it sees nothing (and a watch on the directory
//! would have to follow the kubelet's layout). Reading the file through its path every
//! [`POLL`] and comparing a hash of its bytes sees every swap and every plain edit alike, at
//! the cost of one small read.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::Daemon;

/// How often the catalog file is read.
const POLL: Duration = Duration::from_secs(2);

/// The catalog file's content as last seen.
pub(super) struct CatalogWatch {
    path: PathBuf,
    seen: Option<blake3::Hash>,
}

impl CatalogWatch {
    /// Takes note of the file's content now: taken before the catalog is loaded, a change
    /// between the two is reloaded at the first poll instead of missed.
    pub(super) fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            seen: content_hash(path).ok(),
        }
    }

    /// Polls the file until the task is aborted; each change is reloaded once (a refused
    /// catalog is not tried again until the file changes again).
    pub(super) async fn run(mut self, daemon: Arc<Daemon>) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.changed() {
                tracing::info!("{} changed: reloading the catalog", self.path.display());
                daemon.reload();
            }
        }
    }

    /// Whether the content differs from the last seen; an unreadable file is no change (the
    /// kubelet's swap is atomic, so this is a file being edited in place or removed).
    fn changed(&mut self) -> bool {
        match content_hash(&self.path) {
            Ok(hash) if self.seen != Some(hash) => {
                self.seen = Some(hash);
                true
            }
            Ok(_) => false,
            Err(err) => {
                tracing::debug!("reading {}: {err}", self.path.display());
                false
            }
        }
    }
}

fn content_hash(path: &Path) -> std::io::Result<blake3::Hash> {
    std::fs::read(path).map(|bytes| blake3::hash(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_swap_is_a_change_and_the_same_bytes_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("..old"), dir.path().join("..new"));
        for (at, text) in [(&old, "a"), (&new, "b")] {
            std::fs::create_dir(at).unwrap();
            std::fs::write(at.join("catalog.toml"), text).unwrap();
        }
        let data = dir.path().join("..data");
        std::os::unix::fs::symlink(&old, &data).unwrap();
        let file = dir.path().join("catalog.toml");
        std::os::unix::fs::symlink("..data/catalog.toml", &file).unwrap();
        let mut watch = CatalogWatch::new(&file);
        assert!(!watch.changed());

        let swap = dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&new, &swap).unwrap();
        std::fs::rename(&swap, &data).unwrap();
        assert!(watch.changed(), "the swap is seen");
        assert!(!watch.changed(), "once");

        std::fs::write(new.join("catalog.toml"), "b").unwrap();
        assert!(!watch.changed(), "the same bytes written again");
    }
}
