//! The listing, streamed page by page into a bounded queue, so the first GET starts with the
//! first page and memory does not grow with the number of objects.

use std::panic::AssertUnwindSafe;
use std::time::SystemTime;

use futures::FutureExt;

use tokio::sync::mpsc;

use std::sync::Arc;

use super::errors::classify;
pub(crate) use super::object_source::ObjectEntry;
use super::object_source::ObjectSource;
use super::url::S3Url;
use crate::error::{HttpAnswer, ListingError, Remedy, SourceError, SourceErrorKind, SyncError};

/// Listed objects as they stream in, ending with an error if the listing broke.
pub(crate) type Listing = mpsc::Receiver<Result<ObjectEntry, SyncError>>;

/// Objects buffered between the listing and the planner (a few pages).
pub(crate) const LISTING_QUEUE: usize = 4096;

fn listing_error(err: SourceError, first_page: bool) -> SyncError {
    match err.remedy() {
        Remedy::Usage => SyncError::Source(err),
        Remedy::Retry if first_page => ListingError::Unreachable(err).into(),
        _ => ListingError::Source(err).into(),
    }
}

/// Starts listing `url` and returns the queue it fills. The queue ends with either the last
/// object or one error; a queue that ends with an error means the listing is incomplete.
pub(crate) fn spawn(source: Arc<dyn ObjectSource>, url: S3Url) -> Listing {
    let (tx, rx) = mpsc::channel(LISTING_QUEUE);
    tokio::spawn(async move {
        // A panic must end the queue with an error too: a queue that just closes is complete.
        let listed = AssertUnwindSafe(list_into(&*source, &url, &tx))
            .catch_unwind()
            .await;
        let failure = match listed {
            Ok(Ok(())) => return,
            Ok(Err(err)) => err,
            Err(_) => ListingError::TaskFailed {
                url: url.to_string(),
            }
            .into(),
        };
        let _ = tx.send(Err(failure)).await;
    });
    rx
}

async fn list_into(
    source: &dyn ObjectSource,
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
        let page = source
            .list_page(&url.bucket, &url.prefix, token.take())
            .await
            .map_err(|err| listing_error(err, first_page))?;
        first_page = false;
        for entry in page.entries {
            let key = entry.key.as_str();
            if let Some(last) = last_key.as_deref().filter(|last| key <= *last) {
                return Err(ListingError::Reordered {
                    url: url.to_string(),
                    key: key.to_string(),
                    last: last.to_string(),
                }
                .into());
            }
            last_key = Some(key.to_string());
            if tx.send(Ok(entry)).await.is_err() {
                return Ok(()); // the run stopped listening
            }
        }
        if !page.truncated {
            return Ok(());
        }
        // A listing that says it continues but cannot be continued is incomplete, never done.
        match page.continuation.filter(|next| !next.is_empty()) {
            Some(next) if tokens_seen.contains(&next) => {
                return Err(ListingError::TokenLoop {
                    url: url.to_string(),
                    token: next,
                }
                .into())
            }
            Some(next) => {
                tokens_seen.insert(next.clone());
                token = Some(next);
            }
            None => {
                return Err(ListingError::NoContinuation {
                    url: url.to_string(),
                }
                .into())
            }
        }
    }
}

/// What ListObjectVersions gave for a prefix.
pub(crate) enum Versions {
    /// The latest version of every object (a delete marker hides its object); the version id
    /// is `None` where the server keeps none ("null").
    Listed(Vec<ObjectEntry>),
    /// The server does not list versions here: why.
    NotListed(SourceError),
}

/// Lists the latest version of every object under `url` with its version id (for
/// snapshots). Whether a bucket keeps versions is judged by this answer, not by
/// GetBucketVersioning, which some servers answer in a form the SDK cannot read.
pub(crate) async fn list_latest_versions(
    client: &aws_sdk_s3::Client,
    url: &S3Url,
) -> Result<Versions, SyncError> {
    let mut entries: Vec<ObjectEntry> = Vec::new();
    let (mut key_marker, mut version_marker) = (None, None);
    let mut markers_seen = std::collections::HashSet::new();
    // A key whose latest version is a delete marker is hidden; a listing of versions none of
    // which is latest, and no such marker, is a server that does not say which is latest.
    let (mut versions, mut latest_markers) = (0, 0);
    loop {
        let answer = client
            .list_object_versions()
            .bucket(&url.bucket)
            .prefix(&url.prefix)
            .set_key_marker(key_marker.take())
            .set_version_id_marker(version_marker.take())
            .send()
            .await;
        let page = match answer {
            Ok(page) => page,
            Err(err) => {
                let err = classify(err, format!("listing the versions of {url}"));
                let first_page = entries.is_empty();
                if first_page && versions_not_offered(&err.kind) {
                    return Ok(Versions::NotListed(err));
                }
                return Err(listing_error(err, first_page));
            }
        };
        versions += page.versions().len();
        latest_markers += page
            .delete_markers()
            .iter()
            .filter(|m| m.is_latest() == Some(true))
            .count();
        for version in page
            .versions()
            .iter()
            .filter(|v| v.is_latest() == Some(true))
        {
            let key = version.key().unwrap_or_default();
            if let Some(last) = entries.last().filter(|last| last.key.as_str() >= key) {
                return Err(ListingError::Reordered {
                    url: url.to_string(),
                    key: key.to_string(),
                    last: last.key.clone(),
                }
                .into());
            }
            entries.push(ObjectEntry {
                key: key.to_string(),
                size: version.size().unwrap_or(0).max(0) as u64,
                etag: version.e_tag().unwrap_or_default().to_string(),
                last_modified: version
                    .last_modified()
                    .and_then(|t| SystemTime::try_from(*t).ok()),
                version_id: version
                    .version_id()
                    .filter(|id| *id != "null")
                    .map(str::to_string),
                sealed: None,
            });
        }
        if page.is_truncated() != Some(true) {
            if versions > 0 && entries.is_empty() && latest_markers == 0 {
                return Ok(Versions::NotListed(SourceError {
                    request: format!("listing the versions of {url}"),
                    kind: SourceErrorKind::Refused(HttpAnswer {
                        status: 200,
                        code: String::new(),
                        message: "no version is marked as the latest".into(),
                    }),
                    cause: None,
                }));
            }
            return Ok(Versions::Listed(entries));
        }
        key_marker = page.next_key_marker().map(str::to_string);
        version_marker = page.next_version_id_marker().map(str::to_string);
        let Some(key) = &key_marker else {
            return Err(ListingError::NoContinuation {
                url: url.to_string(),
            }
            .into());
        };
        if !markers_seen.insert((key.clone(), version_marker.clone())) {
            return Err(ListingError::TokenLoop {
                url: url.to_string(),
                token: format!("{key} {}", version_marker.as_deref().unwrap_or("")),
            }
            .into());
        }
    }
}

/// Whether an error answers "no versions listed here" rather than "no listing at all": the
/// call is not implemented (Garage, s3s), or only the version listing is forbidden
/// (`s3:ListBucketVersions` is a permission of its own).
fn versions_not_offered(kind: &SourceErrorKind) -> bool {
    match kind {
        SourceErrorKind::AccessDenied(_)
        | SourceErrorKind::NotFound(_)
        | SourceErrorKind::Refused(_) => true,
        SourceErrorKind::Unavailable(answer) => answer.status == 501,
        _ => false,
    }
}
