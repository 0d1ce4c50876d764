//! The settings of a sync: [`SyncConfigBuilder`] gathers them from a front-end (the command
//! line, a daemon catalog entry, `warm --fallback`), fills in what follows from others and
//! validates them once; a [`SyncConfig`] that exists is valid. Defaults are in one place.
//!
//! Tuning constants live beside the code that uses them (client time-outs in
//! [`source::client`](crate::source::client), the write buffer size in
//! [`write::buffer`](crate::write::buffer), retry and restart budgets in `engine/`); those
//! below are the user-facing limits.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::UsageError;
use crate::plan::filter::KeyFilter;
use crate::plan::shard::Shard;
use crate::snapshot::Snapshot;
use crate::source::client::{ClientSettings, StaticCredentials};
use crate::source::url::S3Url;

pub(crate) const DEFAULT_PART_SIZE: u64 = 8 << 20;
pub(crate) const MIN_PART_SIZE: u64 = 1 << 20;
/// Requests in flight when a `--concurrency auto` run starts.
pub(crate) const AUTO_INITIAL_CONCURRENCY: usize = 4;
/// Most requests in flight `--concurrency auto` may climb to.
pub(crate) const AUTO_MAX_CONCURRENCY: usize = 64;
/// Most requests in flight a fixed `--concurrency` may ask for.
pub(crate) const MAX_CONCURRENCY: usize = 1024;
/// `--max-errors`' default: enough failures in a row that a few bad keys never stop a run,
/// few enough that a policy refusing every GET stops it within seconds.
pub(crate) const DEFAULT_MAX_ERRORS: u64 = 100;

/// The write backend asked for: `Auto` probes io_uring and falls back to pwrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoBackendChoice {
    Auto,
    IoUring,
    Pwrite,
}

/// When files are written with O_DIRECT (`--direct-io`).
///
/// A buffered write copies every byte into the page cache, and on a large file that copy is
/// the client's largest cost: against a near-free origin, 2 GiB in one file took 2.03–2.19
/// CPU-s buffered and 1.57–1.74 with O_DIRECT (`copy_folio_from_iter_atomic`, the page-cache
/// copy, was 43 % of the buffered profile). A training set larger than memory is evicted from
/// the cache before it is read again anyway. Files that fit one write buffer stay buffered by
/// default: O_DIRECT makes each of their writes wait for the device, and their cost is the
/// request, not the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectIo {
    /// O_DIRECT for files larger than a write buffer, where DEST's filesystem takes it.
    Auto,
    /// O_DIRECT for every file; a filesystem that refuses it is an error.
    Always,
    /// Through the page cache.
    Never,
}

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProgressMode {
    /// Bars on a terminal, log lines otherwise.
    Auto,
    Bar,
    Log,
    None,
}

/// Everything a sync needs, validated: only [`SyncConfigBuilder::build`] makes one.
#[derive(Clone, Debug)]
pub(crate) struct SyncConfig {
    pub source: S3Url,
    pub dest: PathBuf,
    client: ClientSettings,
    concurrency: Concurrency,
    part_size: u64,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// Only this share of the dataset (`--shard`).
    pub shard: Option<Shard>,
    pub io_backend: IoBackendChoice,
    pub direct_io: DirectIo,
    pub report: Option<PathBuf>,
    pub progress: ProgressMode,
    /// Remove local files that are not in the source (`--delete`).
    pub delete: bool,
    /// Longest wait for another hydrator working on DEST; `None` waits as long as it takes.
    pub lock_timeout: Option<Duration>,
    /// Hydrate exactly this snapshot instead of the live listing.
    pub snapshot: Option<Arc<Snapshot>>,
    /// A directory DEST lies in whose subdirectories down to DEST must be real ones (the
    /// daemon's cache root): they are opened without following a symlink.
    pub dest_anchor: Option<PathBuf>,
    /// Bytes a second the run may receive (`--max-bandwidth`).
    pub max_bandwidth: Option<u64>,
    /// GETs a second the run may send (`--max-requests-per-second`).
    pub max_requests_per_second: Option<f64>,
    /// Say what the run would do and write nothing (`--dry-run`).
    pub dry_run: bool,
    /// A selection that holds no object is a dataset, not a mistake (`--allow-empty`).
    pub allow_empty: bool,
    /// Check single-PUT objects against their ETag's MD5 (`--check-md5`).
    pub check_md5: bool,
    /// Stop after this many objects failed in a row, none succeeding in between
    /// (`--max-errors`); 0: never.
    pub max_errors: u64,
}

