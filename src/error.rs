//! Error types of each layer and the exit codes an init container can trust.

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

/// Why a sync as a whole could not finish.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// The listing broke off: the set of objects is unknown, so the run cannot succeed.
    #[error("listing failed: {0}")]
    Listing(String),
    #[error("{0}")]
    Local(String),
    /// Asked to stop (a signal) before the end; the manifest keeps what was done.
    #[error("stopped before the end; a new run resumes")]
    Stopped,
}

impl SyncError {
    pub fn exit(&self) -> Exit {
        match self {
            SyncError::Usage(_) => Exit::Usage,
            SyncError::Listing(_) | SyncError::Local(_) => Exit::Failed,
            SyncError::Stopped => Exit::Stopped,
        }
    }
}

/// Why fetching one part failed.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// The object no longer matches the listing's ETag (HTTP 412): restart the whole object.
    #[error("object changed on the server during the download")]
    Changed,
    /// Worth another attempt: a truncated, stalled or reset body, a 5xx the SDK gave up on.
    #[error("{0}")]
    Retryable(String),
    /// The parts' CRCs do not combine to the server's full-object checksum: the bytes received
    /// are not the bytes uploaded. The object is fetched again from scratch.
    #[error("{0}")]
    ChecksumMismatch(String),
    /// Another attempt cannot help (object gone, access denied, disk error).
    #[error("{0}")]
    Fatal(String),
}
