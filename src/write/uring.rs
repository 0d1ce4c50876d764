//! io_uring writes on one thread running a tokio-uring runtime; the kernel runs many writes
//! at once, so one submitting thread is enough.
//!
//! `tokio_uring::start()` panics where io_uring is blocked, so the probe builds the runtime
//! with `Runtime::new` and submits a no-op: both must succeed before this backend is used.

use std::io;

use tokio::sync::mpsc;

use super::{WriteJob, Writer};

pub(crate) struct UringWriter {
    tx: mpsc::UnboundedSender<WriteJob>,
}

impl UringWriter {
    /// Starts the io_uring thread, or says why io_uring cannot be used here.
    pub(crate) fn start() -> io::Result<Self> {
        let (tx, mut rx) = mpsc::unbounded_channel::<WriteJob>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        std::thread::Builder::new()
            .name("hydrator-uring".into())
            .spawn(move || {
                let runtime = match tokio_uring::Runtime::new(&tokio_uring::builder()) {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                runtime.block_on(async move {
                    if let Err(err) = tokio_uring::no_op().await {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                    let _ = ready_tx.send(Ok(()));
                    while let Some(job) = rx.recv().await {
                        tokio_uring::spawn(write(job));
                    }
                });
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("the io_uring thread died while starting"))??;
        Ok(Self { tx })
    }
}

async fn write(job: WriteJob) {
    let WriteJob {
        file,
        offset,
        buf,
        done,
    } = job;
    let result = async {
        // The ring needs a file it owns; a duplicate descriptor costs two cheap syscalls per
        // buffer, far below the cost of the write itself.
        let file = tokio_uring::fs::File::from_std(file.try_clone()?);
        let (written, buf) = file.write_all_at(buf, offset).await;
        drop(buf);
        written?;
        file.close().await
    }
    .await;
    let _ = done.send(result);
}

impl Writer for UringWriter {
    fn submit(&self, job: WriteJob) {
        if let Err(mpsc::error::SendError(job)) = self.tx.send(job) {
            let _ = job
                .done
                .send(Err(io::Error::other("the io_uring thread has stopped")));
        }
    }
}
