//! One part: a ranged GET streamed into pooled buffers while BLAKE3 hashes it, retried with
//! backoff when the body breaks (the SDK retries only up to the response headers).

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;

use super::context::Ctx;
use super::priority::Priority;
use super::retry::PART_RETRY;
use super::stats::Stats;
use crate::error::{BodyError, BoxError, PartError, WriteError};
use crate::hash::{PartDigest, PartHasher};
use crate::source::checksum::Algorithm;
use crate::source::client::STALL_GRACE;
use crate::source::errors::describe_chain;
use crate::source::fetch::{get_range, PinnedObject};
use crate::write::buffer::PooledBuf;
use crate::write::dest;
use crate::write::WriteJob;

/// Attempts per part for errors the SDK does not retry (body truncation, stall, reset).
pub(super) const MAX_PART_ATTEMPTS: u32 = 6;
/// A part body slower than this (bytes per second of waiting on the network), once
/// [`SLOW_BODY_GRACE`] of waiting has passed, is abandoned and retried: a slow-loris body
/// passes the SDK's stalled-stream check, which needs only 1 byte per second.
const MIN_BODY_RATE: u64 = 64 << 10;
const SLOW_BODY_GRACE: Duration = Duration::from_secs(10);

/// A part's BLAKE3 digest, and its CRC when the object has a full-object checksum to meet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FetchedPart {
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

/// Where a part's bytes go.
pub(crate) enum Sink {
    /// To the writer threads, at their offsets in this file, as each buffer fills.
    File(Arc<File>),
    /// Kept in memory for the caller to write: a whole object that fits one pooled buffer.
    Memory,
}

/// Where a part goes.
pub(crate) struct PartTarget {
    pub sink: Sink,
    pub range: Range<u64>,
    /// The part is the whole object (its hash is the root hash).
    pub whole_object: bool,
    /// Pad the last buffer to the O_DIRECT alignment (last part of a file under --direct-io).
    pub pad_tail: bool,
    /// CRC the part with this algorithm (to check the object's full-object checksum).
    pub crc: Option<Algorithm>,
}

/// Fetches, hashes and writes one part. Holds a request slot throughout.
pub(crate) async fn fetch_part(
    ctx: Arc<Ctx>,
    object: Arc<PinnedObject>,
    target: PartTarget,
) -> Result<FetchedPart, PartError> {
    fetch(&ctx, &object, &target).await.map(|(part, _)| part)
}

/// Fetches and hashes a whole, non-empty object into the one buffer it fits; the caller
/// writes it.
pub(crate) async fn fetch_into_memory(
    ctx: &Ctx,
    object: &PinnedObject,
    pad_tail: bool,
) -> Result<(FetchedPart, PooledBuf), PartError> {
    let target = PartTarget {
        sink: Sink::Memory,
        range: 0..object.size,
        whole_object: true,
        pad_tail,
        crc: None,
    };
    let (part, kept) = fetch(ctx, object, &target).await?;
    Ok((part, kept.expect("a non-empty object fills a buffer")))
}

