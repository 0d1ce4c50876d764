//! A whole sync in three stages: `prepare` (validate, lock DEST, open the manifest, start the
//! writers, the committer and the request budget), `mirror` (stream the listing into object
//! tasks and gather their results) and `finish` (flush, fold the manifest, `--delete`, READY, the
//! summary and the report).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::adaptive::{self, RequestSlots};
use super::ahead::{self, Ahead};
use super::ceiling::Ceiling;
use super::checkpoint::{self, Checkpoints};
use super::context::{Ctx, FetchCtx, WriteCtx};
use super::failures::{self, Cause, Unshown};
use super::limits;
use super::measure::Baseline;
use super::object::mirror_object;
use super::priority::RESERVED_SLOTS;
use super::progress::Progress;
use super::rate::Rates;
use super::schedule::{Planned, Schedule};
use super::stats::Stats;
use crate::bound::Bound;
use crate::config::{Concurrency, SyncConfig};
use crate::console::{self, Level};
use crate::error::{
    EmptySelection, ErrorKind, Exit, IoContext, LocalError, NoSpace, ObjectError, SyncError,
    TooManyFailures, UsageError,
};
use crate::fs::Dir;
use crate::host::Host;
use crate::manifest::fold::Folded;
use crate::manifest::journal::SourceInfo;
use crate::manifest::listed::ListedKeys;
use crate::manifest::lock::{self, DestLock};
use crate::manifest::ready::{self, Ready};
use crate::manifest::selected::{self, Selected};
use crate::manifest::{self, journal, Manifest};
use crate::plan::filter::KeyFilter;
use crate::plan::keys::{plan_key, KeyPlan, Placement, RelPath, STATE_DIR};
use crate::report::{
    ByteCounts, Failure, FileRecord, FileStatus, ObjectCounts, ReportSink, RunResult,
    SelectionCounts, Summary, REPORT_VERSION,
};
use crate::snapshot;
use crate::source::list::{self, ObjectEntry};
use crate::source::object_source::{ObjectRef, ObjectSource};
use crate::source::s3::S3Source;
use crate::write::buffer::{BufferPool, WRITE_BUFFER_SIZE};
use crate::write::commit::Committer;
use crate::write::dest::{Dest, DirectWrites};
use crate::write::prune;
use crate::write::Writers;

/// Pool buffers per in-flight GET: one being filled, one queued at a writer.
const BUFFERS_PER_REQUEST: usize = 2;
/// Spare buffers so that writers never idle while GETs refill.
const SPARE_BUFFERS: usize = 4;

/// Request slots and write buffers that several runs in one process share, so that together
/// they stay inside one concurrency and memory budget and back off together when throttled.
#[derive(Clone)]
pub(crate) struct Budget {
    pub slots: Arc<RequestSlots>,
    pub pool: BufferPool,
    /// Bandwidth and request-rate caps.
    pub rates: Arc<Rates>,
    /// The cores and network the budget was sized for.
    pub host: Arc<Host>,
}

impl Budget {
    /// The budget of `concurrency` requests in flight (and the buffers they need); with
    /// `Auto`, as many as this machine's [`Ceiling`], and the adaptive controller runs until
    /// the returned handle is aborted.
    pub(crate) fn new(concurrency: Concurrency, rates: Rates) -> (Self, Option<JoinHandle<()>>) {
        let host = Arc::new(Host::read());
        let max = match concurrency {
            Concurrency::Auto => {
                let ceiling = Ceiling::of(&host);
                tracing::debug!(?host, "concurrency auto: at most {ceiling}");
                ceiling.requests
            }
            Concurrency::Fixed(n) => n,
        };
        let in_flight = limits::in_flight(max, max * adaptive::OBJECTS_PER_SLOT);
        let slots = Arc::new(RequestSlots::new(
            concurrency.initial(),
            in_flight.requests,
            in_flight.objects,
        ));
        let controller =
            (concurrency == Concurrency::Auto).then(|| adaptive::spawn_controller(slots.clone()));
        let pool = BufferPool::new(buffer_count(max + RESERVED_SLOTS), WRITE_BUFFER_SIZE);
        let rates = Arc::new(rates);
        let budget = Self {
            slots,
            pool,
            rates,
            host,
        };
        (budget, controller)
    }
}

/// How a run is embedded: its own budget or a shared one, counters the caller can watch, a
/// signal that stops it early (the run then flushes its manifest and reports `Stopped`), and
/// the object store to read (an S3 client built from the config when `None`).
#[derive(Default)]
pub(crate) struct Hooks {
    pub budget: Option<Budget>,
    pub stats: Arc<Stats>,
    pub stop: Option<watch::Receiver<bool>>,
    pub source: Option<Arc<dyn ObjectSource>>,
    /// Keys a `--dry-run` takes as unknown to the manifest (`verify --repair --dry-run`: the
    /// files found bad, which the repair forgets before it syncs). A real run never reads it.
    pub forgotten: std::collections::HashSet<String>,
    /// A `--dry-run` takes DEST's READY as gone (`verify --repair --dry-run` of a damaged
    /// DEST: the repair removes READY before it syncs). A real run never reads it.
    pub ready_removed: bool,
    /// A listing made by the caller (a lazy view lists before it mounts): its ETags pin the
    /// objects, so one that changes is an error, as with a snapshot.
    pub listing: Option<Listing>,
    /// The order to fetch in, when not the listing's (a lazy view's readers steer it).
    pub schedule: Option<Arc<Schedule>>,
    /// The node's peers, for the sealed objects large enough to be worth them.
    pub peers: Option<Arc<dyn crate::p2p::Peers>>,
    /// Added to each durable batch: a disk slower than the network.
    #[cfg(test)]
    pub slow_disk: Duration,
}

