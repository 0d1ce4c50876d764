//! The API's HTTP server, built for a node where any pod may open a connection: at most
//! [`MAX_CONNECTIONS`] are served at once (the rest wait in the kernel's backlog), and a
//! connection whose request header has not fully arrived within the header timeout (also an
//! idle keep-alive connection) is closed. So half-sent or silent connections cannot pile up and
//! hold the daemon's descriptors.
//!
//! Each connection's requests carry its caller when the transport names one (the socket
//! peer's uid); TCP callers are named later, by their token.
//!
//! On stop it accepts no more, asks every connection to finish the request in progress and
//! close, and returns when they have.

use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::identity::Peer;

/// Connections served at once per listener.
pub(crate) const MAX_CONNECTIONS: usize = 512;

/// Serves `app` on `listener` until `stop` turns true.
pub(crate) async fn serve<L>(
    mut listener: L,
    app: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) where
    L: Listener,
    L::Io: Peer,
{
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let app = match io.caller() {
            Some(caller) => app.clone().layer(Extension(caller)),
            None => app.clone(),
        };
        let service = TowerToHyperService::new(app);
        let mut stop = stop.clone();
        connections.spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stop.wait_for(|stop| *stop) => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}
