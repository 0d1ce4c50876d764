//! Ranged GETs pinned to one object version.
//!
//! Every GET carries `If-Match: <listing ETag>` and the response's ETag and `Content-Range` are
//! checked too, because some servers ignore `If-Match`: a file is never stitched together from
//! two versions of an object.

use std::ops::Range;

use aws_sdk_s3::primitives::ByteStream;

use aws_sdk_s3::types::ChecksumMode;

use super::checksum::{full_object, FullObjectChecksum};
use super::errors::{classify, Classified};
use crate::error::PartError;

/// The object a part belongs to, as the listing (or a restart's HEAD) saw it.
#[derive(Clone, Debug)]
pub struct PinnedObject {
    pub bucket: String,
    pub key: String,
    pub etag: String,
    pub size: u64,
    /// Pins GETs to this version too (snapshots of versioned buckets).
    pub version_id: Option<String>,
}

/// Sends a ranged GET for `range` of `object` and returns the body once the response headers
/// prove it is exactly that range of that version.
pub async fn get_range(
    client: &aws_sdk_s3::Client,
    object: &PinnedObject,
    range: Range<u64>,
) -> Result<ByteStream, PartError> {
    let mut request = client
        .get_object()
        .bucket(&object.bucket)
        .key(&object.key)
        .set_version_id(object.version_id.clone());
    request = if range.start == 0 && range.end == object.size {
        // The whole object: a plain GET, for which servers send the full-object checksum, and
        // the SDK checks the body against it.
        request.checksum_mode(ChecksumMode::Enabled)
    } else {
        request.range(format!("bytes={}-{}", range.start, range.end - 1))
    };
    if !object.etag.is_empty() {
        request = request.if_match(&object.etag);
    }
    let response = request.send().await.map_err(|err| {
        match classify(&err, &format!("GET {} {:?}", object.key, range)) {
            Classified::Changed => PartError::Changed,
            Classified::Retryable(msg) => PartError::Retryable(msg),
            Classified::Usage(msg) | Classified::Fatal(msg) => PartError::Fatal(msg),
        }
    })?;
    if !object.etag.is_empty() && response.e_tag().is_some_and(|e| e != object.etag) {
        return Err(PartError::Changed);
    }
    check_range(
        response.content_range(),
        response.content_length(),
        &range,
        object.size,
    )?;
    Ok(response.body)
}

/// The server's full-object checksum of `object` at its pinned version, if it keeps one.
pub async fn full_object_checksum(
    client: &aws_sdk_s3::Client,
    object: &PinnedObject,
) -> Result<Option<FullObjectChecksum>, PartError> {
    let mut request = client
        .head_object()
        .bucket(&object.bucket)
        .key(&object.key)
        .set_version_id(object.version_id.clone())
        .checksum_mode(ChecksumMode::Enabled);
    if !object.etag.is_empty() {
        request = request.if_match(&object.etag);
    }
    match request.send().await {
        Ok(head) => Ok(full_object(
            head.checksum_type(),
            head.checksum_crc64_nvme(),
            head.checksum_crc32_c(),
            head.checksum_crc32(),
        )),
        Err(err) => match classify(&err, &format!("HEAD {}", object.key)) {
            Classified::Changed => Err(PartError::Changed),
            other => {
                tracing::debug!(key = %object.key, "no end-to-end checksum: {other:?}");
                Ok(None)
            }
        },
    }
}

/// Looks the object up again after it changed, to pin the new version.
pub async fn head(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
) -> Result<(PinnedObject, Option<std::time::SystemTime>), PartError> {
    let response = client
        .head_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|err| match classify(&err, &format!("HEAD {key}")) {
            Classified::Retryable(msg) => PartError::Retryable(msg),
            Classified::Changed => PartError::Changed,
            Classified::Usage(msg) | Classified::Fatal(msg) => PartError::Fatal(msg),
        })?;
    let object = PinnedObject {
        bucket: bucket.to_string(),
        key: key.to_string(),
        etag: response.e_tag().unwrap_or_default().to_string(),
        size: response.content_length().unwrap_or(0).max(0) as u64,
        version_id: None,
    };
    let modified = response
        .last_modified()
        .and_then(|t| std::time::SystemTime::try_from(*t).ok());
    Ok((object, modified))
}

fn check_range(
    content_range: Option<&str>,
    content_length: Option<i64>,
    range: &Range<u64>,
    object_size: u64,
) -> Result<(), PartError> {
    let expected_len = range.end - range.start;
    if let Some(content_range) = content_range {
        let (start, end, total) = parse_content_range(content_range).ok_or_else(|| {
            PartError::Fatal(format!("malformed Content-Range {content_range:?}"))
        })?;
        if total != object_size {
            return Err(PartError::Changed); // another version, whatever the ETag says
        }
        if start != range.start || end + 1 != range.end {
            return Err(PartError::Fatal(format!(
                "asked for bytes {}-{}, server sent {content_range:?}",
                range.start,
                range.end - 1
            )));
        }
    } else if range.start != 0 || range.end != object_size {
        // A 200 with the whole object is a valid answer only to a range covering all of it.
        return Err(PartError::Fatal(
            "the server ignored the Range header (no Content-Range in the response)".into(),
        ));
    } else if content_length.is_some_and(|len| len as u64 != object_size) {
        return Err(PartError::Changed); // the whole object, but not of the listed size
    }
    match content_length {
        Some(len) if len as u64 != expected_len => Err(PartError::Retryable(format!(
            "asked for {expected_len} bytes, server announced {len}"
        ))),
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