pub(crate) use crate::source::list::Listing;

/// The result of a run that got as far as starting.
pub(crate) struct Outcome {
    pub summary: Summary,
    pub exit: Exit,
    /// What cut the run short (the summary's `error`, with its cause).
    pub error: Option<SyncError>,
    /// The failures past the first ones, which were printed as they happened.
    pub unshown: Unshown,
}

impl Outcome {
    /// Prints the run's error, failures and closing line (with `--log-format json`, the
    /// summary as a JSON line on stderr too); returns its exit code.
    pub(crate) fn print(self) -> Exit {
        self.show(true)
    }

    /// As [`print`](Self::print), the closing line on stderr: for a command whose stdout says
    /// something else (`warm --fallback`: the directory).
    pub(crate) fn print_on_stderr(self) -> Exit {
        self.show(false)
    }

    fn show(self, closing_line_on_stdout: bool) -> Exit {
        if let Some(error) = &self.summary.error {
            let what = match self.error {
                Some(SyncError::TooManyFailures(_)) => "stopping",
                _ => "error",
            };
            crate::note!(Level::Error, "{what}: {error}");
        }
        if !self.unshown.is_empty() {
            console::say(Level::Error, &self.unshown, None);
        }
        let line = self.summary.one_line();
        if closing_line_on_stdout {
            crate::out!("{line}");
        }
        let level = match self.exit {
            Exit::Success => Level::Info,
            _ => Level::Error,
        };
        let message = line.trim_start_matches("hydrator: ");
        if console::json() {
            console::say(level, message, Some(&self.summary));
        } else if !closing_line_on_stdout {
            console::say(level, message, None);
        }
        self.exit
    }
}

/// Runs a sync embedded as `hooks` say.
pub(super) async fn run_with(
    cfg: SyncConfig,
    hooks: Hooks,
    mut stop: Option<watch::Receiver<bool>>,
) -> Result<Outcome, SyncError> {
    let started = Instant::now();
    let mut run = match prepare(&cfg, hooks, &mut stop, started).await? {
        Start::AlreadyThere(outcome) => return Ok(*outcome),
        Start::Run(run) => *run,
    };
    let mirrored = mirror(&cfg, &mut run, &mut stop).await;
    Ok(finish(&cfg, run, mirrored, started).await)
}

/// A run that holds DEST and has its pipeline started.
struct Prepared {
    ctx: Arc<Ctx>,
    filter: KeyFilter,
    state_dir: Dir,
    _lock: DestLock,
    sink: ReportSink,
    progress: Progress,
    checkpointer: JoinHandle<()>,
    controller: Option<JoinHandle<()>>,
    listing: Listing,
    schedule: Option<Arc<Schedule>>,
    host: Arc<Host>,
    baseline: Baseline,
}

enum Start {
    /// `--snapshot` and DEST's READY already names it: nothing to do.
    AlreadyThere(Box<Outcome>),
    Run(Box<Prepared>),
}

