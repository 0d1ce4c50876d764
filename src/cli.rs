//! Command line: every option of `sync` can also be set through an environment variable, as
//! init containers are usually configured that way. The settings' own types know nothing of
//! clap; their command-line side (value enums, value parsers) is here, and the options go into a
//! [`SyncConfigBuilder`].

use std::path::PathBuf;

use clap::builder::PossibleValue;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, DirectIo, IoBackendChoice, ProgressMode, SyncConfig, SyncConfigBuilder};
use crate::console::Format;
use crate::error::UsageError;
use crate::source::mc_alias::McAlias;
use crate::source::url::CliSource;

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
        hide_env_values = true,
        global = true
    )]
    pub log_format: Format,
}

/// The command-line values of the settings' enums: their variants' names in kebab case.
macro_rules! value_enum {
    ($type:ident { $($variant:ident => $value:literal),+ $(,)? }) => {
        impl ValueEnum for $type {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($type::$variant),+]
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(PossibleValue::new(match self {
                    $($type::$variant => $value),+
                }))
            }
        }
    };
}

value_enum!(Format { Text => "text", Json => "json" });

/// Parses `--direct-io`: auto, always or never; a yes/no answer (the flag's earlier form, as
/// `HYDRATOR_DIRECT_IO=true`) means always or never.
fn parse_direct_io(text: &str) -> Result<DirectIo, BadDirectIo> {
    match text.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(DirectIo::Auto),
        "always" | "true" | "yes" | "on" | "1" => Ok(DirectIo::Always),
        "never" | "false" | "no" | "off" | "0" => Ok(DirectIo::Never),
        other => Err(BadDirectIo(other.to_string())),
    }
}

/// A `--direct-io` value that is none of the accepted words.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected auto, always or never")]
pub struct BadDirectIo(String);
value_enum!(IoBackendChoice { Auto => "auto", IoUring => "io-uring", Pwrite => "pwrite" });
value_enum!(ProgressMode { Auto => "auto", Bar => "bar", Log => "log", None => "none" });

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mirror every object under s3://BUCKET/PREFIX/ (or an mc alias's ALIAS/BUCKET/PREFIX/) into
    /// DEST.
    #[command(override_usage = "hydrator sync [OPTIONS] <SOURCE DEST | --snapshot FILE DEST>")]
    Sync(SyncArgs),
    /// Re-hash every file in DEST against its manifest, and fail a DEST without READY (saying
    /// how much of the dataset it holds); --repair fetches bad and missing files again.
    Verify(VerifyArgs),
    /// Freeze the listing of s3://BUCKET/PREFIX/ into a file that `sync --snapshot` hydrates.
    Snapshot(SnapshotArgs),
    /// Run the node cache daemon: keep the catalog's datasets warm and share them between jobs.
    Daemon(DaemonArgs),
    /// Ask the node daemon for a dataset; print its ready directory (exit 0 only when ready).
    Warm(WarmArgs),
    /// Hold a lease on a dataset's snapshot while this process runs (a pod's sidecar): renew
    /// it, release it on SIGTERM.
    Lease(LeaseArgs),
    /// Run the CSI node plugin: serve datasets to pods as read-only inline volumes.
    Csi(CsiArgs),
    /// Hold the connections of the CSI plugin's lazy views, so that they outlive the plugin's
    /// restarts (a DaemonSet of its own, beside the plugin's).
    CsiKeeper(CsiKeeperArgs),
    /// Run the controller of a Kueue AdmissionCheck: warm a workload's datasets on the nodes
    /// its pods will run on before Kueue admits it, and label the nodes with what they hold.
    Admission(AdmissionArgs),
    /// Mount s3://BUCKET/PREFIX/ read-only at MOUNTPOINT at once, hydrating it into --cache DIR
    /// meanwhile: files opened first are fetched first; local files read at local speed.
    #[command(
        override_usage = "hydrator mount [OPTIONS] --cache DIR <SOURCE MOUNTPOINT | --snapshot FILE MOUNTPOINT>"
    )]
    Mount(MountArgs),
    /// Print a completion script for SHELL (e.g. `hydrator completions bash >
    /// /etc/bash_completion.d/hydrator`).
    Completions(CompletionsArgs),
    /// Write the manual pages (hydrator.1 and one per subcommand) into DIR.
    Man(ManArgs),
    /// Start an S3 server in-process, seed it with a generated dataset and sync it.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Where to write the pages (created if missing).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The catalog (TOML): cache root and quota, listeners, datasets. SIGHUP reloads it.
    #[arg(long, env = "HYDRATOR_CONFIG", hide_env_values = true)]
    pub config: PathBuf,
}

