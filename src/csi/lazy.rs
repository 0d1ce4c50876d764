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
//! - The view lives in this process: a restart of the plugin ends it, and the pods reading it
//!   then get `ENOTCONN` (never zeros or stale bytes) until they are restarted. A restart of the
//!   daemon does not: opens wait for the daemon to come back (and resume the hydration, which a
//!   lazy volume's lease keeps), for at most [`PATIENCE`].

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};

use super::target::Target;
use crate::daemon::protocol::WantRequest;
use crate::daemon_client::{explain, percent_encode, CallError, Client};
use crate::engine::schedule::Wanted;
use crate::mount::tree::{FileNode, Tree};
use crate::mount::view::{LazyView, Wants};
use crate::plan::filter::KeyFilter;
use crate::source::list::ObjectEntry;
use crate::write::dest::Dest;

/// How long an open waits for a daemon that does not answer before it fails with EIO.
const PATIENCE: Duration = Duration::from_secs(300);
/// The pause between two asks while the daemon is away.
const RETRY: Duration = Duration::from_secs(1);

/// Mounts the lazy view of `snapshot` of `dataset` (whose directory is `dir`) at `target`,
/// created if missing, and serves it until it is unmounted.
pub(crate) async fn publish(
    client: Arc<Client>,
    dataset: &str,
    snapshot: &str,
    dir: &Path,
    target: &Target,
) -> std::io::Result<()> {
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
    let view = LazyView::new(Arc::new(tree), Arc::new(wants), Dest::open(dir)?, true);
    target.create_dir()?;
    let fsname = format!("hydrator:{dataset}");
    let pinned = target.pin()?;
    crate::mount::pinned::serve(view, pinned.as_fd(), fsname, true)
        .await
        .map_err(std::io::Error::other)?;
    Ok(())
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
    fn want(&self, file: &FileNode) -> Wanted {
        if let Ok(Some(_)) = self.dest.stat_final(&file.rel) {
            return Wanted::Now(Ok(()));
        }
        let (tell, told) = tokio::sync::oneshot::channel();
        let (client, path) = (self.client.clone(), self.path.clone());
        let request = WantRequest {
            snapshot: self.snapshot.clone(),
            key: file.key.clone(),
        };
        self.runtime.spawn(async move {
            let asked = ask(&client, &path, &request).await;
            let _ = tell.send(asked.map_err(|err| err.to_string().into()));
        });
        Wanted::Later(told)
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
}

/// Asks the daemon for one file until it is local or cannot be fetched.
async fn ask(client: &Client, path: &str, request: &WantRequest) -> Result<(), Unwanted> {
    let body = serde_json::to_vec(request).expect("a want request serialises");
    let mut away_since: Option<Instant> = None;
    loop {
        let why = match client.call(Method::POST, path, Some(body.clone())).await {
            Ok((StatusCode::OK, _)) => return Ok(()),
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
