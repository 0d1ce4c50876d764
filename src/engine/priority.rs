//! Wanted parts first: the GETs of a file a reader waits for go ahead of the background's.
//!
//! A lazy view dispatches an opened file before any other *object* (`schedule.rs`), but its
//! GETs then met three queues that served in arrival order: the request slots (a FIFO
//! semaphore, where the parts of two 150 MiB shards already stood, 19 each), the slots' weight
//! (a 100 KB GET behind a full 8 MiB part), and the bandwidth cap (a virtual clock that every
//! byte pushes). At 10 MiB/s a 100 KB file waited 17–29 s behind two shards. So:
//! - **slots by request, not by arrival**: background parts queue for their turn on a mutex of
//!   their own and only the one whose turn it is waits at the slots; it gives its place up as
//!   soon as a wanted part starts waiting ([`Precedence`]), so the next slot freed goes to the
//!   wanted part. Tokio's semaphore cannot reorder its waiters, and cancelling one (which is
//!   what giving the place up is) returns whatever it had been assigned: no slot is lost.
//! - **a small reserve**: [`RESERVED_SLOTS`] slots beyond the limit that only wanted parts
//!   take, so a wanted part never waits for a background part of 8 MiB to end. They are counted
//!   in the buffer pool, so memory stays bounded by `(2 × (requests + reserve) + 4)` buffers.
//! - **the bandwidth cap to wanted bytes first**: wanted bytes are paced on a clock of their own
//!   and also push the clock background bytes are paced on (`rate.rs`): while wanted bytes flow
//!   the background yields its share, and the sum stays within the cap.
//!
//! A part's priority is read when it asks for its slot, and a part waiting as a background one
//! becomes wanted when a reader opens its file meanwhile (a file the background had already
//! dispatched: opened, it waited 22 s behind the shards' parts); a part already streaming keeps
//! its pace. A sync (no schedule) has no reader and no wanted part: its parts take the slots
//! in arrival order, straight from the semaphore, as before any of this.

use std::future::Future;
use std::ops::Range;

use tokio::sync::{watch, Mutex};

use super::schedule::Schedule;

/// Request slots kept beyond the limit for wanted parts.
pub(crate) const RESERVED_SLOTS: usize = 2;

/// Whom a GET serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Priority {
    /// A file a reader waits for.
    Wanted,
    /// Everything else: the listing order, read-ahead, a plain sync.
    Background,
}

impl Priority {
    /// The priority of the part of `key` holding the bytes `part`: wanted while a reader of
    /// `schedule` waits for it (for the whole file, or for a range the part holds).
    pub(crate) fn of(schedule: &Schedule, key: &str, part: &Range<u64>) -> Self {
        match schedule.is_part_wanted(key, part) {
            true => Self::Wanted,
            false => Self::Background,
        }
    }
}

/// Which waiter gets a slot first: a wanted part, then the background parts in order.
pub(crate) struct Precedence {
    /// Wanted parts waiting for a slot now.
    wanted: watch::Sender<usize>,
    /// Background parts wait here for their turn at the slots.
    turn: Mutex<()>,
}

impl Default for Precedence {
    fn default() -> Self {
        Self {
            wanted: watch::channel(0).0,
            turn: Mutex::new(()),
        }
    }
}

/// A wanted part's place among the waiting ones, given up when dropped (also when cancelled).
struct Waiting<'a>(&'a watch::Sender<usize>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Precedence {
    /// A slot for a background part, from `acquire` (called again after each time the part
    /// stood aside): only while no wanted part waits, and after the background parts that
    /// asked before it.
    pub(crate) async fn background<T, F>(&self, mut acquire: impl FnMut() -> F) -> T
    where
        F: Future<Output = T>,
    {
        let _turn = self.turn.lock().await;
        let mut wanted = self.wanted.subscribe();
        loop {
            // The sender lives in `self`: neither wait can end in a closed channel.
            let _ = wanted.wait_for(|n| *n == 0).await;
            tokio::select! {
                biased;
                got = acquire() => return got,
                _ = wanted.wait_for(|n| *n > 0) => {}
            }
        }
    }

    /// A slot for a wanted part that found none free at once: the first of `shared` (the
    /// limit's, where it now stands ahead of every background part) and `reserved`.
    pub(crate) async fn wanted<T>(
        &self,
        shared: impl Future<Output = T>,
        reserved: impl Future<Output = T>,
    ) -> T {
        self.wanted.send_modify(|n| *n += 1);
        let _waiting = Waiting(&self.wanted);
        tokio::select! {
            biased;
            got = shared => got,
            got = reserved => got,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::{OwnedSemaphorePermit, Semaphore};

    use super::*;

    async fn one(slots: &Arc<Semaphore>) -> OwnedSemaphorePermit {
        slots.clone().acquire_owned().await.expect("open")
    }

    #[tokio::test]
    async fn a_wanted_waiter_gets_the_next_slot_before_background_ones_that_came_first() {
        let precedence = Arc::new(Precedence::default());
        let slots = Arc::new(Semaphore::new(1));
        let held = one(&slots).await;
        let (order, mut got) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (precedence, slots, order) = (precedence.clone(), slots.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let permit = precedence.background(|| one(&slots)).await;
                order.send(format!("background {i}")).unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(permit);
            }));
            tokio::task::yield_now().await;
        }
        let never = std::future::pending::<OwnedSemaphorePermit>();
        let wanted = {
            let (precedence, slots, order) = (precedence.clone(), slots.clone(), order.clone());
            tokio::spawn(async move {
                let permit = precedence.wanted(one(&slots), never).await;
                order.send("wanted".to_string()).unwrap();
                drop(permit);
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        wanted.await.unwrap();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        drop(order);
        let mut seen = Vec::new();
        while let Some(who) = got.recv().await {
            seen.push(who);
        }
        assert_eq!(
            seen,
            ["wanted", "background 0", "background 1", "background 2"]
        );
        assert_eq!(*precedence.wanted.borrow(), 0, "no wanted part waits now");
    }

    #[tokio::test]
    async fn a_wanted_waiter_takes_the_reserve_and_one_cancelled_lets_the_background_on() {
        let precedence = Precedence::default();
        let (shared, reserve) = (Arc::new(Semaphore::new(1)), Arc::new(Semaphore::new(1)));
        let held = one(&shared).await;
        let within = |ms| Duration::from_millis(ms);
        let wanted = precedence.wanted(one(&shared), one(&reserve));
        let reserved = tokio::time::timeout(within(100), wanted).await;
        let reserved = reserved.expect("the reserve was free");
        let wanted = precedence.wanted(one(&shared), one(&reserve));
        let cancelled = tokio::time::timeout(within(20), wanted).await;
        assert!(cancelled.is_err(), "shared and reserve are both taken");
        assert_eq!(*precedence.wanted.borrow(), 0, "its place was given up");
        drop((held, reserved));
        let background = precedence.background(|| one(&shared));
        let got = tokio::time::timeout(within(100), background).await;
        drop(got.expect("no wanted part waits: the background goes on"));
    }
}
