//! A lean path for GETs. Through the SDK a 64 KiB GET costs about three times the CPU of the
//! request itself (`benches/requests.rs`: 219.9 against 80.0 µs), the orchestrator's
//! per-request set-up; small objects are nearly all request, so this path signs the same GET
//! with `aws-sigv4`, as the SDK signs for S3, and sends it over a pooled `hyper` client. Ranged
//! GETs (the parts of large objects) take it too: per byte the SDK's body adds its own layers.
//!
//! It is a fast path, not a second client. Only a 200 to a whole-object GET and a 206 to a
//! ranged one are taken from it; any other answer (after
//! it is recorded, so throttling still reaches the adaptive limit), a transport error or no
//! answer within the SDK's first-byte timeout hands the request to the SDK path, which retries,
//! classifies and reports as always. What the SDK does on a 200 is done here too: the body is
//! CRC'd against the full-object checksum header, and a body with no bytes for the stall grace
//! fails as a stalled one. Used with a custom endpoint (in-cluster MinIO, Garage, Ceph RGW) over
//! HTTP or HTTPS, trusting what the SDK trusts (`source::tls`), and unversioned GETs; AWS keeps
//! the SDK path. A certificate the lean path refuses, the SDK path refuses too, and reports.

use std::ops::Range;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_s3::types::ChecksumType;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use futures::stream;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::checksum::{full_object, FullObjectChecksum};
use super::client::{ClientSettings, Responses, CONNECT_TIMEOUT, FIRST_BYTE_TIMEOUT, STALL_GRACE};
use super::object_source::{Body, GetResponse, ObjectRef};

/// What S3 leaves unescaped in a key's path: RFC 3986's unreserved characters and `/`.
const KEY_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');
/// Credentials are fetched again this long before they expire.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);

pub(crate) struct LeanGets {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// `http(s)://host:port`, without a trailing slash.
    endpoint: String,
    path_style: bool,
    region: String,
    /// `None`: unsigned requests (`--no-sign-request`).
    credentials: Option<CachedCredentials>,
    responses: Arc<Responses>,
}

impl LeanGets {
    /// The lean path for `settings` beside the SDK client `sdk` and its `credentials`, when they
    /// allow one: a custom HTTP(S) endpoint, a region, and credentials unless unsigned.
    pub(crate) fn for_settings(
        settings: &ClientSettings,
        sdk: &aws_sdk_s3::Client,
        credentials: Option<SharedCredentialsProvider>,
        responses: Arc<Responses>,
    ) -> Option<Self> {
        let endpoint = settings.endpoint.as_deref()?.trim_end_matches('/');
        let uri: hyper::Uri = endpoint.parse().ok()?;
        let web = matches!(uri.scheme_str(), Some("http" | "https"));
        if !web || !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return None;
        }
        let credentials = match settings.anonymous {
            true => None,
            false => Some(CachedCredentials::new(credentials?)),
        };
        Some(Self {
            client: pooled_client(settings),
            endpoint: endpoint.to_string(),
            path_style: settings.path_style,
            region: sdk.config().region()?.to_string(),
            credentials,
            responses,
        })
    }

    /// GETs `range` of `object`, or the whole of it (with its full-object checksum checked);
    /// `None` hands it to the SDK path (see the module note).
    pub(crate) async fn get(
        &self,
        object: &ObjectRef<'_>,
        range: Option<Range<u64>>,
    ) -> Option<GetResponse> {
        if object.version_id.is_some() {
            return None;
        }
        let uri = self.uri(object)?;
        let range = range.map(|r| format!("bytes={}-{}", r.start, r.end - 1));
        let mut headers = match &range {
            Some(range) => vec![("range", range.as_str())],
            None => vec![("x-amz-checksum-mode", "ENABLED")],
        };
        if !object.etag.is_empty() {
            headers.push(("if-match", object.etag));
        }
        let mut request = hyper::Request::get(&uri);
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        let mut request = request.body(Empty::new()).ok()?;
        if let Some(credentials) = &self.credentials {
            let identity = credentials.identity().await?;
            let signable =
                SignableRequest::new("GET", &uri, headers.into_iter(), SignableBody::Bytes(&[]))
                    .ok()?;
            let params = v4::SigningParams::builder()
                .identity(&identity)
                .region(&self.region)
                .name("s3")
                .time(SystemTime::now())
                .settings(s3_signing())
                .build()
                .ok()?
                .into();
            let (instructions, _) = sign(signable, &params).ok()?.into_parts();
            instructions.apply_to_request_http1x(&mut request);
        }
        let sent = tokio::time::timeout(FIRST_BYTE_TIMEOUT, self.client.request(request));
        let response = sent.await.ok()?.ok()?;
        self.responses
            .record("GetObject", response.status().as_u16());
        let expected = match range {
            Some(_) => hyper::StatusCode::PARTIAL_CONTENT,
            None => hyper::StatusCode::OK,
        };
        if response.status() != expected {
            return None;
        }
        let header = |name: &str| response.headers().get(name)?.to_str().ok();
        let etag = header("etag");
        let checksum = range.is_none().then(|| {
            full_object(
                header("x-amz-checksum-type")
                    .map(ChecksumType::from)
                    .as_ref(),
                etag.unwrap_or_default(),
                header("x-amz-checksum-crc64nvme"),
                header("x-amz-checksum-crc32c"),
                header("x-amz-checksum-crc32"),
            )
        });
        let content_length = header("content-length").and_then(|l| l.parse().ok());
        let content_range = header("content-range").map(str::to_string);
        let etag = etag.map(str::to_string);
        Some(GetResponse {
            etag,
            content_range,
            content_length,
            body: checked_body(response.into_body(), checksum.flatten()),
        })
    }

    /// The object's URL, path-style or virtual-hosted as the SDK would address it.
    fn uri(&self, object: &ObjectRef<'_>) -> Option<String> {
        let key = utf8_percent_encode(object.key, KEY_ESCAPES);
        match self.path_style {
            true => Some(format!("{}/{}/{key}", self.endpoint, object.bucket)),
            // A dotted bucket would need a certificate of its own; leave it to the SDK.
            false if object.bucket.contains('.') => None,
            false => {
                let (scheme, host) = self.endpoint.split_once("://")?;
                Some(format!("{scheme}://{}.{host}/{key}", object.bucket))
            }
        }
    }
}

