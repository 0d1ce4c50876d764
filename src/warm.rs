//! `hydrator warm NAME --daemon URL`: the init container's client of the node daemon. It asks
//! for the dataset, shows progress while it hydrates, takes a lease for the pod, prints the
//! ready directory on stdout and exits 0 only when the dataset is ready. When no daemon answers
//! and `--fallback SOURCE DEST` is given, it runs a direct sync instead and prints DEST.
//!
//! It rides through a daemon rollout ([`crate::daemon_client`]): a daemon that is restarting is
//! asked again for `--daemon-wait`. A permission error means a daemon is there but this pod may
//! not use it: that is an error (exit 2), never a reason to download on its own.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};

use crate::cli::WarmArgs;
use crate::config::SyncConfig;
use crate::console::Level;
use crate::daemon::protocol::{DatasetStatus, Lease, LeaseRequest, State};
use crate::daemon_client::{explain, percent_encode, CallError, Client};
use crate::error::{Exit, IoContext, LeaseRefusal, SyncError, UsageError, WarmError};
use crate::fs;
use crate::plan::shard::Shard;
use crate::units::human_bytes;

const POLL_INTERVAL: Duration = Duration::from_millis(500);
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
/// Times a lease is retried when its snapshot was replaced between ready and lease.
const LEASE_ATTEMPTS: u32 = 3;

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SyncError> {
    serde_json::from_slice(body).map_err(|e| WarmError::Answer(e).into())
}

pub(crate) async fn run(args: WarmArgs) -> Result<Exit, SyncError> {
    let deadline = args
        .timeout
        .map(|seconds| Instant::now() + Duration::from_secs(seconds));
    let client = Client::new(&args.connection, "warm", deadline)?;
    let fallback = fallback_config(&args)?;
    match warm(&client, &args).await {
        Err(CallError::Unreachable(why)) => match fallback {
            Some(config) => {
                crate::note!(
                    Level::Warn,
                    "warm: no daemon at {} ({why}); syncing {} into {} directly",
                    args.connection.daemon,
                    config.source,
                    config.dest.display()
                );
                let dest = config.dest.clone();
                let outcome = crate::engine::run(config).await?;
                // stdout is the directory alone.
                let exit = outcome.print_on_stderr();
                if exit == Exit::Success {
                    announce(&dest.display().to_string(), args.path_file.as_deref())?;
                }
                Ok(exit)
            }
            None => Err(WarmError::NoDaemon {
                daemon: args.connection.daemon.clone(),
                why,
            }
            .into()),
        },
        Err(CallError::Broken(why)) => Err(WarmError::Broken {
            daemon: args.connection.daemon.clone(),
            why,
        }
        .into()),
        Err(CallError::Denied(why)) => Err(WarmError::Denied {
            daemon: args.connection.daemon.clone(),
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
    let config = args.options.for_source(source, PathBuf::from(dest))?;
    config.build().map(Some)
}

/// A `--shard` the daemon's dataset does not hold: the node's catalog gives it another share.
/// A dataset held whole holds every share.
fn other_shard(name: &str, wanted: Option<Shard>, status: &DatasetStatus) -> Option<UsageError> {
    let (wanted, held) = (wanted?.to_string(), status.shard.as_deref()?);
    (wanted != held).then(|| {
        UsageError::new(format!(
            "warm: the daemon's {name} is shard {held} of the dataset, not --shard {wanted}: \
             the node's catalog and this pod disagree on the share"
        ))
    })
}

/// Prints the ready directory, and writes it (atomically) into `path_file` if given.
fn announce(path: &str, path_file: Option<&std::path::Path>) -> Result<(), SyncError> {
    crate::out!("{path}");
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
            StatusCode::NOT_FOUND
            | StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::BAD_REQUEST => {
                return Ok(Err(UsageError::new(explain(code, &body)).into()))
            }
            _ => return Ok(Err(WarmError::Refused(explain(code, &body)).into())),
        };
        if let Some(refusal) = other_shard(name, args.options.shard, &status) {
            return Ok(Err(refusal.into()));
        }
        let status = match (status.state, args.wait, status.held_as_ready()) {
            (State::Ready | State::Failed, _, _) => status,
            // A refresh runs: the snapshot held meanwhile is ready (`--wait` waits for the new one).
            (_, false, Some(held)) => held,
            (_, false, None) => {
                crate::note!(
                    Level::Error,
                    "warm: {name} is {}; --wait waits for it",
                    status.state.label()
                );
                return Ok(Ok(Exit::Failed));
            }
            (_, true, _) => {
                wait(client, name, args.timeout.map(Duration::from_secs), started).await?
            }
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
                Ok(lease) => crate::note!(
                    Level::Info,
                    "warm: {holder} leases {name} snapshot {} {}",
                    lease.snapshot,
                    crate::lease::expiry(lease.expires_at)
                ),
                Err(why @ LeaseRefusal::Replaced(_)) if attempts + 1 < LEASE_ATTEMPTS => {
                    attempts += 1;
                    crate::note!(Level::Warn, "warm: lease refused ({why}); asking again");
                    continue;
                }
                Err(why) => return Ok(Err(WarmError::LeaseRefused(why).into())),
            }
        }
        match status.objects.zip(status.bytes) {
            Some((objects, bytes)) => crate::note!(
                Level::Info,
                "warm: {name} ready: {objects} objects ({}) in {path}",
                human_bytes(bytes)
            ),
            None => crate::note!(
                Level::Info,
                "warm: {name} ready in {path} (the snapshot held while a refresh runs)"
            ),
        }
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
                crate::note!(
                    Level::Info,
                    "warm: {name} {}: {}/{} objects, {} of {}",
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
        until_released: false,
        pod: None,
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
    match code {
        StatusCode::OK => {}
        StatusCode::CONFLICT => return Ok(Err(LeaseRefusal::Replaced(explain(code, &answer)))),
        _ => return Ok(Err(LeaseRefusal::Refused(explain(code, &answer)))),
    }
    Ok(serde_json::from_slice(&answer).map_err(LeaseRefusal::from))
}
