//! The FUSE side of a lazy view: names and attributes from the [`Tree`], opens that wait for
//! the engine, and reads that go to the local file.
//!
//! Why it is built this way:
//! - An open of a file that is not local asks for it ([`Wants`]: the engine's schedule, or the
//!   node daemon that runs the engine) and is answered from a
//!   tokio task when the engine has written, synced and verified it: the FUSE loop never blocks,
//!   so `readdir`, `stat` and opens of local files go on meanwhile. A file the engine could not
//!   fetch fails its open with EIO.
//! - An opened local file is handed to the kernel as a passthrough backing file (Linux ≥ 6.9,
//!   and CAP_SYS_ADMIN): its reads never come to this process, and run at the local file's
//!   speed. One backing file per inode, held while any handle of it is open, as the kernel
//!   wants, and kept after the last close for the next open of that file (the last
//!   [`IDLE_BACKINGS`] idle ones): an open of a file opened before then costs one round trip
//!   and no syscall here. Where passthrough is refused, reads are served here with `pread`
//!   (said once).
//! - The view may be served by more than one process in its life (the CSI plugin's views are
//!   kept across its restarts, [`super::resume`]): its inode numbers come from the snapshot, a
//!   file handle is never reused by a later process (numbered from the time its process
//!   started), and a read or release of a handle this process did not give out is resolved by
//!   its inode: the local file is opened again, never guessed.
//! - A handle opened while its file downloads reads the partial file, kept open here per inode.
//!   Its bytes have not passed the whole-file checks, so each read is tied to the partial file
//!   it came from: before a kept partial file serves a read, its link count is looked at (the
//!   engine unlinks an attempt it discards, a rejected one included, and renames the one it
//!   publishes), and a discarded one goes, failing with EIO every later read of each handle
//!   that read from it ([`Open::check_partial`]), counted in [`Health`]. A partial file opened by
//!   name serves reads only once the wants, asked again, still name its inode: a later attempt
//!   may have taken the inode number of a discarded one.
//! - The view's own marker, `.hydrator/LAZY` ([`Kind::Memory`]), is opened and read from memory,
//!   never asking [`Wants`]: a trainer's gate on it cannot wait on the hydration.
//! - The view is read-only and never changes while mounted: entries and attributes are cached
//!   by the kernel for a day, file data keeps its page cache between opens, and a close sends
//!   no flush (`FOPEN_NOFLUSH`): while it hydrates, each file costs this process one open and
//!   one release (the open hands over the passthrough backing). Lookups in a directory run in
//!   parallel (`FUSE_PARALLEL_DIROPS`), and directories are opened by the kernel without asking
//!   (`FUSE_NO_OPENDIR_SUPPORT`), their listings cached.
//! - Once the dataset is whole, an open answered ENOSYS tells the kernel to open files by
//!   itself from then on (`FUSE_NO_OPEN_SUPPORT`, [`Shared::settle`]): a file whose pages the
//!   kernel holds is then read with no round trip at all, as a pod that keeps the view after
//!   READY rereads its epochs; a page it lacks is one read here from the local file. The price:
//!   those pages are cached twice (the view's and the local file's), and a file opened after
//!   that needs this process (or a later one of the view) for every page the kernel does not
//!   hold, where a passthrough file reads on from the kernel alone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, Request,
};

use super::backings::BackingJournal;
use super::tree::{FileNode, Kind, Tree};
use crate::engine::schedule::{Schedule, Unavailable};
use crate::engine::streams::{RangeOutcome, RangeWanted, Readable};
use crate::write::dest::Dest;

/// What an open or a read of a file asks: whether its bytes are local, or when they will be.
/// The engine's [`Schedule`] answers in `hydrator mount`; the node daemon answers for the CSI
/// plugin.
pub(crate) trait Wants: Send + Sync + 'static {
    /// `bytes` of `file`: published, written in its partial file (`streams.rs`), or when.
    fn want_range(&self, file: &FileNode, bytes: Range<u64>) -> RangeWanted;

    /// Whether every file of the view is local for good (the dataset is complete).
    fn all_local(&self) -> bool;
}

impl Wants for Schedule {
    fn want_range(&self, file: &FileNode, bytes: Range<u64>) -> RangeWanted {
        Schedule::want_range(self, &file.key, bytes)
    }

    fn all_local(&self) -> bool {
        self.is_complete()
    }
}

/// The view never changes while mounted.
const TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Backing files kept for files no handle has open (each holds an open file in the kernel).
const IDLE_BACKINGS: usize = 4096;
/// Times a read asks again for bytes whose partial file was replaced since it was told.
const MAX_ASKS: u32 = 4;
/// The handle of a file the kernel opened without asking (`FUSE_NO_OPEN_SUPPORT`): never one
/// this process gives out ([`first_handle`] is at least 1).
const UNOPENED: u64 = 0;

pub(crate) struct LazyView {
    shared: Arc<Shared>,
    /// Whether to ask the kernel for passthrough (`--no-passthrough` says no).
    want_passthrough: bool,
}

