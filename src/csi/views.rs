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

use tokio::sync::oneshot;

use super::keeper::{Keeper, KeptView};
use super::lazy;
use crate::daemon_client::Client;

struct Served {
    /// Which serving of the volume this is (a volume published again is served anew).
    serial: u64,
    kept: KeptView,
    fuse: OwnedFd,
    /// Whether the ready snapshot was bound over the view.
    settled: bool,
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
        ended: oneshot::Receiver<()>,
        settled: bool,
    ) {
        if let Some(keeper) = &self.keeper {
            let (keeper, view) = (keeper.clone(), kept.clone());
            let handed = fuse
                .try_clone()
                .map(|copy| tokio::task::spawn_blocking(move || keeper.keep(&view, copy.as_fd())));
            let outcome = match handed {
                Ok(task) => task
                    .await
                    .map_err(|err| err.to_string())
                    .and_then(|kept| kept.map_err(|err| err.to_string())),
                Err(err) => Err(err.to_string()),
            };
            if let Err(err) = outcome {
                tracing::warn!(volume = %kept.volume, "the lazy view ends with this process of the plugin: {err}");
            }
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
        let Some(keeper) = self.keeper.clone() else {
            return;
        };
        let copies: Vec<(KeptView, OwnedFd)> = (self.served().values())
            .filter_map(|served| Some((served.kept.clone(), served.fuse.try_clone().ok()?)))
            .collect();
        if copies.is_empty() {
            return;
        }
        let kept = tokio::task::spawn_blocking(move || {
            copies
                .iter()
                .try_for_each(|(view, fuse)| keeper.keep(view, fuse.as_fd()))
        })
        .await;
        match kept {
            Ok(Ok(())) => {
                if self.keeper_failing.swap(false, Relaxed) {
                    tracing::info!("the keeper holds the lazy views again");
                }
            }
            Ok(Err(err)) if !self.keeper_failing.swap(true, Relaxed) => {
                tracing::warn!("the lazy views end with this process of the plugin: {err}")
            }
            Ok(Err(_)) => {}
            Err(err) => tracing::warn!("handing the lazy views to the keeper: {err}"),
        }
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
        let socket = keeper.socket().to_path_buf();
        let kept = match tokio::task::spawn_blocking(move || keeper.list()).await {
            Ok(Ok(kept)) => kept,
            Ok(Err(err)) => {
                tracing::warn!(
                    "no lazy view to serve again: {err}; a view a previous life of the plugin served ends (ENOTCONN) unless the keeper runs at {}",
                    socket.display()
                );
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
                Ok(ended) => {
                    tracing::info!(volume = %view.volume, "serving again the lazy view of {} snapshot {}", view.dataset, view.snapshot);
                    resumed += 1;
                    self.serve(view, fuse, ended, settled).await;
                }
                Err(err) => {
                    tracing::error!(volume = %view.volume, "serving the lazy view again: {err}")
                }
            }
        }
        resumed
    }
}
