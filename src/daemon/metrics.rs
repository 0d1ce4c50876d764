//! Prometheus metrics of the daemon, kept and encoded by `prometheus-client` in the text
//! exposition format (version 0.0.4). Names carry the `hydrator_` prefix and base units;
//! counters are registered without `_total`, which the encoder appends; no label names a file
//! or a key, so the number of series stays fixed whatever the datasets hold.
//!
//! The state, byte, duration and failure series carry a `dataset` label whose values are the
//! catalog's names only: a scrape shows the datasets of the catalog in force, and what was kept
//! for a dataset the catalog no longer holds is dropped, so the series stay bounded by the
//! catalog whatever callers ask for or a reload removes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::{
    prometheus_text, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::protocol::State;
use super::space::Pressure;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub(crate) const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds of the hydration duration histogram, in seconds.
const DURATION_BUCKETS: [f64; 9] = [1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0];

/// How a hydration ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum HydrationResult {
    Complete,
    Failed,
    /// Cut short by the daemon stopping.
    Stopped,
}

impl HydrationResult {
    const ALL: [HydrationResult; 3] = [
        HydrationResult::Complete,
        HydrationResult::Failed,
        HydrationResult::Stopped,
    ];

    fn label(self) -> &'static str {
        match self {
            HydrationResult::Complete => "complete",
            HydrationResult::Failed => "failed",
            HydrationResult::Stopped => "stopped",
        }
    }
}

/// Label values are the enums' own labels.
macro_rules! label_values {
    ($($kind:ty),*) => {$(
        impl EncodeLabelValue for $kind {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
                std::fmt::Write::write_str(encoder, self.label())
            }
        }
    )*};
}
label_values!(HydrationResult, Pressure, State);

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DatasetLabel {
    dataset: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    dataset: String,
    result: HydrationResult,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: Pressure,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    dataset: String,
    state: State,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    operation: String,
    status: u16,
}

type DurationFamily = Family<DatasetLabel, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The daemon's counters and measured gauges; the rest is read from its state when rendering.
pub(crate) struct Metrics {
    /// Bytes received by finished hydrations (running ones are added when rendering).
    bytes_fetched: Family<DatasetLabel, Counter>,
    bytes_from_cache: Family<DatasetLabel, Counter>,
    /// Bytes of finished hydrations that came from the node's peers, and objects they did not
    /// deliver as sealed.
    bytes_from_peers: Family<DatasetLabel, Counter>,
    peer_fallbacks: Family<DatasetLabel, Counter>,
    hydrations: Family<ResultLabels, Counter>,
    durations: DurationFamily,
    /// The datasets something was kept for: those the catalog drops are forgotten.
    recorded: Mutex<BTreeSet<String>>,
    cache_used: Gauge<u64, AtomicU64>,
    cache_free: Gauge<u64, AtomicU64>,
    evictions: Family<ReasonLabel, Counter>,
    cache_walks: Counter,
    state_saves: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            bytes_fetched: Family::default(),
            bytes_from_cache: Family::default(),
            bytes_from_peers: Family::default(),
            peer_fallbacks: Family::default(),
            hydrations: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            recorded: Mutex::default(),
            cache_used: Gauge::default(),
            cache_free: Gauge::default(),
            evictions: Family::default(),
            cache_walks: Counter::default(),
            state_saves: Counter::default(),
        }
    }
}

/// One catalog dataset at the scrape.
pub(crate) struct DatasetNow<'a> {
    pub name: &'a str,
    pub state: State,
    /// Bytes its running hydration has received so far.
    pub bytes_fetching: u64,
}

/// What the daemon's state contributes to one scrape.
pub(crate) struct Snapshot<'a> {
    pub capacity: u64,
    /// Every dataset of the catalog in force, and only those.
    pub datasets: Vec<DatasetNow<'a>>,
    pub leases: usize,
    pub s3_requests: &'a BTreeMap<(String, u16), u64>,
    pub io_backend: &'a str,
    /// Seconds hydrations waited on the catalog's bandwidth and request-rate caps.
    pub rate_limited_seconds: f64,
}

