//! The listing's read-ahead: the listing is drained as fast as the store answers, spooled to an
//! unlinked file in the state directory, and handed to the run from there at the pace objects
//! start. Two things need the listing ahead of the downloads:
//! - **totals**: progress shows a percentage and an ETA once the selection's size is known,
//!   long before its last object starts (`Stats::ahead_*`);
//! - **room**: what the selection still needs (its bytes less what DEST already holds, as the
//!   manifest records it) is compared with the free space of DEST's filesystem after every
//!   batch of listed objects, and the run stops with one line as soon as the known remainder
//!   cannot fit. Nothing is handed to the run before the first comparison, so a selection that
//!   does not fit from its first page is refused before its first GET.
//!
//! Memory stays flat whatever the object count: the spool is on disk, and the queues on each
//! side of it hold a few pages. The spool is written and read by two threads of its own
//! (`blocking_recv`/`blocking_send` on the run's queues): plain file I/O, no runtime worker
//! blocked. Should the spool itself fail (a full disk), the read-ahead hands the rest of the
//! listing straight through, as if it had none: slower to learn the totals, never wrong.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::executor::block_on;
use tokio::sync::mpsc;

use super::stats::Stats;
use crate::error::{ListingError, NoSpace, SyncError};
use crate::fs::{Dir, OFlags};
use crate::manifest::base::Cursor;
use crate::manifest::ObjectState;
use crate::plan::filter::KeyFilter;
use crate::plan::keys::{plan_key, KeyPlan};
use crate::source::list::{Listing, ObjectEntry};

/// Listed objects spooled before the free space is compared again.
const BATCH: usize = 1000;
/// Objects queued between the spool and the run.
const QUEUE: usize = 1024;
/// Objects handed to the run's queue at once.
const HANDOVER: usize = QUEUE / 4;
/// How long the read-ahead waits for the rest of a page once its first object is in.
const COALESCE: Duration = Duration::from_millis(2);
const SPOOL: &str = "listing-ahead.spool";

/// What the read-ahead needs besides the listing.
pub(crate) struct Ahead {
    pub filter: KeyFilter,
    pub prefix: String,
    /// The manifest's base, read in step with the listing: what DEST already holds.
    pub known: Cursor,
    /// The state directory, where the spool lives (unlinked), on DEST's filesystem.
    pub state_dir: Dir,
    /// DEST as given, for the message.
    pub dest: PathBuf,
    pub stats: Arc<Stats>,
}

/// Starts the read-ahead of `listing` and returns the queue the run reads instead.
pub(crate) fn spawn(listing: Listing, ahead: Ahead) -> io::Result<Listing> {
    let file = ahead
        .state_dir
        .open_file(SPOOL, OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC)?;
    ahead.state_dir.unlink(SPOOL)?;
    let file = Arc::new(file);
    let shared = Arc::new(Shared::default());
    let (tx, rx) = mpsc::channel(QUEUE);
    let reader = Reader {
        spool: BufReader::with_capacity(256 << 10, Window::new(file.clone())),
        shared: shared.clone(),
        tx: tx.clone(),
    };
    // A queue that just closes is a complete listing: a panic on either side ends it with an
    // error instead.
    let failed = || {
        SyncError::from(ListingError::Spool(io::Error::other(
            "the read-ahead failed",
        )))
    };
    let reader_tx = tx.clone();
    std::thread::Builder::new()
        .name("listing-spool-out".into())
        .spawn(move || {
            if catch_unwind(AssertUnwindSafe(|| reader.run())).is_err() {
                let _ = reader_tx.blocking_send(Err(failed()));
            }
        })?;
    let writer_shared = shared.clone();
    let writer = Writer {
        spool: Some(BufWriter::with_capacity(
            256 << 10,
            file.as_ref().try_clone()?,
        )),
        written: 0,
        shared,
        tx,
        ahead,
        needed: 0,
    };
    std::thread::Builder::new()
        .name("listing-spool-in".into())
        .spawn(move || {
            if catch_unwind(AssertUnwindSafe(|| writer.run(listing))).is_err() {
                let mut state = writer_shared
                    .state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                state.fatal = Some(failed());
                drop(state);
                writer_shared.changed.notify_all();
            }
        })?;
    Ok(rx)
}

