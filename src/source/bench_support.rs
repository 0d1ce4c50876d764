//! hydrator's two request paths for whole-object GETs, open to `benches/requests.rs` so that it
//! measures the code a sync runs rather than a copy of it.

use std::sync::Arc;

use tokio::io::AsyncReadExt;

use super::client::ClientSettings;
use super::lean::LeanGets;
use super::object_source::{ObjectRef, ObjectSource};
use super::s3::S3Source;
use crate::error::BoxError;

/// Which way a GET goes.
#[derive(Clone, Copy, Debug)]
pub enum Path {
    /// `GetObject` through the SDK client a sync builds.
    Sdk,
    /// The lean path (`source/lean.rs`), with no fallback to the SDK.
    Lean,
}

pub struct WholeGets {
    sdk: S3Source,
    lean: LeanGets,
}

impl WholeGets {
    /// Both paths for `settings`; `None` when the settings allow no lean path.
    pub async fn new(settings: &ClientSettings) -> Option<Self> {
        let mut sdk = S3Source::for_settings(settings, Arc::default()).await;
        let lean = sdk.lean.take()?;
        Some(Self { sdk, lean })
    }

    /// GETs all `size` bytes of `key` as a sync GETs a single-part object (pinned to `etag`,
    /// checked against the full-object checksum), by `path`; the bytes received.
    pub async fn get(
        &self,
        path: Path,
        bucket: &str,
        key: &str,
        etag: &str,
        size: u64,
    ) -> Result<u64, BoxError> {
        let object = ObjectRef {
            bucket,
            key,
            version_id: None,
            etag,
        };
        let response = match path {
            Path::Sdk => self.sdk.get(object, 0..size, true).await?,
            Path::Lean => {
                (self.lean.get(&object, None).await).ok_or("the lean path handed the GET on")?
            }
        };
        let mut body = response.body;
        let mut received = Vec::with_capacity(size as usize);
        body.read_to_end(&mut received).await?;
        Ok(received.len() as u64)
    }
}
