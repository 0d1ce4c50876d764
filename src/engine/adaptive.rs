//! Request slots whose number adapts to what the run measures.
//!
//! The right number of GETs in flight depends on the path: on a 2-core machine whose CPU is
//! shared with the server, fewer streams are faster (16 × 128 MiB with 8 MiB parts: 16 streams
//! 3.00–3.04 s, 8 streams 2.84–2.86 s), while a 100 Gbit/s node needs dozens. No fixed default
//! suits both, so `--concurrency auto` starts at
//! [`AUTO_INITIAL_CONCURRENCY`](crate::config::AUTO_INITIAL_CONCURRENCY) and climbs by
//! hill-climbing on the bytes received per [`WINDOW`]:
//! - a raise (by half) is tried only when requests had to wait for a slot, since otherwise
//!   the listing or the disk, not the limit, is what bounds the run;
//! - the window right after a change is skipped (it mixes both limits); if the next one is not
//!   [`GAIN`] times faster than the window before the raise, the raise is undone and the limit
//!   holds for [`HOLD`] windows before probing again;
//! - throttling answers (429, 503) cut the limit by a quarter at once, then hold.
//!
//! The limit counts GETs of a full part; smaller ones weigh less (see [`RequestSlots`]).
//! Write buffers are allocated on first use, so memory follows the highest limit reached, not
//! the maximum.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::priority::{Precedence, Priority, RESERVED_SLOTS};
use crate::source::client::Responses;
use crate::write::buffer::WRITE_BUFFER_SIZE;

/// The adaptive limit never goes below this.
const MIN: usize = 2;
const WINDOW: Duration = Duration::from_millis(250);
/// Throughput growth a raise must bring to be kept.
const GAIN: f64 = 1.15;
/// Windows to wait after an undone raise or throttling before probing again.
const HOLD: u32 = 8;

/// Objects in progress per request slot: enough to keep every slot busy with small objects
/// while finished files wait for their durable commit.
pub(crate) const OBJECTS_PER_SLOT: usize = 4;

/// Bytes one unit of a slot stands for (a write buffer): a request or object weighs a unit per
/// this many bytes, at least one and at most [`SLOT_UNITS`].
const UNIT_BYTES: u64 = WRITE_BUFFER_SIZE as u64;
/// Units in one slot: a request of 8 MiB (the default part size) or more fills one.
const SLOT_UNITS: usize = 8;

/// The units a request or object of `len` bytes weighs.
fn units(len: u64) -> usize {
    (len.div_ceil(UNIT_BYTES) as usize).clamp(1, SLOT_UNITS)
}

/// A semaphore whose size can go down while permits are out: those retire as they come back.
struct Adjustable {
    semaphore: Arc<Semaphore>,
    size: AtomicUsize,
    retiring: AtomicUsize,
}

impl Adjustable {
    fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            semaphore: Arc::new(Semaphore::new(size)),
            size: AtomicUsize::new(size),
            retiring: AtomicUsize::new(0),
        })
    }

    fn resize(&self, new: usize) {
        let old = self.size.swap(new, Relaxed);
        if new > old {
            // Cancel pending retirements before adding permits.
            let grow = new - old;
            self.semaphore
                .add_permits(grow - self.take_retirement(grow));
        } else if new < old {
            let shrink = old - new;
            let idle = self.semaphore.forget_permits(shrink);
            self.retiring.fetch_add(shrink - idle, Relaxed);
        }
    }

    /// How many of `n` returning permits should be retired instead of freed.
    fn take_retirement(&self, n: usize) -> usize {
        self.retiring
            .fetch_update(Relaxed, Relaxed, |r| (r > 0).then(|| r.saturating_sub(n)))
            .map_or(0, |r| r.min(n))
    }
}

/// Units of an [`Adjustable`] on loan; those the size went down by meanwhile retire on return.
struct Units {
    permit: OwnedSemaphorePermit,
    from: Arc<Adjustable>,
}

impl Drop for Units {
    fn drop(&mut self) {
        let retire = self.from.take_retirement(self.permit.num_permits());
        if retire > 0 {
            self.permit
                .split(retire)
                .expect("no more than held")
                .forget();
        }
    }
}