/// What the two threads share.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Bytes still needed by the objects handed to the run: they take their room as they are
    /// written, and the free space shows it.
    handed: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Spooled bytes the reader may read: whole records, checked against the free space.
    committed: u64,
    /// The listing ended, completely or with this error.
    ended: Option<Result<(), SyncError>>,
    /// The run must stop: handed over before anything still spooled.
    fatal: Option<SyncError>,
    /// The spool failed: the reader hands over what is committed, then leaves the queue to the
    /// writer.
    passing_through: bool,
    reader_done: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("read-ahead state")
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }
}

struct Writer {
    /// `None` once the spool failed: the listing then passes straight through.
    spool: Option<BufWriter<File>>,
    written: u64,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<ObjectEntry, SyncError>>,
    ahead: Ahead,
    /// Bytes the selection listed so far needs and DEST does not hold.
    needed: u64,
}

impl Writer {
    fn run(mut self, mut listing: Listing) {
        loop {
            let mut items = Vec::with_capacity(BATCH);
            if block_on(listing.recv_many(&mut items, BATCH)) == 0 {
                return self.end(Ok(()));
            }
            if items.len() < BATCH {
                // A page arrives object by object: waiting a moment for the rest of it makes
                // one wake-up, one spool write and one free-space check a page, not an object.
                std::thread::sleep(COALESCE);
                while items.len() < BATCH {
                    match listing.try_recv() {
                        Ok(item) => items.push(item),
                        Err(_) => break,
                    }
                }
            }
            let mut batch = Vec::with_capacity(items.len());
            let mut broke = None;
            for item in items {
                match item {
                    Ok(entry) => {
                        let needed = self.count(&entry);
                        batch.push((entry, needed));
                    }
                    Err(err) => {
                        broke = Some(err);
                        break;
                    }
                }
            }
            if !self.deliver(batch) {
                return; // the run must stop, or stopped reading
            }
            if let Some(err) = broke {
                return self.end(Err(err));
            }
        }
    }

    /// Books one listed object in the totals; returns the bytes it still needs on DEST.
    fn count(&mut self, entry: &ObjectEntry) -> u64 {
        let stats = &self.ahead.stats;
        let selected = match plan_key(&self.ahead.prefix, &entry.key, entry.size) {
            KeyPlan::DirectoryMarker => false,
            // Counted as a failed object of the selection, as the run books it.
            KeyPlan::Refused(_) => true,
            KeyPlan::File(rel) => self.ahead.filter.accepts(rel.as_str()),
        };
        if !selected {
            return 0;
        }
        Stats::add(&stats.ahead_objects, 1);
        Stats::add(&stats.ahead_bytes, entry.size);
        let known = match self.ahead.known.find(&entry.key) {
            Ok(known) => known,
            Err(err) => {
                // The run's own reading of the manifest reports it; here it only costs the
                // estimate its precision.
                tracing::debug!("read-ahead: the manifest: {err}");
                None
            }
        };
        let needed = still_needed(entry, known);
        self.needed += needed;
        needed
    }

    /// Spools a batch and makes it readable, or passes it on once the spool has failed;
    /// `false` once the run must stop or stopped reading.
    fn deliver(&mut self, batch: Vec<(ObjectEntry, u64)>) -> bool {
        if let Some(spool) = &mut self.spool {
            match spool_batch(spool, &batch) {
                Ok(len) => {
                    self.written += len;
                    return self.commit();
                }
                Err(err) => {
                    tracing::warn!(
                        "the listing's read-ahead cannot spool ({err}): the run takes the listing as it comes"
                    );
                    self.spool = None;
                    // What this batch spooled is not committed, so the reader never sees it:
                    // once it has handed over the rest, the batch goes on from here, in order.
                    self.shared.update(|state| state.passing_through = true);
                    let mut state = self.shared.lock();
                    while !state.reader_done {
                        state = self.shared.changed.wait(state).expect("read-ahead state");
                    }
                }
            }
        }
        if let Some(no_room) = self.no_room() {
            let _ = self.tx.blocking_send(Err(no_room.into()));
            return false;
        }
        for (entry, needed) in batch {
            self.shared.handed.fetch_add(needed, Relaxed);
            if self.tx.blocking_send(Ok(entry)).is_err() {
                return false;
            }
        }
        true
    }

    /// Makes what was spooled readable once the free space was found to hold what the
    /// selection still needs; `false` once the run must stop or stopped reading.
    fn commit(&mut self) -> bool {
        let no_room = self.no_room();
        let stop = no_room.is_some();
        let written = self.written;
        let mut reader_done = false;
        self.shared.update(|state| {
            reader_done = state.reader_done;
            match no_room {
                Some(no_room) => state.fatal = Some(no_room.into()),
                None => state.committed = written,
            }
        });
        !stop && !reader_done
    }

