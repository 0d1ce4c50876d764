//! Snapshots: a listing frozen into a file (`hydrator snapshot ... -o dataset.lock`) so every
//! node hydrates exactly the same objects. `sync --snapshot` reads the objects from the file
//! instead of listing, pins every GET to the recorded ETag (a changed object is an error that
//! names it), and returns at once when DEST's READY already names the snapshot's digest.
//! A sealed snapshot ([`crate::seal`]) also records each object's BLAKE3.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::error::SourceError;
use crate::error::{SyncError, UsageError};
use crate::fs;
use crate::plan::keys::{plan_key, KeyPlan};
use crate::source::list::{self, ObjectEntry};
use crate::source::url::S3Url;
use crate::units::unix_nanos;

pub(crate) const SNAPSHOT_VERSION: u32 = 1;
/// The format of a sealed snapshot: entries that are files carry `blake3`.
pub(crate) const SEALED_VERSION: u32 = 2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct SnapshotEntry {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified_ns: Option<u64>,
    /// Set when the bucket is versioned: GETs then ask for exactly this version.
    pub version_id: Option<String>,
    /// In a sealed snapshot: the BLAKE3 of this version's bytes, in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub version: u32,
    pub endpoint: Option<String>,
    pub bucket: String,
    pub prefix: String,
    /// BLAKE3 over `key \0 size \0 etag \0 version [\0 blake3] \n` of every entry, sorted by
    /// key (the seal's BLAKE3 only in a sealed snapshot).
    pub digest: String,
    pub objects: u64,
    pub bytes: u64,
    pub created_at: String,
    pub entries: Vec<SnapshotEntry>,
}

impl From<&SnapshotEntry> for ObjectEntry {
    fn from(e: &SnapshotEntry) -> Self {
        ObjectEntry {
            key: e.key.clone(),
            size: e.size,
            etag: e.etag.clone(),
            last_modified: e
                .last_modified_ns
                .map(|ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)),
            version_id: e.version_id.clone(),
            sealed: e
                .blake3
                .as_deref()
                .and_then(|hex| blake3::Hash::from_hex(hex).ok())
                .map(|hash| *hash.as_bytes()),
        }
    }
}

impl Snapshot {
    pub(crate) fn url(&self) -> S3Url {
        S3Url {
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
        }
    }
}

/// Whether `name` has the form of a snapshot digest (64 hex digits), as the daemon's snapshot
/// directories are named.
pub(crate) fn is_digest(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

pub(crate) fn digest(entries: &[SnapshotEntry]) -> String {
    digest_of(entries.iter().map(|e| Digested {
        key: &e.key,
        size: e.size,
        etag: &e.etag,
        version_id: e.version_id.as_deref(),
        blake3: e.blake3.as_deref(),
    }))
}

/// What the digest covers of one entry.
struct Digested<'a> {
    key: &'a str,
    size: u64,
    etag: &'a str,
    version_id: Option<&'a str>,
    blake3: Option<&'a str>,
}

fn digest_of<'a>(entries: impl Iterator<Item = Digested<'a>>) -> String {
    let mut sorted: Vec<Digested<'a>> = entries.collect();
    sorted.sort_unstable_by(|a, b| a.key.cmp(b.key));
    let mut hasher = blake3::Hasher::new();
    for e in sorted {
        hasher.update(e.key.as_bytes());
        hasher.update(b"\0");
        hasher.update(e.size.to_string().as_bytes());
        hasher.update(b"\0");
        hasher.update(e.etag.as_bytes());
        hasher.update(b"\0");
        hasher.update(e.version_id.unwrap_or("").as_bytes());
        if let Some(sealed) = e.blake3 {
            hasher.update(b"\0");
            hasher.update(sealed.as_bytes());
        }
        hasher.update(b"\n");
    }
    hasher.finalize().to_hex().to_string()
}

/// A listing frozen by [`create`].
pub(crate) struct Created {
    pub snapshot: Snapshot,
    /// The server did not list object versions: for the caller to say, as often as it sees fit.
    pub unversioned: Option<Unversioned>,
}