/// A pooled HTTP and HTTPS client, with the TLS `settings` ask for.
fn pooled_client(settings: &ClientSettings) -> Client<HttpsConnector<HttpConnector>, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(super::tls::client_config(
            settings.ca_bundle.as_deref(),
            settings.no_verify_ssl,
        ))
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(connector)
}

/// How the SDK signs for S3: the payload hash in `x-amz-content-sha256`, the path escaped once
/// and never normalised.
fn s3_signing() -> SigningSettings {
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings
}

/// The body as chunks; it fails when no bytes come for the stall grace, and at its end when its
/// CRC is not the full-object checksum the server sent.
fn checked_body<B>(body: B, checksum: Option<FullObjectChecksum>) -> Body
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let crc = checksum.map(|expected| (expected, expected.algorithm.digest()));
    Box::pin(stream::unfold(Some((body, crc)), |state| async move {
        let (mut body, mut crc) = state?;
        loop {
            let frame = match tokio::time::timeout(STALL_GRACE, body.frame()).await {
                Err(_) => {
                    let stalled = format!("no bytes for {STALL_GRACE:?}: the body stalled");
                    return Some((Err(stalled.into()), None));
                }
                Ok(None) => {
                    let (expected, digest) = crc?;
                    let actual = digest.finalize();
                    return (actual != expected.value).then(|| {
                        let mismatch = format!(
                            "{} of the body is {actual:#x}, the server's checksum {:#x}",
                            expected.algorithm.name(),
                            expected.value
                        );
                        (Err(mismatch.into()), None)
                    });
                }
                Ok(Some(Err(err))) => return Some((Err(err.into()), None)),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                if let Some((_, digest)) = &mut crc {
                    digest.update(&data);
                }
                return Some((Ok(data), Some((body, crc))));
            }
        }
    }))
}

/// The SDK's credentials provider, asked again only when what it gave is near its expiry.
struct CachedCredentials {
    provider: SharedCredentialsProvider,
    cached: RwLock<Option<(Identity, Option<SystemTime>)>>,
}

impl CachedCredentials {
    fn new(provider: SharedCredentialsProvider) -> Self {
        Self {
            provider,
            cached: RwLock::new(None),
        }
    }

    async fn identity(&self) -> Option<Identity> {
        let fresh = |expiry: &Option<SystemTime>| {
            expiry.is_none_or(|at| at > SystemTime::now() + REFRESH_BEFORE_EXPIRY)
        };
        if let Some((identity, expiry)) = &*self.cached.read().ok()? {
            if fresh(expiry) {
                return Some(identity.clone());
            }
        }
        let credentials = self.provider.provide_credentials().await.ok()?;
        let expiry = credentials.expiry();
        let identity = Identity::from(credentials);
        *self.cached.write().ok()? = Some((identity.clone(), expiry));
        Some(identity)
    }
}

