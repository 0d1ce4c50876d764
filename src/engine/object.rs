//! One object: skip it when the manifest proves DEST already holds it, resume its durable parts
//! when an earlier run was cut short, otherwise fetch its parts concurrently into
//! `.NAME.partial`, merge the part hashes, and publish through the batch committer. An object
//! that fits one pooled buffer is fetched into memory instead and written in one call. An object
//! that changes on the server mid-download is started again from scratch, never mixed (in
//! snapshot mode it is an error instead: the snapshot pins the version).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
#[cfg(test)]
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use super::adaptive::Permit;
use tokio::task::JoinSet;

use super::context::Ctx;
use super::etag_md5;
use super::part::{fetch_into_memory, fetch_part, FetchedPart, PartTarget, Sink};
use super::peers;
use super::stats::Stats;
use crate::error::{IoContext, LocalError, ObjectError, PartError};
use crate::fs::{Dir, OFlags};
use crate::hash::{merge_parts, PartDigest};
use crate::manifest::{Completed, DurablePart, Manifest, ObjectState};
use crate::plan::keys::RelPath;
use crate::plan::parts::part_ranges;
use crate::report::{FileRecord, FileStatus};
use crate::source::checksum::{self, FullObjectChecksum};
use crate::source::fetch::{full_object_checksum, head, PinnedObject};
use crate::source::list::ObjectEntry;
use crate::units::unix_nanos;
use crate::write::dest::{self, Dest};
use crate::write::partials::Holding;

/// Times an object is restarted from scratch after it changed on the server mid-download.
const MAX_OBJECT_RESTARTS: u32 = 3;

