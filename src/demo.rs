//! `hydrator demo`: the main job with nothing installed. An S3 server starts in-process on
//! loopback, is seeded with a generated dataset, and the ordinary `sync` path mirrors it; the
//! mirror is then re-read and compared with what was uploaded.

pub mod dataset;
#[cfg(test)]
mod lean_gets_tests;
pub mod server;

use std::path::PathBuf;

use crate::cli::DemoArgs;
use crate::config::{SyncConfig, SyncConfigBuilder};
use crate::console::Level;
use crate::engine::{self, Outcome};
use crate::error::{Exit, IoContext, SyncError};
use crate::source::url::S3Url;

const BUCKET: &str = "demo-datasets";
const PREFIX: &str = "imagenet-mini/";

pub(crate) async fn run(args: DemoArgs) -> Result<Outcome, SyncError> {
    let temp;
    let base: PathBuf = match args.dir {
        Some(dir) => dir,
        None => {
            temp = tempfile::Builder::new()
                .prefix("hydrator-demo-")
                .tempdir()
                .local(
                    "demo: creating a temporary directory in",
                    std::env::temp_dir(),
                )?;
            temp.path().to_path_buf()
        }
    };
    let server_root = base.join("server");
    let dest = base.join("mirror");
    std::fs::create_dir_all(&server_root).local("demo: creating", &server_root)?;
    let server = server::EmbeddedS3::start(&server_root)
        .await
        .local("demo: starting the S3 server in", &server_root)?;
    crate::out!("demo: S3 server listening on {}", server.endpoint);
    let expected = dataset::seed(&server, BUCKET, PREFIX, args.size)
        .await
        .map_err(SyncError::Source)?;
    crate::out!(
        "demo: seeded s3://{BUCKET}/{PREFIX} with {} objects ({}); mirroring into {}",
        expected.len(),
        crate::units::human_bytes(expected.iter().map(|f| f.size).sum()),
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
    Ok(outcome)
}