/// Slots weighed by size: an adjustable budget of units, and a fixed bound on how many
/// holders there are whatever they weigh (connections, open files).
struct Weighted {
    units: Arc<Adjustable>,
    count: Arc<Semaphore>,
}

/// A slot of a [`Weighted`]: held by a request for its GET or by an object until its file is
/// written.
pub(crate) struct Permit {
    _units: Units,
    _count: OwnedSemaphorePermit,
    _also: Option<Box<dyn Send + Sync>>,
}

impl Permit {
    /// This permit, holding `other` until it is released too (a lazy view's background window).
    pub(crate) fn holding(mut self, other: Option<Box<dyn Send + Sync>>) -> Self {
        self._also = other;
        self
    }
}

impl Weighted {
    fn new(units: usize, count: usize) -> Self {
        Self {
            units: Adjustable::new(units),
            count: Arc::new(Semaphore::new(count)),
        }
    }

    /// Waits for `n` units, counting in `waited` when none were free at once, then for a
    /// place under the count.
    async fn acquire(&self, n: usize, waited: Option<&AtomicU64>) -> Permit {
        let semaphore = &self.units.semaphore;
        let units = match semaphore.clone().try_acquire_many_owned(n as u32) {
            Ok(permit) => permit,
            Err(_) => {
                if let Some(waited) = waited {
                    waited.fetch_add(1, Relaxed);
                }
                let permit = semaphore.clone().acquire_many_owned(n as u32).await;
                permit.expect("slots never close")
            }
        };
        let units = Units {
            permit: units,
            from: self.units.clone(),
        };
        let count = self.count.clone().acquire_owned().await;
        Permit {
            _units: units,
            _count: count.expect("slots never close"),
            _also: None,
        }
    }

    /// `n` units and a place under the count if both are free now.
    fn try_acquire(&self, n: usize) -> Option<Permit> {
        let units = self
            .units
            .semaphore
            .clone()
            .try_acquire_many_owned(n as u32);
        let count = self.count.clone().try_acquire_owned();
        Some(Permit {
            _units: Units {
                permit: units.ok()?,
                from: self.units.clone(),
            },
            _count: count.ok()?,
            _also: None,
        })
    }
}

/// The slots GETs and objects hold, with a limit that can move.
///
/// The limit counts requests of a full part; smaller ones weigh less (see [`units`]), so that
/// the same limit keeps 8 times as many GETs of 1 MiB or less in flight as of 8 MiB: a small
/// GET's time is mostly its round trip, a large one's its bytes. On this 2-core machine
/// 16 × 128 MiB went fastest with 8 streams, while 20,000 × 64 KiB from Garage took a median
/// 23.65 s when every GET weighed a full slot and 21.39 s weighed (6 runs each).
/// Under a fixed `--concurrency N` the count bound is `N`, so it means `N` GETs of any size.
pub(crate) struct RequestSlots {
    requests: Weighted,
    /// [`RESERVED_SLOTS`] more, for wanted parts only (`priority.rs`).
    reserve: Weighted,
    /// Wanted parts before background ones at the slots.
    precedence: Precedence,
    /// `OBJECTS_PER_SLOT` × the request limit, weighed like requests: objects in flight
    /// follow the limit, since each holds memory and an open file.
    objects: Weighted,
    max: usize,
    peak: AtomicUsize,
    /// Request acquires that found no free slot since the controller last looked.
    waited: AtomicU64,
    /// Bytes received by every request using these slots: what the controller climbs on.
    received: AtomicU64,
    /// Raises undone because they did not pay off: what is past the client bounds the run.
    undone_raises: AtomicU64,
    /// The answers of every client using these slots (throttling cuts the limit).
    pub responses: Arc<Responses>,
}

impl RequestSlots {
    /// `initial` slots now, up to `max` if the controller finds that more pay off; at most
    /// `max` requests and `max_objects` objects in flight whatever their sizes.
    pub(crate) fn new(initial: usize, max: usize, max_objects: usize) -> Self {
        let initial = initial.min(max);
        Self {
            requests: Weighted::new(initial * SLOT_UNITS, max),
            reserve: Weighted::new(RESERVED_SLOTS * SLOT_UNITS, RESERVED_SLOTS),
            precedence: Precedence::default(),
            objects: Weighted::new(initial * OBJECTS_PER_SLOT * SLOT_UNITS, max_objects),
            max,
            peak: AtomicUsize::new(initial),
            waited: AtomicU64::new(0),
            received: AtomicU64::new(0),
            undone_raises: AtomicU64::new(0),
            responses: Arc::default(),
        }
    }

