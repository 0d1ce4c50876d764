//! Builds the S3 client from [`ClientSettings`]: path-style for custom endpoints, time-outs,
//! stalled-stream protection, and a retry budget sized for the number of requests in flight.
//!
//! A 429 is retried as throttling, as a 503 `SlowDown` is: MinIO answers a request beyond its
//! `requests_max` (by default sized from its memory) at once with 429 `TooManyRequests`, a
//! status and a code the SDK's own classifiers leave alone. Without [`TooManyRequests`], a busy
//! MinIO failed a listing page at its first such answer, and a GET spent hydrator's few part
//! attempts without a back-off.

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    Credentials, Region, ResponseChecksumValidation, StalledStreamProtectionConfig,
};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::InterceptorContext;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::retries::classifiers::{ClassifyRetry, RetryAction};

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub(crate) const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(5);
/// SDK attempts per request (5xx, throttling, connection errors before the body).
const SDK_MAX_ATTEMPTS: u32 = 5;
/// Retry tokens per in-flight request: the SDK's default bucket (500 tokens, 5 per retry) runs
/// dry within seconds of a 503 storm at high concurrency and then fails requests outright.
const RETRY_TOKENS_PER_REQUEST: usize = 100;
const MIN_RETRY_TOKENS: usize = 500;
/// Region used with a custom endpoint when none is configured (MinIO, Garage and RGW accept it
/// unless set up otherwise).
const DEFAULT_ENDPOINT_REGION: &str = "us-east-1";

/// Static credentials: a catalog dataset's, an mc alias's, the embedded demo server's. Without
/// them the standard AWS chain is used.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    pub access_key: String,
    pub secret_key: String,
    /// Temporary credentials' token (an mc alias's `sessionToken`).
    pub session_token: Option<String>,
}

/// The secret never reaches a log or a panic message.
impl std::fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Where the S3 server is and how to talk to it.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// A custom endpoint (MinIO, Ceph RGW, Garage...); `None`: AWS.
    pub endpoint: Option<String>,
    /// `None`: the AWS chain, or us-east-1 with a custom endpoint.
    pub region: Option<String>,
    pub path_style: bool,
    /// `None`: the standard AWS credential chain.
    pub credentials: Option<StaticCredentials>,
    /// A named profile of the shared config and credentials files (`None`: `AWS_PROFILE` or
    /// the default profile).
    pub profile: Option<String>,
    /// Unsigned requests, for public buckets (`--no-sign-request`).
    pub anonymous: bool,
    /// PEM certificates trusted besides the system's (`--ca-bundle`, an in-house CA).
    pub ca_bundle: Option<Vec<u8>>,
    /// Accept any server certificate (`--no-verify-ssl`).
    pub no_verify_ssl: bool,
    /// The most requests in flight, which sizes the retry budget.
    pub max_requests: usize,
}

/// The answers S3 clients received: throttling ones (429, 503, retried or not) for the adaptive
/// limit, and every one by operation and status for the daemon's metrics.
#[derive(Debug, Default)]
pub struct Responses {
    /// Throttling answers since the adaptive controller last looked.
    pub throttled: AtomicU64,
    /// (operation, status, count): a handful of entries, scanned without allocating.
    counts: Mutex<Vec<(String, u16, u64)>>,
}

impl Responses {
    /// Answers so far, by (operation, HTTP status).
    pub(crate) fn by_operation(&self) -> BTreeMap<(String, u16), u64> {
        let counts = self.counts.lock().expect("responses lock");
        let by_operation = counts
            .iter()
            .map(|(op, status, n)| ((op.clone(), *status), *n));
        by_operation.collect()
    }

    /// Answers so far, and how many of them were throttling (429, 503).
    pub(crate) fn totals(&self) -> (u64, u64) {
        let counts = self.counts.lock().expect("responses lock");
        counts
            .iter()
            .fold((0, 0), |(all, throttled), (_, status, n)| {
                (all + n, throttled + n * u64::from(throttling(*status)))
            })
    }

