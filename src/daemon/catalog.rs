//! The daemon's catalog (TOML): the cache, the listeners and the datasets that may be hydrated.
//! Only names in the catalog can be requested, so a caller can never make the daemon read a
//! bucket of its choosing with the daemon's credentials. Every problem in the file is reported
//! at once, each naming the setting it concerns.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::access::{self, Access, RawRules};
use super::identity::Token;
use crate::config::{self, ProgressMode, SyncConfig, SyncConfigBuilder};
use crate::error::UsageError;
use crate::plan::shard::Shard;
use crate::source::client::StaticCredentials;
use crate::source::url::S3Url;

const DEFAULT_SOCKET_MODE: u32 = 0o660;
const DEFAULT_PARALLEL_HYDRATIONS: usize = 2;
const DEFAULT_LEASE_TTL: u64 = 3600;
const DEFAULT_HEADER_TIMEOUT: u64 = 10;
/// The longest lease a caller can take: a day, so a lost holder pins nothing for long.
const DEFAULT_MAX_LEASE_TTL: u64 = 86_400;
const DEFAULT_REFRESH: u64 = 60;
const DEFAULT_MAINTENANCE_INTERVAL: u64 = 30;
/// Leases one dataset may hold at once: more than the pods a node runs by default (110).
const DEFAULT_MAX_LEASES_PER_DATASET: usize = 256;
/// Leases of one dataset one identity may hold: still more than a node's pods.
const DEFAULT_MAX_LEASES_PER_IDENTITY: usize = 128;
/// Objects smaller than this go to the store directly even in a `p2p` dataset.
const DEFAULT_P2P_MIN_OBJECT_SIZE: u64 = 16 << 20;
/// The longest one object's download through the peers may take, in seconds.
const DEFAULT_P2P_TIMEOUT: u64 = 3600;
/// The identity of the token read from `listen.token_file`.
const DEFAULT_TOKEN_NAME: &str = "default";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    cache: RawCache,
    #[serde(default)]
    listen: RawListen,
    #[serde(default)]
    datasets: BTreeMap<String, RawDataset>,
    /// Who may mount the datasets that name no one themselves.
    access: Option<RawRules>,
    p2p: Option<RawP2p>,
}

/// `[p2p]`: the node's Dragonfly peer, for the datasets with `p2p = true`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawP2p {
    socket: PathBuf,
    min_object_size: Option<String>,
    timeout_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    root: PathBuf,
    quota: String,
    #[serde(default)]
    free_space_floor: Option<String>,
    #[serde(default)]
    parallel_hydrations: Option<usize>,
    #[serde(default)]
    concurrency: Option<String>,
    #[serde(default)]
    default_lease_ttl_seconds: Option<u64>,
    #[serde(default)]
    max_lease_ttl_seconds: Option<u64>,
    #[serde(default)]
    maintenance_interval_seconds: Option<u64>,
    #[serde(default)]
    max_leases_per_dataset: Option<usize>,
    #[serde(default)]
    max_leases_per_identity: Option<usize>,
    max_bandwidth: Option<String>,
    max_requests_per_second: Option<f64>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    socket: Option<PathBuf>,
    socket_mode: Option<String>,
    tcp: Option<String>,
    probes: Option<String>,
    token_file: Option<PathBuf>,
    #[serde(default)]
    tokens: Vec<RawToken>,
    #[serde(default)]
    admins: Vec<String>,
    header_timeout_seconds: Option<u64>,
}

/// `[[listen.tokens]]`: a named token, optionally limited to some datasets.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: String,
    file: PathBuf,
    datasets: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataset {
    source: String,
    endpoint: Option<String>,
    region: Option<String>,
    access_key_id_env: Option<String>,
    secret_access_key_env: Option<String>,
    snapshot: Option<PathBuf>,
    #[serde(default)]
    prewarm: bool,
    refresh_seconds: Option<u64>,
    profile: Option<String>,
    #[serde(default)]
    no_sign_request: bool,
    ca_bundle: Option<PathBuf>,
    #[serde(default)]
    no_verify_ssl: bool,
    #[serde(default)]
    allow_empty: bool,
    #[serde(default)]
    start: Start,
    shard: Option<String>,
    #[serde(default)]
    p2p: bool,
    #[serde(default = "streams_by_default")]
    stream_unchecked: bool,
    namespaces: Option<Vec<String>>,
    service_accounts: Option<Vec<String>>,
}

impl RawDataset {
    fn rules(&self) -> RawRules {
        RawRules {
            namespaces: self.namespaces.clone(),
            service_accounts: self.service_accounts.clone(),
        }
    }
}

