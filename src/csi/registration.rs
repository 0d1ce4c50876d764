//! Registration with the kubelet, served by the plugin itself: the kubelet's plugin watcher
//! finds a socket in its `plugins_registry` directory, asks it `GetInfo` (the driver's name and
//! where its CSI socket is, as the host sees it) and answers `NotifyRegistrationStatus`.
//!
//! Why not the usual node-driver-registrar sidecar: the protocol is two calls, and serving it
//! here leaves one image to mirror into an air-gapped registry instead of two, one container
//! fewer on every GPU node, and no registration that outlives the plugin: the socket is
//! removed when the plugin stops, and the kubelet deregisters the driver when it goes.

use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use super::proto::registration::registration_server::Registration;
use super::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The CSI spec versions the plugin serves (the kubelet accepts 1.x).
const CSI_VERSIONS: &[&str] = &["1.0.0"];

pub(crate) struct RegistrationService {
    /// The CSI driver's name.
    pub driver_name: String,
    /// The plugin's CSI socket as the kubelet (the host) sees it.
    pub kubelet_endpoint: PathBuf,
}

/// The registration socket for `driver_name` in the kubelet's registry directory, named as the
/// kubelet's own registrar names it.
pub(crate) fn socket_in(registry: &Path, driver_name: &str) -> PathBuf {
    registry.join(format!("{driver_name}-reg.sock"))
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: self.driver_name.clone(),
            endpoint: self.kubelet_endpoint.display().to_string(),
            supported_versions: CSI_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(
                "registered with the kubelet as CSI driver {}",
                self.driver_name
            );
        } else {
            tracing::error!(
                "the kubelet refused CSI driver {}: {}",
                self.driver_name,
                status.error
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
