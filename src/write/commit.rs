//! Batched, durable publication of finished files.
//!
//! A finished `.NAME.partial` is handed to the committer, which gathers files for a short while
//! and then, on a blocking thread: `syncfs` (data and inodes of the whole batch durable in one
//! call), `rename` each to its final name, `syncfs` again (the renames durable). Only then is
//! each file reported done. One batch costs two filesystem syncs however many files it holds,
//! so small files do not pay one journal commit each, while a file still appears under its
//! final name only once it is whole, hashed and on disk.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::dest::{self, Dest};
use crate::plan::keys::RelPath;

/// Most files in one batch.
const BATCH_FILES: usize = 256;
/// Longest a finished file waits for its batch to close.
const BATCH_WINDOW: Duration = Duration::from_millis(100);

/// A finished `.NAME.partial`. It carries no open descriptor (its directory is reached again
/// at commit time through the same no-symlink walk), so files waiting for a batch cost memory
/// only, not file descriptors.
struct Job {
    rel: RelPath,
    done: oneshot::Sender<io::Result<()>>,
}

/// Handle to the committer task.
#[derive(Clone)]
pub struct Committer {
    tx: mpsc::Sender<Job>,
}

impl Committer {
    /// Starts the committer task; it ends when the last handle is dropped.
    pub fn start(dest: Arc<Dest>) -> Self {
        let (tx, rx) = mpsc::channel(BATCH_FILES);
        tokio::spawn(run(dest, rx));
        Self { tx }
    }

    /// Publishes `rel`'s partial file under its final name; returns once that is durable.
    pub async fn publish(&self, rel: RelPath) -> io::Result<()> {
        let (done, wait) = oneshot::channel();
        let job = Job { rel, done };
        self.tx
            .send(job)
            .await
            .map_err(|_| io::Error::other("the committer has stopped"))?;
        wait.await
            .map_err(|_| io::Error::other("the committer stopped before the file was published"))?
    }
}

async fn run(dest: Arc<Dest>, mut rx: mpsc::Receiver<Job>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + BATCH_WINDOW;
        while batch.len() < BATCH_FILES {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(job)) => batch.push(job),
                Ok(None) | Err(_) => break,
            }
        }
        let dest = dest.clone();
        let committed = tokio::task::spawn_blocking(move || commit_batch(&dest, batch)).await;
        if let Err(err) = committed {
            tracing::error!("commit batch panicked: {err}");
        }
    }
}

fn commit_batch(dest: &Dest, batch: Vec<Job>) {
    if let Err(err) = dest.sync_filesystem() {
        let msg = format!("syncing {}: {err}", dest.path().display());
        for job in batch {
            let _ = job.done.send(Err(io::Error::new(err.kind(), msg.clone())));
        }
        return;
    }
    let mut renamed = Vec::with_capacity(batch.len());
    for job in batch {
        match publish_one(dest, &job.rel) {
            Ok(()) => renamed.push(job.done),
            Err(err) => {
                let _ = job.done.send(Err(err));
            }
        }
    }
    let synced = dest.sync_filesystem();
    for done in renamed {
        let _ = done.send(match &synced {
            Ok(()) => Ok(()),
            Err(err) => Err(io::Error::new(err.kind(), err.to_string())),
        });
    }
}

/// Renames `rel`'s partial file to its final name; on failure the partial file is removed.
fn publish_one(dest: &Dest, rel: &RelPath) -> io::Result<()> {
    let dir = dest
        .open_parent(rel, false)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "its directory vanished"))?;
    let partial = rel.partial_name();
    dest::publish(&dir, &partial, rel.file_name()).inspect_err(|_| {
        if let Ok(name) = dest::cstring(&partial) {
            let _ = dest::unlink_at(&dir, &name);
        }
    })
}
