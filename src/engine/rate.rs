//! Bandwidth and request-rate caps (`--max-bandwidth`, `--max-requests-per-second`): shared
//! budgets that every part of every run using them draws from, so a node stays within what the
//! storage network or the server can take, however many objects and hydrations are in flight.
//!
//! Each cap is a virtual clock (GCRA): taking `n` units pushes the time at which the next unit
//! is free by `n / rate`; a taker sleeps until its units' time comes, less a small burst
//! allowance. That paces bytes as they arrive (the socket then fills and TCP slows the sender)
//! without a refilling task. The time spent waiting is counted: the report's
//! `rate_limited_seconds` says when a cap, not the network, was the bottleneck. The adaptive
//! concurrency sees throughput stop growing under a cap and stops climbing.
//!
//! Wanted units (a file a reader waits for, `priority.rs`) are paced on a clock of their own,
//! so they never queue behind the background's, and push the background's clock too: the
//! background yields its share while they flow, and the sum of both stays within the cap (plus
//! what background takers had booked before, one read each).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::priority::Priority;

/// How far ahead of its pace a cap lets takers run.
const BURST: Duration = Duration::from_millis(50);

/// One cap: `per_second` units a second.
#[derive(Debug)]
pub(crate) struct RateLimit {
    per_second: f64,
    next: Mutex<Clocks>,
}

/// When the next unit is free: for a background taker (every unit taken pushes it), and for
/// a wanted one (only wanted units push it).
#[derive(Debug)]
struct Clocks {
    background: Instant,
    wanted: Instant,
}

impl RateLimit {
    pub(crate) fn new(per_second: f64) -> Self {
        Self {
            per_second,
            next: Mutex::new(Clocks {
                background: Instant::now(),
                wanted: Instant::now(),
            }),
        }
    }

    /// How long a taker of `units` with `priority` must wait now; books them.
    fn reserve(&self, units: u64, priority: Priority, now: Instant) -> Duration {
        let mut clocks = self.next.lock().expect("rate lock");
        let cost = Duration::from_secs_f64(units as f64 / self.per_second);
        clocks.background = clocks.background.max(now) + cost;
        let next = match priority {
            Priority::Background => clocks.background,
            Priority::Wanted => {
                clocks.wanted = clocks.wanted.max(now) + cost;
                clocks.wanted
            }
        };
        next.saturating_duration_since(now).saturating_sub(BURST)
    }
}

/// The caps of a run (or of every hydration of a daemon), and the time spent waiting on them.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    pub bandwidth: Option<RateLimit>,
    pub requests: Option<RateLimit>,
    waited_ns: AtomicU64,
}

impl Rates {
    /// Caps of `bytes_per_second` and `requests_per_second`, each if given.
    pub(crate) fn new(bytes_per_second: Option<u64>, requests_per_second: Option<f64>) -> Self {
        Self {
            bandwidth: bytes_per_second.map(|rate| RateLimit::new(rate as f64)),
            requests: requests_per_second.map(RateLimit::new),
            waited_ns: AtomicU64::new(0),
        }
    }

    /// Waits until `bytes` more with `priority` fit under the bandwidth cap.
    pub(crate) async fn bytes(&self, bytes: u64, priority: Priority) {
        self.take(self.bandwidth.as_ref(), bytes, priority).await;
    }

    /// Waits until one more request with `priority` fits under the request-rate cap.
    pub(crate) async fn request(&self, priority: Priority) {
        self.take(self.requests.as_ref(), 1, priority).await;
    }

    async fn take(&self, limit: Option<&RateLimit>, units: u64, priority: Priority) {
        let Some(limit) = limit else {
            return;
        };
        let wait = limit.reserve(units, priority, Instant::now());
        if !wait.is_zero() {
            self.waited_ns.fetch_add(wait.as_nanos() as u64, Relaxed);
            tokio::time::sleep(wait).await;
        }
    }

    /// Seconds spent waiting on the caps so far, summed over every waiter.
    pub(crate) fn waited_seconds(&self) -> f64 {
        self.waited_ns.load(Relaxed) as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use Priority::{Background, Wanted};

    #[test]
    fn takers_are_paced_at_the_rate_after_a_small_burst() {
        let limit = RateLimit::new(1000.0);
        let now = Instant::now();
        assert_eq!(
            limit.reserve(50, Background, now),
            Duration::ZERO,
            "within the burst"
        );
        let wait = limit.reserve(1000, Background, now);
        assert_eq!(
            wait,
            Duration::from_millis(1000),
            "1,050 units at 1,000/s, less 50 ms"
        );
        let later = now + Duration::from_secs(5);
        assert_eq!(
            limit.reserve(10, Background, later),
            Duration::ZERO,
            "an idle cap does not bank time"
        );
    }

    #[test]
    fn wanted_units_pass_the_background_and_the_background_pays_for_them() {
        let limit = RateLimit::new(1000.0);
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(limit.reserve(2050, Background, now), ms(2000));
        assert_eq!(
            limit.reserve(50, Wanted, now),
            Duration::ZERO,
            "not behind the background's 2 s"
        );
        assert_eq!(
            limit.reserve(500, Wanted, now),
            ms(500),
            "wanted units are paced at the rate among themselves"
        );
        assert_eq!(
            limit.reserve(50, Background, now),
            ms(2600),
            "the background waits for its own 2,050 units and the 550 wanted ones"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_time_spent_waiting_is_counted() {
        let rates = Rates::new(Some(1 << 20), Some(10.0));
        rates.bytes(3 << 20, Background).await;
        for _ in 0..11 {
            rates.request(Background).await;
        }
        let waited = rates.waited_seconds();
        assert!((3.9..4.1).contains(&waited), "{waited}");
        assert_eq!(Rates::default().waited_seconds(), 0.0);
    }
}
