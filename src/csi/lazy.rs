//! A lazy volume: a pod reads a dataset while the node daemon hydrates it. The plugin serves a
//! read-only FUSE view ([`crate::mount::view`]) at the pod's target, named from the snapshot
//! file the daemon froze, over the snapshot's directory as it fills.
//!
//! Why it is built this way:
//! - The daemon stays the only writer: an open of a file that is not local asks the daemon
//!   (`POST /v1/datasets/NAME/want`), whose engine fetches it first and answers once it is
//!   written, durable and verified; the view then opens the file the engine published. A file
//!   at its final path in a snapshot's directory is always whole and verified (the engine renames
//!   into place only after its checks), so one that is already there is opened at once.
//! - Reads of local files go to the kernel (FUSE passthrough): the plugin is in the read path
//!   only for opens.
//! - The view outlives this process: a duplicate of its FUSE connection is handed to the keeper
//!   ([`super::keeper`]), and a restarted plugin takes it back and serves the view again
//!   ([`resume`]), built from the same snapshot file, so the kernel's inode numbers still mean
//!   the same files. Without a keeper, a restart of the plugin ends the view, and the pods
//!   reading it then get `ENOTCONN` (never zeros or stale bytes) until they are restarted. A
//!   restart of the daemon does not: opens wait for the daemon to come back (and resume the
//!   hydration, which a lazy volume's lease keeps), for at most [`PATIENCE`].

use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use tokio::sync::oneshot;

use super::keeper::KeptView;
use super::target::Target;
use crate::daemon::protocol::{WantAnswer, WantRequest};
use crate::daemon_client::{explain, percent_encode, CallError, Client};
use crate::engine::streams::{RangeWanted, Readable};
use crate::mount::backings::BackingJournal;
use crate::mount::tree::{FileNode, Tree};
use crate::mount::view::{Health, LazyView, Wants};
use crate::plan::filter::KeyFilter;
use crate::source::list::ObjectEntry;
use crate::write::dest::Dest;

/// How long an open waits for a daemon that does not answer before it fails with EIO.
const PATIENCE: Duration = Duration::from_secs(300);
/// The pause between two asks while the daemon is away.
const RETRY: Duration = Duration::from_secs(1);

/// A view being served: what fires when its session ends, and what its readers met.
pub(crate) struct Serving {
    pub ended: oneshot::Receiver<()>,
    pub health: Health,
}

/// Mounts the lazy view of `snapshot` of `dataset` (whose directory is `dir`) at `target`,
/// created if missing, and serves it until it is unmounted; returns what the keeper needs to
/// keep it, a duplicate of its connection, and the view being served.
pub(crate) async fn publish(
    client: Arc<Client>,
    volume: &str,
    dataset: &str,
    snapshot: &str,
    dir: &Path,
    target: &Target,
    journal: &Path,
) -> std::io::Result<(KeptView, OwnedFd, Serving)> {
    let journal = BackingJournal::create(journal)?;
    let view = view_of(client, dataset, snapshot, dir)
        .await?
        .with_journal(journal);
    let health = view.health();
    target.create_dir()?;
    let fsname = format!("hydrator:{dataset}");
    let pinned = target.pin()?;
    let served = crate::mount::pinned::serve(view, pinned.as_fd(), fsname, true)
        .await
        .map_err(std::io::Error::other)?;
    let kept = KeptView {
        volume: volume.to_string(),
        dataset: dataset.to_string(),
        snapshot: snapshot.to_string(),
        dir: dir.to_path_buf(),
        passthrough: served.passthrough,
    };
    let serving = Serving {
        ended: served.ended,
        health,
    };
    Ok((kept, served.fuse, serving))
}

/// Serves again a view a previous life of the plugin mounted, on `fuse`, its connection kept by
/// the keeper. A view whose snapshot file cannot be read any more is served empty: its pod's
/// requests fail (ENOENT) instead of waiting for an answer that never comes.
pub(crate) async fn resume(
    client: Arc<Client>,
    kept: &KeptView,
    fuse: OwnedFd,
    journal: &Path,
) -> Result<Serving, ResumeError> {
    let journal = BackingJournal::reopen(journal)?;
    let view = match view_of(client.clone(), &kept.dataset, &kept.snapshot, &kept.dir).await {
        Ok(view) => view.with_journal(journal),
        Err(err) => {
            tracing::error!(volume = %kept.volume, "the lazy view of {} cannot be served again ({err}): its reads fail until its pod is restarted", kept.dataset);
            empty_view(&kept.dir)?
        }
    };
    let health = view.health();
    let ended = crate::mount::resume::resume(view, fuse, kept.passthrough)?;
    Ok(Serving { ended, health })
}