    pub(crate) fn record(&self, operation: &str, status: u16) {
        if throttling(status) {
            self.throttled.fetch_add(1, Relaxed);
        }
        let mut counts = self.counts.lock().expect("responses lock");
        let seen = counts
            .iter_mut()
            .find(|(op, s, _)| op == operation && *s == status);
        match seen {
            Some((_, _, count)) => *count += 1,
            None => counts.push((operation.to_string(), status, 1)),
        }
    }
}

fn throttling(status: u16) -> bool {
    matches!(status, 429 | 503)
}

/// Classifies a 429 answer, whatever its code, as throttling (see the module note).
#[derive(Debug)]
struct TooManyRequests;

impl ClassifyRetry for TooManyRequests {
    fn classify_retry(&self, ctx: &InterceptorContext) -> RetryAction {
        match ctx.response().map(|response| response.status().as_u16()) {
            Some(429) => RetryAction::throttling_error(),
            _ => RetryAction::NoActionIndicated,
        }
    }

    fn name(&self) -> &'static str {
        "429 Too Many Requests"
    }
}

#[derive(Debug)]
struct RecordResponses(Arc<Responses>);

impl Intercept for RecordResponses {
    fn name(&self) -> &'static str {
        "RecordResponses"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let operation = cfg.load::<Metadata>().map_or("unknown", |m| m.name());
        self.0
            .record(operation, context.response().status().as_u16());
        Ok(())
    }
}

/// The SDK's HTTPS client, trusting `pem`'s certificates as well as the system's roots (which
/// honour `SSL_CERT_FILE` and `SSL_CERT_DIR`).
fn https_client_trusting(pem: &[u8]) -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode, TlsContext, TrustStore};
    let context = TlsContext::builder()
        .with_trust_store(TrustStore::default().with_pem_certificate(pem.to_vec()))
        .build()
        .expect("a trust store of PEM certificates always builds");
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
        .tls_context(context)
        .build_https()
}

/// The client for `settings`; its answers are counted into `responses`.
pub async fn build(settings: &ClientSettings, responses: Arc<Responses>) -> aws_sdk_s3::Client {
    build_with_credentials(settings, responses).await.0
}

/// [`build`], with the credentials provider the client signs with (`None` when unsigned).
pub(crate) async fn build_with_credentials(
    settings: &ClientSettings,
    responses: Arc<Responses>,
) -> (aws_sdk_s3::Client, Option<SharedCredentialsProvider>) {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    let region = settings.region.clone().or_else(|| {
        settings
            .endpoint
            .as_ref()
            .map(|_| DEFAULT_ENDPOINT_REGION.to_string())
    });
    if let Some(region) = region {
        loader = loader.region(Region::new(region));
    }
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(pem) = &settings.ca_bundle {
        loader = loader.http_client(https_client_trusting(pem));
    }
    if settings.no_verify_ssl {
        tracing::warn!(
            "--no-verify-ssl: the server's certificate is not checked, so anyone on the network path can pose as it (BLAKE3 and the CRCs catch damage, not a forger)"
        );
        loader = loader.http_client(super::unverified_tls::client());
    }
    if let Some(profile) = &settings.profile {
        loader = loader.profile_name(profile);
    }
    if settings.anonymous {
        loader = loader.no_credentials();
    }
    if let Some(creds) = &settings.credentials {
        loader = loader.credentials_provider(Credentials::new(
            &creds.access_key,
            &creds.secret_key,
            creds.session_token.clone(),
            None,
            "hydrator-static",
        ));
    }
    let shared = loader.load().await;
    let tokens = (settings.max_requests * RETRY_TOKENS_PER_REQUEST).max(MIN_RETRY_TOKENS);
    let s3_config = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(settings.path_style)
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(SDK_MAX_ATTEMPTS)
                .with_initial_backoff(Duration::from_millis(100)),
        )
        .retry_classifier(TooManyRequests)
        .retry_partition(
            RetryPartition::custom("hydrator")
                .token_bucket(TokenBucket::new(tokens))
                .build(),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(FIRST_BYTE_TIMEOUT)
                .build(),
        )
        .stalled_stream_protection(
            StalledStreamProtectionConfig::enabled()
                .grace_period(STALL_GRACE)
                .build(),
        )
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .interceptor(RecordResponses(responses))
        .build();
    let credentials = shared.credentials_provider();
    (aws_sdk_s3::Client::from_conf(s3_config), credentials)
}
