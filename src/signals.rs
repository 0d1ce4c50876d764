//! SIGTERM and SIGINT during a sync: the first one stops the run gracefully (no new objects,
//! in-flight parts abandoned, the durable parts recorded in the manifest, exit code 3), so the
//! next run resumes; a second one exits at once. Kubernetes gives an init container 30 s
//! between SIGTERM and SIGKILL by default; the graceful path needs well under a second plus
//! one `syncfs`.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::error::Exit;

/// A stop signal for `engine::run_with` that turns true on the first SIGTERM or SIGINT.
pub(crate) fn stop_on_signals() -> watch::Receiver<bool> {
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!("cannot catch SIGTERM and SIGINT; they will end the run abruptly");
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("stopping: recording what is durable (a second signal exits at once)");
        stop.send_replace(true);
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        std::process::exit(Exit::Stopped as i32);
    });
    stopped
}
