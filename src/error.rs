//! Error types of each layer and the exit codes an init container can trust.
//!
//! Errors keep what failed (the operation, the key or path) and the cause (the `io::Error`, the
//! SDK's error); they become text once, through `Display`, at the edges: the log, the report's
//! `reason`, stderr and the exit code.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit codes: 0 only when every object is mirrored and hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    /// Some objects failed (each is named in the log and the report), or the transfer was cut
    /// short (a listing that broke off, a destination that stopped accepting writes).
    Failed = 1,
    /// Usage, configuration, credentials, a missing bucket: retrying will not help.
    Usage = 2,
    /// Stopped by SIGTERM or SIGINT before the end; a re-run resumes.
    Stopped = 3,
    /// DEST's filesystem cannot hold what the selection still needs: free space (or a larger
    /// volume) is what helps, not a retry.
    NoSpace = 4,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// A problem with what the user asked for; reported on one line, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(String);

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A run whose selection holds no object, and `--allow-empty` was not given: a typo in the
/// prefix, filters that keep nothing, an object's key given as the prefix. `why` says which,
/// naming the source; the daemon words the remedy its own way (its catalog's `allow_empty`).
#[derive(Debug, thiserror::Error)]
#[error("nothing to mirror: {why} (--allow-empty accepts an empty dataset)")]
pub struct EmptySelection {
    pub why: String,
}

/// A local filesystem operation that failed: what was being done, to which path, and why.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}: {source}", path.display())]
pub struct LocalError {
    pub action: Cow<'static, str>,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl LocalError {
    pub fn new(
        action: impl Into<Cow<'static, str>>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self {
            action: action.into(),
            path: path.into(),
            source,
        }
    }
}

/// `io_result.local("creating", &path)?`: an `io::Error` with its operation and path.
pub trait IoContext<T> {
    fn local(
        self,
        action: impl Into<Cow<'static, str>>,
        path: impl AsRef<Path>,
    ) -> Result<T, LocalError>;

    /// As [`IoContext::local`], with an action built only on failure (per-object paths).
    fn local_with(
        self,
        action: impl FnOnce() -> String,
        path: impl AsRef<Path>,
    ) -> Result<T, LocalError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn local(
        self,
        action: impl Into<Cow<'static, str>>,
        path: impl AsRef<Path>,
    ) -> Result<T, LocalError> {
        self.map_err(|source| LocalError::new(action, path.as_ref(), source))
    }

    fn local_with(
        self,
        action: impl FnOnce() -> String,
        path: impl AsRef<Path>,
    ) -> Result<T, LocalError> {
        self.map_err(|source| LocalError::new(action(), path.as_ref(), source))
    }
}

/// A request to the object store that failed: the request, what the answer means, and the
/// SDK's error (which holds the HTTP answer) as the cause.
#[derive(Debug, thiserror::Error)]
#[error("{request}: {kind}")]
pub struct SourceError {
    /// `GET KEY RANGE`, `HEAD KEY`, `listing s3://BUCKET/PREFIX/`.
    pub request: String,
    pub kind: SourceErrorKind,
    #[source]
    pub cause: Option<BoxError>,
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What an object store's answer (or its absence) means.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceErrorKind {
    /// HTTP 412: the object no longer has the pinned ETag.
    #[error("HTTP 412")]
    Changed,
    #[error("the bucket does not exist")]
    NoSuchBucket,
    #[error("the credentials were rejected ({0})")]
    CredentialsRejected(HttpAnswer),
    /// The server computed another signature: the access key is known, its secret is not this.
    #[error("the secret key is wrong: the server computes another signature with the access key's secret ({0}); check the secret (AWS_SECRET_ACCESS_KEY, the profile's or the mc alias's)")]
    WrongSecretKey(HttpAnswer),
    #[error("access denied ({0})")]
    AccessDenied(HttpAnswer),
    /// An unsigned request refused: the bucket does not allow anonymous access.
    #[error("the bucket is not public: anonymous requests (--no-sign-request) are refused ({0}); give credentials instead")]
    NotPublic(HttpAnswer),
    #[error("wrong region or endpoint for this bucket ({0})")]
    WrongRegion(HttpAnswer),
    #[error("object not found ({0})")]
    NotFound(HttpAnswer),
    /// Throttling or a server error: worth another attempt.
    #[error("{0}")]
    Unavailable(HttpAnswer),
    /// Any other refusal: permanent for this request.
    #[error("{0}")]
    Refused(HttpAnswer),
    #[error("timed out")]
    Timeout,
    #[error("no usable credentials ({0}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile (--profile, AWS_PROFILE) or web identity (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE); a public bucket takes --no-sign-request")]
    NoCredentials(String),
    #[error("cannot connect: {0}")]
    Connection(String),
    /// TLS asked of a server that answers plain HTTP.
    #[error(
        "the endpoint answers plain HTTP, not HTTPS ({0}): write it with http://, not https://"
    )]
    PlainHttp(String),
    /// TLS: the server's certificate is not trusted or names another host.
    #[error("the server's certificate is not trusted: {0}; if your own CA signed it, give its certificate with --ca-bundle (AWS_CA_BUNDLE), and reach the server by a name the certificate holds")]
    UntrustedCertificate(String),
    #[error("request failed: {0}")]
    Dispatch(String),
    #[error("broken response: {0}")]
    BrokenResponse(String),
    #[error("cannot build the request: {0}")]
    Construction(String),
}

