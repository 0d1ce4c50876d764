//! Reads of a file still downloading: which of its parts are written, and who waits for which
//! bytes.
//!
//! A lazy view used to answer an open once the whole file was local, so a loader opening a
//! 150 MiB shard waited for all of it. Now a read waits for the parts it covers only. The
//! engine tells the [`Schedule`](super::schedule::Schedule) when a multi-part download has its
//! partial file ([`Streams::start`]) and when each part of it is written ([`Streams::written`]);
//! a reader asks for a byte range and is answered with the partial file's inode and the byte
//! runs written so far ([`Readable::Partial`]), or with [`Readable::Whole`] once the file is
//! published.
//!
//! What a written part has passed when a reader gets it (`part.rs`): its GET was pinned to the
//! listed version (`If-Match` on the ETag, or the version id), answered with exactly the range
//! asked, and its bytes were written whole to the partial file. What it has *not* passed yet:
//! the whole file's checks (its BLAKE3 against a seal, the full-object CRC, `--check-md5`),
//! which run at publish as before; READY still waits for every one of them. A file fetched
//! from peers is never streamed: a peer's bytes are trusted only through the seal's whole-file
//! hash, so its readers wait for the whole file.
//!
//! The inode names one attempt: a download started again (a whole-file check failed) writes a
//! new partial file, and a reader told of the old inode asks again. An attempt whose partial
//! file is discarded leaves [`Streams`] before the next one is created ([`Streams::discarded`]),
//! and the engine streams no later attempt of that object in the run: after a rejection its
//! readers wait for the whole, verified file. The view ([`crate::mount::view`]) fails the
//! handles that read from a discarded attempt.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use tokio::sync::oneshot;

/// Why an object is not local: its fetch failed (the engine's reason), or the view is stopping.
pub(crate) type Unavailable = Arc<str>;

/// Where a reader finds the bytes it asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Readable {
    /// The file is published: read it at its final name.
    Whole,
    /// The file is downloading into the partial file with inode `inode`, of which the byte
    /// `runs` are written (sorted, disjoint), the asked range among them.
    Partial { inode: u64, runs: Vec<Range<u64>> },
}

pub(crate) type RangeOutcome = Result<Readable, Unavailable>;

/// Whether a wanted byte range is readable now, or when it will be.
pub(crate) enum RangeWanted {
    Now(RangeOutcome),
    Later(oneshot::Receiver<RangeOutcome>),
}

/// One multi-part download's partial file.
struct Stream {
    inode: u64,
    size: u64,
    part_size: u64,
    written: Vec<bool>,
}

impl Stream {
    /// The parts holding any byte of `bytes`.
    fn parts(&self, bytes: &Range<u64>) -> Range<usize> {
        let end = bytes.end.min(self.size);
        if bytes.start >= end {
            return 0..0;
        }
        let first = bytes.start / self.part_size;
        let last = (end - 1) / self.part_size;
        first as usize..last as usize + 1
    }

    fn covers(&self, bytes: &Range<u64>) -> bool {
        self.parts(bytes).all(|part| self.written[part])
    }

    fn readable(&self) -> Readable {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for (part, _) in self.written.iter().enumerate().filter(|(_, w)| **w) {
            let start = part as u64 * self.part_size;
            let end = (start + self.part_size).min(self.size);
            match runs.last_mut() {
                Some(last) if last.end == start => last.end = end,
                _ => runs.push(start..end),
            }
        }
        Readable::Partial {
            inode: self.inode,
            runs,
        }
    }
}

struct RangeWaiter {
    bytes: Range<u64>,
    tell: oneshot::Sender<RangeOutcome>,
}

/// The streams of one run and their waiters, by the object's place in the listing.
#[derive(Default)]
pub(super) struct Streams {
    streams: HashMap<usize, Stream>,
    waiters: HashMap<usize, Vec<RangeWaiter>>,
}

impl Streams {
    /// Object `at` downloads into the partial file `inode`, of `size` bytes in parts of
    /// `part_size`, of which `written` hold their bytes already (resumed).
    pub(super) fn start(
        &mut self,
        at: usize,
        inode: u64,
        (size, part_size): (u64, u64),
        written: impl IntoIterator<Item = u32>,
    ) {
        let parts = size.div_ceil(part_size.max(1)) as usize;
        let mut stream = Stream {
            inode,
            size,
            part_size: part_size.max(1),
            written: vec![false; parts],
        };
        for part in written {
            if let Some(slot) = stream.written.get_mut(part as usize) {
                *slot = true;
            }
        }
        self.streams.insert(at, stream);
        self.answer_covered(at);
    }

    /// Part `index` of object `at`'s partial file `inode` is written.
    pub(super) fn written(&mut self, at: usize, inode: u64, index: u32) {
        let Some(stream) = self.streams.get_mut(&at).filter(|s| s.inode == inode) else {
            return;
        };
        if let Some(slot) = stream.written.get_mut(index as usize) {
            *slot = true;
        }
        self.answer_covered(at);
    }

    /// Object `at`'s partial file `inode` was discarded (its whole-file check rejected it, or
    /// its download was given up): its parts are readable no more, and the readers waiting
    /// wait on for the next attempt or the object's end.
    pub(super) fn discarded(&mut self, at: usize, inode: u64) {
        if self.streams.get(&at).is_some_and(|s| s.inode == inode) {
            self.streams.remove(&at);
        }
    }

    /// Object `at` is published (`Ok`) or failed: every reader waiting on it is told.
    pub(super) fn finished(&mut self, at: usize, outcome: &Result<(), Unavailable>) {
        self.streams.remove(&at);
        let answer = outcome.clone().map(|()| Readable::Whole);
        for waiter in self.waiters.remove(&at).unwrap_or_default() {
            let _ = waiter.tell.send(answer.clone());
        }
    }

