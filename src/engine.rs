//! The sync engine: listing, planning, fetching, hashing and writing overlap.
//!
//! The listing streams into a bounded queue; each listed object becomes a task (at most
//! `4 × concurrency` at once, each holding one open file); each part of an object becomes a
//! task that waits for one of `concurrency` request slots, sends a ranged GET pinned to the
//! listing's ETag, and streams the body into pooled buffers while BLAKE3 hashes it. Buffers go
//! to the writer threads; when every part is written the part hashes are merged, the file is
//! handed to the batch committer, and only after its batch is durable does it count as done.
//!
//! The engine reads the object store through `source::object_source::ObjectSource` (the S3
//! client, or an in-memory store with scripted faults in `tests.rs`); a run goes through three
//! stages in `run.rs`: prepare, mirror, finish.
//!
//! Memory for data in flight is the buffer pool, `(2 × (concurrency + 2) + 4) × 1 MiB` (with
//! `auto`, the machine's ceiling in `ceiling.rs`; the 2 are the slots kept for the files a lazy
//! view's readers wait for, `priority.rs`), whatever the part size, object sizes or number of
//! objects.

pub(crate) mod adaptive;
mod ahead;
mod ceiling;
mod checkpoint;
mod context;
mod dry_run;
mod etag_md5;
mod failures;
mod limits;
mod measure;
mod object;
mod part;
mod peers;
mod priority;
pub(crate) mod progress;
pub(crate) mod rate;
pub(crate) mod retry;
mod run;
pub(crate) mod schedule;
pub(crate) mod stats;
pub(crate) mod streams;
#[cfg(test)]
mod tests;

pub(crate) use run::{Budget, Hooks, Listing, Outcome};

use crate::config::SyncConfig;
use crate::error::SyncError;

/// Runs a sync. `Err` only for problems found before any work starts.
pub(crate) async fn run(cfg: SyncConfig) -> Result<Outcome, SyncError> {
    run_with(cfg, Hooks::default()).await
}

/// Runs a sync embedded as `hooks` say; with `--dry-run`, only says what it would do.
pub(crate) async fn run_with(cfg: SyncConfig, mut hooks: Hooks) -> Result<Outcome, SyncError> {
    let stop = hooks.stop.take();
    match cfg.dry_run {
        true => dry_run::run(&cfg, hooks, stop).await,
        false => run::run_with(cfg, hooks, stop).await,
    }
}
