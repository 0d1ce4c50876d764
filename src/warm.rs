//! `hydrator warm NAME --daemon URL`: the init container's client of the node daemon. It asks
//! for the dataset, shows progress while it hydrates, takes a lease for the pod, prints the
//! ready directory on stdout and exits 0 only when the dataset is ready. When no daemon answers
//! and `--fallback SOURCE DEST` is given, it runs a direct sync instead and prints DEST.
//!
//! It rides through a daemon rollout: a missing socket or a refused connection is asked again
//! with back-off for `--daemon-wait` (the socket is gone while the daemon restarts), and only
//! then counts as no daemon. Every call has a deadline, so a daemon that accepts and never
//! answers cannot hang a pod. A permission error means a daemon is there but this pod may not
//! use it: that is an error (exit 2), never a reason to download on its own.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::cli::WarmArgs;
use crate::config::SyncConfig;
use crate::daemon::protocol::{DatasetStatus, ErrorBody, Lease, LeaseRequest, State};
use crate::engine::retry::Backoff;
use crate::error::{Exit, IoContext, LeaseRefusal, SyncError, UsageError, WarmError};
use crate::fs;
use crate::source::url::S3Url;
use crate::units::human_bytes;

const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The longest one call may take, whatever `--timeout` leaves.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Pauses before asking an absent daemon again.
const RECONNECT: Backoff = Backoff {
    first: Duration::from_millis(250),
    cap: Duration::from_secs(5),
};
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
/// Times a lease is retried when its snapshot was replaced between ready and lease.
const LEASE_ATTEMPTS: u32 = 3;

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
enum CallError {
    /// Nothing listens there, even after `--daemon-wait`: the fallback may run.
    Unreachable(String),
    /// A daemon is there but refuses this process (permissions).
    Denied(String),
    Broken(String),
}

struct Client {
    endpoint: Endpoint,
    token: Option<String>,
    /// How long an absent daemon is asked again.
    daemon_wait: Duration,
    /// `--timeout`: no call runs past it.
    deadline: Option<Instant>,
}