fn label(dataset: &str) -> DatasetLabel {
    DatasetLabel {
        dataset: dataset.to_string(),
    }
}

impl Metrics {
    /// Notes that `dataset` has series kept; its label.
    fn record(&self, dataset: &str) -> DatasetLabel {
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        recorded.insert(dataset.to_string());
        label(dataset)
    }

    pub(crate) fn hydration_finished(&self, dataset: &str, result: HydrationResult, seconds: f64) {
        let label = self.record(dataset);
        self.durations.get_or_create(&label).observe(seconds);
        let labels = ResultLabels {
            dataset: label.dataset,
            result,
        };
        self.hydrations.get_or_create(&labels).inc();
    }

    pub(crate) fn evicted(&self, reason: Pressure) {
        self.evictions.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Bytes a finished hydration of `dataset` received.
    pub(crate) fn fetched(&self, dataset: &str, bytes: u64) {
        let label = self.record(dataset);
        self.bytes_fetched.get_or_create(&label).inc_by(bytes);
    }

    /// What a finished hydration of `dataset` got from the node's peers.
    pub(crate) fn peers_delivered(&self, dataset: &str, bytes: u64, fallbacks: u64) {
        let label = self.record(dataset);
        self.bytes_from_peers.get_or_create(&label).inc_by(bytes);
        self.peer_fallbacks.get_or_create(&label).inc_by(fallbacks);
    }

    pub(crate) fn served_from_cache(&self, dataset: &str, bytes: u64) {
        let label = self.record(dataset);
        self.bytes_from_cache.get_or_create(&label).inc_by(bytes);
    }

    /// Drops what was kept for datasets that are not in `catalog`.
    fn forget_all_but(&self, catalog: &BTreeSet<&str>) {
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        recorded.retain(|dataset| {
            let kept = catalog.contains(dataset.as_str());
            if !kept {
                let label = label(dataset);
                for family in [
                    &self.bytes_fetched,
                    &self.bytes_from_cache,
                    &self.bytes_from_peers,
                    &self.peer_fallbacks,
                ] {
                    family.remove(&label);
                }
                self.durations.remove(&label);
                for result in HydrationResult::ALL {
                    self.hydrations.remove(&ResultLabels {
                        dataset: dataset.clone(),
                        result,
                    });
                }
            }
            kept
        });
    }

    /// A family of one counter per catalog dataset: `kept`'s value, plus `extra`.
    fn per_dataset(
        kept: &Family<DatasetLabel, Counter>,
        now: &Snapshot<'_>,
        extra: impl Fn(&DatasetNow<'_>) -> u64,
    ) -> Family<DatasetLabel, Counter> {
        let family = Family::<DatasetLabel, Counter>::default();
        for dataset in &now.datasets {
            let label = label(dataset.name);
            let value = kept.get(&label).map_or(0, |counter| counter.get());
            family.get_or_create(&label).inc_by(value + extra(dataset));
        }
        family
    }

    /// A dataset's directory was walked to measure what it holds.
    pub(crate) fn dataset_walked(&self) {
        self.cache_walks.inc();
    }

    pub(crate) fn state_saved(&self) {
        self.state_saves.inc();
    }

    pub(crate) fn cache_measured(&self, used: u64, free: u64) {
        self.cache_used.set(used);
        self.cache_free.set(free);
    }

    /// The exposition text: the kept metrics and `now`'s, in one registry made for the scrape.
    pub(crate) fn render(&self, now: &Snapshot<'_>) -> String {
        self.forget_all_but(&now.datasets.iter().map(|d| d.name).collect());
        let mut registry = Registry::default();
        // The registry appends a full stop to each help text.
        registry.register(
            "hydrator_bytes_fetched",
            "Bytes received from object storage",
            Self::per_dataset(&self.bytes_fetched, now, |d| d.bytes_fetching),
        );
        registry.register(
            "hydrator_bytes_served_from_cache",
            "Bytes handed out from the cache without fetching them (ready snapshots, hard-linked files)",
            Self::per_dataset(&self.bytes_from_cache, now, |_| 0),
        );
        registry.register(
            "hydrator_bytes_from_peers",
            "Bytes that came from the node's Dragonfly peers and matched their seal",
            Self::per_dataset(&self.bytes_from_peers, now, |_| 0),
        );
        registry.register(
            "hydrator_peer_fallbacks",
            "Objects the peers did not deliver as sealed, fetched from object storage instead",
            Self::per_dataset(&self.peer_fallbacks, now, |_| 0),
        );
        registry.register(
            "hydrator_hydrations",
            "Finished hydrations by result",
            self.hydrations.clone(),
        );
        registry.register(
            "hydrator_hydration_duration_seconds",
            "Duration of finished hydrations",
            self.durations.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        for ((operation, status), count) in now.s3_requests {
            let labels = RequestLabels {
                operation: operation.clone(),
                status: *status,
            };
            requests.get_or_create(&labels).inc_by(*count);
        }
        registry.register(
            "hydrator_s3_requests",
            "S3 answers by operation and HTTP status",
            requests,
        );
        registry.register(
            "hydrator_rate_limited_seconds",
            "Seconds hydrations waited on the bandwidth and request-rate caps, summed over requests (rising fast: a cap is the bottleneck)",
            ConstCounter::new(now.rate_limited_seconds),
        );
        registry.register(
            "hydrator_cache_used_bytes",
            "Bytes the cache uses on disk (hard-linked files counted once)",
            self.cache_used.clone(),
        );
        registry.register(
            "hydrator_cache_capacity_bytes",
            "The cache quota",
            ConstGauge::new(now.capacity),
        );
        registry.register(
            "hydrator_cache_filesystem_free_bytes",
            "Free bytes on the cache's filesystem",
            self.cache_free.clone(),
        );
        registry.register(
            "hydrator_evictions",
            "Snapshots evicted, by reason",
            self.evictions.clone(),
        );
        registry.register(
            "hydrator_cache_walks",
            "Walks of a dataset's directory to measure its disk use (only after it changed)",
            self.cache_walks.clone(),
        );
        registry.register(
            "hydrator_state_saves",
            "Writes of the daemon's state file (leases, last use)",
            self.state_saves.clone(),
        );
        let datasets = Family::<StateLabels, Gauge<u64, AtomicU64>>::default();
        for dataset in &now.datasets {
            for state in State::ALL {
                let labels = StateLabels {
                    dataset: dataset.name.to_string(),
                    state,
                };
                datasets
                    .get_or_create(&labels)
                    .set(u64::from(dataset.state == state));
            }
        }
        registry.register("hydrator_datasets", "Catalog datasets by state", datasets);
        registry.register(
            "hydrator_leases",
            "Leases held",
            ConstGauge::new(now.leases as u64),
        );
        registry.register(
            "hydrator_io_backend",
            "The write backend in use",
            Info::new([("backend", now.io_backend.to_string())]),
        );
        registry.register(
            "hydrator_build",
            "The running build",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        let mut text = String::new();
        prometheus_text::encode(&mut text, &registry).expect("writing to a String");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now<'a>(
        datasets: Vec<DatasetNow<'a>>,
        requests: &'a BTreeMap<(String, u16), u64>,
    ) -> Snapshot<'a> {
        Snapshot {
            capacity: 1024,
            datasets,
            leases: 3,
            s3_requests: requests,
            io_backend: "pwrite",
            rate_limited_seconds: 1.5,
        }
    }

    fn dataset(name: &str, state: State, bytes_fetching: u64) -> DatasetNow<'_> {
        DatasetNow {
            name,
            state,
            bytes_fetching,
        }
    }

    fn rendered() -> String {
        let metrics = Metrics::default();
        metrics.hydration_finished("coco", HydrationResult::Complete, 3.0);
        metrics.hydration_finished("coco", HydrationResult::Failed, 100.0);
        metrics.evicted(Pressure::Quota);
        metrics.fetched("coco", 5);
        metrics.served_from_cache("coco", 11);
        metrics.peers_delivered("coco", 64, 2);
        metrics.cache_measured(300, 4000);
        metrics.dataset_walked();
        metrics.dataset_walked();
        metrics.state_saved();
        let requests = BTreeMap::from([(("GetObject".to_string(), 206), 7)]);
        metrics.render(&now(vec![dataset("coco", State::Ready, 2)], &requests))
    }

    /// The names, types, labels and help texts docs/daemon.md documents ("Metrics"), exactly.
    #[test]
    fn exposes_the_documented_names_types_and_labels() {
        let text = rendered();
        let families = [
            ("hydrator_bytes_fetched_total", "counter", "Bytes received from object storage."),
            ("hydrator_bytes_served_from_cache_total", "counter", "Bytes handed out from the cache without fetching them (ready snapshots, hard-linked files)."),
            ("hydrator_bytes_from_peers_total", "counter", "Bytes that came from the node's Dragonfly peers and matched their seal."),
            ("hydrator_peer_fallbacks_total", "counter", "Objects the peers did not deliver as sealed, fetched from object storage instead."),
            ("hydrator_hydrations_total", "counter", "Finished hydrations by result."),
            ("hydrator_hydration_duration_seconds", "histogram", "Duration of finished hydrations."),
            ("hydrator_s3_requests_total", "counter", "S3 answers by operation and HTTP status."),
            ("hydrator_rate_limited_seconds_total", "counter", "Seconds hydrations waited on the bandwidth and request-rate caps, summed over requests (rising fast: a cap is the bottleneck)."),
            ("hydrator_cache_used_bytes", "gauge", "Bytes the cache uses on disk (hard-linked files counted once)."),
            ("hydrator_cache_capacity_bytes", "gauge", "The cache quota."),
            ("hydrator_cache_filesystem_free_bytes", "gauge", "Free bytes on the cache's filesystem."),
            ("hydrator_evictions_total", "counter", "Snapshots evicted, by reason."),
            ("hydrator_cache_walks_total", "counter", "Walks of a dataset's directory to measure its disk use (only after it changed)."),
            ("hydrator_state_saves_total", "counter", "Writes of the daemon's state file (leases, last use)."),
            ("hydrator_datasets", "gauge", "Catalog datasets by state."),
            ("hydrator_leases", "gauge", "Leases held."),
            ("hydrator_io_backend_info", "gauge", "The write backend in use."),
            ("hydrator_build_info", "gauge", "The running build."),
        ];
        let mut expected = Vec::new();
        for (name, kind, help) in families {
            expected.push(format!("# HELP {name} {help}"));
            expected.push(format!("# TYPE {name} {kind}"));
        }
        let headers: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(headers, expected, "in\n{text}");
        let samples = [
            "hydrator_bytes_fetched_total{dataset=\"coco\"} 7",
            "hydrator_bytes_served_from_cache_total{dataset=\"coco\"} 11",
            "hydrator_bytes_from_peers_total{dataset=\"coco\"} 64",
            "hydrator_peer_fallbacks_total{dataset=\"coco\"} 2",
            "hydrator_rate_limited_seconds_total 1.5",
            "hydrator_hydrations_total{dataset=\"coco\",result=\"complete\"} 1",
            "hydrator_hydrations_total{dataset=\"coco\",result=\"failed\"} 1",
            "hydrator_hydration_duration_seconds_bucket{dataset=\"coco\",le=\"1\"} 0",
            "hydrator_hydration_duration_seconds_bucket{dataset=\"coco\",le=\"5\"} 1",
            "hydrator_hydration_duration_seconds_bucket{dataset=\"coco\",le=\"300\"} 2",
            "hydrator_hydration_duration_seconds_bucket{dataset=\"coco\",le=\"86400\"} 2",
            "hydrator_hydration_duration_seconds_bucket{dataset=\"coco\",le=\"+Inf\"} 2",
            "hydrator_hydration_duration_seconds_sum{dataset=\"coco\"} 103.0",
            "hydrator_hydration_duration_seconds_count{dataset=\"coco\"} 2",
            "hydrator_s3_requests_total{operation=\"GetObject\",status=\"206\"} 7",
            "hydrator_cache_used_bytes 300",
            "hydrator_cache_capacity_bytes 1024",
            "hydrator_cache_filesystem_free_bytes 4000",
            "hydrator_evictions_total{reason=\"quota\"} 1",
            "hydrator_cache_walks_total 2",
            "hydrator_state_saves_total 1",
            "hydrator_datasets{dataset=\"coco\",state=\"ready\"} 1",
            "hydrator_datasets{dataset=\"coco\",state=\"absent\"} 0",
            "hydrator_datasets{dataset=\"coco\",state=\"hydrating\"} 0",
            "hydrator_datasets{dataset=\"coco\",state=\"failed\"} 0",
            "hydrator_leases 3",
            "hydrator_io_backend_info{backend=\"pwrite\"} 1",
            concat!(
                "hydrator_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
        ];
        for line in samples {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(
            series,
            samples.len() + 5,
            "the other buckets and nothing else in\n{text}"
        );
    }

    #[test]
    fn dataset_labels_are_the_catalogs_names_and_a_dataset_it_drops_is_forgotten() {
        let metrics = Metrics::default();
        metrics.hydration_finished("coco", HydrationResult::Complete, 3.0);
        metrics.hydration_finished("gone", HydrationResult::Failed, 1.0);
        metrics.fetched("gone", 9);
        metrics.served_from_cache("gone", 9);
        let requests = BTreeMap::new();
        let catalog = vec![
            dataset("coco", State::Ready, 0),
            dataset("imagenet", State::Hydrating, 40),
        ];
        let text = metrics.render(&now(catalog, &requests));
        for line in [
            "hydrator_hydrations_total{dataset=\"coco\",result=\"complete\"} 1",
            "hydrator_bytes_fetched_total{dataset=\"imagenet\"} 40",
            "hydrator_bytes_fetched_total{dataset=\"coco\"} 0",
            "hydrator_datasets{dataset=\"imagenet\",state=\"hydrating\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("gone"), "not in the catalog:\n{text}");
        // Back in the catalog, it starts afresh.
        let text = metrics.render(&now(vec![dataset("gone", State::Absent, 0)], &requests));
        assert!(
            text.lines()
                .any(|l| l == "hydrator_bytes_fetched_total{dataset=\"gone\"} 0"),
            "{text}"
        );
        assert!(!text.contains("result=\"failed\""), "{text}");
    }

    #[test]
    fn the_other_label_values_are_the_documented_ones() {
        let metrics = Metrics::default();
        metrics.hydration_finished("coco", HydrationResult::Stopped, 1.0);
        metrics.evicted(Pressure::FreeSpace);
        let requests = BTreeMap::new();
        let text = metrics.render(&now(vec![dataset("coco", State::Absent, 0)], &requests));
        for line in [
            "hydrator_hydrations_total{dataset=\"coco\",result=\"stopped\"} 1",
            "hydrator_evictions_total{reason=\"free_space_floor\"} 1",
            "hydrator_datasets{dataset=\"coco\",state=\"absent\"} 1",
            "hydrator_datasets{dataset=\"coco\",state=\"hydrating\"} 0",
            "hydrator_datasets{dataset=\"coco\",state=\"ready\"} 0",
            "hydrator_datasets{dataset=\"coco\",state=\"failed\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