    /// What the selection still needs, when the free space cannot hold it.
    fn no_room(&self) -> Option<NoSpace> {
        let needs = self.needed.saturating_sub(self.shared.handed.load(Relaxed));
        if needs == 0 {
            return None;
        }
        let free = match crate::fs::free_bytes(&self.ahead.state_dir) {
            Ok(free) => free,
            Err(err) => {
                tracing::debug!("read-ahead: the free space of DEST: {err}");
                return None;
            }
        };
        (needs > free).then(|| NoSpace::Needs {
            needs,
            free,
            mount: mount_point(&self.ahead.dest),
        })
    }

    fn end(self, ended: Result<(), SyncError>) {
        self.ahead.stats.ahead_done.store(ended.is_ok(), Relaxed);
        match (&self.spool, ended) {
            (Some(_), ended) => self.shared.update(|state| state.ended = Some(ended)),
            (None, Err(err)) => {
                let _ = self.tx.blocking_send(Err(err));
            }
            (None, Ok(())) => {}
        }
    }
}

/// Appends a batch of records to the spool and flushes it; returns the bytes written.
fn spool_batch(spool: &mut BufWriter<File>, batch: &[(ObjectEntry, u64)]) -> io::Result<u64> {
    let mut len = 0;
    for (entry, needed) in batch {
        len += encode(spool, entry, *needed)?;
    }
    spool.flush()?;
    Ok(len)
}

struct Reader {
    spool: BufReader<Window>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<ObjectEntry, SyncError>>,
}

impl Reader {
    fn run(mut self) {
        loop {
            let next = {
                let mut state = self.shared.lock();
                loop {
                    if let Some(fatal) = state.fatal.take() {
                        break Next::Stop(Err(fatal));
                    }
                    if state.committed > self.spool.get_ref().limit {
                        break Next::Read(state.committed);
                    }
                    if let Some(ended) = state.ended.take() {
                        break Next::Stop(ended);
                    }
                    if state.passing_through {
                        break Next::Stop(Ok(()));
                    }
                    state = self.shared.changed.wait(state).expect("read-ahead state");
                }
            };
            match next {
                Next::Read(committed) => {
                    self.spool.get_mut().limit = committed;
                    if !self.hand_over() {
                        return self.done();
                    }
                }
                Next::Stop(Ok(())) => return self.done(),
                Next::Stop(Err(err)) => {
                    let _ = self.tx.blocking_send(Err(err));
                    return self.done();
                }
            }
        }
    }

    /// Hands every committed record to the run; `false` once it stopped reading.
    fn hand_over(&mut self) -> bool {
        let mut chunk = Vec::with_capacity(HANDOVER);
        loop {
            while chunk.len() < HANDOVER {
                match decode(&mut self.spool) {
                    Ok(Some(record)) => chunk.push(record),
                    Ok(None) => break,
                    Err(err) => {
                        let broken = ListingError::Spool(err);
                        let _ = self.tx.blocking_send(Err(broken.into()));
                        return false;
                    }
                }
            }
            if chunk.is_empty() {
                return true;
            }
            // Room for the whole chunk at once: the run frees queue places one object at a
            // time, and waking this thread for each would cost more than the object.
            let Ok(places) = block_on(self.tx.reserve_many(chunk.len())) else {
                return false;
            };
            for (place, (entry, needed)) in places.zip(chunk.drain(..)) {
                self.shared.handed.fetch_add(needed, Relaxed);
                place.send(Ok(entry));
            }
        }
    }

    fn done(self) {
        self.shared.update(|state| state.reader_done = true);
    }
}

enum Next {
    /// Committed bytes up to here are readable.
    Read(u64),
    Stop(Result<(), SyncError>),
}

/// The spool as far as it is committed, read through a position of its own (the writer
/// appends through another descriptor of the same file).
struct Window {
    file: Arc<File>,
    read: u64,
    limit: u64,
}

impl Window {
    fn new(file: Arc<File>) -> Self {
        Self {
            file,
            read: 0,
            limit: 0,
        }
    }
}

impl Read for Window {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.limit.saturating_sub(self.read);
        let len = buf.len().min(left as usize);
        if len == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..len], self.read)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Bytes `entry` still needs on DEST, from what the manifest `known` says DEST holds: none for
