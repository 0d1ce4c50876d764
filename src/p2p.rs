//! Large objects of a sealed dataset through the node's Dragonfly peer (`dfdaemon`) instead of
//! the object store, so the store serves each byte about once per cluster rather than once per
//! node. hydrator keeps what makes a dataset right (the frozen listing, the manifest, leases and
//! the BLAKE3 of every byte) and hands the bulk bytes to the engine built for moving them.
//!
//! Why only sealed datasets: a file from peers is trusted by nothing but its hash, so the seal's
//! BLAKE3 is checked before it counts; one that differs is discarded and fetched from the store
//! (`engine::peers`). A scheduler outage, a bad peer, a torn piece or an object replaced in the
//! store can delay a file, never publish a wrong one.
//!
//! Why presigned URLs: the peer that the scheduler sends to the store fetches the object itself,
//! and the request travels through the scheduler. A presigned GET carries no secret, expires,
//! and is pinned to the listed version by its signed `If-Match` (and `versionId`); all nodes
//! name the same task because the signature's query parameters are left out of the task id.

pub(crate) mod dfdaemon;

use std::path::Path;

use futures::future::BoxFuture;

use crate::source::fetch::PinnedObject;

/// Dragonfly's gRPC messages and the dfdaemon's download client, generated from the vendored
/// `common.proto` and `dfdaemon.proto` (dragonflyoss/api, Apache-2.0) by `src/build.rs`.
/// Vendored rather than the `dragonfly-api` crate: that crate's build runs `protoc`, which a
/// fresh machine lacks, and brings serde and prost-wkt-types for all of Dragonfly's API.
#[allow(clippy::all, clippy::pedantic, missing_docs, dead_code)]
pub(crate) mod proto {
    pub mod common {
        pub mod v2 {
            tonic::include_proto!("common.v2");
        }
    }
    pub mod dfdaemon {
        pub mod v2 {
            tonic::include_proto!("dfdaemon.v2");
        }
    }
}

/// Where the engine gets an object's bytes from peers.
pub(crate) trait Peers: Send + Sync + 'static {
    /// Objects smaller than this go to the store directly.
    fn min_size(&self) -> u64;

    /// Downloads `object` into `output`, a path that does not exist yet, on DEST's filesystem.
    /// Only a regular file there is taken, and never itself: its bytes are reflinked or copied
    /// into a file of hydrator's own. The future is dropped when the run stops.
    fn download<'a>(
        &'a self,
        object: &'a PinnedObject,
        output: &'a Path,
    ) -> BoxFuture<'a, Result<(), PeerError>>;
}

/// Why an object did not come from peers; it is then fetched from the store.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerError {
    #[error("the dfdaemon failed the download: {0}")]
    Failed(String),
    #[error("the dfdaemon's answer ended before the download finished")]
    Unfinished,
    #[error("the download could not be presigned: {0}")]
    Presign(String),
    #[error("the peers delivered {found}, not a regular file")]
    NotRegular { found: &'static str },
    #[error("the peers delivered {got} bytes of {size}")]
    WrongSize { got: u64, size: u64 },
    #[error("the peers delivered bytes whose BLAKE3 is {got}, not the sealed {sealed}")]
    NotAsSealed { sealed: String, got: String },
    #[error("the run stopped while the peers' file was being taken")]
    Abandoned,
    #[error("handling what the peers delivered: {0}")]
    Local(#[from] std::io::Error),
}
