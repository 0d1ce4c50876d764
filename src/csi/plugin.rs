//! The node plugin's work: publish a dataset's ready snapshot read-only into a pod, unpublish
//! it, and keep the daemon's leases matching what is mounted.
//!
//! Why it is built this way:
//! - A publish never waits for a hydration: it asks the daemon to warm the dataset and, while
//!   that runs, answers `UNAVAILABLE` with the progress, which the kubelet shows in the pod's
//!   events and retries with back-off. The pod stays `ContainerCreating` until the data is
//!   ready, as it would behind an init container, and no CSI call outlives its deadline.
//! - The lease is held until unpublish (`until_released`), by `POD_UID:VOLUME_ID`, on the exact
//!   snapshot that is mounted, so eviction never removes data a pod has mounted and a newer
//!   version of the dataset never changes files under it.
//! - Every volume is recorded on disk before it is mounted ([`super::volumes`]); at start and
//!   every minute the plugin renews the lease of each mounted volume (a daemon that lost its
//!   state gets them back) and releases those of records whose target is no longer mounted (a
//!   publish or unpublish cut short).
//! - Publishes, unpublishes and that reconciliation run one at a time: each is a few
//!   milliseconds of local work and one or two calls to the daemon.

use std::path::{Path, PathBuf};

use hyper::{Method, StatusCode};
use tonic::Status;

use super::mount;
use super::proto::{volume_capability::AccessType, NodePublishVolumeRequest};
use super::volumes::{self, Volume, Volumes};
use crate::daemon::protocol::{DatasetStatus, LeaseRequest, State};
use crate::daemon_client::{explain, percent_encode, CallError, Client};
use crate::units::human_bytes;

/// The volume attribute naming the catalog dataset.
pub(crate) const DATASET_ATTRIBUTE: &str = "dataset";
/// The optional volume attribute naming a snapshot digest to mount instead of the current one.
pub(crate) const SNAPSHOT_ATTRIBUTE: &str = "snapshot";
const POD_UID_ATTRIBUTE: &str = "csi.storage.k8s.io/pod.uid";
const EPHEMERAL_ATTRIBUTE: &str = "csi.storage.k8s.io/ephemeral";

pub(crate) struct Plugin {
    pub client: Client,
    pub volumes: Volumes,
    /// One publish, unpublish or reconciliation at a time.
    one_at_a_time: tokio::sync::Mutex<()>,
}

/// What a publish request asks for, checked.
struct Ask {
    id: String,
    dataset: String,
    snapshot: Option<String>,
    holder: String,
    target: PathBuf,
}

impl Ask {
    fn parse(request: &NodePublishVolumeRequest) -> Result<Self, Status> {
        let invalid = |why: String| Err(Status::invalid_argument(why));
        if !volumes::valid_id(&request.volume_id) {
            return invalid(format!(
                "volume id {:?} is not a plain name",
                request.volume_id
            ));
        }
        let target = PathBuf::from(&request.target_path);
        if !target.is_absolute() {
            return invalid(format!(
                "target path {:?} must be absolute",
                request.target_path
            ));
        }
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
        Ok(Self {
            id: request.volume_id.clone(),
            dataset: dataset.clone(),
            snapshot: context.get(SNAPSHOT_ATTRIBUTE).cloned(),
            holder: format!("{pod}:{}", request.volume_id),
            target,
        })
    }
}

impl Plugin {
    pub(crate) fn new(client: Client, volumes: Volumes) -> Self {
        Self {
            client,
            volumes,
            one_at_a_time: Default::default(),
        }
    }