/// Mirrors one listed object, whose state in the manifest's base is `known`; the error names
/// the reason for a person.
///
/// `slot` is one of the run's object slots; it is released as soon as the file is written, so
/// files waiting for their durable batch do not hold back the next downloads.
pub(crate) async fn mirror_object(
    ctx: Arc<Ctx>,
    entry: ObjectEntry,
    rel: RelPath,
    known: Option<ObjectState>,
    slot: Permit,
) -> Result<FileRecord, ObjectError> {
    let _in_flight = InFlight::adopt(&ctx, &entry.key, known);
    let record = |size, hash: [u8; 32], status| FileRecord {
        key: entry.key.clone(),
        path: rel.to_string(),
        size,
        blake3: Some(crate::manifest::hex(&hash)),
        status,
    };
    let up_to_date = up_to_date(&ctx, &rel, &entry).local("checking", &rel)?;
    // A file the seal disowns is fetched again, and checked again.
    if let Some(hash) = up_to_date.filter(|hash| entry.sealed.is_none_or(|s| s == *hash)) {
        return Ok(record(entry.size, hash, FileStatus::Skipped));
    }
    let mut object = Arc::new(PinnedObject {
        bucket: ctx.fetch.bucket.clone(),
        key: entry.key.clone(),
        etag: entry.etag.clone(),
        size: entry.size,
        version_id: entry.version_id.clone(),
    });
    let mut modified = entry.last_modified;
    let mut from_peers = match (&ctx.fetch.peers, entry.sealed) {
        (Some(peers), Some(sealed)) if entry.size >= peers.min_size() => {
            let fetched = peers::fetch(&ctx, &**peers, &object, &rel, sealed, modified).await;
            fetched
                .inspect_err(|err| {
                    Stats::add(&ctx.fetch.stats.peer_fallbacks, 1);
                    tracing::warn!(key = %entry.key, "{err}; fetching it from the store");
                })
                .ok()
        }
        _ => None,
    };
    let mut restarts = 0;
    // Readers may read a file while it downloads, before its whole-file checks, unless it is
    // sealed (the seal checks only the whole file, so no byte reaches a reader before it) or
    // an attempt of it was rejected already (its readers then wait for the verified file).
    let mut streamable = entry.sealed.is_none();
    loop {
        let fetched = match from_peers.take() {
            Some(hash) => Ok(hash),
            None => download(&ctx, object.clone(), &rel, modified, streamable).await,
        };
        match fetched {
            Ok(hash) => {
                if let Some(sealed) = entry.sealed.filter(|s| s != hash.as_bytes()) {
                    discard_partial(&ctx, &rel).await;
                    return Err(ObjectError::NotAsSealed {
                        sealed: crate::manifest::hex(&sealed),
                        got: hash.to_hex().to_string(),
                    });
                }
                let (key, etag) = (entry.key.clone(), object.etag.clone());
                let committer = &ctx.write.committer;
                let wanted = ctx.write.schedule.as_ref();
                // The download slot goes as soon as the file is written (a batch's syncs would
                // otherwise hold back the next downloads), once the file has a place to wait.
                match wanted.is_some_and(|schedule| schedule.is_wanted(&entry.key)) {
                    true => {
                        drop(slot);
                        committer.publish_now(rel.clone(), key, etag, hash).await
                    }
                    false => {
                        let place = committer.reserve().await;
                        drop(slot);
                        committer.publish(place, rel.clone(), key, etag, hash).await
                    }
                }
                .local("publishing", &rel)?;
                return Ok(record(
                    object.size,
                    *hash.as_bytes(),
                    FileStatus::Downloaded,
                ));
            }
            Err(err @ (PartError::ChecksumMismatch { .. } | PartError::Md5Mismatch { .. }))
                if restarts < MAX_OBJECT_RESTARTS =>
            {
                restarts += 1;
                streamable = false;
                Stats::add(&ctx.fetch.stats.object_restarts, 1);
                tracing::warn!(key = %entry.key, "{err}; fetching it again");
            }
            Err(PartError::Changed) if ctx.fetch.pinned => {
                return Err(ObjectError::ChangedSinceSnapshot {
                    etag: object.etag.clone(),
                })
            }
            Err(PartError::Changed) if restarts < MAX_OBJECT_RESTARTS => {
                restarts += 1;
                Stats::add(&ctx.fetch.stats.object_restarts, 1);
                tracing::warn!(key = %entry.key, "object changed on the server during the download; starting it again");
                let (fresh, fresh_modified) =
                    head(&*ctx.fetch.source, &ctx.fetch.bucket, &entry.key).await?;
                object = Arc::new(fresh);
                modified = fresh_modified;
            }
            Err(PartError::Changed) => {
                return Err(ObjectError::KeptChanging {
                    restarts: MAX_OBJECT_RESTARTS,
                })
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Removes the partial file of a download whose bytes may not be published.
async fn discard_partial(ctx: &Ctx, rel: &RelPath) {
    let (dest, rel) = (ctx.write.dest.clone(), rel.clone());
    let removed = blocking(move || {
        if let Some(dir) = dest.open_parent(&rel, false).local("opening", &rel)? {
            let partial = rel.partial_name();
            dir.unlink(&partial).local("removing", &partial)?;
        }
        Ok(())
    })
    .await;
    if let Err(err) = removed {
        tracing::warn!("{err}");
    }
}

/// Holds an object's state in the manifest's memory while its task runs, aborted or not.
struct InFlight<'a> {
    ctx: &'a Ctx,
    key: &'a str,
}

impl<'a> InFlight<'a> {
    fn adopt(ctx: &'a Ctx, key: &'a str, known: Option<ObjectState>) -> Self {
        ctx.write.manifest.adopt(key, known);
        #[cfg(test)]
        {
            let stats = &ctx.fetch.stats;
            let now = stats.objects_in_flight.fetch_add(1, Relaxed) + 1;
            stats.most_objects_in_flight.fetch_max(now, Relaxed);
        }
        Self { ctx, key }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.ctx.write.manifest.release(self.key);
        #[cfg(test)]
        self.ctx.fetch.stats.objects_in_flight.fetch_sub(1, Relaxed);
    }
}

/// The file's hash when the manifest says it is published at this version and the file on disk
/// is still the one published (size, mtime and inode unchanged).
fn up_to_date(ctx: &Ctx, rel: &RelPath, entry: &ObjectEntry) -> std::io::Result<Option<[u8; 32]>> {
    let done = ctx
        .write
        .manifest
        .inspect(&entry.key, |known| published(known, rel, entry));
    match done {
        Some(done) => still_on_disk(&ctx.write.dest, rel, entry.size, done),
        None => Ok(None),
    }
}

/// What the manifest's `known` state says is published of this listed version at `rel`.
pub(super) fn published(
    known: Option<&ObjectState>,
    rel: &RelPath,
    entry: &ObjectEntry,
) -> Option<Completed> {
    known
        .filter(|k| k.etag == entry.etag && k.size == entry.size && rel.is(&k.path))
        .and_then(|k| k.complete)
}

/// The file's hash when the file at `rel` is still the one `done` published.
pub(super) fn still_on_disk(
    dest: &Dest,
    rel: &RelPath,
    size: u64,
    done: Completed,
) -> std::io::Result<Option<[u8; 32]>> {
    let Some(stat) = dest.stat_final(rel)? else {
        return Ok(None);
    };
    if stat.size != size || stat.inode != done.inode || stat.mtime_ns != done.mtime_ns {
        return Ok(None);
    }
    Ok(Some(done.blake3))
}

/// Whether the durable parts `known` holds can be resumed for a download of this version.
pub(super) fn resumable(known: &ObjectState, etag: &str, size: u64, part_size: u64) -> bool {
    known.complete.is_none()
        && !known.parts.is_empty()
        && (known.etag.as_str(), known.size, known.part_size) == (etag, size, part_size)
}

/// Downloads `object` into `rel`'s partial file; its written parts are offered to a lazy
/// view's readers when `streamable`.
async fn download(
    ctx: &Arc<Ctx>,
    object: Arc<PinnedObject>,
    rel: &RelPath,
    modified: Option<SystemTime>,
    streamable: bool,
) -> Result<blake3::Hash, PartError> {
    if object.size <= ctx.fetch.pool.buffer_size() as u64 {
        return download_small(ctx, &object, rel, modified).await;
    }
    let state = new_attempt(ctx, &object, rel, modified);
    let part_size = state.part_size;
    let known = ctx.write.manifest.lookup(&object.key);
    let stale_parts = known.as_ref().is_some_and(|k| !k.parts.is_empty());
    let resumable =
        known.filter(|known| resumable(known, &state.etag, state.size, state.part_size));
    let (dir, file, attempt, resumed) = {
        let (dest, manifest, rel, key) = (
            ctx.write.dest.clone(),
            ctx.write.manifest.clone(),
            rel.clone(),
            object.key.clone(),
        );
        let (size, direct) = (object.size, ctx.write.direct.large);
        blocking(move || {
            if let Some(known) = resumable {
                let reopened = dest
                    .reopen_partial(&rel, direct, size)
                    .local("reopening", &rel)?;
                if let Some((dir, file)) = reopened {
                    return Ok((dir, file, known.attempt, known.parts));
                }
            }
            record_attempt(&manifest, &key, &state, stale_parts)
                .local("recording in the manifest", &rel)?;
            let (dir, file) = dest.create_partial(&rel, direct).local("creating", &rel)?;
            if let Err(err) = dest::preallocate(&file, size) {
                // Whatever the filesystem reserved before it gave up goes with the file.
                let _ = dir.unlink(rel.partial_name());
                return Err(err).local_with(|| format!("reserving {size} bytes for"), &rel);
            }
            Ok((dir, file, state.attempt, BTreeMap::new()))
        })
        .await?
    };
    let (dir, file) = (Arc::new(dir), Arc::new(file));
    let streamed = streamable
        .then(|| stream_to_readers(ctx, &object, &file, part_size, &resumed))
        .flatten();
    let held = ctx.write.partials.hold(
        dir.clone(),
        rel.partial_name(),
        file.clone(),
        (object.size, part_size),
        resumed.keys().copied(),
    );
    let written = PartsWritten {
        held: &held,
        streamed,
    };
    let fetched = match fetch_all_parts(ctx, &object, &file, (attempt, &written), &resumed).await {
        Ok(hash) => check_md5_of_file(ctx, &object, &dir, rel)
            .await
            .map(|()| hash),
        Err(err) => Err(err),
    };
    // No reader is told of this attempt's parts from now on (a whole-file check rejected it,
    // or it failed); those that read some learn it from the unlinked file (`mount::view`).
    if let (Some(schedule), Some(inode), Err(_)) = (&ctx.write.schedule, streamed, &fetched) {
        schedule.discarded(&object.key, inode);
    }
    // A full disk stops the run, which then gives back the room this file holds unwritten.
    if !fetched.as_ref().is_err_and(PartError::disk_full) {
        held.done();
    }
    match fetched {
        Ok(hash) => {
            let (size, direct) = (object.size, ctx.write.direct.large);
            let rel = rel.clone();
            blocking(move || {
                finish_file(&file, size, direct, modified)
                    .local_with(|| format!("finishing the {size}-byte file"), &rel)
            })
            .await?;
            Ok(hash)
        }
        Err(err) => {
            // Keep a partial file whose durable parts a later run can resume; drop one that has
            // none or holds another version.
            let keep = !matches!(
                err,
                PartError::Changed
                    | PartError::ChecksumMismatch { .. }
                    | PartError::Md5Mismatch { .. }
            ) && ctx
                .write
                .manifest
                .inspect(&object.key, |o| o.is_some_and(|o| !o.parts.is_empty()));
            if !keep {
                let partial = rel.partial_name();
                let _ = blocking(move || dir.unlink(&partial).local("removing", &partial)).await;
            }
            Err(err)
        }
    }
}

/// Offers the parts of `object`'s partial `file` to a lazy view's readers as they are written
/// (`streams.rs`), when the run has readers that may read unchecked bytes and the object has
/// more than one part; returns the file's inode then.
fn stream_to_readers(
    ctx: &Ctx,
    object: &PinnedObject,
    file: &File,
    part_size: u64,
    resumed: &BTreeMap<u32, DurablePart>,
) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let schedule = ctx.write.schedule.as_ref()?;
    if object.size <= part_size || !schedule.streams_unchecked() {
        return None;
    }
    let inode = file.metadata().ok()?.ino();
    let sizes = (object.size, part_size);
    schedule.streaming(&object.key, inode, sizes, resumed.keys().copied());
    Some(inode)
}

/// Where a written part is told: the partial files held for a full disk, and the readers
/// of a streamed file.
struct PartsWritten<'a> {
    held: &'a Holding,
    /// The partial file's inode, when its parts are offered to readers.
    streamed: Option<u64>,
}

impl PartsWritten<'_> {
    fn written(&self, ctx: &Ctx, key: &str, index: u32) {
        self.held.written(index);
        if let (Some(schedule), Some(inode)) = (ctx.write.schedule.as_ref(), self.streamed) {
            schedule.part_written(key, inode, index);
        }
    }
}

