//! Part durability for resume. A part whose bytes are written is only *written*; after a crash
//! its preallocated region may read back as zeros. Every 100 ms (sooner when enough
//! data is pending) the checkpointer makes DEST's filesystem durable with one `syncfs` and only
//! then records the parts written before it as durable in the manifest. A resumed run trusts
//! exactly those parts; the rest is fetched again, so re-fetching after a crash is bounded by
//! the parts in flight plus one checkpoint's worth of data.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::manifest::{DurablePart, Manifest};
use crate::write::dest::{Dest, Syncer};

const INTERVAL: Duration = Duration::from_millis(100);
/// Pending bytes that trigger a checkpoint before the interval ends.
pub(crate) const CHECKPOINT_BYTES: u64 = 32 << 20;

struct WrittenPart {
    key: String,
    attempt: u64,
    index: u32,
    part: DurablePart,
}

/// Parts written since the last checkpoint.
pub(crate) struct Checkpoints {
    pending: Mutex<Vec<WrittenPart>>,
    pending_bytes: AtomicU64,
    wake: Notify,
    syncer: Syncer,
}

impl Checkpoints {
    pub(crate) fn new(dest: &Dest) -> std::io::Result<Self> {
        Ok(Self {
            pending: Mutex::default(),
            pending_bytes: AtomicU64::new(0),
            wake: Notify::new(),
            syncer: dest.syncer()?,
        })
    }

    pub(crate) fn part_written(
        &self,
        key: &str,
        attempt: u64,
        index: u32,
        part: DurablePart,
        bytes: u64,
    ) {
        self.pending
            .lock()
            .expect("checkpoint lock")
            .push(WrittenPart {
                key: key.to_string(),
                attempt,
                index,
                part,
            });
        if self.pending_bytes.fetch_add(bytes, Relaxed) + bytes >= CHECKPOINT_BYTES {
            self.wake.notify_one();
        }
    }

    /// Syncs DEST's filesystem, then records every part written before the sync as durable.
    pub(crate) fn flush(&self, manifest: &Manifest) -> std::io::Result<()> {
        let parts = std::mem::take(&mut *self.pending.lock().expect("checkpoint lock"));
        self.pending_bytes.store(0, Relaxed);
        if parts.is_empty() {
            return Ok(());
        }
        self.syncer.sync()?;
        let mut by_object: std::collections::BTreeMap<(&str, u64), Vec<(u32, DurablePart)>> =
            Default::default();
        for part in &parts {
            by_object
                .entry((&part.key, part.attempt))
                .or_default()
                .push((part.index, part.part));
        }
        for ((key, attempt), parts) in by_object {
            manifest.parts_durable(key, attempt, &parts)?;
        }
        manifest.sync()
    }
}

/// Runs checkpoints until the returned task is aborted.
pub(crate) fn spawn(
    checkpoints: Arc<Checkpoints>,
    manifest: Arc<Manifest>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let _ = tokio::time::timeout(INTERVAL, checkpoints.wake.notified()).await;
            let (checkpoints, manifest) = (checkpoints.clone(), manifest.clone());
            let flushed = tokio::task::spawn_blocking(move || checkpoints.flush(&manifest)).await;
            if let Ok(Err(err)) = flushed {
                tracing::warn!(
                    "recording durable parts failed (a resume will fetch them again): {err}"
                );
            }
        }
    })
}
