//! hydrator mirrors a dataset (an S3 bucket prefix) onto local disk as fast as the network and
//! the disk allow, and proves every byte arrived intact.
//!
//! Data flow: `source::list` streams the listing page by page → `plan` maps each key to a safe
//! path and skips what DEST already holds → `engine` fetches parts as concurrent ranged GETs
//! pinned to the listing's ETag, hashing each body with BLAKE3 as it is copied into a pooled
//! buffer → `write` hands buffers to writer threads (io_uring or pwrite) and publishes whole
//! files atomically in durable batches → `report` says what happened.

pub(crate) mod admission;
pub(crate) mod bound;
pub mod cli;
pub mod commands;
pub mod config;
pub mod console;
pub mod csi;
pub(crate) mod daemon;
pub(crate) mod daemon_client;
#[cfg(feature = "demo")]
pub mod demo;
pub(crate) mod engine;
pub mod error;
pub(crate) mod fs;
pub mod hash;
pub(crate) mod host;
pub(crate) mod lease;
pub(crate) mod man;
pub(crate) mod manifest;
pub(crate) mod mount;
pub(crate) mod mounts;
pub(crate) mod p2p;
pub(crate) mod plan;
pub(crate) mod report;
pub(crate) mod seal;
pub(crate) mod signals;
pub(crate) mod snapshot;
pub mod source;
pub(crate) mod suggest;
pub(crate) mod units;
pub(crate) mod verify;
pub(crate) mod warm;
pub mod write;
