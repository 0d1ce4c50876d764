//! The controller's calls to the node daemons' API (`IP:7070`, bearer token): what each
//! holds, and a warm-up started on behalf of a workload's pods.
//!
//! Every call ends within [`CALL_LIMIT`]: a node whose daemon stalls slows no other node, and
//! counts as unreachable for that round.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};

use crate::daemon::protocol::{DatasetStatus, PodIdentity, WarmRequest};
use crate::daemon_client::{explain, percent_encode, CallError, Client};

const CALL_LIMIT: Duration = Duration::from_secs(5);

/// What one node's daemon said this round.
#[derive(Clone, Debug)]
pub(crate) enum Holding {
    Unreachable(String),
    /// Every catalog dataset's status, by name.
    Serving(BTreeMap<String, DatasetStatus>),
}

impl Holding {
    /// The datasets' statuses, when the daemon answered.
    pub(crate) fn serving(&self) -> Option<&BTreeMap<String, DatasetStatus>> {
        match self {
            Holding::Serving(datasets) => Some(datasets),
            Holding::Unreachable(_) => None,
        }
    }
}

/// Why a daemon gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DaemonError {
    #[error("the daemon at {address} does not answer: {why}")]
    Unreachable { address: String, why: String },
    #[error("the daemon at {address} answered {answer}")]
    Refused { address: String, answer: String },
    #[error("the daemon at {address} answered what is not a dataset status: {source}")]
    Malformed {
        address: String,
        #[source]
        source: serde_json::Error,
    },
}

/// What a warm request came to.
#[derive(Debug)]
pub(crate) enum Warmed {
    /// Ready, hydrating or failed: the dataset's status.
    Status(Box<DatasetStatus>),
    /// The daemon will not warm it for these pods (unknown dataset, access rules): the
    /// reason, final for this workload.
    Refused(String),
}

#[derive(Clone)]
pub(crate) struct Daemons {
    token: String,
}

impl Daemons {
    pub(crate) fn new(token: String) -> Self {
        Daemons { token }
    }

    fn client(&self, address: &str) -> Client {
        let deadline = Instant::now() + CALL_LIMIT;
        Client::tcp(address.into(), self.token.clone(), deadline, "admission")
    }

    /// Every catalog dataset's status on the daemon at `address`.
    pub(crate) async fn datasets(&self, address: &str) -> Result<Vec<DatasetStatus>, DaemonError> {
        let answer = self
            .client(address)
            .call(Method::GET, "/v1/datasets", None)
            .await;
        let body = match answer {
            Ok((StatusCode::OK, body)) => body,
            Ok((code, body)) => return Err(refused(address, code, &body)),
            Err(e) => return Err(unreachable(address, e)),
        };
        serde_json::from_slice(&body).map_err(|source| DaemonError::Malformed {
            address: address.into(),
            source,
        })
    }

    /// Asks the daemon at `address` to hydrate `dataset` for pods of `pod` (its access rules
    /// apply); answered at once with where it stands.
    pub(crate) async fn warm(
        &self,
        address: &str,
        dataset: &str,
        pod: PodIdentity,
    ) -> Result<Warmed, DaemonError> {
        let request = WarmRequest {
            wait: false,
            pod: Some(pod),
        };
        let body = serde_json::to_vec(&request).expect("a warm request serializes");
        let path = format!("/v1/datasets/{}/warm", percent_encode(dataset));
        let answer = self
            .client(address)
            .call(Method::POST, &path, Some(body))
            .await;
        let (code, body) = answer.map_err(|e| unreachable(address, e))?;
        match code {
            StatusCode::OK | StatusCode::ACCEPTED | StatusCode::INTERNAL_SERVER_ERROR => {
                match serde_json::from_slice::<DatasetStatus>(&body) {
                    Ok(status) => Ok(Warmed::Status(Box::new(status))),
                    Err(_) => Err(refused(address, code, &body)),
                }
            }
            StatusCode::NOT_FOUND | StatusCode::FORBIDDEN => {
                Ok(Warmed::Refused(explain(code, &body)))
            }
            _ => Err(refused(address, code, &body)),
        }
    }
}

fn refused(address: &str, code: StatusCode, body: &[u8]) -> DaemonError {
    DaemonError::Refused {
        address: address.into(),
        answer: explain(code, body),
    }
}

fn unreachable(address: &str, error: CallError) -> DaemonError {
    let why = match error {
        CallError::Unreachable(why) | CallError::Denied(why) | CallError::Broken(why) => why,
    };
    DaemonError::Unreachable {
        address: address.into(),
        why,
    }
}
