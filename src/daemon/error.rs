//! Why a hydration, a reservation of cache space or a catalog name failed. The cause is kept;
//! the text is rendered once, as the dataset's `reason`, in the log or in the catalog's problems.

use std::io;

use super::space::Budget;
use crate::error::{EmptySelection, LocalError, SyncError};
use crate::units::human_bytes;

/// Why a hydration ended without a ready snapshot.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HydrationError {
    #[error("the daemon is stopping")]
    Stopping,
    /// Listing the source, or a sync that was refused or cut short.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// Creating the snapshot directory or linking the previous snapshot's files.
    #[error(transparent)]
    Prepare(#[from] LocalError),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Space(#[from] SpaceError),
    #[error("{failed} objects failed; first: {key}: {reason}")]
    ObjectsFailed {
        failed: u64,
        key: String,
        reason: String,
    },
    /// Nothing selected, and the catalog does not allow an empty dataset.
    #[error("nothing to mirror: {} (allow_empty = true in the dataset's catalog entry accepts an empty dataset)", .0.why)]
    EmptySelection(EmptySelection),
    #[error("the hydration did not complete")]
    Incomplete,
    #[error("the hydration task panicked: {0}")]
    Panicked(String),
}

impl HydrationError {
    /// The dataset needs more than the cache's whole quota: no eviction makes room for it.
    pub(crate) fn beyond_quota(&self) -> bool {
        matches!(self, HydrationError::Space(SpaceError::NotEnough { need, budget, .. })
            if *need > budget.quota)
    }
}

/// Why the cache cannot make room.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpaceError {
    #[error("measuring the cache: {0}")]
    MeasureCache(#[source] io::Error),
    #[error(
        "not enough space: {} of new data needed; quota {}, cache uses {}, {} reserved by \
         running hydrations, {} free on disk with a floor of {}; evicting every unleased \
         snapshot would free {}, {} short",
        human_bytes(*.need),
        human_bytes(.budget.quota),
        human_bytes(.budget.used),
        human_bytes(.budget.reserved),
        human_bytes(.budget.free),
        human_bytes(.budget.free_space_floor),
        human_bytes(*.evictable),
        human_bytes(.deficit - .evictable)
    )]
    NotEnough {
        need: u64,
        budget: Budget,
        deficit: u64,
        evictable: u64,
    },
    #[error("evicting {dataset}/{digest}: {source}")]
    Evict {
        dataset: String,
        digest: String,
        #[source]
        source: io::Error,
    },
}

/// A catalog dataset name that cannot be a directory name and an API path segment.
#[derive(Debug, thiserror::Error)]
#[error("names are 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit")]
pub(crate) struct InvalidName;