/// Where the node daemon is and how to reach it.
#[derive(Debug, Args)]
pub struct DaemonConnection {
    /// The daemon: unix:///PATH/TO/SOCKET or http://HOST:PORT.
    #[arg(
        long,
        env = "HYDRATOR_DAEMON",
        hide_env_values = true,
        default_value = "unix:///run/hydrator/hydrator.sock"
    )]
    pub daemon: String,
    /// File holding the bearer token (needed over http://).
    #[arg(long, env = "HYDRATOR_TOKEN_FILE", hide_env_values = true)]
    pub token_file: Option<PathBuf>,
    /// How long to keep asking a daemon that is not there (socket missing or connection
    /// refused, as while it restarts) before falling back or giving up.
    #[arg(
        long,
        env = "HYDRATOR_DAEMON_WAIT",
        hide_env_values = true,
        default_value_t = 60,
        value_name = "SECONDS"
    )]
    pub daemon_wait: u64,
}

#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// The dataset's name in the daemon's catalog.
    pub name: String,
    /// Who holds the lease (e.g. the pod UID; `warm --lease-holder` takes it first).
    #[arg(long, env = "HYDRATOR_LEASE_HOLDER", hide_env_values = true)]
    pub holder: String,
    /// Lease length in seconds: it is renewed every third of it, so a pod that dies without
    /// releasing pins its snapshot for at most this long.
    #[arg(
        long,
        env = "HYDRATOR_LEASE_TTL",
        hide_env_values = true,
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub ttl: u64,
    /// The ready directory `warm --path-file` wrote: its snapshot is the one leased, so the
    /// files the pod reads are the files pinned.
    #[arg(long, env = "HYDRATOR_PATH_FILE", hide_env_values = true)]
    pub path_file: Option<PathBuf>,
    #[command(flatten)]
    pub connection: DaemonConnection,
}

#[derive(Debug, Args)]
pub struct CsiArgs {
    /// Where the kubelet talks to the plugin.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        hide_env_values = true,
        default_value = "unix:///csi/csi.sock"
    )]
    pub endpoint: String,
    /// This node's name (the kubelet's node name).
    #[arg(long, env = "NODE_NAME", hide_env_values = true)]
    pub node_id: String,
    /// The driver name pods use in their `csi:` volumes.
    #[arg(
        long,
        env = "HYDRATOR_CSI_DRIVER",
        hide_env_values = true,
        default_value = "cache.hydrator.dev"
    )]
    pub driver_name: String,
    /// Where published volumes are recorded (a hostPath, kept across restarts).
    #[arg(
        long,
        env = "HYDRATOR_CSI_STATE",
        hide_env_values = true,
        default_value = "/var/lib/hydrator-csi"
    )]
    pub state_dir: PathBuf,
    /// The kubelet's pods directory: the plugin mounts and unmounts only under it.
    #[arg(
        long,
        env = "HYDRATOR_CSI_PODS_DIR",
        hide_env_values = true,
        default_value = "/var/lib/kubelet/pods"
    )]
    pub pods_dir: PathBuf,
    /// The kubelet's plugin registry (its /var/lib/kubelet/plugins_registry, mounted): the
    /// plugin registers itself there with the kubelet, no registrar sidecar needed.
    #[arg(long, env = "HYDRATOR_CSI_REGISTRATION_DIR", hide_env_values = true)]
    pub registration_dir: Option<PathBuf>,
    /// The plugin's socket as the kubelet (the host) sees it, told to the kubelet at
    /// registration [default: /var/lib/kubelet/plugins/DRIVER_NAME/csi.sock].
    #[arg(long, env = "HYDRATOR_CSI_KUBELET_ENDPOINT", hide_env_values = true)]
    pub kubelet_endpoint: Option<PathBuf>,
    /// The socket of `hydrator csi-keeper`, which holds the lazy views' connections: with it,
    /// a lazy view outlives a restart, an upgrade or a rollout of the plugin; without it, a
    /// lazy view ends (ENOTCONN) with the plugin's process.
    #[arg(long, env = "HYDRATOR_CSI_KEEPER", hide_env_values = true)]
    pub keeper_socket: Option<PathBuf>,
    #[command(flatten)]
    pub connection: DaemonConnection,
}

