//! Command line: every option of `sync` can also be set through an environment variable, as
//! init containers are usually configured that way.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, IoBackendChoice, ProgressMode, S3Url, SyncConfig};
use crate::error::UsageError;

#[derive(Debug, Parser)]
#[command(
    name = "hydrator",
    version,
    about = "Mirror S3 datasets onto local NVMe: parallel, verified, resumable."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More detail in the log (-v: debug, -vv: trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only warnings and errors (-q), only errors (-qq).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub quiet: u8,
    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "HYDRATOR_LOG_FORMAT",
        global = true
    )]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mirror every object under s3://BUCKET/PREFIX/ into DEST.
    Sync(SyncArgs),
    /// Start an S3 server in-process, seed it with a generated dataset and sync it.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Source: s3://BUCKET/PREFIX/ (keys are mirrored relative to PREFIX).
    pub source: String,
    /// Destination directory (created if missing).
    pub dest: PathBuf,
    #[command(flatten)]
    pub options: SyncOptions,
}

#[derive(Debug, Args)]
pub struct SyncOptions {
    /// S3 endpoint for MinIO, Ceph RGW, Garage... (default: AWS).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub endpoint_url: Option<String>,
    /// Region (default: the AWS chain; us-east-1 with a custom endpoint).
    #[arg(long, env = "AWS_REGION")]
    pub region: Option<String>,
    /// Path-style addressing (default: on when an endpoint is given).
    #[arg(long, env = "HYDRATOR_PATH_STYLE")]
    pub path_style: Option<bool>,
    /// Ranged GETs in flight.
    #[arg(long, env = "HYDRATOR_CONCURRENCY", default_value_t = config::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Part size: a power of two ≥ 1MiB (e.g. 8MiB, 16M, 1048576).
    #[arg(long, env = "HYDRATOR_PART_SIZE", default_value = "8MiB", value_parser = config::parse_size)]
    pub part_size: u64,
    /// Only paths (relative to PREFIX) matching one of these globs; repeatable, ';'-separated in the env.
    #[arg(long, env = "HYDRATOR_INCLUDE", value_delimiter = ';')]
    pub include: Vec<String>,
    /// Skip paths matching any of these globs; repeatable, ';'-separated in the env.
    #[arg(long, env = "HYDRATOR_EXCLUDE", value_delimiter = ';')]
    pub exclude: Vec<String>,
    /// Write backend: auto probes io_uring and falls back to pwrite.
    #[arg(long, value_enum, env = "HYDRATOR_IO_BACKEND", default_value = "auto")]
    pub io_backend: IoBackendChoice,
    /// Bypass the page cache (O_DIRECT) for datasets larger than memory.
    #[arg(long, env = "HYDRATOR_DIRECT_IO")]
    pub direct_io: bool,
    /// Write a JSON report here.
    #[arg(long, env = "HYDRATOR_REPORT")]
    pub report: Option<PathBuf>,
    /// Progress display: bars on a terminal, log lines otherwise.
    #[arg(long, value_enum, env = "HYDRATOR_PROGRESS", default_value = "auto")]
    pub progress: ProgressMode,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Directory for the server's data and the mirror (default: a temporary directory, removed
    /// afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Approximate size of the generated dataset.
    #[arg(long, default_value = "256MiB", value_parser = config::parse_size)]
    pub size: u64,
    /// Write backend used by the demo's sync.
    #[arg(long, value_enum, default_value = "auto")]
    pub io_backend: IoBackendChoice,
    /// Progress display.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
}

impl SyncArgs {
    pub fn into_config(self) -> Result<SyncConfig, UsageError> {
        let source = S3Url::parse(&self.source)?;
        let o = self.options;
        let endpoint = o.endpoint_url.filter(|e| !e.is_empty());
        let config = SyncConfig {
            path_style: o.path_style.unwrap_or(endpoint.is_some()),
            source,
            dest: self.dest,
            endpoint,
            region: o.region.filter(|r| !r.is_empty()),
            credentials: None,
            concurrency: o.concurrency,
            part_size: o.part_size,
            include: o.include,
            exclude: o.exclude,
            io_backend: o.io_backend,
            direct_io: o.direct_io,
            report: o.report,
            progress: o.progress,
        };
        config.validate()?;
        Ok(config)
    }
}