/// Fetches and hashes one part into `target`'s sink; returns the buffer a memory sink kept.
///
/// A body that breaks is not fetched again from its start: the next attempt asks for the rest of
/// the range and streams on into the same hashes. A part that is a whole object starts again
/// instead, so that its GET stays the plain one whose checksum the client checks, and so does a
/// part whose body broke after its last byte.
async fn fetch(
    ctx: &Ctx,
    object: &PinnedObject,
    target: &PartTarget,
) -> Result<(FetchedPart, Option<PooledBuf>), PartError> {
    let stats = &ctx.fetch.stats;
    let slots = &ctx.fetch.request_slots;
    let asked = Instant::now();
    let len = target.range.end - target.range.start;
    let (_slot, priority) = match ctx.write.schedule.as_deref() {
        // A sync: no reader waits for anything, the slots go in arrival order.
        None => (slots.acquire_in_turn(len).await, Priority::Background),
        Some(schedule) => {
            let (key, part) = (&object.key, &target.range);
            let priority = Priority::of(schedule, key, part);
            slots
                .acquire(len, priority, schedule.wanted(key, part))
                .await
        }
    };
    if slots.limit() >= slots.max() {
        Stats::add_since(&stats.slot_wait_nanos, asked);
    }
    let held = Instant::now();
    let mut stream = PartStream::new(target);
    let mut attempt = 0;
    let result = loop {
        match stream.fetch_rest(ctx, object, target, priority).await {
            Ok(()) => break Ok(()),
            Err(err) if err.is_retryable() && attempt + 1 < MAX_PART_ATTEMPTS => {
                Stats::add(&ctx.fetch.stats.part_retries, 1);
                tracing::debug!(key = %object.key, range = ?target.range, "retrying part: {err}");
                // Nothing is left to resume when the body broke after its last byte.
                if target.whole_object || stream.received == target.range.end - target.range.start {
                    stream.wait_writes().await?;
                    stream = PartStream::new(target);
                }
                tokio::time::sleep(PART_RETRY.jittered(attempt)).await;
                attempt += 1;
            }
            Err(err) if err.is_retryable() => {
                break Err(PartError::GaveUp {
                    attempts: MAX_PART_ATTEMPTS,
                    last: Box::new(err),
                })
            }
            Err(err) => break Err(err),
        }
    };
    let finished = stream.finish(ctx, target, result).await;
    Stats::add_since(&stats.request_nanos, held);
    finished
}

/// A part's progress: the bytes accepted so far, hashed and handed to writers (or, for a
/// memory sink, kept).
struct PartStream {
    file: Option<Arc<File>>,
    /// The buffer a memory sink keeps (a whole object fills one buffer at most).
    kept: Option<PooledBuf>,
    sums: PartSums,
    writes: Vec<oneshot::Receiver<std::io::Result<()>>>,
    /// Bytes of the part accepted so far (a resumed GET asks for the rest).
    received: u64,
    /// File offset of the buffer being filled.
    offset: u64,
    /// Taken from the pool once the response's head has come (the body is read straight into
    /// it), and handed on as soon as it is full: a part never holds a full buffer while waiting
    /// for an empty one (that could starve the pool).
    buf: Option<PooledBuf>,
}

impl PartStream {
    fn new(target: &PartTarget) -> Self {
        let file = match &target.sink {
            Sink::File(file) => Some(file.clone()),
            Sink::Memory => None,
        };
        Self {
            file,
            kept: None,
            sums: PartSums {
                blake3: PartHasher::new(target.range.start, target.whole_object),
                crc: target.crc.map(Algorithm::digest),
            },
            writes: Vec::new(),
            received: 0,
            offset: target.range.start,
            buf: None,
        }
    }