struct Shared {
    tree: Arc<Tree>,
    wants: Arc<dyn Wants>,
    dest: Dest,
    runtime: tokio::runtime::Handle,
    uid: u32,
    gid: u32,
    passthrough: AtomicBool,
    /// Whether the kernel opens directories without asking (it said so at INIT).
    no_opendir: AtomicBool,
    /// Whether the kernel can open files without asking (it said so at INIT).
    no_open: AtomicBool,
    /// Opens are answered ENOSYS: the dataset is whole, and the kernel opens its files itself.
    settled: AtomicBool,
    next_handle: AtomicU64,
    open: Mutex<Open>,
    /// Keys whose failure was logged by an open (once each).
    told: Mutex<HashSet<String>>,
    /// Where the backings are written down for a later process serving the view.
    journal: OnceLock<BackingJournal>,
    /// Serial of the next partial file opened.
    next_partial: AtomicU64,
    /// What went wrong for the view's readers, for whoever reports its condition.
    health: Health,
}

/// A read refused: its handle read bytes that were discarded unverified.
struct Rejected;

/// What a view's readers met, readable while its session serves it: how many handles it
/// failed because they had read bytes that were then discarded, and the file the last one was
/// of.
#[derive(Clone, Default)]
pub(crate) struct Health(Arc<Mutex<Option<(u64, String)>>>);

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, String)>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many handles read bytes that were then discarded (their reads fail with EIO since),
    /// and the file the last one was of.
    pub(crate) fn rejected(&self) -> Option<(u64, String)> {
        self.lock().clone()
    }

    /// Counts `handles` more, of `key`; the count so far.
    fn add(&self, handles: u64, key: &str) -> u64 {
        let mut rejected = self.lock();
        let total = rejected.as_ref().map_or(0, |(before, _)| *before) + handles;
        *rejected = Some((total, key.to_owned()));
        total
    }
}

#[derive(Default)]
struct Open {
    /// Files read through this process (no passthrough), by handle, with their inode.
    files: HashMap<u64, (u64, Arc<File>)>,
    /// Passthrough backing files by inode, with how many handles use each.
    backing: HashMap<u64, (Arc<BackingId>, usize)>,
    /// Inodes whose backing file lost its last handle, oldest first (an inode may be listed
    /// again after it was reused; only one still idle when its turn comes is dropped).
    idle: VecDeque<u64>,
    /// The inode of each passthrough handle.
    handles: HashMap<u64, u64>,
    /// Each handle opened while its file was downloading (read here, through its partial
    /// file until the file is published).
    streamed: HashMap<u64, Streamed>,
    /// The partial file read by streamed handles, by inode.
    partials: HashMap<u64, PartialFile>,
    /// Inodes some handle of which read bytes that were then discarded: the kernel keeps no
    /// page of theirs across an open (a mapping may have cached the discarded bytes).
    tainted: HashSet<u64>,
    /// Handles read through this process (`files` and `streamed`), by inode. The kernel fails
    /// a passthrough open of an inode that a cached handle uses (a handle read here, or a
    /// streamed one that was mapped), so while one is open the file's opens are served here.
    read_here: HashMap<u64, usize>,
}

/// A handle opened while its file was downloading.
struct Streamed {
    ino: u64,
    /// The partial file (its [`PartialFile::serial`]) whose bytes it was last answered with.
    read_from: Option<u64>,
    /// It read bytes of an attempt that was discarded unverified: every read of it fails.
    rejected: bool,
}

impl Streamed {
    fn of(ino: u64) -> Self {
        Self {
            ino,
            read_from: None,
            rejected: false,
        }
    }
}

/// A partial file open for reading, with the byte runs known written in it.
struct PartialFile {
    file: Arc<File>,
    inode: u64,
    runs: Vec<Range<u64>>,
    /// Which partial file this is, in this process (inode numbers are reused).
    serial: u64,
    /// Whether the wants said, after it was opened, that its inode is still the download's:
    /// the file opened by name is then that download's, not a later one's that took its
    /// inode number.
    confirmed: bool,
}

impl PartialFile {
    fn covers(&self, bytes: &Range<u64>) -> bool {
        self.runs
            .iter()
            .any(|run| run.start <= bytes.start && bytes.end <= run.end)
    }

    /// Whether the engine unlinked it: its download was discarded (its whole-file check
    /// rejected it, or it was given up) and its bytes will never be verified. Published, it
    /// keeps its link under the final name.
    fn discarded(&self) -> bool {
        self.file.metadata().is_ok_and(|meta| meta.nlink() == 0)
    }
}

impl Open {
    /// The backing file kept for `ino`, counted as used by one more handle.
    /// An idle backing is not taken while a handle of `ino` is read here; one in use always
    /// is (the inode is then in passthrough mode, and every open of it must be).
    fn take_kept(&mut self, ino: u64) -> Option<Arc<BackingId>> {
        let read_here = self.read_here.get(&ino).is_some_and(|n| *n > 0);
        let (backing, users) = self.backing.get_mut(&ino)?;
        if *users == 0 && read_here {
            return None;
        }
        *users += 1;
        Some(backing.clone())
    }