    pub(crate) async fn publish(&self, request: &NodePublishVolumeRequest) -> Result<(), Status> {
        let ask = Ask::parse(request)?;
        let _turn = self.one_at_a_time.lock().await;
        if let Some(published) = self.volumes.read(&ask.id).map_err(local)? {
            if published.target == ask.target
                && mount::is_mount_point(&ask.target).map_err(local)?
            {
                return match published.dataset == ask.dataset {
                    true => Ok(()),
                    false => Err(Status::already_exists(format!(
                        "volume {} is already published with dataset {}",
                        ask.id, published.dataset
                    ))),
                };
            }
        }
        let status = self.ready(&ask.dataset).await?;
        let current = status.snapshot.clone().unwrap_or_default();
        let snapshot = ask.snapshot.clone().unwrap_or(current);
        let dir = snapshot_dir(&status, &snapshot)?;
        let volume = Volume {
            id: ask.id,
            dataset: ask.dataset,
            snapshot,
            holder: ask.holder,
            target: ask.target,
        };
        self.volumes.write(&volume).map_err(local)?;
        self.lease(&volume).await?;
        mount::bind_read_only(&dir, &volume.target).map_err(|err| {
            Status::internal(format!(
                "mounting {} on {}: {err}",
                dir.display(),
                volume.target.display()
            ))
        })?;
        tracing::info!(
            volume = %volume.id,
            "published {} snapshot {} read-only at {}",
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
        let _turn = self.one_at_a_time.lock().await;
        if mount::is_mount_point(target).map_err(local)? {
            mount::unmount(target).map_err(|err| {
                Status::internal(format!("unmounting {}: {err}", target.display()))
            })?;
        }
        match std::fs::remove_dir(target) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(Status::internal(format!(
                    "removing {}: {err}",
                    target.display()
                )))
            }
            _ => {}
        }
        if let Some(volume) = self.volumes.read(id).map_err(local)? {
            self.release(&volume).await?;
            self.volumes.remove(id).map_err(local)?;
            tracing::info!(volume = %id, "unpublished {} from {}", volume.dataset, target.display());
        }
        Ok(())
    }

    /// Renews the lease of every mounted volume and drops the records (and leases) of volumes
    /// that are not mounted any more.
    pub(crate) async fn reconcile(&self) {
        let _turn = self.one_at_a_time.lock().await;
        let recorded = match self.volumes.all() {
            Ok(recorded) => recorded,
            Err(err) => return tracing::error!("reading the volume records: {err}"),
        };
        for volume in recorded {
            let outcome = match mount::is_mount_point(&volume.target) {
                Ok(true) => self.lease(&volume).await,
                Ok(false) => match self.release(&volume).await {
                    Ok(()) => self.volumes.remove(&volume.id).map_err(local),
                    Err(status) => Err(status),
                },
                Err(err) => Err(local(err)),
            };
            if let Err(status) = outcome {
                tracing::warn!(volume = %volume.id, "reconciling: {}", status.message());
            }
        }
    }

    /// The dataset's status once it is ready; while it hydrates, a retryable error with the
    /// progress (what the pod's events show).
    async fn ready(&self, dataset: &str) -> Result<DatasetStatus, Status> {
        let path = format!("/v1/datasets/{}/warm", percent_encode(dataset));
        let (code, body) = self
            .client
            .call(Method::POST, &path, None)
            .await
            .map_err(unreachable)?;
        if !matches!(
            code,
            StatusCode::OK | StatusCode::ACCEPTED | StatusCode::INTERNAL_SERVER_ERROR
        ) {
            return Err(refused(code, &explain(code, &body)));
        }
        let status: DatasetStatus = serde_json::from_slice(&body)
            .map_err(|e| Status::internal(format!("unexpected answer from the daemon: {e}")))?;
        match status.state {
            State::Ready => Ok(status),
            State::Failed => Err(Status::unavailable(format!(
                "the daemon could not hydrate {dataset}: {}",
                status.reason.as_deref().unwrap_or("no reason given")
            ))),
            _ => Err(Status::unavailable(hydrating(dataset, &status))),
        }
    }

    /// Takes or renews the volume's lease, held until released.
    async fn lease(&self, volume: &Volume) -> Result<(), Status> {
        let request = LeaseRequest {
            ttl_seconds: None,
            snapshot: Some(volume.snapshot.clone()),
            until_released: true,
        };
        let body = serde_json::to_vec(&request).expect("a lease request serialises");
        let (code, answer) = self
            .client
            .call(Method::PUT, &lease_path(volume), Some(body))
            .await
            .map_err(unreachable)?;
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
            .map_err(unreachable)?;
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

/// The directory of `snapshot` of the dataset whose current snapshot `status` describes:
/// snapshots of one dataset are siblings (`ROOT/NAME/DIGEST`).
fn snapshot_dir(status: &DatasetStatus, snapshot: &str) -> Result<PathBuf, Status> {
    let current = status.path.as_deref().map(Path::new);
    let parent = current.and_then(Path::parent);
    let valid = crate::snapshot::is_digest(snapshot);
    match parent {
        Some(parent) if valid => Ok(parent.join(snapshot)),
        _ => Err(Status::invalid_argument(format!(
            "{SNAPSHOT_ATTRIBUTE} {snapshot:?} is not a snapshot digest (64 hex digits)"
        ))),
    }
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

fn unreachable(err: CallError) -> Status {
    match err {
        CallError::Denied(why) => Status::permission_denied(format!("the daemon's socket: {why}")),
        CallError::Unreachable(why) | CallError::Broken(why) => {
            Status::unavailable(format!("the node daemon: {why}"))
        }
    }
}

fn local(err: std::io::Error) -> Status {
    Status::internal(err.to_string())
}
