//! Running the real `hydrator csi` plugin beside a test daemon and calling it the way the
//! kubelet does: gRPC over its unix socket, with a client built from the same CSI proto.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hydrator::csi::proto::identity_client::IdentityClient;
use hydrator::csi::proto::node_client::NodeClient;
use hydrator::csi::proto::registration::registration_client::RegistrationClient;
use hydrator::csi::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use hydrator::csi::proto::volume_capability::{AccessType, MountVolume};
use hydrator::csi::proto::*;
use hyper_util::rt::TokioIo;
use tonic::transport::Channel;

use super::daemon::Daemon;

/// The driver name the plugin runs under by default.
pub const DRIVER: &str = "cache.hydrator.dev";

/// How long the kubelet waits for the answer to a CSI call before it gives up on it.
pub const CALL_BUDGET: Duration = Duration::from_secs(120);

/// A running plugin with `DIR/pods` as the kubelet's pods directory; killed when dropped, and
/// whatever is still mounted under `DIR/pods` is unmounted, so a failed test leaves no mount
/// behind. Other threads may call it while one kills and restarts it.
pub struct Csi {
    child: Mutex<Child>,
    pub socket: PathBuf,
    dir: PathBuf,
    daemon_socket: PathBuf,
    /// `hydrator csi-keeper`, which holds the lazy views' connections, and its socket.
    keeper: Option<(Mutex<Child>, PathBuf)>,
    runtime: tokio::runtime::Runtime,
}

/// One inline ephemeral volume of a pod, as the kubelet describes it.
pub struct Volume<'a> {
    pub id: &'a str,
    pub pod_uid: &'a str,
    pub dataset: &'a str,
    pub target: &'a Path,
    pub readonly: bool,
    /// More volume attributes (`snapshot`).
    pub attributes: &'a [(&'a str, &'a str)],
}

pub fn volume<'a>(id: &'a str, pod_uid: &'a str, dataset: &'a str, target: &'a Path) -> Volume<'a> {
    Volume {
        id,
        pod_uid,
        dataset,
        target,
        readonly: true,
        attributes: &[],
    }
}

impl Csi {
    /// Starts `hydrator csi` in `dir` against `daemon`; waits until it answers a probe.
    pub fn start(dir: &Path, daemon: &Daemon) -> Self {
        Self::start_beside(dir, daemon, None)
    }

    /// [`Csi::start`] with `hydrator csi-keeper` beside it, as the manifests run them.
    pub fn start_with_keeper(dir: &Path, daemon: &Daemon) -> Self {
        let socket = dir.join("keeper/keeper.sock");
        let keeper = spawn_keeper(dir, &socket);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the keeper is not up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self::start_beside(dir, daemon, Some((Mutex::new(keeper), socket)))
    }

    fn start_beside(dir: &Path, daemon: &Daemon, keeper: Option<(Mutex<Child>, PathBuf)>) -> Self {
        let socket = dir.join("csi.sock");
        let keeper_socket = keeper.as_ref().map(|(_, socket)| socket.as_path());
        let child = spawn(dir, &socket, &daemon.socket, keeper_socket);
        let csi = Self {
            child: Mutex::new(child),
            socket,
            dir: dir.to_path_buf(),
            daemon_socket: daemon.socket.clone(),
            keeper,
            runtime: tokio::runtime::Runtime::new().unwrap(),
        };
        csi.wait_until_ready();
        csi
    }

    /// SIGKILL to the keeper, then starts it again: it comes back holding nothing.
    pub fn restart_keeper(&self) {
        let (keeper, socket) = self.keeper.as_ref().expect("started with a keeper");
        let mut keeper = keeper
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = keeper.kill();
        let _ = keeper.wait();
        let _ = std::fs::remove_file(socket);
        *keeper = spawn_keeper(&self.dir, socket);
    }

    fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.probe().is_ok_and(|ready| ready) {
            assert!(Instant::now() < deadline, "plugin not up:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("csi.log")).unwrap_or_default()
    }

    pub fn keeper_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("keeper.log")).unwrap_or_default()
    }

    /// The process id of the running plugin.
    pub fn pid(&self) -> u32 {
        self.child().id()
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// SIGKILL, as a crash or an OOM kill would end it; published mounts stay.
    pub fn kill(&self) {
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGTERM, as a rollout ends the plugin, then starts it again.
    pub fn terminate_and_restart(&self) {
        let mut child = self.child();
        // SAFETY: a signal to the plugin's own process, which this handle has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        let keeper_socket = self.keeper.as_ref().map(|(_, socket)| socket.as_path());
        *child = spawn(&self.dir, &self.socket, &self.daemon_socket, keeper_socket);
        drop(child);
        self.wait_until_ready();
    }

    /// Kills the plugin and starts it again, as a crash and the DaemonSet's restart would.
    pub fn restart(&mut self) {
        self.kill_and_restart(Duration::ZERO);
    }

    /// [`Csi::restart`] while other threads may be calling the plugin, with the plugin down for
    /// `down` in between (the DaemonSet's back-off): their calls fail meanwhile, as the
    /// kubelet's would.
    pub fn kill_and_restart(&self, down: Duration) {
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
        std::thread::sleep(down);
        let keeper_socket = self.keeper.as_ref().map(|(_, socket)| socket.as_path());
        *child = spawn(&self.dir, &self.socket, &self.daemon_socket, keeper_socket);
        drop(child);
        self.wait_until_ready();
    }

    /// One call, given up after [`CALL_BUDGET`] as the kubelet does (`DEADLINE_EXCEEDED`).
    fn call<T>(
        &self,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        let timed = async { tokio::time::timeout(CALL_BUDGET, call).await };
        match self.runtime.block_on(timed) {
            Ok(answer) => answer.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {CALL_BUDGET:?}, the kubelet's budget"
            ))),
        }
    }

    fn channel(&self) -> Result<Channel, tonic::Status> {
        self.channel_to(self.socket.clone())
    }

    /// The socket the kubelet's plugin watcher finds in its registry directory.
    pub fn registration_socket(&self) -> PathBuf {
        self.dir.join("registry").join(format!("{DRIVER}-reg.sock"))
    }

    /// What the kubelet's plugin watcher asks first: the driver's name and CSI endpoint.
    pub fn registration_info(&self) -> PluginInfo {
        let channel = self.channel_to(self.registration_socket()).unwrap();
        let mut client = RegistrationClient::new(channel);
        self.call(client.get_info(InfoRequest {})).unwrap()
    }

    /// What the kubelet's plugin watcher tells the plugin once it has validated it.
    pub fn notify_registration(&self, registered: bool, error: &str) {
        let channel = self.channel_to(self.registration_socket()).unwrap();
        let mut client = RegistrationClient::new(channel);
        let status = RegistrationStatus {
            plugin_registered: registered,
            error: error.into(),
        };
        self.call(client.notify_registration_status(status))
            .unwrap();
    }

    /// Stops the plugin as the kubelet's container runtime does: SIGTERM, then waits.
    pub fn terminate(&self) {
        let mut child = self.child();
        // SAFETY: signals the plugin's own process, which this handle has not reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = child.wait();
    }

    fn channel_to(&self, socket: PathBuf) -> Result<Channel, tonic::Status> {
        self.runtime.block_on(async move {
            tonic::transport::Endpoint::from_static("http://plugin")
                .connect_with_connector(tower::service_fn(move |_| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(socket).await?,
                        ))
                    }
                }))
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))
        })
    }

    pub fn probe(&self) -> Result<bool, tonic::Status> {
        let mut client = IdentityClient::new(self.channel()?);
        let answer = self.call(client.probe(ProbeRequest {}))?;
        Ok(answer.ready == Some(true))
    }

    pub fn plugin_info(&self) -> GetPluginInfoResponse {
        let mut client = IdentityClient::new(self.channel().unwrap());
        self.call(client.get_plugin_info(GetPluginInfoRequest {}))
            .unwrap()
    }

    pub fn node_info(&self) -> NodeGetInfoResponse {
        let mut client = NodeClient::new(self.channel().unwrap());
        self.call(client.node_get_info(NodeGetInfoRequest {}))
            .unwrap()
    }

    /// One NodePublishVolume call; the target's parent is made first, as the kubelet does.
    pub fn publish(&self, volume: &Volume) -> Result<(), tonic::Status> {
        if let Some(parent) = volume.target.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        self.publish_as_is(volume)
    }

    /// One NodePublishVolume call, with the target's directories as they are.
    pub fn publish_as_is(&self, volume: &Volume) -> Result<(), tonic::Status> {
        let mut context: std::collections::HashMap<String, String> = [
            ("dataset", volume.dataset),
            ("csi.storage.k8s.io/pod.uid", volume.pod_uid),
            ("csi.storage.k8s.io/pod.name", "trainer-0"),
            ("csi.storage.k8s.io/pod.namespace", "default"),
            ("csi.storage.k8s.io/serviceAccount.name", "default"),
            ("csi.storage.k8s.io/ephemeral", "true"),
        ]
        .iter()
        .chain(volume.attributes)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        context.retain(|_, v| !v.is_empty());
        let request = NodePublishVolumeRequest {
            volume_id: volume.id.into(),
            target_path: volume.target.display().to_string(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(volume_capability::AccessMode {
                    // What the kubelet sends for an inline ephemeral volume.
                    mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
            }),
            readonly: volume.readonly,
            volume_context: context,
            ..Default::default()
        };
        let mut client = NodeClient::new(self.channel()?);
        self.call(client.node_publish_volume(request)).map(|_| ())
    }

    /// Publishes, retrying while the plugin answers UNAVAILABLE (as the kubelet does); returns
    /// the retryable answers it got on the way.
    pub fn publish_when_ready(&self, volume: &Volume) -> Vec<tonic::Status> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut retried = Vec::new();
        loop {
            match self.publish(volume) {
                Ok(()) => return retried,
                Err(status) if status.code() == tonic::Code::Unavailable => retried.push(status),
                Err(status) => panic!("publish failed: {status:?}\n{}", self.log()),
            }
            assert!(
                Instant::now() < deadline,
                "never ready: {retried:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// NodeGetVolumeStats, as the kubelet calls it for metrics and volume health.
    pub fn volume_stats(
        &self,
        id: &str,
        target: &Path,
    ) -> Result<NodeGetVolumeStatsResponse, tonic::Status> {
        let mut client = NodeClient::new(self.channel()?);
        let request = NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: target.display().to_string(),
            ..Default::default()
        };
        self.call(client.node_get_volume_stats(request))
    }

    pub fn unpublish(&self, id: &str, target: &Path) -> Result<(), tonic::Status> {
        let mut client = NodeClient::new(self.channel()?);
        let request = NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        };
        self.call(client.node_unpublish_volume(request)).map(|_| ())
    }
}

