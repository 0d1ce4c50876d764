//! Validated settings for a sync, with their defaults in one place.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::UsageError;

pub const DEFAULT_PART_SIZE: u64 = 8 << 20;
pub const MIN_PART_SIZE: u64 = 1 << 20;
/// Most requests in flight `--concurrency auto` may climb to.
pub const AUTO_MAX_CONCURRENCY: usize = 64;
/// Most requests in flight a fixed `--concurrency` may ask for.
pub const MAX_CONCURRENCY: usize = 1024;
/// Size of one pooled write buffer. Parts stream through several of these.
pub const WRITE_BUFFER_SIZE: usize = 1 << 20;
/// Pool buffers per in-flight GET: one being filled, one queued at a writer.
pub const BUFFERS_PER_REQUEST: usize = 2;
/// Spare buffers so that writers never idle while GETs refill.
pub const SPARE_BUFFERS: usize = 4;
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
pub const STALL_GRACE: Duration = Duration::from_secs(5);
/// Times an object is restarted from scratch after it changed on the server mid-download.
pub const MAX_OBJECT_RESTARTS: u32 = 3;
/// Attempts per part for errors the SDK does not retry (body truncation, stall, reset).
pub const MAX_PART_ATTEMPTS: u32 = 6;
/// SDK attempts per request (5xx, throttling, connection errors before the body).
pub const SDK_MAX_ATTEMPTS: u32 = 5;
pub const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// A part body slower than this (bytes per second of waiting on the network), once
/// [`SLOW_BODY_GRACE`] of waiting has passed, is abandoned and retried: a slow-loris body
/// passes the SDK's stalled-stream check, which needs only 1 byte per second.
pub const MIN_BODY_RATE: u64 = 64 << 10;
pub const SLOW_BODY_GRACE: Duration = Duration::from_secs(10);

/// `s3://bucket/prefix/`: the prefix, if not empty, always ends with `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    pub prefix: String,
}

