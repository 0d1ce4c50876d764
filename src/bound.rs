//! What bounded a run, judged from counters it kept at a cost per request, never per byte.
//!
//! Each resource has a sign that it was saturated, checked in this order (the first one found
//! names the bound):
//! - `server`: 1 % or more of the answers were throttling (429, 503);
//! - `rate_cap`: parts spent a fifth or more of their request time waiting on
//!   `--max-bandwidth` / `--max-requests-per-second`;
//! - `network`: bytes received at 80 % or more of the NIC's speed (when it is known);
//! - `cpu`: the process kept 90 % or more of its cores busy (its whole CPU time, so an
//!   in-process server, as in `hydrator demo`, counts too);
//! - `disk`: GETs spent a fifth or more of their time waiting for a write buffer, which only
//!   writers that fall behind keep from coming back;
//! - `concurrency_limit`: GETs were ready but waited for a request slot while the limit was at
//!   its ceiling, one or more of them at any time on average;
//! - `server` again: half or more of the GETs' time went by before their first byte (latency,
//!   not bandwidth, is what each request costs), or `auto` raised its limit and undid the raise
//!   because throughput did not grow with it (what is past the client bounds: the server, or
//!   the path to it);
//! - `listing`: the run waited half its time or more for listed objects;
//! - `none`: nothing above: a short run, or fixed costs (durable commits, the manifest).
//!
//! The thresholds are judgement, not measurement: well inside what a saturated resource
//! shows, so that the verdict names the resource that ran out, with the figures that say so.

use serde::Serialize;

const THROTTLED_SHARE: f64 = 0.01;
const WAIT_SHARE: f64 = 0.2;
const NIC_SHARE: f64 = 0.8;
const CPU_SHARE: f64 = 0.9;
const SLOT_WAITERS: f64 = 1.0;
const FIRST_BYTE_SHARE: f64 = 0.5;
const LISTING_SHARE: f64 = 0.5;

/// What a run measured of itself.
#[derive(Clone, Debug, Default)]
pub(crate) struct Measured {
    pub seconds: f64,
    pub cpu_seconds: f64,
    /// Cores the process may keep busy.
    pub cores: f64,
    pub nic_mbit_per_second: Option<u64>,
    pub received_bytes: u64,
    /// The server's answers, and how many of them were throttling.
    pub answers: u64,
    pub throttled: u64,
    /// Seconds GETs held their slots, summed over GETs.
    pub request_seconds: f64,
    /// Of those, before the first byte of a response.
    pub first_byte_seconds: f64,
    /// Of those, waiting for a write buffer.
    pub buffer_wait_seconds: f64,
    /// Of those, waiting on a bandwidth or request-rate cap.
    pub rate_limited_seconds: f64,
    /// GETs' waits for a request slot while the limit was at its ceiling, summed.
    pub slot_wait_seconds: f64,
    pub ceiling: usize,
    /// Raises of `auto`'s limit undone because throughput did not grow with them, and the most
    /// GETs that were in flight at once.
    pub undone_raises: u64,
    pub peak_in_flight: usize,
    /// Seconds the run waited for the listing's next object.
    pub listing_wait_seconds: f64,
}

/// What bounded the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum By {
    Server,
    RateCap,
    Network,
    Cpu,
    Disk,
    ConcurrencyLimit,
    Listing,
    None,
}

impl std::fmt::Display for By {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            By::Server => "server",
            By::RateCap => "rate cap",
            By::Network => "network",
            By::Cpu => "cpu",
            By::Disk => "disk",
            By::ConcurrencyLimit => "concurrency limit",
            By::Listing => "listing",
            By::None => "none",
        })
    }
}

/// The verdict, the figure behind it, and the figures it was chosen from.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Bound {
    pub by: By,
    /// The figure that decided it, for a person.
    pub detail: String,
    pub cores: f64,
    pub cores_busy: f64,
    pub nic_mbit_per_second: Option<u64>,
    pub received_mbit_per_second: f64,
    pub answers: u64,
    pub throttled_answers: u64,
    /// Shares of the GETs' time: before the first byte, waiting for a write buffer, waiting
    /// on a rate cap.
    pub first_byte_share: f64,
    pub buffer_wait_share: f64,
    pub rate_limited_share: f64,
    /// GETs waiting for a slot at the ceiling, on average over the run.
    pub slot_waiters: f64,
    pub request_ceiling: usize,
    pub undone_raises: u64,
    /// In the report already (`peak_requests_in_flight`).
    #[serde(skip)]
    pub peak_in_flight: usize,
    pub listing_wait_share: f64,
}

