//! The listing, streamed page by page into a bounded queue, so the first GET starts with the
//! first page and memory does not grow with the number of objects.

use std::panic::AssertUnwindSafe;
use std::time::SystemTime;

use futures::FutureExt;

use tokio::sync::mpsc;

use super::errors::{classify, Classified};
use crate::config::S3Url;
use crate::error::{SyncError, UsageError};

/// Objects buffered between the listing and the planner (a few pages).
pub const LISTING_QUEUE: usize = 4096;

/// One object of the listing.
#[derive(Clone, Debug)]
pub struct ObjectEntry {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified: Option<SystemTime>,
    /// The version, where the object comes from a snapshot of a versioned bucket.
    pub version_id: Option<String>,
}

fn listing_error<E, R>(
    err: &aws_sdk_s3::error::SdkError<E, R>,
    url: &S3Url,
    first_page: bool,
) -> SyncError
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + super::errors::HasStatus,
{
    let what = format!("listing {url}");
    match classify(err, &what) {
        Classified::Usage(msg) => SyncError::Usage(UsageError::new(msg)),
        Classified::Retryable(msg) if first_page => SyncError::Listing(format!(
            "{msg} (is --endpoint-url right and the server up?)"
        )),
        Classified::Retryable(msg) | Classified::Fatal(msg) => SyncError::Listing(msg),
        Classified::Changed => SyncError::Listing(format!("{what}: HTTP 412")),
    }
}

/// Starts listing `url` and returns the queue it fills. The queue ends with either the last
/// object or one error; a queue that ends with an error means the listing is incomplete.
pub fn spawn(
    client: aws_sdk_s3::Client,
    url: S3Url,
) -> mpsc::Receiver<Result<ObjectEntry, SyncError>> {
    let (tx, rx) = mpsc::channel(LISTING_QUEUE);
    tokio::spawn(async move {
        // A panic must end the queue with an error too: a queue that just closes is complete.
        let listed = AssertUnwindSafe(list_into(&client, &url, &tx))
            .catch_unwind()
            .await;
        let failure = match listed {
            Ok(Ok(())) => return,
            Ok(Err(err)) => err,
            Err(_) => SyncError::Listing(format!("listing {url}: the listing task failed")),
        };
        let _ = tx.send(Err(failure)).await;
    });
    rx
}

async fn list_into(
    client: &aws_sdk_s3::Client,
    url: &S3Url,
    tx: &mpsc::Sender<Result<ObjectEntry, SyncError>>,
) -> Result<(), SyncError> {
    let mut token: Option<String> = None;
    let mut first_page = true;
    // ListObjectsV2 returns keys in strictly ascending order, page after page. A server that
    // repeats a page, loops its continuation token or goes back would otherwise make the run
    // list forever or hand the same key to two downloads at once.
    let mut last_key: Option<String> = None;
    let mut tokens_seen = std::collections::HashSet::new();
    loop {
        let page = client
            .list_objects_v2()
            .bucket(&url.bucket)
            .prefix(&url.prefix)
            .set_continuation_token(token.take())
            .send()
            .await
            .map_err(|err| listing_error(&err, url, first_page))?;
        first_page = false;
        for object in page.contents() {
            let key = object.key().unwrap_or_default();
            if let Some(last) = last_key.as_deref().filter(|last| key <= *last) {
                return Err(SyncError::Listing(format!(
                    "listing {url}: the server repeated or reordered keys ({key:?} after {last:?})"
                )));
            }
            last_key = Some(key.to_string());
            let entry = ObjectEntry {
                key: key.to_string(),
                size: object.size().unwrap_or(0).max(0) as u64,
                etag: object.e_tag().unwrap_or_default().to_string(),
                last_modified: object
                    .last_modified()
                    .and_then(|t| SystemTime::try_from(*t).ok()),
                version_id: None,
            };
            if tx.send(Ok(entry)).await.is_err() {
                return Ok(()); // the run stopped listening
            }
        }
        if page.is_truncated() != Some(true) {
            return Ok(());
        }
        // A listing that says it continues but cannot be continued is incomplete, never done.
        match page.next_continuation_token().filter(|next| !next.is_empty()) {
            Some(next) if !tokens_seen.insert(next.to_string()) => {
                return Err(SyncError::Listing(format!(
                    "listing {url}: the server sent continuation token {next:?} twice (a loop)"
                )))
            }
            Some(next) => token = Some(next.to_string()),
            None => {
                return Err(SyncError::Listing(format!(
                    "listing {url}: the server said the listing continues but gave no continuation token"
                )))
            }
        }
    }
}

/// Lists the latest version of every object under `url` in a versioned bucket, with its
/// version id (for snapshots). Deleted objects (a delete marker is latest) are left out.
pub async fn list_latest_versions(
    client: &aws_sdk_s3::Client,
    url: &S3Url,
) -> Result<Vec<ObjectEntry>, SyncError> {
    let mut entries = Vec::new();
    let (mut key_marker, mut version_marker) = (None, None);
    loop {
        let page = client
            .list_object_versions()
            .bucket(&url.bucket)
            .prefix(&url.prefix)
            .set_key_marker(key_marker.take())
            .set_version_id_marker(version_marker.take())
            .send()
            .await
            .map_err(|err| listing_error(&err, url, entries.is_empty()))?;
        for version in page
            .versions()
            .iter()
            .filter(|v| v.is_latest() == Some(true))
        {
            entries.push(ObjectEntry {
                key: version.key().unwrap_or_default().to_string(),
                size: version.size().unwrap_or(0).max(0) as u64,
                etag: version.e_tag().unwrap_or_default().to_string(),
                last_modified: version
                    .last_modified()
                    .and_then(|t| SystemTime::try_from(*t).ok()),
                version_id: version.version_id().map(str::to_string),
            });
        }
        if page.is_truncated() != Some(true) {
            return Ok(entries);
        }
        key_marker = page.next_key_marker().map(str::to_string);
        version_marker = page.next_version_id_marker().map(str::to_string);
        if key_marker.is_none() {
            return Err(SyncError::Listing(format!(
                "listing versions of {url}: the server said the listing continues but gave no marker"
            )));
        }
    }
}

/// Whether the bucket keeps versions (servers without versioning say no, or nothing).
pub async fn bucket_is_versioned(client: &aws_sdk_s3::Client, bucket: &str) -> bool {
    match client.get_bucket_versioning().bucket(bucket).send().await {
        Ok(out) => out.status() == Some(&aws_sdk_s3::types::BucketVersioningStatus::Enabled),
        Err(err) => {
            tracing::debug!(
                "GetBucketVersioning: {}",
                super::errors::describe_chain(&err)
            );
            false
        }
    }
}