    /// One more handle of `ino` is read through this process, until its release.
    fn read_here(&mut self, ino: u64) {
        *self.read_here.entry(ino).or_default() += 1;
    }

    /// The partial file kept for `ino`, unless it was discarded: then it goes, every handle
    /// that read from it is rejected, and how many were is returned.
    fn check_partial(&mut self, ino: u64) -> (Option<&mut PartialFile>, u64) {
        if !self.partials.get(&ino).is_some_and(PartialFile::discarded) {
            return (self.partials.get_mut(&ino), 0);
        }
        let rejected = match self.partials.remove(&ino) {
            Some(partial) => self.reject_readers(ino, partial.serial),
            None => 0,
        };
        (None, rejected)
    }

    /// Keeps `partial` for `ino`: the one it replaces is another attempt's, which will never be
    /// published, so the handles that read from it are rejected (how many is returned).
    fn replace_partial(&mut self, ino: u64, partial: PartialFile) -> u64 {
        let Some(serial) = self.partials.insert(ino, partial).map(|old| old.serial) else {
            return 0;
        };
        self.reject_readers(ino, serial)
    }

    /// Rejects the handles of `ino` that read from partial file `serial`; how many were.
    fn reject_readers(&mut self, ino: u64, serial: u64) -> u64 {
        let mut rejected = 0;
        for handle in self.streamed.values_mut() {
            if handle.read_from == Some(serial) && !handle.rejected {
                handle.rejected = true;
                rejected += 1;
            }
        }
        if rejected > 0 {
            self.tainted.insert(ino);
        }
        rejected
    }

    /// Whether handle `fh` read bytes that were discarded.
    fn is_rejected(&self, fh: u64) -> bool {
        self.streamed.get(&fh).is_some_and(|handle| handle.rejected)
    }

    /// Handle `fh` is answered with the bytes of partial file `serial`.
    fn reads_from(&mut self, fh: u64, serial: u64) {
        if let Some(handle) = self.streamed.get_mut(&fh) {
            handle.read_from = Some(serial);
        }
    }

    /// Handle `fh` is released: what this process held for it goes.
    fn release(&mut self, fh: u64, ino: u64) {
        let served = self.files.remove(&fh).is_some();
        let streamed = self.streamed.remove(&fh).is_some();
        if served || streamed {
            if let Some(n) = self.read_here.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    self.read_here.remove(&ino);
                }
            }
        }
        if !self.streamed.values().any(|handle| handle.ino == ino) {
            self.partials.remove(&ino);
        }
    }
}

impl LazyView {
    pub(crate) fn new(
        tree: Arc<Tree>,
        wants: Arc<dyn Wants>,
        dest: Dest,
        want_passthrough: bool,
    ) -> Self {
        Self {
            want_passthrough,
            shared: Arc::new(Shared {
                tree,
                wants,
                dest,
                runtime: tokio::runtime::Handle::current(),
                uid: rustix::process::getuid().as_raw(),
                gid: rustix::process::getgid().as_raw(),
                passthrough: AtomicBool::new(false),
                no_opendir: AtomicBool::new(false),
                no_open: AtomicBool::new(false),
                settled: AtomicBool::new(false),
                next_handle: AtomicU64::new(first_handle()),
                open: Mutex::default(),
                told: Mutex::default(),
                journal: OnceLock::new(),
                next_partial: AtomicU64::new(0),
                health: Health::default(),
            }),
        }
    }
}

/// An open's reply held while its file is fetched. fuser answers EIO for a reply dropped
/// unanswered; one dropped here (its task cancelled: this process is stopping) is left to the
/// kernel instead: a view kept for a later process is asked again there (FUSE_NOTIFY_RESEND),
/// and a view that ends with this process fails the open with ENOTCONN itself. Never EIO for a
/// file nobody failed to fetch.
/// The same holds for a read waiting for its bytes.
struct HeldReply<R>(Option<R>);

impl<R> HeldReply<R> {
    fn take(mut self) -> R {
        self.0.take().expect("a held reply is taken once")
    }
}

impl<R> Drop for HeldReply<R> {
    fn drop(&mut self) {
        if let Some(unanswered) = self.0.take() {
            std::mem::forget(unanswered);
        }
    }
}

/// What the kernel took at the view's INIT, readable once the view is handed to its session.
pub(crate) struct Taken(Arc<Shared>);

impl Taken {
    pub(crate) fn passthrough(&self) -> bool {
        self.0.passthrough.load(Relaxed)
    }
}

impl LazyView {
    pub(crate) fn taken(&self) -> Taken {
        Taken(self.shared.clone())
    }

    pub(crate) fn health(&self) -> Health {
        self.shared.health.clone()
    }

    /// Writes the view's backings down in `journal`, and answers with those it inherits
    /// (a view a later process may serve again).
    pub(crate) fn with_journal(self, journal: BackingJournal) -> Self {
        let _ = self.shared.journal.set(journal);
        self
    }
}

