//! Hydrations, single-flight: every warm request for a dataset that is not ready joins the one
//! hydration of that dataset in progress, or starts it. A hydration lists the source into a
//! snapshot (or takes the catalog's pinned one), returns at once when that snapshot is already
//! on disk, otherwise links the unchanged files of the previous snapshot, reserves space for
//! what its directory does not hold yet and runs the sync engine into `ROOT/<name>/<digest>/`
//! under the daemon's shared request and buffer budget. The engine dispatches by a
//! [`Schedule`], so the opens of lazy views (`POST .../want`) go first and steer what follows;
//! with none it fetches in listing order.
//!
//! The interrupted hydrations found at start wait in their dataset's queue and run one after
//! another ([`resume_next`]), older leased snapshots before the dataset's refresh. A hydration
//! that ends short leaves its snapshot, while a lease pins it, as unfinished: what it fetched is
//! served, and the rest is answered with why.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use super::catalog::{Dataset, P2p};
use super::error::HydrationError;
use super::link;
use super::metrics::HydrationResult;
use super::protocol::{DatasetStatus, Phase};
use super::registry::{self, Flight, ReadySnapshot, Resume, Unfinished};
use super::Daemon;
use crate::config::SyncConfig;
use crate::engine::{self, schedule::Schedule, stats::Stats, Hooks};
use crate::error::{Exit, IoContext, SyncError};
use crate::p2p::dfdaemon::Dfdaemon;
use crate::plan::keys::{plan_key, KeyPlan, Placement};
use crate::snapshot;
use crate::source::client;
use crate::write::dest::Dest;

/// What a warm request gets.
pub(crate) enum Warm {
    /// The answer now: ready (maybe stale), or failed and backing off.
    Known(Box<DatasetStatus>),
    /// Turns true when the hydration ends.
    Hydrating(tokio::sync::watch::Receiver<bool>),
}

/// Answers a warm request for the catalog dataset `name`.
pub(crate) fn warm(daemon: &Arc<Daemon>, name: &str, dataset: &Dataset) -> Warm {
    let mut registry = daemon.registry();
    let entry = registry.datasets.entry(name.to_string()).or_default();
    if let Some(flight) = &entry.flight {
        return Warm::Hydrating(flight.done.subscribe());
    }
    let fresh = entry
        .current
        .as_ref()
        .filter(|current| match &dataset.pinned {
            Some(pinned) => **current == pinned.digest,
            None => entry
                .checked_at
                .is_some_and(|at| at.elapsed() < dataset.refresh),
        });
    // A failed hydration is not tried again before its back-off ends; meanwhile what is held
    // is served as it is.
    let serve = fresh.or(entry.current.as_ref().filter(|_| entry.backing_off()));
    if let Some(current) = serve.cloned() {
        let ready = entry.ready.get_mut(&current).expect("current is ready");
        ready.last_used = registry::now_unix();
        daemon.metrics.served_from_cache(name, ready.bytes);
        return Warm::Known(Box::new(registry.status(&daemon.root, name)));
    }
    if entry.backing_off() {
        return Warm::Known(Box::new(registry.status(&daemon.root, name)));
    }
    let receiver = start(daemon, &mut registry, name, dataset.clone(), None);
    Warm::Hydrating(receiver)
}

/// Starts the next interrupted hydration of `name` waiting for its turn, if any; one whose
/// dataset left the catalog meanwhile is kept as unfinished when a lease pins it.
pub(crate) fn resume_next(daemon: &Arc<Daemon>, registry: &mut registry::Registry, name: &str) {
    while let Some(resume) = (registry.datasets.get_mut(name)).and_then(|e| e.queued.pop_front()) {
        let digest = resume.snapshot.digest.clone();
        let Some(dataset) = daemon.catalog().datasets.get(name).cloned() else {
            if registry.leased(name, &digest, registry::now_unix()) {
                let reason = "its dataset left the catalog before it was resumed".to_string();
                let entry = registry.datasets.entry(name.to_string()).or_default();
                let unfinished = Unfinished {
                    reason,
                    schedule: None,
                };
                entry.unfinished.insert(digest, unfinished);
            }
            continue;
        };
        tracing::info!(dataset = %name, "resuming the hydration of snapshot {digest}");
        start(daemon, registry, name, dataset, Some(resume));
        return;
    }
}

/// Starts a hydration of `name` (of `resume`, a snapshot found half-done on disk, if given).
pub(crate) fn start(
    daemon: &Arc<Daemon>,
    registry: &mut registry::Registry,
    name: &str,
    dataset: Dataset,
    resume: Option<Resume>,
) -> tokio::sync::watch::Receiver<bool> {
    let entry = registry.datasets.entry(name.to_string()).or_default();
    let flight = Flight::new();
    flight.info().link_source = entry.current.clone();
    flight.info().for_lease = resume.as_ref().is_some_and(|r| r.for_lease);
    entry.flight = Some(flight.clone());
    let receiver = flight.done.subscribe();
    let (daemon, name) = (daemon.clone(), name.to_string());
    tokio::spawn(async move {
        // A panic is a failed hydration, never a dataset left `hydrating` forever.
        let hydration = hydrate(&daemon, &name, &dataset, &flight, resume);
        let result = AssertUnwindSafe(hydration)
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(HydrationError::Panicked(panic_message(&*panic))));
        finish(&daemon, &name, &flight, result);
    });
    receiver
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

