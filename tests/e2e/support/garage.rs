//! A real single-node Garage (S3-compatible; AGPL, so it runs as an external binary and is never
//! linked) shared by every test of one test process.
//!
//! Why it is built this way:
//! - One server per process (`OnceLock`): it starts in well under a second, and `cargo nextest`
//!   runs each test in its own process anyway. A failed start is remembered, so every test reports
//!   the same error instead of waiting for its own timeout.
//! - A `static` is never dropped, so a `libc::atexit` hook kills the child and removes its temp dir
//!   on any normal exit (failing tests included). If the test process is killed instead,
//!   `PR_SET_PDEATHSIG` takes Garage down with it. That signal fires when the *thread* that spawned
//!   the child exits, so the child is spawned from a dedicated thread that never returns. The child
//!   stays in the test's process group, so Ctrl-C and nextest's timeout kills reach it too.
//! - The same thread probes readiness with its own current-thread tokio runtime, so `shared()` works
//!   whether or not the caller is already inside a runtime.
//! - Ready means a signed ListObjectsV2 on the default bucket succeeds, not just an open port.

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::DisplayErrorContext;
use tempfile::TempDir;

use super::keeper::{free_ports, log_tail, missing, start_kept, with_attempts, Failure};

const BIN_ENV: &str = "HYDRATOR_GARAGE_BIN";
const REQUIRE_ENV: &str = "HYDRATOR_REQUIRE_GARAGE";
const REGION: &str = "garage";
const BUCKET: &str = "hydrator-test";
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Ports are picked by binding port 0 and released just before Garage binds them, so another
/// process can take one in between. Garage then aborts (RPC port) or logs the error and hangs
/// (S3 port); either way we retry with fresh ports.
const ATTEMPTS: u32 = 3;

/// A running Garage with one bucket that the key below can read and write.
/// Clients must use path-style addressing.
pub struct Garage {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    pub bucket: String,
    /// Taken by the `atexit` hook.
    running: Mutex<Option<Running>>,
}

struct Running {
    child: Child,
    dir: TempDir,
}

static GARAGE: OnceLock<Result<Option<Garage>, String>> = OnceLock::new();

/// Starts Garage once per test process and returns it. Returns `None` when no garage binary is
/// found (tests should then skip) unless `HYDRATOR_REQUIRE_GARAGE=1`; panics when it is required
/// but missing, or when a binary is found but Garage fails to start.
pub fn shared() -> Option<&'static Garage> {
    match GARAGE.get_or_init(init) {
        Ok(garage) => garage.as_ref(),
        Err(message) => panic!("{message}"),
    }
}

fn init() -> Result<Option<Garage>, String> {
    let Some(bin) = find_binary() else {
        let hint = format!(
            "no garage binary found (set {BIN_ENV}, put `garage` on PATH, or run tests/install-garage.sh)"
        );
        return missing(REQUIRE_ENV, "Garage", &hint);
    };
    let garage = with_attempts(ATTEMPTS, || launch(&bin))?;
    // SAFETY: registers a plain `extern "C" fn` that does not unwind.
    if unsafe { libc::atexit(stop_at_exit) } != 0 {
        garage.stop();
        return Err("libc::atexit failed: cannot guarantee Garage is stopped".to_owned());
    }
    Ok(Some(garage))
}

