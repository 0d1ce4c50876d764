//! One object: skip it when DEST already holds it, otherwise fetch its parts concurrently into
//! `.NAME.partial`, merge the part hashes, and publish through the batch committer. An object
//! that changes on the server mid-download is started again from scratch, never mixed.

use std::fs::File;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

use super::part::{fetch_part, PartTarget};
use super::run::Ctx;
use super::stats::Stats;
use crate::config::MAX_OBJECT_RESTARTS;
use crate::error::PartError;
use crate::hash::{merge_parts, PartDigest};
use crate::plan::keys::RelPath;
use crate::plan::parts::part_ranges;
use crate::report::{FileRecord, FileStatus};
use crate::source::fetch::{head, PinnedObject};
use crate::source::list::ObjectEntry;
use crate::write::dest::{self, Dest};

/// Mirrors one listed object; the error names the reason for a person.
///
/// `slot` is one of the run's object slots; it is released as soon as the file is written, so
/// files waiting for their durable batch do not hold back the next downloads.
pub async fn mirror_object(
    ctx: Arc<Ctx>,
    entry: ObjectEntry,
    rel: RelPath,
    slot: OwnedSemaphorePermit,
) -> Result<FileRecord, String> {
    let record = |size, hash: Option<String>, status| FileRecord {
        key: entry.key.clone(),
        path: rel.to_string(),
        size,
        blake3: hash,
        status,
    };
    if let Some(hash) =
        up_to_date(&ctx.dest, &rel, &entry).map_err(|err| format!("checking {rel}: {err}"))?
    {
        return Ok(record(entry.size, hash, FileStatus::Skipped));
    }
    let mut object = Arc::new(PinnedObject {
        bucket: ctx.bucket.clone(),
        key: entry.key.clone(),
        etag: entry.etag.clone(),
        size: entry.size,
    });
    let mut modified = entry.last_modified;
    let mut restarts = 0;
    loop {
        match download(&ctx, object.clone(), &rel, modified).await {
            Ok(hash) => {
                drop(slot);
                ctx.committer
                    .publish(rel.clone())
                    .await
                    .map_err(|err| format!("publishing {rel}: {err}"))?;
                return Ok(record(
                    object.size,
                    Some(hash.to_hex().to_string()),
                    FileStatus::Downloaded,
                ));
            }
            Err(PartError::Changed) if restarts < MAX_OBJECT_RESTARTS => {
                restarts += 1;
                Stats::add(&ctx.stats.object_restarts, 1);
                tracing::warn!(key = %entry.key, "object changed on the server during the download; starting it again");
                let (fresh, fresh_modified) = head(&ctx.client, &ctx.bucket, &entry.key)
                    .await
                    .map_err(|err| err.to_string())?;
                object = Arc::new(fresh);
                modified = fresh_modified;
            }
            Err(PartError::Changed) => {
                return Err(format!(
                    "the object kept changing on the server ({} restarts)",
                    MAX_OBJECT_RESTARTS
                ))
            }
            Err(err) => return Err(err.to_string()),
        }
    }
}

/// `Some(hash if known)` when the final file already matches the listing (size and mtime).
fn up_to_date(
    dest: &Dest,
    rel: &RelPath,
    entry: &ObjectEntry,
) -> std::io::Result<Option<Option<String>>> {
    let Some(modified) = entry.last_modified else {
        return Ok(None);
    };
    let Some((stat, dir)) = dest.stat_final(rel)? else {
        return Ok(None);
    };
    if stat.size != entry.size || stat.modified != modified {
        return Ok(None);
    }
    Ok(Some(dest::hash_xattr_at(&dir, rel.file_name())))
}

async fn download(
    ctx: &Arc<Ctx>,
    object: Arc<PinnedObject>,
    rel: &RelPath,
    modified: Option<SystemTime>,
) -> Result<blake3::Hash, PartError> {
    let (dir, file) = {
        let (dest, rel, size, direct) = (ctx.dest.clone(), rel.clone(), object.size, ctx.direct_io);
        blocking(move || {
            let (dir, file) = dest
                .create_partial(&rel, direct)
                .map_err(|e| (format!("creating {rel}"), e))?;
            dest::preallocate(&file, size)
                .map_err(|e| (format!("reserving {size} bytes for {rel}"), e))?;
            Ok((dir, file))
        })
        .await?
    };
    let file = Arc::new(file);
    match fetch_all_parts(ctx, &object, &file).await {
        Ok(hash) => {
            let (size, direct) = (object.size, ctx.direct_io);
            blocking(move || {
                finish_file(&file, size, direct, modified, &hash)
                    .map_err(|e| (format!("finishing {size}-byte file"), e))
            })
            .await?;
            Ok(hash)
        }
        Err(err) => {
            let partial = rel.partial_name();
            let _ = blocking(move || {
                dest::unlink_at(
                    &dir,
                    &dest::cstring(&partial).map_err(|e| (String::new(), e))?,
                )
                .map_err(|e| (String::new(), e))
            })
            .await;
            Err(err)
        }
    }
}

async fn fetch_all_parts(
    ctx: &Arc<Ctx>,
    object: &Arc<PinnedObject>,
    file: &Arc<File>,
) -> Result<blake3::Hash, PartError> {
    if object.size == 0 {
        return Ok(blake3::hash(b""));
    }
    let ranges: Vec<_> = part_ranges(object.size, ctx.part_size).collect();
    let whole_object = ranges.len() == 1;
    let mut parts = JoinSet::new();
    for (index, range) in ranges.iter().cloned().enumerate() {
        let target = PartTarget {
            file: file.clone(),
            pad_tail: ctx.direct_io && range.end == object.size,
            range,
            whole_object,
        };
        let (ctx, object) = (ctx.clone(), object.clone());
        parts.spawn(async move { (index, fetch_part(ctx, object, target).await) });
    }
    let mut digests: Vec<Option<PartDigest>> = vec![None; ranges.len()];
    while let Some(joined) = parts.join_next().await {
        let (index, result) =
            joined.map_err(|err| PartError::Fatal(format!("part task failed: {err}")))?;
        match result {
            Ok(digest) => digests[index] = Some(digest),
            Err(err) => {
                parts.abort_all();
                return Err(err);
            }
        }
    }
    let digests: Vec<PartDigest> = digests
        .into_iter()
        .map(|d| d.expect("every part joined"))
        .collect();
    Ok(merge_parts(&digests, object.size, ctx.part_size))
}

fn finish_file(
    file: &File,
    size: u64,
    direct_io: bool,
    modified: Option<SystemTime>,
    hash: &blake3::Hash,
) -> std::io::Result<()> {
    if direct_io {
        file.set_len(size)?; // drop the O_DIRECT padding of the last block
    }
    if let Some(modified) = modified {
        file.set_modified(modified)?;
    }
    dest::set_hash_xattr(file, hash)
}

/// Runs filesystem work off the async threads; an error becomes fatal for the object.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, (String, std::io::Error)> + Send + 'static,
) -> Result<T, PartError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| PartError::Fatal(format!("filesystem task failed: {err}")))?
        .map_err(|(what, err)| {
            PartError::Fatal(if what.is_empty() {
                err.to_string()
            } else {
                format!("{what}: {err}")
            })
        })
}