/// Helpers for tests that drive the lean path against a server.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::source::client::StaticCredentials;
    use crate::source::s3::S3Source;

    pub(crate) fn settings(endpoint: &str, credentials: StaticCredentials) -> ClientSettings {
        ClientSettings {
            endpoint: Some(endpoint.to_string()),
            region: None,
            path_style: true,
            credentials: Some(credentials),
            profile: None,
            anonymous: false,
            ca_bundle: None,
            no_verify_ssl: false,
            max_requests: 4,
        }
    }

    /// The lean path `settings` give (if any), and the answers it records.
    pub(crate) async fn lean_for(settings: &ClientSettings) -> (Option<LeanGets>, Arc<Responses>) {
        let responses = Arc::new(Responses::default());
        let source = S3Source::for_settings(settings, responses.clone()).await;
        (source.lean, responses)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    use super::test_support::{lean_for, settings};
    use super::*;
    use crate::source::checksum::Algorithm;
    use crate::source::client::StaticCredentials;

    #[tokio::test]
    async fn only_http_and_https_root_endpoints_take_the_lean_path() {
        let credentials = StaticCredentials {
            access_key: "a".to_string(),
            secret_key: "b".to_string(),
        };
        for (endpoint, lean) in [
            ("http://127.0.0.1:9000", true),
            ("http://127.0.0.1:9000/", true),
            ("https://127.0.0.1:9000", true),
            ("ftp://127.0.0.1:9000", false),
            ("https://127.0.0.1:9000/prefix", false),
            ("http://127.0.0.1:9000/prefix", false),
        ] {
            let settings = settings(endpoint, credentials.clone());
            assert_eq!(lean_for(&settings).await.0.is_some(), lean, "{endpoint}");
        }
        let mut aws = settings("http://unused", credentials);
        aws.endpoint = None;
        assert!(
            lean_for(&aws).await.0.is_none(),
            "AWS itself keeps the SDK path"
        );
    }

    #[test]
    fn keys_are_escaped_once_and_addressed_as_the_sdk_would() {
        let credentials = StaticCredentials {
            access_key: "a".to_string(),
            secret_key: "b".to_string(),
        };
        let settings = settings("http://h:9", credentials);
        let lean = |path_style| LeanGets {
            client: pooled_client(&settings),
            endpoint: "http://h:9".to_string(),
            path_style,
            region: "r".to_string(),
            credentials: None,
            responses: Arc::default(),
        };
        let uri = |lean: &LeanGets, bucket, key| {
            let object = ObjectRef {
                bucket,
                key,
                version_id: None,
                etag: "",
            };
            lean.uri(&object)
        };
        let key = "a b/ü+%~_.-x";
        let escaped = "a%20b/%C3%BC%2B%25~_.-x";
        assert_eq!(
            uri(&lean(true), "bk", key).unwrap(),
            format!("http://h:9/bk/{escaped}")
        );
        assert_eq!(
            uri(&lean(false), "bk", key).unwrap(),
            format!("http://bk.h:9/{escaped}")
        );
        assert_eq!(uri(&lean(false), "b.k", key), None);
    }

    fn body_of(
        chunks: Vec<&'static [u8]>,
    ) -> impl hyper::body::Body<Data = Bytes, Error = std::io::Error> + Send + Unpin + 'static {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(c))));
        StreamBody::new(stream::iter(frames))
    }

    fn crc32c(data: &[u8]) -> FullObjectChecksum {
        let mut digest = Algorithm::Crc32c.digest();
        digest.update(data);
        FullObjectChecksum {
            algorithm: Algorithm::Crc32c,
            value: digest.finalize(),
        }
    }

    #[tokio::test]
    async fn a_body_is_checked_against_the_full_object_checksum_at_its_end() {
        let good: Vec<_> = checked_body(
            body_of(vec![b"hello ", b"world"]),
            Some(crc32c(b"hello world")),
        )
        .collect()
        .await;
        assert_eq!(good.len(), 2);
        assert!(good.iter().all(Result::is_ok));
        let bad: Vec<_> = checked_body(
            body_of(vec![b"hello ", b"w0rld"]),
            Some(crc32c(b"hello world")),
        )
        .collect()
        .await;
        assert_eq!(bad.len(), 3, "both chunks, then the mismatch");
        let err = bad[2].as_ref().unwrap_err().to_string();
        assert!(err.contains("CRC32C"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_without_bytes_for_the_grace_fails_as_stalled() {
        let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, std::io::Error>>());
        let items: Vec<_> = checked_body(silent, None).collect().await;
        assert_eq!(items.len(), 1);
        let err = items[0].as_ref().unwrap_err().to_string();
        assert!(err.contains("stalled"), "{err}");
    }
}