#[derive(Debug, Args)]
pub struct AdmissionArgs {
    /// The `spec.controllerName` of the AdmissionChecks this controller serves.
    #[arg(long, default_value = "hydrator.dev/prewarm")]
    pub controller_name: String,
    /// The bearer token the node daemons know this controller by (a `listen.tokens` entry of
    /// their catalog).
    #[arg(long, env = "HYDRATOR_TOKEN_FILE", hide_env_values = true)]
    pub token_file: PathBuf,
    /// The namespace of the node cache's DaemonSet.
    #[arg(long, default_value = "hydrator-system")]
    pub daemon_namespace: String,
    /// The label selector of the DaemonSet's pods.
    #[arg(long, default_value = "app.kubernetes.io/name=hydrator")]
    pub daemon_selector: String,
    /// The daemons' API port on their pod's IP.
    #[arg(long, default_value_t = 7070)]
    pub daemon_port: u16,
    /// How many nodes may fetch from the store at once, cluster-wide (a dataset that comes
    /// through Dragonfly peers counts once, however many nodes fetch it).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub warm_budget: u32,
    /// How long a workload may hold its reserved quota while its datasets warm, in seconds:
    /// then it gives the quota back to the queue (Retry) while its nodes hydrate on.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub hold_seconds: u64,
    /// Seconds between rounds (each asks every node's daemon what it holds); a change to a
    /// Workload, a Node or a daemon starts one sooner.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval_seconds: u64,
    /// The CSI driver's name in pods' `csi:` volumes.
    #[arg(long, default_value = "cache.hydrator.dev")]
    pub driver_name: String,
}

#[derive(Debug, Args)]
pub struct CsiKeeperArgs {
    /// Where the plugin hands over and takes back the views' connections (the directory is
    /// made the keeper's user's alone).
    #[arg(
        long,
        env = "HYDRATOR_CSI_KEEPER",
        hide_env_values = true,
        default_value = "/run/hydrator-keeper/keeper.sock"
    )]
    pub socket: PathBuf,
}

#[derive(Debug, Args)]
pub struct WarmArgs {
    /// The dataset's name in the daemon's catalog.
    pub name: String,
    #[command(flatten)]
    pub connection: DaemonConnection,
    /// Wait until the dataset is ready (or failed), showing progress; during a refresh, wait
    /// for the new snapshot (without it, the snapshot held meanwhile is served at once).
    #[arg(long, env = "HYDRATOR_WAIT", hide_env_values = true, value_parser = clap::builder::BoolishValueParser::new())]
    pub wait: bool,
    /// Give up waiting after this many seconds.
    #[arg(long, env = "HYDRATOR_WAIT_TIMEOUT", hide_env_values = true)]
    pub timeout: Option<u64>,
    /// Lease the ready snapshot for this holder (e.g. the pod UID) so it is not evicted.
    #[arg(long, env = "HYDRATOR_LEASE_HOLDER", hide_env_values = true)]
    pub lease_holder: Option<String>,
    /// Lease length in seconds (default: the daemon's).
    #[arg(long, env = "HYDRATOR_LEASE_TTL", hide_env_values = true)]
    pub lease_ttl: Option<u64>,
    /// Also write the ready directory into this file (for a trainer in another container).
    #[arg(long, env = "HYDRATOR_PATH_FILE", hide_env_values = true)]
    pub path_file: Option<PathBuf>,
    /// When no daemon answers, sync SOURCE into DEST directly (then DEST is printed).
    #[arg(long, num_args = 2, value_names = ["SOURCE", "DEST"], env = "HYDRATOR_FALLBACK", hide_env_values = true, value_delimiter = ' ')]
    pub fallback: Vec<String>,
    /// Options of the fallback sync.
    #[command(flatten)]
    pub options: SyncOptions,
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// SOURCE DEST: s3://BUCKET/PREFIX/ or ALIAS/BUCKET/PREFIX/ with an mc alias (MC_HOST_ALIAS
    /// or ~/.mc/config.json; keys are mirrored relative to PREFIX) and the destination directory
    /// (created if missing). With --snapshot, DEST only.
    #[arg(required = true, num_args = 1..=2, value_names = ["SOURCE", "DEST"])]
    pub paths: Vec<String>,
    /// Hydrate exactly the objects recorded in this snapshot file (see `hydrator snapshot`).
    #[arg(long, env = "HYDRATOR_SNAPSHOT", hide_env_values = true)]
    pub snapshot: Option<PathBuf>,
    /// Print what would be downloaded, resumed, skipped and deleted, with bytes, and write
    /// nothing (not even DEST or DEST/.hydrator).
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    #[command(flatten)]
    pub options: SyncOptions,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    /// SOURCE MOUNTPOINT: s3://BUCKET/PREFIX/ (or ALIAS/BUCKET/PREFIX/ with an mc alias) and the
    /// empty directory to mount the view on.
    /// With --snapshot, MOUNTPOINT only.
    #[arg(required = true, num_args = 1..=2, value_names = ["SOURCE", "MOUNTPOINT"])]
    pub paths: Vec<String>,
    /// Where the data is hydrated: a DEST as for `sync` (resumable; READY once complete).
    #[arg(
        long,
        env = "HYDRATOR_CACHE",
        hide_env_values = true,
        value_name = "DIR"
    )]
    pub cache: PathBuf,
    /// Mount exactly the objects recorded in this snapshot file (see `hydrator snapshot`).
    #[arg(long, env = "HYDRATOR_SNAPSHOT", hide_env_values = true)]
    pub snapshot: Option<PathBuf>,
    /// Let every user read the view, not only the one who mounted it.
    #[arg(long, env = "HYDRATOR_ALLOW_OTHER", hide_env_values = true, value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_other: bool,
    /// Serve reads of local files from hydrator instead of handing them to the kernel (FUSE
    /// passthrough): slower, for kernels whose passthrough misbehaves.
    #[arg(long, env = "HYDRATOR_NO_PASSTHROUGH", hide_env_values = true, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_passthrough: bool,
    /// Open a file only once it is whole and verified: no byte of a file still downloading
    /// is read before the whole-file checks (BLAKE3 against a seal, the server's full-object
    /// checksum, --check-md5) have passed.
    #[arg(long, env = "HYDRATOR_NO_STREAM_UNCHECKED", hide_env_values = true, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_stream_unchecked: bool,
    #[command(flatten)]
    pub options: SyncOptions,
}

