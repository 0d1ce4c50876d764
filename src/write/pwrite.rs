//! Positional `pwrite` on a few blocking threads: works everywhere, including under seccomp
//! profiles that refuse io_uring.

use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::{WriteJob, Writer};

/// Threads blocked in `pwrite` at once; enough to keep an NVMe queue busy with buffered writes.
const THREADS: usize = 4;

pub(crate) struct PwriteWriter {
    tx: mpsc::UnboundedSender<WriteJob>,
}

impl PwriteWriter {
    pub(crate) fn start() -> Self {
        let (tx, rx) = mpsc::unbounded_channel::<WriteJob>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..THREADS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("hydrator-pwrite-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().expect("writer queue lock").blocking_recv();
                    let Some(job) = job else { return };
                    let result = job.file.write_all_at(job.buf.as_slice(), job.offset);
                    drop(job.buf);
                    let _ = job.done.send(result);
                })
                .expect("spawn a writer thread");
        }
        Self { tx }
    }
}

impl Writer for PwriteWriter {
    fn submit(&self, job: WriteJob) {
        if let Err(mpsc::error::SendError(job)) = self.tx.send(job) {
            let _ = job.done.send(Err(std::io::Error::other(
                "the writer threads have stopped",
            )));
        }
    }
}
