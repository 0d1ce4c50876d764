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
//! Write buffers are allocated on first use, so memory follows the highest limit reached, not
//! the maximum.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::source::client::Responses;

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

/// A semaphore whose size can go down while permits are out: those retire as they come back.
struct Adjustable {
    semaphore: Arc<Semaphore>,
    size: AtomicUsize,
    retiring: AtomicUsize,
}

/// A permit of an [`Adjustable`]; returning it retires it when the size went down meanwhile.
pub(crate) struct Permit {
    permit: Option<OwnedSemaphorePermit>,
    from: Arc<Adjustable>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let (true, Some(permit)) = (self.from.take_retirement(), self.permit.take()) {
            permit.forget();
        }
    }
}

impl Adjustable {
    fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            semaphore: Arc::new(Semaphore::new(size)),
            size: AtomicUsize::new(size),
            retiring: AtomicUsize::new(0),
        })
    }

    fn permit(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Permit {
        Permit {
            permit: Some(permit),
            from: self.clone(),
        }
    }

    fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let permit = self.semaphore.clone().try_acquire_owned().ok()?;
        Some(self.permit(permit))
    }

    async fn acquire(self: &Arc<Self>) -> Permit {
        let permit = self.semaphore.clone().acquire_owned().await;
        self.permit(permit.expect("slots never close"))
    }

    fn resize(&self, new: usize) {
        let old = self.size.swap(new, Relaxed);
        if new > old {
            let mut grow = new - old;
            // Cancel pending retirements before adding permits.
            while grow > 0 && self.take_retirement() {
                grow -= 1;
            }
            self.semaphore.add_permits(grow);
        } else if new < old {
            let shrink = old - new;
            let idle = self.semaphore.forget_permits(shrink);
            self.retiring.fetch_add(shrink - idle, Relaxed);
        }
    }

    /// Whether a returning permit should be retired instead of freed.
    fn take_retirement(&self) -> bool {
        self.retiring
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// The slots GETs and objects hold, with a limit that can move.
pub(crate) struct RequestSlots {
    requests: Arc<Adjustable>,
    /// `OBJECTS_PER_SLOT` × the request limit: objects in flight follow the limit, since each
    /// holds memory (200,000 tiny objects: 140 MiB peak RSS with 256 in flight, 119 MiB with
    /// 64, and not slower).
    objects: Arc<Adjustable>,
    max: usize,
    /// Objects in flight never exceed this, whatever the limit (open-file limits).
    max_objects: usize,
    peak: AtomicUsize,
    /// Request acquires that found no free slot since the controller last looked.
    waited: AtomicU64,
    /// Bytes received by every request using these slots: what the controller climbs on.
    received: AtomicU64,
    /// The answers of every client using these slots (throttling cuts the limit).
    pub responses: Arc<Responses>,
}

impl RequestSlots {
    /// `initial` slots now, up to `max` if the controller finds that more pay off, with at
    /// most `max_objects` objects in flight.
    pub(crate) fn new(initial: usize, max: usize, max_objects: usize) -> Self {
        let initial = initial.min(max);
        Self {
            requests: Adjustable::new(initial),
            objects: Adjustable::new((initial * OBJECTS_PER_SLOT).min(max_objects)),
            max,
            max_objects,
            peak: AtomicUsize::new(initial),
            waited: AtomicU64::new(0),
            received: AtomicU64::new(0),
            responses: Arc::default(),
        }
    }

    /// Books `n` bytes received by a request.
    pub(crate) fn record_received(&self, n: u64) {
        self.received.fetch_add(n, Relaxed);
    }

    /// A request slot, held by a part for its GET.
    pub(crate) async fn acquire(&self) -> Permit {
        match self.requests.try_acquire() {
            Some(permit) => permit,
            None => {
                self.waited.fetch_add(1, Relaxed);
                self.requests.acquire().await
            }
        }
    }

    /// An object slot, held by an object task until its file is written.
    pub(crate) async fn acquire_object(&self) -> Permit {
        self.objects.acquire().await
    }

    /// The most slots there can ever be: bounds the part tasks an object keeps started.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The highest limit this run reached.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }

    fn limit(&self) -> usize {
        self.requests.size.load(Relaxed)
    }

    fn set_limit(&self, new: usize) {
        self.requests.resize(new);
        self.objects
            .resize((new * OBJECTS_PER_SLOT).min(self.max_objects));
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
    use super::*;

    fn probe(slots: &RequestSlots, rate: f64) -> Phase {
        let phase = step(slots, Phase::Ready, rate, true, false);
        step(slots, phase, rate, true, false)
    }

    #[test]
    fn a_raise_that_pays_off_is_kept_and_one_that_does_not_is_undone() {
        let slots = RequestSlots::new(4, 64, usize::MAX);
        let phase = probe(&slots, 100.0);
        assert_eq!(slots.limit(), 6);
        let phase = step(&slots, phase, 200.0, true, false);
        assert_eq!(slots.limit(), 9, "a faster window raises again");
        let phase = step(&slots, phase, 200.0, true, false);
        let phase = step(&slots, phase, 201.0, true, false);
        assert_eq!(slots.limit(), 6, "no gain: back to the previous limit");
        assert!(matches!(phase, Phase::Holding(HOLD)));
        assert_eq!(slots.peak(), 9);
    }

    #[test]
    fn no_raise_without_waiting_requests_and_never_past_max() {
        let slots = RequestSlots::new(4, 5, usize::MAX);
        step(&slots, Phase::Ready, 100.0, false, false);
        assert_eq!(slots.limit(), 4);
        probe(&slots, 100.0);
        assert_eq!(slots.limit(), 5);
    }

    #[tokio::test]
    async fn throttling_cuts_the_limit_and_busy_slots_retire_on_return() {
        let slots = RequestSlots::new(8, 64, usize::MAX);
        let held: Vec<_> = futures::future::join_all((0..8).map(|_| slots.acquire())).await;
        step(&slots, Phase::Ready, 100.0, true, true);
        assert_eq!(slots.limit(), 6);
        drop(held);
        assert_eq!(slots.requests.semaphore.available_permits(), 6);
        assert_eq!(
            slots.objects.semaphore.available_permits(),
            6 * OBJECTS_PER_SLOT
        );
    }
}
