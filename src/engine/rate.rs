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

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How far ahead of its pace a cap lets takers run.
const BURST: Duration = Duration::from_millis(50);

/// One cap: `per_second` units a second.
#[derive(Debug)]
pub(crate) struct RateLimit {
    per_second: f64,
    /// When the next unit is free.
    next: Mutex<Instant>,
}

impl RateLimit {
    pub(crate) fn new(per_second: f64) -> Self {
        Self {
            per_second,
            next: Mutex::new(Instant::now()),
        }
    }

    /// How long a taker of `units` must wait now; books them.
    fn reserve(&self, units: u64, now: Instant) -> Duration {
        let mut next = self.next.lock().expect("rate lock");
        let start = (*next).max(now);
        *next = start + Duration::from_secs_f64(units as f64 / self.per_second);
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

    /// Waits until `bytes` more fit under the bandwidth cap.
    pub(crate) async fn bytes(&self, bytes: u64) {
        self.take(self.bandwidth.as_ref(), bytes).await;
    }

    /// Waits until one more request fits under the request-rate cap.
    pub(crate) async fn request(&self) {
        self.take(self.requests.as_ref(), 1).await;
    }

    async fn take(&self, limit: Option<&RateLimit>, units: u64) {
        let Some(limit) = limit else {
            return;
        };
        let wait = limit.reserve(units, Instant::now());
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

    #[test]
    fn takers_are_paced_at_the_rate_after_a_small_burst() {
        let limit = RateLimit::new(1000.0);
        let now = Instant::now();
        assert_eq!(limit.reserve(50, now), Duration::ZERO, "within the burst");
        let wait = limit.reserve(1000, now);
        assert_eq!(
            wait,
            Duration::from_millis(1000),
            "1,050 units at 1,000/s, less 50 ms"
        );
        let later = now + Duration::from_secs(5);
        assert_eq!(
            limit.reserve(10, later),
            Duration::ZERO,
            "an idle cap does not bank time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_time_spent_waiting_is_counted() {
        let rates = Rates::new(Some(1 << 20), Some(10.0));
        rates.bytes(3 << 20).await;
        for _ in 0..11 {
            rates.request().await;
        }
        let waited = rates.waited_seconds();
        assert!((3.9..4.1).contains(&waited), "{waited}");
        assert_eq!(Rates::default().waited_seconds(), 0.0);
    }
}