/// When a pod of the CSI volume may start reading a dataset that is not on the node yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Start {
    /// Once it is complete and verified (the pod waits in `ContainerCreating`).
    #[default]
    Ready,
    /// At once, through a lazy view whose opens wait for their file only.
    Lazy,
}

/// The validated catalog.
#[derive(Clone, Debug)]
pub(crate) struct Catalog {
    pub cache: Cache,
    pub listen: Listen,
    pub p2p: Option<P2p>,
    pub datasets: BTreeMap<String, Dataset>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cache {
    pub root: PathBuf,
    /// Bytes the cache may hold on disk.
    pub quota: u64,
    /// Free bytes to leave on the cache's filesystem.
    pub free_space_floor: u64,
    /// Hydrations that run side by side.
    pub parallel_hydrations: usize,
    /// Requests in flight across all hydrations (default: auto).
    pub concurrency: config::Concurrency,
    pub default_lease_ttl: Duration,
    /// Longer leases are cut to this.
    pub max_lease_ttl: Duration,
    /// How often leases expire and the quota is enforced.
    pub maintenance_interval: Duration,
    /// Leases one dataset may hold; more are refused.
    pub max_leases_per_dataset: usize,
    /// Leases of one dataset one (non-admin) identity may hold at once.
    pub max_leases_per_identity: usize,
    /// Bytes a second all hydrations together may receive.
    pub max_bandwidth: Option<u64>,
    /// GETs a second all hydrations together may send.
    pub max_requests_per_second: Option<f64>,
}

#[derive(Clone, PartialEq)]
pub(crate) struct Listen {
    pub socket: Option<PathBuf>,
    pub socket_mode: u32,
    pub tcp: Option<SocketAddr>,
    /// A TCP address of its own for the probes and `/metrics`, so that no caller of the API
    /// can keep the kubelet from them.
    pub probes: Option<SocketAddr>,
    /// The bearer tokens TCP callers may send (`token_file` is the one named "default").
    pub tokens: Vec<Token>,
    /// Identities (`uid:0`, `token:ops`) that may renew or release any lease.
    pub admins: BTreeSet<String>,
    /// A connection whose request header has not arrived within this is closed.
    pub header_timeout: Duration,
}

/// Token secrets never reach a log or a panic message.
impl std::fmt::Debug for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listen")
            .field("socket", &self.socket)
            .field("socket_mode", &format_args!("{:o}", self.socket_mode))
            .field("tcp", &self.tcp)
            .field("probes", &self.probes)
            .field("tokens", &self.tokens)
            .field("admins", &self.admins)
            .field("header_timeout", &self.header_timeout)
            .finish()
    }
}

/// The node's dfdaemon (`crate::p2p`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct P2p {
    pub socket: PathBuf,
    /// Smaller objects go to the store directly: a task's set-up costs more than they do.
    pub min_object_size: u64,
    /// The longest one object's download through the peers may take.
    pub timeout: Duration,
}

#[derive(Clone, Debug)]
pub(crate) struct Dataset {
    pub source: S3Url,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Static credentials from the named environment variables; `None`: the AWS chain.
    pub credentials: Option<StaticCredentials>,
    /// A named profile for the AWS chain.
    pub profile: Option<String>,
    /// Unsigned requests, for a public bucket.
    pub anonymous: bool,
    /// CA certificates to trust besides the system's.
    pub ca_bundle: Option<PathBuf>,
    /// Accept any server certificate.
    pub no_verify_ssl: bool,
    /// A selection that holds no object is a dataset (`allow_empty`), not a failed hydration.
    pub allow_empty: bool,
    /// The pinned snapshot (from the catalog's `snapshot` file): the dataset never moves past it.
    pub pinned: Option<std::sync::Arc<crate::snapshot::Snapshot>>,
    pub prewarm: bool,
    /// The CSI volume's default when its pod does not say (`start` volume attribute).
    pub start: Start,
    /// Which pods may mount it through the CSI driver.
    pub access: Access,
    /// How long a ready copy of an unpinned dataset is handed out before the source is listed
    /// again for a newer version.
    pub refresh: Duration,
    /// Only this node's share of the dataset (a catalog rendered per node or node pool).
    pub shard: Option<Shard>,
    /// Large objects come from the node's peers (`[p2p]`), checked against the sealed snapshot.
    pub p2p: bool,
    /// A lazy view may read a file still downloading, before its whole-file checks
    /// (`stream_unchecked = false`: its files open only once whole and verified).
    pub stream_unchecked: bool,
}

impl Catalog {
    /// Why `name` is refused: no such dataset, and the nearest of the names the caller may use
    /// (`may_use`) when one is near enough to be a typo. Names the caller may not use are
    /// never suggested.
    pub(crate) fn unknown_dataset(&self, name: &str, may_use: impl Fn(&str) -> bool) -> String {
        let usable = self
            .datasets
            .keys()
            .map(String::as_str)
            .filter(|n| may_use(n));
        match crate::suggest::closest(name, usable) {
            Some(near) => format!("no dataset {name:?} in the catalog; did you mean {near:?}?"),
            None => format!("no dataset {name:?} in the catalog"),
        }
    }
}

