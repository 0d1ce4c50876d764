//! `hydrator mount`: a dataset readable at once, hydrated meanwhile.
//!
//! The listing (or the snapshot) is read first and frozen into a [`tree::Tree`], so every name,
//! size and mtime is there before any data. The ordinary engine then hydrates the dataset into
//! the cache directory, exactly as `sync` would (manifest, resume, READY), except that it is fed
//! this listing (its ETags pin every object: one that changes is an error, not a restart) and
//! dispatches by a [`Schedule`] that the view's opens steer. The view ([`view::LazyView`]) is a
//! FUSE filesystem whose opens wait for their file to be local and whose reads then go to the
//! local file in the kernel (FUSE passthrough).
//!
//! The mount lives as long as this process: SIGTERM or SIGINT stops the engine (what is durable
//! is recorded, so the next mount or sync resumes) and unmounts; an unmount from outside
//! (`fusermount3 -u`, `umount`) ends the process the same way.

pub(crate) mod backings;
pub(crate) mod pinned;
pub(crate) mod resume;
pub(crate) mod tree;
pub(crate) mod view;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{MountOption, SessionACL};
use rustix::mount::UnmountFlags;
use tokio::sync::{oneshot, watch};

use crate::cli::MountArgs;
use crate::config::SyncConfig;
use crate::console::Level;
use crate::engine::schedule::Schedule;
use crate::engine::{self, rate::Rates, Budget, Hooks, Outcome};
use crate::error::{Exit, IoContext, LocalError, SyncError, UsageError};
use crate::source::list::{self, ObjectEntry};
use crate::source::object_source::ObjectSource;
use crate::source::s3::S3Source;
use crate::write::dest::Dest;
use crate::{snapshot, units};

/// How long an unmounted session may take to end before the process exits without it.
const SESSION_END: Duration = Duration::from_secs(5);
/// Threads answering the kernel's FUSE requests.
const FUSE_THREADS: usize = 4;
/// How often the cache's bind mount over a hydrated view is looked for (an unmount from outside
/// takes it off first).
const WATCH_BIND: Duration = Duration::from_secs(1);

/// Mounts the view, serves it until a signal or an unmount, and returns the hydration's exit
/// code (3 when stopped before the dataset was complete: the next run resumes).
pub(crate) async fn run(args: MountArgs) -> Result<Exit, SyncError> {
    let (allow_other, passthrough) = (args.allow_other, !args.no_passthrough);
    let whole_only = args.no_stream_unchecked;
    let (cfg, mountpoint) = args.into_config()?;
    check_mountpoint(&mountpoint, &cfg.dest)?;
    let (budget, controller) = Budget::new(
        cfg.concurrency(),
        Rates::new(cfg.max_bandwidth, cfg.max_requests_per_second),
    );
    let responses = budget.slots.responses.clone();
    let source: Arc<dyn ObjectSource> =
        Arc::new(S3Source::for_settings(cfg.client_settings(), responses).await);
    let listed = list_all(&cfg, &source).await?;
    let (tree, keys) = plan_view(&cfg, &listed)?;
    let schedule = Arc::new(Schedule::new(keys).whole_files_only(whole_only));
    let (stop, stopped) = watch::channel(false);
    let hooks = Hooks {
        budget: Some(budget),
        source: Some(source),
        listing: Some(feed(listed)),
        schedule: Some(schedule.clone()),
        stop: Some(stopped),
        ..Default::default()
    };
    let mut engine = tokio::spawn(engine::run_with(cfg.clone(), hooks));
    let dest = Dest::open(&cfg.dest).local("opening", &cfg.dest)?;
    let (files, bytes) = (tree.files(), tree.bytes());
    let view = view::LazyView::new(Arc::new(tree), schedule.clone(), dest, passthrough);
    let fsname = format!("hydrator:{}", cfg.source);
    let (mut unmounter, mut session_ended) =
        match serve(view, &mountpoint, fsname, allow_other).await {
            Ok(mounted) => mounted,
            Err(err) => {
                stop.send_replace(true);
                let _ = engine.await;
                return Err(err.into());
            }
        };
    crate::note!(
        Level::Info,
        "mounted {} at {}: {files} files, {}; hydrating into {}",
        cfg.source,
        mountpoint.display(),
        units::human_bytes(bytes),
        cfg.dest.display()
    );
    let mut signals = crate::signals::stop_on_signals();
    let (mut exit, mut failed) = (None, None);
    let (mut session_over, mut overmounted) = (false, false);
    let mut watch = tokio::time::interval(WATCH_BIND);
    loop {
        tokio::select! {
            finished = &mut engine, if exit.is_none() => {
                match hydrated(finished, &schedule, &cfg.dest) {
                    Ok(Exit::Success) => {
                        exit = Some(Exit::Success);
                        overmounted = overmount(&cfg.dest, &mountpoint);
                    }
                    Ok(other) => exit = Some(other),
                    Err(err) => {
                        failed = Some(err);
                        break;
                    }
                }
            }
            _ = signals.wait_for(|stop| *stop) => break,
            _ = &mut session_ended => {
                tracing::info!("{} was unmounted", mountpoint.display());
                session_over = true;
                break;
            }
            _ = watch.tick(), if overmounted => {
                if !cache_on_top(&mountpoint) {
                    tracing::info!("{} was unmounted", mountpoint.display());
                    overmounted = false;
                    break;
                }
            }
        }
    }
    stop.send_replace(true);
    schedule.close("the mount is stopping");
    let unmounted = tokio::task::spawn_blocking(move || {
        if overmounted {
            let bind = rustix::mount::unmount(&mountpoint, UnmountFlags::empty());
            unmount_busy(&mountpoint, bind.map_err(Into::into));
        }
        unmount(&mut unmounter, &mountpoint);
    });
    let _ = unmounted.await;
    if !session_over {
        let _ = tokio::time::timeout(SESSION_END, session_ended).await;
    }
    if let Some(controller) = controller {
        controller.abort();
    }
    if let Some(err) = failed {
        return Err(err);
    }
    match exit {
        Some(exit) => Ok(exit),
        None => hydrated(engine.await, &schedule, &cfg.dest),
    }
}