impl Client {
    /// One request, asked again while the daemon is absent (for `daemon_wait`), each attempt
    /// bounded in time.
    async fn call(
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
            let waited = absent_since.get_or_insert_with(Instant::now).elapsed();
            let pause = RECONNECT.ceiling(retries);
            let past_deadline = self.deadline.is_some_and(|d| Instant::now() + pause >= d);
            if waited >= self.daemon_wait || past_deadline {
                return Err(CallError::Unreachable(why));
            }
            if retries == 0 {
                eprintln!(
                    "hydrator: warm: no daemon answers yet ({why}); asking again for up to {} s",
                    self.daemon_wait.as_secs()
                );
            }
            tokio::time::sleep(pause.min(self.daemon_wait - waited)).await;
            retries += 1;
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
fn explain(status: StatusCode, body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(error) => format!("{} ({status})", error.error),
        Err(_) => format!("{status}: {}", String::from_utf8_lossy(body).trim()),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SyncError> {
    serde_json::from_slice(body).map_err(|e| WarmError::Answer(e).into())
}

pub(crate) async fn run(args: WarmArgs) -> Result<Exit, SyncError> {
    let endpoint = Endpoint::parse(&args.daemon)?;
    let token = match &args.token_file {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| UsageError::new(format!("--token-file {}: {e}", file.display())))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let fallback = fallback_config(&args)?;
    let client = Client {
        endpoint,
        token,
        daemon_wait: Duration::from_secs(args.daemon_wait),
        deadline: args
            .timeout
            .map(|seconds| Instant::now() + Duration::from_secs(seconds)),
    };
    match warm(&client, &args).await {
        Err(CallError::Unreachable(why)) => match fallback {
            Some(config) => {
                eprintln!(
                    "hydrator: warm: no daemon at {} ({why}); syncing {} into {} directly",
                    args.daemon,
                    config.source,
                    config.dest.display()
                );
                let dest = config.dest.clone();
                let outcome = crate::engine::run(config).await?;
                let exit = outcome.print();
                if exit == Exit::Success {
                    announce(&dest.display().to_string(), args.path_file.as_deref())?;
                }
                Ok(exit)
            }
            None => Err(WarmError::NoDaemon {
                daemon: args.daemon.clone(),
                why,
            }
            .into()),
        },
        Err(CallError::Broken(why)) => Err(WarmError::Broken {
            daemon: args.daemon.clone(),
            why,
        }
        .into()),
        Err(CallError::Denied(why)) => Err(WarmError::Denied {
            daemon: args.daemon.clone(),
            why,
        }
        .into()),
        Ok(result) => result,
    }
}

fn fallback_config(args: &WarmArgs) -> Result<Option<SyncConfig>, UsageError> {
    let [source, dest] = args.fallback.as_slice() else {
        return Ok(None);
    };
    let source = S3Url::parse(source)?;
    let config = args
        .options
        .apply(SyncConfig::builder(source, PathBuf::from(dest)));
    config.build().map(Some)
}

/// Prints the ready directory, and writes it (atomically) into `path_file` if given.
fn announce(path: &str, path_file: Option<&std::path::Path>) -> Result<(), SyncError> {
    println!("{path}");
    let Some(file) = path_file else {
        return Ok(());
    };
    fs::write_atomic_path(file, |out| out.write_all(format!("{path}\n").as_bytes()))
        .local("--path-file: writing", file)
        .map_err(Into::into)
}

/// Asks, waits, leases, prints. `Err` only when the daemon could not be talked to.
async fn warm(client: &Client, args: &WarmArgs) -> Result<Result<Exit, SyncError>, CallError> {
    let name = &args.name;
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        let (code, body) = client
            .call(Method::POST, &format!("/v1/datasets/{name}/warm"), None)
            .await?;
        let status = match code {
            StatusCode::OK | StatusCode::ACCEPTED | StatusCode::INTERNAL_SERVER_ERROR => {
                match parse::<DatasetStatus>(&body) {
                    Ok(status) => status,
                    Err(err) => return Ok(Err(err)),
                }
            }
            StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED | StatusCode::BAD_REQUEST => {
                return Ok(Err(UsageError::new(explain(code, &body)).into()))
            }
            _ => return Ok(Err(WarmError::Refused(explain(code, &body)).into())),
        };
        let status = match (status.state, args.wait) {
            (State::Ready | State::Failed, _) => status,
            (_, false) => {
                eprintln!(
                    "hydrator: warm: {name} is {}; --wait waits for it",
                    status.state.label()
                );
                return Ok(Ok(Exit::Failed));
            }
            (_, true) => wait(client, name, args.timeout.map(Duration::from_secs), started).await?,
        };
        match status.state {
            State::Ready => {}
            State::Failed => {
                let reason = status.reason.unwrap_or_default();
                return Ok(Err(WarmError::Failed {
                    name: name.clone(),
                    reason,
                }
                .into()));
            }
            _ => {
                return Ok(Err(WarmError::StillBusy {
                    name: name.clone(),
                    state: status.state.label(),
                }
                .into()))
            }
        }
        let path = status.path.clone().unwrap_or_default();
        if let Some(holder) = &args.lease_holder {
            match lease(client, name, holder, &status, args.lease_ttl).await? {
                Ok(lease) => eprintln!(
                    "hydrator: warm: {holder} leases {name} snapshot {} until unix time {}",
                    lease.snapshot, lease.expires_at
                ),
                Err(why) if attempts + 1 < LEASE_ATTEMPTS => {
                    attempts += 1;
                    eprintln!("hydrator: warm: lease refused ({why}); asking again");
                    continue;
                }
                Err(why) => return Ok(Err(WarmError::LeaseRefused(why).into())),
            }
        }
        eprintln!(
            "hydrator: warm: {name} ready: {} objects ({}) in {path}",
            status.objects.unwrap_or_default(),
            human_bytes(status.bytes.unwrap_or_default())
        );
        return Ok(announce(&path, args.path_file.as_deref()).map(|()| Exit::Success));
    }
}

/// Polls the dataset's status until it is ready or failed (or `timeout` passes), logging
/// progress.
async fn wait(
    client: &Client,
    name: &str,
    timeout: Option<Duration>,
    started: Instant,
) -> Result<DatasetStatus, CallError> {
    let mut last_log: Option<Instant> = None;
    loop {
        let (code, body) = client
            .call(Method::GET, &format!("/v1/datasets/{name}"), None)
            .await?;
        if code != StatusCode::OK {
            return Err(CallError::Broken(explain(code, &body)));
        }
        let status: DatasetStatus =
            serde_json::from_slice(&body).map_err(|e| CallError::Broken(e.to_string()))?;
        let timed_out = timeout.is_some_and(|t| started.elapsed() >= t);
        if matches!(status.state, State::Ready | State::Failed) || timed_out {
            return Ok(status);
        }
        if let Some(progress) = &status.progress {
            if last_log.is_none_or(|at| at.elapsed() >= PROGRESS_INTERVAL) {
                eprintln!(
                    "hydrator: warm: {name} {}: {}/{} objects, {} of {}",
                    progress.phase,
                    progress.objects_done,
                    progress.objects_total,
                    human_bytes(progress.bytes_done),
                    human_bytes(progress.bytes_total)
                );
                last_log = Some(Instant::now());
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Leases the snapshot `status` names; `Ok(Err)` when the daemon refuses.
async fn lease(
    client: &Client,
    name: &str,
    holder: &str,
    status: &DatasetStatus,
    ttl: Option<u64>,
) -> Result<Result<Lease, LeaseRefusal>, CallError> {
    let request = LeaseRequest {
        ttl_seconds: ttl,
        snapshot: status.snapshot.clone(),
    };
    let body = serde_json::to_vec(&request).expect("a lease request serialises");
    let holder_path = percent_encode(holder);
    let (code, answer) = client
        .call(
            Method::PUT,
            &format!("/v1/datasets/{name}/leases/{holder_path}"),
            Some(body),
        )
        .await?;
    if code != StatusCode::OK {
        return Ok(Err(LeaseRefusal::Refused(explain(code, &answer))));
    }
    Ok(serde_json::from_slice(&answer).map_err(LeaseRefusal::from))
}

/// Escapes everything but unreserved characters, for a path segment.
fn percent_encode(text: &str) -> String {
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