/// A whole object that fits one pooled buffer (it is then one part): fetched into memory
/// first, then recorded, created, written and stamped in one trip to a blocking thread. The
/// streaming path takes three trips (create, the writer thread, mtime), and below a buffer
/// the wake-ups of those trips cost more CPU than the bytes; preallocating a file written in
/// one call gains nothing either. Nothing is kept of a failed attempt: one part has nothing
/// to resume.
async fn download_small(
    ctx: &Ctx,
    object: &PinnedObject,
    rel: &RelPath,
    modified: Option<SystemTime>,
) -> Result<blake3::Hash, PartError> {
    let direct = ctx.write.direct.small;
    let (hash, bytes) = match object.size {
        0 => (blake3::hash(b""), None),
        _ => {
            let (part, bytes) = fetch_into_memory(ctx, object, direct).await?;
            if let Some(md5) = md5_to_check(ctx, object) {
                etag_md5::check_bytes(md5, &bytes.as_slice()[..object.size as usize])?;
            }
            let hash = merge_parts(&[part.digest], object.size, ctx.fetch.part_size);
            (hash, Some(bytes))
        }
    };
    let state = new_attempt(ctx, object, rel, modified);
    let stale_parts = ctx
        .write
        .manifest
        .inspect(&object.key, |k| k.is_some_and(|k| !k.parts.is_empty()));
    let (dest, manifest, rel, key) = (
        ctx.write.dest.clone(),
        ctx.write.manifest.clone(),
        rel.clone(),
        object.key.clone(),
    );
    let size = object.size;
    let written = tokio::task::spawn_blocking(move || -> Result<(), PartError> {
        record_attempt(&manifest, &key, &state, stale_parts)
            .local("recording in the manifest", &rel)?;
        let (dir, file) = dest.create_partial(&rel, direct).local("creating", &rel)?;
        let written = match &bytes {
            Some(bytes) => file
                .write_all_at(bytes.as_slice(), 0)
                .map_err(|err| dest::write_error(err, &file).into()),
            None => Ok(()),
        }
        .and_then(|()| {
            finish_file(&file, size, direct, modified)
                .local_with(|| format!("finishing the {size}-byte file"), &rel)
                .map_err(PartError::from)
        });
        if written.is_err() {
            let _ = dir.unlink(rel.partial_name());
        }
        written
    })
    .await
    .map_err(|err| PartError::Task("filesystem task failed", err))?;
    written.map(|()| hash)
}