    /// Books `n` bytes received by a request.
    pub(crate) fn record_received(&self, n: u64) {
        self.received.fetch_add(n, Relaxed);
    }

    /// A request slot for a GET of `len` bytes, held by a part for its GET, with the priority
    /// the part has once it holds it: a background part becomes wanted if `promoted` resolves
    /// first. A wanted part's slot goes to it before any background part's, from the reserve
    /// when the limit's are taken.
    pub(crate) async fn acquire(
        &self,
        len: u64,
        priority: Priority,
        promoted: impl Future<Output = ()>,
    ) -> (Permit, Priority) {
        let n = units(len);
        if priority == Priority::Background {
            let shared = || self.requests.acquire(n, Some(&self.waited));
            tokio::select! {
                biased;
                permit = self.precedence.background(shared) => return (permit, priority),
                () = promoted => {}
            }
        }
        (self.acquire_wanted(n).await, Priority::Wanted)
    }

    /// A request slot for a GET of `len` bytes when no part can be wanted (a sync): in arrival
    /// order, with no precedence to keep.
    pub(crate) async fn acquire_in_turn(&self, len: u64) -> Permit {
        self.requests.acquire(units(len), Some(&self.waited)).await
    }

    /// `n` units for a wanted part: free ones at once, else the first freed, shared or reserved.
    async fn acquire_wanted(&self, n: usize) -> Permit {
        let free = self.requests.try_acquire(n);
        match free.or_else(|| self.reserve.try_acquire(n)) {
            Some(permit) => permit,
            None => {
                let shared = self.requests.acquire(n, Some(&self.waited));
                let reserved = self.reserve.acquire(n, None);
                self.precedence.wanted(shared, reserved).await
            }
        }
    }

    /// An object slot for an object of `size` bytes, held by its task until its file is
    /// written.
    pub(crate) async fn acquire_object(&self, size: u64) -> Permit {
        self.objects.acquire(units(size), None).await
    }

    /// The most requests there can ever be in flight: bounds the part tasks an object keeps
    /// started.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The highest limit this run reached.
    /// Raises of the limit undone so far because throughput did not grow with them.
    pub(crate) fn undone_raises(&self) -> u64 {
        self.undone_raises.load(Relaxed)
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }

    /// How many GETs of a full part may be in flight now.
    pub(crate) fn limit(&self) -> usize {
        self.requests.units.size.load(Relaxed) / SLOT_UNITS
    }

    fn set_limit(&self, new: usize) {
        self.requests.units.resize(new * SLOT_UNITS);
        self.objects
            .units
            .resize(new * OBJECTS_PER_SLOT * SLOT_UNITS);
        self.peak.fetch_max(new, Relaxed);
    }
}

/// Where the hill-climb is.
enum Phase {
    /// May raise when requests waited.
    Ready,
    /// A raise from `from` happened; `skip` marks the mixed window right after it.
    Probing {
        from: usize,
        base_rate: f64,
        skip: bool,
    },
    Holding(u32),
}

/// Adjusts `slots` every window until aborted.
pub(crate) fn spawn_controller(slots: Arc<RequestSlots>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut phase = Phase::Ready;
        let mut last_bytes = slots.received.load(Relaxed);
        let mut last_at = Instant::now();
        loop {
            tokio::time::sleep(WINDOW).await;
            let bytes = slots.received.load(Relaxed);
            let now = Instant::now();
            let rate = (bytes - last_bytes) as f64 / (now - last_at).as_secs_f64();
            (last_bytes, last_at) = (bytes, now);
            let waited = slots.waited.swap(0, Relaxed) > 0;
            let throttled = slots.responses.throttled.swap(0, Relaxed) > 0;
            phase = step(&slots, phase, rate, waited, throttled);
        }
    })
}

