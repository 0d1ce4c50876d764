//! The bodies the daemon's HTTP API speaks (JSON), shared by the daemon and `hydrator warm`.

use serde::{Deserialize, Serialize};

use crate::engine::streams::Readable;

/// Where a dataset stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum State {
    /// Not on this node.
    Absent,
    Hydrating,
    /// A complete, verified snapshot is on disk at `path`.
    Ready,
    /// The last hydration failed (`reason`); the next warm request tries again.
    Failed,
}

impl State {
    pub(crate) const ALL: [State; 4] =
        [State::Absent, State::Hydrating, State::Ready, State::Failed];

    pub(crate) fn label(self) -> &'static str {
        match self {
            State::Absent => "absent",
            State::Hydrating => "hydrating",
            State::Ready => "ready",
            State::Failed => "failed",
        }
    }
}

/// What a hydration is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// Waiting for a hydration slot.
    #[default]
    Queued,
    Listing,
    /// Linking the unchanged files of the previous snapshot.
    Linking,
    /// Making room in the cache.
    Reserving,
    Downloading,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Queued => "queued",
            Phase::Listing => "listing",
            Phase::Linking => "linking",
            Phase::Reserving => "reserving",
            Phase::Downloading => "downloading",
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Progress {
    pub phase: Phase,
    pub objects_done: u64,
    pub objects_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DatasetStatus {
    pub name: String,
    pub state: State,
    /// Digest of the ready snapshot (`ready`), or of the one being hydrated once listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The ready snapshot's directory: mount or read it, never write to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Why it failed (`failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `ready`, but the last refresh failed: this is the snapshot from before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    /// Why the last refresh failed (`stale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// While `hydrating` a refresh: the ready snapshot held meanwhile, and its directory, which
    /// may be served at once (the CSI plugin does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_path: Option<String>,
    /// When the source was last listed successfully (RFC 3339; after a daemon restart, when
    /// the snapshot held was completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshed_at: Option<String>,
    /// While `hydrating`, once listed: the snapshot's directory as it fills. Only a lazy view
    /// reads it, and only the files the daemon answered as local (`POST .../want`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_path: Option<String>,
    /// The catalog lets pods read the dataset while it hydrates (`start = "lazy"`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
    /// The share of the dataset this node holds (`INDEX/COUNT`), when the catalog gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Large objects come through the node's Dragonfly peers (`p2p = true`): the store
    /// serves about one copy however many nodes hydrate it at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p2p: bool,
    /// `failed` because the dataset needs more than the cache's quota: evicting every other
    /// snapshot would not make room, so asking again cannot help.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub beyond_quota: bool,
}

impl DatasetStatus {
    /// While a refresh hydrates, the snapshot held meanwhile, as a ready status (its figures
    /// unknown): what a client that wants a ready copy is served.
    pub(crate) fn held_as_ready(&self) -> Option<DatasetStatus> {
        let (snapshot, path) = self.held_snapshot.clone().zip(self.held_path.clone())?;
        (self.state == State::Hydrating).then(|| DatasetStatus {
            state: State::Ready,
            snapshot: Some(snapshot),
            path: Some(path),
            progress: None,
            held_snapshot: None,
            held_path: None,
            partial_path: None,
            ..self.clone()
        })
    }
}

/// `POST /v1/datasets/{name}/warm` (the body is optional).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WarmRequest {
    /// Answer only when the hydration has finished (ready or failed).
    #[serde(default)]
    pub wait: bool,
    /// The pod that asks, from the CSI plugin: checked against the dataset's access rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodIdentity>,
}

/// A pod as the kubelet names it to the CSI plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PodIdentity {
    pub namespace: String,
    pub service_account: String,
}

/// `POST /v1/datasets/{name}/want`: a lazy view opens or reads `key` of `snapshot`, which is
/// being hydrated. Answered 200 once the file is local (written, durable, verified), or once
/// the parts holding `range` are written ([`WantAnswer`]), 202 when it is still coming (ask
/// again), 409 when the snapshot is neither hydrating nor ready here, 503 when the daemon stops
/// (ask the next one), 422 when the object cannot be fetched (the reason in the body).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WantRequest {
    pub snapshot: String,
    pub key: String,
    /// The bytes `[start, end)` a read waits for; without it, the whole file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<[u64; 2]>,
}