/// Why a kept view could not be served again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeError {
    #[error("opening the snapshot's directory or the backings' journal: {0}")]
    Local(#[from] std::io::Error),
    #[error(transparent)]
    Session(#[from] crate::mount::resume::ResumeError),
}

/// A view with no file, over `dir`.
fn empty_view(dir: &Path) -> std::io::Result<LazyView> {
    let nothing = Arc::new(Tree::build(Vec::new()).0);
    let wants = Arc::new(crate::engine::schedule::Schedule::new(Vec::<String>::new()));
    Ok(LazyView::new(nothing, wants, Dest::open(dir)?, true))
}

/// The view of `snapshot` of `dataset` over `dir`, named from its snapshot file (so its inode
/// numbers are the same in every life of the plugin).
async fn view_of(
    client: Arc<Client>,
    dataset: &str,
    snapshot: &str,
    dir: &Path,
) -> std::io::Result<LazyView> {
    let parent = dir.parent().unwrap_or(dir);
    let file = parent.join(format!("{snapshot}.snapshot"));
    let frozen = tokio::task::spawn_blocking(move || crate::snapshot::read(&file))
        .await?
        .map_err(|err| std::io::Error::other(err.to_string()))?;
    if frozen.digest != snapshot {
        return Err(std::io::Error::other(format!(
            "the snapshot file of {snapshot} holds {}",
            frozen.digest
        )));
    }
    let listed: Vec<ObjectEntry> = frozen.entries.iter().map(Into::into).collect();
    let everything = KeyFilter::new(&[], &[]).map_err(std::io::Error::other)?;
    let (mut tree, _) = Tree::of_listing(&frozen.prefix, &everything, &listed);
    tree.mark_lazy(dataset, snapshot);
    let wants = DaemonWants {
        client,
        path: format!("/v1/datasets/{}/want", percent_encode(dataset)),
        snapshot: snapshot.to_string(),
        dest: Dest::open(dir)?,
        runtime: tokio::runtime::Handle::current(),
    };
    Ok(LazyView::new(
        Arc::new(tree),
        Arc::new(wants),
        Dest::open(dir)?,
        true,
    ))
}

/// Opens of a lazy volume, answered by the node daemon.
struct DaemonWants {
    client: Arc<Client>,
    path: String,
    snapshot: String,
    dest: Dest,
    /// Opens come from the FUSE thread; their asks run here.
    runtime: tokio::runtime::Handle,
}

impl Wants for DaemonWants {
    fn want_range(&self, file: &FileNode, bytes: Range<u64>) -> RangeWanted {
        if let Ok(Some(_)) = self.dest.stat_final(&file.rel) {
            return RangeWanted::Now(Ok(Readable::Whole));
        }
        let (tell, told) = tokio::sync::oneshot::channel();
        let (client, path) = (self.client.clone(), self.path.clone());
        let request = WantRequest {
            snapshot: self.snapshot.clone(),
            key: file.key.clone(),
            range: Some([bytes.start, bytes.end]),
        };
        self.runtime.spawn(async move {
            let asked = ask(&client, &path, &request).await;
            let _ = tell.send(asked.map_err(|err| err.to_string().into()));
        });
        RangeWanted::Later(told)
    }

    /// The snapshot's READY marker: written once its every file was published and checked.
    fn all_local(&self) -> bool {
        matches!(self.dest.existing_state_dir(), Ok(Some(state))
            if crate::manifest::ready::exists(&state).unwrap_or(false))
    }
}

/// Why a lazy view's open cannot have its file.
#[derive(Debug, thiserror::Error)]
enum Unwanted {
    /// The daemon answered that the object cannot be fetched, or refused the ask.
    #[error("{0}")]
    Refused(String),
    /// The daemon's socket refused this process.
    #[error("{0}")]
    Denied(String),
    /// The daemon was away for longer than [`PATIENCE`].
    #[error("the node daemon: {0}")]
    Away(String),
    /// The daemon's answer is not one this plugin reads.
    #[error("the node daemon's answer: {0}")]
    Unreadable(#[source] serde_json::Error),
}

/// Asks the daemon for one file's bytes until they are local or cannot be fetched.
async fn ask(client: &Client, path: &str, request: &WantRequest) -> Result<Readable, Unwanted> {
    let body = serde_json::to_vec(request).expect("a want request serialises");
    let mut away_since: Option<Instant> = None;
    loop {
        let why = match client.call(Method::POST, path, Some(body.clone())).await {
            Ok((StatusCode::OK, answer)) => {
                let answer: WantAnswer =
                    serde_json::from_slice(&answer).map_err(Unwanted::Unreadable)?;
                return Ok(answer.into());
            }
            Ok((StatusCode::ACCEPTED, _)) => {
                away_since = None;
                continue;
            }
            // A daemon stopping, or restarted and not hydrating the snapshot again yet.
            Ok((code @ (StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE), answer)) => {
                explain(code, &answer)
            }
            Ok((code, answer)) => return Err(Unwanted::Refused(explain(code, &answer))),
            Err(CallError::Unreachable(why) | CallError::Broken(why)) => why,
            Err(CallError::Denied(why)) => return Err(Unwanted::Denied(why)),
        };
        if away_since.get_or_insert_with(Instant::now).elapsed() > PATIENCE {
            return Err(Unwanted::Away(why));
        }
        tokio::time::sleep(RETRY).await;
    }
}