async fn prepare(
    cfg: &SyncConfig,
    hooks: Hooks,
    stop: &mut Option<watch::Receiver<bool>>,
    started: Instant,
) -> Result<Start, SyncError> {
    let filter = cfg.key_filter()?;
    let dest = match &cfg.dest_anchor {
        Some(anchor) => Dest::open_beneath(anchor, &cfg.dest),
        None => Dest::open(&cfg.dest),
    };
    let dest = dest.map_err(|err| dest_unusable(cfg, err))?;
    let state_dir = dest.state_dir().map_err(|err| {
        UsageError::new(format!(
            "cannot use {}/.hydrator: {err}",
            cfg.dest.display()
        ))
    })?;
    let state_path = cfg.dest.join(STATE_DIR);
    let lock = tokio::select! {
        lock = lock::acquire(&state_dir, cfg.lock_timeout) => lock?,
        () = stopped(stop) => return Err(SyncError::Stopped),
    };
    if let Some(outcome) = snapshot_already_there(cfg, &state_dir, started) {
        return Ok(Start::AlreadyThere(Box::new(outcome)));
    }
    refuse_another_dataset(cfg, &state_dir)?;
    let sink = report_sink(cfg)?;
    let writers = Writers::start(cfg.io_backend)?;
    let direct = DirectWrites::resolve(cfg.direct_io, &dest);
    let manifest = state_dir
        .try_clone()
        .and_then(|dir| Manifest::open(dir, &journal::SourceInfo::from(cfg)))
        .local("opening the manifest in", &state_path)?;
    ready::remove(&state_dir)
        .and_then(|()| selected::remove(&state_dir))
        .local("removing READY from", &state_path)?;
    tracing::info!(
        backend = %writers.backend,
        "writing with {}, {direct}",
        writers.backend
    );
    let dest = Arc::new(dest);
    let manifest = Arc::new(manifest);
    let checkpoints = Arc::new(Checkpoints::new(&dest).local("opening", &cfg.dest)?);
    #[cfg(not(test))]
    let slow_disk = Duration::ZERO;
    #[cfg(test)]
    let slow_disk = hooks.slow_disk;
    let committer =
        Committer::start(dest.clone(), manifest.clone(), slow_disk).local("opening", &cfg.dest)?;
    let checkpointer = checkpoint::spawn(checkpoints.clone(), manifest.clone());
    let (budget, controller) = match hooks.budget {
        Some(budget) => (budget, None),
        None => Budget::new(
            cfg.concurrency(),
            Rates::new(cfg.max_bandwidth, cfg.max_requests_per_second),
        ),
    };
    let source = match hooks.source {
        Some(source) => source,
        None => {
            let responses = budget.slots.responses.clone();
            Arc::new(S3Source::for_settings(cfg.client_settings(), responses).await)
        }
    };
    let progress = Progress::start(cfg.progress, hooks.stats.clone());
    let ctx = Arc::new(Ctx {
        fetch: FetchCtx {
            source,
            bucket: cfg.source.bucket.clone(),
            part_size: cfg.part_size(),
            request_slots: budget.slots,
            pool: budget.pool,
            rates: budget.rates,
            stats: hooks.stats,
            pinned: cfg.snapshot.is_some() || hooks.listing.is_some(),
            check_md5: cfg.check_md5,
            peers: hooks.peers,
        },
        write: WriteCtx {
            dest,
            direct,
            writers,
            committer,
            manifest,
            checkpoints,
            partials: Arc::default(),
            schedule: hooks.schedule.clone(),
        },
    });
    let baseline = Baseline::take(&ctx);
    let listing = match (hooks.listing, &cfg.snapshot) {
        (Some(listing), _) => listing,
        (None, Some(snapshot)) => snapshot::spawn_entries(snapshot.clone()),
        (None, None) => list::spawn(ctx.fetch.source.clone(), cfg.source.clone()),
    };
    let ahead = Ahead {
        filter: cfg.key_filter()?,
        prefix: cfg.source.prefix.clone(),
        known: ctx
            .write
            .manifest
            .cursor()
            .local("reading the manifest in", &state_path)?,
        state_dir: state_dir.try_clone().local("opening", &state_path)?,
        dest: cfg.dest.clone(),
        stats: ctx.fetch.stats.clone(),
    };
    let listing =
        ahead::spawn(listing, ahead).local("starting the listing's read-ahead in", &state_path)?;
    Ok(Start::Run(Box::new(Prepared {
        ctx,
        filter,
        state_dir,
        _lock: lock,
        sink,
        progress,
        checkpointer,
        controller,
        listing,
        schedule: hooks.schedule,
        host: budget.host,
        baseline,
    })))
}

/// What mirroring left behind.
struct Mirrored {
    /// What cut the run short: a broken listing, a stop signal, a report that cannot be written.
    fatal: Option<SyncError>,
    failures: failures::Book,
    /// The keys the run mirrors (all of the source's only when nothing was fatal).
    listed: Option<ListedKeys>,
}

/// Streams the listing into object tasks and books their results.
async fn mirror(
    cfg: &SyncConfig,
    run: &mut Prepared,
    stop: &mut Option<watch::Receiver<bool>>,
) -> Mirrored {
    let ctx = run.ctx.clone();
    let stats = ctx.fetch.stats.clone();
    let schedule = run.schedule.clone();
    let mut tally = Tally {
        stats: &stats,
        sink: &mut run.sink,
        failures: failures::Book::new(false, cfg.max_errors),
        tripped: None,
        sink_error: None,
        schedule: schedule.as_deref(),
        placement: Placement::default(),
        full_disk: None,
    };
    let state_path = cfg.dest.join(STATE_DIR);
    let manifest = &ctx.write.manifest;
    let mut planner = match manifest
        .cursor()
        .and_then(|cursor| Ok((cursor, ListedKeys::create(&run.state_dir)?)))
    {
        Ok((base, listed)) => Planner {
            base,
            listed,
            filter: &run.filter,
            prefix: &cfg.source.prefix,
            state_dir: &run.state_dir,
            state_path: &state_path,
        },
        Err(err) => {
            return Mirrored {
                fatal: Some(LocalError::new("reading the manifest in", state_path, err).into()),
                failures: tally.failures,
                listed: None,
            }
        }
    };
    let mut tasks = JoinSet::new();
    let listing = &mut run.listing;
    let mut fatal = match &schedule {
        None => in_listing_order(&ctx, listing, &mut planner, &mut tally, &mut tasks, stop).await,
        Some(schedule) => {
            in_schedule_order(
                &ctx,
                listing,
                &mut planner,
                &mut tally,
                &mut tasks,
                stop,
                schedule,
            )
            .await
        }
    };
    if fatal.is_none() {
        fatal = loop {
            if tally.full_disk.is_some() {
                break None;
            }
            if let Some(err) = tally.tripped() {
                break Some(err);
            }
            tokio::select! {
                done = tasks.join_next() => match done {
                    Some(done) => tally.joined(done),
                    None => break None,
                },
                () = stopped(stop) => break Some(SyncError::Stopped),
            }
        };
    }
    tasks.abort_all();
    while let Some(done) = tasks.join_next().await {
        tally.joined(done);
    }
    if let Some((key, cause)) = tally.full_disk.take() {
        let mount = ahead::mount_point(&cfg.dest);
        let cause = Box::new(cause);
        fatal.get_or_insert(NoSpace::Full { mount, key, cause }.into());
    }
    if let Some(SyncError::NoSpace(_)) = &fatal {
        // Every download has ended: what they reserved and never wrote can go.
        let released = ctx.write.partials.release_unwritten();
        if released.files > 0 {
            tracing::info!(
                "gave back {} reserved for {} partial files and not written; their written parts are kept for the next run",
                crate::units::human_bytes(released.bytes),
                released.files
            );
        }
    }
    if let (None, Some(err)) = (&fatal, tally.sink_error.take()) {
        let report = cfg.report.clone().unwrap_or_default();
        fatal = Some(LocalError::new("writing the report spool for", report, err).into());
    }
    Mirrored {
        fatal,
        failures: tally.failures,
        listed: Some(planner.listed),
    }
}

