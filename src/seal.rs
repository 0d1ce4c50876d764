//! Sealing a snapshot: each object's BLAKE3 is recorded beside its ETag and version, and the
//! digest covers it. Bytes of that version from anywhere (the store, a peer, a cache) can then
//! be checked before they count: the engine never publishes a file that does not match.
//!
//! The hashes come from the manifest of a DEST that a `sync` of exactly those versions filled:
//! it holds the BLAKE3 of the bytes as they arrived, checked against the server's checksums,
//! which is what the seal vouches for. No file is read again, and a file changed on disk since
//! cannot leak into the seal. The manifest is read in key order, in step with the snapshot.

use std::path::Path;

use crate::error::UsageError;
use crate::manifest::base::ObjectStream;
use crate::manifest::view::ManifestView;
use crate::manifest::{hex, ObjectState};
use crate::plan::keys::{plan_key, KeyPlan};
use crate::snapshot::{digest, Snapshot, SEALED_VERSION};
use crate::write::dest::Dest;

/// Records in `snapshot` the BLAKE3 of each of its files, from the manifest in `dest`, which
/// must hold every one of them complete at its listed ETag and size.
pub(crate) fn seal(snapshot: &mut Snapshot, dest: &Path) -> Result<(), UsageError> {
    let bad = |why: String| UsageError::new(format!("sealing from {}: {why}", dest.display()));
    let view = Dest::open_existing(dest)
        .and_then(|d| d.map(|d| d.existing_state_dir()).transpose())
        .map(Option::flatten)
        .and_then(|dir| dir.map(|d| ManifestView::open(d, None, false)).transpose())
        .map(Option::flatten)
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| bad("no hydrator manifest there: sync the snapshot into it first".into()))?;
    let source = view.source();
    if (source.bucket.as_str(), source.prefix.as_str())
        != (snapshot.bucket.as_str(), snapshot.prefix.as_str())
    {
        return Err(bad(format!(
            "it holds s3://{}/{}, not s3://{}/{}",
            source.bucket, source.prefix, snapshot.bucket, snapshot.prefix
        )));
    }
    snapshot.entries.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    let mut objects = view.objects().map_err(|e| bad(e.to_string()))?;
    let mut next = objects.next_object().map_err(|e| bad(e.to_string()))?;
    let (mut unsealed, mut first) = (0, None);
    for entry in &mut snapshot.entries {
        if !matches!(
            plan_key(&snapshot.prefix, &entry.key, entry.size),
            KeyPlan::File(_)
        ) {
            continue;
        }
        while next.as_ref().is_some_and(|(key, _)| *key < entry.key) {
            next = objects.next_object().map_err(|e| bad(e.to_string()))?;
        }
        let held = next.as_ref().filter(|(key, _)| *key == entry.key);
        match held.and_then(|(_, state)| complete_at(state, &entry.etag, entry.size)) {
            Some(hash) => entry.blake3 = Some(hex(&hash)),
            None => {
                unsealed += 1;
                first.get_or_insert_with(|| entry.key.clone());
            }
        }
    }
    if let Some(first) = first {
        return Err(bad(format!(
            "{unsealed} of the snapshot's objects are not there complete at their listed ETag (the first: {first:?}); run `hydrator sync --snapshot` into it first"
        )));
    }
    snapshot.version = SEALED_VERSION;
    snapshot.digest = digest(&snapshot.entries);
    Ok(())
}

/// The hash of a complete download of exactly this version.
fn complete_at(state: &ObjectState, etag: &str, size: u64) -> Option<[u8; 32]> {
    let same = state.etag == etag && state.size == size;
    state.complete.filter(|_| same).map(|done| done.blake3)
}