impl S3Url {
    pub fn parse(url: &str) -> Result<Self, UsageError> {
        let bad = |why: &str| UsageError::new(format!("invalid source URL {url:?}: {why}"));
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("expected s3://BUCKET/PREFIX/"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("the bucket name is missing"));
        }
        validate_bucket_name(bucket).map_err(|why| bad(&why))?;
        if prefix.contains('\0') {
            return Err(bad("the prefix contains a NUL byte"));
        }
        let mut prefix = prefix.to_string();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Self {
            bucket: bucket.to_string(),
            prefix,
        })
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// S3 bucket naming rules (3–63 characters of lowercase letters, digits, `.` and `-`,
/// starting and ending with a letter or digit). Underscores and capitals are accepted too,
/// as some on-premise servers allow legacy names.
fn validate_bucket_name(name: &str) -> Result<(), String> {
    if !(3..=63).contains(&name.len()) {
        return Err(format!(
            "bucket name {name:?} must be 3 to 63 characters long"
        ));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if !name.chars().all(ok_char) {
        return Err(format!(
            "bucket name {name:?} may only hold letters, digits, '.', '-' and '_'"
        ));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(name.chars().next()) || !edge_ok(name.chars().last()) {
        return Err(format!(
            "bucket name {name:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IoBackendChoice {
    Auto,
    IoUring,
    Pwrite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    Auto,
    Bar,
    Log,
    None,
}

/// Static credentials, for the embedded demo server; the CLI uses the standard AWS chain.
#[derive(Clone, Debug)]
pub struct StaticCredentials {
    pub access_key: String,
    pub secret_key: String,
}

/// Everything a sync needs, validated.
#[derive(Clone, Debug)]
pub struct SyncConfig {
    pub source: S3Url,
    pub dest: PathBuf,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub path_style: bool,
    pub credentials: Option<StaticCredentials>,
    pub concurrency: Concurrency,
    pub part_size: u64,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub io_backend: IoBackendChoice,
    pub direct_io: bool,
    pub report: Option<PathBuf>,
    pub progress: ProgressMode,
    /// Remove local files that are not in the source (`--delete`).
    pub delete: bool,
    /// Longest wait for another hydrator working on DEST; `None` waits as long as it takes.
    pub lock_timeout: Option<Duration>,
    /// Hydrate exactly this snapshot instead of the live listing.
    pub snapshot: Option<std::sync::Arc<crate::snapshot::Snapshot>>,
}

impl SyncConfig {
    /// A config with the defaults for everything but what says where to read and write.
    pub fn new(source: S3Url, dest: PathBuf) -> Self {
        Self {
            source,
            dest,
            endpoint: None,
            region: None,
            path_style: false,
            credentials: None,
            concurrency: Concurrency::Auto,
            part_size: DEFAULT_PART_SIZE,
            include: vec![],
            exclude: vec![],
            io_backend: IoBackendChoice::Auto,
            direct_io: false,
            report: None,
            progress: ProgressMode::Auto,
            delete: false,
            lock_timeout: None,
            snapshot: None,
        }
    }

    /// What the manifest records as the dataset's source.
    pub fn source_info(&self) -> crate::manifest::journal::SourceInfo {
        crate::manifest::journal::SourceInfo {
            endpoint: self.endpoint.clone(),
            bucket: self.source.bucket.clone(),
            prefix: self.source.prefix.clone(),
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            snapshot: self.snapshot.as_ref().map(|s| s.digest.clone()),
        }
    }

    pub fn validate(&self) -> Result<(), UsageError> {
        if self.part_size < MIN_PART_SIZE || !self.part_size.is_power_of_two() {
            return Err(UsageError::new(format!(
                "--part-size {} must be a power of two of at least 1 MiB (1048576)",
                self.part_size
            )));
        }
        if let Concurrency::Fixed(n) = self.concurrency {
            if !(1..=MAX_CONCURRENCY).contains(&n) {
                return Err(UsageError::new(format!(
                    "--concurrency {n} must be auto or between 1 and {MAX_CONCURRENCY}"
                )));
            }
        }
        if let Some(endpoint) = &self.endpoint {
            let ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !ok || endpoint.len() <= "https://".len() {
                return Err(UsageError::new(format!(
                    "--endpoint-url {endpoint:?} must be an http:// or https:// URL"
                )));
            }
        }
        Ok(())
    }
}

/// Requests in flight: adapted to what the run measures, or fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concurrency {
    Auto,
    Fixed(usize),
}

impl Concurrency {
    /// The requests in flight a run starts with.
    pub fn initial(self) -> usize {
        match self {
            Self::Auto => crate::engine::adaptive::INITIAL,
            Self::Fixed(n) => n,
        }
    }

    /// The most requests in flight a run can reach.
    pub fn max(self) -> usize {
        match self {
            Self::Auto => AUTO_MAX_CONCURRENCY,
            Self::Fixed(n) => n,
        }
    }
}

/// Parses `--concurrency`: `auto` or a number.
pub fn parse_concurrency(text: &str) -> Result<Concurrency, String> {
    match text.trim() {
        "auto" => Ok(Concurrency::Auto),
        n => n
            .parse()
            .map(Concurrency::Fixed)
            .map_err(|_| format!("{text:?} is neither auto nor a number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = S3Url::parse("s3://my-bucket/data/train").unwrap();
        assert_eq!(u.bucket, "my-bucket");
        assert_eq!(u.prefix, "data/train/");
        assert_eq!(S3Url::parse("s3://my-bucket").unwrap().prefix, "");
        assert_eq!(S3Url::parse("s3://my-bucket/").unwrap().prefix, "");
        for bad in [
            "my-bucket/x",
            "s3://",
            "s3:///x",
            "s3://ab/x",
            "s3://Bad Bucket/",
            "http://b/x",
        ] {
            assert!(S3Url::parse(bad).is_err(), "{bad}");
        }
    }
}
