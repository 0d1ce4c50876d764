//! A lean path for GETs. Through the SDK a 64 KiB GET costs about three times the CPU of the
//! request itself (`benches/requests.rs`: 219.9 against 80.0 µs), the orchestrator's
//! per-request set-up; small objects are nearly all request, so this path signs the same GET
//! with `aws-sigv4`, as the SDK signs for S3, and sends it on connections of its own, its body
//! read straight into the engine's buffers (`exchange`). Ranged GETs (the parts of large
//! objects) take it too: per byte the SDK's body adds its own layers, and hyper's a copy.
//!
//! It is a fast path, not a second client. Only a 200 to a whole-object GET and a 206 to a
//! ranged one, framed by a `Content-Length`, are taken from it; any other answer (after it is
//! recorded, so throttling still reaches the adaptive limit), a transport error or no answer
//! within the SDK's first-byte timeout hands the request to the SDK path, which retries,
//! classifies and reports as always; after an answer not framed by `Content-Length` (each GET
//! would be sent twice) the lean path stands aside for the rest of the run. What the SDK does
//! on a 200 is done here too: the body is CRC'd against the full-object checksum header (and
//! the engine fails a body with no bytes for the stall grace as a stalled one, whichever path
//! it came by). Used with a custom endpoint (in-cluster MinIO, Garage, Ceph RGW) over HTTP or
//! HTTPS, trusting what the SDK trusts (`source::tls`), and unversioned GETs; AWS keeps the SDK
//! path. A certificate the lean path refuses, the SDK path refuses too, and reports.