impl MountArgs {
    /// The sync the view runs (into --cache) and where it is mounted.
    pub(crate) fn into_config(self) -> Result<(SyncConfig, PathBuf), UsageError> {
        let cache = self.cache.to_string_lossy().into_owned();
        let (paths, mountpoint) = match (&self.snapshot, self.paths.as_slice()) {
            (Some(_), [mountpoint]) => (vec![cache], mountpoint),
            (Some(_), _) => return Err(UsageError::new("with --snapshot, give only MOUNTPOINT")),
            (None, [source, mountpoint]) => (vec![source.clone(), cache], mountpoint),
            (None, _) => {
                return Err(UsageError::new(
                    "expected SOURCE and MOUNTPOINT (or --snapshot FILE MOUNTPOINT)",
                ))
            }
        };
        let mountpoint = PathBuf::from(mountpoint);
        let sync = SyncArgs {
            paths,
            snapshot: self.snapshot,
            dry_run: false,
            options: self.options,
        };
        Ok((sync.into_config()?, mountpoint))
    }
}

/// Where the S3 server is.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "S3 connection")]
pub struct ConnectionOptions {
    /// S3 endpoint for MinIO, Ceph RGW, Garage... (default: AWS).
    #[arg(long, env = "AWS_ENDPOINT_URL", hide_env_values = true)]
    pub endpoint_url: Option<String>,
    /// Region (default: the AWS chain; us-east-1 with a custom endpoint).
    #[arg(long, env = "AWS_REGION", hide_env_values = true)]
    pub region: Option<String>,
    /// Path-style addressing (default: on when an endpoint is given).
    #[arg(long, env = "HYDRATOR_PATH_STYLE", hide_env_values = true)]
    pub path_style: Option<bool>,
    /// A named profile of ~/.aws/config and ~/.aws/credentials (default: AWS_PROFILE, then
    /// "default").
    #[arg(long, env = "AWS_PROFILE", hide_env_values = true)]
    pub profile: Option<String>,
    /// Send requests unsigned, for public buckets (open data).
    #[arg(long, env = "HYDRATOR_NO_SIGN_REQUEST", hide_env_values = true, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_sign_request: bool,
    /// PEM file of CA certificates to trust besides the system's (an in-house CA for an
    /// on-prem HTTPS endpoint). SSL_CERT_FILE replaces the system's roots instead.
    #[arg(long, env = "AWS_CA_BUNDLE", hide_env_values = true)]
    pub ca_bundle: Option<PathBuf>,
    /// Accept any server certificate (warned on every run): a test endpoint with a
    /// self-signed certificate. Prefer --ca-bundle.
    #[arg(long, env = "HYDRATOR_NO_VERIFY_SSL", hide_env_values = true, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_verify_ssl: bool,
}

