//! Dragonfly's own scheduler for the fleet test, as tests/install-dragonfly-scheduler.sh builds
//! it: standalone, with no manager (a local dynconfig file, written with its defaults on first
//! start) and no Redis, with one peer per task sent to the store (`backToSourceCount: 1`, as
//! k8s/overlays/p2p/dragonfly-values.yaml sets). It goes down on cue by being killed, and comes
//! back on the same port.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN_ENV: &str = "HYDRATOR_DRAGONFLY_SCHEDULER_BIN";

/// The installed scheduler: `$HYDRATOR_DRAGONFLY_SCHEDULER_BIN`, or where the install script
/// puts it.
pub fn installed() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_ENV) {
        return Some(PathBuf::from(bin));
    }
    let home = PathBuf::from(std::env::var_os("HOME")?);
    let bin = home.join(".cache/hydrator-tests/dragonfly/bin/scheduler");
    bin.is_file().then_some(bin)
}

/// What the install script built (`v2.5.1+api-v2.3.8`).
pub fn version(bin: &Path) -> String {
    std::fs::read_to_string(bin.with_extension("version"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "unknown version".into())
}

/// A running scheduler on `127.0.0.1`, killed when dropped.
pub struct RealScheduler {
    pub addr: SocketAddr,
    bin: PathBuf,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

impl RealScheduler {
    /// Starts `bin` with its files under `dir`, on a free port; waits until it listens.
    pub fn start(bin: &Path, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = format!(
            "console: true\n\
             server:\n  listenIP: 127.0.0.1\n  advertiseIP: 127.0.0.1\n  port: {port}\n  \
             advertisePort: {port}\n  host: fleet-scheduler\n  logDir: {dir}/log\n  \
             pluginDir: {dir}/plugins\n\
             scheduler:\n  backToSourceCount: 1\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("scheduler.yaml"), config).unwrap();
        let scheduler = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            child: Mutex::new(None),
        };
        scheduler.up();
        scheduler
    }

    /// Starts the process (again), and waits until it accepts connections.
    pub fn up(&self) {
        let mut child = self.child.lock().unwrap();
        assert!(child.is_none(), "the scheduler is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("scheduler.log"))
            .unwrap();
        *child = Some(
            Command::new(&self.bin)
                .arg("--config")
                .arg(self.dir.join("scheduler.yaml"))
                .arg("--dynconfig")
                .arg(self.dir.join("dynconfig.yaml"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(self.addr).is_err() {
            if let Some(status) = child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the scheduler exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "scheduler not up:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL: the scheduler is down until [`RealScheduler::up`].
    pub fn down(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("scheduler.log")).unwrap_or_default()
    }
}

impl Drop for RealScheduler {
    fn drop(&mut self) {
        self.down();
    }
}