/// The mountpoint is a directory, and neither it nor the cache is inside the other (the
/// engine would write into its own view, or the view would show the cache's state).
fn check_mountpoint(mountpoint: &Path, cache: &Path) -> Result<(), UsageError> {
    let canonical = std::fs::canonicalize(mountpoint)
        .ok()
        .filter(|path| path.is_dir())
        .ok_or_else(|| {
            UsageError::new(format!(
                "MOUNTPOINT {} is not a directory",
                mountpoint.display()
            ))
        })?;
    let cache = std::fs::canonicalize(cache).unwrap_or_else(|_| cache.to_path_buf());
    if canonical.starts_with(&cache) || cache.starts_with(&canonical) {
        return Err(UsageError::new(format!(
            "MOUNTPOINT {} and --cache {} must not be inside one another",
            mountpoint.display(),
            cache.display()
        )));
    }
    Ok(())
}

/// The whole listing (or the snapshot's entries), before anything is mounted.
async fn list_all(
    cfg: &SyncConfig,
    source: &Arc<dyn ObjectSource>,
) -> Result<Vec<ObjectEntry>, SyncError> {
    let mut listing = match &cfg.snapshot {
        Some(snapshot) => snapshot::spawn_entries(snapshot.clone()),
        None => list::spawn(source.clone(), cfg.source.clone()),
    };
    let mut listed = Vec::new();
    while let Some(entry) = listing.recv().await {
        listed.push(entry?);
    }
    Ok(listed)
}

/// The view's tree, marked lazy with the snapshot's digest (that of the listing without
/// `--snapshot`), and the keys the engine will fetch in listing order.
fn plan_view(
    cfg: &SyncConfig,
    listed: &[ObjectEntry],
) -> Result<(tree::Tree, Vec<String>), SyncError> {
    let filter = cfg.key_filter()?;
    let (mut tree, keys) = tree::Tree::of_listing(&cfg.source.prefix, &filter, listed);
    let digest = match &cfg.snapshot {
        Some(snapshot) => snapshot.digest.clone(),
        None => snapshot::listing_digest(listed),
    };
    tree.mark_lazy(&cfg.source.to_string(), &digest);
    if tree.files() == 0 && !cfg.allow_empty {
        return Err(UsageError::new(format!(
            "{} lists {} objects and none is a file to mount (give --allow-empty to mount an empty view)",
            cfg.source,
            listed.len()
        ))
        .into());
    }
    Ok((tree, keys))
}

/// The frozen listing, fed to the engine as a listing would be.
fn feed(listed: Vec<ObjectEntry>) -> engine::Listing {
    let (tx, rx) = tokio::sync::mpsc::channel(list::LISTING_QUEUE);
    tokio::spawn(async move {
        for entry in listed {
            if tx.send(Ok(entry)).await.is_err() {
                return;
            }
        }
    });
    rx
}

pub(crate) type Mounted = (fuser::SessionUnmounter, oneshot::Receiver<()>);