/// The first file handle of this process: the time it started, in nanoseconds. An earlier
/// process serving the same view gave out fewer handles than nanoseconds went by, so the
/// handles the kernel still holds from it are never given out again here.
fn first_handle() -> u64 {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    now.map_or(1, |since| since.as_nanos() as u64).max(1)
}

impl Shared {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let node = self.tree.node(ino)?;
        let (kind, size, mtime, perm, nlink) = match &node.kind {
            Kind::Dir { .. } => (FileType::Directory, 0, SystemTime::UNIX_EPOCH, 0o555, 2),
            Kind::File(file) => (FileType::RegularFile, file.size, file.mtime, 0o444, 1),
            Kind::Memory(bytes) => {
                let size = bytes.len() as u64;
                (
                    FileType::RegularFile,
                    size,
                    SystemTime::UNIX_EPOCH,
                    0o444,
                    1,
                )
            }
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn file(&self, ino: u64) -> Option<&FileNode> {
        match &self.tree.node(ino)?.kind {
            Kind::File(file) => Some(file),
            Kind::Dir { .. } | Kind::Memory(_) => None,
        }
    }

    /// The bytes of `ino` when it is a file of the view's own.
    fn memory(&self, ino: u64) -> Option<&[u8]> {
        match &self.tree.node(ino)?.kind {
            Kind::Memory(bytes) => Some(bytes),
            Kind::Dir { .. } | Kind::File(_) => None,
        }
    }

    /// Whether opens need this process no more, from now on: the kernel can open files by
    /// itself, every file is local for good, and no handle is open here (the kernel would
    /// refuse an open that keeps pages beside a passthrough one of the same file). The open
    /// that finds so is answered ENOSYS, and the kernel sends no open of a file again: each
    /// file then costs no round trip at all while its pages are cached.
    fn settle(&self) -> bool {
        if self.settled.load(Relaxed) {
            return true;
        }
        if !self.no_open.load(Relaxed) || !self.wants.all_local() {
            return false;
        }
        if self
            .journal
            .get()
            .is_some_and(BackingJournal::has_inherited)
        {
            return false;
        }
        let mut open = self.open_mut();
        if !(open.handles.is_empty() && open.files.is_empty() && open.streamed.is_empty()) {
            return false;
        }
        self.settled.store(true, Relaxed);
        // The idle backings will serve no open again.
        for ino in std::mem::take(&mut open.idle) {
            if let Some(journal) = self.journal.get() {
                journal.closing(ino);
            }
            open.backing.remove(&ino);
        }
        tracing::info!("the view is whole: the kernel opens its files without asking from now on");
        true
    }

    /// Answers a read of a file the kernel opened without asking, which it does only once
    /// the view settled ([`Shared::settle`], maybe in an earlier process of the view): the
    /// published file is read.
    fn read_unopened(&self, ino: u64, bytes: Range<u64>, reply: ReplyData) {
        let Some(node) = self.file(ino) else {
            return reply.error(Errno::EIO);
        };
        let bytes = bytes.start.min(node.size)..bytes.end.min(node.size);
        match self.dest.open_final(&node.rel) {
            Ok(Some(local)) => reply_read(&local, &bytes, reply),
            Ok(None) => {
                self.report(node, "a read failed with EIO", "the local file is missing");
                reply.error(Errno::EIO)
            }
            Err(err) => {
                let reason = format!("opening the local file: {err}");
                self.report(node, "a read failed with EIO", &reason);
                reply.error(Errno::EIO)
            }
        }
    }

    /// Answers an open of a file of the view's own: its reads come here, by inode.
    fn open_memory(&self, reply: ReplyOpen) {
        let fh = self.next_handle.fetch_add(1, Relaxed);
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        );
    }

    fn open_mut(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Answers an open of `ino` with the backing file kept from an earlier open, if there is
    /// one (the file is local); otherwise hands the reply back.
    fn open_kept(&self, ino: u64, reply: ReplyOpen) -> Option<ReplyOpen> {
        let mut open = self.open_mut();
        let Some(backing) = open.take_kept(ino) else {
            return Some(reply);
        };
        let fh = self.next_handle.fetch_add(1, Relaxed);
        open.handles.insert(fh, ino);
        drop(open);
        reply.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_NOFLUSH, &backing);
        None
    }