    /// GETs what is missing of the part and streams it in, under the caps with `priority`
    /// (a background part under a bandwidth cap becomes wanted when a reader comes to wait
    /// for it: it then streams at the wanted bytes' pace).
    async fn fetch_rest(
        &mut self,
        ctx: &Ctx,
        object: &PinnedObject,
        target: &PartTarget,
        mut priority: Priority,
    ) -> Result<(), PartError> {
        let expected = target.range.end - target.range.start;
        let rest = target.range.start + self.received..target.range.end;
        ctx.fetch.rates.request(priority).await;
        let asked = Instant::now();
        let body = get_range(&*ctx.fetch.source, object, rest).await;
        Stats::add_since(&ctx.fetch.stats.first_byte_nanos, asked);
        let mut body = body?;
        // The rate of this response: time spent waiting for the network only (waiting for a
        // buffer, a slow disk, is not the server's slowness) and the bytes it brought.
        let (mut waited, mut brought) = (Duration::ZERO, 0u64);
        let broke = |received, cause: BoxError| BodyError::Broke {
            key: object.key.clone(),
            received,
            expected,
            detail: describe_chain(&*cause),
            cause,
        };
        loop {
            if self.received == expected {
                // The end must come now: a byte more is a body longer than asked for.
                let mut probe = [0u8; 1];
                return match within_grace(body.read(&mut probe)).await {
                    Ok(0) => Ok(()),
                    Ok(_) => Err(BodyError::Long { expected }.into()),
                    Err(cause) => Err(broke(self.received, cause).into()),
                };
            }
            let filling = match &mut self.buf {
                Some(filling) => filling,
                None => {
                    let asked = Instant::now();
                    let buf = ctx.fetch.pool.acquire_for(target.range.end - self.offset);
                    let buf = buf.await;
                    Stats::add_since(&ctx.fetch.stats.buffer_wait_nanos, asked);
                    self.buf.insert(buf)
                }
            };
            // Never past the part's end: a longer body is caught by the probe above, and the
            // buffer keeps only bytes of the part (a retry resumes after them).
            let most = (expected - self.received) as usize;
            let asked = Instant::now();
            let read = within_grace(filling.read_from(&mut body, most)).await;
            waited += asked.elapsed();
            let n = match read {
                Ok(0) => {
                    return Err(BodyError::Short {
                        key: object.key.clone(),
                        received: self.received,
                        expected,
                    }
                    .into())
                }
                Ok(n) => n as u64,
                Err(cause) => return Err(broke(self.received, cause).into()),
            };
            Stats::add(&ctx.fetch.stats.bytes_received, n);
            ctx.fetch.request_slots.record_received(n);
            if priority == Priority::Background && ctx.fetch.rates.bandwidth.is_some() {
                if let Some(schedule) = ctx.write.schedule.as_deref() {
                    priority = Priority::of(schedule, &object.key, &target.range);
                }
            }
            ctx.fetch.rates.bytes(n, priority).await;
            self.received += n;
            brought += n;
            if waited > SLOW_BODY_GRACE && brought < MIN_BODY_RATE * waited.as_secs() {
                return Err(BodyError::TooSlow {
                    key: object.key.clone(),
                    received: brought,
                    seconds: waited.as_secs_f64(),
                }
                .into());
            }
            if filling.is_full() {
                let full = self.buf.take().expect("just filled");
                self.submit(ctx, full, false);
            }
        }
    }

    /// Hashes `buf` and hands it to a writer, or keeps it for a memory sink.
    fn submit(&mut self, ctx: &Ctx, mut buf: PooledBuf, pad: bool) {
        self.sums.update(buf.as_slice());
        let len = buf.len() as u64;
        if pad {
            buf.pad_for_direct_io();
        }
        self.offset += len;
        let Some(file) = &self.file else {
            assert!(self.kept.is_none(), "a memory sink fills one buffer");
            self.kept = Some(buf);
            return;
        };
        let (done, wait) = oneshot::channel();
        ctx.write.writers.writer.submit(WriteJob {
            file: file.clone(),
            offset: self.offset - len,
            buf,
            done,
        });
        self.writes.push(wait);
    }

    /// Writes the last buffer of a complete part, waits for all its writes (also after a
    /// failure, so no stale write lands after a retry's) and returns its sums, with the buffer
    /// a memory sink kept.
    async fn finish(
        mut self,
        ctx: &Ctx,
        target: &PartTarget,
        result: Result<(), PartError>,
    ) -> Result<(FetchedPart, Option<PooledBuf>), PartError> {
        if let (Ok(()), Some(last)) = (&result, self.buf.take()) {
            self.submit(ctx, last, target.pad_tail);
        }
        self.wait_writes().await?;
        result.map(|()| (self.sums.finish(), self.kept.take()))
    }

    /// Waits for the writes handed on so far; a write error is fatal for the object.
    async fn wait_writes(&mut self) -> Result<(), WriteError> {
        let mut write_error = None;
        for wait in self.writes.drain(..) {
            let failed = match wait.await {
                Ok(Ok(())) => continue,
                Ok(Err(err)) => {
                    dest::write_error(err, self.file.as_ref().expect("writes go to a file"))
                }
                Err(_) => WriteError::WriterStopped,
            };
            write_error.get_or_insert(failed);
        }
        write_error.map_or(Ok(()), Err)
    }
}

/// A read of a body, failed as stalled when no bytes come for the stall grace.
async fn within_grace(
    read: impl std::future::Future<Output = std::io::Result<usize>>,
) -> Result<usize, BoxError> {
    match tokio::time::timeout(STALL_GRACE, read).await {
        Ok(read) => Ok(read?),
        Err(_) => Err(format!("no bytes for {STALL_GRACE:?}: the body stalled").into()),
    }
}