fn step(slots: &RequestSlots, phase: Phase, rate: f64, waited: bool, throttled: bool) -> Phase {
    let limit = slots.limit();
    if throttled {
        let lower = (limit - limit / 4).max(MIN).min(limit);
        if lower != limit {
            tracing::debug!("throttled: {limit} → {lower} requests in flight");
            slots.set_limit(lower);
        }
        return Phase::Holding(HOLD);
    }
    match phase {
        Phase::Holding(0) => Phase::Ready,
        Phase::Holding(n) => Phase::Holding(n - 1),
        Phase::Probing {
            from,
            base_rate,
            skip: true,
        } => Phase::Probing {
            from,
            base_rate,
            skip: false,
        },
        Phase::Probing {
            from, base_rate, ..
        } if rate < base_rate * GAIN => {
            tracing::debug!("{limit} requests in flight did not pay off: back to {from}");
            slots.set_limit(from);
            slots.undone_raises.fetch_add(1, Relaxed);
            Phase::Holding(HOLD)
        }
        Phase::Probing { .. } | Phase::Ready if waited && limit < slots.max => {
            let raised = (limit + (limit / 2).max(1)).min(slots.max);
            tracing::debug!("trying {raised} requests in flight (was {limit})");
            slots.set_limit(raised);
            Phase::Probing {
                from: limit,
                base_rate: rate,
                skip: true,
            }
        }
        Phase::Probing { .. } | Phase::Ready => Phase::Ready,
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;

    use futures::future::join_all;

    use super::*;

    async fn background(slots: &RequestSlots, len: u64) -> Permit {
        slots.acquire(len, Priority::Background, pending()).await.0
    }

    fn probe(slots: &RequestSlots, rate: f64) -> Phase {
        let phase = step(slots, Phase::Ready, rate, true, false);
        step(slots, phase, rate, true, false)
    }

    #[test]
    fn a_raise_that_pays_off_is_kept_and_one_that_does_not_is_undone() {
        let slots = RequestSlots::new(4, 64, 1_000);
        let phase = probe(&slots, 100.0);
        assert_eq!(slots.limit(), 6);
        let phase = step(&slots, phase, 200.0, true, false);
        assert_eq!(slots.limit(), 9, "a faster window raises again");
        assert_eq!(slots.undone_raises(), 0);
        let phase = step(&slots, phase, 200.0, true, false);
        let phase = step(&slots, phase, 201.0, true, false);
        assert_eq!(slots.limit(), 6, "no gain: back to the previous limit");
        assert!(matches!(phase, Phase::Holding(HOLD)));
        assert_eq!((slots.peak(), slots.undone_raises()), (9, 1));
    }

    #[test]
    fn no_raise_without_waiting_requests_and_never_past_max() {
        let slots = RequestSlots::new(4, 5, 1_000);
        step(&slots, Phase::Ready, 100.0, false, false);
        assert_eq!(slots.limit(), 4);
        probe(&slots, 100.0);
        assert_eq!(slots.limit(), 5);
    }

    #[tokio::test]
    async fn throttling_cuts_the_limit_and_busy_slots_retire_on_return() {
        let slots = RequestSlots::new(8, 64, 1_000);
        let held: Vec<_> = join_all((0..8).map(|_| background(&slots, 8 << 20))).await;
        step(&slots, Phase::Ready, 100.0, true, true);
        assert_eq!(slots.limit(), 6);
        assert_eq!(slots.requests.units.semaphore.available_permits(), 0);
        drop(held);
        assert_eq!(
            slots.requests.units.semaphore.available_permits(),
            6 * SLOT_UNITS
        );
        assert_eq!(
            slots.objects.units.semaphore.available_permits(),
            6 * OBJECTS_PER_SLOT * SLOT_UNITS
        );
    }

    #[tokio::test]
    async fn a_slot_partly_retired_frees_the_rest() {
        let slots = RequestSlots::new(4, 64, 1_000);
        let held: Vec<_> = join_all((0..5).map(|_| background(&slots, 6 << 20))).await;
        slots.set_limit(2);
        drop(held);
        assert_eq!(
            slots.requests.units.semaphore.available_permits(),
            2 * SLOT_UNITS
        );
    }

    /// Whether `acquire` has to wait.
    async fn waits(acquire: impl std::future::Future<Output = Permit>) -> bool {
        tokio::time::timeout(Duration::from_millis(20), acquire)
            .await
            .is_err()
    }

    /// Whether one more request of `len` bytes would have to wait.
    async fn full(slots: &RequestSlots, len: u64) -> bool {
        waits(background(slots, len)).await
    }

    #[tokio::test]
    async fn small_requests_weigh_less_up_to_the_count_bound() {
        let slots = RequestSlots::new(4, 64, 1_000);
        let large: Vec<_> = join_all((0..4).map(|_| background(&slots, 8 << 20))).await;
        assert!(
            full(&slots, 64 << 10).await,
            "4 full parts fill a limit of 4"
        );
        drop(large);
        let halves: Vec<_> = join_all((0..8).map(|_| background(&slots, 4 << 20))).await;
        assert!(full(&slots, 1).await, "8 half parts fill it too");
        drop(halves);
        let mut small: Vec<_> = join_all((0..32).map(|_| background(&slots, 64 << 10))).await;
        assert!(full(&slots, 1).await, "a request weighs at least one unit");
        slots.set_limit(16);
        small.extend(join_all((0..32).map(|_| background(&slots, 64 << 10))).await);
        assert!(
            full(&slots, 1).await,
            "never more requests than the count bound"
        );
        drop(small);
        assert!(!full(&slots, 1).await);
    }

    #[tokio::test]
    async fn a_wanted_part_goes_before_queued_background_parts_and_past_the_limit() {
        use Priority::{Background, Wanted};
        const PART: u64 = 8 << 20;
        let slots = Arc::new(RequestSlots::new(1, 8, 100));
        let (running, _) = slots.acquire(PART, Background, pending()).await;
        let mut reserved = Vec::new();
        for _ in 0..RESERVED_SLOTS {
            let wanted = tokio::time::timeout(
                Duration::from_millis(100),
                slots.acquire(PART, Wanted, pending()),
            );
            reserved.push(
                wanted
                    .await
                    .expect("a wanted part takes the reserve at once"),
            );
        }
        let (order, mut got) = tokio::sync::mpsc::unbounded_channel();
        let mut queued = Vec::new();
        for who in ["background", "background", "wanted"] {
            let priority = if who == "wanted" { Wanted } else { Background };
            let (slots, order) = (slots.clone(), order.clone());
            queued.push(tokio::spawn(async move {
                let (permit, _) = slots.acquire(PART, priority, pending()).await;
                order.send(who).unwrap();
                permit
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            got.try_recv().is_err(),
            "the slot and the reserve are taken"
        );
        drop(running);
        assert_eq!(got.recv().await, Some("wanted"), "the next slot goes to it");
        drop(reserved.pop());
        let background = tokio::time::timeout(Duration::from_millis(20), got.recv()).await;
        assert!(
            background.is_err(),
            "the background never takes the reserve"
        );
        for part in queued {
            part.abort();
        }
    }

    #[tokio::test]
    async fn a_background_part_whose_file_is_opened_while_it_waits_is_served_as_wanted() {
        let slots = RequestSlots::new(1, 8, 100);
        let _running = background(&slots, 8 << 20).await;
        let (open, opened) = tokio::sync::oneshot::channel::<()>();
        let promoted = async {
            let _ = opened.await;
        };
        let part = slots.acquire(8 << 20, Priority::Background, promoted);
        open.send(()).unwrap();
        let got = tokio::time::timeout(Duration::from_millis(100), part).await;
        let (_reserved, priority) = got.expect("promoted, it takes the reserve");
        assert_eq!(priority, Priority::Wanted, "and streams as wanted");
    }

    #[tokio::test]
    async fn objects_in_flight_follow_the_limit_by_weight() {
        let slots = RequestSlots::new(2, 64, 50);
        let large: Vec<_> = join_all((0..8).map(|_| slots.acquire_object(1 << 30))).await;
        assert!(
            waits(slots.acquire_object(1)).await,
            "{OBJECTS_PER_SLOT} large objects per slot"
        );
        drop(large);
        let small: Vec<_> = join_all((0..50).map(|_| slots.acquire_object(1))).await;
        assert!(
            waits(slots.acquire_object(1)).await,
            "no more objects than max_objects"
        );
        drop(small);
    }
}