impl SyncConfig {
    /// A builder with the defaults for everything but what says where to read and write.
    pub(crate) fn builder(source: S3Url, dest: PathBuf) -> SyncConfigBuilder {
        SyncConfigBuilder {
            source,
            dest,
            endpoint: None,
            region: None,
            path_style: None,
            credentials: None,
            profile: None,
            anonymous: false,
            ca_bundle: None,
            no_verify_ssl: false,
            concurrency: Concurrency::Auto,
            part_size: DEFAULT_PART_SIZE,
            include: vec![],
            exclude: vec![],
            shard: None,
            io_backend: IoBackendChoice::Auto,
            direct_io: DirectIo::Auto,
            report: None,
            progress: ProgressMode::Auto,
            delete: false,
            lock_timeout: None,
            snapshot: None,
            max_bandwidth: None,
            max_requests_per_second: None,
            dry_run: false,
            allow_empty: false,
            check_md5: false,
            max_errors: DEFAULT_MAX_ERRORS,
        }
    }

    /// The paths the run takes: `--include`, `--exclude` and `--shard`.
    pub(crate) fn key_filter(&self) -> Result<KeyFilter, UsageError> {
        Ok(KeyFilter::new(&self.include, &self.exclude)?.in_shard(self.shard))
    }

    /// Where the S3 server is and how to talk to it.
    pub(crate) fn client_settings(&self) -> &ClientSettings {
        &self.client
    }

    pub(crate) fn concurrency(&self) -> Concurrency {
        self.concurrency
    }

    pub(crate) fn part_size(&self) -> u64 {
        self.part_size
    }

    /// Checks the settings. [`SyncConfigBuilder::build`] runs this, so every `SyncConfig` passes.
    fn validate(&self) -> Result<(), UsageError> {
        if self.max_bandwidth == Some(0) {
            return Err(UsageError::new("--max-bandwidth must be more than 0"));
        }
        if self
            .max_requests_per_second
            .is_some_and(|r| r.is_nan() || r <= 0.0)
        {
            return Err(UsageError::new(
                "--max-requests-per-second must be more than 0",
            ));
        }
        let client = &self.client;
        if client.no_verify_ssl && client.ca_bundle.is_some() {
            return Err(UsageError::new(
                "--no-verify-ssl checks no certificate, so --ca-bundle (or AWS_CA_BUNDLE) would change nothing: give one of them",
            ));
        }
        if client.anonymous && (client.credentials.is_some() || client.profile.is_some()) {
            return Err(UsageError::new(
                "--no-sign-request sends no credentials: give it without credentials or --profile",
            ));
        }
        if let Some(profile) = &client.profile {
            check_profile(profile)?;
        }
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
        if let Some(endpoint) = &self.client.endpoint {
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

/// The settings of a sync as a front-end gathers them; [`build`](Self::build) turns them into a
/// [`SyncConfig`].
#[derive(Clone, Debug)]
#[must_use]
pub(crate) struct SyncConfigBuilder {
    pub source: S3Url,
    pub dest: PathBuf,
    /// A custom S3 endpoint; `None`: AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Path-style addressing; `None`: on when an endpoint is given.
    pub path_style: Option<bool>,
    /// Static credentials; `None`: the standard AWS chain.
    pub credentials: Option<StaticCredentials>,
    /// A named profile for the standard chain.
    pub profile: Option<String>,
    /// Unsigned requests (`--no-sign-request`).
    pub anonymous: bool,
    /// A PEM file of certificates to trust besides the system's (`--ca-bundle`).
    pub ca_bundle: Option<PathBuf>,
    /// Accept any server certificate (`--no-verify-ssl`).
    pub no_verify_ssl: bool,
    pub concurrency: Concurrency,
    pub part_size: u64,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub shard: Option<Shard>,
    pub io_backend: IoBackendChoice,
    pub direct_io: DirectIo,
    pub report: Option<PathBuf>,
    pub progress: ProgressMode,
    pub delete: bool,
    pub lock_timeout: Option<Duration>,
    pub snapshot: Option<Arc<Snapshot>>,
    pub max_bandwidth: Option<u64>,
    pub max_requests_per_second: Option<f64>,
    pub dry_run: bool,
    pub allow_empty: bool,
    pub check_md5: bool,
    pub max_errors: u64,
}

impl SyncConfigBuilder {
    /// The validated config.
    pub(crate) fn build(self) -> Result<SyncConfig, UsageError> {
        let ca_bundle = match &self.ca_bundle {
            None => None,
            Some(file) => Some(read_ca_bundle(file)?),
        };
        let config = SyncConfig {
            client: ClientSettings {
                path_style: self.path_style.unwrap_or(self.endpoint.is_some()),
                endpoint: self.endpoint,
                region: self.region,
                credentials: self.credentials,
                profile: self.profile,
                anonymous: self.anonymous,
                ca_bundle,
                no_verify_ssl: self.no_verify_ssl,
                max_requests: self.concurrency.max(),
            },
            source: self.source,
            dest: self.dest,
            concurrency: self.concurrency,
            part_size: self.part_size,
            include: self.include,
            exclude: self.exclude,
            shard: self.shard,
            io_backend: self.io_backend,
            direct_io: self.direct_io,
            report: self.report,
            progress: self.progress,
            delete: self.delete,
            lock_timeout: self.lock_timeout,
            snapshot: self.snapshot,
            dest_anchor: None,
            max_bandwidth: self.max_bandwidth,
            max_requests_per_second: self.max_requests_per_second,
            dry_run: self.dry_run,
            allow_empty: self.allow_empty,
            check_md5: self.check_md5,
            max_errors: self.max_errors,
        };
        config.validate()?;
        Ok(config)
    }
}

/// A `--profile` that no shared AWS file defines is a usage error that names it, rather than
/// the credential chain's "none found" after the first request.
fn check_profile(name: &str) -> Result<(), UsageError> {
    use aws_runtime::env_config::file::EnvConfigFiles;
    use aws_types::os_shim_internal::{Env, Fs};
    let files = EnvConfigFiles::default();
    // The loader reads the files with std::fs: nothing in it needs a runtime.
    let loaded = futures::executor::block_on(aws_config::profile::load(
        &Fs::real(),
        &Env::real(),
        &files,
        None,
    ));
    let known = match loaded {
        Ok(set) if set.get_profile(name).is_some() => return Ok(()),
        Ok(set) => set.profiles().map(str::to_string).collect::<Vec<_>>(),
        Err(err) => {
            return Err(UsageError::new(format!(
                "--profile {name}: the AWS config files cannot be read: {err}"
            )))
        }
    };
    let defined = match known.is_empty() {
        true => "they define no profile".to_string(),
        false => format!("they define {}", known.join(", ")),
    };
    Err(UsageError::new(format!(
        "--profile {name} (or AWS_PROFILE): no such profile in the AWS config and credentials files (AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE; by default ~/.aws/config and ~/.aws/credentials): {defined}"
    )))
}

/// The certificates of a `--ca-bundle` file: PEM with at least one certificate.
pub(crate) fn read_ca_bundle(file: &std::path::Path) -> Result<Vec<u8>, UsageError> {
    let bad = |why: String| UsageError::new(format!("--ca-bundle {}: {why}", file.display()));
    let pem = std::fs::read(file).map_err(|e| bad(e.to_string()))?;
    match pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
        true => Ok(pem),
        false => Err(bad(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        )),
    }
}

/// Requests in flight: adapted to what the run measures, or fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Concurrency {
    Auto,
    Fixed(usize),
}

impl Concurrency {
    /// The requests in flight a run starts with.
    pub(crate) fn initial(self) -> usize {
        match self {
            Self::Auto => AUTO_INITIAL_CONCURRENCY,
            Self::Fixed(n) => n,
        }
    }