impl Bound {
    pub(crate) fn judge(m: &Measured) -> Self {
        let seconds = m.seconds.max(1e-9);
        let share = |part: f64| match m.request_seconds > 0.0 {
            true => (part / m.request_seconds).min(1.0),
            false => 0.0,
        };
        let mut bound = Self {
            by: By::None,
            detail: String::new(),
            cores: m.cores,
            cores_busy: m.cpu_seconds / seconds,
            nic_mbit_per_second: m.nic_mbit_per_second,
            received_mbit_per_second: m.received_bytes as f64 * 8.0 / 1e6 / seconds,
            answers: m.answers,
            throttled_answers: m.throttled,
            first_byte_share: share(m.first_byte_seconds),
            buffer_wait_share: share(m.buffer_wait_seconds),
            rate_limited_share: share(m.rate_limited_seconds),
            slot_waiters: m.slot_wait_seconds / seconds,
            request_ceiling: m.ceiling,
            undone_raises: m.undone_raises,
            peak_in_flight: m.peak_in_flight,
            listing_wait_share: (m.listing_wait_seconds / seconds).min(1.0),
        };
        (bound.by, bound.detail) = bound.verdict();
        bound
    }

    fn verdict(&self) -> (By, String) {
        let pct = |share: f64| format!("{:.0} %", share * 100.0);
        let throttled = self.throttled_answers as f64;
        if self.answers > 0 && throttled >= THROTTLED_SHARE * self.answers as f64 {
            let (n, of) = (self.throttled_answers, self.answers);
            return (
                By::Server,
                format!("{n} of {of} answers throttling (429/503)"),
            );
        }
        if self.rate_limited_share >= WAIT_SHARE {
            let share = pct(self.rate_limited_share);
            return (By::RateCap, format!("GETs spent {share} of their time held back by --max-bandwidth/--max-requests-per-second"));
        }
        if let Some(nic) = self.nic_mbit_per_second {
            if self.received_mbit_per_second >= NIC_SHARE * nic as f64 {
                let received = self.received_mbit_per_second;
                return (
                    By::Network,
                    format!("{received:.0} of {nic} Mbit/s received"),
                );
            }
        }
        let cores = format!("{:.2} of {} cores busy", self.cores_busy, trim(self.cores));
        if self.cores > 0.0 && self.cores_busy >= CPU_SHARE * self.cores {
            return (By::Cpu, cores);
        }
        if self.buffer_wait_share >= WAIT_SHARE {
            let share = pct(self.buffer_wait_share);
            return (
                By::Disk,
                format!("GETs spent {share} of their time waiting for write buffers"),
            );
        }
        if self.slot_waiters >= SLOT_WAITERS {
            let (waiters, ceiling) = (self.slot_waiters, self.request_ceiling);
            return (
                By::ConcurrencyLimit,
                format!(
                    "{waiters:.1} GETs waiting for a slot on average at the ceiling of {ceiling}"
                ),
            );
        }
        let first_byte = format!(
            "{} of request time before the first byte",
            pct(self.first_byte_share)
        );
        if self.first_byte_share >= FIRST_BYTE_SHARE {
            return (By::Server, first_byte);
        }
        if self.undone_raises > 0 {
            let (n, peak) = (self.undone_raises, self.peak_in_flight);
            let raises = if n == 1 { "raise" } else { "raises" };
            return (
                By::Server,
                format!("the server or the path to it: more GETs in flight did not raise throughput ({n} {raises} undone, at most {peak} at once)"),
            );
        }
        if self.listing_wait_share >= LISTING_SHARE {
            let share = pct(self.listing_wait_share);
            return (
                By::Listing,
                format!("waited {share} of the run for listed objects"),
            );
        }
        (By::None, format!("{cores}, {first_byte}"))
    }
}

