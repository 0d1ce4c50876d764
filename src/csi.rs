//! `hydrator csi`: a CSI node plugin that gives pods a ready dataset as an inline ephemeral
//! volume (`csi: {driver, readOnly: true, volumeAttributes: {dataset: NAME}}`), a bind mount
//! of the daemon's snapshot directory, read-only and leased for exactly the pod's lifetime.
//!
//! Why a CSI plugin: the Baseline and Restricted Pod Security levels refuse `hostPath`, so a
//! pod there can mount neither the daemon's socket nor the cache; they admit `csi` volumes. The
//! plugin runs beside the daemon (same binary and image, a privileged container of the node
//! DaemonSet) and talks to it over its socket like any client; the trainer sees only its
//! dataset's directory, needs no token and runs unprivileged.
//!
//! The protocol is compiled from `csi.proto` (spec v1.12.0) by `src/build.rs`, and so is the
//! kubelet's plugin registration (`registration.proto`), which the plugin serves itself
//! ([`registration`]).

/// The CSI protocol's messages and services (generated).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("csi.v1");

    /// The kubelet's plugin registration protocol (generated).
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

mod authority;
mod keeper;
mod lazy;
mod plugin;
mod registration;
mod service;
mod target;
mod views;

pub(crate) use plugin::DATASET_ATTRIBUTE;
mod volumes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_stream::wrappers::UnixListenerStream;

use crate::cli::{CsiArgs, CsiKeeperArgs, DaemonConnection};
use crate::daemon_client::Client;
use crate::error::{Exit, SyncError, UsageError};
use plugin::Plugin;
use proto::identity_server::IdentityServer;
use proto::node_server::NodeServer;
use proto::registration::registration_server::RegistrationServer;
use registration::RegistrationService;
use service::IdentityService;

/// The longest a call waits for an absent daemon (`--daemon-wait` is cut to it).
const MAX_DAEMON_WAIT: u64 = 5;
/// How often lazy views are looked at for a snapshot that became ready.
const SETTLE_EVERY: Duration = Duration::from_secs(2);
/// How often leases are matched against what is mounted.
const RECONCILE_EVERY: Duration = Duration::from_secs(60);
/// How often the lazy views' connections are handed to the keeper again.
const KEEP_EVERY: Duration = Duration::from_secs(5);

/// `hydrator csi-keeper`: holds the lazy views' connections across restarts of the plugin.
pub(crate) async fn keep(args: CsiKeeperArgs) -> Result<Exit, SyncError> {
    let socket = args.socket;
    let served = tokio::task::spawn_blocking({
        let socket = socket.clone();
        move || keeper::serve(&socket)
    })
    .await;
    let err = match served {
        Ok(Err(err)) => err.to_string(),
        Err(err) => err.to_string(),
    };
    Err(UsageError::new(format!("keeping lazy views on {}: {err}", socket.display())).into())
}

