//! The engine against an in-memory object store with scripted faults: how an object and its
//! parts come through a broken body, a changed object, throttling and a lying server.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::{run_with, Hooks, Outcome};
use crate::config::{Concurrency, IoBackendChoice, ProgressMode, S3Url, SyncConfig};
use crate::error::Exit;
use crate::source::memory::{Fault, MemorySource, Request};

const MIB: usize = 1 << 20;

fn content(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn sync(source: &Arc<MemorySource>, dest: &Path) -> Outcome {
    let cfg = SyncConfig {
        concurrency: Concurrency::Fixed(4),
        part_size: MIB as u64,
        io_backend: IoBackendChoice::Pwrite,
        progress: ProgressMode::None,
        ..SyncConfig::new(
            S3Url {
                bucket: "bucket".into(),
                prefix: String::new(),
            },
            dest.to_path_buf(),
        )
    };
    let hooks = Hooks {
        source: Some(source.clone()),
        ..Default::default()
    };
    run_with(cfg, hooks).await.expect("the run starts")
}

fn gets(source: &MemorySource, key: &str) -> Vec<Range<u64>> {
    source
        .requests()
        .into_iter()
        .filter_map(|r| match r {
            Request::Get(k, range) if k == key => Some(range),
            _ => None,
        })
        .collect()
}

/// Re-hashes DEST against the manifest: the recorded BLAKE3 is that of the bytes on disk.
async fn assert_verified(dest: &Path) {
    let (findings, _) = crate::verify::verify(dest, false).await.unwrap();
    assert!(findings.clean(), "{findings:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_resumes_the_rest_of_its_range() {
    let dest = tempfile::tempdir().unwrap();
    let source = Arc::new(MemorySource::new(true));
    let data = content(3 * MIB + 100, 1);
    source.put("big.bin", data.clone());
    source.fault("big.bin", Fault::CutAfter(300_000));
    let outcome = sync(&source, dest.path()).await;
    assert_eq!(
        outcome.exit,
        Exit::Success,
        "{:?}",
        outcome.summary.failures
    );
    assert_eq!(std::fs::read(dest.path().join("big.bin")).unwrap(), data);
    let gets = gets(&source, "big.bin");
    let cut = gets[0].clone();
    assert!(
        gets.contains(&(cut.start + 300_000..cut.end)),
        "no GET for the rest of {cut:?}: {gets:?}"
    );
    assert_eq!(gets.len(), 5, "4 parts and one resumption: {gets:?}");
    assert_eq!(outcome.summary.bytes.received, data.len() as u64);
    assert_eq!(outcome.summary.part_retries, 1);
    assert_verified(dest.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_object_body_cut_short_starts_again() {
    let dest = tempfile::tempdir().unwrap();
    let source = Arc::new(MemorySource::new(false));
    let data = content(200_000, 2);
    source.put("small.bin", data.clone());
    source.fault("small.bin", Fault::CutAfter(70_000));
    let outcome = sync(&source, dest.path()).await;
    assert_eq!(
        outcome.exit,
        Exit::Success,
        "{:?}",
        outcome.summary.failures
    );
    assert_eq!(std::fs::read(dest.path().join("small.bin")).unwrap(), data);
    assert_eq!(gets(&source, "small.bin"), vec![0..200_000, 0..200_000]);
    assert_verified(dest.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_changes_mid_download_is_restarted_at_its_new_version() {
    let dest = tempfile::tempdir().unwrap();
    let source = Arc::new(MemorySource::new(true));
    source.put("m.bin", content(2 * MIB + 5, 3));
    let newer = content(2 * MIB + 5, 4);
    source.fault("m.bin", Fault::Overwrite(newer.clone()));
    let outcome = sync(&source, dest.path()).await;
    assert_eq!(
        outcome.exit,
        Exit::Success,
        "{:?}",
        outcome.summary.failures
    );
    assert_eq!(std::fs::read(dest.path().join("m.bin")).unwrap(), newer);
    assert_eq!(outcome.summary.object_restarts, 1);
    assert!(source
        .requests()
        .contains(&Request::Head("m.bin".to_string())));
    assert_verified(dest.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_with_backoff_and_then_given_up() {
    let dest = tempfile::tempdir().unwrap();
    let source = Arc::new(MemorySource::new(false));
    source.put("hot.bin", content(MIB / 2, 5));
    source.put("scorching.bin", content(MIB / 2, 6));
    for _ in 0..2 {
        source.fault("hot.bin", Fault::Status(503, "SlowDown"));
    }
    for _ in 0..crate::config::MAX_PART_ATTEMPTS {
        source.fault("scorching.bin", Fault::Status(503, "SlowDown"));
    }
    let outcome = sync(&source, dest.path()).await;
    assert_eq!(outcome.exit, Exit::Failed);
    assert_eq!(gets(&source, "hot.bin").len(), 3);
    assert!(dest.path().join("hot.bin").exists());
    let attempts = crate::config::MAX_PART_ATTEMPTS as usize;
    assert_eq!(gets(&source, "scorching.bin").len(), attempts);
    assert!(!dest.path().join("scorching.bin").exists());
    let failures = &outcome.summary.failures;
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].key, "scorching.bin");
    assert!(
        failures[0].reason.contains("HTTP 503 SlowDown")
            && failures[0]
                .reason
                .contains(&format!("gave up after {attempts} attempts")),
        "{}",
        failures[0].reason
    );
    assert_eq!(outcome.summary.part_retries, 2 + attempts as u64 - 1);
    assert!(!dest.path().join(".hydrator/READY").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_content_range_fails_the_object_without_retrying() {
    let dest = tempfile::tempdir().unwrap();
    let source = Arc::new(MemorySource::new(false));
    source.put("lie.bin", content(3 * MIB, 7));
    source.put("fine.bin", content(1000, 8));
    source.fault("lie.bin", Fault::ShiftedContentRange);
    let outcome = sync(&source, dest.path()).await;
    assert_eq!(outcome.exit, Exit::Failed);
    let failures = &outcome.summary.failures;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].key, "lie.bin");
    assert!(
        failures[0].reason.contains("server sent"),
        "{}",
        failures[0].reason
    );
    assert_eq!(outcome.summary.part_retries, 0);
    assert!(!dest.path().join("lie.bin").exists());
    assert!(dest.path().join("fine.bin").exists());
    assert!(!dest.path().join(".hydrator/READY").exists());
}