impl Dataset {
    /// A sync config for hydrating this dataset into `dest`.
    pub(crate) fn sync_config(
        &self,
        dest: PathBuf,
        concurrency: config::Concurrency,
    ) -> Result<SyncConfig, UsageError> {
        SyncConfigBuilder {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            credentials: self.credentials.clone(),
            profile: self.profile.clone(),
            anonymous: self.anonymous,
            ca_bundle: self.ca_bundle.clone(),
            no_verify_ssl: self.no_verify_ssl,
            concurrency,
            progress: ProgressMode::None,
            allow_empty: self.allow_empty,
            shard: self.shard,
            ..SyncConfig::builder(self.source.clone(), dest)
        }
        .build()
    }
}

/// Reads and validates the catalog at `path`; environment variables are looked up with `env`.
pub(crate) fn load(
    path: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Catalog, UsageError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| UsageError::new(format!("catalog {}: {e}", path.display())))?;
    parse(&text, env)
        .map_err(|problems| UsageError::new(format!("catalog {}:\n  {problems}", path.display())))
}

/// Every problem found in a catalog, each naming its setting; one a line.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n  "))]
pub(crate) struct Problems(Vec<String>);

impl std::ops::Deref for Problems {
    type Target = [String];

    fn deref(&self) -> &[String] {
        &self.0
    }
}

/// Parses catalog text; `Err` lists every problem found.
pub(crate) fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Catalog, Problems> {
    let raw: RawCatalog = toml::from_str(text).map_err(|e| Problems(vec![e.to_string()]))?;
    let mut problems = Vec::new();
    let cache = cache(raw.cache, &mut problems);
    let listen = listen(raw.listen, &mut problems);
    let p2p = raw.p2p.map(|raw| p2p(raw, &mut problems));
    let default = (raw.access.as_ref())
        .map(|rules| Arc::new(access::rules(rules, "access", &mut problems).into_default()));
    let any_rules = default.is_some() || raw.datasets.values().any(|d| d.rules().is_set());
    let mut datasets = BTreeMap::new();
    for (name, dataset) in raw.datasets {
        let own = dataset.rules();
        let own = own.is_set().then(|| {
            let field = format!("dataset {name:?}");
            access::rules(&own, &field, &mut problems)
        });
        let mut problem = |why: String| problems.push(format!("dataset {name:?}: {why}"));
        if let Err(why) = check_name(&name) {
            problem(why.to_string());
        }
        if dataset.p2p && p2p.is_none() {
            problem("p2p = true needs the catalog's [p2p] section (the dfdaemon's socket)".into());
        }
        if let Some(mut dataset) = self::dataset(dataset, &env, &mut problem) {
            dataset.access = access::resolve(own, default.as_ref(), any_rules);
            datasets.insert(name, dataset);
        }
    }
    for token in &listen.tokens {
        for name in token.datasets.iter().flat_map(|d| d.iter()) {
            if !datasets.contains_key(name) {
                problems.push(format!(
                    "listen.tokens {:?}: no dataset {name:?} in the catalog",
                    token.name
                ));
            }
        }
    }
    match problems.is_empty() {
        true => Ok(Catalog {
            cache,
            listen,
            p2p,
            datasets,
        }),
        false => Err(Problems(problems)),
    }
}

fn p2p(raw: RawP2p, problems: &mut Vec<String>) -> P2p {
    if !raw.socket.is_absolute() {
        problems.push(format!(
            "p2p.socket {:?} must be an absolute path",
            raw.socket
        ));
    }
    P2p {
        socket: raw.socket,
        min_object_size: raw
            .min_object_size
            .map_or(DEFAULT_P2P_MIN_OBJECT_SIZE, |text| {
                size("p2p.min_object_size", &text, problems)
            }),
        timeout: Duration::from_secs(raw.timeout_seconds.unwrap_or(DEFAULT_P2P_TIMEOUT)),
    }
}

fn size(field: &str, text: &str, problems: &mut Vec<String>) -> u64 {
    crate::units::parse_size(text).unwrap_or_else(|why| {
        problems.push(format!("{field}: {why}"));
        0
    })
}