/// What to do about a [`SourceError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// Configuration, credentials or a missing bucket: exit 2.
    Usage,
    /// The object changed: start it again from its new version.
    Restart,
    /// Transient: throttling, 5xx, a dropped or timed-out connection.
    Retry,
    /// Permanent for this object (it is gone, or the server refuses it).
    GiveUp,
}

impl SourceErrorKind {
    pub fn remedy(&self) -> Remedy {
        use SourceErrorKind::*;
        match self {
            Changed => Remedy::Restart,
            NoSuchBucket
            | CredentialsRejected(_)
            | WrongSecretKey(_)
            | PlainHttp(_)
            | AccessDenied(_)
            | NotPublic(_)
            | WrongRegion(_)
            | NoCredentials(_)
            | UntrustedCertificate(_)
            | Construction(_) => Remedy::Usage,
            Unavailable(_) | Timeout | Connection(_) | Dispatch(_) | BrokenResponse(_) => {
                Remedy::Retry
            }
            NotFound(_) | Refused(_) => Remedy::GiveUp,
        }
    }
}

impl SourceError {
    pub fn remedy(&self) -> Remedy {
        self.kind.remedy()
    }
}

/// An HTTP error answer: status, S3 error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for HttpAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {} {}", self.status, self.code)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Why a listing is incomplete.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// The first page failed for a reason worth retrying: likely nothing answers there.
    #[error("{0} (is --endpoint-url right and the server up?)")]
    Unreachable(SourceError),
    #[error(transparent)]
    Source(SourceError),
    #[error("listing {url}: the server repeated or reordered keys ({key:?} after {last:?})")]
    Reordered {
        url: String,
        key: String,
        last: String,
    },
    #[error("listing {url}: the server sent continuation token {token:?} twice (a loop)")]
    TokenLoop { url: String, token: String },
    #[error("listing {url}: the server said the listing continues but gave no continuation token")]
    NoContinuation { url: String },
    #[error("listing {url}: the listing task failed")]
    TaskFailed { url: String },
    /// The listing's read-ahead could not read back what it spooled.
    #[error("the listing's read-ahead spool in DEST/.hydrator: {0}")]
    Spool(#[source] std::io::Error),
}

/// Why `warm` could not get a dataset from the node daemon.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("unexpected answer from the daemon: {0}")]
    Answer(#[source] serde_json::Error),
    #[error("no daemon answers at {daemon} ({why}); give --fallback SOURCE DEST to sync directly")]
    NoDaemon { daemon: String, why: String },
    #[error("talking to the daemon at {daemon}: {why}")]
    Broken { daemon: String, why: String },
    /// The daemon is there but this process may not talk to it: no fallback, exit 2.
    #[error(
        "not allowed to talk to the daemon at {daemon} ({why}); check the socket's permissions"
    )]
    Denied { daemon: String, why: String },
    /// The daemon's own explanation of a refusal.
    #[error("{0}")]
    Refused(String),
    #[error("the daemon could not hydrate {name}: {reason}")]
    Failed { name: String, reason: String },
    #[error("{name} is still {state} after --timeout")]
    StillBusy { name: String, state: &'static str },
    #[error("lease refused: {0}")]
    LeaseRefused(LeaseRefusal),
}