    /// Nothing more will be fetched: every waiter gets `reason`.
    pub(super) fn close(&mut self, reason: &Unavailable) {
        self.streams.clear();
        for (_, waiters) in self.waiters.drain() {
            for waiter in waiters {
                let _ = waiter.tell.send(Err(reason.clone()));
            }
        }
    }

    /// `bytes` of object `at` when they are written now.
    pub(super) fn readable_now(&self, at: usize, bytes: &Range<u64>) -> Option<Readable> {
        let stream = self.streams.get(&at)?;
        stream.covers(bytes).then(|| stream.readable())
    }

    /// Waits for `bytes` of object `at`.
    pub(super) fn wait(&mut self, at: usize, bytes: Range<u64>) -> oneshot::Receiver<RangeOutcome> {
        let (tell, told) = oneshot::channel();
        let waiters = self.waiters.entry(at).or_default();
        waiters.retain(|waiter| !waiter.tell.is_closed());
        waiters.push(RangeWaiter { bytes, tell });
        told
    }

    /// Whether a reader still waits for any byte of `part` of object `at`.
    pub(super) fn waits_for(&self, at: usize, part: &Range<u64>) -> bool {
        self.waiters.get(&at).is_some_and(|waiters| {
            waiters.iter().any(|waiter| {
                !waiter.tell.is_closed()
                    && waiter.bytes.start < part.end
                    && part.start < waiter.bytes.end
            })
        })
    }

    /// Whether a reader still waits for any byte of object `at`.
    pub(super) fn waits_any(&self, at: usize) -> bool {
        self.waiters
            .get(&at)
            .is_some_and(|waiters| waiters.iter().any(|waiter| !waiter.tell.is_closed()))
    }

    fn answer_covered(&mut self, at: usize) {
        let (Some(stream), Some(waiters)) = (self.streams.get(&at), self.waiters.get_mut(&at))
        else {
            return;
        };
        let mut readable = None;
        let mut waiting = Vec::with_capacity(waiters.len());
        for waiter in waiters.drain(..) {
            if waiter.tell.is_closed() {
                continue;
            }
            match stream.covers(&waiter.bytes) {
                true => {
                    let answer = readable.get_or_insert_with(|| stream.readable()).clone();
                    let _ = waiter.tell.send(Ok(answer));
                }
                false => waiting.push(waiter),
            }
        }
        *waiters = waiting;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_range_is_readable_once_every_part_it_touches_is_written() {
        let mut streams = Streams::default();
        streams.start(3, 77, (20 * MIB, 8 * MIB), [2]);
        assert_eq!(
            streams.readable_now(3, &(17 * MIB..18 * MIB)),
            Some(Readable::Partial {
                inode: 77,
                runs: std::iter::once(16 * MIB..20 * MIB).collect()
            }),
            "the last, short part was resumed"
        );
        let mut told = streams.wait(3, 7 * MIB..9 * MIB);
        assert!(streams.waits_for(3, &(0..8 * MIB)));
        assert!(streams.waits_for(3, &(8 * MIB..16 * MIB)));
        assert!(!streams.waits_for(3, &(16 * MIB..20 * MIB)));
        streams.written(3, 77, 1);
        assert!(told.try_recv().is_err(), "part 0 is still missing");
        streams.written(3, 99, 0);
        assert!(
            told.try_recv().is_err(),
            "another attempt's part says nothing"
        );
        streams.written(3, 77, 0);
        assert_eq!(
            told.try_recv().unwrap(),
            Ok(Readable::Partial {
                inode: 77,
                runs: std::iter::once(0..20 * MIB).collect()
            })
        );
        assert!(!streams.waits_any(3));
    }

    #[test]
    fn waiters_learn_the_end_a_published_file_a_failure_or_a_close() {
        let mut streams = Streams::default();
        streams.start(1, 5, (16 * MIB, 8 * MIB), []);
        let mut published = streams.wait(1, 0..1);
        let mut failed = streams.wait(2, 0..1);
        let mut closed = streams.wait(4, 0..1);
        streams.finished(1, &Ok(()));
        assert_eq!(published.try_recv().unwrap(), Ok(Readable::Whole));
        assert_eq!(streams.readable_now(1, &(0..1)), None, "no stream left");
        streams.finished(2, &Err("gone".into()));
        assert_eq!(&*failed.try_recv().unwrap().unwrap_err(), "gone");
        streams.close(&"stopping".into());
        assert_eq!(&*closed.try_recv().unwrap().unwrap_err(), "stopping");
    }

    #[test]
    fn a_discarded_attempt_is_readable_no_more_and_its_readers_wait_for_the_end() {
        let mut streams = Streams::default();
        streams.start(0, 8, (16 * MIB, 8 * MIB), [0, 1]);
        assert!(streams.readable_now(0, &(0..1)).is_some());
        streams.discarded(0, 9);
        assert!(
            streams.readable_now(0, &(0..1)).is_some(),
            "another attempt's"
        );
        streams.discarded(0, 8);
        assert_eq!(streams.readable_now(0, &(0..1)), None);
        let mut told = streams.wait(0, 0..1);
        assert!(told.try_recv().is_err(), "waits for the next attempt");
        streams.finished(0, &Ok(()));
        assert_eq!(told.try_recv().unwrap(), Ok(Readable::Whole));
    }

    #[test]
    fn a_reader_that_gave_up_waits_for_nothing() {
        let mut streams = Streams::default();
        drop(streams.wait(0, 0..1));
        assert!(!streams.waits_any(0));
        assert!(!streams.waits_for(0, &(0..MIB)));
    }
}
