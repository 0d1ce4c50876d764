//! The local side: safe paths under DEST, pooled buffers, writer threads, atomic commit.
//!
//! Why it is built this way:
//! - Data writes run on dedicated writer threads fed by a channel, so a slow disk never blocks
//!   the async runtime that drives the network. The buffer returns to the pool once written.
//! - Two backends sit behind [`Writer`]: io_uring (tokio-uring) and positional `pwrite`.
//!   io_uring is refused by the default seccomp profiles of Docker ≥ 25, containerd ≥ 2.0,
//!   CRI-O and Podman, and by `kernel.io_uring_disabled`, so `auto` probes it (a ring and a
//!   no-op) and falls back to `pwrite`; the fallback is the common case in production. Files
//!   that fit one buffer do not use either: they are written with one `pwrite` (below).
//! - A file is written as `.NAME.partial` beside its final name, preallocated with `fallocate`
//!   (which also fails fast on a full disk), and renamed only after its data is durable.
//! - A file that fits one pooled buffer skips the writer threads and the preallocation: it is
//!   created and written in one call on the blocking thread that creates it (see
//!   `engine::object`), since for small files the hand-offs cost more than the bytes.
//! - Durability is batched (see [`commit`]): one `syncfs` for many files instead of one
//!   `fdatasync` each, so 20,000 small files do not pay 20,000 journal commits.

pub mod buffer;
pub(crate) mod commit;
pub(crate) mod dest;
pub(crate) mod partials;
pub(crate) mod prune;
mod pwrite;
mod uring;
pub(crate) mod walk;

use std::fs::File;
use std::io;
use std::sync::Arc;

use tokio::sync::oneshot;

use buffer::PooledBuf;

use crate::config::IoBackendChoice;
use crate::error::UsageError;

/// One positional write of a pooled buffer into an open file.
pub struct WriteJob {
    pub file: Arc<File>,
    pub offset: u64,
    pub buf: PooledBuf,
    pub done: oneshot::Sender<io::Result<()>>,
}

/// A set of writer threads.
pub trait Writer: Send + Sync {
    fn submit(&self, job: WriteJob);
}

/// The backend that actually runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    IoUring,
    Pwrite,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::IoUring => "io_uring",
            Backend::Pwrite => "pwrite",
        })
    }
}

/// The writers of a run, with what was chosen and why.
pub struct Writers {
    pub writer: Box<dyn Writer>,
    pub backend: Backend,
    /// Why io_uring is not used when `auto` fell back to pwrite.
    pub fallback_reason: Option<String>,
}

impl Writers {
    pub fn start(choice: IoBackendChoice) -> Result<Self, UsageError> {
        let pwrite = |reason| Writers {
            writer: Box::new(pwrite::PwriteWriter::start()),
            backend: Backend::Pwrite,
            fallback_reason: reason,
        };
        match choice {
            IoBackendChoice::Pwrite => Ok(pwrite(None)),
            IoBackendChoice::IoUring => match uring::UringWriter::start() {
                Ok(writer) => Ok(Self::uring(writer)),
                Err(err) => Err(UsageError::new(format!(
                    "--io-backend io-uring: io_uring is not available here ({err}); use auto or pwrite"
                ))),
            },
            IoBackendChoice::Auto => match uring::UringWriter::start() {
                Ok(writer) => Ok(Self::uring(writer)),
                Err(err) => {
                    let reason = format!("io_uring is not available ({err})");
                    tracing::warn!("{reason}; writing with pwrite");
                    Ok(pwrite(Some(reason)))
                }
            },
        }
    }

    fn uring(writer: uring::UringWriter) -> Self {
        Writers {
            writer: Box::new(writer),
            backend: Backend::IoUring,
            fallback_reason: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::buffer::BufferPool;
    use std::os::unix::fs::FileExt;

    async fn write_pattern(writers: &Writers, path: &std::path::Path) -> Vec<u8> {
        let file = Arc::new(
            File::options()
                .create_new(true)
                .read(true)
                .write(true)
                .open(path)
                .unwrap(),
        );
        let pool = BufferPool::new(4, 8192);
        let mut expected = vec![0u8; 8192 * 5 + 100];
        let mut waits = Vec::new();
        // Out of order, as parts finish in any order.
        for (i, chunk) in expected.chunks_mut(8192).enumerate().rev() {
            chunk
                .iter_mut()
                .for_each(|b| *b = (i as u8).wrapping_mul(37).wrapping_add(1));
            let mut buf = pool.acquire().await;
            buf.fill_from(chunk);
            let (done, wait) = oneshot::channel();
            let offset = (i * 8192) as u64;
            writers.writer.submit(WriteJob {
                file: file.clone(),
                offset,
                buf,
                done,
            });
            waits.push(wait);
        }
        for wait in waits {
            wait.await.unwrap().unwrap();
        }
        let mut back = vec![0u8; expected.len()];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, expected);
        back
    }

    #[tokio::test]
    async fn both_backends_write_identical_files() {
        let dir = tempfile::tempdir().unwrap();
        let pwrite = Writers::start(IoBackendChoice::Pwrite).unwrap();
        assert_eq!(pwrite.backend, Backend::Pwrite);
        let a = write_pattern(&pwrite, &dir.path().join("a")).await;
        let auto = Writers::start(IoBackendChoice::Auto).unwrap();
        let b = write_pattern(&auto, &dir.path().join("b")).await;
        assert_eq!(a, b);
    }
}