fn cache(raw: RawCache, problems: &mut Vec<String>) -> Cache {
    if !raw.root.is_absolute() {
        problems.push(format!(
            "cache.root {:?} must be an absolute path",
            raw.root
        ));
    }
    let quota = size("cache.quota", &raw.quota, problems);
    if quota == 0 && problems.is_empty() {
        problems.push("cache.quota must be more than 0".into());
    }
    let free_space_floor = raw
        .free_space_floor
        .map_or(0, |floor| size("cache.free_space_floor", &floor, problems));
    let parallel_hydrations = raw
        .parallel_hydrations
        .unwrap_or(DEFAULT_PARALLEL_HYDRATIONS);
    if parallel_hydrations == 0 {
        problems.push("cache.parallel_hydrations must be at least 1".into());
    }
    let concurrency = match raw.concurrency.as_deref() {
        None => config::Concurrency::Auto,
        Some(text) => match config::parse_concurrency(text) {
            Ok(config::Concurrency::Fixed(n)) if !(1..=config::MAX_CONCURRENCY).contains(&n) => {
                problems.push(format!(
                    "cache.concurrency {n} must be auto or 1 to {}",
                    config::MAX_CONCURRENCY
                ));
                config::Concurrency::Auto
            }
            Ok(concurrency) => concurrency,
            Err(why) => {
                problems.push(format!("cache.concurrency: {why}"));
                config::Concurrency::Auto
            }
        },
    };
    let seconds = |value: Option<u64>, default: u64, field: &str, problems: &mut Vec<String>| {
        let value = value.unwrap_or(default);
        if value == 0 {
            problems.push(format!("cache.{field} must be at least 1"));
        }
        Duration::from_secs(value)
    };
    let default_lease_ttl = seconds(
        raw.default_lease_ttl_seconds,
        DEFAULT_LEASE_TTL,
        "default_lease_ttl_seconds",
        problems,
    );
    let max_lease_ttl = seconds(
        raw.max_lease_ttl_seconds,
        DEFAULT_MAX_LEASE_TTL.max(default_lease_ttl.as_secs()),
        "max_lease_ttl_seconds",
        problems,
    );
    if default_lease_ttl > max_lease_ttl {
        problems.push(format!(
            "cache.default_lease_ttl_seconds {} is longer than max_lease_ttl_seconds {}",
            default_lease_ttl.as_secs(),
            max_lease_ttl.as_secs()
        ));
    }
    let max_leases_per_dataset = raw
        .max_leases_per_dataset
        .unwrap_or(DEFAULT_MAX_LEASES_PER_DATASET);
    if max_leases_per_dataset == 0 {
        problems.push("cache.max_leases_per_dataset must be at least 1".into());
    }
    let max_leases_per_identity = raw
        .max_leases_per_identity
        .unwrap_or(DEFAULT_MAX_LEASES_PER_IDENTITY);
    if max_leases_per_identity == 0 {
        problems.push("cache.max_leases_per_identity must be at least 1".into());
    }
    Cache {
        root: raw.root,
        quota,
        free_space_floor,
        parallel_hydrations,
        concurrency,
        default_lease_ttl,
        max_lease_ttl,
        maintenance_interval: seconds(
            raw.maintenance_interval_seconds,
            DEFAULT_MAINTENANCE_INTERVAL,
            "maintenance_interval_seconds",
            problems,
        ),
        max_leases_per_dataset,
        max_leases_per_identity,
        max_bandwidth: raw
            .max_bandwidth
            .map(|rate| size("cache.max_bandwidth", &rate, problems))
            .filter(|&rate| rate > 0),
        max_requests_per_second: raw.max_requests_per_second.filter(|&rate| {
            let valid = rate > 0.0;
            if !valid {
                problems.push("cache.max_requests_per_second must be more than 0".into());
            }
            valid
        }),
    }
}