/// `HYDRATOR_GARAGE_BIN`, else `garage` on `PATH`, else `$HOME/.cargo/bin/garage`.
fn find_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_ENV) {
        return Some(bin.into());
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("garage"));
    let cargo_bin = std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo/bin/garage"));
    on_path.chain(cargo_bin).find(|candidate| {
        fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

fn launch(bin: &Path) -> Result<Garage, Failure> {
    let dir = tempfile::Builder::new()
        .prefix("hydrator-garage-")
        .tempdir()
        .map_err(|e| Failure::setup("temp dir", e))?;
    let [rpc_port, s3_port] = free_ports().map_err(|e| Failure::setup("free ports", e))?;
    let config_path = dir.path().join("garage.toml");
    let config = format!(
        r#"metadata_dir = "{dir}/meta"
data_dir = "{dir}/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:{rpc_port}"
rpc_public_addr = "127.0.0.1:{rpc_port}"
rpc_secret = "{rpc_secret}"

[s3_api]
api_bind_addr = "127.0.0.1:{s3_port}"
s3_region = "{REGION}"
"#,
        dir = dir.path().display(),
        rpc_secret = hex(64),
    );
    fs::write(&config_path, config).map_err(|e| Failure::setup("write garage.toml", e))?;
    let log_path = dir.path().join("garage.log");
    let log = File::create(&log_path).map_err(|e| Failure::setup("create garage.log", e))?;
    let log_copy = log
        .try_clone()
        .map_err(|e| Failure::setup("dup garage.log", e))?;

    let garage = Garage {
        endpoint: format!("http://127.0.0.1:{s3_port}"),
        region: REGION.to_owned(),
        access_key: format!("GK{}", hex(24)),
        secret_key: hex(64),
        bucket: BUCKET.to_owned(),
        running: Mutex::new(None),
    };
    let mut command = Command::new(bin);
    command
        .arg("-c")
        .arg(&config_path)
        .args(["server", "--single-node", "--default-bucket"])
        // Nothing inherited: a GARAGE_RPC_SECRET or RUST_LOG from the caller's shell would
        // override the config or flood the log.
        .env_clear()
        .env("RUST_LOG", "netapp=info,garage=info")
        .env("GARAGE_DEFAULT_ACCESS_KEY", &garage.access_key)
        .env("GARAGE_DEFAULT_SECRET_KEY", &garage.secret_key)
        .env("GARAGE_DEFAULT_BUCKET", &garage.bucket)
        .stdin(Stdio::null())
        .stdout(log_copy)
        .stderr(log);
    let client = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&garage.endpoint)
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new(
                &garage.access_key,
                &garage.secret_key,
                None,
                None,
                "hydrator-test-garage",
            ))
            .force_path_style(true)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(2))
                    .build(),
            )
            .build(),
    );

    let ready_log = log_path.clone();
    let outcome = start_kept(command, "garage", move |child| {
        wait_ready(child, &client, &ready_log)
    });
    match outcome {
        Ok(child) => {
            *garage.running.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Running { child, dir });
            Ok(garage)
        }
        Err(mut failure) => {
            failure.message = format!(
                "{}\nbinary: {}\nlast lines of its log:\n{}",
                failure.message,
                bin.display(),
                log_tail(&log_path),
            );
            Err(failure)
        }
    }
}

fn wait_ready(child: &mut Child, client: &aws_sdk_s3::Client, log: &Path) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::setup("tokio runtime", e))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let probe = client.list_objects_v2().bucket(BUCKET).max_keys(1).send();
        let last_error = match runtime.block_on(probe) {
            Ok(_) => return Ok(()),
            Err(e) => DisplayErrorContext(e).to_string(),
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(Failure {
                    retry: true,
                    message: format!("Garage exited before it was ready ({status})"),
                })
            }
            Ok(None) => {}
            Err(e) => return Err(Failure::setup("wait for garage", e)),
        }
        if fs::read_to_string(log).is_ok_and(|log| log.contains("Address already in use")) {
            return Err(Failure {
                retry: true,
                message: "Garage could not bind its port".to_owned(),
            });
        }
        if Instant::now() >= deadline {
            return Err(Failure {
                retry: false,
                message: format!(
                    "Garage not ready after {READY_TIMEOUT:?}; last ListObjectsV2 error: {last_error}"
                ),
            });
        }
        thread::sleep(Duration::from_millis(50));
    }
}

impl Garage {
    fn stop(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(Running { mut child, dir }) = running {
            let _ = child.kill();
            let _ = child.wait();
            let _ = dir.close();
        }
    }
}

extern "C" fn stop_at_exit() {
    if let Some(Ok(Some(garage))) = GARAGE.get() {
        garage.stop();
    }
}

fn hex(len: usize) -> String {
    (0..len)
        .map(|_| char::from(b"0123456789abcdef"[fastrand::usize(..16)]))
        .collect()
}