pub(crate) async fn run(args: CsiArgs) -> Result<Exit, SyncError> {
    let socket = socket_path(&args.endpoint)?;
    let volumes = volumes::Volumes::open(&args.state_dir)
        .map_err(|e| UsageError::new(format!("--state-dir {}: {e}", args.state_dir.display())))?;
    // A CSI call must not sit out a long wait for an absent daemon: the kubelet asks again.
    let connection = DaemonConnection {
        daemon_wait: args.connection.daemon_wait.min(MAX_DAEMON_WAIT),
        ..args.connection
    };
    let client = Client::new(&connection, "csi", None)?;
    let keeper = args.keeper_socket.clone().map(keeper::Keeper::new);
    let plugin = Arc::new(Plugin::new(client, volumes, args.pods_dir.clone(), keeper));
    // Before the kubelet is answered: a view of the previous run is served again, not
    // published afresh.
    plugin.resume_kept_views().await;
    let identity = IdentityService {
        name: args.driver_name.clone(),
        daemon: Arc::new(Client::new(&connection, "csi", None)?),
    };
    let node = service::NodeService {
        node_id: args.node_id.clone(),
        plugin: plugin.clone(),
    };
    let listener = bind(&socket)?;
    let registration = args
        .registration_dir
        .as_deref()
        .map(|registry| {
            serve_registration(
                registry,
                &args.driver_name,
                args.kubelet_endpoint.as_deref(),
            )
        })
        .transpose()?;
    tracing::info!(
        "CSI driver {} on node {} listening on unix:{}",
        args.driver_name,
        args.node_id,
        socket.display()
    );
    let settling = plugin.clone();
    let keeping = plugin.clone();
    let reconciler = tokio::spawn(async move {
        loop {
            plugin.reconcile().await;
            tokio::time::sleep(RECONCILE_EVERY).await;
        }
    });
    let settler = tokio::spawn(async move {
        loop {
            settling.settle().await;
            tokio::time::sleep(SETTLE_EVERY).await;
        }
    });
    let keeper = tokio::spawn(async move {
        loop {
            tokio::time::sleep(KEEP_EVERY).await;
            keeping.keep_views().await;
        }
    });
    let served = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop_signal())
        .await;
    reconciler.abort();
    settler.abort();
    keeper.abort();
    if let Some((task, registration_socket)) = registration {
        task.abort();
        // Gone with the plugin: the kubelet deregisters the driver.
        let _ = std::fs::remove_file(registration_socket);
    }
    let _ = std::fs::remove_file(&socket);
    served.map_err(|e| UsageError::new(format!("serving CSI on {}: {e}", socket.display())))?;
    tracing::info!("stopped; published volumes stay mounted");
    Ok(Exit::Success)
}

/// Serves the kubelet's plugin registration on `DRIVER-reg.sock` in `registry` until the
/// plugin stops; returns the task and the socket to remove then.
fn serve_registration(
    registry: &Path,
    driver_name: &str,
    kubelet_endpoint: Option<&Path>,
) -> Result<(tokio::task::JoinHandle<()>, PathBuf), UsageError> {
    let socket = registration::socket_in(registry, driver_name);
    let kubelet_endpoint = kubelet_endpoint.map(Path::to_path_buf).unwrap_or_else(|| {
        Path::new("/var/lib/kubelet/plugins")
            .join(driver_name)
            .join("csi.sock")
    });
    let service = RegistrationService {
        driver_name: driver_name.to_owned(),
        kubelet_endpoint,
    };
    let listener = bind(&socket)?;
    tracing::info!(
        "registration for the kubelet on unix:{}, naming {}",
        socket.display(),
        service.kubelet_endpoint.display()
    );
    // Every connection goes through the relay that makes the kubelet's requests acceptable
    // to tonic (see `authority`).
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming(authority::relayed(listener))
            .await;
        if let Err(err) = served {
            tracing::error!("serving registration: {err}");
        }
    });
    Ok((task, socket))
}

/// `unix:///csi/csi.sock` (as the kubelet's registrar writes it) or a plain absolute path.
fn socket_path(endpoint: &str) -> Result<PathBuf, UsageError> {
    let path = Path::new(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
    match path.is_absolute() {
        true => Ok(path.to_path_buf()),
        false => Err(UsageError::new(format!(
            "--endpoint {endpoint:?} must be unix:///PATH/TO/csi.sock"
        ))),
    }
}

/// Binds the plugin's socket, replacing one a killed plugin left behind.
fn bind(socket: &Path) -> Result<tokio::net::UnixListener, UsageError> {
    let bad = |e: std::io::Error| UsageError::new(format!("--endpoint {}: {e}", socket.display()));
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(bad)?;
    }
    match std::fs::remove_file(socket) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(bad(err)),
        _ => {}
    }
    tokio::net::UnixListener::bind(socket).map_err(bad)
}

async fn stop_signal() {
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("/csi/csi.sock").unwrap(),
            Path::new("/csi/csi.sock")
        );
        assert!(socket_path("unix://csi.sock").is_err());
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
    }
}