impl Drop for Csi {
    fn drop(&mut self) {
        self.kill();
        if let Some((keeper, _)) = &self.keeper {
            let mut keeper = keeper
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let _ = keeper.kill();
            let _ = keeper.wait();
        }
        let pods = self.dir.join("pods");
        // Stacked mounts come off one per pass.
        for _ in 0..8 {
            let mounted = mounts_under(&pods);
            if mounted.is_empty() {
                break;
            }
            for target in mounted.iter().rev() {
                let path = std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path; detaching cannot touch anything else.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// The `(root, mount point)` of every mount in this mount namespace, bottom to top.
fn mount_table() -> Vec<(PathBuf, PathBuf)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ').skip(3);
            let root = fields.next()?;
            Some((PathBuf::from(root), PathBuf::from(fields.next()?)))
        })
        .collect()
}

/// Every mount point under `dir` (one per mount: stacked mounts repeat), bottom to top.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mount_table()
        .into_iter()
        .map(|(_, point)| point)
        .filter(|point| point.starts_with(dir) && point != dir)
        .collect()
}

/// The snapshot digest bound on `target` (the last name of the topmost mount's source
/// directory, `ROOT/NAME/DIGEST`): what a pod there reads, whatever the plugin recorded.
pub fn mounted_snapshot(target: &Path) -> Option<String> {
    let (root, _) = mount_table()
        .into_iter()
        .rfind(|(_, point)| point == target)?;
    Some(root.file_name()?.to_string_lossy().into_owned())
}

/// `hydrator csi` for the daemon on `daemon_socket`, logging into `dir/csi.log`.
fn spawn(dir: &Path, socket: &Path, daemon_socket: &Path, keeper: Option<&Path>) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("csi.log"))
        .unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hydrator"));
    command
        .env_clear()
        .arg("csi")
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .args(["--node-id", "test-node"])
        .arg("--state-dir")
        .arg(dir.join("csi-state"))
        .arg("--pods-dir")
        .arg(dir.join("pods"))
        .arg("--registration-dir")
        .arg(dir.join("registry"))
        .arg("--daemon")
        .arg(format!("unix://{}", daemon_socket.display()));
    if let Some(keeper) = keeper {
        command.arg("--keeper-socket").arg(keeper);
    }
    command
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

/// `hydrator csi-keeper` on `socket`, logging beside the plugin.
fn spawn_keeper(dir: &Path, socket: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("keeper.log"))
        .unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_hydrator"))
        .env_clear()
        .arg("csi-keeper")
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}
