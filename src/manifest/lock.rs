//! One writer per DEST: an exclusive `flock` on `DEST/.hydrator/lock`. A second sync on the same
//! DEST (two init containers on one node) says it waits, waits, then usually finds the work done.
//! The kernel drops the lock when the holder dies, so a killed run never leaves it stuck.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{IoContext, SyncError};
use crate::write::dest;

const LOCK: &str = "lock";
const POLL: Duration = Duration::from_millis(100);

/// Held for the whole run; released when dropped.
pub struct DestLock {
    _file: File,
}

/// Takes the lock, waiting at most `timeout` (forever when `None`).
pub async fn acquire(
    state_dir: &OwnedFd,
    timeout: Option<Duration>,
) -> Result<DestLock, SyncError> {
    let file = dest::open_in(state_dir, LOCK, libc::O_RDWR | libc::O_CREAT)
        .local("opening the lock file", ".hydrator/lock")?;
    let started = Instant::now();
    let mut told = false;
    loop {
        // SAFETY: valid fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            if told {
                tracing::info!(
                    "got the lock after {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
            return Ok(DestLock { _file: file });
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Err(err).local("locking", ".hydrator/lock")?);
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
