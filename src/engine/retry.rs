//! Exponential backoff as plain data: a first wait that doubles with each attempt up to a cap.

use std::time::Duration;

/// Waits of `first × 2^attempt`, capped at `cap` (attempt 0-based).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub first: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// The wait before retry number `attempt`.
    pub(crate) fn ceiling(&self, attempt: u32) -> Duration {
        self.first
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.cap)
    }

    /// A wait drawn uniformly from `[0, ceiling(attempt)]` (full jitter), so that many clients
    /// that failed together do not retry together.
    pub(crate) fn jittered(&self, attempt: u32) -> Duration {
        self.ceiling(attempt).mul_f64(fastrand::f64())
    }
}

/// Part retries after a broken body.
pub(crate) const PART_RETRY: Backoff = Backoff {
    first: Duration::from_millis(100),
    cap: Duration::from_secs(10),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_is_capped() {
        for attempt in 0..40 {
            let d = PART_RETRY.jittered(attempt);
            assert!(d <= PART_RETRY.cap);
            assert!(d <= PART_RETRY.first * 2u32.pow(attempt.min(16)));
        }
        assert_eq!(PART_RETRY.ceiling(0), Duration::from_millis(100));
        assert_eq!(PART_RETRY.ceiling(3), Duration::from_millis(800));
        assert_eq!(PART_RETRY.ceiling(30), PART_RETRY.cap);
    }
}