/// `2` for 2.0, `1.5` for 1.5.
fn trim(cores: f64) -> String {
    let text = format!("{cores:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 10-second run on 2 cores that saturated nothing.
    fn idle() -> Measured {
        Measured {
            seconds: 10.0,
            cpu_seconds: 4.0,
            cores: 2.0,
            nic_mbit_per_second: Some(10_000),
            received_bytes: 500_000_000,
            answers: 1_000,
            throttled: 0,
            request_seconds: 40.0,
            first_byte_seconds: 8.0,
            buffer_wait_seconds: 1.0,
            rate_limited_seconds: 0.0,
            slot_wait_seconds: 2.0,
            ceiling: 52,
            undone_raises: 0,
            peak_in_flight: 6,
            listing_wait_seconds: 1.0,
        }
    }

    type Change = fn(&mut Measured);

    fn judge(change: impl FnOnce(&mut Measured)) -> Bound {
        let mut measured = idle();
        change(&mut measured);
        Bound::judge(&measured)
    }

    #[test]
    fn nothing_saturated_is_none_with_its_figures() {
        let bound = judge(|_| {});
        assert_eq!(bound.by, By::None);
        assert_eq!(
            bound.detail,
            "0.40 of 2 cores busy, 20 % of request time before the first byte"
        );
        assert_eq!(bound.received_mbit_per_second, 400.0);
        assert_eq!(bound.slot_waiters, 0.2);
    }

    #[test]
    fn each_saturated_resource_names_itself_with_its_figure() {
        let cases: [(Change, By, &str); 10] = [
            (|m| m.throttled = 10, By::Server, "10 of 1000 answers throttling (429/503)"),
            (|m| m.rate_limited_seconds = 10.0, By::RateCap, "GETs spent 25 % of their time held back by --max-bandwidth/--max-requests-per-second"),
            (|m| m.received_bytes = 10_000_000_000, By::Network, "8000 of 10000 Mbit/s received"),
            (|m| m.cpu_seconds = 19.6, By::Cpu, "1.96 of 2 cores busy"),
            (|m| (m.cores, m.cpu_seconds) = (1.5, 14.0), By::Cpu, "1.40 of 1.5 cores busy"),
            (|m| m.buffer_wait_seconds = 12.0, By::Disk, "GETs spent 30 % of their time waiting for write buffers"),
            (|m| m.slot_wait_seconds = 31.0, By::ConcurrencyLimit, "3.1 GETs waiting for a slot on average at the ceiling of 52"),
            (|m| m.first_byte_seconds = 30.0, By::Server, "75 % of request time before the first byte"),
            (|m| m.undone_raises = 2, By::Server, "the server or the path to it: more GETs in flight did not raise throughput (2 raises undone, at most 6 at once)"),
            (|m| m.listing_wait_seconds = 6.0, By::Listing, "waited 60 % of the run for listed objects"),
        ];
        for (change, by, detail) in cases {
            let bound = judge(change);
            assert_eq!((bound.by, bound.detail.as_str()), (by, detail));
        }
    }

    #[test]
    fn just_under_each_threshold_is_not_a_bound() {
        let cases: [Change; 6] = [
            |m| m.throttled = 9,
            |m| m.received_bytes = 9_999_000_000,
            |m| m.cpu_seconds = 17.9,
            |m| m.buffer_wait_seconds = 7.9,
            |m| m.slot_wait_seconds = 9.9,
            |m| m.first_byte_seconds = 19.9,
        ];
        for change in cases {
            assert_eq!(judge(change).by, By::None);
        }
    }

    #[test]
    fn throttling_outranks_a_busy_cpu_and_an_unknown_nic_never_bounds() {
        let bound = judge(|m| (m.throttled, m.cpu_seconds) = (500, 20.0));
        assert_eq!(bound.by, By::Server);
        let bound = judge(|m| (m.nic_mbit_per_second, m.received_bytes) = (None, u64::MAX / 4));
        assert_eq!(bound.by, By::None);
        assert_eq!(bound.nic_mbit_per_second, None);
    }

    #[test]
    fn a_run_without_requests_has_no_shares() {
        let bound = judge(|m| {
            (m.request_seconds, m.first_byte_seconds, m.answers) = (0.0, 0.0, 0);
        });
        assert_eq!((bound.first_byte_share, bound.by), (0.0, By::None));
    }
}
