//! The figures a run's `bound` is judged from. The process's CPU time and the answers of
//! clients that runs in one process may share (the daemon's) are counted from where they
//! stood when the run started; the rest are the run's own counters.

use std::time::Instant;

use super::context::Ctx;
use super::stats::Stats;
use crate::bound::{Bound, Measured};
use crate::host::{self, Host};

/// Where the shared counters stood when a run started.
pub(super) struct Baseline {
    started: Instant,
    cpu_seconds: f64,
    answers: u64,
    throttled: u64,
    rate_limited_seconds: f64,
    undone_raises: u64,
}

impl Baseline {
    pub(super) fn take(ctx: &Ctx) -> Self {
        let (answers, throttled) = ctx.fetch.request_slots.responses.totals();
        Self {
            started: Instant::now(),
            cpu_seconds: host::cpu_seconds(),
            answers,
            throttled,
            rate_limited_seconds: ctx.fetch.rates.waited_seconds(),
            undone_raises: ctx.fetch.request_slots.undone_raises(),
        }
    }

    /// What bounded the run since `self` was taken.
    pub(super) fn bound(&self, ctx: &Ctx, host: &Host) -> Bound {
        let fetch = &ctx.fetch;
        let stats = &fetch.stats;
        let (answers, throttled) = fetch.request_slots.responses.totals();
        Bound::judge(&Measured {
            seconds: self.started.elapsed().as_secs_f64(),
            cpu_seconds: host::cpu_seconds() - self.cpu_seconds,
            cores: host.cores(),
            nic_mbit_per_second: host.nic.as_ref().map(|nic| nic.mbit_per_second),
            received_bytes: Stats::get(&stats.bytes_received),
            answers: answers - self.answers,
            throttled: throttled - self.throttled,
            request_seconds: Stats::seconds(&stats.request_nanos),
            first_byte_seconds: Stats::seconds(&stats.first_byte_nanos),
            buffer_wait_seconds: Stats::seconds(&stats.buffer_wait_nanos),
            rate_limited_seconds: fetch.rates.waited_seconds() - self.rate_limited_seconds,
            slot_wait_seconds: Stats::seconds(&stats.slot_wait_nanos),
            ceiling: fetch.request_slots.max(),
            undone_raises: fetch.request_slots.undone_raises() - self.undone_raises,
            peak_in_flight: fetch.request_slots.peak(),
            listing_wait_seconds: Stats::seconds(&stats.listing_wait_nanos),
        })
    }
}
