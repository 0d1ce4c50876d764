//! The engine against an in-memory object store with scripted faults: how an object and its
//! parts come through a broken body, a changed object, throttling and a lying server.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::stats::Stats;
use super::{run_with, Hooks, Outcome};
use crate::config::{Concurrency, IoBackendChoice, ProgressMode, SyncConfig, SyncConfigBuilder};
use crate::error::Exit;
use crate::p2p::{PeerError, Peers};
use crate::source::fetch::PinnedObject;
use crate::source::memory::{Fault, MemorySource, Request};
use crate::source::object_source::ObjectSource;
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
        let hooks = Hooks {
            source: Some(self.source.clone()),
            ..Default::default()
        };
        self.sync_with(hooks).await
    }

    /// A run of a sealed listing of what the store holds, sealed as `data` by key, with
    /// `peers` tried first for every object.
    async fn sync_sealed(
        &self,
        data: &[(&str, &Bytes)],
        peers: Arc<dyn Peers>,
    ) -> (Outcome, Arc<Stats>) {
        let page = self.source.list_page("bucket", "", None).await.unwrap();
        let (listed, listing) = tokio::sync::mpsc::channel(page.entries.len().max(1));
        for mut entry in page.entries {
            let (_, bytes) = data.iter().find(|(key, _)| *key == entry.key).unwrap();
            entry.sealed = Some(*blake3::hash(bytes).as_bytes());
            listed.send(Ok(entry)).await.unwrap();
        }
        drop(listed);
        let stats = Arc::new(Stats::default());
        let hooks = Hooks {
            source: Some(self.source.clone()),
            listing: Some(listing),
            peers: Some(peers),
            stats: stats.clone(),
            ..Default::default()
        };
        (self.sync_with(hooks).await, stats)
    }

    async fn sync_with(&self, hooks: Hooks) -> Outcome {
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
        assert!(findings.passes(), "{findings:?}");
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

/// Peers that deliver every object by running `deliver` on the output path.
struct ScriptedPeers<F>(F);

impl<F: Fn(&Path) -> std::io::Result<()> + Send + Sync + 'static> Peers for ScriptedPeers<F> {
    fn min_size(&self) -> u64 {
        1
    }

    fn download<'a>(
        &'a self,
        _object: &'a PinnedObject,
        output: &'a Path,
    ) -> BoxFuture<'a, Result<(), PeerError>> {
        let delivered = (self.0)(output).map_err(PeerError::Local);
        Box::pin(async move { delivered })
    }
}

fn scripted(
    deliver: impl Fn(&Path) -> std::io::Result<()> + Send + Sync + 'static,
) -> Arc<dyn Peers> {
    Arc::new(ScriptedPeers(deliver))
}

