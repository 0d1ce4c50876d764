//! `hydrator demo`: the main job with nothing installed. An S3 server starts in-process on
//! loopback, is seeded with a generated dataset, and the ordinary `sync` path mirrors it; the
//! mirror is then re-read and compared with what was uploaded.
//!
//! Nothing in it is silent for long: the seeding (seconds of uploads) prints its progress, and
//! the run's summary comes before the temporary directory is removed (which takes as long as
//! the disk takes to delete twice the dataset), with a line saying so.

pub mod dataset;
#[cfg(test)]
mod lean_gets_tests;
pub mod server;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::cli::DemoArgs;
use crate::config::{SyncConfig, SyncConfigBuilder};
use crate::console::Level;
use crate::engine;
use crate::error::{Exit, IoContext, SyncError};
use crate::source::url::S3Url;
use crate::units::human_bytes;

const BUCKET: &str = "demo-datasets";
const PREFIX: &str = "imagenet-mini/";
/// How often the seeding says how far it is.
const SEED_PROGRESS: Duration = Duration::from_secs(2);

/// Runs the demo to its exit code; the run's summary is printed before the temporary
/// directory is removed.
pub(crate) async fn run(args: DemoArgs) -> Result<Exit, SyncError> {
    let (base, temp) = match args.dir {
        Some(dir) => (dir, None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("hydrator-demo-")
                .tempdir()
                .local(
                    "demo: creating a temporary directory in",
                    std::env::temp_dir(),
                )?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let server_root = base.join("server");
    let dest = base.join("mirror");
    std::fs::create_dir_all(&server_root).local("demo: creating", &server_root)?;
    let server = server::EmbeddedS3::start(&server_root)
        .await
        .local("demo: starting the S3 server in", &server_root)?;
    crate::out!("demo: S3 server listening on {}", server.endpoint);
    let files = dataset::layout(args.size);
    let (objects, bytes) = (files.len(), files.iter().map(|(_, size)| size).sum::<u64>());
    crate::out!(
        "demo: seeding s3://{BUCKET}/{PREFIX} with {objects} generated objects ({}) through the server's S3 API",
        human_bytes(bytes)
    );
    let seeded = dataset::Seeded::default();
    let expected = {
        let seeding = dataset::seed(&server, BUCKET, PREFIX, files, &seeded);
        tokio::pin!(seeding);
        let start = tokio::time::Instant::now() + SEED_PROGRESS;
        let mut progress = tokio::time::interval_at(start, SEED_PROGRESS);
        loop {
            tokio::select! {
                done = &mut seeding => break done.map_err(SyncError::Source)?,
                _ = progress.tick() => crate::out!(
                    "demo: seeding: {} of {objects} objects ({} of {})",
                    seeded.objects.load(Relaxed),
                    human_bytes(seeded.bytes.load(Relaxed)),
                    human_bytes(bytes)
                ),
            }
        }
    };
    crate::out!(
        "demo: seeded s3://{BUCKET}/{PREFIX} with {objects} objects ({}); mirroring into {}",
        human_bytes(bytes),
        dest.display()
    );
    let cfg = SyncConfigBuilder {
        endpoint: Some(server.endpoint.clone()),
        credentials: Some(server.credentials.clone()),
        io_backend: args.io_backend,
        progress: args.progress,
        ..SyncConfig::builder(
            S3Url {
                bucket: BUCKET.into(),
                prefix: PREFIX.into(),
            },
            dest.clone(),
        )
    }
    .build()?;
    let mut outcome = engine::run(cfg).await?;
    drop(server);
    if outcome.exit == Exit::Success {
        match dataset::verify(&dest, &expected) {
            Ok(None) => crate::out!(
                "demo: re-read all {} files from {}: every byte matches the source",
                expected.len(),
                dest.display()
            ),
            Ok(Some(path)) => {
                crate::note!(
                    Level::Error,
                    "demo: verification failed: {} differs from the source",
                    path.display()
                );
                outcome.exit = Exit::Failed;
            }
            Err(err) => {
                crate::note!(Level::Error, "demo: verification failed: {err}");
                outcome.exit = Exit::Failed;
            }
        }
    }
    let exit = outcome.print();
    if let Some(temp) = temp {
        crate::out!(
            "demo: removing {} (the server's copy and the mirror; --dir DIR keeps them)",
            temp.path().display()
        );
        let started = Instant::now();
        let path = temp.path().to_path_buf();
        temp.close().local("demo: removing", &path)?;
        crate::out!("demo: removed in {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok(exit)
}
