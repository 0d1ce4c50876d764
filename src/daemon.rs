//! The node daemon (`hydrator daemon --config catalog.toml`): keeps the catalog's datasets warm
//! under a cache root on local disk and shares them between the jobs of a node.
//!
//! Why it is built this way:
//! - It is never in the read path: each snapshot of a dataset is a plain directory
//!   (`ROOT/<name>/<snapshot digest>/`, a normal DEST with its `.hydrator/`) that jobs read
//!   directly, so the daemon can restart or upgrade while they train.
//! - A new version of a dataset lands in a new directory, so files never change under a reader;
//!   unchanged files are hard-linked from the previous snapshot ([`link`]).
//! - Concurrent requests for one dataset share one hydration ([`flight`]); hydrations of
//!   different datasets share one request and buffer budget, so they back off together when
//!   the server throttles and memory stays bounded.
//! - Space is reserved before a hydration downloads, and whole unleased snapshots are evicted
//!   least recently used first ([`evict`]).
//! - The disk is the truth: on start, the registry is rebuilt from the directories and
//!   interrupted hydrations resume from their manifests, every one a lease pins among them
//!   ([`recover`]).
//! - The catalog is reloaded in place, on SIGHUP or when its file changes ([`catalog_watch`]):
//!   editing it restarts nothing.

mod access;
pub(crate) mod api;
pub(crate) mod catalog;
mod catalog_watch;
mod error;
mod evict;
mod flight;
mod holder;
mod identity;
mod link;
pub(crate) mod metrics;
pub(crate) mod protocol;
mod recover;
pub(crate) mod registry;
mod saver;
mod serve;
pub(crate) mod space;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{watch, Semaphore};

use crate::engine::{stats::Stats, Budget};
use crate::error::{Exit, SyncError, UsageError};
use catalog::Catalog;
use registry::Registry;

/// How long hydrations get to flush their manifests after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

pub(crate) struct Daemon {
    pub root: PathBuf,
    catalog_path: PathBuf,
    catalog: RwLock<Arc<Catalog>>,
    registry: Mutex<Registry>,
    /// Request slots and write buffers shared by every hydration.
    pub budget: Budget,
    hydrations: Semaphore,
    /// Serialises reservations and evictions.
    space: tokio::sync::Mutex<()>,
    /// Writes `state.json` in batches after changes.
    saver: saver::StateSaver,
    pub metrics: metrics::Metrics,
    /// Set once on SIGTERM/SIGINT: hydrations stop, requests are refused.
    pub stop: watch::Sender<bool>,
    io_backend: String,
}

impl Daemon {
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        self.catalog.read().expect("catalog lock").clone()
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().expect("registry lock")
    }

    /// Writes leases and last-use times now; a failure is logged (the next change writes
    /// again) and returned. Only at start and by the saver: changes go through
    /// [`Daemon::state_changed`].
    fn save_now(&self) -> std::io::Result<()> {
        let persisted = self.registry().persisted();
        self.metrics.state_saved();
        registry::save(&self.root, &persisted)
            .inspect_err(|err| tracing::error!("saving the daemon state: {err}"))
    }

    /// Asks for the state to be saved (in the next batch); the generation to wait for with
    /// [`Daemon::state_durable`].
    pub(crate) fn state_changed(&self) -> u64 {
        self.saver.changed()
    }

    /// Waits until the change `generation` is saved; `Err` when that save failed.
    pub(crate) async fn state_durable(&self, generation: u64) -> std::io::Result<()> {
        self.saver.durable(generation).await
    }

    pub(crate) fn render_metrics(&self) -> String {
        let catalog = self.catalog();
        let registry = self.registry();
        let datasets = catalog
            .datasets
            .keys()
            .map(|name| metrics::DatasetNow {
                name,
                state: registry.status(&self.root, name).state,
                bytes_fetching: (registry.datasets.get(name))
                    .and_then(|entry| entry.flight.as_ref())
                    .map_or(0, |flight| Stats::get(&flight.stats.bytes_received)),
            })
            .collect();
        let requests = self.budget.slots.responses.by_operation();
        self.metrics.render(&metrics::Snapshot {
            capacity: catalog.cache.quota,
            datasets,
            leases: registry.live_leases(registry::now_unix()).count(),
            s3_requests: &requests,
            io_backend: &self.io_backend,
            rate_limited_seconds: self.budget.rates.waited_seconds(),
        })
    }

    /// Re-reads the catalog (SIGHUP, or its file changed). A catalog with errors is refused and
    /// the old one kept; running hydrations finish with the settings they started with.
    fn reload(self: &Arc<Self>) {
        let new = match catalog::load(&self.catalog_path, |k| std::env::var(k).ok()) {
            Ok(new) => new,
            Err(err) => {
                tracing::error!("reload refused, keeping the running catalog: {err}");
                return;
            }
        };
        let old = self.catalog();
        let moved = new.listen.socket != old.listen.socket
            || new.listen.socket_mode != old.listen.socket_mode
            || new.listen.tcp != old.listen.tcp
            || new.listen.probes != old.listen.probes
            || new.cache.root != old.cache.root;
        if moved {
            tracing::warn!("listener and cache root changes take effect at the next restart (the token and everything else apply now)");
        }
        if new.cache.parallel_hydrations != old.cache.parallel_hydrations {
            tracing::warn!("cache.parallel_hydrations takes effect at the next restart");
        }
        let mut new = new;
        new.listen.socket.clone_from(&old.listen.socket);
        new.listen.socket_mode = old.listen.socket_mode;
        new.listen.tcp = old.listen.tcp;
        new.listen.probes = old.listen.probes;
        new.cache.root.clone_from(&old.cache.root);
        let (added, removed) = (
            names_missing(&new, &old).join(", "),
            names_missing(&old, &new).join(", "),
        );
        let count = new.datasets.len();
        *self.catalog.write().expect("catalog lock") = Arc::new(new);
        tracing::info!(
            added = %added,
            removed = %removed,
            "catalog reloaded: {count} datasets"
        );
        self.prewarm();
    }

    fn prewarm(self: &Arc<Self>) {
        for (name, dataset) in &self.catalog().datasets {
            if dataset.prewarm {
                let _ = flight::warm(self, name, dataset);
            }
        }
    }
}

