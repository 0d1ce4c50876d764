//! The API's HTTP server, built for a node where any pod may open a connection, so that no
//! caller can hold it:
//! - at most [`MAX_CONNECTIONS`] of counted callers (a socket peer's uid, root as any other; a
//!   TCP peer's address) are served at once, and at most [`MAX_PER_CALLER`] of one caller: the
//!   next is closed at once. The admins' doors are not counted: loopback TCP (where the CSI
//!   plugin beside the daemon talks, with its admin token) and a socket uid the catalog names
//!   in `admins`. [`RESERVED_CONNECTIONS`] more places are kept for them, so the plugin finds
//!   room however many tenants hold connections (a root container that mounts the socket holds
//!   its uid's share, like any caller); when those are taken too, the rest wait in the kernel's
//!   backlog. A door is told at accept, before any request: a token arrives too late to decide;
//! - a connection whose request header has not fully arrived within the header timeout (also an
//!   idle keep-alive connection) is closed, and so is one whose body does not arrive within it
//!   ([`super::api`]) or that does not read its answers within it ([`DeadlineIo`]): a caller
//!   that pipelines requests and never reads is cut off when its socket buffer is full;
//! - a connection serves at most [`MAX_REQUESTS_PER_CONNECTION`] requests, then closes.
//!
//! Each connection's requests carry its caller when the transport names one (the socket
//! peer's uid); TCP callers are named later, by their token.
//!
//! On stop it accepts no more, asks every connection to finish the request in progress and
//! close, and returns when they have.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::serve::Listener;
use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::identity::Peer;

/// Connections of counted callers served at once per listener.
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// Connections beyond [`MAX_CONNECTIONS`] only the admins' doors (loopback TCP, an admin uid on
/// the socket) may use.
pub(crate) const RESERVED_CONNECTIONS: usize = 32;
/// Connections of one caller served at once per listener.
pub(crate) const MAX_PER_CALLER: usize = 64;
/// Requests one connection may make before it is closed.
pub(crate) const MAX_REQUESTS_PER_CONNECTION: usize = 1000;

/// Whether a socket caller (`uid:N`) is an admin, read at each accept (the catalog reloads).
pub(crate) type IsAdmin = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Serves `app` on `listener` until `stop` turns true.
pub(crate) async fn serve<L>(
    mut listener: L,
    app: Router,
    header_timeout: Duration,
    is_admin: IsAdmin,
    mut stop: watch::Receiver<bool>,
) where
    L: Listener,
    L::Io: Peer,
{
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS + RESERVED_CONNECTIONS));
    let counted = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_caller = PerCaller::default();
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
        let caller = io.counted_as();
        let counted_caller = !(io.is_loopback() || is_admin(&caller));
        // A counted caller takes one of the unreserved places, or is closed at once.
        let unreserved = match counted_caller {
            true => match counted.clone().try_acquire_owned() {
                Ok(place) => Some(place),
                Err(_) => continue,
            },
            false => None,
        };
        let Some(turn) = per_caller.enter(counted_caller.then_some(caller)) else {
            continue; // dropped: closed at once
        };
        let app = match io.caller() {
            Some(caller) => app.clone().layer(Extension(caller)),
            None => app.clone(),
        };
        let served = Arc::new(AtomicUsize::new(0));
        let app = app.layer(axum::middleware::map_response(
            move |mut response: Response| {
                if served.fetch_add(1, Relaxed) + 1 >= MAX_REQUESTS_PER_CONNECTION {
                    let close = HeaderValue::from_static("close");
                    response.headers_mut().insert(header::CONNECTION, close);
                }
                std::future::ready(response)
            },
        ));
        let service = TowerToHyperService::new(app);
        let mut stop = stop.clone();
        connections.spawn(async move {
            let (_slot, _unreserved, _turn) = (slot, unreserved, turn);
            let io = DeadlineIo::new(io, header_timeout);
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

/// Connections in service per caller.
#[derive(Clone, Default)]
struct PerCaller(Arc<Mutex<HashMap<String, usize>>>);

/// One connection's place in its caller's count, given back when dropped.
struct Turn {
    counts: PerCaller,
    caller: Option<String>,
}

impl PerCaller {
    /// A place for a connection of `caller` (`None`: not counted), unless it has its fill.
    fn enter(&self, caller: Option<String>) -> Option<Turn> {
        if let Some(caller) = &caller {
            let mut counts = self.0.lock().expect("per-caller lock");
            let count = counts.entry(caller.clone()).or_default();
            if *count >= MAX_PER_CALLER {
                return None;
            }
            *count += 1;
        }
        Some(Turn {
            counts: self.clone(),
            caller,
        })
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(caller) = &self.caller {
            let mut counts = self.counts.0.lock().expect("per-caller lock");
            if let Some(count) = counts.get_mut(caller) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(caller);
                }
            }
        }
    }
}

/// A connection whose writes fail once they have waited `limit` for the peer to read: an answer
/// nobody reads cannot hold the connection.
pub(crate) struct DeadlineIo<T> {
    inner: T,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> DeadlineIo<T> {
    pub(crate) fn new(inner: T, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a write that could not go on: an error once it has waited too long.
    fn waited(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the peer does not read its answers",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for DeadlineIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for DeadlineIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.waited(cx).map(Err),
            done => {
                self.stalled = None;
                done
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.waited(cx).map(Err),
            done => {
                self.stalled = None;
                done
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