/// The MD5 to check `object` against: its ETag's, under `--check-md5`.
fn md5_to_check(ctx: &Ctx, object: &PinnedObject) -> Option<[u8; 16]> {
    ctx.fetch
        .check_md5
        .then(|| etag_md5::etag_md5(&object.etag))
        .flatten()
}

/// Under `--check-md5`, reads the complete partial file in `dir` back and checks its MD5.
async fn check_md5_of_file(
    ctx: &Ctx,
    object: &PinnedObject,
    dir: &Arc<Dir>,
    rel: &RelPath,
) -> Result<(), PartError> {
    let Some(md5) = md5_to_check(ctx, object) else {
        return Ok(());
    };
    let (dir, rel, size) = (dir.clone(), rel.clone(), object.size);
    let checked = blocking(move || {
        let partial = rel.partial_name();
        let file = dir
            .open_file(&partial, OFlags::RDONLY | OFlags::NOFOLLOW)
            .local("reading back", &partial)?;
        etag_md5::check_file(md5, &file, size).local("reading back", &partial)
    });
    checked.await?
}

/// A new download attempt of `object` at `rel`, as the manifest records it.
fn new_attempt(
    ctx: &Ctx,
    object: &PinnedObject,
    rel: &RelPath,
    modified: Option<SystemTime>,
) -> ObjectState {
    ObjectState {
        path: rel.to_string(),
        size: object.size,
        etag: object.etag.clone(),
        last_modified_ns: modified.map(unix_nanos),
        part_size: ctx.fetch.part_size,
        attempt: fastrand::u64(..),
        parts: BTreeMap::new(),
        complete: None,
    }
}

