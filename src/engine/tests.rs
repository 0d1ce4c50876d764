//! The engine against an in-memory object store with scripted faults: how an object and its
//! parts come through a broken body, a changed object, throttling and a lying server.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::{run_with, Hooks, Outcome};
use crate::config::{Concurrency, IoBackendChoice, ProgressMode, SyncConfig, SyncConfigBuilder};
use crate::error::Exit;
use crate::source::memory::{Fault, MemorySource, Request};
use crate::source::url::S3Url;

const MIB: usize = 1 << 20;

fn content(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// An empty DEST and an in-memory store to mirror from.
struct Fixture {
    dest: tempfile::TempDir,
    source: Arc<MemorySource>,
}

impl Fixture {
    fn new(with_checksums: bool) -> Self {
        Self {
            dest: tempfile::tempdir().unwrap(),
            source: Arc::new(MemorySource::new(with_checksums)),
        }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dest.path().join(name)
    }

    async fn sync(&self) -> Outcome {
        let cfg = SyncConfigBuilder {
            concurrency: Concurrency::Fixed(4),
            part_size: MIB as u64,
            io_backend: IoBackendChoice::Pwrite,
            progress: ProgressMode::None,
            ..SyncConfig::builder(
                S3Url {
                    bucket: "bucket".into(),
                    prefix: String::new(),
                },
                self.dest.path().to_path_buf(),
            )
        }
        .build()
        .expect("a valid config");
        let hooks = Hooks {
            source: Some(self.source.clone()),
            ..Default::default()
        };
        run_with(cfg, hooks).await.expect("the run starts")
    }

    /// The GETs of `key`, in the order they were answered.
    fn gets(&self, key: &str) -> Vec<Range<u64>> {
        self.source
            .requests()
            .into_iter()
            .filter_map(|r| match r {
                Request::Get(k, range) if k == key => Some(range),
                _ => None,
            })
            .collect()
    }

    /// The run succeeded, `key` holds `data`, and re-hashing DEST against the manifest finds
    /// the BLAKE3 it recorded.
    async fn assert_mirrored(&self, outcome: &Outcome, key: &str, data: &Bytes) {
        let failures = &outcome.summary.failures;
        assert_eq!(outcome.exit, Exit::Success, "{failures:?}");
        assert_eq!(std::fs::read(self.path(key)).unwrap(), *data);
        let (findings, _) = crate::verify::verify(self.dest.path(), crate::verify::Mode::ReadOnly)
            .await
            .unwrap();
        assert!(findings.clean(), "{findings:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_resumes_the_rest_of_its_range() {
    let fixture = Fixture::new(true);
    // Every part is longer than the cut, whichever is asked for first.
    let data = content(3 * MIB + 400_000, 1);
    fixture.source.put("big.bin", data.clone());
    fixture.source.fault("big.bin", Fault::CutAfter(300_000));
    let outcome = fixture.sync().await;
    fixture.assert_mirrored(&outcome, "big.bin", &data).await;
    let gets = fixture.gets("big.bin");
    let cut = gets[0].clone();
    assert!(
        gets.contains(&(cut.start + 300_000..cut.end)),
        "no GET for the rest of {cut:?}: {gets:?}"
    );
    assert_eq!(gets.len(), 5, "4 parts and one resumption: {gets:?}");
    assert_eq!(outcome.summary.bytes.received, data.len() as u64);
    assert_eq!(outcome.summary.part_retries, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_breaks_after_its_last_byte_is_fetched_again() {
    let fixture = Fixture::new(true);
    let data = content(2 * MIB, 9);
    fixture.source.put("two.bin", data.clone());
    fixture.source.fault("two.bin", Fault::CutAfter(MIB));
    let outcome = fixture.sync().await;
    fixture.assert_mirrored(&outcome, "two.bin", &data).await;
    let gets = fixture.gets("two.bin");
    assert_eq!(gets.len(), 3, "{gets:?}");
    assert_eq!(
        gets.iter().filter(|r| **r == gets[0]).count(),
        2,
        "{gets:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_its_range_is_fetched_again_and_none_of_its_extra_bytes_land() {
    let fixture = Fixture::new(true);
    // Two parts, the second shorter than a buffer: extra bytes would fit in its buffer.
    let data = content(MIB + 5000, 4);
    fixture.source.put("long.bin", data.clone());
    fixture.source.fault("long.bin", Fault::Longer(3000));
    fixture.source.fault("long.bin", Fault::Longer(3000));
    let outcome = fixture.sync().await;
    fixture.assert_mirrored(&outcome, "long.bin", &data).await;
    assert_eq!(fixture.gets("long.bin").len(), 4, "each part again");
    assert_eq!(outcome.summary.part_retries, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_object_body_cut_short_starts_again() {
    let fixture = Fixture::new(false);
    let data = content(200_000, 2);
    fixture.source.put("small.bin", data.clone());
    fixture.source.fault("small.bin", Fault::CutAfter(70_000));
    let outcome = fixture.sync().await;
    fixture.assert_mirrored(&outcome, "small.bin", &data).await;
    assert_eq!(fixture.gets("small.bin"), vec![0..200_000, 0..200_000]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_changes_mid_download_is_restarted_at_its_new_version() {
    let fixture = Fixture::new(true);
    fixture.source.put("m.bin", content(2 * MIB + 5, 3));
    let newer = content(2 * MIB + 5, 4);
    fixture
        .source
        .fault("m.bin", Fault::Overwrite(newer.clone()));
    let outcome = fixture.sync().await;
    fixture.assert_mirrored(&outcome, "m.bin", &newer).await;
    assert_eq!(outcome.summary.object_restarts, 1);
    let head = Request::Head("m.bin".to_string());
    assert!(fixture.source.requests().contains(&head));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_and_then_given_up() {
    let fixture = Fixture::new(false);
    let source = &fixture.source;
    source.put("hot.bin", content(MIB / 2, 5));
    source.put("scorching.bin", content(MIB / 2, 6));
    for _ in 0..2 {
        source.fault("hot.bin", Fault::Status(503, "SlowDown"));
    }
    let attempts = super::part::MAX_PART_ATTEMPTS as usize;
    for _ in 0..attempts {
        source.fault("scorching.bin", Fault::Status(503, "SlowDown"));
    }
    let outcome = fixture.sync().await;
    assert_eq!(outcome.exit, Exit::Failed);
    assert_eq!(fixture.gets("hot.bin").len(), 3);
    assert!(fixture.path("hot.bin").exists());
    assert_eq!(fixture.gets("scorching.bin").len(), attempts);
    assert!(!fixture.path("scorching.bin").exists());
    let failures = &outcome.summary.failures;
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].key, "scorching.bin");
    let gave_up = format!("gave up after {attempts} attempts");
    let reason = &failures[0].reason;
    assert!(
        reason.contains("HTTP 503 SlowDown") && reason.contains(&gave_up),
        "{reason}"
    );
    assert_eq!(outcome.summary.part_retries, 2 + attempts as u64 - 1);
    assert!(!fixture.path(".hydrator/READY").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_content_range_fails_the_object_without_retrying() {
    let fixture = Fixture::new(false);
    fixture.source.put("lie.bin", content(3 * MIB, 7));
    fixture.source.put("fine.bin", content(1000, 8));
    fixture.source.fault("lie.bin", Fault::ShiftedContentRange);
    let outcome = fixture.sync().await;
    assert_eq!(outcome.exit, Exit::Failed);
    let failures = &outcome.summary.failures;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].key, "lie.bin");
    let reason = &failures[0].reason;
    assert!(reason.contains("server sent"), "{reason}");
    assert_eq!(outcome.summary.part_retries, 0);
    assert!(!fixture.path("lie.bin").exists());
    assert!(fixture.path("fine.bin").exists());
    assert!(!fixture.path(".hydrator/READY").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_waiting_for_a_slow_disk_are_bounded_whatever_their_count() {
    // Downloads from memory outpace a disk whose batches take 200 ms more: finished files wait
    // for their batch, and without a bound every object's task would wait with them.
    const OBJECTS: usize = 4_000;
    let fixture = Fixture::new(false);
    for n in 0..OBJECTS {
        fixture
            .source
            .put(&format!("d/{n:05}"), content(16, n as u8));
    }
    let cfg = SyncConfigBuilder {
        concurrency: Concurrency::Fixed(4),
        io_backend: IoBackendChoice::Pwrite,
        progress: ProgressMode::None,
        ..SyncConfig::builder(
            S3Url {
                bucket: "bucket".into(),
                prefix: String::new(),
            },
            fixture.dest.path().to_path_buf(),
        )
    }
    .build()
    .expect("a valid config");
    let stats = Arc::new(crate::engine::stats::Stats::default());
    let hooks = Hooks {
        source: Some(fixture.source.clone()),
        stats: stats.clone(),
        slow_disk: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    let outcome = run_with(cfg, hooks).await.expect("the run starts");
    assert_eq!(outcome.exit, Exit::Success);
    let most = stats
        .most_objects_in_flight
        .load(std::sync::atomic::Ordering::Relaxed);
    // Object slots (4 × concurrency) and the files waiting for their batch (4 batches of 256).
    assert!(most <= 16 + 1024, "{most} objects in flight at once");
}