/// Books the end of a hydration, starts the next one waiting for the dataset and wakes the
/// waiters.
fn finish(daemon: &Arc<Daemon>, name: &str, flight: &Flight, result: Result<Done, HydrationError>) {
    let seconds = flight.started.elapsed().as_secs_f64();
    if let Some(schedule) = flight.schedule.get() {
        match &result {
            Ok(_) => schedule.all_local(),
            Err(reason) => schedule.close(&format!("the hydration ended: {reason}")),
        }
    }
    let stats = &flight.stats;
    daemon
        .metrics
        .fetched(name, Stats::get(&stats.bytes_received));
    daemon.metrics.peers_delivered(
        name,
        Stats::get(&stats.bytes_from_peers),
        Stats::get(&stats.peer_fallbacks),
    );
    {
        let mut registry = daemon.registry();
        let stopping = *daemon.stop.borrow();
        let (digest, for_lease) = {
            let info = flight.info();
            (info.snapshot.clone(), info.for_lease)
        };
        let unfinished = match (&result, &digest) {
            (Err(reason), Some(digest)) if !stopping => {
                (registry.leased(name, digest, registry::now_unix())).then(|| Unfinished {
                    reason: reason.to_string(),
                    schedule: flight.schedule.get().cloned(),
                })
            }
            _ => None,
        };
        let entry = registry.datasets.entry(name.to_string()).or_default();
        entry.flight = None;
        entry.changed_on_disk();
        if let (Some(digest), Some(unfinished)) = (&digest, unfinished) {
            tracing::warn!(
                dataset = name,
                "the leased snapshot {digest} stays incomplete"
            );
            entry.unfinished.insert(digest.clone(), unfinished);
        }
        let ended = match result {
            Ok(done) => {
                entry.unfinished.remove(&done.digest);
                entry.ready.insert(done.digest.clone(), done.ready);
                // A leased snapshot resumed behind a newer one: the dataset serves its own.
                if !for_lease || entry.current.is_none() {
                    entry.current = Some(done.digest);
                    entry.checked_at = Some(std::time::Instant::now());
                    entry.refreshed_at = Some(crate::units::now_rfc3339());
                    (entry.failure, entry.failures, entry.failed_at) = (None, 0, None);
                }
                tracing::info!(dataset = name, "ready in {seconds:.1} s");
                HydrationResult::Complete
            }
            // Cut short by this daemon's own stop: not the dataset's failure. Waiting clients
            // see no end and ask the next daemon, which resumes it.
            Err(reason) if stopping => {
                tracing::info!(
                    dataset = name,
                    "hydration stopped with the daemon: {reason}"
                );
                HydrationResult::Stopped
            }
            // Its reason is the leased snapshot's condition, not the dataset's failure.
            Err(reason) if for_lease => {
                tracing::error!(
                    dataset = name,
                    "an older snapshot resumed for its lease did not complete: {reason}"
                );
                HydrationResult::Failed
            }
            Err(reason) => {
                match entry.current {
                    Some(_) => tracing::error!(
                        dataset = name,
                        "refresh failed: {reason}; serving the snapshot held"
                    ),
                    None => tracing::error!(dataset = name, "hydration failed: {reason}"),
                }
                entry.failure = Some(reason);
                entry.failures += 1;
                entry.failed_at = Some(std::time::Instant::now());
                HydrationResult::Failed
            }
        };
        daemon.metrics.hydration_finished(name, ended, seconds);
        if !stopping {
            resume_next(daemon, &mut registry, name);
        }
    }
    daemon.state_changed();
    flight.done.send_replace(true);
}

/// Warns that the server does not list `name`'s object versions, once per dataset and daemon
/// life: every refresh lists again, and would say it again.
fn say_once(daemon: &Daemon, name: &str, unversioned: &snapshot::Unversioned) {
    let first = {
        let mut registry = daemon.registry();
        let entry = registry.datasets.entry(name.to_string()).or_default();
        !std::mem::replace(&mut entry.unversioned_said, true)
    };
    if first {
        tracing::warn!(dataset = name, "{unversioned} (said once for this dataset)");
    }
}

/// The node's dfdaemon, for a dataset that takes its large objects from peers.
async fn peers(daemon: &Daemon, cfg: &SyncConfig, p2p: &P2p) -> Arc<dyn crate::p2p::Peers> {
    let s3 = client::build(cfg.client_settings(), daemon.budget.slots.responses.clone()).await;
    Arc::new(Dfdaemon::new(
        &p2p.socket,
        s3,
        p2p.min_object_size,
        p2p.timeout,
    ))
}

struct Done {
    digest: String,
    ready: ReadySnapshot,
}