/// Why a snapshot pins ETags only.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server does not list object versions ({0}): the snapshot pins ETags only, so an object \
     overwritten after it will fail the hydration instead of being fetched at its version"
)]
pub(crate) struct Unversioned(#[source] SourceError);

/// Lists `url` completely with `client` (built from `settings`) and freezes it.
pub(crate) async fn create(
    client: aws_sdk_s3::Client,
    url: &S3Url,
    settings: &crate::source::client::ClientSettings,
) -> Result<Created, SyncError> {
    let endpoint = settings.endpoint.clone();
    let mut unversioned = None;
    let listed = match list::list_latest_versions(&client, url).await? {
        list::Versions::Listed(entries) => entries,
        list::Versions::NotListed(why) => {
            unversioned = Some(Unversioned(why));
            let source = Arc::new(crate::source::s3::S3Source::new(client, settings.anonymous));
            let mut listing = list::spawn(source, url.clone());
            let mut listed = Vec::new();
            while let Some(entry) = listing.recv().await {
                listed.push(entry?);
            }
            listed
        }
    };
    let entries: Vec<SnapshotEntry> = listed.into_iter().map(unsealed).collect();
    let snapshot = Snapshot {
        version: SNAPSHOT_VERSION,
        endpoint,
        bucket: url.bucket.clone(),
        prefix: url.prefix.clone(),
        digest: digest(&entries),
        objects: entries.len() as u64,
        bytes: entries.iter().map(|e| e.size).sum(),
        created_at: crate::units::now_rfc3339(),
        entries,
    };
    Ok(Created {
        snapshot,
        unversioned,
    })
}

/// The entry of a listed object in a snapshot that is not sealed.
fn unsealed(entry: ObjectEntry) -> SnapshotEntry {
    SnapshotEntry {
        key: entry.key,
        size: entry.size,
        etag: entry.etag,
        last_modified_ns: entry.last_modified.map(unix_nanos),
        version_id: entry.version_id,
        blake3: None,
    }
}

/// The digest a snapshot of exactly this listing has.
pub(crate) fn listing_digest(listed: &[ObjectEntry]) -> String {
    digest_of(listed.iter().map(|e| Digested {
        key: &e.key,
        size: e.size,
        etag: &e.etag,
        version_id: e.version_id.as_deref(),
        blake3: None,
    }))
}

/// Writes the snapshot file atomically ([`fs::write_atomic`]).
pub(crate) fn write(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    fs::write_atomic_path(path, |file| {
        serde_json::to_writer(&mut *file, snapshot)?;
        file.write_all(b"\n")
    })
}

/// Reads and checks a snapshot file.
pub(crate) fn read(path: &Path) -> Result<Snapshot, UsageError> {
    let bad = |why: String| UsageError::new(format!("snapshot {}: {why}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut snapshot: Snapshot =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a hydrator snapshot: {e}")))?;
    if ![SNAPSHOT_VERSION, SEALED_VERSION].contains(&snapshot.version) {
        return Err(bad(format!(
            "format version {} is not supported",
            snapshot.version
        )));
    }
    check_seals(&snapshot).map_err(|err| bad(err.to_string()))?;
    if digest(&snapshot.entries) != snapshot.digest {
        return Err(bad(
            "its digest does not match its entries (edited or damaged)".into(),
        ));
    }
    // Mirrored in key order, like a listing: the manifest is read in step with it.
    snapshot.entries.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    if let Some(pair) = snapshot.entries.windows(2).find(|w| w[0].key == w[1].key) {
        return Err(bad(format!("key {:?} is listed twice", pair[0].key)));
    }
    Ok(snapshot)
}

/// An entry whose seal does not fit its snapshot's format.
#[derive(Debug, thiserror::Error)]
#[error("key {key:?}: its blake3 is missing or malformed for format version {version}")]
struct BadSeal {
    key: String,
    version: u32,
}

/// A sealed snapshot seals each of its files with a well-formed hash, and an unsealed one none.
fn check_seals(snapshot: &Snapshot) -> Result<(), BadSeal> {
    for entry in &snapshot.entries {
        let is_file = matches!(
            plan_key(&snapshot.prefix, &entry.key, entry.size),
            KeyPlan::File(_)
        );
        let well_formed = entry
            .blake3
            .as_deref()
            .is_some_and(|hex| blake3::Hash::from_hex(hex).is_ok());
        let fits = match snapshot.version {
            SNAPSHOT_VERSION => entry.blake3.is_none(),
            _ => well_formed || (!is_file && entry.blake3.is_none()),
        };
        if !fits {
            return Err(BadSeal {
                key: entry.key.clone(),
                version: snapshot.version,
            });
        }
    }
    Ok(())
}

/// Feeds the snapshot's objects to the engine as a listing would.
pub(crate) fn spawn_entries(
    snapshot: Arc<Snapshot>,
) -> mpsc::Receiver<Result<ObjectEntry, SyncError>> {
    let (tx, rx) = mpsc::channel(list::LISTING_QUEUE);
    tokio::spawn(async move {
        for entry in &snapshot.entries {
            if tx.send(Ok(entry.into())).await.is_err() {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(entries: Vec<SnapshotEntry>, version: u32) -> Snapshot {
        Snapshot {
            version,
            endpoint: None,
            bucket: "b".into(),
            prefix: "p/".into(),
            digest: digest(&entries),
            objects: entries.len() as u64,
            bytes: entries.iter().map(|e| e.size).sum(),
            created_at: String::new(),
            entries,
        }
    }

    fn entry(key: &str, blake3: Option<&str>) -> SnapshotEntry {
        SnapshotEntry {
            key: key.into(),
            size: 1,
            etag: "\"e\"".into(),
            last_modified_ns: None,
            version_id: None,
            blake3: blake3.map(str::to_string),
        }
    }

    #[test]
    fn the_digest_covers_the_seal_and_leaves_unsealed_digests_as_they_were() {
        let hash = blake3::hash(b"x").to_hex().to_string();
        let other = blake3::hash(b"y").to_hex().to_string();
        let plain = digest(&[entry("p/a", None)]);
        let sealed = digest(&[entry("p/a", Some(&hash))]);
        assert_ne!(plain, sealed);
        assert_ne!(sealed, digest(&[entry("p/a", Some(&other))]));
        // What the format before seals wrote: key, size, etag, version.
        let before = blake3::hash(b"p/a\x001\x00\"e\"\x00\n")
            .to_hex()
            .to_string();
        assert_eq!(plain, before);
    }

    #[test]
    fn a_sealed_snapshot_seals_every_file_and_an_unsealed_one_none() {
        let hash = blake3::hash(b"x").to_hex().to_string();
        let dir_marker = || entry("p/dir/", None);
        assert!(check_seals(&snapshot(vec![entry("p/a", Some(&hash)), dir_marker()], 2)).is_ok());
        assert!(check_seals(&snapshot(vec![entry("p/a", None)], 1)).is_ok());
        let unsealed_file = check_seals(&snapshot(vec![entry("p/a", None)], 2))
            .unwrap_err()
            .to_string();
        assert!(unsealed_file.contains("\"p/a\""), "{unsealed_file}");
        assert!(check_seals(&snapshot(vec![entry("p/a", Some("beef"))], 2)).is_err());
        assert!(check_seals(&snapshot(vec![entry("p/a", Some(&hash))], 1)).is_err());
    }
}
