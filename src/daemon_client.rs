//! Talking to the node daemon over its unix socket or TCP port, for `warm` and `lease`.
//!
//! A missing socket or a refused connection is asked again with back-off for the caller's
//! `--daemon-wait` (the socket is gone while the daemon restarts), and only then counts as no
//! daemon; a missing socket directory counts at once (no daemon is installed on the node).
//! Every call has a deadline, so a daemon that accepts and never answers cannot hang a pod. A
//! permission error means a daemon is there but this process may not use it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::cli::DaemonConnection;
use crate::console::Level;
use crate::daemon::protocol::ErrorBody;
use crate::engine::retry::Backoff;
use crate::error::UsageError;

/// The longest one call may take, whatever the caller's deadline leaves.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Pauses before asking an absent daemon again.
const RECONNECT: Backoff = Backoff {
    first: Duration::from_millis(250),
    cap: Duration::from_secs(5),
};
/// Where the daemon listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

impl Endpoint {
    pub(crate) fn parse(url: &str) -> Result<Self, UsageError> {
        if let Some(path) = url.strip_prefix("unix://") {
            if path.starts_with('/') {
                return Ok(Self::Unix(PathBuf::from(path)));
            }
        } else if let Some(authority) = url.strip_prefix("http://") {
            let authority = authority.trim_end_matches('/');
            if !authority.is_empty() && !authority.contains('/') {
                return Ok(Self::Tcp(authority.to_string()));
            }
        }
        Err(UsageError::new(format!(
            "--daemon {url:?} must be unix:///PATH/TO/SOCKET or http://HOST:PORT"
        )))
    }
}

/// Why a call did not get an answer.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Nothing listens there, even after `--daemon-wait`: the fallback may run.
    Unreachable(String),
    /// A daemon is there but refuses this process (permissions).
    Denied(String),
    Broken(String),
}

pub(crate) struct Client {
    endpoint: Endpoint,
    token: Option<String>,
    /// How long an absent daemon is asked again.
    daemon_wait: Duration,
    /// `--timeout`: no call runs past it.
    deadline: Option<Instant>,
    /// The subcommand, for its messages.
    command: &'static str,
}

impl Client {
    /// A client for `--daemon`, `--token-file` and `--daemon-wait`, whose calls end by
    /// `deadline`.
    pub(crate) fn new(
        connection: &DaemonConnection,
        command: &'static str,
        deadline: Option<Instant>,
    ) -> Result<Self, UsageError> {
        let token = match &connection.token_file {
            Some(file) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| UsageError::new(format!("--token-file {}: {e}", file.display())))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        Ok(Self {
            endpoint: Endpoint::parse(&connection.daemon)?,
            token,
            daemon_wait: Duration::from_secs(connection.daemon_wait),
            deadline,
            command,
        })
    }

    /// A client of the daemon at `address` (`IP:PORT`) as the bearer of `token`, for a
    /// controller that asks many daemons: an absent daemon is not waited for, and every call
    /// ends by `deadline`.
    pub(crate) fn tcp(
        address: String,
        token: String,
        deadline: Instant,
        command: &'static str,
    ) -> Self {
        Self {
            endpoint: Endpoint::Tcp(address),
            token: Some(token),
            daemon_wait: Duration::ZERO,
            deadline: Some(deadline),
            command,
        }
    }

    /// One request, asked again while the daemon is absent (for `daemon_wait`), each attempt
    /// bounded in time.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), CallError> {
        let mut absent_since: Option<Instant> = None;
        let mut retries = 0;
        loop {
            let limit = self.deadline.map_or(CALL_TIMEOUT, |deadline| {
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(CALL_TIMEOUT)
            });
            let attempt = self.call_once(method.clone(), path, body.clone());
            let why = match tokio::time::timeout(limit, attempt).await {
                Ok(Err(CallError::Unreachable(why))) => why,
                Ok(answer) => return answer,
                Err(_) => {
                    return Err(CallError::Broken(format!(
                        "no answer within {:.0} s",
                        limit.as_secs_f64()
                    )))
                }
            };
            if let Some(dir) = self.not_installed() {
                let dir = dir.display();
                return Err(CallError::Unreachable(format!(
                    "{why}; {dir} does not exist: no daemon is installed on this node"
                )));
            }
            let waited = absent_since.get_or_insert_with(Instant::now).elapsed();
            let pause = RECONNECT.ceiling(retries);
            let past_deadline = self.deadline.is_some_and(|d| Instant::now() + pause >= d);
            if waited >= self.daemon_wait || past_deadline {
                return Err(CallError::Unreachable(why));
            }
            if retries == 0 {
                crate::note!(
                    Level::Warn,
                    "{}: no daemon answers yet ({why}); asking again for up to {} s",
                    self.command,
                    self.daemon_wait.as_secs()
                );
            }
            tokio::time::sleep(pause.min(self.daemon_wait - waited)).await;
            retries += 1;
        }
    }

    /// The socket's directory, when it does not exist: the daemon that creates it is not
    /// installed on this node (a restarting daemon leaves its directory), so waiting is futile.
    fn not_installed(&self) -> Option<&std::path::Path> {
        match &self.endpoint {
            Endpoint::Unix(socket) => socket.parent().filter(|dir| !dir.exists()),
            Endpoint::Tcp(_) => None,
        }
    }

    async fn call_once(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), CallError> {
        let broken = |e: &dyn std::fmt::Display| CallError::Broken(e.to_string());
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "hydrator");
        if let Some(token) = &self.token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| broken(&e))?;
        let unreachable = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::PermissionDenied => CallError::Denied(e.to_string()),
            _ => CallError::Unreachable(e.to_string()),
        };
        let response = match &self.endpoint {
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(unreachable)?;
                send(TokioIo::new(stream), request).await
            }
            Endpoint::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(unreachable)?;
                send(TokioIo::new(stream), request).await
            }
        }
        .map_err(|e| broken(&e))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| broken(&e))?
            .to_bytes();
        Ok((status, body))
    }
}

async fn send<T>(
    io: TokioIo<T>,
    request: Request<Full<Bytes>>,
) -> hyper::Result<hyper::Response<hyper::body::Incoming>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(connection);
    sender.send_request(request).await
}

/// The daemon's error message in a non-success answer.
pub(crate) fn explain(status: StatusCode, body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(error) => format!("{} ({status})", error.error),
        Err(_) => format!("{status}: {}", String::from_utf8_lossy(body).trim()),
    }
}

/// Escapes everything but unreserved characters, for a path segment.
pub(crate) fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_urls() {
        assert_eq!(
            Endpoint::parse("unix:///run/hydrator/hydrator.sock").unwrap(),
            Endpoint::Unix("/run/hydrator/hydrator.sock".into())
        );
        assert_eq!(
            Endpoint::parse("http://10.0.0.1:7070/").unwrap(),
            Endpoint::Tcp("10.0.0.1:7070".into())
        );
        for bad in [
            "unix://relative.sock",
            "https://x:1",
            "http://",
            "/run/x.sock",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn holder_ids_are_escaped() {
        assert_eq!(percent_encode("pod-1_a.b~"), "pod-1_a.b~");
        assert_eq!(percent_encode("a/b c"), "a%2Fb%20c");
    }
}
