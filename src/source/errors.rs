//! Maps S3 SDK errors to what hydrator does about them: stop with a usage error, restart the
//! object, retry the part, or give up on the object.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

/// What an S3 error means for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// Configuration, credentials or a missing bucket: exit 2.
    Usage(String),
    /// HTTP 412: the object no longer has the pinned ETag.
    Changed,
    /// Transient: throttling, 5xx, a dropped or timed-out connection.
    Retryable(String),
    /// Permanent for this object (it is gone, or access to it is denied).
    Fatal(String),
}

pub fn classify<E, R>(err: &SdkError<E, R>, what: &str) -> Classified
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + HasStatus,
{
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status_code();
            let code = service.err().code().unwrap_or("");
            let message = service.err().message().unwrap_or("");
            classify_status(status, code, message, what)
        }
        SdkError::TimeoutError(_) => Classified::Retryable(format!("{what}: timed out")),
        SdkError::DispatchFailure(failure)
            if failure.as_connector_error().is_some_and(|e| caused_by_credentials(e)) =>
        {
            Classified::Usage(format!(
            "{what}: no usable credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, or web identity): {}",
            describe_chain(err)
        ))
        }
        SdkError::DispatchFailure(failure) => {
            let detail = describe_chain(err);
            if failure.is_io() || failure.is_timeout() {
                Classified::Retryable(format!("{what}: connection failed: {detail}"))
            } else {
                Classified::Retryable(format!("{what}: request failed: {detail}"))
            }
        }
        SdkError::ResponseError(_) => {
            Classified::Retryable(format!("{what}: broken response: {}", describe_chain(err)))
        }
        SdkError::ConstructionFailure(_) => Classified::Usage(format!(
            "{what}: cannot build the request: {}",
            describe_chain(err)
        )),
        _ => Classified::Retryable(format!("{what}: {}", describe_chain(err))),
    }
}

fn classify_status(status: u16, code: &str, message: &str, what: &str) -> Classified {
    let detail = if message.is_empty() {
        format!("HTTP {status} {code}")
    } else {
        format!("HTTP {status} {code}: {message}")
    };
    match (status, code) {
        (412, _) => Classified::Changed,
        (_, "NoSuchBucket") => Classified::Usage(format!("{what}: the bucket does not exist")),
        (_, "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "InvalidToken" | "ExpiredToken") => {
            Classified::Usage(format!("{what}: the credentials were rejected ({detail})"))
        }
        (_, "AccessDenied") | (403, _) => {
            Classified::Usage(format!("{what}: access denied ({detail})"))
        }
        (_, "PermanentRedirect" | "AuthorizationHeaderMalformed") | (301, _) => Classified::Usage(
            format!("{what}: wrong region or endpoint for this bucket ({detail})"),
        ),
        (404, _) | (_, "NoSuchKey") => {
            Classified::Fatal(format!("{what}: object not found ({detail})"))
        }
        (429 | 500..=599, _) | (_, "SlowDown" | "RequestTimeout") => {
            Classified::Retryable(format!("{what}: {detail}"))
        }
        _ => Classified::Fatal(format!("{what}: {detail}")),
    }
}

/// Whether resolving credentials is what failed (none found, or the provider broke).
fn caused_by_credentials(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if e.is::<aws_credential_types::provider::error::CredentialsError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The error and its sources on one line, for a person to read.
pub fn describe_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Access to the HTTP status of a raw response, whatever its type.
pub trait HasStatus {
    fn status_code(&self) -> u16;
}

impl HasStatus for aws_sdk_s3::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}
