//! The one place where S3 SDK errors are classified into [`SourceErrorKind`]s, each with its
//! [`Remedy`](crate::error::Remedy): stop with a usage error, restart the object, retry the part,
//! or give up on the object.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use crate::error::{HttpAnswer, SourceError, SourceErrorKind};

/// The SDK's error for `request`, classified; the SDK error is kept as the cause.
pub(crate) fn classify<E, R>(err: SdkError<E, R>, request: impl Into<String>) -> SourceError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + HasStatus + Send + Sync + 'static,
{
    let kind = match &err {
        SdkError::ServiceError(service) => classify_status(HttpAnswer {
            status: service.raw().status_code(),
            code: service.err().code().unwrap_or("").to_string(),
            message: service.err().message().unwrap_or("").to_string(),
        }),
        SdkError::TimeoutError(_) => SourceErrorKind::Timeout,
        SdkError::DispatchFailure(failure)
            if failure
                .as_connector_error()
                .is_some_and(|e| caused_by_credentials(e)) =>
        {
            SourceErrorKind::NoCredentials(credentials_problem(&err))
        }
        SdkError::DispatchFailure(failure)
            if failure
                .as_connector_error()
                .is_some_and(|e| answered_without_tls(e)) =>
        {
            SourceErrorKind::PlainHttp(root_cause(&err))
        }
        // rustls' own words; the error reaches here as text inside an io::Error.
        SdkError::DispatchFailure(_)
            if describe_chain(&err).contains("invalid peer certificate") =>
        {
            SourceErrorKind::UntrustedCertificate(describe_chain(&err))
        }
        SdkError::DispatchFailure(failure) if failure.is_io() || failure.is_timeout() => {
            SourceErrorKind::Connection(root_cause(&err))
        }
        SdkError::DispatchFailure(_) => SourceErrorKind::Dispatch(describe_chain(&err)),
        SdkError::ResponseError(_) => SourceErrorKind::BrokenResponse(describe_chain(&err)),
        SdkError::ConstructionFailure(_) => SourceErrorKind::Construction(describe_chain(&err)),
        _ => SourceErrorKind::Dispatch(describe_chain(&err)),
    };
    SourceError {
        request: request.into(),
        kind,
        cause: Some(Box::new(err)),
    }
}

fn classify_status(answer: HttpAnswer) -> SourceErrorKind {
    use SourceErrorKind::*;
    match (answer.status, answer.code.as_str()) {
        (412, _) => Changed,
        (_, "NoSuchBucket") => NoSuchBucket,
        (_, "SignatureDoesNotMatch") => WrongSecretKey(answer),
        // Garage refuses a bad signature as AccessDenied, "Forbidden: Invalid signature", and an
        // unknown key as "Forbidden: No such key: GK…".
        (403, "AccessDenied") if answer.message.contains("Invalid signature") => {
            WrongSecretKey(answer)
        }
        (403, "AccessDenied") if answer.message.contains("No such key") => {
            CredentialsRejected(answer)
        }
        (_, "InvalidAccessKeyId" | "InvalidToken" | "ExpiredToken" | "NotSignedUp") => {
            CredentialsRejected(answer)
        }
        (_, "AccessDenied") | (403, _) => AccessDenied(answer),
        (_, "PermanentRedirect" | "AuthorizationHeaderMalformed") | (301, _) => WrongRegion(answer),
        (404, _) | (_, "NoSuchKey") => NotFound(answer),
        (429 | 500..=599, _) | (_, "SlowDown" | "RequestTimeout") => Unavailable(answer),
        _ => Refused(answer),
    }
}

/// Whether the TLS handshake failed because the server answered something that is not TLS:
/// rustls finds no TLS record type in the answer (`InvalidContentType`), as when an `https://`
/// endpoint is a plain-HTTP port that answers the ClientHello with `HTTP/1.1 400`. rustls'
/// error travels inside an `io::Error` inside another (the TLS connector's), and an io::Error's
/// `source` skips what it wraps, so each io::Error is opened down to what it holds.
fn answered_without_tls(err: &(dyn std::error::Error + 'static)) -> bool {
    let not_tls = |e: &(dyn std::error::Error + 'static)| {
        matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))
        )
    };
    let mut cause = Some(err);
    while let Some(e) = cause {
        let mut wrapped = Some(e);
        while let Some(layer) = wrapped {
            if not_tls(layer) {
                return true;
            }
            wrapped = layer
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .map(|inner| inner as &(dyn std::error::Error + 'static));
        }
        cause = e.source();
    }
    false
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

/// What went wrong with the credential chain, on one line: nothing found (the chain's list of
/// every provider it tried says nothing the remedy does not), or why a provider broke.
fn credentials_problem(err: &dyn std::error::Error) -> String {
    let chain = describe_chain(err);
    tracing::debug!("credential chain: {chain}");
    match chain.contains("no credentials found in chain") {
        true => "none found".to_string(),
        false => root_cause(err).lines().collect::<Vec<_>>().join("; "),
    }
}

/// The innermost error's words ("Connection refused (os error 111)"), without the layers the
/// SDK and its HTTP client wrap around it.
fn root_cause(err: &dyn std::error::Error) -> String {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// The error and its sources on one line, for a person to read.
pub(crate) fn describe_chain(err: &dyn std::error::Error) -> String {
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
pub(crate) trait HasStatus {
    fn status_code(&self) -> u16;
}

impl HasStatus for aws_sdk_s3::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, code: &str, message: &str) -> HttpAnswer {
        HttpAnswer {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_bad_signature_reads_as_a_wrong_secret_key_whichever_server_says_it() {
        let s3 = classify_status(answer(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match",
        ));
        let garage = classify_status(answer(403, "AccessDenied", "Forbidden: Invalid signature"));
        for kind in [s3, garage] {
            assert!(
                matches!(kind, SourceErrorKind::WrongSecretKey(_)),
                "{kind:?}"
            );
            assert!(
                kind.to_string().contains("the secret key is wrong"),
                "{kind}"
            );
            assert_eq!(kind.remedy(), crate::error::Remedy::Usage);
        }
        let unknown_key = classify_status(answer(
            403,
            "AccessDenied",
            "Forbidden: No such key: GK31c2f218a2e44f485b94239e",
        ));
        assert!(
            matches!(unknown_key, SourceErrorKind::CredentialsRejected(_)),
            "{unknown_key:?}"
        );
        let denied = classify_status(answer(
            403,
            "AccessDenied",
            "Forbidden: Operation is not allowed for this key.",
        ));
        assert!(
            matches!(denied, SourceErrorKind::AccessDenied(_)),
            "{denied:?}"
        );
    }

    #[test]
    fn a_plain_http_answer_to_a_tls_handshake_is_recognised_inside_an_io_error() {
        // As the SDK's TLS connector hands it over: rustls' error in an io::Error in another.
        let tls = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let connector = std::io::Error::other(io);
        assert!(answered_without_tls(&connector));
        let other = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::MessageTooShort),
        );
        assert!(!answered_without_tls(&other));
        assert!(!answered_without_tls(&std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        )));
    }
}
