//! Batched, durable publication of finished files.
//!
//! A finished `.NAME.partial` is handed to the committer, which gathers files for a short while
//! and then, on a blocking thread: `syncfs` (data and inodes of the whole batch durable in one
//! call), `rename` each to its final name, `syncfs` again (the renames durable). Only then is
//! each file reported done. One batch costs two filesystem syncs however many files it holds,
//! so small files do not pay one journal commit each, while a file still appears under its
//! final name only once it is whole, hashed and on disk. The manifest's `Complete` records of
//! a batch are written and synced after the second `syncfs`.
//!
//! A file a lazy view's reader waits for skips the batch ([`Committer::publish_now`]): its own
//! `fdatasync`, rename and directory `fsync`s. A batch's `syncfs` flushes every file being
//! written at that moment: an opened 8 MiB file waited 0.94 s, 0.74 s of it in its batch's two
//! `syncfs` calls (strace, 64 × 8 MiB from the origin); alone, open to fully read took 0.12 s.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::dest::{self, Dest, Syncer};
use crate::fs::{FileStat, OFlags};
use crate::manifest::{Completed, Manifest};
use crate::plan::keys::RelPath;

/// Most files in one batch.
const BATCH_FILES: usize = 256;
/// Most finished files waiting for their batch. An object's download slot is freed once its file
/// is written, so downloads go on while a batch syncs; without this bound, a disk whose `syncfs`
/// is slower than the network kept every downloaded object's task waiting here, and memory grew
/// with the object count (2.3 GB for 1.28 million 4 KiB objects). Four batches keep the next
/// batch full while one syncs.
const MAX_WAITING: usize = 4 * BATCH_FILES;
/// Longest a finished file waits for its batch to close.
const BATCH_WINDOW: Duration = Duration::from_millis(100);

/// A finished `.NAME.partial`. It carries no open descriptor (its directory is reached again
/// at commit time through the same no-symlink walk), so files waiting for a batch cost memory
/// only, not file descriptors.
struct Job {
    rel: RelPath,
    key: String,
    etag: String,
    hash: blake3::Hash,
    done: oneshot::Sender<io::Result<()>>,
}

/// Handle to the committer task.
#[derive(Clone)]
pub(crate) struct Committer {
    tx: mpsc::Sender<Job>,
    dest: Arc<Dest>,
    manifest: Arc<Manifest>,
    /// Places for files waiting for their batch ([`MAX_WAITING`]).
    waiting: Arc<Semaphore>,
}

/// A finished file's place among those waiting for their batch, taken before its download slot
/// is given up ([`Committer::reserve`]).
pub(crate) struct Place {
    _permit: OwnedSemaphorePermit,
}

impl Committer {
    /// Starts the committer task; it ends when the last handle is dropped. Each batch waits
    /// `slow_disk` more before its first sync (tests stand in for a slow disk with it; a run
    /// passes zero).
    pub(crate) fn start(
        dest: Arc<Dest>,
        manifest: Arc<Manifest>,
        slow_disk: Duration,
    ) -> io::Result<Self> {
        let syncer = Arc::new(dest.syncer()?);
        let (tx, rx) = mpsc::channel(BATCH_FILES);
        tokio::spawn(run(dest.clone(), syncer, manifest.clone(), rx, slow_disk));
        Ok(Self {
            tx,
            dest,
            manifest,
            waiting: Arc::new(Semaphore::new(MAX_WAITING)),
        })
    }

    /// A place among the files waiting for their batch: waits while [`MAX_WAITING`] are. Taken
    /// while the object still holds its download slot, so downloads slow to the disk's pace
    /// instead of piling up finished files.
    pub(crate) async fn reserve(&self) -> Place {
        let permit = self.waiting.clone().acquire_owned().await;
        Place {
            _permit: permit.expect("the semaphore is never closed"),
        }
    }

    /// As [`publish`](Self::publish), for a file a reader waits for: made durable on its own
    /// (its data, its rename, the directories up to DEST) instead of in the next batch, whose
    /// `syncfs` would also wait for every other file being written at that moment.
    pub(crate) async fn publish_now(
        &self,
        rel: RelPath,
        key: String,
        etag: String,
        hash: blake3::Hash,
    ) -> io::Result<()> {
        let (dest, manifest) = (self.dest.clone(), self.manifest.clone());
        let job = move || {
            let stat = publish_alone(&dest, &rel)?;
            manifest.complete(&key, &etag, completed(&hash, &stat))?;
            manifest.sync()
        };
        tokio::task::spawn_blocking(job)
            .await
            .map_err(io::Error::other)?
    }