#[derive(Debug, Args)]
pub struct SyncOptions {
    #[command(flatten)]
    pub connection: ConnectionOptions,
    /// Bytes a second to receive at most, across all requests (e.g. 500MiB): leaves room on a
    /// network shared with training traffic.
    #[arg(long, env = "HYDRATOR_MAX_BANDWIDTH", hide_env_values = true, value_parser = crate::units::parse_size, value_name = "RATE", help_heading = "Transfer")]
    pub max_bandwidth: Option<u64>,
    /// GET requests a second to send at most, across all requests.
    #[arg(
        long,
        env = "HYDRATOR_MAX_REQUESTS_PER_SECOND",
        hide_env_values = true,
        value_name = "N",
        help_heading = "Transfer"
    )]
    pub max_requests_per_second: Option<f64>,
    /// Ranged GETs in flight: auto (start at 4 full parts' worth, climb while throughput
    /// grows, up to 64; GETs under 8 MiB weigh less) or a fixed number.
    #[arg(long, env = "HYDRATOR_CONCURRENCY", hide_env_values = true, default_value = "auto", value_parser = config::parse_concurrency, help_heading = "Transfer")]
    pub(crate) concurrency: config::Concurrency,
    /// Part size: a power of two ≥ 1MiB (e.g. 8MiB, 16M, 1048576).
    #[arg(long, env = "HYDRATOR_PART_SIZE", hide_env_values = true, default_value = "8MiB", value_parser = crate::units::parse_size, help_heading = "Transfer")]
    pub part_size: u64,
    /// Only paths (relative to PREFIX) matching one of these globs; repeatable, ';'-separated in the env.
    #[arg(
        long,
        env = "HYDRATOR_INCLUDE",
        hide_env_values = true,
        value_delimiter = ';',
        help_heading = "Filters"
    )]
    pub include: Vec<String>,
    /// Skip paths matching any of these globs; repeatable, ';'-separated in the env.
    #[arg(
        long,
        env = "HYDRATOR_EXCLUDE",
        hide_env_values = true,
        value_delimiter = ';',
        help_heading = "Filters"
    )]
    pub exclude: Vec<String>,
    /// Only this share of the dataset, INDEX/COUNT (e.g. 2/8): the objects whose path hashes to
    /// INDEX. The COUNT shares are disjoint and together the whole dataset; they hold about as
    /// many objects each, not as many bytes.
    #[arg(
        long,
        env = "HYDRATOR_SHARD",
        hide_env_values = true,
        value_name = "INDEX/COUNT",
        help_heading = "Filters"
    )]
    pub(crate) shard: Option<crate::plan::shard::Shard>,
    /// Write backend: auto probes io_uring and falls back to pwrite.
    #[arg(
        long,
        value_enum,
        env = "HYDRATOR_IO_BACKEND",
        hide_env_values = true,
        default_value = "auto",
        help_heading = "Transfer"
    )]
    pub io_backend: IoBackendChoice,
    /// Write with O_DIRECT, past the page cache: auto (files larger than a write buffer, where
    /// DEST's filesystem takes it), always (every file; `--direct-io` alone), never.
    #[arg(
        long,
        env = "HYDRATOR_DIRECT_IO",
        hide_env_values = true,
        help_heading = "Transfer",
        value_name = "WHEN",
        default_value = "auto",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "always",
        value_parser = parse_direct_io
    )]
    pub direct_io: DirectIo,
    /// Write a JSON report here.
    #[arg(
        long,
        env = "HYDRATOR_REPORT",
        hide_env_values = true,
        help_heading = "Output"
    )]
    pub report: Option<PathBuf>,
    /// Progress display: bars on a terminal, log lines otherwise.
    #[arg(
        long,
        value_enum,
        env = "HYDRATOR_PROGRESS",
        hide_env_values = true,
        default_value = "auto",
        help_heading = "Output"
    )]
    pub(crate) progress: ProgressMode,
    /// Remove local files that are not in the source (never follows symlinks, never touches
    /// .hydrator/, keeps paths the filters exclude).
    #[arg(
        long,
        env = "HYDRATOR_DELETE",
        hide_env_values = true,
        help_heading = "Filters"
    , value_parser = clap::builder::BoolishValueParser::new())]
    pub delete: bool,
    /// Give up after this many seconds waiting for another hydrator on the same DEST
    /// (default: wait).
    #[arg(
        long,
        env = "HYDRATOR_LOCK_TIMEOUT",
        hide_env_values = true,
        help_heading = "Transfer"
    )]
    pub lock_timeout: Option<u64>,
    /// Accept a selection that holds no object (by default an empty prefix, or filters that
    /// keep nothing, is a usage error: exit 2, no READY).
    #[arg(
        long,
        env = "HYDRATOR_ALLOW_EMPTY",
        hide_env_values = true,
        help_heading = "Filters"
    , value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_empty: bool,
    /// Check each object uploaded in one PUT against the MD5 its ETag states: an end-to-end
    /// check where the server keeps no full-object checksum (MD5 costs more CPU than the rest
    /// of a download; an object larger than one buffer is read back from disk for it).
    #[arg(
        long,
        env = "HYDRATOR_CHECK_MD5",
        hide_env_values = true,
        help_heading = "Transfer"
    , value_parser = clap::builder::BoolishValueParser::new())]
    pub check_md5: bool,
    /// Stop after N objects failed in a row with none succeeding in between (every GET
    /// denied, a bucket policy that refuses reads): exit 1, no READY, what is durable kept.
    /// 0: never stop; failures among successes never stop a run.
    #[arg(
        long,
        env = "HYDRATOR_MAX_ERRORS",
        hide_env_values = true,
        value_name = "N",
        default_value_t = crate::config::DEFAULT_MAX_ERRORS,
        help_heading = "Transfer"
    )]
    pub max_errors: u64,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The directory to check.
    pub dest: PathBuf,
    /// Fetch missing and corrupt files again from the manifest's source.
    #[arg(long)]
    pub repair: bool,
    /// With --repair on a DEST hydrated from a snapshot: that snapshot file (repairs stay pinned).
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    /// Check and print what --repair would fetch, writing nothing (READY stays).
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    #[command(flatten)]
    pub options: SyncOptions,
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// s3://BUCKET/PREFIX/ (or ALIAS/BUCKET/PREFIX/ with an mc alias) to freeze.
    pub source: String,
    /// The snapshot file to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Seal it: record each object's BLAKE3 from DEST, which a `sync --snapshot` of these
    /// versions filled. Nodes then publish no file whose bytes differ.
    #[arg(long, value_name = "DEST")]
    pub seal: Option<PathBuf>,
    /// Seal this snapshot file instead of listing SOURCE again (with --seal).
    #[arg(long, value_name = "FILE", requires = "seal")]
    pub from: Option<PathBuf>,
    #[command(flatten)]
    pub connection: ConnectionOptions,
}

