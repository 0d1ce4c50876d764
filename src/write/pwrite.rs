//! Positional `pwrite` on a few blocking threads: works everywhere, including under seccomp
//! profiles that refuse io_uring.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::buffer::consume;
use super::{WriteBuf, WriteJob, Writer};

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
                    let result = match job.buf {
                        WriteBuf::Aligned(buf) => job.file.write_all_at(buf.as_slice(), job.offset),
                        WriteBuf::Chunks(list) => {
                            let (chunks, _permit) = list.into_parts();
                            write_all_vectored_at(&job.file, chunks, job.offset)
                        }
                    };
                    let _ = job.done.send(result);
                })
                .expect("spawn a writer thread");
        }
        Self { tx }
    }
}

/// `pwritev` until every chunk is written.
fn write_all_vectored_at(file: &File, mut chunks: Vec<Bytes>, mut offset: u64) -> io::Result<()> {
    while !chunks.is_empty() {
        let slices: Vec<IoSlice> = chunks.iter().map(|chunk| IoSlice::new(chunk)).collect();
        match rustix::io::pwritev(file, &slices, offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => {
                offset += written as u64;
                consume(&mut chunks, written);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
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
