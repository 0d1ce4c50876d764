//! One part: a ranged GET streamed into pooled buffers while BLAKE3 hashes it, retried with
//! backoff when the body breaks (the SDK retries only up to the response headers).

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::retry::backoff;
use super::run::Ctx;
use super::stats::Stats;
use crate::config::{MAX_PART_ATTEMPTS, MIN_BODY_RATE, SLOW_BODY_GRACE};
use crate::error::PartError;
use crate::hash::{PartDigest, PartHasher};
use crate::source::checksum::Algorithm;
use crate::source::errors::describe_chain;
use crate::source::fetch::{get_range, PinnedObject};
use crate::write::buffer::PooledBuf;
use crate::write::dest;
use crate::write::WriteJob;

/// A part's BLAKE3 digest, and its CRC when the object has a full-object checksum to meet.
#[derive(Clone, Copy, Debug)]
pub struct FetchedPart {
    pub digest: PartDigest,
    pub crc: Option<u64>,
}

/// The sums a part's bytes go through as they stream in.
struct PartSums {
    blake3: PartHasher,
    crc: Option<crc_fast::Digest>,
}

impl PartSums {
    fn update(&mut self, bytes: &[u8]) {
        self.blake3.update(bytes);
        if let Some(crc) = &mut self.crc {
            crc.update(bytes);
        }
    }

    fn finish(&self) -> FetchedPart {
        FetchedPart {
            digest: self.blake3.finish(),
            crc: self.crc.as_ref().map(|c| c.finalize()),
        }
    }
}

/// Where a part goes.
pub struct PartTarget {
    pub file: Arc<File>,
    pub range: Range<u64>,
    /// The part is the whole object (its hash is the root hash).
    pub whole_object: bool,
    /// Pad the last buffer to the O_DIRECT alignment (last part of a file under --direct-io).
    pub pad_tail: bool,
    /// CRC the part with this algorithm (to check the object's full-object checksum).
    pub crc: Option<Algorithm>,
}

/// Fetches, hashes and writes one part, retrying broken bodies. Holds a request slot throughout.
pub async fn fetch_part(
    ctx: Arc<Ctx>,
    object: Arc<PinnedObject>,
    target: PartTarget,
) -> Result<FetchedPart, PartError> {
    let _slot = ctx.request_slots.acquire().await;
    let mut attempt = 0;
    loop {
        match try_part(&ctx, &object, &target).await {
            Err(PartError::Retryable(why)) if attempt + 1 < MAX_PART_ATTEMPTS => {
                Stats::add(&ctx.stats.part_retries, 1);
                tracing::debug!(key = %object.key, range = ?target.range, "retrying part: {why}");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            Err(PartError::Retryable(why)) => {
                return Err(PartError::Retryable(format!(
                    "{why} (gave up after {MAX_PART_ATTEMPTS} attempts)"
                )))
            }
            result => return result,
        }
    }
}

async fn try_part(
    ctx: &Ctx,
    object: &PinnedObject,
    target: &PartTarget,
) -> Result<FetchedPart, PartError> {
    let mut body = get_range(&ctx.client, object, target.range.clone()).await?;
    let expected = target.range.end - target.range.start;
    let mut sums = PartSums {
        blake3: PartHasher::new(target.range.start, target.whole_object),
        crc: target.crc.map(Algorithm::digest),
    };
    let mut writes = Vec::new();
    let mut received = 0u64;
    let mut offset = target.range.start;
    // Taken from the pool only when bytes arrive, and handed on as soon as it is full: a part
    // never holds a full buffer while waiting for an empty one (that could starve the pool).
    let mut buf: Option<PooledBuf> = None;
    // Time spent waiting for the network only: waiting for a buffer (a slow disk) is not the
    // server's slowness.
    let mut waited = Duration::ZERO;
    let streamed = loop {
        let asked = Instant::now();
        let next = body.next().await;
        waited += asked.elapsed();
        let chunk = match next {
            None => break Ok(()),
            Some(Ok(chunk)) => chunk,
            Some(Err(err)) => {
                break Err(PartError::Retryable(format!(
                    "body of {} broke after {received} of {expected} bytes: {}",
                    object.key,
                    describe_chain(&err)
                )))
            }
        };
        received += chunk.len() as u64;
        Stats::add(&ctx.stats.bytes_received, chunk.len() as u64);
        ctx.request_slots.record_received(chunk.len() as u64);
        if received > expected {
            break Err(PartError::Retryable(format!(
                "server sent more than the {expected} bytes asked for"
            )));
        }
        if waited > SLOW_BODY_GRACE && received < MIN_BODY_RATE * waited.as_secs() {
            break Err(PartError::Retryable(format!(
                "body of {} too slow: {received} bytes in {:.0} s",
                object.key,
                waited.as_secs_f64()
            )));
        }
        let mut data = &chunk[..];
        while !data.is_empty() {
            let filling = match &mut buf {
                Some(filling) => filling,
                None => buf.insert(ctx.pool.acquire_for(target.range.end - offset).await),
            };
            data = &data[filling.fill_from(data)..];
            if filling.is_full() {
                let full = buf.take().expect("just filled");
                offset += submit(ctx, target, &mut sums, full, offset, false, &mut writes);
            }
        }
    };
    if streamed.is_ok() && received != expected {
        return finish_writes(
            &target.file,
            writes,
            Err(PartError::Retryable(format!(
                "body of {} ended after {received} of {expected} bytes",
                object.key
            ))),
        )
        .await;
    }
    if let (Ok(()), Some(last)) = (&streamed, buf) {
        submit(
            ctx,
            target,
            &mut sums,
            last,
            offset,
            target.pad_tail,
            &mut writes,
        );
    }
    finish_writes(&target.file, writes, streamed.map(|()| sums.finish())).await
}

/// Hashes `buf` and hands it to a writer; returns the number of data bytes it carries.
fn submit(
    ctx: &Ctx,
    target: &PartTarget,
    sums: &mut PartSums,
    mut buf: PooledBuf,
    offset: u64,
    pad: bool,
    writes: &mut Vec<oneshot::Receiver<std::io::Result<()>>>,
) -> u64 {
    sums.update(buf.as_slice());
    let len = buf.len() as u64;
    if pad {
        buf.pad_for_direct_io();
    }
    let (done, wait) = oneshot::channel();
    ctx.writers.writer.submit(WriteJob {
        file: target.file.clone(),
        offset,
        buf,
        done,
    });
    writes.push(wait);
    len
}

/// Waits for the part's writes (also after a failure, so no stale write lands after a retry's)
/// and turns a write error into a fatal error for the object.
async fn finish_writes<T>(
    file: &File,
    writes: Vec<oneshot::Receiver<std::io::Result<()>>>,
    result: Result<T, PartError>,
) -> Result<T, PartError> {
    let mut write_error = None;
    for wait in writes {
        match wait.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                let why = dest::explain_write_error(&err, file);
                write_error = write_error.or(Some(format!("write failed: {why}")));
            }
            Err(_) => write_error = write_error.or(Some("writer stopped".to_string())),
        }
    }
    match write_error {
        Some(why) => Err(PartError::Fatal(why)),
        None => result,
    }
}