async fn hydrate(
    daemon: &Arc<Daemon>,
    name: &str,
    dataset: &Dataset,
    flight: &Flight,
    resume: Option<Resume>,
) -> Result<Done, HydrationError> {
    let _permit = daemon
        .hydrations
        .acquire()
        .await
        .map_err(|_| HydrationError::Stopping)?;
    if *daemon.stop.borrow() {
        return Err(HydrationError::Stopping);
    }
    let concurrency = daemon.catalog().cache.concurrency;
    let dir = |digest: &str| registry::snapshot_dir(&daemon.root, name, digest);
    let mut cfg = dataset
        .sync_config(Default::default(), concurrency)
        .map_err(SyncError::from)?;
    flight.set_phase(Phase::Listing);
    let snapshot = match resume
        .map(|r| r.snapshot)
        .or_else(|| dataset.pinned.clone())
    {
        Some(snapshot) => snapshot,
        None => {
            let client =
                client::build(cfg.client_settings(), daemon.budget.slots.responses.clone()).await;
            let created = snapshot::create(client, &dataset.source, cfg.client_settings()).await?;
            if let Some(unversioned) = &created.unversioned {
                say_once(daemon, name, unversioned);
            }
            Arc::new(created.snapshot)
        }
    };
    let digest = snapshot.digest.clone();
    {
        let mut info = flight.info();
        info.snapshot = Some(digest.clone());
        (info.objects, info.bytes) = (snapshot.objects, snapshot.bytes);
    }
    let already = daemon.registry().datasets[name].ready.get(&digest).cloned();
    if let Some(ready) = already {
        tracing::info!(dataset = name, "the source is unchanged: snapshot {digest}");
        return Ok(Done { digest, ready });
    }
    cfg.dest = dir(&digest);
    cfg.snapshot = Some(snapshot.clone());
    cfg.dest_anchor = Some(daemon.root.clone());
    let link_source = flight.info().link_source.clone().filter(|s| *s != digest);
    let linked = {
        let (root, name, source, snapshot) = (
            daemon.root.clone(),
            name.to_string(),
            crate::manifest::journal::SourceInfo::from(&cfg),
            snapshot.clone(),
        );
        flight.set_phase(Phase::Linking);
        let dest = cfg.dest.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<link::Linked> {
            let new_dest = Dest::open_beneath(&root, &dest)?;
            if let Some(dataset_dir) = dest.parent() {
                registry::restrict(dataset_dir, registry::PASSAGE_MODE)?;
            }
            snapshot::write(
                &registry::snapshot_file(&root, &name, &snapshot.digest),
                &snapshot,
            )?;
            match link_source {
                Some(previous) => link::link_unchanged(
                    &Dest::open_beneath(&root, &registry::snapshot_dir(&root, &name, &previous))?,
                    &new_dest,
                    &source,
                    &snapshot,
                ),
                None => Ok(link::Linked::default()),
            }
        })
        .await?
        .local("preparing", &cfg.dest)?
    };
    if linked.objects > 0 {
        tracing::info!(
            dataset = name,
            "{} unchanged objects linked from the previous snapshot",
            linked.objects
        );
        daemon.metrics.served_from_cache(name, linked.bytes);
    }
    flight.set_phase(Phase::Reserving);
    super::evict::reserve(daemon, flight, name, snapshot.bytes).await?;
    let schedule =
        flight.schedule.get_or_init(|| {
            let mut placement = Placement::default();
            let files = snapshot.entries.iter().filter(|e| {
                match plan_key(&snapshot.prefix, &e.key, e.size) {
                    KeyPlan::File(rel) => placement.place(&rel).is_ok(),
                    _ => false,
                }
            });
            let whole_only = !dataset.stream_unchecked;
            Arc::new(Schedule::new(files.map(|e| e.key.clone())).whole_files_only(whole_only))
        });
    flight.set_phase(Phase::Downloading);
    let catalog = daemon.catalog();
    let peers = match (dataset.p2p, &catalog.p2p) {
        (true, Some(p2p)) => Some(peers(daemon, &cfg, p2p).await),
        _ => None,
    };
    let hooks = Hooks {
        peers,
        schedule: Some(schedule.clone()),
        budget: Some(daemon.budget.clone()),
        stats: flight.stats.clone(),
        stop: Some(daemon.stop.subscribe()),
        ..Default::default()
    };
    let outcome = engine::run_with(cfg, hooks).await?;
    if outcome.exit != Exit::Success {
        let summary = outcome.summary;
        return Err(match (outcome.error, summary.failures.into_iter().next()) {
            (Some(SyncError::EmptySelection(empty)), _) => HydrationError::EmptySelection(empty),
            (Some(error), _) => HydrationError::Sync(error),
            (None, Some(first)) => HydrationError::ObjectsFailed {
                failed: summary.objects.failed,
                key: first.key,
                reason: first.reason,
            },
            (None, None) => HydrationError::Incomplete,
        });
    }
    Ok(Done {
        digest,
        ready: ReadySnapshot {
            objects: snapshot.objects,
            bytes: snapshot.bytes,
            last_used: registry::now_unix(),
        },
    })
}
