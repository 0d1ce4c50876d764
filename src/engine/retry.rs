//! Exponential backoff with full jitter, as plain data.

use std::time::Duration;

const BASE: Duration = Duration::from_millis(100);
const CAP: Duration = Duration::from_secs(10);

/// The delay before retry number `attempt` (0-based): uniform in `[0, min(CAP, BASE × 2^n)]`.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let ceiling = BASE.saturating_mul(1u32 << attempt.min(16)).min(CAP);
    ceiling.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_is_capped() {
        for attempt in 0..40 {
            let d = backoff(attempt);
            assert!(d <= CAP);
            assert!(d <= BASE * 2u32.pow(attempt.min(16)));
        }
    }
}