#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Directory for the server's data and the mirror (default: a temporary directory, removed
    /// afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Approximate size of the generated dataset.
    #[arg(long, default_value = "256MiB", value_parser = crate::units::parse_size)]
    pub size: u64,
    /// Write backend used by the demo's sync.
    #[arg(long, value_enum, default_value = "auto")]
    pub io_backend: IoBackendChoice,
    /// Progress display.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) progress: ProgressMode,
}

impl SyncArgs {
    pub(crate) fn into_config(self) -> Result<SyncConfig, UsageError> {
        let (source, dest, snapshot) = match (self.snapshot, self.paths.as_slice()) {
            (Some(file), [dest]) => {
                let snapshot = crate::snapshot::read(&file)?;
                (
                    snapshot.url(),
                    PathBuf::from(dest),
                    Some(std::sync::Arc::new(snapshot)),
                )
            }
            (Some(_), _) => return Err(UsageError::new("with --snapshot, give only DEST")),
            (None, [source, dest]) => {
                let config = self.options.for_source(source, PathBuf::from(dest))?;
                return SyncConfigBuilder {
                    dry_run: self.dry_run,
                    ..config
                }
                .build();
            }
            (None, _) => {
                return Err(UsageError::new(
                    "expected SOURCE and DEST (or --snapshot FILE DEST)",
                ))
            }
        };
        let mut config = self.options.apply(SyncConfig::builder(source, dest));
        if let Some(snapshot) = &snapshot {
            config.endpoint = config.endpoint.or_else(|| snapshot.endpoint.clone());
        }
        config.snapshot = snapshot;
        config.dry_run = self.dry_run;
        config.build()
    }
}

impl ConnectionOptions {
    /// Sets where the server is; empty values (an empty environment variable) count as unset.
    pub(crate) fn apply(&self, config: SyncConfigBuilder) -> SyncConfigBuilder {
        SyncConfigBuilder {
            endpoint: self.endpoint_url.clone().filter(|e| !e.is_empty()),
            region: self.region.clone().filter(|r| !r.is_empty()),
            path_style: self.path_style,
            profile: self.profile.clone().filter(|p| !p.is_empty()),
            anonymous: self.no_sign_request,
            ca_bundle: self.ca_bundle.clone().filter(|f| !f.as_os_str().is_empty()),
            no_verify_ssl: self.no_verify_ssl,
            ..config
        }
    }
}

