//! One writer per DEST: an exclusive `flock` on `DEST/.hydrator/lock`. A second sync on the same
//! DEST (two init containers on one node) says it waits, waits, then usually finds the work done.
//! The kernel drops the lock when the holder dies, so a killed run never leaves it stuck.

use std::fs::{File, TryLockError};
use std::time::{Duration, Instant};

use crate::error::{IoContext, SyncError};
use crate::fs::{Dir, OFlags};

const LOCK: &str = "lock";
const POLL: Duration = Duration::from_millis(100);

/// Held for the whole run; released when dropped.
pub(crate) struct DestLock {
    _file: File,
}

/// Whether another process holds DEST's lock now; only reads (`--dry-run`).
pub(crate) fn held_elsewhere(state_dir: &Dir) -> bool {
    state_dir
        .open_file(LOCK, OFlags::RDONLY)
        .is_ok_and(|file| matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock)))
}

/// Takes the lock, waiting at most `timeout` (forever when `None`).
pub(crate) async fn acquire(
    state_dir: &Dir,
    timeout: Option<Duration>,
) -> Result<DestLock, SyncError> {
    let file = state_dir
        .open_file(LOCK, OFlags::RDWR | OFlags::CREATE)
        .local("opening the lock file", ".hydrator/lock")?;
    let started = Instant::now();
    let mut told = false;
    loop {
        // `flock(LOCK_EX | LOCK_NB)` on Linux.
        match file.try_lock() {
            Ok(()) => {
                if told {
                    tracing::info!(
                        "got the lock after {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(DestLock { _file: file });
            }
            Err(TryLockError::Error(err)) => {
                return Err(Err(err).local("locking", ".hydrator/lock")?)
            }
            Err(TryLockError::WouldBlock) => {}
        }
        if !told {
            tracing::info!("another hydrator is working on this DEST; waiting for it to finish");
            told = true;
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Err(SyncError::LockTimeout(started.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(POLL).await;
    }
}
