//! Runs an external server (Garage, moto) for the whole test process: the child is spawned
//! from a dedicated thread that parks forever, because `PR_SET_PDEATHSIG` fires when the
//! *thread* that spawned the child exits; with it, a killed test process takes the server down.
//! The child stays in the test's process group, so Ctrl-C and nextest's timeouts reach it.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Why a server did not start.
pub struct Failure {
    /// It died or could not bind: worth another attempt with fresh ports.
    pub retry: bool,
    pub message: String,
}

impl Failure {
    pub fn setup(what: &str, error: impl std::fmt::Display) -> Self {
        Self {
            retry: false,
            message: format!("cannot start the server: {what}: {error}"),
        }
    }
}

/// Spawns `command` on a keeper thread and returns the child once `ready` says it serves.
pub fn start_kept(
    mut command: Command,
    name: &str,
    ready: impl FnOnce(&mut Child) -> Result<(), Failure> + Send + 'static,
) -> Result<Child, Failure> {
    // SAFETY: only `prctl`, which is async-signal-safe, runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (started, outcome) = mpsc::channel();
    thread::Builder::new()
        .name(format!("{name}-keeper"))
        .spawn(move || {
            let mut child = match command.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let _ = started.send(Err(Failure::setup("spawn", e)));
                    return;
                }
            };
            match ready(&mut child) {
                Ok(()) => {
                    if started.send(Ok(child)).is_err() {
                        return; // nobody to hand it to: exiting fires the death signal
                    }
                    loop {
                        thread::park();
                    }
                }
                Err(failure) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = started.send(Err(failure));
                }
            }
        })
        .map_err(|e| Failure::setup("spawn keeper thread", e))?;
    outcome.recv().unwrap_or_else(|_| {
        Err(Failure::setup(
            "keeper thread",
            "panicked before reporting readiness",
        ))
    })
}

/// What a test process does where a server is not installed (`hint` says how to install it): an
/// error when `require_env` is `1`, else it says the checks against `name` are skipped.
pub fn missing<T>(require_env: &str, name: &str, hint: &str) -> Result<Option<T>, String> {
    if std::env::var(require_env).is_ok_and(|v| v == "1") {
        return Err(format!("{require_env}=1 but {hint}"));
    }
    eprintln!("skipping {name}-backed checks: {hint}");
    Ok(None)
}

/// Calls `launch` until it starts the server, fails in a way not worth another attempt, or has
/// made `attempts` attempts.
pub fn with_attempts<T>(
    attempts: u32,
    mut launch: impl FnMut() -> Result<T, Failure>,
) -> Result<T, String> {
    let mut attempt = 1;
    loop {
        match launch() {
            Ok(server) => return Ok(server),
            Err(failure) if failure.retry && attempt < attempts => attempt += 1,
            Err(failure) if attempt == 1 => return Err(failure.message),
            Err(failure) => return Err(format!("attempt {attempt}: {}", failure.message)),
        }
    }
}

/// Two distinct free loopback ports (both listeners are held until both are picked).
pub fn free_ports() -> io::Result<[u16; 2]> {
    let a = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let b = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok([a.local_addr()?.port(), b.local_addr()?.port()])
}

/// The last lines of a log, for a failure message.
pub fn log_tail(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(log) => {
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Waits until `GET PATH` on the loopback `port` answers, not with a 5xx, for at most `limit`; `name`
/// names the server in the failure. A server that exits first is worth another attempt (it
/// may have lost its port to another process).
pub fn wait_answering(
    child: &mut Child,
    name: &str,
    port: u16,
    path: &str,
    limit: Duration,
) -> Result<(), Failure> {
    let deadline = Instant::now() + limit;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    loop {
        let answered = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).and_then(|mut stream| {
            stream.write_all(request.as_bytes())?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head)?;
            Ok(head.starts_with(b"HTTP/1.") && head[9] != b'5')
        });
        if answered.is_ok_and(|ok| ok) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Failure {
                retry: true,
                message: format!("{name} exited before it was ready ({status})"),
            });
        }
        if Instant::now() >= deadline {
            return Err(Failure {
                retry: false,
                message: format!("{name} not ready after {limit:?}"),
            });
        }
        thread::sleep(Duration::from_millis(100));
    }
}