/// a complete file of the same version, what its durable parts do not cover for a resumable
/// download, all of it otherwise (a new version is written beside the old file until it
/// replaces it).
fn still_needed(entry: &ObjectEntry, known: Option<&ObjectState>) -> u64 {
    match known {
        Some(known) if known.etag == entry.etag && known.size == entry.size => {
            match known.complete {
                Some(_) => 0,
                None => {
                    let durable = known.parts.len() as u64 * known.part_size;
                    entry.size.saturating_sub(durable)
                }
            }
        }
        _ => entry.size,
    }
}

/// The mount point of the filesystem holding `path` (or its nearest existing ancestor): where
/// an operator looks for the space. `path` itself when it cannot be told.
pub(crate) fn mount_point(path: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.ancestors().filter_map(|dir| {
        let meta = std::fs::metadata(dir).ok()?;
        Some((dir, meta.dev()))
    });
    let Some((mut top, dev)) = existing.next() else {
        return path.to_path_buf();
    };
    for (dir, dir_dev) in existing {
        if dir_dev != dev {
            break;
        }
        top = dir;
    }
    top.to_path_buf()
}

/// Appends one record; returns its length.
fn encode(out: &mut impl Write, entry: &ObjectEntry, needed: u64) -> io::Result<u64> {
    let mut len = 0u64;
    let mut put = |bytes: &[u8]| -> io::Result<()> {
        len += bytes.len() as u64;
        out.write_all(bytes)
    };
    let text = |put: &mut dyn FnMut(&[u8]) -> io::Result<()>, s: &str| -> io::Result<()> {
        put(&(s.len() as u32).to_le_bytes())?;
        put(s.as_bytes())
    };
    text(&mut put, &entry.key)?;
    put(&entry.size.to_le_bytes())?;
    put(&needed.to_le_bytes())?;
    text(&mut put, &entry.etag)?;
    let modified = entry.last_modified.map(since_epoch);
    let flags = u8::from(modified.is_some())
        | u8::from(entry.version_id.is_some()) << 1
        | u8::from(entry.sealed.is_some()) << 2;
    put(&[flags])?;
    if let Some(nanos) = modified {
        put(&nanos.to_le_bytes())?;
    }
    if let Some(version) = &entry.version_id {
        text(&mut put, version)?;
    }
    if let Some(sealed) = &entry.sealed {
        put(sealed)?;
    }
    Ok(len)
}

/// Reads one record; `None` at the end of what is committed.
fn decode(input: &mut impl BufRead) -> io::Result<Option<(ObjectEntry, u64)>> {
    if input.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let key = read_text(input)?;
    let size = read_u64(input)?;
    let needed = read_u64(input)?;
    let etag = read_text(input)?;
    let mut flags = [0u8];
    input.read_exact(&mut flags)?;
    let last_modified = match flags[0] & 1 {
        0 => None,
        _ => Some(from_epoch(read_i128(input)?)),
    };
    let version_id = match flags[0] & 2 {
        0 => None,
        _ => Some(read_text(input)?),
    };
    let sealed = match flags[0] & 4 {
        0 => None,
        _ => {
            let mut hash = [0u8; 32];
            input.read_exact(&mut hash)?;
            Some(hash)
        }
    };
    let entry = ObjectEntry {
        key,
        size,
        etag,
        last_modified,
        version_id,
        sealed,
    };
    Ok(Some((entry, needed)))
}

fn read_u64(input: &mut impl Read) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    input.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_i128(input: &mut impl Read) -> io::Result<i128> {
    let mut bytes = [0u8; 16];
    input.read_exact(&mut bytes)?;
    Ok(i128::from_le_bytes(bytes))
}

fn read_text(input: &mut impl Read) -> io::Result<String> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let mut bytes = vec![0u8; u32::from_le_bytes(len) as usize];
    input.read_exact(&mut bytes)?;
    String::from_utf8(bytes).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
}

/// Nanoseconds since the epoch, negative before it.
fn since_epoch(time: SystemTime) -> i128 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}

