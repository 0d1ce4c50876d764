//! Prometheus metrics of the daemon, in the text exposition format. Names carry the `hydrator_`
//! prefix and base units; counters end in `_total`; no label names a file or a key, so the
//! number of series stays fixed whatever the datasets hold.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

pub const BYTES_FETCHED: &str = "hydrator_bytes_fetched_total";
pub const BYTES_FROM_CACHE: &str = "hydrator_bytes_served_from_cache_total";
pub const HYDRATIONS: &str = "hydrator_hydrations_total";
pub const HYDRATION_DURATION: &str = "hydrator_hydration_duration_seconds";
pub const S3_REQUESTS: &str = "hydrator_s3_requests_total";
pub const CACHE_USED: &str = "hydrator_cache_used_bytes";
pub const CACHE_CAPACITY: &str = "hydrator_cache_capacity_bytes";
pub const CACHE_FREE: &str = "hydrator_cache_filesystem_free_bytes";
pub const EVICTIONS: &str = "hydrator_evictions_total";
pub const DATASETS: &str = "hydrator_datasets";
pub const LEASES: &str = "hydrator_leases";
pub const IO_BACKEND: &str = "hydrator_io_backend_info";
pub const BUILD_INFO: &str = "hydrator_build_info";

/// Upper bounds of the hydration duration histogram, in seconds.
const DURATION_BUCKETS: [f64; 9] = [1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; DURATION_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The daemon's counters; gauges are read from its state when rendering.
#[derive(Default)]
pub struct Metrics {
    /// Bytes received by finished hydrations (running ones are added when rendering).
    pub bytes_fetched: AtomicU64,
    pub bytes_from_cache: AtomicU64,
    pub cache_used: AtomicU64,
    pub cache_free: AtomicU64,
    hydrations: Mutex<BTreeMap<&'static str, u64>>,
    evictions: Mutex<BTreeMap<&'static str, u64>>,
    durations: Mutex<Histogram>,
}

impl Metrics {
    pub fn hydration_finished(&self, result: &'static str, seconds: f64) {
        *self
            .hydrations
            .lock()
            .expect("metrics lock")
            .entry(result)
            .or_default() += 1;
        let mut histogram = self.durations.lock().expect("metrics lock");
        for (bound, count) in DURATION_BUCKETS.iter().zip(&mut histogram.counts) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    pub fn evicted(&self, reason: &'static str) {
        *self
            .evictions
            .lock()
            .expect("metrics lock")
            .entry(reason)
            .or_default() += 1;
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

/// What the daemon's state contributes to one scrape.
pub struct Snapshot<'a> {
    pub bytes_fetched_running: u64,
    pub capacity: u64,
    pub datasets_by_state: BTreeMap<&'static str, u64>,
    pub leases: usize,
    pub s3_requests: &'a BTreeMap<(String, u16), u64>,
    pub io_backend: &'a str,
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The exposition text.
pub fn render(metrics: &Metrics, now: &Snapshot<'_>) -> String {
    let mut out = String::new();
    let simple = |out: &mut String, name: &str, kind: &str, help: &str, value: u64| {
        header(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    };
    simple(
        &mut out,
        BYTES_FETCHED,
        "counter",
        "Bytes received from object storage.",
        metrics.bytes_fetched.load(Relaxed) + now.bytes_fetched_running,
    );
    simple(
        &mut out,
        BYTES_FROM_CACHE,
        "counter",
        "Bytes handed out from the cache without fetching them (ready snapshots, hard-linked files).",
        metrics.bytes_from_cache.load(Relaxed),
    );
    header(
        &mut out,
        HYDRATIONS,
        "counter",
        "Finished hydrations by result.",
    );
    for (result, count) in metrics.hydrations.lock().expect("metrics lock").iter() {
        let _ = writeln!(out, "{HYDRATIONS}{{result=\"{result}\"}} {count}");
    }
    header(
        &mut out,
        HYDRATION_DURATION,
        "histogram",
        "Duration of finished hydrations.",
    );
    {
        let histogram = metrics.durations.lock().expect("metrics lock");
        for (bound, count) in DURATION_BUCKETS.iter().zip(histogram.counts) {
            let _ = writeln!(out, "{HYDRATION_DURATION}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "{HYDRATION_DURATION}_bucket{{le=\"+Inf\"}} {}\n{HYDRATION_DURATION}_sum {}\n{HYDRATION_DURATION}_count {}",
            histogram.count, histogram.sum, histogram.count
        );
    }
    header(
        &mut out,
        S3_REQUESTS,
        "counter",
        "S3 answers by operation and HTTP status.",
    );
    for ((operation, status), count) in now.s3_requests {
        let _ = writeln!(
            out,
            "{S3_REQUESTS}{{operation=\"{operation}\",status=\"{status}\"}} {count}"
        );
    }
    simple(
        &mut out,
        CACHE_USED,
        "gauge",
        "Bytes the cache uses on disk (hard-linked files counted once).",
        metrics.cache_used.load(Relaxed),
    );
    simple(
        &mut out,
        CACHE_CAPACITY,
        "gauge",
        "The cache quota.",
        now.capacity,
    );
    simple(
        &mut out,
        CACHE_FREE,
        "gauge",
        "Free bytes on the cache's filesystem.",
        metrics.cache_free.load(Relaxed),
    );
    header(
        &mut out,
        EVICTIONS,
        "counter",
        "Snapshots evicted, by reason.",
    );
    for (reason, count) in metrics.evictions.lock().expect("metrics lock").iter() {
        let _ = writeln!(out, "{EVICTIONS}{{reason=\"{reason}\"}} {count}");
    }
    header(&mut out, DATASETS, "gauge", "Catalog datasets by state.");
    for (state, count) in &now.datasets_by_state {
        let _ = writeln!(out, "{DATASETS}{{state=\"{state}\"}} {count}");
    }
    simple(&mut out, LEASES, "gauge", "Leases held.", now.leases as u64);
    header(&mut out, IO_BACKEND, "gauge", "The write backend in use.");
    let _ = writeln!(out, "{IO_BACKEND}{{backend=\"{}\"}} 1", now.io_backend);
    header(&mut out, BUILD_INFO, "gauge", "The running build.");
    let _ = writeln!(
        out,
        "{BUILD_INFO}{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histogram_and_labels() {
        let metrics = Metrics::default();
        metrics.hydration_finished("complete", 3.0);
        metrics.hydration_finished("failed", 100.0);
        metrics.evicted("quota");
        Metrics::add(&metrics.bytes_fetched, 5);
        let requests = BTreeMap::from([(("GetObject".to_string(), 206), 7)]);
        let text = render(
            &metrics,
            &Snapshot {
                bytes_fetched_running: 2,
                capacity: 1024,
                datasets_by_state: BTreeMap::from([("ready", 1)]),
                leases: 3,
                s3_requests: &requests,
                io_backend: "pwrite",
            },
        );
        for line in [
            "hydrator_bytes_fetched_total 7",
            "hydrator_hydrations_total{result=\"failed\"} 1",
            "hydrator_hydration_duration_seconds_bucket{le=\"5\"} 1",
            "hydrator_hydration_duration_seconds_bucket{le=\"300\"} 2",
            "hydrator_hydration_duration_seconds_count 2",
            "hydrator_s3_requests_total{operation=\"GetObject\",status=\"206\"} 7",
            "hydrator_evictions_total{reason=\"quota\"} 1",
            "hydrator_datasets{state=\"ready\"} 1",
            "hydrator_leases 3",
            "hydrator_io_backend_info{backend=\"pwrite\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