/// The names of `of`'s datasets that `than` does not hold.
fn names_missing<'a>(of: &'a Catalog, than: &Catalog) -> Vec<&'a str> {
    (of.datasets.keys())
        .filter(|name| !than.datasets.contains_key(*name))
        .map(String::as_str)
        .collect()
}

/// Runs the daemon until SIGTERM or SIGINT.
pub(crate) async fn run(catalog_path: &Path) -> Result<Exit, SyncError> {
    let watch = catalog_watch::CatalogWatch::new(catalog_path);
    let catalog = catalog::load(catalog_path, |k| std::env::var(k).ok())?;
    let root = catalog.cache.root.clone();
    let registry = recover::scan(&root, &catalog)
        .map_err(|e| UsageError::new(format!("cache root {}: {e}", root.display())))?;
    let rates = crate::engine::rate::Rates::new(
        catalog.cache.max_bandwidth,
        catalog.cache.max_requests_per_second,
    );
    let (budget, controller) = Budget::new(catalog.cache.concurrency, rates);
    let io_backend = crate::write::Writers::start(crate::config::IoBackendChoice::Auto)?
        .backend
        .to_string();
    let listeners = Listeners::bind(&catalog.listen).await?;
    let daemon = Arc::new(Daemon {
        root,
        catalog_path: catalog_path.to_path_buf(),
        hydrations: Semaphore::new(catalog.cache.parallel_hydrations),
        catalog: RwLock::new(Arc::new(catalog)),
        registry: Mutex::new(registry),
        budget,
        space: Default::default(),
        saver: Default::default(),
        metrics: Default::default(),
        stop: watch::channel(false).0,
        io_backend,
    });
    let _ = daemon.save_now(); // logged; the next change writes again
    let saver = tokio::spawn(saver::StateSaver::run(daemon.clone()));
    {
        let mut registry = daemon.registry();
        let names: Vec<String> = registry.datasets.keys().cloned().collect();
        for name in names {
            flight::resume_next(&daemon, &mut registry, &name);
        }
    }
    daemon.prewarm();
    let servers = listeners.serve(&daemon);
    let maintenance = tokio::spawn({
        let daemon = daemon.clone();
        async move {
            loop {
                evict::maintain(&daemon).await;
                tokio::time::sleep(daemon.catalog().cache.maintenance_interval).await;
            }
        }
    });
    let watch = tokio::spawn(watch.run(daemon.clone()));
    tracing::info!(
        "daemon ready: cache {} (quota {}), {} datasets",
        daemon.root.display(),
        crate::units::human_bytes(daemon.catalog().cache.quota),
        daemon.catalog().datasets.len()
    );
    wait_for_stop(&daemon).await;
    tracing::info!("stopping: no new work; hydrations flush their manifests");
    daemon.stop.send_replace(true);
    maintenance.abort();
    watch.abort();
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while daemon
        .registry()
        .datasets
        .values()
        .any(|e| e.flight.is_some())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(controller) = controller {
        controller.abort();
    }
    servers.stop().await;
    daemon.saver.close();
    let _ = saver.await; // its last write holds every answered change
    tracing::info!("stopped");
    Ok(Exit::Success)
}