/// The run took every object from the peers, and the store served no GET.
fn all_from_peers(fixture: &Fixture, outcome: &Outcome, stats: &Stats, bytes: usize) {
    assert_eq!(
        outcome.exit,
        Exit::Success,
        "{:?}",
        outcome.summary.failures
    );
    assert_eq!(Stats::get(&stats.peer_fallbacks), 0);
    assert_eq!(Stats::get(&stats.bytes_from_peers), bytes as u64);
    let gets = fixture.source.requests();
    assert!(
        !gets.iter().any(|r| matches!(r, Request::Get(..))),
        "{gets:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_file_hard_linked_from_elsewhere_is_published_as_an_inode_of_our_own() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let fixture = Fixture::new(false);
    let data = content(3 * MIB + 5, 12);
    fixture.source.put("linked.bin", data.clone());
    // The dfdaemon's storage, on DEST's filesystem: it hard-links its copy to the output.
    let storage = tempfile::tempdir().unwrap();
    let stored = storage.path().join("task");
    std::fs::write(&stored, &data).unwrap();
    let link_from = stored.clone();
    let peers = scripted(move |output| std::fs::hard_link(&link_from, output));
    let (outcome, stats) = fixture.sync_sealed(&[("linked.bin", &data)], peers).await;
    all_from_peers(&fixture, &outcome, &stats, data.len());

    // The dfdaemon writes to its copy later: the published file is another inode, unchanged.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&stored)
        .unwrap()
        .write_all_at(b"overwritten by the dfdaemon", 0)
        .unwrap();
    let published = fixture.path("linked.bin");
    let hash = |path: &Path| blake3::hash(&std::fs::read(path).unwrap());
    assert_eq!(
        hash(&published),
        blake3::hash(&data),
        "changed by the dfdaemon's write"
    );
    let (ours, theirs) = (
        std::fs::metadata(&published).unwrap(),
        std::fs::metadata(&stored).unwrap(),
    );
    assert_ne!(ours.ino(), theirs.ino());
    assert_eq!((ours.nlink(), theirs.nlink()), (1, 1));
    // Nothing of what was delivered is left in the staging directory.
    let staging = fixture.path(".hydrator/peers");
    assert_eq!(std::fs::read_dir(staging).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_file_swapped_after_its_download_has_none_of_its_new_bytes_published() {
    use rustix::fs::inotify;
    let fixture = Fixture::new(false);
    // Large enough that hashing it outlasts the swap by far.
    let data = content(32 * MIB, 13);
    fixture.source.put("swapped.bin", data.clone());
    let elsewhere = tempfile::tempdir().unwrap();
    let (good, other) = (
        elsewhere.path().join("good"),
        elsewhere.path().join("other"),
    );
    std::fs::write(&good, &data).unwrap();
    let mut swapped_in = data.to_vec();
    swapped_in[7] ^= 1;
    std::fs::write(&other, &swapped_in).unwrap();
    // The peer delivers the right bytes, then renames others over them as soon as hydrator
    // opens what it delivered: every check hydrator makes after that open sees the new file
    // under the old name.
    let swapper = Arc::new(std::sync::Mutex::new(None));
    let swapping = swapper.clone();
    let peers = scripted(move |output| {
        std::fs::rename(&good, output)?;
        let watcher = inotify::init(inotify::CreateFlags::CLOEXEC)?;
        let flags = inotify::WatchFlags::OPEN | inotify::WatchFlags::ONESHOT;
        inotify::add_watch(&watcher, output, flags)?;
        let (other, output) = (other.clone(), output.to_path_buf());
        *swapping.lock().unwrap() = Some(std::thread::spawn(move || {
            let mut buffer = [std::mem::MaybeUninit::uninit(); 1024];
            inotify::Reader::new(&watcher, &mut buffer).next().unwrap();
            std::fs::rename(&other, &output).unwrap();
        }));
        Ok(())
    });
    let (outcome, stats) = fixture.sync_sealed(&[("swapped.bin", &data)], peers).await;
    let swapper = swapper.lock().unwrap().take().expect("delivered");
    swapper.join().expect("the swap happened");
    all_from_peers(&fixture, &outcome, &stats, data.len());
    let published = std::fs::read(fixture.path("swapped.bin")).unwrap();
    assert!(published == data, "the bytes swapped in were published");
    fixture
        .assert_mirrored(&outcome, "swapped.bin", &data)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_from_the_peers_is_refused_at_once_and_the_object_comes_from_the_store() {
    let fixture = Fixture::new(false);
    let data = content(2 * MIB, 14);
    fixture.source.put("fifo.bin", data.clone());
    let fifo = Arc::new(std::sync::Mutex::new(None));
    let delivered = fifo.clone();
    let peers = scripted(move |output| {
        *delivered.lock().unwrap() = Some(output.to_path_buf());
        let mode = rustix::fs::Mode::from_raw_mode(0o600);
        Ok(rustix::fs::mkfifoat(rustix::fs::CWD, output, mode)?)
    });
    let sealed = [("fifo.bin", &data)];
    let run = fixture.sync_sealed(&sealed, peers);
    let Ok((outcome, stats)) = tokio::time::timeout(Duration::from_secs(60), run).await else {
        // A reader blocked in open() is let go by a writer, so that the test can end.
        if let Some(fifo) = fifo.lock().unwrap().as_ref() {
            let _ = std::fs::OpenOptions::new().write(true).open(fifo);
        }
        panic!("the run hung on the FIFO the peers delivered");
    };
    assert_eq!(Stats::get(&stats.peer_fallbacks), 1);
    assert_eq!(Stats::get(&stats.bytes_from_peers), 0);
    assert!(!fixture.gets("fifo.bin").is_empty());
    fixture.assert_mirrored(&outcome, "fifo.bin", &data).await;
    assert_eq!(
        std::fs::read_dir(fixture.path(".hydrator/peers"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_from_the_peers_is_refused_even_to_the_right_bytes() {
    let fixture = Fixture::new(false);
    let data = content(MIB + 3, 15);
    fixture.source.put("link.bin", data.clone());
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("right-bytes");
    std::fs::write(&target, &data).unwrap();
    let peers = scripted(move |output| std::os::unix::fs::symlink(&target, output));
    let (outcome, stats) = fixture.sync_sealed(&[("link.bin", &data)], peers).await;
    assert_eq!(Stats::get(&stats.peer_fallbacks), 1);
    assert!(!fixture.gets("link.bin").is_empty());
    fixture.assert_mirrored(&outcome, "link.bin", &data).await;
    let published = std::fs::symlink_metadata(fixture.path("link.bin")).unwrap();
    assert!(published.file_type().is_file());
}
