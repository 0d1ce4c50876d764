//! moto's S3 server (`python -m moto.server`), a second real S3 implementation and the one
//! with versioned buckets, shared by every test of one test process like Garage
//! ([`super::garage`]): started once, killed at exit or with the test process.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::keeper::{free_ports, log_tail, missing, start_kept, wait_answering, Failure};

const PYTHON_ENV: &str = "HYDRATOR_MOTO_PYTHON";
const REQUIRE_ENV: &str = "HYDRATOR_REQUIRE_MOTO";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running moto server; it takes any credentials.
pub struct Moto {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    child: Mutex<Option<(Child, tempfile::TempDir)>>,
}

static MOTO: OnceLock<Result<Option<Moto>, String>> = OnceLock::new();

/// Starts moto once per test process. `None` when no Python with moto is found (tests then
/// skip) unless `HYDRATOR_REQUIRE_MOTO=1`; panics when it is required but missing, or found
/// but fails to start.
pub fn shared() -> Option<&'static Moto> {
    match MOTO.get_or_init(init) {
        Ok(moto) => moto.as_ref(),
        Err(message) => panic!("{message}"),
    }
}

fn init() -> Result<Option<Moto>, String> {
    let Some(python) = find_python() else {
        let hint =
            format!("no Python with moto found (set {PYTHON_ENV}, or run tests/install-moto.sh)");
        return missing(REQUIRE_ENV, "moto", &hint);
    };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let log_path = dir.path().join("moto.log");
    let [port, _] = free_ports().map_err(|e| e.to_string())?;
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let mut command = Command::new(&python);
    command
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    let ready = move |child: &mut Child| wait_answering(child, "moto", port, "/", READY_TIMEOUT);
    let child = start_kept(command, "moto", ready).map_err(|failure: Failure| {
        format!(
            "{}\npython: {}\nlast lines of its log:\n{}",
            failure.message,
            python.display(),
            log_tail(&log_path)
        )
    })?;
    // SAFETY: registers a plain `extern "C" fn` that does not unwind.
    if unsafe { libc::atexit(stop_at_exit) } != 0 {
        return Err("libc::atexit failed: cannot guarantee moto is stopped".to_owned());
    }
    Ok(Some(Moto {
        endpoint: format!("http://127.0.0.1:{port}"),
        child: Mutex::new(Some((child, dir))),
    }))
}

/// `HYDRATOR_MOTO_PYTHON`, else the virtualenv `tests/install-moto.sh` makes, else `python3`
/// when it imports moto's server.
fn find_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os(PYTHON_ENV) {
        return Some(python.into());
    }
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let venv = home.join(".cache/hydrator-tests/moto/bin/python");
    let has_moto = |python: &std::path::Path| {
        Command::new(python)
            .args(["-c", "import moto.server"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    [venv, PathBuf::from("python3")]
        .into_iter()
        .find(|python| has_moto(python))
}

extern "C" fn stop_at_exit() {
    if let Some(Ok(Some(moto))) = MOTO.get() {
        let running = moto.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((mut child, dir)) = running {
            let _ = child.kill();
            let _ = child.wait();
            let _ = dir.close();
        }
    }
}