/// The process's environment, as the source's parser and [`with_alias`] read it.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `config` with what an mc alias says where the command line and the environment leave it
/// open: `--endpoint-url` (AWS_ENDPOINT_URL) comes before the alias's URL, `--path-style`
/// (HYDRATOR_PATH_STYLE) before its `path`, and credentials of their own (AWS_ACCESS_KEY_ID,
/// `--profile` or AWS_PROFILE, `--no-sign-request`) before its keys. An alias without keys
/// sends unsigned requests, as mc does.
fn with_alias(
    config: SyncConfigBuilder,
    alias: McAlias,
    env: &dyn Fn(&str) -> Option<String>,
) -> SyncConfigBuilder {
    let own_credentials = config.credentials.is_some()
        || config.profile.is_some()
        || config.anonymous
        || env("AWS_ACCESS_KEY_ID").is_some_and(|key| !key.is_empty());
    tracing::debug!(
        "source {}: mc alias from {}, endpoint {}{}",
        config.source,
        alias.origin,
        config.endpoint.as_deref().unwrap_or(&alias.endpoint),
        match own_credentials {
            true => ", the alias's keys set aside for credentials given otherwise",
            false => "",
        }
    );
    let (credentials, anonymous) = match own_credentials {
        true => (config.credentials, config.anonymous),
        false => (alias.credentials.clone(), alias.credentials.is_none()),
    };
    SyncConfigBuilder {
        endpoint: config.endpoint.or(Some(alias.endpoint)),
        path_style: config.path_style.or(alias.path_style),
        credentials,
        anonymous,
        ..config
    }
}

/// The settings for `source` (`s3://BUCKET/PREFIX/` or an mc alias's `ALIAS/BUCKET/PREFIX/`)
/// and `dest`: `apply` sets the options, then the alias fills in what they leave open.
fn for_source(
    source: &str,
    dest: PathBuf,
    apply: impl FnOnce(SyncConfigBuilder) -> SyncConfigBuilder,
) -> Result<SyncConfigBuilder, UsageError> {
    let source = CliSource::parse(source, &process_env)?;
    let config = apply(SyncConfig::builder(source.url, dest));
    Ok(match source.alias {
        Some(alias) => with_alias(config, alias, &process_env),
        None => config,
    })
}

impl ConnectionOptions {
    /// The settings for `source` and `dest` with these options (see [`for_source`]).
    pub(crate) fn for_source(
        &self,
        source: &str,
        dest: PathBuf,
    ) -> Result<SyncConfigBuilder, UsageError> {
        for_source(source, dest, |config| self.apply(config))
    }
}

impl SyncOptions {
    /// The settings for `source` and `dest` with every option (see [`for_source`]).
    pub(crate) fn for_source(
        &self,
        source: &str,
        dest: PathBuf,
    ) -> Result<SyncConfigBuilder, UsageError> {
        for_source(source, dest, |config| self.apply(config))
    }

