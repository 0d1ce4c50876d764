//! The node's `dfdaemon`, reached on its unix socket with one `DfdaemonDownload.DownloadTask`
//! call per object: a presigned GET as the URL, the pinned ETag (and version) as the tag, the
//! output written beside DEST (the dfdaemon hard-links its copy there when its storage is on the
//! same filesystem; `engine::peers` then reflinks or copies it into a file of hydrator's own),
//! and back-to-source left to the scheduler: a dfdaemon that cannot reach its scheduler fails
//! the download instead of reading the store itself, and hydrator's direct path takes the
//! object under its own limits.
//!
//! No process is started: the call is a future on the daemon's runtime, bounded by the
//! catalog's `timeout_seconds` and cancelled (its stream dropped) when the run stops, so a
//! dfdaemon that never answers cannot hold a stopping daemon past its grace.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_sdk_s3::presigning::PresigningConfig;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

use super::proto::common::v2::{Download, TaskType};
use super::proto::dfdaemon::v2::dfdaemon_download_client::DfdaemonDownloadClient;
use super::proto::dfdaemon::v2::download_task_response::Response;
use super::proto::dfdaemon::v2::DownloadTaskRequest;
use super::{PeerError, Peers};
use crate::source::fetch::PinnedObject;

/// How long a presigned URL holds: the pieces of a large task may be read from the store
/// long after the first peer asked.
const PRESIGNED_FOR: Duration = Duration::from_secs(12 * 3600);
/// The presigned URL's query parameters that vary from node to node: left out of the task id,
/// so every node's request for one version is one Dragonfly task.
const SIGNATURE_PARAMS: [&str; 8] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "X-Amz-User-Agent",
];
/// Names the tasks of hydrator's objects apart from other users' tasks of the same URL.
const APPLICATION: &str = "hydrator";

pub(crate) struct Dfdaemon {
    socket: PathBuf,
    channel: Channel,
    s3: aws_sdk_s3::Client,
    min_size: u64,
    timeout: Duration,
}

impl Dfdaemon {
    /// A client of the dfdaemon at `socket`, which connects on first use (and again after a
    /// failure); `s3` presigns the requests.
    pub(crate) fn new(
        socket: &Path,
        s3: aws_sdk_s3::Client,
        min_size: u64,
        timeout: Duration,
    ) -> Self {
        let path = socket.to_path_buf();
        let channel = Endpoint::from_static("http://dfdaemon").connect_with_connector_lazy(
            tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }),
        );
        Self {
            socket: socket.to_path_buf(),
            channel,
            s3,
            min_size,
            timeout,
        }
    }

    /// The request for `object`, with a GET presigned for exactly its version.
    async fn request(&self, object: &PinnedObject, output: &Path) -> Result<Download, PeerError> {
        let presigning = PresigningConfig::expires_in(PRESIGNED_FOR)
            .map_err(|e| PeerError::Presign(e.to_string()))?;
        let presigned = self
            .s3
            .get_object()
            .bucket(&object.bucket)
            .key(&object.key)
            .set_if_match((!object.etag.is_empty()).then(|| object.etag.clone()))
            .set_version_id(object.version_id.clone())
            .presigned(presigning)
            .await
            .map_err(|e| {
                PeerError::Presign(aws_sdk_s3::error::DisplayErrorContext(e).to_string())
            })?;
        let tag = match &object.version_id {
            Some(version) => format!("{} {version}", object.etag),
            None => object.etag.clone(),
        };
        Ok(Download {
            url: presigned.uri().to_string(),
            tag: Some(tag),
            application: Some(APPLICATION.into()),
            r#type: TaskType::Standard.into(),
            filtered_query_params: SIGNATURE_PARAMS.map(String::from).to_vec(),
            request_header: presigned
                .headers()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            output_path: Some(output.to_string_lossy().into_owned()),
            timeout: prost_types::Duration::try_from(self.timeout).ok(),
            disable_back_to_source: true,
            ..Default::default()
        })
    }

    async fn download_task(&self, download: Download) -> Result<(), PeerError> {
        let failed = |status: tonic::Status| {
            PeerError::Failed(format!(
                "{} ({:?}) at {}",
                status.message(),
                status.code(),
                self.socket.display()
            ))
        };
        let mut client = DfdaemonDownloadClient::new(self.channel.clone());
        let request = DownloadTaskRequest {
            download: Some(download),
        };
        let mut answers = client
            .download_task(request)
            .await
            .map_err(failed)?
            .into_inner();
        let (mut wanted, mut finished) = (None, 0usize);
        while let Some(answer) = answers.next().await {
            match answer.map_err(failed)?.response {
                Some(Response::DownloadTaskStartedResponse(started)) if started.is_finished => {
                    return Ok(())
                }
                Some(Response::DownloadTaskStartedResponse(started)) => {
                    wanted = Some(started.pieces.len())
                }
                Some(Response::DownloadPieceFinishedResponse(_)) => finished += 1,
                None => {}
            }
        }
        match wanted {
            Some(wanted) if finished >= wanted => Ok(()),
            _ => Err(PeerError::Unfinished),
        }
    }
}

impl Peers for Dfdaemon {
    fn min_size(&self) -> u64 {
        self.min_size
    }

    fn download<'a>(
        &'a self,
        object: &'a PinnedObject,
        output: &'a Path,
    ) -> BoxFuture<'a, Result<(), PeerError>> {
        Box::pin(async move {
            let download = self.request(object, output).await?;
            tokio::time::timeout(self.timeout, self.download_task(download))
                .await
                .map_err(|_| PeerError::Failed(format!("no end within {:?}", self.timeout)))?
        })
    }
}
