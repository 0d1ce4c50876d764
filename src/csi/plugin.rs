//! The node plugin's work: publish a dataset's ready snapshot read-only into a pod, unpublish
//! it, and keep the daemon's leases matching what is mounted.
//!
//! Why it is built this way:
//! - A publish never waits for a hydration: it asks the daemon to warm the dataset and, while
//!   that runs, answers `UNAVAILABLE` with the progress, which the kubelet shows in the pod's
//!   events and retries with back-off. The pod stays `ContainerCreating` until the data is
//!   ready, as it would behind an init container, and no CSI call outlives its deadline.
//! - Unless the volume (attribute `start: lazy`) or the catalog (`start = "lazy"`) asks for a
//!   lazy start: once the daemon has listed the dataset, the publish mounts a lazy view of the
//!   snapshot being hydrated ([`super::lazy`]) and the pod starts at once. A pod that comes
//!   after the snapshot is ready gets the plain bind mount.
//! - The lease is held until unpublish (`until_released`), by `POD_UID:VOLUME_ID`, on the exact
//!   snapshot that is mounted, so eviction never removes data a pod has mounted and a newer
//!   version of the dataset never changes files under it.
//! - A dataset that is being refreshed is served from the snapshot held meanwhile: a pod never
//!   waits for a relisting, only for data the node does not have yet.
//! - Every volume is recorded on disk before it is mounted ([`super::volumes`]); at start and
//!   every minute the plugin asks the daemon for its leases once, takes again those of mounted
//!   volumes that are missing (a daemon that lost its state gets them back) and releases those
//!   of records whose target is no longer mounted (a publish or unpublish cut short). A pass
//!   stops at the first call the daemon does not answer.
//! - Calls for one volume run one at a time; different volumes do not wait for each other.
//! - Who may mount a dataset is the daemon's to say: every warm call names the pod's namespace
//!   and service account (from `podInfoOnMount`), checked against the catalog's access rules; a
//!   refusal is `PERMISSION_DENIED` with the rule, in the pod's events.
//! - Targets must lie under the kubelet's pods directory: the plugin mounts and unmounts only
//!   there.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use hyper::{Method, StatusCode};
use tokio::sync::OwnedMutexGuard;
use tonic::Status;

use super::keeper::{Keeper, KeptView};
use super::lazy;
use super::proto::{
    volume_capability::AccessType, volume_usage, NodePublishVolumeRequest, VolumeCondition,
    VolumeUsage,
};
use super::target::{self, Target};
use super::views::Views;
use super::volumes::{self, Volume, Volumes};
use crate::daemon::catalog::Start;
use crate::daemon::protocol::{
    Condition, DatasetStatus, Lease, LeaseRequest, LeaseStatus, PodIdentity, State, WarmRequest,
    UNTIL_RELEASED,
};
use crate::daemon_client::{explain, percent_encode, CallError, Client};
use crate::mounts::Mounted;
use crate::units::human_bytes;

/// The volume attribute naming the catalog dataset.
pub(crate) const DATASET_ATTRIBUTE: &str = "dataset";
/// The optional volume attribute naming a snapshot digest to mount instead of the current one.
pub(crate) const SNAPSHOT_ATTRIBUTE: &str = "snapshot";
/// The optional volume attribute saying when the pod may start: `ready` or `lazy`.
pub(crate) const START_ATTRIBUTE: &str = "start";
const POD_UID_ATTRIBUTE: &str = "csi.storage.k8s.io/pod.uid";
const POD_NAMESPACE_ATTRIBUTE: &str = "csi.storage.k8s.io/pod.namespace";
const SERVICE_ACCOUNT_ATTRIBUTE: &str = "csi.storage.k8s.io/serviceAccount.name";
const EPHEMERAL_ATTRIBUTE: &str = "csi.storage.k8s.io/ephemeral";

pub(crate) struct Plugin {
    client: Arc<Client>,
    volumes: Volumes,
    /// The kubelet's pods directory: every target lies under it.
    pods_dir: PathBuf,
    /// One lock per volume id being published or unpublished: calls for a volume take turns.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Whether the lazy views left by a previous life were looked for.
    found_dead_views: AtomicBool,
    /// The volumes whose lazy view this process serves (a lazy volume not in it is one whose
    /// view ended with a previous life of the plugin).
    views: Arc<Views>,
}

