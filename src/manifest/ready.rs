//! `DEST/.hydrator/READY`: removed before a sync changes anything, written last (with
//! [`fs::write_atomic`]) once every file is published and durable.
//!
//! Contract for the training container: the dataset in DEST is complete and verified exactly
//! when `DEST/.hydrator/READY` exists; its `digest` identifies the dataset's content (BLAKE3
//! over the sorted list of path, size and file hash), so two nodes with the same digest hold
//! the same bytes.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use crate::fs::{self, Dir};

const READY: &str = "READY";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Ready {
    pub version: u32,
    /// BLAKE3 over `path \0 size \0 blake3 \n` for every file, sorted by path.
    pub digest: String,
    pub objects: u64,
    pub bytes: u64,
    pub source: String,
    /// Digest of the snapshot file this dataset was hydrated from, if any.
    pub snapshot: Option<String>,
    /// The `--include` / `--exclude` globs that selected the dataset.
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// The `--shard` (INDEX/COUNT) the dataset is a share of, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    pub completed_at: String,
}

/// The dataset digest, fed `(path, size, blake3)` in ascending path order.
#[derive(Default)]
pub(crate) struct DatasetDigest {
    hasher: blake3::Hasher,
}

impl DatasetDigest {
    pub(crate) fn add(&mut self, path: &str, size: u64, hash: &[u8; 32]) {
        self.hasher.update(path.as_bytes());
        self.hasher.update(b"\0");
        self.hasher.update(size.to_string().as_bytes());
        self.hasher.update(b"\0");
        self.hasher.update(super::hex(hash).as_bytes());
        self.hasher.update(b"\n");
    }

    pub(crate) fn finish(&self) -> blake3::Hash {
        self.hasher.finalize()
    }
}

/// Removes READY (durably) before anything in DEST changes.
pub(crate) fn remove(state_dir: &Dir) -> io::Result<()> {
    state_dir.unlink(READY)?;
    state_dir.sync()
}

pub(crate) fn write(state_dir: &Dir, ready: &Ready) -> io::Result<()> {
    fs::write_atomic(state_dir, READY, |file| {
        file.write_all(&serde_json::to_vec_pretty(ready)?)?;
        file.write_all(b"\n")
    })
}

/// Whether READY is there (read or not).
pub(crate) fn exists(state_dir: &Dir) -> io::Result<bool> {
    Ok(state_dir.stat_regular(READY)?.is_some())
}

/// READY's content, if present and readable.
pub(crate) fn read(state_dir: &Dir) -> Option<Ready> {
    super::read_json(state_dir, READY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(entries: &[(&str, u64, [u8; 32])]) -> blake3::Hash {
        let mut digest = DatasetDigest::default();
        for (path, size, hash) in entries {
            digest.add(path, *size, hash);
        }
        digest.finish()
    }

    #[test]
    fn digest_covers_every_path_size_and_hash() {
        let (a, b) = (("a", 1, [1u8; 32]), ("b/c", 2, [2u8; 32]));
        let both = digest(&[a, b]);
        assert_eq!(both, digest(&[a, b]));
        assert_ne!(both, digest(&[a, ("b/c", 3, [2u8; 32])]));
        assert_ne!(both, digest(&[a, ("b/d", 2, [2u8; 32])]));
        assert_ne!(both, digest(&[a, ("b/c", 2, [3u8; 32])]));
        assert_ne!(both, digest(&[a]));
    }
}
