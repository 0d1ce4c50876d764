//! The lazy views this plugin serves, each with a duplicate of its FUSE connection that the
//! keeper ([`super::keeper`]) is given, and takes back for the next life of the plugin.
//!
//! Why it is built this way: the keeper may restart on its own and come back holding nothing,
//! so the plugin hands it every connection again every few seconds ([`Views::keep_all`]): a
//! keep replaces what the keeper held for the volume, and costs a message. The plugin's first
//! act in a new life is [`Views::resume_kept`], before it answers the kubelet, so a view is never
//! both served again and published afresh.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use super::keeper::{Keeper, KeeperError, KeptView};
use super::lazy::{self, Serving};
use crate::daemon_client::Client;
use crate::mount::view::Health;

/// Why the keeper was not given a view.
#[derive(Debug, thiserror::Error)]
enum HandOver {
    #[error("duplicating its connection: {0}")]
    Duplicate(#[from] std::io::Error),
    #[error(transparent)]
    Keeper(#[from] KeeperError),
    #[error("the hand-over task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

struct Served {
    /// Which serving of the volume this is (a volume published again is served anew).
    serial: u64,
    kept: KeptView,
    fuse: OwnedFd,
    /// Whether the ready snapshot was bound over the view.
    settled: bool,
    health: Health,
}

pub(crate) struct Views {
    keeper: Option<Keeper>,
    served: Mutex<BTreeMap<String, Served>>,
    serials: AtomicU64,
    /// Whether the last hand-over to the keeper failed (said once, until it works again).
    keeper_failing: AtomicBool,
}

impl Views {
    pub(crate) fn new(keeper: Option<Keeper>) -> Self {
        Self {
            keeper,
            served: Mutex::default(),
            serials: AtomicU64::new(0),
            keeper_failing: AtomicBool::new(false),
        }
    }

    fn served(&self) -> MutexGuard<'_, BTreeMap<String, Served>> {
        self.served
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a view this process now serves, until its session `ended` (unmounted), and
    /// hands its connection to the keeper.
    pub(crate) async fn serve(
        self: &Arc<Self>,
        kept: KeptView,
        fuse: OwnedFd,
        Serving { ended, health }: Serving,
        settled: bool,
    ) {
        let copy = fuse.try_clone().map(|copy| vec![(kept.clone(), copy)]);
        if let Err(err) = self.hand_over(copy).await {
            tracing::warn!(volume = %kept.volume, "the lazy view ends with this process of the plugin: {err}");
        }
        let volume = kept.volume.clone();
        let serial = self.serials.fetch_add(1, Relaxed);
        self.served().insert(
            volume.clone(),
            Served {
                serial,
                kept,
                fuse,
                settled,
                health,
            },
        );
        let views = Arc::downgrade(self);
        tokio::spawn(async move {
            let _ = ended.await;
            let Some(views) = views.upgrade() else {
                return;
            };
            let mut served = views.served();
            if served.get(&volume).is_some_and(|s| s.serial == serial) {
                served.remove(&volume);
                tracing::info!(volume = %volume, "the lazy view ended (unmounted)");
            }
        });
    }

    pub(crate) fn serves(&self, volume: &str) -> bool {
        self.served().contains_key(volume)
    }

    /// How many handles of the view of `volume` read bytes that were then discarded (their
    /// reads fail with EIO), and the file the last one was of.
    pub(crate) fn rejected(&self, volume: &str) -> Option<(u64, String)> {
        self.served().get(volume)?.health.rejected()
    }

    pub(crate) fn remove(&self, volume: &str) {
        self.served().remove(volume);
    }

    /// The views whose ready snapshot is not bound over them yet.
    pub(crate) fn unsettled(&self) -> Vec<String> {
        (self.served().iter())
            .filter(|(_, served)| !served.settled)
            .map(|(volume, _)| volume.clone())
            .collect()
    }

    pub(crate) fn settled(&self, volume: &str) {
        if let Some(served) = self.served().get_mut(volume) {
            served.settled = true;
        }
    }

    /// Hands every view's connection to the keeper again (one that restarted holds nothing).
    pub(crate) async fn keep_all(&self) {
        let copies = (self.served().values())
            .map(|served| Ok((served.kept.clone(), served.fuse.try_clone()?)))
            .collect();
        match self.hand_over(copies).await {
            Ok(()) if self.keeper_failing.swap(false, Relaxed) => {
                tracing::info!("the keeper holds the lazy views again")
            }
            Ok(()) => {}
            Err(err) if !self.keeper_failing.swap(true, Relaxed) => {
                tracing::warn!("the lazy views end with this process of the plugin: {err}")
            }
            Err(_) => {}
        }
    }

    /// Gives the keeper (if there is one) the `views` and their duplicated connections.
    async fn hand_over(
        &self,
        views: std::io::Result<Vec<(KeptView, OwnedFd)>>,
    ) -> Result<(), HandOver> {
        let Some(keeper) = self.keeper.clone() else {
            return Ok(());
        };
        let views = views?;
        if views.is_empty() {
            return Ok(());
        }
        tokio::task::spawn_blocking(move || {
            (views.iter()).try_for_each(|(view, fuse)| keeper.keep(view, fuse.as_fd()))
        })
        .await??;
        Ok(())
    }

    /// Serves again every view the keeper holds (the keeper holds only connections still
    /// mounted: one nobody served would leave its pod's requests waiting forever);
    /// `bound_over` says whether the ready snapshot was bound over a view already, `journal`
    /// where a volume's backings are written down. Returns how many are served again.
    pub(crate) async fn resume_kept(
        self: &Arc<Self>,
        client: &Arc<Client>,
        bound_over: impl Fn(&KeptView) -> bool,
        journal: impl Fn(&KeptView) -> PathBuf,
    ) -> usize {
        let Some(keeper) = self.keeper.clone() else {
            return 0;
        };
        let kept = match tokio::task::spawn_blocking(move || keeper.list()).await {
            Ok(Ok(kept)) => kept,
            Ok(Err(err)) => {
                tracing::warn!("no lazy view to serve again: {err}; the views of the plugin's previous run end (ENOTCONN)");
                return 0;
            }
            Err(err) => {
                tracing::warn!("asking the keeper for the lazy views: {err}");
                return 0;
            }
        };
        let mut resumed = 0;
        for (view, fuse) in kept {
            let settled = bound_over(&view);
            let session = match fuse.try_clone() {
                Ok(session) => session,
                Err(err) => {
                    tracing::error!(volume = %view.volume, "serving the lazy view again: {err}");
                    continue;
                }
            };
            match lazy::resume(client.clone(), &view, session, &journal(&view)).await {
                Ok(serving) => {
                    tracing::info!(volume = %view.volume, "serving again the lazy view of {} snapshot {}", view.dataset, view.snapshot);
                    resumed += 1;
                    self.serve(view, fuse, serving, settled).await;
                }
                Err(err) => {
                    tracing::error!(volume = %view.volume, "serving the lazy view again: {err}")
                }
            }
        }
        resumed
    }
}