fn from_epoch(nanos: i128) -> SystemTime {
    let magnitude = Duration::from_nanos_u128(nanos.unsigned_abs());
    match nanos >= 0 {
        true => UNIX_EPOCH + magnitude,
        false => UNIX_EPOCH - magnitude,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Completed;

    fn entry(key: &str, size: u64) -> ObjectEntry {
        ObjectEntry {
            key: key.into(),
            size,
            etag: format!("\"{key}\""),
            last_modified: None,
            version_id: None,
            sealed: None,
        }
    }

    #[test]
    fn records_read_back_as_written() {
        let before_epoch = UNIX_EPOCH - Duration::from_nanos(1_500_000_001);
        let entries = [
            ObjectEntry {
                last_modified: Some(UNIX_EPOCH + Duration::from_nanos(1_765_000_000_123_456_789)),
                version_id: Some("v1".into()),
                sealed: Some([7; 32]),
                ..entry("a/b", 5)
            },
            ObjectEntry {
                last_modified: Some(before_epoch),
                ..entry("ünïcode", 0)
            },
        ];
        let mut spool = Vec::new();
        for (needed, e) in entries.iter().enumerate() {
            encode(&mut spool, e, needed as u64).unwrap();
        }
        let mut input = io::Cursor::new(spool);
        for (needed, e) in entries.iter().enumerate() {
            let (back, back_needed) = decode(&mut input).unwrap().unwrap();
            assert_eq!(back_needed, needed as u64);
            assert_eq!(
                (
                    &back.key,
                    back.size,
                    &back.etag,
                    back.last_modified,
                    &back.version_id,
                    back.sealed
                ),
                (
                    &e.key,
                    e.size,
                    &e.etag,
                    e.last_modified,
                    &e.version_id,
                    e.sealed
                )
            );
        }
        assert!(decode(&mut input).unwrap().is_none());
    }

    #[test]
    fn what_dest_holds_is_not_needed_again() {
        let listed = entry("k", 10 << 20);
        let mut known = ObjectState {
            path: "k".into(),
            size: 10 << 20,
            etag: listed.etag.clone(),
            last_modified_ns: None,
            part_size: 4 << 20,
            attempt: 1,
            parts: Default::default(),
            complete: None,
        };
        assert_eq!(still_needed(&listed, None), 10 << 20);
        assert_eq!(still_needed(&listed, Some(&known)), 10 << 20);
        known.parts.insert(
            0,
            crate::manifest::DurablePart {
                cv: [0; 32],
                crc: None,
            },
        );
        assert_eq!(
            still_needed(&listed, Some(&known)),
            6 << 20,
            "one durable part"
        );
        known.complete = Some(Completed {
            blake3: [0; 32],
            inode: 1,
            mtime_ns: 0,
        });
        assert_eq!(still_needed(&listed, Some(&known)), 0);
        known.etag = "\"other\"".into();
        assert_eq!(
            still_needed(&listed, Some(&known)),
            10 << 20,
            "a new version"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_listing_comes_through_in_order_and_is_counted_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = Dir::open(dir.path()).unwrap();
        let stats = Arc::new(Stats::default());
        let (tx, listing) = mpsc::channel(16);
        let ahead = Ahead {
            filter: KeyFilter::new(&[], &["*.skip".into()]).unwrap(),
            prefix: String::new(),
            known: Cursor::new(None),
            state_dir,
            dest: dir.path().to_path_buf(),
            stats: stats.clone(),
        };
        let mut out = spawn(listing, ahead).unwrap();
        let count = 5000u64;
        tokio::spawn(async move {
            for i in 0..count {
                let key = match i % 10 {
                    0 => format!("k{i:05}.skip"),
                    _ => format!("k{i:05}"),
                };
                tx.send(Ok(entry(&key, i))).await.unwrap();
            }
        });
        // The whole listing is counted before the run takes a single object.
        while !stats.ahead_done.load(Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(Stats::get(&stats.ahead_objects), count - count / 10);
        let expected: u64 = (0..count).filter(|i| i % 10 != 0).sum();
        assert_eq!(Stats::get(&stats.ahead_bytes), expected);
        let mut seen = 0;
        while let Some(item) = out.recv().await {
            let item = item.unwrap();
            assert_eq!(item.size, seen, "in listing order");
            seen += 1;
        }
        assert_eq!(seen, count);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_listing_ends_the_queue_with_its_error_after_what_was_listed() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(Stats::default());
        let (tx, listing) = mpsc::channel(16);
        let ahead = Ahead {
            filter: KeyFilter::new(&[], &[]).unwrap(),
            prefix: String::new(),
            known: Cursor::new(None),
            state_dir: Dir::open(dir.path()).unwrap(),
            dest: dir.path().to_path_buf(),
            stats: stats.clone(),
        };
        let mut out = spawn(listing, ahead).unwrap();
        tx.send(Ok(entry("a", 1))).await.unwrap();
        tx.send(Err(SyncError::Stopped)).await.unwrap();
        drop(tx);
        assert_eq!(out.recv().await.unwrap().unwrap().key, "a");
        assert!(matches!(out.recv().await, Some(Err(SyncError::Stopped))));
        assert!(out.recv().await.is_none());
        assert!(
            !stats.ahead_done.load(Relaxed),
            "an incomplete listing is not final"
        );
    }
}