/// The 200 answer to a [`WantRequest`]: `{}` when the file is local whole, otherwise where
/// the bytes asked for are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WantAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialAnswer>,
}

/// The file downloads into its `.NAME.partial`, whose inode is `inode` and whose byte `runs`
/// (`[start, end)`) are written and checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PartialAnswer {
    pub inode: u64,
    pub runs: Vec<[u64; 2]>,
}

impl From<Readable> for WantAnswer {
    fn from(readable: Readable) -> Self {
        let partial = match readable {
            Readable::Whole => None,
            Readable::Partial { inode, runs } => Some(PartialAnswer {
                inode,
                runs: runs.into_iter().map(|run| [run.start, run.end]).collect(),
            }),
        };
        Self { partial }
    }
}

impl From<WantAnswer> for Readable {
    fn from(answer: WantAnswer) -> Self {
        match answer.partial {
            None => Readable::Whole,
            Some(PartialAnswer { inode, runs }) => Readable::Partial {
                inode,
                runs: runs.into_iter().map(|[start, end]| start..end).collect(),
            },
        }
    }
}

/// `PUT /v1/datasets/{name}/leases/{holder}` (the body is optional).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseRequest {
    /// Default: the catalog's `default_lease_ttl_seconds`.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// The snapshot to pin (default: the dataset's current ready snapshot).
    #[serde(default)]
    pub snapshot: Option<String>,
    /// No expiry: held until released (admin identities only, for the CSI plugin's mounts).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub until_released: bool,
    /// The pod the lease is for (admin identities only: the CSI plugin names the pod of each
    /// volume it mounts), whose share of the dataset's leases it counts against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// A lease's `expires_at` when it is held until released.
pub(crate) const UNTIL_RELEASED: u64 = u64::MAX;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub dataset: String,
    pub holder: String,
    /// The identity that took it (`uid:<n>` or `token:<name>`): only it, or an admin, can
    /// renew or release it. Empty in a state file from before owners: the next renewal adopts it.
    #[serde(default)]
    pub owner: String,
    pub snapshot: String,
    /// Unix seconds; [`UNTIL_RELEASED`] (2^64 - 1) when it is held until released.
    pub expires_at: u64,
    /// The pod an admin took it for: it counts against that pod's share, not the admin's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// Where the snapshot a lease pins stands on this node: what a view of it can serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Condition {
    /// Being hydrated, or waiting for its turn to resume: opens wait for their files.
    Hydrating,
    /// Complete and verified.
    Ready,
    /// Its hydration ended without completing (an object changed upstream, say): the files
    /// that landed are served, the others fail with `reason`.
    Failed { reason: String },
    /// Not on this node: every open of a file not yet local fails.
    Gone,
}

/// A lease in `GET /v1/leases`, with the condition of the snapshot it pins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseStatus {
    #[serde(flatten)]
    pub lease: Lease,
    pub condition: Condition,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_want_without_a_range_asks_for_the_whole_file_and_answers_say_where_bytes_are() {
        let whole: WantRequest = serde_json::from_str(r#"{"snapshot":"s","key":"k"}"#).unwrap();
        assert_eq!(
            whole.range, None,
            "an open by a plugin that asks for whole files"
        );
        let ranged: WantRequest =
            serde_json::from_str(r#"{"snapshot":"s","key":"k","range":[8,16]}"#).unwrap();
        assert_eq!(ranged.range, Some([8, 16]));
        assert_eq!(
            serde_json::to_string(&WantAnswer::from(Readable::Whole)).unwrap(),
            "{}"
        );
        let partial = Readable::Partial {
            inode: 7,
            runs: vec![0..8, 16..24],
        };
        let json = serde_json::to_string(&WantAnswer::from(partial.clone())).unwrap();
        assert_eq!(json, r#"{"partial":{"inode":7,"runs":[[0,8],[16,24]]}}"#);
        let back: WantAnswer = serde_json::from_str(&json).unwrap();
        assert_eq!(Readable::from(back), partial);
    }

    #[test]
    fn a_phase_reads_the_same_in_json_and_in_the_log() {
        use Phase::*;
        for phase in [Queued, Listing, Linking, Reserving, Downloading] {
            assert_eq!(serde_json::to_value(phase).unwrap(), phase.to_string());
        }
        assert_eq!(serde_json::to_value(Downloading).unwrap(), "downloading");
    }
}