fn listen(raw: RawListen, problems: &mut Vec<String>) -> Listen {
    let socket_mode = match raw.socket_mode.as_deref() {
        None => DEFAULT_SOCKET_MODE,
        Some(text) => match u32::from_str_radix(text.trim_start_matches("0o"), 8) {
            Ok(mode) if mode <= 0o777 => mode,
            _ => {
                problems.push(format!(
                    "listen.socket_mode {text:?} must be octal permissions such as \"0660\""
                ));
                DEFAULT_SOCKET_MODE
            }
        },
    };
    let mut address = |field: &str, given: Option<&str>| {
        given.and_then(|addr| {
            addr.parse()
                .map_err(|_| problems.push(format!("listen.{field} {addr:?} must be IP:PORT")))
                .ok()
        })
    };
    let tcp = address("tcp", raw.tcp.as_deref());
    let probes = address("probes", raw.probes.as_deref());
    let mut tokens = Vec::new();
    if let Some(file) = &raw.token_file {
        let secret = read_token(
            &format!("listen.token_file {}", file.display()),
            file,
            problems,
        );
        tokens.extend(secret.map(|secret| Token {
            name: DEFAULT_TOKEN_NAME.into(),
            secret,
            datasets: None,
        }));
    }
    for raw_token in raw.tokens {
        let field = format!("listen.tokens {:?}", raw_token.name);
        if check_name(&raw_token.name).is_err() {
            problems.push(format!(
                "{field}: a token name is 1 to 63 letters, digits, '-', '_' or '.'"
            ));
        }
        if raw_token.name == DEFAULT_TOKEN_NAME && raw.token_file.is_some()
            || tokens.iter().any(|t: &Token| t.name == raw_token.name)
        {
            problems.push(format!("{field}: the name is taken by another token"));
        }
        let secret = read_token(
            &format!("{field} file {}", raw_token.file.display()),
            &raw_token.file,
            problems,
        );
        tokens.extend(secret.map(|secret| {
            Token {
                name: raw_token.name,
                secret,
                datasets: raw_token
                    .datasets
                    .map(|d| std::sync::Arc::new(d.into_iter().collect())),
            }
        }));
    }
    if raw.tcp.is_some()
        && tokens.is_empty()
        && !problems.iter().any(|p| p.starts_with("listen.token"))
    {
        problems.push(
            "listen.tcp needs listen.token_file or listen.tokens (callers send one as a bearer token)".into(),
        );
    }
    let mut secrets = BTreeSet::new();
    if !tokens.iter().all(|t| secrets.insert(t.secret.as_str())) {
        problems
            .push("listen: two tokens have the same secret, so they cannot be told apart".into());
    }
    let mut admins = BTreeSet::new();
    for admin in raw.admins {
        // Written the way callers are named, so "uid:007" matches uid 7.
        let identity = match admin.split_once(':') {
            Some(("uid", uid)) if uid.bytes().all(|b| b.is_ascii_digit()) => {
                uid.parse::<u32>().ok().map(|uid| format!("uid:{uid}"))
            }
            Some(("token", name)) if tokens.iter().any(|t| t.name == name) => Some(admin.clone()),
            _ => None,
        };
        match identity {
            Some(identity) => {
                admins.insert(identity);
            }
            None => problems.push(format!(
                "listen.admins {admin:?} must be \"uid:<number>\" or \"token:<name of a token>\""
            )),
        }
    }
    if raw.socket.is_none() && raw.tcp.is_none() {
        problems.push("listen: give a socket, a tcp address or both".into());
    }
    let header_timeout = raw.header_timeout_seconds.unwrap_or(DEFAULT_HEADER_TIMEOUT);
    if header_timeout == 0 {
        problems.push("listen.header_timeout_seconds must be at least 1".into());
    }
    Listen {
        socket: raw.socket,
        socket_mode,
        tcp,
        probes,
        tokens,
        admins,
        header_timeout: Duration::from_secs(header_timeout),
    }
}

/// The token in `file`: at least 16 characters, surrounding whitespace dropped.
fn read_token(field: &str, file: &Path, problems: &mut Vec<String>) -> Option<String> {
    match std::fs::read_to_string(file) {
        Ok(token) if token.trim().len() >= 16 => {
            warn_if_readable_by_others(file);
            Some(token.trim().to_string())
        }
        Ok(_) => {
            problems.push(format!("{field}: the token must be at least 16 characters"));
            None
        }
        Err(e) => {
            problems.push(format!("{field}: {e}"));
            None
        }
    }
}

/// A token that other users on the node can read is not a secret.
fn warn_if_readable_by_others(file: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(file) {
        if meta.permissions().mode() & 0o004 != 0 {
            tracing::warn!(
                "token file {} is readable by every user (mode {:o}); make it 0600 or 0640",
                file.display(),
                meta.permissions().mode() & 0o777
            );
        }
    }
}

