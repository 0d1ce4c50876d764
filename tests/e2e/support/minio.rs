//! MinIO, the store most customers run hydrator against (AGPLv3: an external test program only,
//! never linked), shared by every test of one test process like Garage ([`super::garage`]) and
//! moto ([`super::moto`]): started once on one drive (which keeps versions), killed at exit or
//! with the test process. `tests/install-minio.sh` builds it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::keeper::{
    free_ports, log_tail, missing, start_kept, wait_answering, with_attempts, Failure,
};

const BIN_ENV: &str = "HYDRATOR_MINIO_BIN";
const MC_BIN_ENV: &str = "HYDRATOR_MC_BIN";
const REQUIRE_ENV: &str = "HYDRATOR_REQUIRE_MINIO";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Ports are picked free and released just before MinIO binds them: another process may take
/// one in between, and MinIO then exits; another attempt takes fresh ports.
const ATTEMPTS: u32 = 3;

/// A running MinIO; its root user signs every request of the tests.
pub struct Minio {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    child: Mutex<Option<(Child, tempfile::TempDir)>>,
}

static MINIO: OnceLock<Result<Option<Minio>, String>> = OnceLock::new();

/// Starts MinIO once per test process. `None` when no minio binary is found (tests then skip)
/// unless `HYDRATOR_REQUIRE_MINIO=1`; panics when it is required but missing, or found but
/// fails to start.
pub fn shared() -> Option<&'static Minio> {
    match MINIO.get_or_init(init) {
        Ok(minio) => minio.as_ref(),
        Err(message) => panic!("{message}"),
    }
}

fn init() -> Result<Option<Minio>, String> {
    let Some(bin) = find_binary() else {
        let hint = format!("no minio binary found (set {BIN_ENV}, or run tests/install-minio.sh)");
        return missing(REQUIRE_ENV, "MinIO", &hint);
    };
    let minio = with_attempts(ATTEMPTS, || launch(&bin, &[]))?;
    // SAFETY: registers a plain `extern "C" fn` that does not unwind.
    if unsafe { libc::atexit(stop_at_exit) } != 0 {
        minio.stop();
        return Err("libc::atexit failed: cannot guarantee MinIO is stopped".to_owned());
    }
    Ok(Some(minio))
}

/// `HYDRATOR_MINIO_BIN`, else where `tests/install-minio.sh` puts it.
fn find_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_ENV) {
        return Some(bin.into());
    }
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let bin = home.join(".cache/hydrator-tests/minio/bin/minio");
    bin.is_file().then_some(bin)
}

/// A MinIO of one test's own, its settings `env` added (`MINIO_API_REQUESTS_MAX=2`, say);
/// stopped when dropped. `None` where MinIO is not installed and not required.
pub fn own(env: &[(&str, &str)]) -> Option<Own> {
    let Some(bin) = find_binary() else {
        let hint = format!("no minio binary found (set {BIN_ENV}, or run tests/install-minio.sh)");
        return missing(REQUIRE_ENV, "MinIO", &hint).unwrap_or_else(|message| panic!("{message}"));
    };
    match with_attempts(ATTEMPTS, || launch(&bin, env)) {
        Ok(minio) => Some(Own(minio)),
        Err(message) => panic!("{message}"),
    }
}

/// See [`own`].
pub struct Own(Minio);

impl std::ops::Deref for Own {
    type Target = Minio;

    fn deref(&self) -> &Minio {
        &self.0
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// mc, MinIO's client: `HYDRATOR_MC_BIN`, else where `tests/install-minio.sh` puts it beside
/// minio. `None` where it is not there and MinIO is not required; a panic where it is.
pub fn mc() -> Option<PathBuf> {
    let bin = match std::env::var_os(MC_BIN_ENV) {
        Some(bin) => PathBuf::from(bin),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)?
            .join(".cache/hydrator-tests/minio/bin/mc"),
    };
    if bin.is_file() {
        return Some(bin);
    }
    let hint = format!("no mc binary found (set {MC_BIN_ENV}, or run tests/install-minio.sh)");
    missing(REQUIRE_ENV, "mc", &hint).unwrap_or_else(|message| panic!("{message}"))
}

fn launch(bin: &Path, env: &[(&str, &str)]) -> Result<Minio, Failure> {
    let dir = tempfile::Builder::new()
        .prefix("hydrator-minio-")
        .tempdir()
        .map_err(|e| Failure::setup("temp dir", e))?;
    let log_path = dir.path().join("minio.log");
    let log = std::fs::File::create(&log_path).map_err(|e| Failure::setup("create log", e))?;
    let log_copy = log.try_clone().map_err(|e| Failure::setup("dup log", e))?;
    let [port, console] = free_ports().map_err(|e| Failure::setup("free ports", e))?;
    let access_key = "hydrator-minio-root".to_owned();
    let secret_key = format!("secret-{}", fastrand::u64(..));
    let mut command = Command::new(bin);
    command
        .arg("server")
        .arg(dir.path().join("data"))
        .arg("--address")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--console-address")
        .arg(format!("127.0.0.1:{console}"))
        .arg("--certs-dir")
        .arg(dir.path().join("certs"))
        .arg("--quiet")
        // Nothing inherited: a MINIO_* setting of the caller's shell would change the server.
        .env_clear()
        .env("HOME", dir.path())
        .env("MINIO_ROOT_USER", &access_key)
        .env("MINIO_ROOT_PASSWORD", &secret_key)
        .env("MINIO_BROWSER", "off")
        .env("MINIO_UPDATE", "off")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log_copy)
        .stderr(log);
    let ready = move |child: &mut Child| {
        wait_answering(child, "MinIO", port, "/minio/health/ready", READY_TIMEOUT)
    };
    match start_kept(command, "minio", ready) {
        Ok(child) => Ok(Minio {
            endpoint: format!("http://127.0.0.1:{port}"),
            access_key,
            secret_key,
            child: Mutex::new(Some((child, dir))),
        }),
        Err(mut failure) => {
            failure.message = format!(
                "{}\nbinary: {}\nlast lines of its log:\n{}",
                failure.message,
                bin.display(),
                log_tail(&log_path)
            );
            Err(failure)
        }
    }
}

impl Minio {
    fn stop(&self) {
        let running = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((mut child, dir)) = running {
            let _ = child.kill();
            let _ = child.wait();
            let _ = dir.close();
        }
    }
}

extern "C" fn stop_at_exit() {
    if let Some(Ok(Some(minio))) = MINIO.get() {
        minio.stop();
    }
}