type ObjectTasks = JoinSet<(String, Result<FileRecord, ObjectError>)>;

/// Plans listed entries in listing order: their files, and what the manifest knows of them.
struct Planner<'a> {
    base: manifest::base::Cursor,
    listed: ListedKeys,
    filter: &'a KeyFilter,
    prefix: &'a str,
    state_dir: &'a Dir,
    state_path: &'a std::path::Path,
}

impl Planner<'_> {
    /// `None` for an entry the run does not mirror (booked by `tally`).
    fn plan(
        &mut self,
        tally: &mut Tally,
        entry: ObjectEntry,
    ) -> Result<Option<Planned>, SyncError> {
        let Some(rel) = tally.select(self.prefix, self.filter, &entry) else {
            return Ok(None);
        };
        let known = self
            .listed
            .push(&entry.key)
            .and_then(|()| self.base.take(&entry.key))
            .local("reading the manifest in", self.state_path)?;
        Ok(Some(Planned {
            entry,
            rel,
            known,
            window: None,
        }))
    }

    /// The listing has ended: its totals are final, and recorded for `verify` (a DEST without
    /// READY then says how much of the selection it holds).
    fn listing_ended(&self, stats: &Stats) {
        stats.listing_done.store(true, Relaxed);
        let selected = Selected {
            objects: Stats::get(&stats.objects_listed)
                - Stats::get(&stats.objects_filtered)
                - Stats::get(&stats.directory_markers),
            bytes: Stats::get(&stats.bytes_listed),
        };
        if let Err(err) = selected::write(self.state_dir, selected) {
            let at = self.state_path.display();
            tracing::warn!("recording the listing's totals in {at}: {err}");
        }
    }
}

/// Each planned object's task, started when an object slot is free.
async fn start(
    ctx: &Arc<Ctx>,
    tasks: &mut ObjectTasks,
    planned: Planned,
    stop: &mut Option<watch::Receiver<bool>>,
) -> Result<(), SyncError> {
    let permit = tokio::select! {
        permit = ctx.fetch.request_slots.acquire_object(planned.entry.size) => permit,
        () = stopped(stop) => return Err(SyncError::Stopped),
    };
    let ctx = ctx.clone();
    tasks.spawn(async move {
        let Planned {
            entry,
            rel,
            known,
            window,
        } = planned;
        let permit = permit.holding(window.map(|w| Box::new(w) as Box<dyn Send + Sync>));
        let key = entry.key.clone();
        let result = mirror_object(ctx, entry, rel, known, permit).await;
        (key, result)
    });
    Ok(())
}

/// A sync: objects start in listing order as they are listed.
async fn in_listing_order(
    ctx: &Arc<Ctx>,
    listing: &mut Listing,
    planner: &mut Planner<'_>,
    tally: &mut Tally<'_>,
    tasks: &mut ObjectTasks,
    stop: &mut Option<watch::Receiver<bool>>,
) -> Option<SyncError> {
    loop {
        if let Some(err) = tally.tripped() {
            return Some(err);
        }
        let asked = Instant::now();
        let item = tokio::select! {
            item = listing.recv() => item,
            () = stopped(stop) => return Some(SyncError::Stopped),
        };
        Stats::add_since(&tally.stats.listing_wait_nanos, asked);
        let entry = match item {
            Some(Ok(entry)) => entry,
            Some(Err(err)) => return Some(err),
            None => {
                planner.listing_ended(tally.stats);
                return None;
            }
        };
        let planned = match planner.plan(tally, entry) {
            Ok(Some(planned)) => planned,
            Ok(None) => continue,
            Err(err) => return Some(err),
        };
        if let Err(err) = start(ctx, tasks, planned, stop).await {
            return Some(err);
        }
        while let Some(done) = tasks.try_join_next() {
            tally.joined(done);
        }
        if tally.full_disk.is_some() {
            return None;
        }
    }
}