    /// Answers an open of `ino`, whose file is local: passthrough where the kernel takes it.
    fn open_local(&self, ino: u64, reply: ReplyOpen) {
        let Some(reply) = self.open_kept(ino, reply) else {
            return;
        };
        let Some(file) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let local = match self.dest.open_final(&file.rel) {
            Ok(Some(local)) => local,
            Ok(None) => return self.fail(file, "the local file is missing", reply),
            Err(err) => return self.fail(file, &format!("opening the local file: {err}"), reply),
        };
        let fh = self.next_handle.fetch_add(1, Relaxed);
        let read_here = self.open_mut().read_here.contains_key(&ino);
        if self.passthrough.load(Relaxed) && !read_here {
            let mut open = self.open_mut();
            // Another open of the file may have made its backing since.
            let backing = match open.take_kept(ino) {
                Some(backing) => Some(backing),
                None => match self.new_backing(ino, &local, &reply) {
                    Ok(backing) => {
                        let backing = Arc::new(backing);
                        open.backing.insert(ino, (backing.clone(), 1));
                        Some(backing)
                    }
                    Err(err) => {
                        self.passthrough.store(false, Relaxed);
                        tracing::warn!(
                            "FUSE passthrough refused ({err}): reads of the view go through hydrator, slower than the local files"
                        );
                        None
                    }
                },
            };
            if let Some(backing) = backing {
                open.handles.insert(fh, ino);
                return reply.opened_passthrough(
                    FileHandle(fh),
                    FopenFlags::FOPEN_NOFLUSH,
                    &backing,
                );
            }
        }
        let mut open = self.open_mut();
        open.files.insert(fh, (ino, Arc::new(local)));
        open.read_here(ino);
        let keep_cache = match open.tainted.contains(&ino) {
            true => FopenFlags::empty(),
            false => FopenFlags::FOPEN_KEEP_CACHE,
        };
        drop(open);
        reply.opened(FileHandle(fh), keep_cache | FopenFlags::FOPEN_NOFLUSH);
    }

    /// A backing for `ino`, whose local file is `local`: the one an earlier process of the view
    /// left registered for it, if any (the kernel may still hold it for a file open since, and
    /// fails an open of the inode with any other).
    fn new_backing(&self, ino: u64, local: &File, reply: &ReplyOpen) -> std::io::Result<BackingId> {
        let Some(journal) = self.journal.get() else {
            return reply.open_backing(local);
        };
        if let Some(id) = journal.take_inherited(ino) {
            // SAFETY: an earlier process of this view registered `id` on this connection for
            // this inode and did not close it (the journal says so); the one `BackingId` made
            // here is now all that closes it.
            return Ok(unsafe { reply.wrap_backing(id) });
        }
        let id = reply.open_backing(local)?.into_raw();
        journal.registered(ino, id);
        // SAFETY: `id` was registered on this connection just now, and nothing else owns it.
        Ok(unsafe { reply.wrap_backing(id) })
    }

    /// Answers an open whose file's first bytes are `outcome`: the whole file local, its
    /// first part written (the file downloads on), or failed.
    fn opened(&self, ino: u64, outcome: RangeOutcome, reply: ReplyOpen) {
        match (outcome, self.file(ino)) {
            (Ok(Readable::Whole), _) => self.open_local(ino, reply),
            (Ok(Readable::Partial { .. }), _) => self.open_streamed(ino, reply),
            (Err(reason), Some(file)) => self.fail(file, &reason, reply),
            (Err(_), None) => reply.error(Errno::EIO),
        }
    }

