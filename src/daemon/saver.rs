//! Saving the daemon's state (`state.json`) off the request path, in batches; the only writer
//! once the daemon has started. A change bumps a
//! generation and wakes one saver task, which writes the whole state at most once per
//! [`SAVE_INTERVAL`]; every change made meanwhile rides on the next write. A lease request
//! waits for the write that holds its change and answers 500 if that write failed, so a caller
//! is never told a lease is held when a restart would lose it. However many leases are taken
//! at once, the file is rewritten a few times a second at most.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Daemon;

/// The shortest time between two writes of `state.json`.
const SAVE_INTERVAL: Duration = Duration::from_millis(200);

/// The outcome of the newest write.
#[derive(Clone, Debug, Default)]
struct Saved {
    /// The change generation it holds.
    generation: u64,
    /// Why it failed (the next change writes again).
    error: Option<(io::ErrorKind, String)>,
}

pub(crate) struct StateSaver {
    /// The newest change's generation.
    changed: watch::Sender<u64>,
    saved: watch::Sender<Saved>,
    /// Set once nothing can change the state any more (the listeners are closed).
    closing: watch::Sender<bool>,
}

impl Default for StateSaver {
    fn default() -> Self {
        Self {
            changed: watch::channel(0).0,
            saved: watch::channel(Saved::default()).0,
            closing: watch::channel(false).0,
        }
    }
}

impl StateSaver {
    /// Records that the state changed; returns the change's generation.
    pub(crate) fn changed(&self) -> u64 {
        let mut generation = 0;
        self.changed.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        generation
    }

    /// Waits until the change `generation` is on disk, or the write that should hold it failed.
    pub(crate) async fn durable(&self, generation: u64) -> io::Result<()> {
        let mut saved = self.saved.subscribe();
        let saved = saved
            .wait_for(|saved| saved.generation >= generation)
            .await
            .expect("the sender lives as long as the saver");
        match &saved.error {
            None => Ok(()),
            Some((kind, message)) => Err(io::Error::new(*kind, message.clone())),
        }
    }

    /// Ends [`StateSaver::run`] after one last write; call it once the listeners are closed,
    /// so that write holds every change a caller was answered for.
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Writes the state whenever it changed, until [`StateSaver::close`]; then writes once more.
    pub(crate) async fn run(daemon: Arc<Daemon>) {
        let mut changed = daemon.saver.changed.subscribe();
        let mut closing = daemon.saver.closing.subscribe();
        loop {
            let written = daemon.saver.saved.borrow().generation;
            let last = tokio::select! {
                _ = changed.wait_for(|g| *g > written) => false,
                _ = closing.wait_for(|closing| *closing) => true,
            };
            let generation = *changed.borrow_and_update();
            let writer = daemon.clone();
            let result = tokio::task::spawn_blocking(move || writer.save_now())
                .await
                .unwrap_or_else(|panic| Err(io::Error::other(panic.to_string())));
            daemon.saver.saved.send_replace(Saved {
                generation,
                error: result.err().map(|e| (e.kind(), e.to_string())),
            });
            if last {
                return;
            }
            tokio::time::sleep(SAVE_INTERVAL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_gets_the_outcome_of_the_write_that_holds_its_change() {
        let saver = StateSaver::default();
        let first = saver.changed();
        let second = saver.changed();
        assert_eq!((first, second), (1, 2));
        let waiting = tokio::time::timeout(Duration::from_millis(50), saver.durable(first));
        assert!(waiting.await.is_err(), "nothing written yet");
        saver.saved.send_replace(Saved {
            generation: 2,
            error: Some((io::ErrorKind::StorageFull, "disk full".into())),
        });
        let err = saver.durable(first).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        saver.saved.send_replace(Saved {
            generation: 3,
            error: None,
        });
        assert!(saver.durable(second).await.is_ok());
    }
}