/// A lazy view: objects are planned in listing order and start in the schedule's order.
async fn in_schedule_order(
    ctx: &Arc<Ctx>,
    listing: &mut Listing,
    planner: &mut Planner<'_>,
    tally: &mut Tally<'_>,
    tasks: &mut ObjectTasks,
    stop: &mut Option<watch::Receiver<bool>>,
    schedule: &Schedule,
) -> Option<SyncError> {
    let mut planning = true;
    loop {
        if let Some(err) = tally.tripped() {
            return Some(err);
        }
        tokio::select! {
            item = listing.recv(), if planning => match item {
                Some(Ok(entry)) => match planner.plan(tally, entry) {
                    Ok(Some(planned)) => {
                        if let Some(unknown) = schedule.push(planned) {
                            // Not in the view: fetched all the same, so that READY is honest.
                            if let Err(err) = start(ctx, tasks, unknown, stop).await {
                                return Some(err);
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(err) => return Some(err),
                },
                Some(Err(err)) => return Some(err),
                None => {
                    planner.listing_ended(tally.stats);
                    schedule.planning_done();
                    planning = false;
                }
            },
            planned = schedule.next(ctx.fetch.request_slots.limit()) => match planned {
                Some(planned) => {
                    if let Err(err) = start(ctx, tasks, planned, stop).await {
                        return Some(err);
                    }
                }
                None => return None,
            },
            Some(done) = tasks.join_next(), if !tasks.is_empty() => tally.joined(done),
            () = stopped(stop) => return Some(SyncError::Stopped),
        }
        if tally.full_disk.is_some() {
            return None;
        }
    }
}

/// Flushes what is durable, applies `--delete`, writes READY when the dataset is complete, and
/// reports.
async fn finish(cfg: &SyncConfig, run: Prepared, mirrored: Mirrored, started: Instant) -> Outcome {
    let Mirrored {
        mut fatal,
        failures,
        listed,
    } = mirrored;
    let (failures, unshown) = failures.finish();
    let ctx = &run.ctx;
    let (stats, manifest) = (&ctx.fetch.stats, &ctx.write.manifest);
    run.progress.finish();
    // Every object that counts as done has awaited its own durable commit; tasks of aborted
    // objects may still be unwinding and holding `ctx`.
    run.checkpointer.abort();
    if let Some(controller) = run.controller {
        controller.abort();
    }
    let flushed = {
        let (checkpoints, manifest) = (ctx.write.checkpoints.clone(), manifest.clone());
        tokio::task::spawn_blocking(move || checkpoints.flush(&manifest)).await
    };
    if let Ok(Err(err)) = flushed {
        tracing::warn!("recording the last durable parts failed: {err}");
    }
    let any_failed = Stats::get(&stats.objects_failed) > 0;
    if fatal.is_none() {
        let source = ctx.fetch.source.as_ref();
        fatal = empty_selection(cfg, stats, source).await.map(Into::into);
    }
    if cfg.delete && any_failed {
        tracing::warn!("--delete skipped: some objects failed, so their local copies are kept");
    }
    let state_path = cfg.dest.join(STATE_DIR);
    let complete = fatal.is_none() && !any_failed;
    let delete = complete && cfg.delete;
    let in_scope = |path: &str| run.filter.accepts(path);
    // A run cut short leaves its journal for the next run to fold, so stopping stays quick.
    let forget_unlisted = delete.then_some(&in_scope as &dyn Fn(&str) -> bool);
    let folded = match fatal.is_none() {
        false => None,
        true => match manifest.fold(listed.filter(|_| complete), forget_unlisted) {
            Ok(folded) => Some(folded),
            Err(err) => {
                let err = LocalError::new("recording the manifest in", &state_path, err);
                fatal = Some(err.into());
                None
            }
        },
    };
    let (dest, prefix) = (&ctx.write.dest, &cfg.source.prefix);
    match (folded.is_some() && complete, delete) {
        (false, _) => {}
        (true, true) => match prune::remove_unlisted(dest, manifest, &run.filter, prefix) {
            Ok(removed) => stats.files_deleted.store(removed, Relaxed),
            Err(err) => {
                let err = LocalError::new("--delete: removing unlisted files in", &cfg.dest, err);
                fatal = Some(err.into());
            }
        },
        (true, false) => match prune::count_unlisted(dest, manifest, &run.filter, prefix) {
            Ok(foreign) => stats.files_foreign.store(foreign, Relaxed),
            Err(err) => {
                tracing::warn!("counting the files in DEST that are not in the source: {err}")
            }
        },
    }
    if let (true, Some(folded)) = (complete && fatal.is_none(), &folded) {
        if let Err(err) = write_ready(cfg, &run.state_dir, folded) {
            fatal = Some(LocalError::new("writing READY in", state_path, err).into());
        }
    }
    let exit = match &fatal {
        Some(err) => err.exit(),
        None if any_failed => Exit::Failed,
        None => Exit::Success,
    };
    let writers = &ctx.write.writers;
    let summary = summarize(
        cfg,
        stats,
        exit,
        fatal.as_ref(),
        Some(RunFacts {
            backend: writers.backend,
            fallback_reason: writers.fallback_reason.clone(),
            peak_requests: ctx.fetch.request_slots.peak(),
            rate_limited_seconds: ctx.fetch.rates.waited_seconds(),
            bound: run.baseline.bound(ctx, &run.host),
        }),
        failures,
        started,
    );
    match run.sink.finish(&summary) {
        Ok(()) => Outcome {
            summary,
            exit,
            error: fatal,
            unshown,
        },
        Err(err) => {
            tracing::error!("writing the report: {err}");
            let mut summary = summary;
            if exit == Exit::Success {
                summary.exit_code = Exit::Failed as u8;
                summary.error_kind = Some(ErrorKind::Local);
            }
            Outcome {
                exit: if exit == Exit::Success {
                    Exit::Failed
                } else {
                    exit
                },
                summary,
                error: fatal,
                unshown,
            }
        }
    }
}

/// A DEST whose manifest names another dataset (bucket or prefix) is not mixed with this one,
/// unless `--delete` replaces it: its files would stay beside the new ones under one READY.
pub(super) fn refuse_another_dataset(cfg: &SyncConfig, state_dir: &Dir) -> Result<(), SyncError> {
    let state_path = cfg.dest.join(STATE_DIR);
    let recorded = manifest::recorded(state_dir).local("reading the manifest in", &state_path)?;
    match recorded {
        Some((old, true)) if !cfg.delete && !manifest::same_dataset(&old, &SourceInfo::from(cfg)) => {
            Err(UsageError::new(format!(
                "{} holds another dataset, s3://{}/{}: mirroring {} into it would mix the two; give --delete to replace it, or another DEST",
                cfg.dest.display(),
                old.bucket,
                old.prefix,
                cfg.source
            ))
            .into())
        }
        _ => Ok(()),
    }
}

/// Why a run that selected no object fails, unless `--allow-empty`: a typo in the prefix,
/// filters that keep nothing or an object's key given as the prefix would otherwise write
/// READY over an empty directory, and a trainer would start on nothing. A prefix that lists
/// nothing costs one more request: a HEAD (is it an object's key?) and, when it is not, one
/// listing of its parent for a near name ("did you mean").
pub(super) async fn empty_selection(
    cfg: &SyncConfig,
    stats: &Stats,
    source: &dyn ObjectSource,
) -> Option<EmptySelection> {
    if cfg.allow_empty || stats.objects_finished() > 0 {
        return None;
    }
    let listed = Stats::get(&stats.objects_listed);
    let markers = Stats::get(&stats.directory_markers);
    let origin = match &cfg.snapshot {
        Some(snapshot) => format!("snapshot {} of {}", snapshot.digest, cfg.source),
        None => cfg.source.to_string(),
    };
    let mut why = match listed {
        0 => format!("{origin} lists no objects"),
        n if markers == n => format!("{origin} lists only {n} directory markers"),
        n => {
            let filters = cfg
                .include
                .iter()
                .map(|glob| format!("--include {glob:?}"))
                .chain(cfg.exclude.iter().map(|glob| format!("--exclude {glob:?}")))
                .chain(cfg.shard.map(|shard| format!("--shard {shard}")))
                .collect::<Vec<_>>()
                .join(" ");
            format!("{origin} lists {n} objects and the filters ({filters}) keep none of them")
        }
    };
    let key = cfg.source.prefix.trim_end_matches('/');
    if listed == 0 && cfg.snapshot.is_none() && !key.is_empty() {
        let bucket = &cfg.source.bucket;
        let parent = key
            .rsplit_once('/')
            .map_or(String::new(), |(dir, _)| format!("{dir}/"));
        let object = ObjectRef {
            bucket,
            key,
            version_id: None,
            etag: "",
        };
        if source.head(object, false).await.is_ok() {
            why = format!("{why}: s3://{bucket}/{key} is an object, not a prefix; its prefix is s3://{bucket}/{parent}");
        } else if let Some(near) = near_prefix(source, bucket, &parent, key).await {
            why = format!("{why}; did you mean s3://{bucket}/{near}?");
        }
    }
    Some(EmptySelection { why })
}

/// The prefix beside `key` (under `parent`) whose name is nearest to `key`'s, if one is near
/// enough to be what was meant.
async fn near_prefix(
    source: &dyn ObjectSource,
    bucket: &str,
    parent: &str,
    key: &str,
) -> Option<String> {
    let directories = match source.list_directories(bucket, parent).await {
        Ok(directories) => directories,
        Err(err) => {
            tracing::debug!("looking for a prefix near {key}: {err}");
            return None;
        }
    };
    let name_of = |directory: &str| {
        let name = directory.strip_prefix(parent).unwrap_or(directory);
        name.trim_end_matches('/').to_string()
    };
    let names: Vec<String> = directories.iter().map(|d| name_of(d)).collect();
    let wanted = key.strip_prefix(parent).unwrap_or(key);
    let near = crate::suggest::closest(wanted, names.iter().map(String::as_str))?;
    Some(format!("{parent}{near}/"))
}

/// The error for a DEST that cannot be opened.
pub(super) fn dest_unusable(cfg: &SyncConfig, err: std::io::Error) -> UsageError {
    // DEST, or a directory on its way, is a file: said so, not as "File exists".
    let mut ancestors: Vec<&std::path::Path> = cfg.dest.ancestors().collect();
    ancestors.reverse();
    let file = ancestors
        .into_iter()
        .filter(|path| !path.as_os_str().is_empty())
        .find(|path| std::fs::metadata(path).is_ok_and(|meta| !meta.is_dir()));
    if let Some(file) = file {
        let dest = cfg.dest.display();
        return UsageError::new(match file == cfg.dest {
            true => format!(
                "destination {dest} must be a directory (created if missing), but it is a file"
            ),
            false => format!(
                "destination {dest} must be a directory (created if missing), but {} is a file",
                file.display()
            ),
        });
    }
    let remedy = match err.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            " (this process runs as uid {}: in a pod, give the volume to its group with securityContext.fsGroup, or chown the directory)",
            rustix::process::geteuid().as_raw()
        ),
        std::io::ErrorKind::ReadOnlyFilesystem => {
            " (a read-only mount: hydrate into a writable volume and mount that read-only in the trainer)".to_string()
        }
        _ => String::new(),
    };
    UsageError::new(format!(
        "cannot open destination {}: {err}{remedy}",
        cfg.dest.display()
    ))
}

/// The sink for `--report` (or none).
pub(super) fn report_sink(cfg: &SyncConfig) -> Result<ReportSink, UsageError> {
    ReportSink::new(cfg.report.as_deref()).map_err(|err| {
        UsageError::new(format!(
            "cannot write the report next to {:?}: {err}",
            cfg.report
        ))
    })
}

/// Resolves once `stop` says so; never without a stop signal.
pub(super) async fn stopped(stop: &mut Option<watch::Receiver<bool>>) {
    match stop {
        Some(stop) => {
            if stop.wait_for(|stopped| *stopped).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Pooled write buffers for at most `requests` in flight: memory for data in flight is this ×
/// `WRITE_BUFFER_SIZE`.
fn buffer_count(requests: usize) -> usize {
    requests * BUFFERS_PER_REQUEST + SPARE_BUFFERS
}

/// Writes READY over every object this run listed and holds (as the fold counted them).
fn write_ready(cfg: &SyncConfig, state_dir: &Dir, folded: &Folded) -> std::io::Result<()> {
    ready::write(
        state_dir,
        &Ready {
            version: journal::FORMAT_VERSION,
            digest: folded.digest.to_hex().to_string(),
            objects: folded.objects,
            bytes: folded.bytes,
            source: cfg.source.to_string(),
            snapshot: cfg.snapshot.as_ref().map(|s| s.digest.clone()),
            include: cfg.include.clone(),
            exclude: cfg.exclude.clone(),
            shard: cfg.shard.map(|shard| shard.to_string()),
            completed_at: crate::units::now_rfc3339(),
        },
    )
}

/// With `--snapshot`, a DEST whose READY names the same snapshot and filters is done: no S3
/// request. A run checks it under the lock, so no other hydrator is changing DEST meanwhile;
/// a dry run checks it without.
pub(super) fn snapshot_already_there(
    cfg: &SyncConfig,
    state_dir: &Dir,
    started: Instant,
) -> Option<Outcome> {
    let snapshot = cfg.snapshot.as_ref()?;
    let ready = ready::read(state_dir).filter(|r| {
        r.snapshot.as_deref() == Some(snapshot.digest.as_str())
            && r.include == cfg.include
            && r.exclude == cfg.exclude
            && r.shard == cfg.shard.map(|shard| shard.to_string())
    })?;
    tracing::info!("DEST already holds snapshot {} (READY)", snapshot.digest);
    let stats = Stats::default();
    stats.listing_done.store(true, Relaxed);
    for (counter, n) in [
        (&stats.objects_listed, ready.objects),
        (&stats.objects_skipped, ready.objects),
        (&stats.bytes_listed, ready.bytes),
        (&stats.bytes_skipped, ready.bytes),
    ] {
        Stats::add(counter, n);
    }
    let summary = summarize(cfg, &stats, Exit::Success, None, None, vec![], started);
    if let Some(report) = &cfg.report {
        let _ = ReportSink::new(Some(report)).and_then(|sink| sink.finish(&summary));
    }
    Some(Outcome {
        summary,
        exit: Exit::Success,
        error: None,
        unshown: Unshown::default(),
    })
}

/// What only a run that wrote something can say about itself.
pub(super) struct RunFacts {
    backend: crate::write::Backend,
    fallback_reason: Option<String>,
    peak_requests: usize,
    rate_limited_seconds: f64,
    bound: Bound,
}

/// The run's summary, from its counters: the one place a summary is built.
pub(super) fn summarize(
    cfg: &SyncConfig,
    stats: &Stats,
    exit: Exit,
    fatal: Option<&SyncError>,
    facts: Option<RunFacts>,
    failures: Vec<Failure>,
    started: Instant,
) -> Summary {
    let elapsed = started.elapsed().as_secs_f64();
    let downloaded = Stats::get(&stats.bytes_downloaded);
    let selection = stats.selection();
    let error_kind = match (fatal, exit) {
        (Some(err), _) => Some(err.kind()),
        (None, Exit::Success) => None,
        (None, _) => Some(ErrorKind::ObjectsFailed),
    };
    Summary {
        version: REPORT_VERSION,
        dry_run: cfg.dry_run,
        source: cfg.source.to_string(),
        dest: cfg.dest.display().to_string(),
        result: if exit == Exit::Success {
            RunResult::Complete
        } else {
            RunResult::Failed
        },
        error: fatal.map(|err| err.to_string()),
        exit_code: exit as u8,
        error_kind,
        objects: ObjectCounts {
            listed: Stats::get(&stats.objects_listed),
            total: stats.objects_finished(),
            downloaded: Stats::get(&stats.objects_downloaded),
            skipped: Stats::get(&stats.objects_skipped),
            failed: Stats::get(&stats.objects_failed),
            filtered_out: Stats::get(&stats.objects_filtered),
            directory_markers: Stats::get(&stats.directory_markers),
            deleted: Stats::get(&stats.files_deleted),
            foreign: Stats::get(&stats.files_foreign),
        },
        selection: SelectionCounts {
            objects: selection.objects,
            bytes: selection.bytes,
            complete: selection.complete,
        },
        bytes: ByteCounts {
            total: Stats::get(&stats.bytes_listed),
            downloaded,
            skipped: Stats::get(&stats.bytes_skipped),
            resumed: Stats::get(&stats.bytes_resumed),
            received: Stats::get(&stats.bytes_received),
        },
        part_retries: Stats::get(&stats.part_retries),
        object_restarts: Stats::get(&stats.object_restarts),
        io_backend: facts.as_ref().map(|f| f.backend),
        peak_requests_in_flight: facts.as_ref().map_or(0, |f| f.peak_requests),
        rate_limited_seconds: facts.as_ref().map_or(0.0, |f| f.rate_limited_seconds),
        bound: facts.as_ref().map(|f| f.bound.clone()),
        io_backend_fallback_reason: facts.and_then(|f| f.fallback_reason),
        duration_seconds: elapsed,
        throughput_bytes_per_second: downloaded as f64 / elapsed.max(1e-9),
        failures,
    }
}

/// Books finished objects into the counters, the report and the failures.
pub(super) struct Tally<'a> {
    pub stats: &'a Stats,
    pub sink: &'a mut ReportSink,
    pub failures: failures::Book,
    /// `--max-errors` failures in a row: the run stops.
    pub tripped: Option<TooManyFailures>,
    pub sink_error: Option<std::io::Error>,
    /// Told of each finished object (a lazy view waits on it).
    pub schedule: Option<&'a Schedule>,
    /// The files selected so far, so that no path is both a file and a directory.
    pub placement: Placement,
    /// The first object whose write met a full disk: the run stops (exit 4) rather than fail
    /// every object after it.
    pub full_disk: Option<(String, ObjectError)>,
}

impl Tally<'_> {
    /// Counts a listed entry and returns the file it becomes when the run mirrors it; a key
    /// that cannot be a file under DEST is booked as failed.
    pub(super) fn select(
        &mut self,
        prefix: &str,
        filter: &KeyFilter,
        entry: &ObjectEntry,
    ) -> Option<RelPath> {
        let stats = self.stats;
        Stats::add(&stats.objects_listed, 1);
        match plan_key(prefix, &entry.key, entry.size) {
            KeyPlan::DirectoryMarker => Stats::add(&stats.directory_markers, 1),
            KeyPlan::Refused(why) => {
                Stats::add(&stats.bytes_listed, entry.size);
                self.failed(entry.key.clone(), ObjectError::Refused(why));
            }
            KeyPlan::File(rel) if !filter.accepts(rel.as_str()) => {
                Stats::add(&stats.objects_filtered, 1)
            }
            KeyPlan::File(rel) => {
                Stats::add(&stats.bytes_listed, entry.size);
                match self.placement.place(&rel) {
                    Ok(()) => return Some(rel),
                    Err(conflict) => {
                        let why = ObjectError::Refused(conflict.to_string());
                        self.failed(entry.key.clone(), why);
                    }
                }
            }
        }
        None
    }

    fn joined(
        &mut self,
        joined: Result<(String, Result<FileRecord, ObjectError>), tokio::task::JoinError>,
    ) {
        match joined {
            Ok((key, Ok(record))) => {
                if let Some(schedule) = self.schedule {
                    schedule.finished(&key, Ok(()));
                }
                self.done(record)
            }
            Ok((key, Err(err))) => {
                if let Some(schedule) = self.schedule {
                    schedule.finished(&key, Err(&err));
                }
                match (err.disk_full(), &self.full_disk) {
                    (true, None) => self.full_disk = Some((key, err)),
                    (true, Some(_)) => tracing::debug!(key = %key, "{err}"),
                    (false, _) => self.failed(key, err),
                }
            }
            Err(err) if err.is_cancelled() => {}
            Err(err) => self.failed("(unknown)".into(), ObjectError::Task(err)),
        }
    }

    pub(super) fn done(&mut self, record: FileRecord) {
        let (objects, bytes) = match record.status {
            FileStatus::Downloaded | FileStatus::WouldDownload | FileStatus::WouldResume => {
                (&self.stats.objects_downloaded, &self.stats.bytes_downloaded)
            }
            FileStatus::Skipped => (&self.stats.objects_skipped, &self.stats.bytes_skipped),
        };
        Stats::add(objects, 1);
        Stats::add(bytes, record.size);
        self.failures.succeeded();
        if let Err(err) = self.sink.record(&record) {
            self.sink_error.get_or_insert(err);
        }
    }

    /// Books a failed object: counted, spooled for the report, printed if among the first.
    pub(super) fn failed(&mut self, key: String, err: ObjectError) {
        Stats::add(&self.stats.objects_failed, 1);
        let failure = Failure {
            key,
            reason: err.to_string(),
        };
        if let Err(err) = self.sink.failure(&failure) {
            self.sink_error.get_or_insert(err);
        }
        if let Some(tripped) = self.failures.failed(failure, Cause::of(&err)) {
            self.tripped = Some(tripped);
        }
    }

    /// The error that stops the run once `--max-errors` failures came in a row.
    fn tripped(&mut self) -> Option<SyncError> {
        self.tripped.take().map(Into::into)
    }
}