/// Why `hydrator lease` could not hold or release its lease.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The daemon's own explanation (another owner, the cap, the snapshot gone).
    #[error("the daemon refused the lease: {0}")]
    Refused(String),
    #[error(
        "not allowed to talk to the daemon at {daemon} ({why}); check the socket's permissions"
    )]
    Denied { daemon: String, why: String },
    #[error("the lease could not be released: {0}; it expires by itself")]
    NotReleased(String),
}

/// Why the daemon granted no lease.
#[derive(Debug, thiserror::Error)]
pub enum LeaseRefusal {
    /// The snapshot was replaced or evicted between ready and lease: asking again can help.
    #[error("{0}")]
    Replaced(String),
    /// The daemon's own explanation.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Answer(#[from] serde_json::Error),
}

/// Why a sync as a whole could not finish.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// Nothing selected: a usage error (exit 2) the daemon reports in its own words.
    #[error(transparent)]
    EmptySelection(#[from] EmptySelection),
    /// The object store refused the run as configured (credentials, bucket, region): exit 2.
    #[error(transparent)]
    Source(SourceError),
    /// The listing broke off: the set of objects is unknown, so the run cannot succeed.
    #[error("listing failed: {0}")]
    Listing(#[from] ListingError),
    #[error(transparent)]
    Local(#[from] LocalError),
    #[error("timed out after {0:.0} s waiting for another hydrator working on this DEST (--lock-timeout)")]
    LockTimeout(f64),
    /// A blocking task panicked or was cancelled.
    #[error("{0}: {1}")]
    Task(&'static str, #[source] tokio::task::JoinError),
    #[error(transparent)]
    Warm(#[from] WarmError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// Asked to stop (a signal) before the end; the manifest keeps what was done.
    #[error("stopped before the end; a new run resumes")]
    Stopped,
    /// DEST's filesystem cannot hold the rest of the selection.
    #[error(transparent)]
    NoSpace(#[from] NoSpace),
    /// `--max-errors`: the failures are systematic, so the run stops early.
    #[error(transparent)]
    TooManyFailures(#[from] TooManyFailures),
}

/// `--max-errors N`: N objects failed one after the other and none succeeded in between, as
/// when a bucket policy refuses every GET. Going on would only fail the rest the same way.
#[derive(Debug, thiserror::Error)]
#[error("{max_errors} objects failed in a row and none succeeded since (--max-errors {max_errors}); first cause: {first}")]
pub struct TooManyFailures {
    pub max_errors: u64,
    /// The first failure of the run of failures: `KEY: reason`.
    pub first: String,
}

/// What kind of problem ended a run, for machines: the report's and the JSON closing line's
/// `error_kind`. Derived from the typed error, never from its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A bad option, URL or DEST, an empty selection, a missing bucket: exit 2.
    Usage,
    /// The source refused the credentials: none found, rejected, a wrong secret, anonymous
    /// requests refused, or not allowed to list.
    Credentials,
    /// The listing broke off.
    Listing,
    /// Objects failed (`--max-errors` included).
    ObjectsFailed,
    /// SIGTERM or SIGINT.
    Interrupted,
    NoSpace,
    /// A local filesystem operation failed, or another hydrator held DEST too long.
    Local,
    /// A task failed, or the daemon's answer.
    Internal,
}

impl SyncError {
    pub fn exit(&self) -> Exit {
        match self {
            SyncError::Usage(_)
            | SyncError::EmptySelection(_)
            | SyncError::Source(_)
            | SyncError::Warm(WarmError::Denied { .. })
            | SyncError::Lease(LeaseError::Denied { .. }) => Exit::Usage,
            SyncError::Listing(_)
            | SyncError::Local(_)
            | SyncError::LockTimeout(_)
            | SyncError::Task(..)
            | SyncError::Warm(_)
            | SyncError::Lease(_) => Exit::Failed,
            SyncError::TooManyFailures(_) => Exit::Failed,
            SyncError::Stopped => Exit::Stopped,
            SyncError::NoSpace(_) => Exit::NoSpace,
        }
    }

    /// The kind of problem, for the report's `error_kind`.
    pub fn kind(&self) -> ErrorKind {
        use SourceErrorKind::*;
        match self {
            SyncError::Source(err) => match err.kind {
                CredentialsRejected(_)
                | WrongSecretKey(_)
                | NoCredentials(_)
                | NotPublic(_)
                | AccessDenied(_) => ErrorKind::Credentials,
                _ => ErrorKind::Usage,
            },
            SyncError::Usage(_)
            | SyncError::EmptySelection(_)
            | SyncError::Warm(WarmError::Denied { .. })
            | SyncError::Lease(LeaseError::Denied { .. }) => ErrorKind::Usage,
            SyncError::Listing(_) => ErrorKind::Listing,
            SyncError::Local(_) | SyncError::LockTimeout(_) => ErrorKind::Local,
            SyncError::Task(..) | SyncError::Warm(_) | SyncError::Lease(_) => ErrorKind::Internal,
            SyncError::TooManyFailures(_) => ErrorKind::ObjectsFailed,
            SyncError::Stopped => ErrorKind::Interrupted,
            SyncError::NoSpace(_) => ErrorKind::NoSpace,
        }
    }
}

/// DEST's filesystem cannot hold what the run still has to write.
#[derive(Debug, thiserror::Error)]
pub enum NoSpace {
    /// Found before the bytes were fetched: what the selection listed so far still needs
    /// (at least; the listing may not have ended) against the free space.
    #[error("no room: needs {}, {} free on {}", crate::units::human_bytes(*.needs), crate::units::human_bytes(*.free), .mount.display())]
    Needs {
        needs: u64,
        free: u64,
        /// The mount point of DEST's filesystem.
        mount: PathBuf,
    },
    /// A write met a full disk (`ENOSPC`, `EDQUOT`): the run stops rather than fail every
    /// object after it.
    #[error("no room on {}: {key}: {cause}", .mount.display())]
    Full {
        mount: PathBuf,
        key: String,
        #[source]
        cause: Box<ObjectError>,
    },
}

/// Why fetching one part failed.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// The object no longer matches the pinned ETag: restart the whole object.
    #[error("object changed on the server during the download")]
    Changed,
    /// A request failed; its [`Remedy`] says whether another attempt can help.
    #[error(transparent)]
    Source(SourceError),
    /// The body broke, stalled or did not have the announced length: worth another attempt.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// The server answered another range than the one asked for: another attempt cannot help.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The parts' CRCs do not combine to the server's full-object checksum: the bytes received
    /// are not the bytes uploaded. The object is fetched again from scratch.
    #[error("the bytes received do not match the server's {algorithm} (expected {expected:x}, got {actual:x})")]
    ChecksumMismatch {
        algorithm: &'static str,
        expected: u64,
        actual: u64,
    },
    /// `--check-md5`: the object's bytes are not those its ETag's MD5 states. The object is
    /// fetched again from scratch.
    #[error(
        "the bytes received do not match the MD5 of the ETag (expected {expected}, got {actual})"
    )]
    Md5Mismatch { expected: String, actual: String },
    #[error("write failed: {0}")]
    Write(#[from] WriteError),
    #[error(transparent)]
    Local(#[from] LocalError),
    #[error("{last} (gave up after {attempts} attempts)")]
    GaveUp { attempts: u32, last: Box<PartError> },
    #[error("{0}: {1}")]
    Task(&'static str, #[source] tokio::task::JoinError),
}

impl PartError {
    /// Whether another attempt at the same part can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            PartError::Source(err) => err.remedy() == Remedy::Retry,
            PartError::Body(_) => true,
            // Not the answer to this GET; the next attempt goes on another connection.
            PartError::Protocol(ProtocolError::NoEtag) => true,
            _ => false,
        }
    }
}

impl From<SourceError> for PartError {
    fn from(err: SourceError) -> Self {
        match err.remedy() {
            Remedy::Restart => PartError::Changed,
            _ => PartError::Source(err),
        }
    }
}

/// A part body that is not what its response announced.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("body of {key} broke after {received} of {expected} bytes: {detail}")]
    Broke {
        key: String,
        received: u64,
        expected: u64,
        detail: String,
        #[source]
        cause: BoxError,
    },
    #[error("body of {key} ended after {received} of {expected} bytes")]
    Short {
        key: String,
        received: u64,
        expected: u64,
    },
    #[error("server sent more than the {expected} bytes asked for")]
    Long { expected: u64 },
    #[error("body of {key} too slow: {received} bytes in {seconds:.0} s")]
    TooSlow {
        key: String,
        received: u64,
        seconds: f64,
    },
    #[error("asked for {expected} bytes, server announced {announced}")]
    Announced { expected: u64, announced: i64 },
}

/// A response to a ranged GET that is not for the range asked for.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed Content-Range {0:?}")]
    MalformedContentRange(String),
    #[error("asked for bytes {first}-{last}, server sent {content_range:?}")]
    OtherRange {
        first: u64,
        last: u64,
        content_range: String,
    },
    #[error("the server ignored the Range header (no Content-Range in the response)")]
    RangeIgnored,
    #[error("the answer to a GET carries no ETag, so it cannot be shown to be for this object")]
    NoEtag,
}

/// A write of received bytes that failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("the destination's filesystem is full ({} free): {source}", free.map_or("?".into(), crate::units::human_bytes))]
    Full {
        free: Option<u64>,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(std::io::Error),
    #[error("writer stopped")]
    WriterStopped,
}

/// Why one object could not be mirrored.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error(transparent)]
    Part(#[from] PartError),
    #[error("the object changed on the server since the snapshot (snapshot ETag {etag})")]
    ChangedSinceSnapshot { etag: String },
    #[error(
        "its bytes do not match the sealed snapshot (BLAKE3 {got}, sealed {sealed}): not published"
    )]
    NotAsSealed { sealed: String, got: String },
    #[error("the object kept changing on the server ({restarts} restarts)")]
    KeptChanging { restarts: u32 },
    #[error(transparent)]
    Local(#[from] LocalError),
    /// The key cannot be a local path (`../`, absolute, NUL, too long).
    #[error("refused: {0}")]
    Refused(String),
    #[error("object task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl ObjectError {
    /// Whether a write met a full disk or quota (`ENOSPC`, `EDQUOT`): then every object after
    /// it would fail the same way.
    pub fn disk_full(&self) -> bool {
        match self {
            ObjectError::Part(part) => part.disk_full(),
            ObjectError::Local(local) => is_full(&local.source),
            _ => false,
        }
    }
}