/// Mounts `view` read-only at `mountpoint` and serves it on a thread of its own; the receiver
/// fires when the session ends (unmounted).
pub(crate) async fn serve(
    view: view::LazyView,
    mountpoint: &Path,
    fsname: String,
    allow_other: bool,
) -> Result<Mounted, LocalError> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname),
        MountOption::Subtype("hydrator".into()),
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
    ];
    config.acl = match allow_other {
        true => SessionACL::All,
        false => SessionACL::Owner,
    };
    // Opens and releases of readers in parallel are answered in parallel, each thread on its
    // own clone of the FUSE descriptor.
    config.n_threads = Some(FUSE_THREADS);
    config.clone_fd = true;
    let at: PathBuf = mountpoint.to_path_buf();
    let mut session = tokio::task::spawn_blocking(move || fuser::Session::new(view, &at, &config))
        .await
        .unwrap_or_else(|err| Err(std::io::Error::other(err)))
        .local("mounting FUSE at", mountpoint)?;
    let unmounter = session.unmount_callable();
    let session_ended = run_session(session).local("starting the FUSE thread for", mountpoint)?;
    Ok((unmounter, session_ended))
}

/// Serves `session` on a thread of its own; the receiver fires when it ends (unmounted).
fn run_session(session: fuser::Session<view::LazyView>) -> std::io::Result<oneshot::Receiver<()>> {
    let (ended, session_ended) = oneshot::channel();
    std::thread::Builder::new()
        .name("fuse".into())
        .spawn(move || {
            if let Err(err) = session.run() {
                tracing::error!("the FUSE session ended: {err}");
            }
            let _ = ended.send(());
        })?;
    Ok(session_ended)
}

/// Once the dataset is complete, the cache directory itself is bind-mounted read-only over the
/// view: an open through the mountpoint then gets the plain local file, with no round trip
/// through this process (each one costs a FUSE open and release even with passthrough), and
/// `MOUNTPOINT/.hydrator/READY` shows. The view stays underneath for what is open in it. Where
/// this process may not mount (not root), the view serves on.
fn overmount(cache: &Path, mountpoint: &Path) -> bool {
    match crate::mounts::bind_read_only(cache, mountpoint) {
        Ok(()) => {
            tracing::info!(
                "hydrated: {} now shows {} itself (a read-only bind mount over the view)",
                mountpoint.display(),
                cache.display()
            );
            true
        }
        Err(err) => {
            tracing::info!("hydrated; the view serves on ({err} binding the cache over it)");
            false
        }
    }
}

/// Whether the cache's bind mount is still on top of the view.
fn cache_on_top(mountpoint: &Path) -> bool {
    crate::mounts::top_mount(mountpoint)
        .is_ok_and(|top| top.is_some_and(|top| !top.fs_type.starts_with("fuse")))
}

/// Unmounts the view; one still in use is detached instead (it goes when its last reader
/// closes, and reads then fail: this process is ending).
fn unmount(unmounter: &mut fuser::SessionUnmounter, mountpoint: &Path) {
    unmount_busy(mountpoint, unmounter.unmount());
}

/// After an unmount that failed (busy), detaches instead.
fn unmount_busy(mountpoint: &Path, unmounted: std::io::Result<()>) {
    if let Err(err) = unmounted {
        tracing::warn!(
            "{} is busy ({err}): detached; readers still in it get errors from now on",
            mountpoint.display()
        );
        if let Err(err) = rustix::mount::unmount(mountpoint, UnmountFlags::DETACH) {
            tracing::error!("cannot unmount {}: {err}", mountpoint.display());
        }
    }
}

/// What the engine's end means for the view: a complete dataset makes every file local; a run
/// that ended otherwise fails the opens still waiting. Prints the run's summary.
fn hydrated(
    finished: Result<Result<Outcome, SyncError>, tokio::task::JoinError>,
    schedule: &Schedule,
    cache: &Path,
) -> Result<Exit, SyncError> {
    let outcome = match finished {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(err)) => {
            schedule.close(&err.to_string());
            return Err(err);
        }
        Err(err) => {
            let err = LocalError::new("hydrating into", cache, std::io::Error::other(err));
            schedule.close(&err.to_string());
            return Err(err.into());
        }
    };
    match outcome.exit {
        Exit::Success => schedule.all_local(),
        _ => schedule.close(&format!(
            "hydration ended: {}",
            outcome
                .summary
                .error
                .clone()
                .unwrap_or_else(|| "stopped".into())
        )),
    }
    Ok(outcome.print())
}