    /// Answers an open of `ino` while its file downloads: its reads come here and each waits
    /// for its own bytes. Direct I/O: the kernel keeps no page of a file not whole, and the
    /// handle takes no I/O mode of the inode, which would make the kernel refuse a passthrough
    /// open of the file once it is whole.
    fn open_streamed(&self, ino: u64, reply: ReplyOpen) {
        // Published meanwhile, and opened through passthrough since.
        let Some(reply) = self.open_kept(ino, reply) else {
            return;
        };
        let fh = self.next_handle.fetch_add(1, Relaxed);
        let mut open = self.open_mut();
        open.streamed.insert(fh, Streamed::of(ino));
        open.read_here(ino);
        drop(open);
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH,
        );
    }

    /// Counts handle `fh` of `ino` as read here if an earlier process of the view gave it out
    /// (until its release).
    fn adopt(&self, ino: u64, fh: u64) {
        let mut open = self.open_mut();
        if !open.streamed.contains_key(&fh) && !open.files.contains_key(&fh) {
            open.streamed.insert(fh, Streamed::of(ino));
            open.read_here(ino);
        }
    }

    /// The local file a handle opened on a whole file reads.
    fn served_file(&self, ino: u64, fh: u64) -> Option<Arc<File>> {
        let open = self.open_mut();
        let (of, file) = open.files.get(&fh)?;
        (*of == ino).then(|| file.clone())
    }

    /// The partial file of `ino` when the bytes `bytes` are known written in it, to answer
    /// handle `fh` with; `Err` when `fh` read bytes that were discarded since.
    fn partial_covering(
        &self,
        (ino, fh): (u64, u64),
        bytes: &Range<u64>,
    ) -> Result<Option<Arc<File>>, Rejected> {
        self.checked_handle((ino, fh), |open| {
            let partial = open.partials.get(&ino)?;
            let found = (partial.confirmed && partial.covers(bytes))
                .then(|| (partial.file.clone(), partial.serial))?;
            open.reads_from(fh, found.1);
            Some(found.0)
        })
    }

    /// `Err` when handle `fh` of `ino` read bytes that were discarded.
    fn check_handle(&self, key: (u64, u64)) -> Result<(), Rejected> {
        self.checked_handle(key, |_| ())
    }

    /// `then` on what is open, once `ino`'s kept partial file is checked (dropped, and its
    /// readers rejected, when it was discarded) and handle `fh` is not rejected; `Err` when it
    /// is.
    fn checked_handle<T>(
        &self,
        (ino, fh): (u64, u64),
        then: impl FnOnce(&mut Open) -> T,
    ) -> Result<T, Rejected> {
        let mut open = self.open_mut();
        let (_, rejected) = open.check_partial(ino);
        let answer = (!open.is_rejected(fh)).then(|| then(&mut open));
        drop(open);
        self.rejected(ino, rejected);
        answer.ok_or(Rejected)
    }

    /// Counts and logs the `handles` of `ino` just rejected: they read bytes of a download
    /// that was then discarded.
    fn rejected(&self, ino: u64, handles: u64) {
        let Some(node) = self.file(ino).filter(|_| handles > 0) else {
            return;
        };
        let total = self.health.add(handles, &node.key);
        tracing::error!(
            key = %node.key,
            "{handles} open handle(s) read bytes of a download of this file that was then discarded before its whole-file checks passed (a checksum or seal mismatch, or a download given up): their reads fail with EIO from now on; open the file again ({total} handle(s) so far in this view)"
        );
    }

    /// Answers a read of `ino` through handle `fh` that is not a local whole file's: a
    /// streamed handle, or one an earlier process of the view gave out. It waits for the
    /// parts holding the bytes asked for (`asked` times so far).
    fn read_range(
        self: &Arc<Self>,
        (ino, fh): (u64, u64),
        bytes: Range<u64>,
        asked: u32,
        reply: ReplyData,
    ) {
        let Some(file) = self.file(ino) else {
            return reply.error(Errno::EIO);
        };
        match self.partial_covering((ino, fh), &bytes) {
            Ok(Some(partial)) => return reply_read(&partial, &bytes, reply),
            Ok(None) => {}
            Err(Rejected) => return reply.error(Errno::EIO),
        }
        match self.wants.want_range(file, bytes.clone()) {
            RangeWanted::Now(outcome) => {
                self.read_readable((ino, fh), bytes, (outcome, asked), reply)
            }
            RangeWanted::Later(told) => {
                let shared = self.clone();
                let reply = HeldReply(Some(reply));
                self.runtime.spawn(async move {
                    // No answer comes only when this process is stopping (see `HeldReply`).
                    let Ok(outcome) = told.await else {
                        return;
                    };
                    shared.read_readable((ino, fh), bytes, (outcome, asked), reply.take());
                });
            }
        }
    }

    /// Answers a read of `bytes` once the view's wants said where they are.
    fn read_readable(
        self: &Arc<Self>,
        (ino, fh): (u64, u64),
        bytes: Range<u64>,
        (outcome, asked): (RangeOutcome, u32),
        reply: ReplyData,
    ) {
        let Some(node) = self.file(ino) else {
            return reply.error(Errno::EIO);
        };
        // What the handle read may have been discarded while it waited: then no later
        // attempt's bytes, verified or not, are served to it.
        if let Err(Rejected) = self.check_handle((ino, fh)) {
            return reply.error(Errno::EIO);
        }
        let found = match outcome {
            Err(reason) => Err(reason),
            Ok(Readable::Whole) => self.open_whole(ino, fh, node),
            Ok(Readable::Partial { inode, runs }) => {
                self.open_partial((ino, fh), node, inode, runs)
            }
        };
        match found {
            Ok(Some(local)) => reply_read(&local, &bytes, reply),
            // The download started again since it was told (a new partial file).
            Ok(None) if asked < MAX_ASKS => self.read_range((ino, fh), bytes, asked + 1, reply),
            Ok(None) => {
                let reason = "its partial file keeps changing";
                self.report(node, "a read failed with EIO", reason);
                reply.error(Errno::EIO)
            }
            Err(reason) => {
                self.report(node, "a read failed with EIO", &reason);
                reply.error(Errno::EIO)
            }
        }
    }

    /// The published file of `ino`, kept for the later reads of handle `fh`.
    fn open_whole(
        &self,
        ino: u64,
        fh: u64,
        node: &FileNode,
    ) -> Result<Option<Arc<File>>, Unavailable> {
        let local = match self.dest.open_final(&node.rel) {
            Ok(Some(local)) => Arc::new(local),
            Ok(None) => return Err("the local file is missing".into()),
            Err(err) => return Err(format!("opening the local file: {err}").into()),
        };
        self.open_mut().files.insert(fh, (ino, local.clone()));
        Ok(Some(local))
    }

    /// The partial file `inode` of `ino`, whose `runs` are written, for handle `fh`: `None`
    /// when another partial file is there now, or when it was opened just now (asked again,
    /// the wants confirm that its inode is still the download's). Published meanwhile, it is
    /// the final file (same inode).
    fn open_partial(
        &self,
        (ino, fh): (u64, u64),
        node: &FileNode,
        inode: u64,
        runs: Vec<Range<u64>>,
    ) -> Result<Option<Arc<File>>, Unavailable> {
        let mut open = self.open_mut();
        let (cached, rejected) = open.check_partial(ino);
        let reused = cached.filter(|p| p.inode == inode).map(|partial| {
            partial.runs = runs.clone();
            partial.confirmed = true;
            (partial.file.clone(), partial.serial)
        });
        if let Some((file, serial)) = reused {
            open.reads_from(fh, serial);
            return Ok(Some(file));
        }
        drop(open);
        self.rejected(ino, rejected);
        let opened = match self.dest.open_partial(&node.rel) {
            Ok(None) => self.dest.open_final(&node.rel),
            other => other,
        };
        let file = match opened {
            Ok(Some(file)) => file,
            Ok(None) => return Ok(None),
            Err(err) => return Err(format!("opening the partial file: {err}").into()),
        };
        match file.metadata() {
            Ok(meta) if meta.ino() == inode => {}
            Ok(_) => return Ok(None),
            Err(err) => return Err(format!("reading the partial file: {err}").into()),
        }
        let partial = PartialFile {
            file: Arc::new(file),
            inode,
            runs,
            serial: self.next_partial.fetch_add(1, Relaxed),
            confirmed: false,
        };
        let rejected = self.open_mut().replace_partial(ino, partial);
        self.rejected(ino, rejected);
        Ok(None)
    }

    /// Logs `what` failed for `file` because of `reason`, once per file.
    fn report(&self, file: &FileNode, what: &str, reason: &str) {
        let first = self
            .told
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(file.key.clone());
        if first {
            tracing::error!(key = %file.key, "{what}: {reason}");
        }
    }

    fn fail(&self, file: &FileNode, reason: &str, reply: ReplyOpen) {
        self.report(file, "open failed with EIO", reason);
        reply.error(Errno::EIO);
    }
}

