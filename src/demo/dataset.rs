//! The demo's generated dataset: a mix of shard-sized, medium and small files (what training
//! sets look like), edge cases included (an empty file, a 1-byte file, names with spaces and
//! unicode), with pseudo-random content from a fixed seed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use aws_sdk_s3::primitives::ByteStream;
use futures::{StreamExt, TryStreamExt};

use super::server::EmbeddedS3;
use crate::config::DEFAULT_PART_SIZE;
use crate::error::{IoContext, LocalError, SourceError};
use crate::source::client::{self, ClientSettings};
use crate::source::errors::classify;

/// Uploads in flight while seeding.
const UPLOADS: usize = 4;

/// A generated file and the hash of what was uploaded.
pub(crate) struct ExpectedFile {
    pub path: String,
    pub blake3: blake3::Hash,
}

/// The dataset's layout for roughly `total` bytes: a quarter in two large shards, a quarter in
/// medium files, a quarter in small files, a quarter in one file that is not a multiple of the
/// part size.
pub(crate) fn layout(total: u64) -> Vec<(String, u64)> {
    let quarter = (total / 4).max(1);
    let mut files = vec![
        ("README.txt".to_string(), 1u64),
        ("empty.flag".to_string(), 0),
        ("labels/classes with spaces é.txt".to_string(), 4093),
    ];
    for i in 0..2 {
        files.push((format!("shards/train-{i:05}.tar"), quarter / 2));
    }
    let medium = 3 << 20;
    for i in 0..(quarter / medium).max(1) {
        files.push((format!("val/part-{i:04}.parquet"), medium));
    }
    let small = 48 << 10;
    for i in 0..(quarter / small).max(1) {
        files.push((
            format!("images/{:02}/img-{i:06}.jpg", i % 16),
            small + (i * 7919) % 4096,
        ));
    }
    files.push((
        "shards/tail.bin".to_string(),
        quarter + DEFAULT_PART_SIZE / 3,
    ));
    files
}

/// What the seeding has uploaded so far, for the demo's progress lines.
#[derive(Default)]
pub(crate) struct Seeded {
    pub objects: AtomicU64,
    pub bytes: AtomicU64,
}

/// Creates the bucket and uploads `files` (from [`layout`]) under `prefix`, counting them into
/// `seeded`.
pub(crate) async fn seed(
    server: &EmbeddedS3,
    bucket: &str,
    prefix: &str,
    files: Vec<(String, u64)>,
    seeded: &Seeded,
) -> Result<Vec<ExpectedFile>, SourceError> {
    let settings = ClientSettings {
        endpoint: Some(server.endpoint.clone()),
        region: None,
        path_style: true,
        credentials: Some(server.credentials.clone()),
        profile: None,
        anonymous: false,
        ca_bundle: None,
        no_verify_ssl: false,
        max_requests: UPLOADS,
    };
    let client = client::build(&settings, Default::default()).await;
    client
        .create_bucket()
        .bucket(bucket)
        .send()
        .await
        .map_err(|e| classify(e, format!("creating bucket {bucket}")))?;
    futures::stream::iter(files.into_iter().enumerate())
        .map(|(seed, (path, size))| {
            let client = client.clone();
            async move {
                let data = content(seed as u64, size);
                let hash = blake3::hash(&data);
                client
                    .put_object()
                    .bucket(bucket)
                    .key(format!("{prefix}{path}"))
                    .body(ByteStream::from(data))
                    .send()
                    .await
                    .map_err(|e| classify(e, format!("uploading {path}")))?;
                seeded.objects.fetch_add(1, Relaxed);
                seeded.bytes.fetch_add(size, Relaxed);
                Ok(ExpectedFile { path, blake3: hash })
            }
        })
        .buffer_unordered(UPLOADS)
        .try_collect()
        .await
}

/// Deterministic pseudo-random bytes.
pub fn content(seed: u64, size: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut data = vec![0u8; size as usize];
    rng.fill(&mut data);
    data
}

/// Re-reads every file under `dest` and compares it with what was uploaded: the first file
/// that differs, if any.
pub(crate) fn verify(
    dest: &Path,
    expected: &[ExpectedFile],
) -> Result<Option<PathBuf>, LocalError> {
    for file in expected {
        let path = dest.join(&file.path);
        let mut hasher = blake3::Hasher::new();
        std::fs::File::open(&path)
            .and_then(|f| hasher.update_reader(f).map(drop))
            .local("reading", &path)?;
        if hasher.finalize() != file.blake3 {
            return Ok(Some(path));
        }
    }
    Ok(None)
}