mod connections;
mod exchange;
mod handshake;
mod records;
#[cfg(test)]
mod tls_wire_tests;
#[cfg(test)]
mod wire_tests;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
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
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use self::connections::{Connections, Origin};
use self::exchange::{request_head, round_trip, Answer, DirectBody};
use super::checksum::full_object;
use super::client::{ClientSettings, Responses, FIRST_BYTE_TIMEOUT};
use super::object_source::{GetResponse, ObjectRef};

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
    connections: Arc<Connections>,
    /// `http(s)://host:port`, without a trailing slash.
    endpoint: String,
    path_style: bool,
    region: String,
    /// `None`: unsigned requests (`--no-sign-request`).
    credentials: Option<CachedCredentials>,
    responses: Arc<Responses>,
    /// The server answered a GET without a `Content-Length`: every GET would be sent twice,
    /// so the lean path stands aside.
    unframed: AtomicBool,
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
            connections: connections_for(settings),
            endpoint: endpoint.to_string(),
            path_style: settings.path_style,
            region: sdk.config().region()?.to_string(),
            credentials,
            responses,
            unframed: AtomicBool::new(false),
        })
    }

    /// GETs `range` of `object`, or the whole of it (with its full-object checksum checked);
    /// `None` hands it to the SDK path (see the module note).
    pub(crate) async fn get(
        &self,
        object: &ObjectRef<'_>,
        range: Option<Range<u64>>,
    ) -> Option<GetResponse> {
        if object.version_id.is_some() || self.unframed.load(Ordering::Relaxed) {
            return None;
        }
        let uri = self.uri(object)?;
        let parsed: hyper::Uri = uri.parse().ok()?;
        let origin = Origin::of(&parsed)?;
        let request = self
            .signed_head(object, &uri, &parsed, &origin, range.as_ref())
            .await?;
        let answered = tokio::time::timeout(FIRST_BYTE_TIMEOUT, self.ask(&origin, &request));
        let answer = match answered.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => {
                tracing::debug!(key = object.key, "lean GET handed to the SDK: {err}");
                return None;
            }
            Err(_) => {
                tracing::debug!(
                    key = object.key,
                    "lean GET handed to the SDK: no answer in time"
                );
                return None;
            }
        };
        let head = &answer.head;
        self.responses.record("GetObject", head.status);
        let expected = match range {
            Some(_) => 206,
            None => 200,
        };
        if head.status != expected {
            return None;
        }
        let Some(body_length) = head.body_length else {
            if !self.unframed.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    "the server frames GET answers without a Content-Length: GETs go through the SDK"
                );
            }
            return None;
        };
        let etag = head.header("etag");
        let checksum = range.is_none().then(|| {
            full_object(
                head.header("x-amz-checksum-type")
                    .map(ChecksumType::from)
                    .as_ref(),
                etag.unwrap_or_default(),
                head.header("x-amz-checksum-crc64nvme"),
                head.header("x-amz-checksum-crc32c"),
                head.header("x-amz-checksum-crc32"),
            )
        });
        let etag = etag.map(str::to_string);
        let content_range = head.header("content-range").map(str::to_string);
        let connections = self.connections.clone();
        Some(GetResponse {
            etag,
            content_range,
            content_length: Some(body_length as i64),
            body: Box::pin(DirectBody::new(
                answer,
                origin,
                connections,
                checksum.flatten(),
            )),
        })
    }

    /// The GET's request head, signed unless the requests are unsigned.
    async fn signed_head(
        &self,
        object: &ObjectRef<'_>,
        uri: &str,
        parsed: &hyper::Uri,
        origin: &Origin,
        range: Option<&Range<u64>>,
    ) -> Option<Vec<u8>> {
        let range = range.map(|r| format!("bytes={}-{}", r.start, r.end - 1));
        let mut headers = match &range {
            Some(range) => vec![("range", range.as_str())],
            None => vec![("x-amz-checksum-mode", "ENABLED")],
        };
        if !object.etag.is_empty() {
            headers.push(("if-match", object.etag));
        }
        let path = parsed.path_and_query()?.as_str();
        let host = origin.host_header();
        let Some(credentials) = &self.credentials else {
            return Some(request_head(path, &host, headers.into_iter()));
        };
        let identity = credentials.identity().await?;
        // The Host sent is signed as sent (the URL may spell the port otherwise).
        let with_host = headers.iter().copied().chain([("host", host.as_str())]);
        let signable =
            SignableRequest::new("GET", uri, with_host, SignableBody::Bytes(&[])).ok()?;
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
        let signed = headers.into_iter().chain(instructions.headers());
        Some(request_head(path, &host, signed))
    }

    /// Sends `request` to `origin` and reads the answer's head: on an idle connection if one is
    /// open (again on a new one if that fails before an answer: the server may have closed it
    /// just as the request went out), else on a new one.
    async fn ask(&self, origin: &Origin, request: &[u8]) -> std::io::Result<Answer> {
        if let Some(stream) = self.connections.idle(origin) {
            match round_trip(stream, request).await {
                Ok(answer) => return Ok(answer),
                Err(err) => {
                    tracing::debug!("a kept connection failed ({err}): asking on a new one")
                }
            }
        }
        round_trip(self.connections.connect(origin).await?, request).await
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

/// The lean path's connections, with the TLS `settings` ask for and as many kept idle as
/// requests may be in flight.
fn connections_for(settings: &ClientSettings) -> Arc<Connections> {
    let tls = super::tls::client_config(settings.ca_bundle.as_deref(), settings.no_verify_ssl);
    Connections::new(tls, settings.max_requests)
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

    /// The S3 source `settings` describe, lean path and all.
    pub(crate) async fn source_for(settings: &ClientSettings) -> S3Source {
        S3Source::for_settings(settings, Arc::default()).await
    }

    /// An object body of 300,000 + `n` bytes.
    pub(crate) fn large(n: usize) -> Vec<u8> {
        (0..300_000 + n).map(|i| (i % 251) as u8).collect()
    }

    /// A 206 with `body` as the start of an object (whose length the lean path does not
    /// check), with `headers` (each ending in CRLF) added to its head.
    pub(crate) fn partial(body: &[u8], headers: &str) -> Vec<u8> {
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\ncontent-range: bytes 0-{}/{}\r\n\
             etag: \"e\"\r\n{headers}\r\n",
            body.len(),
            body.len() - 1,
            body.len()
        );
        [head.as_bytes(), body].concat()
    }

    /// The object the scripted servers answer for.
    pub(crate) const OBJECT: ObjectRef<'static> = ObjectRef {
        bucket: "b",
        key: "k",
        version_id: None,
        etag: "\"e\"",
    };

    /// GETs the first `len` bytes of [`OBJECT`] and reads the body.
    pub(crate) async fn get(lean: &LeanGets, len: u64) -> Option<std::io::Result<Vec<u8>>> {
        use tokio::io::AsyncReadExt;
        let mut response = lean.get(&OBJECT, Some(0..len)).await?;
        let mut body = Vec::new();
        Some(response.body.read_to_end(&mut body).await.map(|_| body))
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
    use super::test_support::{lean_for, settings};
    use super::*;
    use crate::source::client::StaticCredentials;

    #[tokio::test]
    async fn only_http_and_https_root_endpoints_take_the_lean_path() {
        let credentials = StaticCredentials {
            access_key: "a".to_string(),
            secret_key: "b".to_string(),
            session_token: None,
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
            session_token: None,
        };
        let settings = settings("http://h:9", credentials);
        let lean = |path_style| LeanGets {
            connections: connections_for(&settings),
            endpoint: "http://h:9".to_string(),
            path_style,
            region: "r".to_string(),
            credentials: None,
            responses: Arc::default(),
            unframed: AtomicBool::new(false),
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
}
