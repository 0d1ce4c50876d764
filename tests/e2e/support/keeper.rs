//! Runs an external server (Garage, moto) for the whole test process: the child is spawned
//! from a dedicated thread that parks forever, because `PR_SET_PDEATHSIG` fires when the
//! *thread* that spawned the child exits; with it, a killed test process takes the server down.
//! The child stays in the test's process group, so Ctrl-C and nextest's timeouts reach it.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::thread;

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