fn dataset(
    raw: RawDataset,
    env: &impl Fn(&str) -> Option<String>,
    problem: &mut impl FnMut(String),
) -> Option<Dataset> {
    let source = S3Url::parse(&raw.source)
        .map_err(|e| problem(e.to_string()))
        .ok();
    if let Some(endpoint) = &raw.endpoint {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            problem(format!(
                "endpoint {endpoint:?} must be an http:// or https:// URL"
            ));
        }
    }
    let mut from_env = |field: &str, var: &str| {
        let value = env(var).filter(|v| !v.is_empty());
        if value.is_none() {
            problem(format!("{field}: environment variable {var} is not set"));
        }
        value
    };
    let credentials = match (&raw.access_key_id_env, &raw.secret_access_key_env) {
        (None, None) => None,
        (Some(id), Some(secret)) => {
            let access_key = from_env("access_key_id_env", id);
            let secret_key = from_env("secret_access_key_env", secret);
            access_key
                .zip(secret_key)
                .map(|(access_key, secret_key)| StaticCredentials {
                    access_key,
                    secret_key,
                    session_token: None,
                })
        }
        _ => {
            problem("give both access_key_id_env and secret_access_key_env, or neither".into());
            None
        }
    };
    if let Some(file) = &raw.ca_bundle {
        if let Err(err) = config::read_ca_bundle(file) {
            problem(err.to_string().replace("--ca-bundle", "ca_bundle"));
        }
        if raw.no_verify_ssl {
            problem("no_verify_ssl checks no certificate: give it or ca_bundle, not both".into());
        }
    }
    if raw.no_sign_request && (raw.access_key_id_env.is_some() || raw.profile.is_some()) {
        problem("no_sign_request sends no credentials: drop the credentials or the profile".into());
    }
    let shard = raw.shard.as_deref().and_then(|text| {
        text.parse::<Shard>()
            .map_err(|why| problem(format!("shard {why}")))
            .ok()
    });
    if raw.shard.is_some() && raw.start == Start::Lazy {
        problem(
            "a lazy view shows the whole dataset: give start = \"lazy\" or a shard, not both"
                .into(),
        );
    }
    if raw.p2p && raw.no_sign_request {
        problem("p2p = true hands the peers presigned requests: it needs credentials, not no_sign_request".into());
    }
    let source = source?;
    let pinned = match &raw.snapshot {
        None => None,
        Some(file) => match crate::snapshot::read(file) {
            Ok(s) if s.bucket != source.bucket || s.prefix != source.prefix => {
                problem(format!(
                    "snapshot {} is of s3://{}/{}, not of {source}",
                    file.display(),
                    s.bucket,
                    s.prefix
                ));
                None
            }
            Ok(snapshot) => Some(std::sync::Arc::new(snapshot)),
            Err(e) => {
                problem(e.to_string());
                None
            }
        },
    };
    let sealed = pinned
        .as_ref()
        .is_some_and(|s| s.version == crate::snapshot::SEALED_VERSION);
    if raw.p2p && !sealed {
        problem(
            "p2p = true needs a sealed snapshot (hydrator snapshot --seal): bytes from peers count only once they match it"
                .into(),
        );
    }
    Some(Dataset {
        source,
        endpoint: raw.endpoint,
        region: raw.region,
        credentials,
        profile: raw.profile,
        anonymous: raw.no_sign_request,
        ca_bundle: raw.ca_bundle,
        no_verify_ssl: raw.no_verify_ssl,
        allow_empty: raw.allow_empty,
        pinned,
        prewarm: raw.prewarm,
        start: raw.start,
        access: Access::Open,
        refresh: Duration::from_secs(raw.refresh_seconds.unwrap_or(DEFAULT_REFRESH)),
        shard,
        p2p: raw.p2p,
        stream_unchecked: raw.stream_unchecked,
    })
}

fn streams_by_default() -> bool {
    true
}