/// Waits for SIGTERM or SIGINT, reloading the catalog on SIGHUP meanwhile.
async fn wait_for_stop(daemon: &Arc<Daemon>) {
    let (mut term, mut int, mut hup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(term), Ok(int), Ok(hup)) => (term, int, hup),
        _ => {
            tracing::error!("cannot install signal handlers; stopping");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => daemon.reload(),
        }
    }
}

/// The unix socket and the TCP listeners, bound before anything else starts.
struct Listeners {
    unix: Option<(tokio::net::UnixListener, PathBuf)>,
    tcp: Option<tokio::net::TcpListener>,
    probes: Option<tokio::net::TcpListener>,
}

struct Servers {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    shutdown: watch::Sender<bool>,
    socket: Option<PathBuf>,
}

impl Listeners {
    async fn bind(listen: &catalog::Listen) -> Result<Self, UsageError> {
        let unix = match &listen.socket {
            None => None,
            Some(path) => Some((bind_socket(path, listen.socket_mode)?, path.clone())),
        };
        Ok(Self {
            unix,
            tcp: bind_tcp("tcp", listen.tcp).await?,
            probes: bind_tcp("probes", listen.probes).await?,
        })
    }

    fn serve(self, daemon: &Arc<Daemon>) -> Servers {
        let shutdown = watch::channel(false).0;
        let header_timeout = daemon.catalog().listen.header_timeout;
        let mut tasks = Vec::new();
        let mut socket = None;
        if let Some((listener, path)) = self.unix {
            let app = api::router(daemon.clone(), false);
            tasks.push(spawn_server(
                daemon,
                listener,
                app,
                header_timeout,
                &shutdown,
            ));
            tracing::info!("listening on unix:{}", path.display());
            socket = Some(path);
        }
        if let Some(listener) = self.tcp {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!("listening on http://{addr} (bearer token required)");
            }
            let app = api::router(daemon.clone(), true);
            tasks.push(spawn_server(
                daemon,
                listener,
                app,
                header_timeout,
                &shutdown,
            ));
        }
        if let Some(listener) = self.probes {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!("probes and metrics on http://{addr}");
            }
            let app = api::probes_router(daemon.clone());
            tasks.push(spawn_server(
                daemon,
                listener,
                app,
                header_timeout,
                &shutdown,
            ));
        }
        Servers {
            tasks,
            shutdown,
            socket,
        }
    }
}

async fn bind_tcp(
    field: &str,
    addr: Option<std::net::SocketAddr>,
) -> Result<Option<tokio::net::TcpListener>, UsageError> {
    let Some(addr) = addr else { return Ok(None) };
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => Ok(Some(listener)),
        Err(e) => Err(UsageError::new(format!("listen.{field} {addr}: {e}"))),
    }
}

fn spawn_server<L>(
    daemon: &Arc<Daemon>,
    listener: L,
    app: axum::Router,
    header_timeout: std::time::Duration,
    shutdown: &watch::Sender<bool>,
) -> tokio::task::JoinHandle<()>
where
    L: axum::serve::Listener,
    L::Io: identity::Peer,
{
    let daemon = daemon.clone();
    let is_admin: serve::IsAdmin =
        Arc::new(move |caller: &str| daemon.catalog().listen.admins.contains(caller));
    tokio::spawn(serve::serve(
        listener,
        app,
        header_timeout,
        is_admin,
        shutdown.subscribe(),
    ))
}

impl Servers {
    /// Stops accepting, lets answers in progress finish (briefly), removes the socket.
    async fn stop(self) {
        self.shutdown.send_replace(true);
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Some(socket) = self.socket {
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// Binds the unix socket with `mode`. A socket file left by a killed daemon is replaced; one
/// that still answers belongs to a running daemon and is an error.
fn bind_socket(path: &Path, mode: u32) -> Result<tokio::net::UnixListener, UsageError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let bad = |why: String| UsageError::new(format!("listen.socket {}: {why}", path.display()));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| bad(e.to_string()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(bad("exists and is not a socket".into()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(bad("another daemon is listening on it".into()));
        }
        std::fs::remove_file(path).map_err(|e| bad(e.to_string()))?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| bad(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| bad(e.to_string()))?;
    Ok(listener)
}
