//! A new snapshot of a dataset starts from the one before it: every file whose object did not
//! change (same key, size and ETag, and the old file still the one its manifest published) is
//! hard-linked into the new directory and recorded there as published, so the engine skips it
//! and only changed objects are downloaded.
//!
//! A resumed snapshot may hold a `.partial` download of an object it now gets linked: that
//! partial is removed with the link, so the complete directory holds exactly the listing.
//!
//! Sharing inodes is safe because hydrator never writes a published file in place: new data
//! goes to a `.partial` file that is renamed over the name, which leaves the old inode, and so
//! a reader of the old snapshot, untouched.

use std::io;

use crate::manifest::journal::SourceInfo;
use crate::manifest::{Manifest, ObjectState};
use crate::plan::keys::{plan_key, KeyPlan};
use crate::snapshot::Snapshot;
use crate::write::dest::Dest;

/// What the new snapshot got from the old one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Linked {
    pub objects: u64,
    pub bytes: u64,
}

/// Links the files of `old_dest` (a complete snapshot directory) that `snapshot` still holds
/// into `new_dest`, whose manifest is opened for `source`.
pub(crate) fn link_unchanged(
    old_dest: &Dest,
    new_dest: &Dest,
    source: &SourceInfo,
    snapshot: &Snapshot,
) -> io::Result<Linked> {
    let Some((_, old)) = Manifest::open_existing(old_dest.state_dir()?)? else {
        return Ok(Linked::default());
    };
    let manifest = Manifest::open(new_dest.state_dir()?, source)?;
    // Snapshot entries are sorted by key, so both manifests are read in step with them.
    let (mut old_base, mut new_base) = (old.cursor()?, manifest.cursor()?);
    let mut linked = Linked::default();
    for entry in &snapshot.entries {
        let Some(prev) = old_base.take(&entry.key)? else {
            continue;
        };
        let (Some(done), KeyPlan::File(rel)) = (
            prev.complete,
            plan_key(&snapshot.prefix, &entry.key, entry.size),
        ) else {
            continue;
        };
        if prev.etag != entry.etag || prev.size != entry.size || !rel.is(&prev.path) {
            continue;
        }
        let already = new_base
            .find(&entry.key)?
            .is_some_and(|k| k.etag == entry.etag && k.complete == Some(done));
        if already {
            continue;
        }
        let Some(from) = old_dest.open_parent(&rel, false)? else {
            continue;
        };
        let unchanged = from
            .stat_regular(rel.file_name())?
            .is_some_and(|st| st.inode == done.inode && st.mtime_ns == done.mtime_ns);
        if !unchanged {
            continue;
        }
        let to = new_dest
            .open_parent(&rel, true)?
            .expect("open_parent with create returns a directory");
        match from.link_to(rel.file_name(), &to) {
            Ok(()) => {}
            // Left for the engine, which replaces whatever is there.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(err),
        }
        // An interrupted run of this snapshot (resumed after a restart) may have left the
        // object's download half done: the linked file replaces it.
        to.unlink(rel.partial_name())?;
        let state = ObjectState {
            parts: Default::default(),
            complete: None,
            ..prev
        };
        manifest.start_object(&entry.key, &state)?;
        manifest.complete(&entry.key, &entry.etag, done)?;
        linked.objects += 1;
        linked.bytes += entry.size;
    }
    new_dest.syncer()?.sync()?;
    manifest.sync()?;
    Ok(linked)
}