    /// The most requests in flight a run can reach.
    pub(crate) fn max(self) -> usize {
        match self {
            Self::Auto => AUTO_MAX_CONCURRENCY,
            Self::Fixed(n) => n,
        }
    }
}

/// A `--concurrency` that is neither `auto` nor a number.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is neither auto nor a number")]
pub(crate) struct BadConcurrency(String);

/// Parses `--concurrency`: `auto` or a number.
pub(crate) fn parse_concurrency(text: &str) -> Result<Concurrency, BadConcurrency> {
    match text.trim() {
        "auto" => Ok(Concurrency::Auto),
        n => n
            .parse()
            .map(Concurrency::Fixed)
            .map_err(|_| BadConcurrency(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> SyncConfigBuilder {
        SyncConfig::builder(S3Url::parse("s3://bucket/data").unwrap(), "/dest".into())
    }

    #[test]
    fn path_style_follows_the_endpoint_unless_set() {
        let path_style = |b: SyncConfigBuilder| b.build().unwrap().client.path_style;
        assert!(!path_style(builder()));
        let custom = SyncConfigBuilder {
            endpoint: Some("http://127.0.0.1:9000".into()),
            ..builder()
        };
        assert!(path_style(custom.clone()));
        let virtual_hosted = SyncConfigBuilder {
            path_style: Some(false),
            ..custom
        };
        assert!(!path_style(virtual_hosted));
    }

    #[test]
    fn build_validates() {
        let bad = [
            SyncConfigBuilder {
                part_size: 3 << 20,
                ..builder()
            },
            SyncConfigBuilder {
                concurrency: Concurrency::Fixed(0),
                ..builder()
            },
            SyncConfigBuilder {
                endpoint: Some("minio:9000".into()),
                ..builder()
            },
        ];
        for b in bad {
            assert!(b.clone().build().is_err(), "{b:?}");
        }
        let config = builder().build().unwrap();
        assert_eq!(config.client_settings().max_requests, AUTO_MAX_CONCURRENCY);
    }

    #[test]
    fn parses_concurrency() {
        assert_eq!(parse_concurrency(" auto").unwrap(), Concurrency::Auto);
        assert_eq!(parse_concurrency("16").unwrap(), Concurrency::Fixed(16));
        assert_eq!(
            parse_concurrency("lots").unwrap_err().to_string(),
            "\"lots\" is neither auto nor a number"
        );
    }
}