/// Records a new attempt before its partial file is created. Durable parts of another attempt
/// (`stale_parts`) must be voided, durably, before their partial file is replaced: otherwise a
/// crash could leave them describing a new, still empty file.
fn record_attempt(
    manifest: &Manifest,
    key: &str,
    state: &ObjectState,
    stale_parts: bool,
) -> std::io::Result<()> {
    manifest.start_object(key, state)?;
    match stale_parts {
        true => manifest.sync(),
        false => Ok(()),
    }
}

/// Fetches the parts not already durable, merges the BLAKE3 of all parts into the file's hash
/// and, when the server keeps a full-object checksum, checks the combined part CRCs against it.
async fn fetch_all_parts(
    ctx: &Arc<Ctx>,
    object: &Arc<PinnedObject>,
    file: &Arc<File>,
    (attempt, written): (u64, &PartsWritten<'_>),
    resumed: &BTreeMap<u32, DurablePart>,
) -> Result<blake3::Hash, PartError> {
    let ranges: Vec<_> = part_ranges(object.size, ctx.fetch.part_size).collect();
    let whole_object = ranges.len() == 1;
    // A whole-object GET is checked against the server's checksum by the SDK itself.
    let expected = match whole_object {
        true => None,
        false => full_object_checksum(&*ctx.fetch.source, object).await?,
    };
    let mut fetched: Vec<Option<FetchedPart>> = vec![None; ranges.len()];
    let mut to_fetch = Vec::new();
    for (index, range) in ranges.iter().cloned().enumerate() {
        match (whole_object, resumed.get(&(index as u32))) {
            (false, Some(part)) => {
                fetched[index] = Some(FetchedPart {
                    digest: PartDigest::Subtree(part.cv),
                    crc: part.crc,
                });
                Stats::add(&ctx.fetch.stats.bytes_resumed, range.end - range.start);
            }
            _ => to_fetch.push((index, range)),
        }
    }
    // Part tasks are started as request slots can take them, not all at once, so a huge
    // object does not hold one task per part; a part a reader waits for starts first.
    let mut to_fetch = std::collections::VecDeque::from(to_fetch);
    let mut parts = JoinSet::new();
    loop {
        if parts.len() < ctx.fetch.request_slots.max() {
            if let Some((index, range)) = next_part(ctx, &object.key, &mut to_fetch) {
                let target = PartTarget {
                    sink: Sink::File(file.clone()),
                    pad_tail: ctx.write.direct.large && range.end == object.size,
                    range,
                    whole_object,
                    crc: expected.map(|e| e.algorithm),
                };
                let (ctx, object) = (ctx.clone(), object.clone());
                parts.spawn(async move { (index, fetch_part(ctx, object, target).await) });
                continue;
            }
        }
        let Some(joined) = parts.join_next().await else {
            break;
        };
        let (index, result) = joined.map_err(|err| PartError::Task("part task failed", err))?;
        let part = result.inspect_err(|_| parts.abort_all())?;
        if let PartDigest::Subtree(cv) = part.digest {
            let len = ranges[index].end - ranges[index].start;
            let durable = DurablePart { cv, crc: part.crc };
            ctx.write
                .checkpoints
                .part_written(&object.key, attempt, index as u32, durable, len);
        }
        written.written(ctx, &object.key, index as u32);
        fetched[index] = Some(part);
    }
    let fetched: Vec<FetchedPart> = fetched
        .into_iter()
        .map(|p| p.expect("every part joined"))
        .collect();
    if let Some(expected) = expected {
        check_crc(expected, &fetched, &ranges, &object.key)?;
    }
    let digests: Vec<PartDigest> = fetched.iter().map(|p| p.digest).collect();
    Ok(merge_parts(&digests, object.size, ctx.fetch.part_size))
}

/// The next part of `key` to start: the first one a reader waits for, else the first one.
fn next_part(
    ctx: &Ctx,
    key: &str,
    to_fetch: &mut std::collections::VecDeque<(usize, std::ops::Range<u64>)>,
) -> Option<(usize, std::ops::Range<u64>)> {
    let wanted =
        ctx.write.schedule.as_deref().and_then(|schedule| {
            schedule.first_wanted(key, to_fetch.iter().map(|(_, range)| range))
        });
    to_fetch.remove(wanted.unwrap_or(0))
}

fn check_crc(
    expected: FullObjectChecksum,
    parts: &[FetchedPart],
    ranges: &[std::ops::Range<u64>],
    key: &str,
) -> Result<(), PartError> {
    let Some(crcs) = parts
        .iter()
        .zip(ranges)
        .map(|(p, r)| p.crc.map(|crc| (crc, r.end - r.start)))
        .collect::<Option<Vec<_>>>()
    else {
        tracing::debug!(
            key,
            "parts resumed without a CRC: end-to-end checksum not checked"
        );
        return Ok(());
    };
    let actual = checksum::combine(expected.algorithm, &crcs);
    if actual == expected.value {
        return Ok(());
    }
    Err(PartError::ChecksumMismatch {
        algorithm: expected.algorithm.name(),
        expected: expected.value,
        actual,
    })
}

fn finish_file(
    file: &File,
    size: u64,
    direct_io: bool,
    modified: Option<SystemTime>,
) -> std::io::Result<()> {
    if direct_io {
        file.set_len(size)?; // drop the O_DIRECT padding of the last block
    }
    if let Some(modified) = modified {
        file.set_modified(modified)?;
    }
    Ok(())
}

/// Runs filesystem work off the async threads; an error becomes fatal for the object.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, LocalError> + Send + 'static,
) -> Result<T, PartError> {
    Ok(tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| PartError::Task("filesystem task failed", err))??)
}