    /// Publishes `rel`'s partial file (object `key` at `etag`, hashing to `hash`) under its
    /// final name in the next batch, in the `place` reserved for it; returns once that and its
    /// manifest record are durable.
    pub(crate) async fn publish(
        &self,
        _place: Place,
        rel: RelPath,
        key: String,
        etag: String,
        hash: blake3::Hash,
    ) -> io::Result<()> {
        let (done, wait) = oneshot::channel();
        let job = Job {
            rel,
            key,
            etag,
            hash,
            done,
        };
        self.tx
            .send(job)
            .await
            .map_err(|_| io::Error::other("the committer has stopped"))?;
        wait.await
            .map_err(|_| io::Error::other("the committer stopped before the file was published"))?
    }
}

async fn run(
    dest: Arc<Dest>,
    syncer: Arc<Syncer>,
    manifest: Arc<Manifest>,
    mut rx: mpsc::Receiver<Job>,
    slow_disk: Duration,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + BATCH_WINDOW;
        while batch.len() < BATCH_FILES {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(job)) => batch.push(job),
                Ok(None) | Err(_) => break,
            }
        }
        if !slow_disk.is_zero() {
            tokio::time::sleep(slow_disk).await;
        }
        let (dest, syncer, manifest) = (dest.clone(), syncer.clone(), manifest.clone());
        let committed =
            tokio::task::spawn_blocking(move || commit_batch(&dest, &syncer, &manifest, batch))
                .await;
        if let Err(err) = committed {
            tracing::error!("commit batch panicked: {err}");
        }
    }
}

fn commit_batch(dest: &Dest, syncer: &Syncer, manifest: &Manifest, batch: Vec<Job>) {
    if let Err(err) = syncer.sync() {
        let msg = format!("syncing {}: {err}", dest.path().display());
        for job in batch {
            let _ = job.done.send(Err(io::Error::new(err.kind(), msg.clone())));
        }
        return;
    }
    let mut renamed = Vec::with_capacity(batch.len());
    for job in batch {
        match publish_one(dest, &job.rel) {
            Ok(stat) => renamed.push((job, stat)),
            Err(err) => {
                let _ = job.done.send(Err(err));
            }
        }
    }
    let synced = syncer.sync().and_then(|()| {
        for (job, stat) in &renamed {
            manifest.complete(&job.key, &job.etag, completed(&job.hash, stat))?;
        }
        manifest.sync()
    });
    for (job, _) in renamed {
        let _ = job.done.send(match &synced {
            Ok(()) => Ok(()),
            Err(err) => Err(io::Error::new(err.kind(), err.to_string())),
        });
    }
}

/// The manifest's record of a published file.
fn completed(hash: &blake3::Hash, stat: &FileStat) -> Completed {
    Completed {
        blake3: *hash.as_bytes(),
        inode: stat.inode,
        mtime_ns: stat.mtime_ns,
    }
}

/// Makes `rel`'s partial file durable, renames it and makes the rename durable, with the entries
/// of every directory from DEST down to it.
fn publish_alone(dest: &Dest, rel: &RelPath) -> io::Result<FileStat> {
    let mut dir = dest.root().try_clone()?;
    let mut dirs = Vec::new();
    for segment in rel.parents() {
        let next = dir.open_dir(segment)?;
        dirs.push(std::mem::replace(&mut dir, next));
    }
    dir.open_file(rel.partial_name(), OFlags::RDONLY)?
        .sync_data()?;
    let stat = publish_one(dest, rel)?;
    dir.sync()?;
    for ancestor in dirs.iter().rev() {
        ancestor.sync()?;
    }
    Ok(stat)
}

/// Renames `rel`'s partial file to its final name and returns what is now there; on failure
/// the partial file is removed.
fn publish_one(dest: &Dest, rel: &RelPath) -> io::Result<FileStat> {
    let dir = dest
        .open_parent(rel, false)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "its directory vanished"))?;
    let partial = rel.partial_name();
    dest::publish(&dir, &partial, rel.file_name()).inspect_err(|_| {
        let _ = dir.unlink(&partial);
    })?;
    dir.stat_regular(rel.file_name())?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the file vanished right after its rename",
        )
    })
}