impl Filesystem for LazyView {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let offered = config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH);
        let taken = self.want_passthrough
            && offered
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(2).is_ok();
        self.shared.passthrough.store(taken, Relaxed);
        // A file mapped while it downloads is read through this process like its reads.
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // The tree never changes: lookups in one directory need not wait for each other (the
        // kernel otherwise takes the directory's lock for each, and readers of files side by
        // side queue there).
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        let no_opendir = config.add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        self.shared.no_opendir.store(no_opendir.is_ok(), Relaxed);
        let no_open = config.add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT);
        self.shared.no_open.store(no_open.is_ok(), Relaxed);
        match (taken, self.want_passthrough) {
            (true, _) => {}
            (false, true) => tracing::warn!(
                "this kernel offers no FUSE passthrough (Linux 6.9 or later has it): reads of the view go through hydrator, slower than the local files"
            ),
            (false, false) => tracing::info!(
                "FUSE passthrough off (--no-passthrough): reads of the view go through hydrator"
            ),
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = name
            .to_str()
            .and_then(|name| self.shared.tree.lookup(parent.0, name))
            .and_then(|ino| self.shared.attr(ino));
        match found {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.shared.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let shared = &self.shared;
        if shared.memory(ino.0).is_some() {
            return shared.open_memory(reply);
        }
        let Some(file) = shared.file(ino.0) else {
            return reply.error(Errno::EISDIR);
        };
        if shared.settle() {
            return reply.error(Errno::ENOSYS);
        }
        let Some(reply) = shared.open_kept(ino.0, reply) else {
            return;
        };
        // An open waits for the file's first part (the whole file when it has one part); each
        // read then waits for its own bytes.
        match shared.wants.want_range(file, 0..1) {
            RangeWanted::Now(outcome) => shared.opened(ino.0, outcome, reply),
            RangeWanted::Later(told) => {
                let shared = shared.clone();
                let reply = HeldReply(Some(reply));
                shared.runtime.clone().spawn(async move {
                    // No answer comes only when this process is stopping: the open is left
                    // to the kernel (see `HeldReply`).
                    let Ok(outcome) = told.await else {
                        return;
                    };
                    shared.opened(ino.0, outcome, reply.take());
                });
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if let Some(bytes) = self.shared.memory(ino.0) {
            return reply.data(window(bytes, offset, size));
        }
        let end = offset.saturating_add(size.into());
        if fh.0 == UNOPENED {
            return self.shared.read_unopened(ino.0, offset..end, reply);
        }
        if let Some(file) = self.shared.served_file(ino.0, fh.0) {
            return reply_read(&file, &(offset..end), reply);
        }
        let Some(node) = self.shared.file(ino.0) else {
            return reply.error(Errno::EIO);
        };
        let bytes = offset.min(node.size)..end.min(node.size);
        if bytes.is_empty() {
            return reply.data(&[]);
        }
        self.shared.adopt(ino.0, fh.0);
        self.shared.read_range((ino.0, fh.0), bytes, 0, reply);
    }

    /// Nothing is ever written: a close has nothing to flush. `FOPEN_NOFLUSH` asks the kernel
    /// not to send it; a file the kernel opened without asking has no such flag, and ENOSYS
    /// tells the kernel never to send a flush again.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// A regular file is always ready: ENOSYS tells the kernel so once, and it asks no more
    /// (io_uring readers poll before they read).
    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// No ioctl applies to a file of the view (a `TCGETS` from `isatty` is the usual one).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut open = self.shared.open_mut();
        open.release(fh.0, ino.0);
        // A handle of an earlier process of the view has nothing here to let go of.
        if let Some(ino) = (open.handles.get(&fh.0).copied()).filter(|of| *of == ino.0) {
            open.handles.remove(&fh.0);
            if let Some((_, users)) = open.backing.get_mut(&ino) {
                *users -= 1;
                if *users == 0 {
                    open.idle.push_back(ino);
                }
            }
            while open.idle.len() > IDLE_BACKINGS {
                let oldest = open.idle.pop_front().expect("longer than the bound");
                if open
                    .backing
                    .get(&oldest)
                    .is_some_and(|(_, users)| *users == 0)
                {
                    if let Some(journal) = self.shared.journal.get() {
                        journal.closing(oldest);
                    }
                    open.backing.remove(&oldest);
                }
            }
        }
        reply.ok();
    }

    /// A directory needs no open: where the kernel can do without (Linux ≥ 5.1), ENOSYS tells
    /// it so once, and it opens directories by itself from then on (no OPENDIR and RELEASEDIR
    /// round trips), keeping their listings cached as `FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE` asks.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.shared.tree.node(ino.0).map(|node| &node.kind) {
            Some(Kind::Dir { .. }) if self.shared.no_opendir.load(Relaxed) => {
                reply.error(Errno::ENOSYS)
            }
            Some(Kind::Dir { .. }) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Some(Kind::File(_) | Kind::Memory(_)) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let tree = &self.shared.tree;
        let Some(node) = tree.node(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let Kind::Dir { entries } = &node.kind else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [(".", ino.0), ("..", node.parent)];
        let all = dots
            .iter()
            .map(|&(name, ino)| (name, ino))
            .chain(entries.iter().map(|(name, ino)| (name.as_str(), *ino)));
        for (i, (name, entry)) in all.enumerate().skip(offset as usize) {
            let kind = match tree.node(entry).map(|n| &n.kind) {
                Some(Kind::File(_) | Kind::Memory(_)) => FileType::RegularFile,
                _ => FileType::Directory,
            };
            if reply.add(INodeNo(entry), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        let tree = &self.shared.tree;
        let blocks = tree.bytes().div_ceil(4096);
        let files = tree.files() as u64;
        reply.statfs(blocks, 0, 0, files, 0, 4096, 255, 4096);
    }
}

/// Answers a read of `bytes` of `file` (fewer only at its end), through a buffer each thread
/// keeps: a fresh one per read would cost a page fault per 4 KiB (a reader of 2 GiB through
/// the view cost 2.3 CPU-s per GiB that way, most of it faulting in new pages).
fn reply_read(file: &File, bytes: &Range<u64>, reply: ReplyData) {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let len = (bytes.end - bytes.start) as usize;
    BUF.with_borrow_mut(|buf| {
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let buf = &mut buf[..len];
        let mut filled = 0;
        while filled < len {
            match file.read_at(&mut buf[filled..], bytes.start + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return reply.error(Errno::EIO),
            }
        }
        reply.data(&buf[..filled]);
    });
}

/// The part of `bytes` a read at `offset` of `size` bytes gets.
fn window(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset).map_or(bytes.len(), |at| at.min(bytes.len()));
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial(file: File, serial: u64) -> PartialFile {
        PartialFile {
            inode: file.metadata().unwrap().ino(),
            file: Arc::new(file),
            runs: std::iter::once(0..10).collect(),
            serial,
            confirmed: true,
        }
    }

    #[test]
    fn a_discarded_partial_rejects_the_handles_that_read_it_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".f.partial");
        std::fs::write(&path, b"0123456789").unwrap();
        let mut open = Open::default();
        open.partials
            .insert(7, partial(File::open(&path).unwrap(), 1));
        for fh in [10, 11, 12] {
            open.streamed.insert(fh, Streamed::of(7));
        }
        open.reads_from(10, 1);
        open.reads_from(12, 0); // an earlier partial file, published since
        let (kept, rejected) = open.check_partial(7);
        assert!(kept.is_some() && rejected == 0, "still linked");
        std::fs::remove_file(&path).unwrap();
        let (kept, rejected) = open.check_partial(7);
        assert!(kept.is_none());
        assert_eq!(rejected, 1);
        assert!(open.is_rejected(10));
        assert!(!open.is_rejected(11), "it read nothing of it");
        assert!(!open.is_rejected(12));
        assert!(open.tainted.contains(&7));
        assert_eq!(open.check_partial(7).1, 0, "told once");
    }

    #[test]
    fn a_published_partial_is_not_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let (path, published) = (dir.path().join(".f.partial"), dir.path().join("f"));
        std::fs::write(&path, b"0123456789").unwrap();
        let kept = partial(File::open(&path).unwrap(), 3);
        std::fs::rename(&path, &published).unwrap();
        assert!(!kept.discarded());
    }
}