impl PartError {
    /// Whether a write met a full disk or quota.
    pub fn disk_full(&self) -> bool {
        match self {
            PartError::GaveUp { last, .. } => last.disk_full(),
            PartError::Write(WriteError::Full { .. }) => true,
            PartError::Write(WriteError::Io(err)) => is_full(err),
            PartError::Local(local) => is_full(&local.source),
            _ => false,
        }
    }
}

fn is_full(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || matches!(err.kind(), StorageFull | QuotaExceeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(kind: SourceErrorKind) -> SyncError {
        SyncError::Source(SourceError {
            request: "listing s3://b/p/".into(),
            kind,
            cause: None,
        })
    }

    #[test]
    fn each_error_has_the_kind_the_report_names() {
        let answer = HttpAnswer {
            status: 403,
            code: "SignatureDoesNotMatch".into(),
            message: String::new(),
        };
        let no_space = NoSpace::Needs {
            needs: 2,
            free: 1,
            mount: "/d".into(),
        };
        let too_many = TooManyFailures {
            max_errors: 100,
            first: "k: GET k: access denied".into(),
        };
        let cases = [
            (
                source(SourceErrorKind::WrongSecretKey(answer.clone())),
                ErrorKind::Credentials,
            ),
            (
                source(SourceErrorKind::CredentialsRejected(answer.clone())),
                ErrorKind::Credentials,
            ),
            (
                source(SourceErrorKind::NoCredentials("none found".into())),
                ErrorKind::Credentials,
            ),
            (
                source(SourceErrorKind::AccessDenied(answer)),
                ErrorKind::Credentials,
            ),
            (source(SourceErrorKind::NoSuchBucket), ErrorKind::Usage),
            (UsageError::new("--part-size").into(), ErrorKind::Usage),
            (
                ListingError::NoContinuation {
                    url: "s3://b/p/".into(),
                }
                .into(),
                ErrorKind::Listing,
            ),
            (SyncError::Stopped, ErrorKind::Interrupted),
            (no_space.into(), ErrorKind::NoSpace),
            (too_many.into(), ErrorKind::ObjectsFailed),
            (SyncError::LockTimeout(3.0), ErrorKind::Local),
        ];
        for (err, kind) in cases {
            assert_eq!(err.kind(), kind, "{err}");
        }
        let stop: SyncError = TooManyFailures {
            max_errors: 5,
            first: String::new(),
        }
        .into();
        assert_eq!(stop.exit(), Exit::Failed, "--max-errors exits 1, not 3");
    }
}
