//! Builds the S3 client: path-style for custom endpoints, time-outs, stalled-stream protection,
//! and a retry budget sized for the number of requests in flight.

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    Credentials, Region, ResponseChecksumValidation, StalledStreamProtectionConfig,
};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;

use crate::config::{self, SyncConfig};

/// Retry tokens per in-flight request: the SDK's default bucket (500 tokens, 5 per retry) runs
/// dry within seconds of a 503 storm at high concurrency and then fails requests outright.
const RETRY_TOKENS_PER_REQUEST: usize = 100;
const MIN_RETRY_TOKENS: usize = 500;
/// Region used with a custom endpoint when none is configured (MinIO, Garage and RGW accept it
/// unless set up otherwise).
const DEFAULT_ENDPOINT_REGION: &str = "us-east-1";

/// Counts throttling answers (429, 503), retried or not, into `throttled`.
#[derive(Debug)]
struct CountThrottling(Arc<AtomicU64>);

impl Intercept for CountThrottling {
    fn name(&self) -> &'static str {
        "CountThrottling"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if matches!(context.response().status().as_u16(), 429 | 503) {
            self.0.fetch_add(1, Relaxed);
        }
        Ok(())
    }
}

/// The client for `cfg`; throttling answers are counted into `throttled`.
pub async fn build(cfg: &SyncConfig, throttled: Arc<AtomicU64>) -> aws_sdk_s3::Client {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    let region = cfg.region.clone().or_else(|| {
        cfg.endpoint
            .as_ref()
            .map(|_| DEFAULT_ENDPOINT_REGION.to_string())
    });
    if let Some(region) = region {
        loader = loader.region(Region::new(region));
    }
    if let Some(endpoint) = &cfg.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(creds) = &cfg.credentials {
        loader = loader.credentials_provider(Credentials::new(
            &creds.access_key,
            &creds.secret_key,
            None,
            None,
            "hydrator-static",
        ));
    }
    let shared = loader.load().await;
    let tokens = (cfg.concurrency.max() * RETRY_TOKENS_PER_REQUEST).max(MIN_RETRY_TOKENS);
    let s3_config = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(cfg.path_style)
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(config::SDK_MAX_ATTEMPTS)
                .with_initial_backoff(std::time::Duration::from_millis(100)),
        )
        .retry_partition(
            RetryPartition::custom("hydrator")
                .token_bucket(TokenBucket::new(tokens))
                .build(),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config::CONNECT_TIMEOUT)
                .read_timeout(config::FIRST_BYTE_TIMEOUT)
                .build(),
        )
        .stalled_stream_protection(
            StalledStreamProtectionConfig::enabled()
                .grace_period(config::STALL_GRACE)
                .build(),
        )
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .interceptor(CountThrottling(throttled))
        .build();
    aws_sdk_s3::Client::from_conf(s3_config)
}
