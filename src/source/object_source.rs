//! The object store as the engine sees it: a page of the listing, a HEAD and a ranged GET.
//!
//! The engine holds an `Arc<dyn ObjectSource>`: the S3 client in production, an in-memory store
//! with scripted faults in the engine's unit tests. Implementations report what the server said;
//! whether it is the object and range that were asked for is checked once, above them
//! (`source::fetch`, `source::list`), so every implementation gets the same scrutiny.

use std::ops::Range;
use std::pin::Pin;
use std::time::SystemTime;

use futures::future::BoxFuture;
use tokio::io::AsyncRead;

use super::checksum::FullObjectChecksum;
use crate::error::SourceError;

/// A response body, read into the reader's buffer (straight from the socket on the lean path).
pub(crate) type Body = Pin<Box<dyn AsyncRead + Send>>;

/// One object of the listing.
#[derive(Clone, Debug)]
pub(crate) struct ObjectEntry {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified: Option<SystemTime>,
    /// The version, where the object comes from a snapshot of a versioned bucket.
    pub version_id: Option<String>,
    /// The BLAKE3 of this version's bytes, where a sealed snapshot recorded it: bytes that do
    /// not match are never published.
    pub sealed: Option<[u8; 32]>,
}

/// One page of a listing.
pub(crate) struct ListPage {
    pub entries: Vec<ObjectEntry>,
    /// The server says the listing continues.
    pub truncated: bool,
    pub continuation: Option<String>,
}

/// One version of one object, as a HEAD or GET names it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ObjectRef<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub version_id: Option<&'a str>,
    /// Sent as `If-Match` when not empty.
    pub etag: &'a str,
}

/// The key, and the version when one is pinned: what an error about the request names.
impl std::fmt::Display for ObjectRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.version_id {
            Some(version) => write!(f, "{} (version {version})", self.key),
            None => f.write_str(self.key),
        }
    }
}

/// What a HEAD tells.
#[derive(Clone, Debug)]
pub(crate) struct ObjectHead {
    pub etag: String,
    pub size: u64,
    pub last_modified: Option<SystemTime>,
    /// The server's full-object checksum, when it keeps one.
    pub checksum: Option<FullObjectChecksum>,
}

/// The headers of a GET that matter, and its body.
pub(crate) struct GetResponse {
    pub etag: Option<String>,
    pub content_range: Option<String>,
    pub content_length: Option<i64>,
    pub body: Body,
}

pub(crate) trait ObjectSource: Send + Sync + 'static {
    /// The page of `prefix`'s listing that starts at `continuation`.
    fn list_page<'a>(
        &'a self,
        bucket: &'a str,
        prefix: &'a str,
        continuation: Option<String>,
    ) -> BoxFuture<'a, Result<ListPage, SourceError>>;

    /// The "directories" right under `prefix` (`prefix` + `NAME/`), from the first page of a
    /// listing with delimiter `/`: one request, for a "did you mean" when `prefix` holds nothing.
    fn list_directories<'a>(
        &'a self,
        bucket: &'a str,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, SourceError>>;

    /// HEAD of `object`, with its full-object checksum when `checksum` is asked for.
    fn head<'a>(
        &'a self,
        object: ObjectRef<'a>,
        checksum: bool,
    ) -> BoxFuture<'a, Result<ObjectHead, SourceError>>;

    /// GET of `range` of `object`; the whole object (with the server's checksum checked by the
    /// client where it can) when `range` covers it all.
    fn get<'a>(
        &'a self,
        object: ObjectRef<'a>,
        range: Range<u64>,
        whole: bool,
    ) -> BoxFuture<'a, Result<GetResponse, SourceError>>;
}