/// The snapshot a publish serves, and whether as a lazy view (it is still hydrating).
struct Served {
    snapshot: String,
    dir: PathBuf,
    lazy: bool,
}

/// What a publish request asks for, checked.
struct Ask {
    id: String,
    dataset: String,
    snapshot: Option<String>,
    start: Option<Start>,
    /// Checked by the daemon against the dataset's access rules.
    pod: PodIdentity,
    holder: String,
    target: PathBuf,
}

/// A target the plugin may mount on: under the pods directory, without `.` or `..`.
fn check_target(pods_dir: &Path, target: &Path) -> Result<(), Status> {
    let plain = target
        .components()
        .all(|c| !matches!(c, Component::ParentDir | Component::CurDir));
    match plain && target.starts_with(pods_dir) && target != pods_dir {
        true => Ok(()),
        false => Err(Status::invalid_argument(format!(
            "target path {} is not under {}",
            target.display(),
            pods_dir.display()
        ))),
    }
}

impl Ask {
    fn parse(request: &NodePublishVolumeRequest, pods_dir: &Path) -> Result<Self, Status> {
        let invalid = |why: String| Err(Status::invalid_argument(why));
        if !volumes::valid_id(&request.volume_id) {
            return invalid(format!(
                "volume id {:?} is not a plain name",
                request.volume_id
            ));
        }
        let target = PathBuf::from(&request.target_path);
        check_target(pods_dir, &target)?;
        if !request.readonly {
            return invalid(
                "the dataset cache is read-only: set readOnly: true on the csi volume".into(),
            );
        }
        let capability = request.volume_capability.as_ref();
        if !matches!(
            capability.and_then(|c| c.access_type.as_ref()),
            Some(AccessType::Mount(_))
        ) {
            return invalid("only filesystem (mount) volumes are served, not block".into());
        }
        let context = &request.volume_context;
        if context.get(EPHEMERAL_ATTRIBUTE).map(String::as_str) != Some("true") {
            return invalid(
                "only inline ephemeral volumes are served (a csi: volume in the pod spec)".into(),
            );
        }
        let Some(dataset) = context.get(DATASET_ATTRIBUTE).filter(|d| !d.is_empty()) else {
            return invalid(format!(
                "volumeAttributes needs {DATASET_ATTRIBUTE:?}: the catalog name"
            ));
        };
        let Some(pod) = context.get(POD_UID_ATTRIBUTE) else {
            return invalid(format!(
                "no {POD_UID_ATTRIBUTE}: the CSIDriver object needs podInfoOnMount: true"
            ));
        };
        let start = match context.get(START_ATTRIBUTE).map(String::as_str) {
            None => None,
            Some("ready") => Some(Start::Ready),
            Some("lazy") => Some(Start::Lazy),
            Some(other) => {
                return invalid(format!(
                    "{START_ATTRIBUTE} {other:?} is neither \"ready\" nor \"lazy\""
                ))
            }
        };
        Ok(Self {
            id: request.volume_id.clone(),
            dataset: dataset.clone(),
            snapshot: context.get(SNAPSHOT_ATTRIBUTE).cloned(),
            start,
            pod: PodIdentity {
                namespace: context
                    .get(POD_NAMESPACE_ATTRIBUTE)
                    .cloned()
                    .unwrap_or_default(),
                service_account: (context.get(SERVICE_ACCOUNT_ATTRIBUTE).cloned())
                    .unwrap_or_default(),
            },
            holder: format!("{pod}:{}", request.volume_id),
            target,
        })
    }
}

impl Plugin {
    pub(crate) fn new(
        client: Client,
        volumes: Volumes,
        pods_dir: PathBuf,
        keeper: Option<Keeper>,
    ) -> Self {
        Self {
            client: Arc::new(client),
            volumes,
            pods_dir,
            turns: Mutex::default(),
            found_dead_views: AtomicBool::new(false),
            views: Arc::new(Views::new(keeper)),
        }
    }

