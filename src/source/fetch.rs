//! Ranged GETs pinned to one object version.
//!
//! Every GET carries `If-Match: <listing ETag>` and the response's ETag and `Content-Range` are
//! checked too, because some servers ignore `If-Match`: a file is never stitched together from
//! two versions of an object. An answer without an ETag is not taken either: it cannot be shown
//! to answer this GET (a broken proxy's late bytes on a reused connection read as the next
//! answer, and carry none).

use std::ops::Range;

use super::checksum::FullObjectChecksum;
use super::object_source::{Body, ObjectRef, ObjectSource};
use crate::error::{BodyError, PartError, ProtocolError};

/// The object a part belongs to, as the listing (or a restart's HEAD) saw it.
#[derive(Clone, Debug)]
pub(crate) struct PinnedObject {
    pub bucket: String,
    pub key: String,
    pub etag: String,
    pub size: u64,
    /// Pins GETs to this version too (snapshots of versioned buckets).
    pub version_id: Option<String>,
}

impl PinnedObject {
    fn as_ref(&self) -> ObjectRef<'_> {
        ObjectRef {
            bucket: &self.bucket,
            key: &self.key,
            version_id: self.version_id.as_deref(),
            etag: &self.etag,
        }
    }
}

/// Sends a ranged GET for `range` of `object` and returns the body once the response headers
/// prove it is exactly that range of that version.
pub(crate) async fn get_range(
    source: &dyn ObjectSource,
    object: &PinnedObject,
    range: Range<u64>,
) -> Result<Body, PartError> {
    let whole = range.start == 0 && range.end == object.size;
    let response = source.get(object.as_ref(), range.clone(), whole).await?;
    if !object.etag.is_empty() {
        match &response.etag {
            // Not an answer to this GET (every S3 server sends the ETag): bytes a broken proxy
            // left on a reused connection, say. Another attempt, on another connection, can help.
            None => return Err(ProtocolError::NoEtag.into()),
            Some(etag) if *etag != object.etag => return Err(PartError::Changed),
            Some(_) => {}
        }
    }
    check_range(
        response.content_range.as_deref(),
        response.content_length,
        &range,
        object.size,
    )?;
    Ok(response.body)
}

/// The server's full-object checksum of `object` at its pinned version, if it keeps one.
pub(crate) async fn full_object_checksum(
    source: &dyn ObjectSource,
    object: &PinnedObject,
) -> Result<Option<FullObjectChecksum>, PartError> {
    match source.head(object.as_ref(), true).await {
        Ok(head) => Ok(head.checksum),
        Err(err) => match PartError::from(err) {
            PartError::Changed => Err(PartError::Changed),
            other => {
                tracing::debug!(key = %object.key, "no end-to-end checksum: {other}");
                Ok(None)
            }
        },
    }
}

/// Looks the object up again after it changed, to pin the new version.
pub(crate) async fn head(
    source: &dyn ObjectSource,
    bucket: &str,
    key: &str,
) -> Result<(PinnedObject, Option<std::time::SystemTime>), PartError> {
    let latest = ObjectRef {
        bucket,
        key,
        version_id: None,
        etag: "",
    };
    let head = source.head(latest, false).await?;
    let object = PinnedObject {
        bucket: bucket.to_string(),
        key: key.to_string(),
        etag: head.etag,
        size: head.size,
        version_id: None,
    };
    Ok((object, head.last_modified))
}

fn check_range(
    content_range: Option<&str>,
    content_length: Option<i64>,
    range: &Range<u64>,
    object_size: u64,
) -> Result<(), PartError> {
    let expected_len = range.end - range.start;
    if let Some(content_range) = content_range {
        let (start, end, total) = parse_content_range(content_range)
            .ok_or_else(|| ProtocolError::MalformedContentRange(content_range.to_string()))?;
        if total != object_size {
            return Err(PartError::Changed); // another version, whatever the ETag says
        }
        if start != range.start || end + 1 != range.end {
            return Err(ProtocolError::OtherRange {
                first: range.start,
                last: range.end - 1,
                content_range: content_range.to_string(),
            }
            .into());
        }
    } else if range.start != 0 || range.end != object_size {
        // A 200 with the whole object is a valid answer only to a range covering all of it.
        return Err(ProtocolError::RangeIgnored.into());
    } else if content_length.is_some_and(|len| len as u64 != object_size) {
        return Err(PartError::Changed); // the whole object, but not of the listed size
    }
    match content_length {
        Some(len) if len as u64 != expected_len => Err(BodyError::Announced {
            expected: expected_len,
            announced: len,
        }
        .into()),
        _ => Ok(()),
    }
}

/// Parses `bytes START-END/TOTAL`.
fn parse_content_range(text: &str) -> Option<(u64, u64, u64)> {
    let rest = text.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    let (start, end, total) = (start.parse().ok()?, end.parse().ok()?, total.parse().ok()?);
    (start <= end && end < total).then_some((start, end, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_must_match_request() {
        assert!(check_range(Some("bytes 0-9/20"), Some(10), &(0..10), 20).is_ok());
        assert!(matches!(
            check_range(Some("bytes 0-9/21"), Some(10), &(0..10), 20),
            Err(PartError::Changed)
        ));
        assert!(check_range(Some("bytes 1-10/20"), Some(10), &(0..10), 20).is_err());
        assert!(check_range(Some("bytes 0-9/20"), Some(9), &(0..10), 20).is_err());
        assert!(check_range(None, Some(20), &(0..20), 20).is_ok());
        assert!(check_range(None, Some(10), &(0..10), 20).is_err());
        assert!(matches!(
            check_range(None, Some(19), &(0..20), 20),
            Err(PartError::Changed)
        ));
        assert!(check_range(Some("items 0-9/20"), None, &(0..10), 20).is_err());
    }
}
