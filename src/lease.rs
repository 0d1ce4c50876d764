//! `hydrator lease NAME --holder ID`: holds a lease on a dataset's snapshot for as long as the
//! process runs, as a pod's sidecar. It renews the lease every third of its TTL and releases it
//! on SIGTERM or SIGINT, so the snapshot is pinned while the trainer runs and freed when the
//! pod ends; a pod that dies without a word pins it for one TTL at most.
//!
//! A sidecar rather than the daemon watching pods: the daemon then needs no Kubernetes API
//! access, and the lease ends exactly when the kubelet stops the pod's containers (a native
//! sidecar is stopped after the main container). The lease is the one `warm --lease-holder`
//! took, on the snapshot the pod reads: a renewal keeps its snapshot, and `--path-file` names
//! it for a lease taken afresh.

use std::path::Path;
use std::time::Duration;

use hyper::{Method, StatusCode};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::LeaseArgs;
use crate::console::Level;
use crate::daemon::protocol::{Lease, LeaseRequest, UNTIL_RELEASED};
use crate::daemon_client::{explain, percent_encode, CallError, Client};
use crate::error::{Exit, LeaseError, SyncError, UsageError};

/// The shortest pause between renewals.
const MIN_RENEWAL: Duration = Duration::from_secs(1);

pub(crate) async fn run(args: LeaseArgs) -> Result<Exit, SyncError> {
    if args.ttl == 0 {
        return Err(UsageError::new("--ttl must be at least 1 second").into());
    }
    let snapshot = match &args.path_file {
        Some(file) => Some(snapshot_of(file)?),
        None => None,
    };
    let client = Client::new(&args.connection, "lease", None)?;
    let path = format!(
        "/v1/datasets/{}/leases/{}",
        percent_encode(&args.name),
        percent_encode(&args.holder)
    );
    let request = serde_json::to_vec(&LeaseRequest {
        ttl_seconds: Some(args.ttl),
        snapshot,
        until_released: false,
        pod: None,
    })
    .expect("a lease request serialises");
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return Err(UsageError::new("cannot catch SIGTERM and SIGINT").into());
    };
    let mut every = (Duration::from_secs(args.ttl) / 3).max(MIN_RENEWAL);
    let mut held = false;
    loop {
        let pause = match renew(&client, &path, &request, &args).await {
            Ok(lease) => {
                // The daemon may have granted less than asked (its max_lease_ttl_seconds).
                let granted = lease
                    .expires_at
                    .saturating_sub(crate::daemon::registry::now_unix());
                every = (Duration::from_secs(granted) / 3).clamp(MIN_RENEWAL, every);
                if !held {
                    crate::note!(
                        Level::Info,
                        "lease: {} holds {} snapshot {} {}; renewing every {} s",
                        args.holder,
                        args.name,
                        lease.snapshot,
                        expiry(lease.expires_at),
                        every.as_secs()
                    );
                }
                held = true;
                every
            }
            Err(Renewal::Fatal(err)) => return Err(err.into()),
            Err(Renewal::Later(why)) => {
                crate::note!(Level::Warn, "lease: renewing failed ({why}); trying again");
                (every / 4).max(MIN_RENEWAL)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    release(&client, &path, &args).await?;
    Ok(Exit::Success)
}

/// When a lease ends, for a person: `until 2026-12-01T09:30:00Z` (UTC), or `until released`.
pub(crate) fn expiry(expires_at: u64) -> String {
    match expires_at {
        UNTIL_RELEASED => "until released".to_string(),
        at => format!("until {}", crate::units::rfc3339_from_unix(at)),
    }
}

/// How a renewal failed.
enum Renewal {
    /// The daemon refused: renewing again cannot help.
    Fatal(LeaseError),
    /// The daemon could not be reached or answered badly: the lease still runs until it
    /// expires, so try again.
    Later(String),
}

async fn renew(
    client: &Client,
    path: &str,
    request: &[u8],
    args: &LeaseArgs,
) -> Result<Lease, Renewal> {
    let answer = client.call(Method::PUT, path, Some(request.to_vec())).await;
    match answer {
        Ok((StatusCode::OK, body)) => {
            serde_json::from_slice(&body).map_err(|e| Renewal::Later(e.to_string()))
        }
        // The dataset's lease cap may free up; any other refusal stays.
        Ok((code, body)) if code.is_client_error() && code != StatusCode::TOO_MANY_REQUESTS => {
            Err(Renewal::Fatal(LeaseError::Refused(explain(code, &body))))
        }
        Ok((code, body)) => Err(Renewal::Later(explain(code, &body))),
        Err(CallError::Denied(why)) => Err(Renewal::Fatal(LeaseError::Denied {
            daemon: args.connection.daemon.clone(),
            why,
        })),
        Err(CallError::Unreachable(why) | CallError::Broken(why)) => Err(Renewal::Later(why)),
    }
}

/// Releases the lease; one already gone (expired, released by an admin) is fine.
async fn release(client: &Client, path: &str, args: &LeaseArgs) -> Result<(), LeaseError> {
    match client.call(Method::DELETE, path, None).await {
        Ok((StatusCode::NO_CONTENT | StatusCode::NOT_FOUND, _)) => {
            crate::note!(Level::Info, "lease: {} released {}", args.holder, args.name);
            Ok(())
        }
        Ok((code, body)) => Err(LeaseError::NotReleased(explain(code, &body))),
        Err(CallError::Denied(why) | CallError::Unreachable(why) | CallError::Broken(why)) => {
            Err(LeaseError::NotReleased(why))
        }
    }
}

/// The snapshot digest of the ready directory written in `file` (`ROOT/NAME/DIGEST`).
fn snapshot_of(file: &Path) -> Result<String, UsageError> {
    let bad = |why: String| UsageError::new(format!("--path-file {}: {why}", file.display()));
    let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
    let dir = Path::new(text.trim());
    dir.file_name()
        .and_then(|name| name.to_str())
        .filter(|name| crate::snapshot::is_digest(name))
        .map(str::to_string)
        .ok_or_else(|| {
            bad(format!(
                "{} is not a snapshot directory of the daemon",
                dir.display()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_reads_as_a_date() {
        assert_eq!(expiry(1_764_714_341), "until 2025-12-02T22:25:41Z");
        assert_eq!(expiry(UNTIL_RELEASED), "until released");
    }

    #[test]
    fn the_snapshot_is_the_last_component_of_the_ready_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("path");
        let digest = "ab".repeat(32);
        std::fs::write(&file, format!("/var/cache/hydrator/coco/{digest}\n")).unwrap();
        assert_eq!(snapshot_of(&file).unwrap(), digest);
        std::fs::write(&file, "/data/coco\n").unwrap();
        let err = snapshot_of(&file).unwrap_err().to_string();
        assert!(err.contains("not a snapshot directory"), "{err}");
        assert!(snapshot_of(&dir.path().join("missing")).is_err());
    }
}