    /// Serves again the lazy views a previous life of the plugin published, which the keeper
    /// held meanwhile; before anything else of this life.
    pub(crate) async fn resume_kept_views(&self) {
        let bound_over = |kept: &KeptView| {
            let recorded = self.record(&kept.volume);
            recorded.is_none_or(|volume| {
                Target::open(&self.pods_dir, &volume.target)
                    .and_then(|target| target.shows_snapshot(&volume.snapshot))
                    .unwrap_or(false)
            })
        };
        let journal = |kept: &KeptView| self.volumes.backings_path(&kept.volume);
        let resumed = (self.views)
            .resume_kept(&self.client, bound_over, journal)
            .await;
        if resumed > 0 {
            tracing::info!("serving again {resumed} lazy view(s) of the plugin's previous run");
        }
    }

    /// Hands the lazy views' connections to the keeper again.
    pub(crate) async fn keep_views(&self) {
        self.views.keep_all().await;
    }

    /// Waits for the turn of volume `id`.
    async fn turn(&self, id: &str) -> OwnedMutexGuard<()> {
        let lock = self
            .turns
            .lock()
            .expect("turns lock")
            .entry(id.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    /// Drops the lock of volume `id` once no call but this one holds or waits for it, so the
    /// table does not grow with every volume ever seen.
    fn forget_turn(&self, id: &str) {
        let mut turns = self.turns.lock().expect("turns lock");
        // The table's reference and the caller's guard: nobody else has it.
        if turns
            .get(id)
            .is_some_and(|lock| Arc::strong_count(lock) == 2)
        {
            turns.remove(id);
        }
    }

    /// The volume's record; one that cannot be read or fails its checks (damaged or forged) is
    /// logged and dropped (the volume is then published or unpublished afresh).
    fn record(&self, id: &str) -> Option<Volume> {
        let checked = self.volumes.read(id).and_then(|record| match record {
            Some(volume) if check_target(&self.pods_dir, &volume.target).is_err() => Err(
                std::io::Error::other("its target is not under the pods directory"),
            ),
            record => Ok(record),
        });
        checked.unwrap_or_else(|err| {
            tracing::error!(volume = %id, "dropping an unreadable record: {err}");
            let _ = self.volumes.remove(id);
            None
        })
    }

    pub(crate) async fn publish(&self, request: &NodePublishVolumeRequest) -> Result<(), Status> {
        let ask = Ask::parse(request, &self.pods_dir)?;
        let _turn = self.turn(&ask.id).await;
        let record = self.record(&ask.id);
        let at_target = |err| local(&ask.target, err);
        let target = Target::open(&self.pods_dir, &ask.target)
            .map_err(|err| unreachable_target(&ask.target, err))
            .and_then(|target| target.check().map(|()| target).map_err(at_target));
        // Published here already: nothing to ask the daemon.
        if let (Ok(target), Some(published)) = (&target, &record) {
            let same = published.target == ask.target && published.dataset == ask.dataset;
            if same && matches!(target.mounted(), Ok(Mounted::ReadOnly)) {
                return Ok(());
            }
        }
        // The dataset is checked before the filesystem: a pod that names no dataset of the
        // catalog (or one it may not mount) is told so whatever its target looks like; a target
        // the plugin cannot use is refused before the pod is told to wait for a hydration.
        let served = match self.served(&ask.dataset, ask.start, &ask.pod).await {
            Err(refused) if refused.code() != tonic::Code::Unavailable => return Err(refused),
            served => served,
        };
        let target = target?;
        let served = served?;
        // One lease per volume id: a second target would share it, and lose it with either.
        if let Some(elsewhere) = record.as_ref().filter(|p| p.target != ask.target) {
            let mounted = self.mounted(&elsewhere.target);
            if mounted.map_err(|err| local(&elsewhere.target, err))? != Mounted::No {
                return Err(Status::already_exists(format!(
                    "volume {} is already published at {}",
                    ask.id,
                    elsewhere.target.display()
                )));
            }
        }
        if let Some(published) = record.filter(|p| p.target == ask.target) {
            match target.mounted().map_err(at_target)? {
                Mounted::ReadOnly if published.dataset == ask.dataset => return Ok(()),
                Mounted::ReadOnly => {
                    return Err(Status::already_exists(format!(
                        "volume {} is already published with dataset {}",
                        ask.id, published.dataset
                    )))
                }
                // A publish cut short between its bind and its read-only remount.
                Mounted::Writable => target.unmount().map_err(at_target)?,
                Mounted::No => {}
            }
        }
        let chosen_by_pod = ask.snapshot.is_some();
        let snapshot = ask.snapshot.clone().unwrap_or(served.snapshot.clone());
        let dir = snapshot_dir(&served.dir, &snapshot)?;
        real_directories(&dir)?;
        let volume = Volume {
            lazy: served.lazy && snapshot == served.snapshot,
            id: ask.id,
            dataset: ask.dataset,
            snapshot,
            holder: ask.holder,
            target: ask.target,
        };
        (self.volumes.write(&volume)).map_err(|err| local(&self.volumes.path(&volume.id), err))?;
        self.lease(&volume)
            .await
            .map_err(|refusal| served_snapshot_gone(refusal, chosen_by_pod))?;
        let mounting = |err| {
            Status::internal(format!(
                "mounting {} on {}: {err}",
                dir.display(),
                volume.target.display()
            ))
        };
        if volume.lazy {
            let client = self.client.clone();
            let (kept, fuse, serving) = lazy::publish(
                client,
                &volume.id,
                &volume.dataset,
                &volume.snapshot,
                &dir,
                &target,
                &self.volumes.backings_path(&volume.id),
            )
            .await
            .map_err(mounting)?;
            self.views.serve(kept, fuse, serving, false).await;
        } else {
            target.bind_read_only(&dir).map_err(mounting)?;
        }
        let how = match volume.lazy {
            true => "as a lazy view while it hydrates",
            false => "read-only",
        };
        tracing::info!(
            volume = %volume.id,
            "published {} snapshot {} {how} at {}",
            volume.dataset,
            volume.snapshot,
            volume.target.display()
        );
        Ok(())
    }

    pub(crate) async fn unpublish(&self, id: &str, target: &Path) -> Result<(), Status> {
        if !volumes::valid_id(id) {
            return Err(Status::invalid_argument(format!(
                "volume id {id:?} is not a plain name"
            )));
        }
        check_target(&self.pods_dir, target)?;
        let _turn = self.turn(id).await;
        let record = self.record(id);
        if let Some(other) = record.as_ref().filter(|v| v.target != target) {
            return Err(Status::failed_precondition(format!(
                "volume {id} is published at {}, not at {}",
                other.target.display(),
                target.display()
            )));
        }
        match Target::open(&self.pods_dir, target) {
            Ok(target) => {
                // A volume this plugin has no record of: only what it mounts is taken down.
                let at_target = |err| local(target.path(), err);
                let top = target.top_mount().map_err(at_target)?;
                if record.is_none() && top.is_some_and(|top| !top.is_hydrators()) {
                    return Err(Status::failed_precondition(format!(
                        "no volume {id} was published at {}, and what is mounted there is not the cache's: left alone",
                        target.path().display()
                    )));
                }
                while target.mounted().map_err(at_target)? != Mounted::No {
                    target.unmount().map_err(|err| {
                        let at = target.path().display();
                        // Something still has a file open through the mount: a later try
                        // can succeed, so the kubelet is told to retry, not that it failed.
                        match err.raw_os_error() == Some(libc::EBUSY) {
                            true => Status::unavailable(format!("unmounting {at}: {err}; retry")),
                            false => Status::internal(format!("unmounting {at}: {err}")),
                        }
                    })?;
                }
                target.remove_dir().map_err(|err| {
                    Status::internal(format!("removing {}: {err}", target.path().display()))
                })?;
            }
            // Its parent is gone: nothing is mounted there.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            // The plugin mounts only through real directories: nothing of a volume it never
            // published is there, and the symlink is not followed (an answer the kubelet's
            // retries get the same).
            Err(err) if target::through_symlink(&err) && record.is_none() => {
                tracing::warn!(volume = %id, "unpublishing: {err}; nothing of the plugin's is there");
            }
            Err(err) if target::through_symlink(&err) => {
                return Err(Status::failed_precondition(err.to_string()))
            }
            Err(err) => return Err(unreachable_target(target, err)),
        }
        self.views.remove(id);
        if let Some(volume) = record {
            self.release(&volume).await?;
            (self.volumes.remove(id)).map_err(|err| local(&self.volumes.path(id), err))?;
            tracing::info!(volume = %id, "unpublished {} from {}", volume.dataset, target.display());
        }
        self.forget_turn(id);
        Ok(())
    }

    /// Takes again the missing lease of every mounted volume and drops the records (and
    /// leases) of volumes that are not mounted any more; stops at the first call the daemon
    /// does not answer.
    pub(crate) async fn reconcile(&self) {
        let recorded = match self.volumes.all() {
            Ok(recorded) => recorded,
            Err(err) => return tracing::error!("reading the volume records: {err}"),
        };
        if recorded.is_empty() {
            return;
        }
        self.report_dead_views(&recorded);
        let held = match self.held_leases().await {
            Ok(held) => held,
            Err(status) => return tracing::warn!("reconciling: {}", status.message()),
        };
        for volume in recorded {
            let _turn = self.turn(&volume.id).await;
            let Some(volume) = self.record(&volume.id) else {
                continue; // unpublished meanwhile
            };
            let outcome = match self.mounted(&volume.target) {
                Ok(Mounted::No) => match self.release(&volume).await {
                    Ok(()) => (self.volumes.remove(&volume.id))
                        .map_err(|err| local(&self.volumes.path(&volume.id), err)),
                    Err(status) => Err(status),
                },
                Ok(_) if held.contains(&volume.holder) => Ok(()),
                Ok(_) => self.lease(&volume).await,
                Err(err) => Err(local(&volume.target, err)),
            };
            if let Err(status) = outcome {
                tracing::warn!(volume = %volume.id, "reconciling: {}", status.message());
                if status.code() == tonic::Code::Unavailable {
                    return;
                }
            }
        }
    }

    /// What is mounted on a recorded target (nothing when its parent is gone).
    fn mounted(&self, target: &Path) -> std::io::Result<Mounted> {
        match Target::open(&self.pods_dir, target) {
            Ok(target) => target.mounted(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Mounted::No),
            Err(err) => Err(err),
        }
    }

    /// The usage and condition of volume `id` published at `path`: abnormal when it is a lazy
    /// view that no process serves any more, or whose snapshot the daemon cannot serve whole,
    /// and its ready snapshot was not bound over it (the kubelet, with volume health on, puts
    /// the message in the pod's events).
    pub(crate) async fn stats(
        &self,
        id: &str,
        path: &Path,
    ) -> Result<(Vec<VolumeUsage>, VolumeCondition), Status> {
        let Some(volume) = self.record(id).filter(|v| v.target == path) else {
            return Err(Status::not_found(format!(
                "no volume {id} is published at {}",
                path.display()
            )));
        };
        // The ready snapshot may be bound over the view (by a previous life too): the pod
        // reads the snapshot, whether or not a process serves the view underneath.
        let bound_over = volume.lazy
            && Target::open(&self.pods_dir, path)
                .and_then(|target| target.shows_snapshot(&volume.snapshot))
                .unwrap_or(false);
        if volume.lazy && !bound_over && !self.views.serves(id) {
            let message = format!(
                "the lazy view of {} ended with a restart of the CSI plugin: reads fail (ENOTCONN) until the pod is restarted",
                volume.dataset
            );
            return Ok((
                Vec::new(),
                VolumeCondition {
                    abnormal: true,
                    message,
                },
            ));
        }
        if let Some(condition) = self.lease_condition(&volume, bound_over).await {
            return Ok((Vec::new(), condition));
        }
        if let Some((handles, key)) = self.views.rejected(id) {
            let message = format!(
                "snapshot {} of {}: {handles} open file handle(s) read bytes that hydrator then rejected (last: {key}): their reads fail (EIO); the pod must open those files again",
                volume.snapshot, volume.dataset
            );
            return Ok((
                Vec::new(),
                VolumeCondition {
                    abnormal: true,
                    message,
                },
            ));
        }
        let fs = rustix::fs::statvfs(path)
            .map_err(|err| Status::internal(format!("statfs of {}: {err}", path.display())))?;
        let usage = |unit: volume_usage::Unit, total: u64, available: u64| VolumeUsage {
            total: total as i64,
            available: available as i64,
            used: total.saturating_sub(available) as i64,
            unit: unit as i32,
        };
        let block = fs.f_frsize;
        let how = match (volume.lazy, bound_over) {
            (true, false) => "a lazy view while it hydrates",
            (true, true) => "ready, bound read-only over its lazy view",
            (false, _) => "mounted read-only",
        };
        Ok((
            vec![
                usage(
                    volume_usage::Unit::Bytes,
                    fs.f_blocks * block,
                    fs.f_bavail * block,
                ),
                usage(volume_usage::Unit::Inodes, fs.f_files, fs.f_ffree),
            ],
            VolumeCondition {
                abnormal: false,
                message: format!("snapshot {} of {}: {how}", volume.snapshot, volume.dataset),
            },
        ))
    }

    /// The abnormal condition of a lazy view whose snapshot the daemon cannot serve whole: its
    /// hydration ended short (an object changed upstream, say) or the snapshot is gone. `None`
    /// when it can, when the ready snapshot is bound over the view, or when the daemon does not
    /// answer (opens wait for it).
    async fn lease_condition(&self, volume: &Volume, bound_over: bool) -> Option<VolumeCondition> {
        if !volume.lazy || bound_over {
            return None;
        }
        let (code, body) = (self.client.call(Method::GET, "/v1/leases", None).await).ok()?;
        let leases: Vec<LeaseStatus> = serde_json::from_slice(&body).ok()?;
        let held = leases.into_iter().find(|l| l.lease.holder == volume.holder);
        let why = match held.filter(|_| code == StatusCode::OK)?.condition {
            Condition::Failed { reason } => format!("its hydration ended short: {reason}"),
            Condition::Gone => "the node daemon holds it no more".to_string(),
            Condition::Hydrating | Condition::Ready => return None,
        };
        let message = format!(
            "snapshot {} of {}: {why}; opens of the files that did not land fail (EIO)",
            volume.snapshot, volume.dataset
        );
        Some(VolumeCondition {
            abnormal: true,
            message,
        })
    }

    /// Binds its ready snapshot over each lazy view this process serves whose hydration is
    /// complete: a pod whose volume mount has `mountPropagation: HostToContainer` then reads
    /// the plain files (no round trip to this process per open); the view stays underneath for
    /// the other pods and the files open in it.
    pub(crate) async fn settle(&self) {
        for id in self.views.unsettled() {
            let _turn = self.turn(&id).await;
            let Some(volume) = self.record(&id).filter(|v| v.lazy) else {
                continue;
            };
            if !self.views.serves(&id) {
                continue; // unpublished meanwhile
            }
            let dir = match self.ready_dir(&volume).await {
                Ok(Some(dir)) => dir,
                Ok(None) => continue,
                Err(status) => return tracing::debug!("settling: {}", status.message()),
            };
            let bound = Target::open(&self.pods_dir, &volume.target)
                .and_then(|target| target.bind_read_only(&dir));
            match bound {
                Ok(()) => {
                    self.views.settled(&id);
                    tracing::info!(
                        volume = %id,
                        "{} is ready: bound over the lazy view at {}",
                        volume.dataset,
                        volume.target.display()
                    );
                }
                Err(err) => tracing::warn!(volume = %id, "binding the ready snapshot: {err}"),
            }
        }
    }

    /// The directory of the volume's snapshot once it is ready.
    async fn ready_dir(&self, volume: &Volume) -> Result<Option<PathBuf>, Status> {
        let path = format!("/v1/datasets/{}", percent_encode(&volume.dataset));
        let (code, body) = self
            .client
            .call(Method::GET, &path, None)
            .await
            .map_err(daemon_unreachable)?;
        if code != StatusCode::OK {
            return Err(refused(code, &explain(code, &body)));
        }
        let status: DatasetStatus = serde_json::from_slice(&body)
            .map_err(|e| Status::internal(format!("unexpected answer from the daemon: {e}")))?;
        let ready = status.state == State::Ready
            && status.snapshot.as_deref() == Some(volume.snapshot.as_str());
        Ok(status.path.filter(|_| ready).map(PathBuf::from))
    }

    /// Once per life: the lazy views published by a previous life of the plugin are mounted
    /// but served by no one (their reads fail with ENOTCONN); says which.
    fn report_dead_views(&self, recorded: &[Volume]) {
        if self.found_dead_views.swap(true, Relaxed) {
            return;
        }
        for volume in recorded
            .iter()
            .filter(|v| v.lazy && !self.views.serves(&v.id))
        {
            if !matches!(self.mounted(&volume.target), Ok(Mounted::No)) {
                tracing::error!(
                    volume = %volume.id,
                    "the lazy view of {} at {} ended with the plugin's previous run: its pod's reads fail (ENOTCONN) until the pod is restarted",
                    volume.dataset,
                    volume.target.display()
                );
            }
        }
    }

    /// The holders of the leases held until released, across datasets.
    async fn held_leases(&self) -> Result<BTreeSet<String>, Status> {
        let (code, body) = self
            .client
            .call(Method::GET, "/v1/leases", None)
            .await
            .map_err(daemon_unreachable)?;
        if code != StatusCode::OK {
            return Err(refused(code, &explain(code, &body)));
        }
        let leases: Vec<Lease> = serde_json::from_slice(&body)
            .map_err(|e| Status::internal(format!("unexpected answer from the daemon: {e}")))?;
        Ok(leases
            .into_iter()
            .filter(|l| l.expires_at == UNTIL_RELEASED)
            .map(|l| l.holder)
            .collect())
    }

    /// The snapshot to serve of `dataset`: its ready one, or the one held while a refresh
    /// runs, or (a lazy start) the one being hydrated once it is listed. While the node has
    /// none of these, a retryable error with the progress (what the pod's events show).
    async fn served(
        &self,
        dataset: &str,
        start: Option<Start>,
        pod: &PodIdentity,
    ) -> Result<Served, Status> {
        let path = format!("/v1/datasets/{}/warm", percent_encode(dataset));
        let request = WarmRequest {
            wait: false,
            pod: Some(pod.clone()),
        };
        let request = serde_json::to_vec(&request).expect("a warm request serialises");
        let (code, body) = self
            .client
            .call(Method::POST, &path, Some(request))
            .await
            .map_err(daemon_unreachable)?;
        if !matches!(
            code,
            StatusCode::OK | StatusCode::ACCEPTED | StatusCode::INTERNAL_SERVER_ERROR
        ) {
            return Err(refused(code, &explain(code, &body)));
        }
        let status: DatasetStatus = serde_json::from_slice(&body)
            .map_err(|e| Status::internal(format!("unexpected answer from the daemon: {e}")))?;
        let served = match status.state {
            State::Ready => status.snapshot.clone().zip(status.path.clone()),
            _ => status.held_snapshot.clone().zip(status.held_path.clone()),
        };
        let lazy = start.unwrap_or(match status.lazy {
            true => Start::Lazy,
            false => Start::Ready,
        }) == Start::Lazy;
        let partial = (status.snapshot.clone().zip(status.partial_path.clone()))
            .filter(|_| lazy && status.state == State::Hydrating);
        match (served, partial, status.state) {
            (Some((snapshot, dir)), ..) => Ok(Served {
                snapshot,
                dir: PathBuf::from(dir),
                lazy: false,
            }),
            (None, Some((snapshot, dir)), _) => Ok(Served {
                snapshot,
                dir: PathBuf::from(dir),
                lazy: true,
            }),
            (None, None, State::Failed) => Err(Status::unavailable(format!(
                "the daemon could not hydrate {dataset}: {}",
                status.reason.as_deref().unwrap_or("no reason given")
            ))),
            (None, None, _) => Err(Status::unavailable(hydrating(dataset, &status))),
        }
    }

    /// Takes or renews the volume's lease, held until released.
    async fn lease(&self, volume: &Volume) -> Result<(), Status> {
        let request = LeaseRequest {
            ttl_seconds: None,
            snapshot: Some(volume.snapshot.clone()),
            until_released: true,
            pod: Some(volume.pod().to_string()),
        };
        let body = serde_json::to_vec(&request).expect("a lease request serialises");
        let (code, answer) = self
            .client
            .call(Method::PUT, &lease_path(volume), Some(body))
            .await
            .map_err(daemon_unreachable)?;
        match code {
            StatusCode::OK => Ok(()),
            code => Err(refused(
                code,
                &format!("leasing: {}", explain(code, &answer)),
            )),
        }
    }

    async fn release(&self, volume: &Volume) -> Result<(), Status> {
        let (code, answer) = self
            .client
            .call(Method::DELETE, &lease_path(volume), None)
            .await
            .map_err(daemon_unreachable)?;
        match code {
            StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => Ok(()),
            code => Err(refused(
                code,
                &format!("releasing: {}", explain(code, &answer)),
            )),
        }
    }
}

fn lease_path(volume: &Volume) -> String {
    format!(
        "/v1/datasets/{}/leases/{}",
        percent_encode(&volume.dataset),
        percent_encode(&volume.holder)
    )
}

/// A snapshot directory and its dataset's directory are real directories: one replaced by a
/// symlink would hand the pod whatever it points to.
fn real_directories(snapshot: &Path) -> Result<(), Status> {
    for dir in [Some(snapshot), snapshot.parent()].into_iter().flatten() {
        let real = std::fs::symlink_metadata(dir).is_ok_and(|meta| meta.is_dir());
        if !real {
            return Err(Status::failed_precondition(format!(
                "{} is not a directory of the cache (a symlink, or gone): refused",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// The directory of `snapshot` of the dataset whose served snapshot lives in `served`:
/// snapshots of one dataset are siblings (`ROOT/NAME/DIGEST`).
fn snapshot_dir(served: &Path, snapshot: &str) -> Result<PathBuf, Status> {
    if !crate::snapshot::is_digest(snapshot) {
        return Err(Status::invalid_argument(format!(
            "{SNAPSHOT_ATTRIBUTE} {snapshot:?} is not a snapshot digest (64 hex digits)"
        )));
    }
    let parent = served.parent().ok_or_else(|| {
        Status::internal(format!(
            "the daemon served {}: not a snapshot directory",
            served.display()
        ))
    })?;
    Ok(parent.join(snapshot))
}

fn hydrating(dataset: &str, status: &DatasetStatus) -> String {
    let progress = status.progress.as_ref().map_or(String::new(), |p| {
        format!(
            " ({}: {}/{} objects, {} of {})",
            p.phase,
            p.objects_done,
            p.objects_total,
            human_bytes(p.bytes_done),
            human_bytes(p.bytes_total)
        )
    });
    format!(
        "dataset {dataset} is hydrating on this node{progress}; the pod starts when it is ready"
    )
}

/// A lease refused because the snapshot the daemon had just served was evicted before it
/// could be leased (another hydration needed the room) is worth a retry, which warms the
/// dataset again; a snapshot the pod asked for by name that is gone is not.
fn served_snapshot_gone(refusal: Status, chosen_by_pod: bool) -> Status {
    match refusal.code() {
        tonic::Code::FailedPrecondition if !chosen_by_pod => Status::unavailable(format!(
            "{}; the publish is tried again with the snapshot the node holds then",
            refusal.message()
        )),
        _ => refusal,
    }
}

/// A daemon's refusal as the gRPC code a CO understands.
fn refused(code: StatusCode, why: &str) -> Status {
    match code {
        StatusCode::NOT_FOUND => Status::not_found(why),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Status::permission_denied(why),
        StatusCode::BAD_REQUEST => Status::invalid_argument(why),
        StatusCode::CONFLICT => Status::failed_precondition(why),
        StatusCode::TOO_MANY_REQUESTS => Status::resource_exhausted(why),
        _ => Status::unavailable(why),
    }
}

fn daemon_unreachable(err: CallError) -> Status {
    match err {
        CallError::Denied(why) => Status::permission_denied(format!("the daemon's socket: {why}")),
        CallError::Unreachable(why) | CallError::Broken(why) => {
            Status::unavailable(format!("the node daemon: {why}"))
        }
    }
}

/// A target whose directory cannot be reached (missing, or reached through a symlink).
fn unreachable_target(target: &Path, err: std::io::Error) -> Status {
    let parent = target.parent().unwrap_or(target);
    Status::internal(format!(
        "target path {}: its directory {}: {err}",
        target.display(),
        parent.display()
    ))
}

/// A filesystem error at `path`, naming it.
fn local(path: &Path, err: std::io::Error) -> Status {
    Status::internal(format!("{}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_snapshot_evicted_before_its_lease_is_retried_and_a_named_one_is_not() {
        let gone = || Status::failed_precondition("dataset \"a\" has no ready snapshot 00ff");
        let retried = served_snapshot_gone(gone(), false);
        assert_eq!(retried.code(), tonic::Code::Unavailable);
        assert!(
            retried.message().contains("no ready snapshot 00ff"),
            "{retried:?}"
        );
        assert_eq!(
            served_snapshot_gone(gone(), true).code(),
            tonic::Code::FailedPrecondition
        );
        let denied = Status::permission_denied("no");
        assert_eq!(
            served_snapshot_gone(denied, false).code(),
            tonic::Code::PermissionDenied
        );
    }
}
