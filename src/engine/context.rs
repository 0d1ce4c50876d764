//! What the object and part tasks of a run share, split by side: fetching (the object store,
//! request slots, buffers, counters) and writing (DEST, writer threads, the committer, the
//! manifest and its checkpoints).

use std::sync::Arc;

use super::adaptive::RequestSlots;
use super::checkpoint::Checkpoints;
use super::schedule::Schedule;
use super::stats::Stats;
use crate::manifest::Manifest;
use crate::source::object_source::ObjectSource;
use crate::write::buffer::BufferPool;
use crate::write::commit::Committer;
use crate::write::dest::{Dest, DirectWrites};
use crate::write::Writers;

pub(super) struct Ctx {
    pub fetch: FetchCtx,
    pub write: WriteCtx,
}

pub(super) struct FetchCtx {
    pub source: Arc<dyn ObjectSource>,
    pub bucket: String,
    pub part_size: u64,
    pub request_slots: Arc<RequestSlots>,
    pub pool: BufferPool,
    pub rates: Arc<super::rate::Rates>,
    pub stats: Arc<Stats>,
    /// Versions are pinned by a snapshot: a changed object is an error, not a restart.
    pub pinned: bool,
    /// Check single-PUT objects against their ETag's MD5 (`--check-md5`).
    pub check_md5: bool,
    /// The node's peers (`engine::peers`), tried first for large sealed objects.
    pub peers: Option<Arc<dyn crate::p2p::Peers>>,
}

pub(super) struct WriteCtx {
    pub dest: Arc<Dest>,
    pub direct: DirectWrites,
    pub writers: Writers,
    pub committer: Committer,
    pub manifest: Arc<Manifest>,
    pub checkpoints: Arc<Checkpoints>,
    /// Partial files downloads hold allocated, given back when a full disk stops the run.
    pub partials: Arc<crate::write::partials::Partials>,
    /// A lazy view's schedule: a file a reader waits for is published on its own, at once.
    pub schedule: Option<Arc<Schedule>>,
}