    /// Applies every option to `config`.
    pub(crate) fn apply(&self, config: SyncConfigBuilder) -> SyncConfigBuilder {
        SyncConfigBuilder {
            concurrency: self.concurrency,
            max_bandwidth: self.max_bandwidth,
            max_requests_per_second: self.max_requests_per_second,
            part_size: self.part_size,
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            shard: self.shard,
            io_backend: self.io_backend,
            direct_io: self.direct_io,
            report: self.report.clone(),
            progress: self.progress,
            delete: self.delete,
            lock_timeout: self.lock_timeout.map(std::time::Duration::from_secs),
            allow_empty: self.allow_empty,
            check_md5: self.check_md5,
            max_errors: self.max_errors,
            ..self.connection.apply(config)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    fn direct_io_of(args: &[&str]) -> DirectIo {
        let cli = Cli::try_parse_from(["hydrator", "sync"].iter().chain(args)).unwrap();
        let Command::Sync(sync) = cli.command else {
            panic!("a sync")
        };
        assert_eq!(sync.paths, ["s3://b/p/", "/d"], "{args:?}");
        sync.options.direct_io
    }

    #[test]
    fn no_variable_value_shows_in_the_help_and_no_stray_equals_sign() {
        let mut root = Cli::command();
        root.build();
        let commands = std::iter::once(&root).chain(root.get_subcommands());
        for command in commands {
            for arg in command.get_arguments().filter(|a| a.get_env().is_some()) {
                assert!(
                    arg.is_hide_env_values_set(),
                    "{} --{}: clap shows [env: NAME=VALUE] without hide_env_values",
                    command.get_name(),
                    arg.get_id()
                );
            }
            let help = command.clone().render_long_help().to_string();
            assert!(!help.contains("=]"), "{}: {help}", command.get_name());
        }
    }

    #[test]
    fn sizes_on_the_command_line_take_every_form() {
        let sync = |args: &[&str]| {
            let line = ["hydrator", "sync", "s3://b/p/", "/d"].iter().chain(args);
            match Cli::try_parse_from(line).unwrap().command {
                Command::Sync(sync) => sync.options,
                _ => panic!("a sync"),
            }
        };
        assert_eq!(sync(&["--part-size", "16Mi"]).part_size, 16 << 20);
        assert_eq!(sync(&["--part-size", "16M"]).part_size, 16 << 20);
        let rate = sync(&["--max-bandwidth", "1.5GB"]).max_bandwidth;
        assert_eq!(rate, Some(1_500_000_000));
        let bad =
            Cli::try_parse_from(["hydrator", "sync", "s3://b/p/", "/d", "--part-size", "8XB"]);
        let message = bad.unwrap_err().to_string();
        assert!(message.contains("unknown size unit \"XB\""), "{message}");
        assert!(
            message.contains("Gi") && message.contains("MB"),
            "{message}"
        );
    }

    #[test]
    fn the_usage_lines_show_both_forms() {
        let mut root = Cli::command();
        for (name, form) in [
            ("sync", "<SOURCE DEST | --snapshot FILE DEST>"),
            ("mount", "<SOURCE MOUNTPOINT | --snapshot FILE MOUNTPOINT>"),
        ] {
            let usage = root
                .find_subcommand_mut(name)
                .unwrap()
                .render_usage()
                .to_string();
            assert!(
                usage.contains(&format!("hydrator {name} [OPTIONS]")),
                "{usage}"
            );
            assert!(usage.contains(form), "{usage}");
        }
    }

    fn alias(credentials: bool, path_style: Option<bool>) -> McAlias {
        McAlias {
            endpoint: "http://minio:9000".into(),
            credentials: credentials.then(|| crate::source::client::StaticCredentials {
                access_key: "KEY".into(),
                secret_key: "SECRET".into(),
                session_token: None,
            }),
            path_style,
            origin: crate::source::mc_alias::Origin::Environment("MC_HOST_depot".into()),
        }
    }

    fn builder() -> SyncConfigBuilder {
        let url = crate::source::url::S3Url::parse("s3://jeux-data/vision-2026/").unwrap();
        SyncConfig::builder(url, "/cache".into())
    }

    #[test]
    fn an_alias_fills_what_the_options_and_the_environment_leave_open() {
        let no_env = |_: &str| None;
        let filled = with_alias(builder(), alias(true, Some(false)), &no_env);
        assert_eq!(filled.endpoint.as_deref(), Some("http://minio:9000"));
        assert_eq!(filled.credentials.as_ref().unwrap().secret_key, "SECRET");
        assert_eq!(filled.path_style, Some(false));
        assert!(!filled.anonymous);

        // --endpoint-url and --path-style come first.
        let given = SyncConfigBuilder {
            endpoint: Some("https://other:9000".into()),
            path_style: Some(true),
            ..builder()
        };
        let filled = with_alias(given, alias(true, Some(false)), &no_env);
        assert_eq!(filled.endpoint.as_deref(), Some("https://other:9000"));
        assert_eq!(filled.path_style, Some(true));

        // Credentials of their own: AWS_ACCESS_KEY_ID, --profile, --no-sign-request.
        let aws_keys = |name: &str| (name == "AWS_ACCESS_KEY_ID").then(|| "AKIA".to_string());
        let filled = with_alias(builder(), alias(true, None), &aws_keys);
        assert!(filled.credentials.is_none() && !filled.anonymous);
        let profile = SyncConfigBuilder {
            profile: Some("training".into()),
            ..builder()
        };
        assert!(with_alias(profile, alias(true, None), &no_env)
            .credentials
            .is_none());
        let unsigned = SyncConfigBuilder {
            anonymous: true,
            ..builder()
        };
        let filled = with_alias(unsigned, alias(true, None), &no_env);
        assert!(filled.credentials.is_none() && filled.anonymous);

        // An alias without keys: unsigned, as mc sends it.
        let filled = with_alias(builder(), alias(false, None), &no_env);
        assert!(filled.credentials.is_none() && filled.anonymous);
        assert!(filled.build().is_ok());
    }

    #[test]
    fn direct_io_is_auto_unless_asked_and_the_bare_flag_means_always() {
        assert_eq!(direct_io_of(&["s3://b/p/", "/d"]), DirectIo::Auto);
        assert_eq!(
            direct_io_of(&["--direct-io", "s3://b/p/", "/d"]),
            DirectIo::Always
        );
        assert_eq!(
            direct_io_of(&["s3://b/p/", "/d", "--direct-io=never"]),
            DirectIo::Never
        );
        assert_eq!(parse_direct_io(" TRUE"), Ok(DirectIo::Always));
        assert_eq!(parse_direct_io("0"), Ok(DirectIo::Never));
        assert!(parse_direct_io("sometimes").is_err());
    }
}
