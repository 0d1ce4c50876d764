//! The CSI Identity and Node services over gRPC: checks and answers, with the work done by
//! [`Plugin`]. The plugin serves inline ephemeral volumes only, so it has no Controller service,
//! no staging and no expansion. It answers volume stats with the volume's condition, so that a
//! kubelet with volume health on (`CSIVolumeHealth`) puts a lazy view that ended with a restart
//! of the plugin in the pod's events.

use std::path::Path;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::plugin::Plugin;
use super::proto::identity_server::Identity;
use super::proto::node_server::Node;
use super::proto::*;
use crate::daemon_client::Client;

pub(crate) struct IdentityService {
    pub name: String,
    /// Probed for readiness: the plugin can do nothing without the daemon.
    pub daemon: Arc<Client>,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let ready = matches!(
            self.daemon.call(hyper::Method::GET, "/readyz", None).await,
            Ok((code, _)) if code.is_success()
        );
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}

pub(crate) struct NodeService {
    pub node_id: String,
    pub plugin: Arc<Plugin>,
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        self.plugin.publish(request.get_ref()).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let target = Path::new(&request.target_path);
        if !target.is_absolute() {
            return Err(Status::invalid_argument(format!(
                "target path {:?} must be absolute",
                request.target_path
            )));
        }
        self.plugin.unpublish(&request.volume_id, target).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::{rpc::Type, Rpc, Type as Kind};
        let rpc = |kind: Type| NodeServiceCapability {
            r#type: Some(Kind::Rpc(Rpc {
                r#type: kind as i32,
            })),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![rpc(Type::GetVolumeStats), rpc(Type::VolumeCondition)],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            ..Default::default()
        }))
    }

    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        Err(unsupported("NodeStageVolume"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        Err(unsupported("NodeUnstageVolume"))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let request = request.into_inner();
        for (field, value) in [
            ("volume_id", &request.volume_id),
            ("volume_path", &request.volume_path),
        ] {
            if value.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "NodeGetVolumeStats needs {field}"
                )));
            }
        }
        let path = Path::new(&request.volume_path);
        let (usage, condition) = self.plugin.stats(&request.volume_id, path).await?;
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        }))
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(unsupported("NodeExpandVolume"))
    }
}

fn unsupported(call: &str) -> Status {
    Status::unimplemented(format!(
        "{call}: this plugin serves read-only ephemeral volumes and announces no such capability"
    ))
}