/// Dataset names are directory names under the cache root and path segments of the API.
fn check_name(name: &str) -> Result<(), super::error::InvalidName> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    match ok {
        true => Ok(()),
        false => Err(super::error::InvalidName),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "KEY" || name == "SECRET").then(|| format!("{name}-value"))
    }

    const GOOD: &str = r#"
        [cache]
        root = "/var/cache/hydrator"
        quota = "10GiB"
        free_space_floor = "1GiB"
        [listen]
        socket = "/run/hydrator/hydrator.sock"
        [datasets.imagenet]
        source = "s3://datasets/imagenet"
        endpoint = "http://minio:9000"
        access_key_id_env = "KEY"
        secret_access_key_env = "SECRET"
        prewarm = true
        start = "lazy"
        [datasets.coco]
        source = "s3://datasets/coco/"
    "#;

    #[test]
    fn a_good_catalog_gets_its_defaults() {
        let catalog = parse(GOOD, env).unwrap();
        assert_eq!(catalog.cache.quota, 10 << 30);
        assert_eq!(catalog.cache.parallel_hydrations, 2);
        assert_eq!(catalog.listen.socket_mode, 0o660);
        let imagenet = &catalog.datasets["imagenet"];
        assert_eq!(imagenet.source.prefix, "imagenet/");
        assert_eq!(
            imagenet.credentials.as_ref().unwrap().secret_key,
            "SECRET-value"
        );
        assert!(imagenet.prewarm);
        assert_eq!(imagenet.start, Start::Lazy);
        assert_eq!(catalog.datasets["coco"].start, Start::Ready);
        assert!(catalog.datasets["coco"].credentials.is_none());
        assert_eq!(catalog.datasets["coco"].refresh, Duration::from_secs(60));
    }

    #[test]
    fn a_dataset_may_forbid_lazy_readers_unchecked_bytes() {
        let catalog = parse(GOOD, env).unwrap();
        assert!(catalog.datasets["imagenet"].stream_unchecked, "the default");
        let whole = GOOD.replace(
            "start = \"lazy\"",
            "start = \"lazy\"\nstream_unchecked = false",
        );
        let catalog = parse(&whole, env).unwrap();
        assert!(!catalog.datasets["imagenet"].stream_unchecked);
        assert!(catalog.datasets["coco"].stream_unchecked);
    }

    #[test]
    fn sizes_are_read_as_people_write_them() {
        let written = GOOD
            .replace(
                "quota = \"10GiB\"",
                "quota = \"1.5Ti\"\nmax_bandwidth = \"500MB\"",
            )
            .replace("free_space_floor = \"1GiB\"", "free_space_floor = \"20Gi\"");
        let cache = parse(&written, env).unwrap().cache;
        assert_eq!(cache.quota, 3 << 39);
        assert_eq!(cache.free_space_floor, 20 << 30);
        assert_eq!(cache.max_bandwidth, Some(500_000_000));
        let wrong = GOOD.replace("quota = \"10GiB\"", "quota = \"10 gigs\"");
        let problems = parse(&wrong, env).unwrap_err().join("\n");
        assert!(
            problems.contains("cache.quota: unknown size unit \"gigs\""),
            "{problems}"
        );
        assert!(
            problems.contains("Gi") && problems.contains("GB"),
            "{problems}"
        );
    }

    #[test]
    fn an_unknown_dataset_is_answered_with_the_nearest_usable_name() {
        let catalog = parse(GOOD, env).unwrap();
        let anyone = |_: &str| true;
        assert_eq!(
            catalog.unknown_dataset("imagnet", anyone),
            "no dataset \"imagnet\" in the catalog; did you mean \"imagenet\"?"
        );
        assert_eq!(
            catalog.unknown_dataset("laion", anyone),
            "no dataset \"laion\" in the catalog"
        );
        // A name the caller may not use is never suggested.
        assert_eq!(
            catalog.unknown_dataset("imagnet", |name| name != "imagenet"),
            "no dataset \"imagnet\" in the catalog"
        );
    }

    #[test]
    fn once_one_dataset_has_access_rules_the_others_are_closed_unless_access_says() {
        let ruled = GOOD.replace(
            "start = \"lazy\"",
            "start = \"lazy\"\nnamespaces = [\"ml\"]",
        );
        let catalog = parse(&ruled, env).unwrap();
        assert!(matches!(
            catalog.datasets["imagenet"].access,
            Access::Rules(_)
        ));
        assert_eq!(catalog.datasets["coco"].access, Access::Closed);
        let with_default = format!("{ruled}\n[access]\nservice_accounts = [\"ml/trainer\"]\n");
        let catalog = parse(&with_default, env).unwrap();
        assert!(matches!(catalog.datasets["coco"].access, Access::Rules(_)));
        assert_eq!(
            parse(GOOD, env).unwrap().datasets["coco"].access,
            Access::Open
        );
        let bad = GOOD.replace("prewarm = true", "prewarm = true\nnamespaces = [\"ML\"]");
        let problems = parse(&bad, env).err().unwrap();
        assert!(problems[0].contains("\"ML\""), "{problems:?}");
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let mut catalog = parse(GOOD, env).unwrap();
        catalog.listen.tokens = vec![Token {
            name: "t".into(),
            secret: "the-token-value".into(),
            datasets: None,
        }];
        let printed = format!("{catalog:?}");
        assert!(
            printed.contains("KEY-value"),
            "the access key id is not secret"
        );
        assert!(!printed.contains("SECRET-value"), "{printed}");
        assert!(!printed.contains("the-token-value"), "{printed}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = r#"
            [cache]
            root = "relative"
            quota = "10 bananas"
            [listen]
            tcp = "0.0.0.0:7070"
            probes = "7071"
            socket_mode = "999"
            [datasets."../etc"]
            source = "s3://datasets/x/"
            [datasets.b]
            source = "http://not-s3/"
            shard = "2/2"
            start = "lazy"
            access_key_id_env = "MISSING"
            secret_access_key_env = "SECRET"
        "#;
        let problems = parse(text, env).unwrap_err().join("\n");
        for expected in [
            "cache.root",
            "cache.quota",
            "listen.tcp needs listen.token_file or listen.tokens",
            "listen.socket_mode",
            "listen.probes \"7071\" must be IP:PORT",
            "dataset \"b\": shard \"2/2\": a shard is INDEX/COUNT",
            "dataset \"b\": a lazy view shows the whole dataset",
            "dataset \"../etc\": names are",
            "dataset \"b\": invalid source URL",
            "MISSING is not set",
        ] {
            assert!(problems.contains(expected), "{expected} in:\n{problems}");
        }
    }

    #[test]
    fn p2p_needs_its_section_a_sealed_snapshot_and_credentials() {
        let dataset = r#"
            [cache]
            root = "/cache"
            quota = "1GiB"
            [datasets.c]
            source = "s3://datasets/c/"
            p2p = true
            no_sign_request = true
        "#;
        let problems = parse(dataset, env).unwrap_err().join("\n");
        for expected in [
            "dataset \"c\": p2p = true needs the catalog's [p2p] section",
            "dataset \"c\": p2p = true needs a sealed snapshot",
            "dataset \"c\": p2p = true hands the peers presigned requests",
        ] {
            assert!(problems.contains(expected), "{expected} in:\n{problems}");
        }
        let section = r#"
            [cache]
            root = "/cache"
            quota = "1GiB"
            [p2p]
            socket = "dfdaemon.sock"
            min_object_size = "big"
        "#;
        let problems = parse(section, env).unwrap_err().join("\n");
        assert!(problems.contains("p2p.socket \"dfdaemon.sock\" must be an absolute path"));
        assert!(problems.contains("p2p.min_object_size"), "{problems}");
        let good = format!("{GOOD}\n[p2p]\nsocket = \"/run/dfdaemon.sock\"\n");
        let p2p = parse(&good, env).unwrap().p2p.unwrap();
        assert_eq!(p2p.min_object_size, 16 << 20);
        assert_eq!(p2p.timeout, Duration::from_secs(3600));
    }

    #[test]
    fn named_tokens_scopes_and_admins() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, secret: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, secret).unwrap();
            path.display().to_string()
        };
        let (team, ops, same) = (
            file("team", "team-a-secret-0123456789"),
            file("ops", "ops-secret-0123456789abc"),
            file("same", "ops-secret-0123456789abc"),
        );
        let listen = format!(
            "[listen]\ntcp = \"127.0.0.1:7070\"\nadmins = [\"uid:00\", \"token:ops\"]\n\
             [[listen.tokens]]\nname = \"team-a\"\nfile = {team:?}\ndatasets = [\"coco\"]\n\
             [[listen.tokens]]\nname = \"ops\"\nfile = {ops:?}\n"
        );
        let text = GOOD.replace(
            "[listen]\n        socket = \"/run/hydrator/hydrator.sock\"",
            &listen,
        );
        let catalog = parse(&text, env).unwrap();
        let names: Vec<_> = catalog
            .listen
            .tokens
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(names, ["team-a", "ops"]);
        let team_a = super::super::identity::Caller::token(&catalog.listen.tokens[0]);
        assert!(team_a.may_use("coco") && !team_a.may_use("imagenet"));
        let admins: Vec<_> = catalog.listen.admins.iter().map(String::as_str).collect();
        assert_eq!(admins, ["token:ops", "uid:0"]);

        let bad = text
            .replace("\"coco\"]", "\"nope\"]")
            .replace("\"uid:00\"", "\"root\", \"token:nobody\", \"uid:+1\"")
            .replace(&ops, &same)
            + &format!("[[listen.tokens]]\nname = \"ops\"\nfile = {team:?}\n");
        let problems = parse(&bad, env).unwrap_err().join("\n");
        for expected in [
            "listen.tokens \"team-a\": no dataset \"nope\"",
            "listen.admins \"root\"",
            "listen.admins \"token:nobody\"",
            "listen.admins \"uid:+1\"",
            "listen.tokens \"ops\": the name is taken",
            "two tokens have the same secret",
        ] {
            assert!(problems.contains(expected), "{expected} in:\n{problems}");
        }
    }

    #[test]
    fn the_catalog_shipped_in_k8s_is_valid() {
        let tokens = tempfile::tempdir().unwrap();
        for name in ["token", "csi", "admission"] {
            std::fs::write(
                tokens.path().join(name),
                format!("{name}-of-24-characters-x"),
            )
            .unwrap();
        }
        let text = include_str!("../../k8s/node-cache/catalog.toml")
            .replace("/etc/hydrator/token", tokens.path().to_str().unwrap());
        let env = |name: &str| name.starts_with("MINIO_").then(|| "x".to_string());
        let catalog = parse(&text, env).unwrap();
        assert_eq!(catalog.cache.root, Path::new("/var/cache/hydrator"));
        assert!(catalog.datasets["imagenet"].prewarm);
        assert!(catalog.listen.admins.contains("token:csi"));
    }

    #[test]
    fn unknown_keys_and_bad_toml_are_errors() {
        let typo = GOOD.replace("prewarm", "prewram");
        assert!(parse(&typo, env).unwrap_err()[0].contains("prewram"));
        assert!(parse("[cache\n", env).is_err());
    }
}
