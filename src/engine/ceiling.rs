//! How high `--concurrency auto` may climb on this machine: no more GETs in flight than its
//! cores can process, nor than its network interface can feed.
//!
//! Both bounds count streams of [`STREAM_BYTES_PER_SECOND`], the AWS CRT's figure for one
//! connection to S3 (4 Gbit/s per server address over 10 connections: 0.4 Gbit/s, 50 MB/s),
//! and follow the CRT's rule: streams = target throughput / throughput per stream.
//! - CPU: a core processes [`CLIENT_BYTES_PER_CORE_SECOND`] (hydrator's client cost against a
//!   near-free origin, per GiB received, hashed and written: 0.51–0.55 CPU-s over HTTP,
//!   0.86–0.98 over HTTPS; docs/benchmarks.md; 0.68 lies between), so one core keeps about 32
//!   streams busy: a 1-core pod stops at 32, 1.5 cores at 48.
//! - Network: a 10 Gbit/s NIC fills with 25 streams, 25 Gbit/s with 63; 100 Gbit/s needs 250,
//!   past [`AUTO_MAX_CONCURRENCY`]. An unknown speed does not bound.
//!
//! The ceiling never goes below [`AUTO_INITIAL_CONCURRENCY`], where the climb starts. Write
//! buffers (two per request) and objects in flight follow the ceiling, so it bounds memory
//! too: (2 × ceiling + 4) MiB of buffers at most.

use crate::config::{AUTO_INITIAL_CONCURRENCY, AUTO_MAX_CONCURRENCY};
use crate::host::Host;

/// Bytes a second one connection to S3 delivers (the AWS CRT's sizing figure).
const STREAM_BYTES_PER_SECOND: f64 = 50e6;
/// Bytes a second one core receives, hashes and writes: 1 GiB per 0.68 CPU-s, between the cost
/// over HTTP and over HTTPS.
const CLIENT_BYTES_PER_CORE_SECOND: f64 = (1u64 << 30) as f64 / 0.68;

/// The most GETs `auto` may have in flight, and the bounds it is the smaller of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ceiling {
    pub requests: usize,
    /// Streams the cores can process.
    pub by_cpu: usize,
    /// Streams that fill the NIC, when its speed is known.
    pub by_nic: Option<usize>,
}

impl Ceiling {
    pub(crate) fn of(host: &Host) -> Self {
        Self::for_resources(host.cores(), host.nic.as_ref().map(|n| n.mbit_per_second))
    }

    fn for_resources(cores: f64, nic_mbit_per_second: Option<u64>) -> Self {
        let streams = |bytes_per_second: f64| (bytes_per_second / STREAM_BYTES_PER_SECOND).ceil();
        let by_cpu = streams(cores * CLIENT_BYTES_PER_CORE_SECOND) as usize;
        let by_nic = nic_mbit_per_second.map(|mbit| streams(mbit as f64 * 1e6 / 8.0) as usize);
        let requests = by_cpu
            .min(by_nic.unwrap_or(usize::MAX))
            .clamp(AUTO_INITIAL_CONCURRENCY, AUTO_MAX_CONCURRENCY);
        Self {
            requests,
            by_cpu,
            by_nic,
        }
    }
}

impl std::fmt::Display for Ceiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} requests (cores: {}", self.requests, self.by_cpu)?;
        match self.by_nic {
            Some(nic) => write!(f, ", NIC: {nic})"),
            None => write!(f, ", NIC speed unknown)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceiling(cores: f64, nic: Option<u64>) -> Ceiling {
        Ceiling::for_resources(cores, nic)
    }

    #[test]
    fn cores_bound_streams_at_about_32_each() {
        assert_eq!(ceiling(1.0, None).requests, 32);
        assert_eq!(ceiling(1.5, None).requests, 48);
        assert_eq!(ceiling(2.0, None).requests, 64);
        assert_eq!(ceiling(16.0, None).requests, AUTO_MAX_CONCURRENCY);
        assert_eq!(
            ceiling(0.1, None).requests,
            AUTO_INITIAL_CONCURRENCY,
            "never below where the climb starts"
        );
    }

    #[test]
    fn a_known_nic_bounds_streams_at_its_speed_over_50_mb_per_second() {
        assert_eq!(
            ceiling(16.0, Some(10_000)),
            Ceiling {
                requests: 25,
                by_cpu: 506,
                by_nic: Some(25)
            }
        );
        assert_eq!(ceiling(16.0, Some(25_000)).requests, 63);
        assert_eq!(ceiling(16.0, Some(100_000)).requests, AUTO_MAX_CONCURRENCY);
        assert_eq!(ceiling(1.0, Some(100_000)).requests, 32, "the cores first");
        assert_eq!(ceiling(8.0, Some(1_000)).requests, AUTO_INITIAL_CONCURRENCY);
        assert_eq!(
            ceiling(2.0, Some(10_000)).to_string(),
            "25 requests (cores: 64, NIC: 25)"
        );
    }
}
