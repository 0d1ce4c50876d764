//! [`ObjectSource`] over the AWS SDK's S3 client.

use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use aws_sdk_s3::types::ChecksumMode;
use futures::future::BoxFuture;
use futures::FutureExt;

use super::checksum::full_object;
use super::client::{build_with_credentials, ClientSettings, Responses};
use super::errors::classify;
use super::lean::LeanGets;
use super::list::ObjectEntry;
use super::object_source::{GetResponse, ListPage, ObjectHead, ObjectRef, ObjectSource};
use crate::error::SourceError;
use crate::error::SourceErrorKind;

pub(crate) struct S3Source {
    client: aws_sdk_s3::Client,
    /// Requests go unsigned (`--no-sign-request`): a refusal means the bucket is not public.
    anonymous: bool,
    /// The fast path for GETs, where the settings allow one.
    pub(super) lean: Option<LeanGets>,
}

impl S3Source {
    /// A source over `client`; `anonymous` when it sends unsigned requests.
    pub(crate) fn new(client: aws_sdk_s3::Client, anonymous: bool) -> Self {
        Self {
            client,
            anonymous,
            lean: None,
        }
    }

    /// The source `settings` describe, with the lean path for GETs where they
    /// allow one; its answers are counted into `responses`.
    pub(crate) async fn for_settings(settings: &ClientSettings, responses: Arc<Responses>) -> Self {
        let (client, credentials) = build_with_credentials(settings, responses.clone()).await;
        let lean = LeanGets::for_settings(settings, &client, credentials, responses);
        Self {
            lean,
            ..Self::new(client, settings.anonymous)
        }
    }

    fn classify<E, R>(
        &self,
        err: aws_sdk_s3::error::SdkError<E, R>,
        request: String,
    ) -> crate::error::SourceError
    where
        E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + super::errors::HasStatus + Send + Sync + 'static,
    {
        let mut error = classify(err, request);
        if let (true, SourceErrorKind::AccessDenied(answer)) = (self.anonymous, &error.kind) {
            error.kind = SourceErrorKind::NotPublic(answer.clone());
        }
        error
    }
}

fn timestamp(t: Option<&aws_sdk_s3::primitives::DateTime>) -> Option<SystemTime> {
    t.and_then(|t| SystemTime::try_from(*t).ok())
}

impl ObjectSource for S3Source {
    fn list_page<'a>(
        &'a self,
        bucket: &'a str,
        prefix: &'a str,
        continuation: Option<String>,
    ) -> BoxFuture<'a, Result<ListPage, SourceError>> {
        async move {
            let page = self
                .client
                .list_objects_v2()
                .bucket(bucket)
                .prefix(prefix)
                .set_continuation_token(continuation)
                .send()
                .await
                .map_err(|err| self.classify(err, format!("listing s3://{bucket}/{prefix}")))?;
            let entries = page
                .contents()
                .iter()
                .map(|object| ObjectEntry {
                    key: object.key().unwrap_or_default().to_string(),
                    size: object.size().unwrap_or(0).max(0) as u64,
                    etag: object.e_tag().unwrap_or_default().to_string(),
                    last_modified: timestamp(object.last_modified()),
                    version_id: None,
                    sealed: None,
                })
                .collect();
            Ok(ListPage {
                entries,
                truncated: page.is_truncated() == Some(true),
                continuation: page.next_continuation_token().map(str::to_string),
            })
        }
        .boxed()
    }

    fn list_directories<'a>(
        &'a self,
        bucket: &'a str,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, SourceError>> {
        async move {
            let page = self
                .client
                .list_objects_v2()
                .bucket(bucket)
                .prefix(prefix)
                .delimiter("/")
                .send()
                .await
                .map_err(|err| self.classify(err, format!("listing s3://{bucket}/{prefix}")))?;
            let directories = page.common_prefixes().iter().filter_map(|p| p.prefix());
            Ok(directories.map(str::to_string).collect())
        }
        .boxed()
    }

    fn head<'a>(
        &'a self,
        object: ObjectRef<'a>,
        checksum: bool,
    ) -> BoxFuture<'a, Result<ObjectHead, SourceError>> {
        async move {
            let mut request = self
                .client
                .head_object()
                .bucket(object.bucket)
                .key(object.key)
                .set_version_id(object.version_id.map(str::to_string));
            if checksum {
                request = request.checksum_mode(ChecksumMode::Enabled);
            }
            if !object.etag.is_empty() {
                request = request.if_match(object.etag);
            }
            let head = request
                .send()
                .await
                .map_err(|err| self.classify(err, format!("HEAD {object}")))?;
            let etag = head.e_tag().unwrap_or_default();
            Ok(ObjectHead {
                etag: etag.to_string(),
                size: head.content_length().unwrap_or(0).max(0) as u64,
                last_modified: timestamp(head.last_modified()),
                checksum: full_object(
                    head.checksum_type(),
                    etag,
                    head.checksum_crc64_nvme(),
                    head.checksum_crc32_c(),
                    head.checksum_crc32(),
                ),
            })
        }
        .boxed()
    }

    fn get<'a>(
        &'a self,
        object: ObjectRef<'a>,
        range: Range<u64>,
        whole: bool,
    ) -> BoxFuture<'a, Result<GetResponse, SourceError>> {
        async move {
            if let Some(lean) = &self.lean {
                let ranged = (!whole).then(|| range.clone());
                if let Some(response) = lean.get(&object, ranged).await {
                    return Ok(response);
                }
            }
            let mut request = self
                .client
                .get_object()
                .bucket(object.bucket)
                .key(object.key)
                .set_version_id(object.version_id.map(str::to_string));
            request = if whole {
                // A plain GET, for which servers send the full-object checksum, and the SDK
                // checks the body against it.
                request.checksum_mode(ChecksumMode::Enabled)
            } else {
                request.range(format!("bytes={}-{}", range.start, range.end - 1))
            };
            if !object.etag.is_empty() {
                request = request.if_match(object.etag);
            }
            let response = request
                .send()
                .await
                .map_err(|err| self.classify(err, format!("GET {object} {range:?}")))?;
            Ok(GetResponse {
                etag: response.e_tag().map(str::to_string),
                content_range: response.content_range().map(str::to_string),
                content_length: response.content_length(),
                body: Box::pin(response.body.into_async_read()),
            })
        }
        .boxed()
    }
}
