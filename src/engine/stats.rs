//! Counters shared by the engine, the progress display and the report.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

#[derive(Default, Debug)]
pub(crate) struct Stats {
    /// The listing has ended: the totals below are final.
    pub listing_done: AtomicBool,
    pub objects_listed: AtomicU64,
    pub bytes_listed: AtomicU64,
    /// The listing's read-ahead (which runs ahead of the downloads, spooled to disk): objects
    /// and bytes it has seen that the filters select. Final once `ahead_done` is set, which
    /// can be long before `listing_done`.
    pub ahead_done: AtomicBool,
    pub ahead_objects: AtomicU64,
    pub ahead_bytes: AtomicU64,
    pub objects_downloaded: AtomicU64,
    pub objects_skipped: AtomicU64,
    pub objects_failed: AtomicU64,
    pub objects_filtered: AtomicU64,
    pub directory_markers: AtomicU64,
    /// Bytes received from the server (retried bytes count again).
    pub bytes_received: AtomicU64,
    /// Bytes of files committed by this run.
    pub bytes_downloaded: AtomicU64,
    pub bytes_skipped: AtomicU64,
    /// Bytes of parts made durable by an earlier, interrupted run and not fetched again.
    pub bytes_resumed: AtomicU64,
    /// Part attempts repeated after a broken body or an error the SDK gave up on.
    pub part_retries: AtomicU64,
    /// Local files removed by `--delete`.
    pub files_deleted: AtomicU64,
    /// Files in DEST, in the filters' scope, that are not part of the source.
    pub files_foreign: AtomicU64,
    /// Objects started again because they changed on the server.
    pub object_restarts: AtomicU64,
    /// Bytes of files that came from the node's peers (and matched their seal).
    pub bytes_from_peers: AtomicU64,
    /// Objects the peers did not deliver as sealed, fetched from the store instead.
    pub peer_fallbacks: AtomicU64,
    /// Nanoseconds GETs held their request slots, summed over parts (for `bound`, as the four
    /// below).
    pub request_nanos: AtomicU64,
    /// Of those, before each response's first byte.
    pub first_byte_nanos: AtomicU64,
    /// Of those, waiting for a write buffer.
    pub buffer_wait_nanos: AtomicU64,
    /// Parts' waits for a request slot that ended with the limit at its ceiling.
    pub slot_wait_nanos: AtomicU64,
    /// The run's waits for the listing's next object.
    pub listing_wait_nanos: AtomicU64,
    /// Objects whose task is running now, and the most at once (tests check both stay
    /// bounded whatever the object count).
    #[cfg(test)]
    pub objects_in_flight: AtomicU64,
    #[cfg(test)]
    pub most_objects_in_flight: AtomicU64,
}

impl Stats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Relaxed)
    }

    /// Adds the time since `since` to a counter of nanoseconds.
    pub(crate) fn add_since(counter: &AtomicU64, since: Instant) {
        Self::add(counter, since.elapsed().as_nanos() as u64);
    }

    /// A counter of nanoseconds, in seconds.
    pub(crate) fn seconds(counter: &AtomicU64) -> f64 {
        Self::get(counter) as f64 / 1e9
    }

    /// Whether the totals are final (the listing has ended).
    pub(crate) fn listing_done(&self) -> bool {
        self.listing_done.load(Relaxed)
    }

    /// The selection as far as it is known: the read-ahead's count, or what the run itself has
    /// booked when that is more (keys refused or in conflict count as failed objects).
    pub(crate) fn selection(&self) -> Selection {
        Selection {
            objects: Self::get(&self.ahead_objects).max(self.objects_finished()),
            bytes: Self::get(&self.ahead_bytes).max(Self::get(&self.bytes_listed)),
            complete: self.ahead_done.load(Relaxed) || self.listing_done(),
        }
    }

    /// Objects accounted for: downloaded, skipped or failed.
    pub(crate) fn objects_finished(&self) -> u64 {
        Self::get(&self.objects_downloaded)
            + Self::get(&self.objects_skipped)
            + Self::get(&self.objects_failed)
    }
}

/// The selection's size as far as the listing has gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Selection {
    pub objects: u64,
    pub bytes: u64,
    /// The listing has ended: the figures are final.
    pub complete: bool,
}
