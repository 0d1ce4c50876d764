//! The order in which a lazy view's objects are fetched.
//!
//! A sync fetches in listing order. A lazy view (`hydrator mount`) fetches first what its readers
//! open, then the files after the last one opened (read-ahead over the access pattern, so a
//! loader reading shards in order stays ahead), then the rest, wrapping round. The engine still
//! *plans* every object in listing order (the manifest's cursor and the listed spool need it) and
//! only *dispatches* in this order.
//!
//! Objects fetched in the background are held to a small window: [`WINDOW_PER_SLOT`] downloads
//! per request slot of the moment (an object leaves it when its download ends, not when its
//! batch is durable). An opened file then queues behind about two GETs per slot, not behind
//! every object the engine could have in flight (four per slot, each with its parts). Opened
//! files bypass the window.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use tokio::sync::{oneshot, Notify};

pub(crate) use super::streams::Unavailable;
use super::streams::{RangeWanted, Readable, Streams};
use crate::error::ObjectError;
use crate::manifest::ObjectState;
use crate::plan::keys::RelPath;
use crate::source::list::ObjectEntry;

/// Background downloads per request slot.
const WINDOW_PER_SLOT: usize = 2;

/// An object the engine planned (in listing order) and has not fetched yet.
pub(crate) struct Planned {
    pub entry: ObjectEntry,
    pub rel: RelPath,
    pub known: Option<ObjectState>,
    /// Its place in the background window, held until its download ends.
    pub window: Option<WindowPlace>,
}

/// Whether a wanted object is local now, or when it will be.
pub(crate) enum Wanted {
    Now(Result<(), Unavailable>),
    Later(oneshot::Receiver<Result<(), Unavailable>>),
}

#[derive(Clone)]
enum State {
    /// Not planned by the engine yet.
    Unplanned,
    Waiting,
    Fetching,
    Local,
    Failed(Unavailable),
}

struct Inner {
    states: Vec<State>,
    waiting: BTreeMap<usize, Planned>,
    urgent: VecDeque<usize>,
    /// Where the background goes on: after the last file opened before it was local.
    cursor: usize,
    waiters: HashMap<usize, Vec<oneshot::Sender<Result<(), Unavailable>>>>,
    planning_done: bool,
    closed: Option<Unavailable>,
    /// The run completed with every object local ([`Schedule::all_local`], none failed).
    complete: bool,
    /// Multi-part downloads readers may read before they are whole, and who waits for which
    /// of their bytes.
    streams: Streams,
}

/// The objects of one run by their position in the listing, shared by the engine (which plans,
/// dispatches and finishes them) and the view (which wants them).
pub(crate) struct Schedule {
    positions: HashMap<String, usize>,
    inner: Mutex<Inner>,
    /// Wakes the engine's dispatcher (the only one waiting on it).
    changed: Notify,
    /// Wakes the parts waiting for a request slot as background ones: a reader now waits for
    /// an object being fetched.
    promoted: Notify,
    window: Arc<Window>,
    /// Readers get only whole, verified files (`--no-stream-unchecked`, the catalog's
    /// `stream_unchecked = false`).
    whole_only: bool,
}

/// Background downloads in flight, and a wake-up when one ends.
#[derive(Default)]
struct Window {
    downloads: AtomicUsize,
    freed: Notify,
}

/// A background download's place in the window, given back when dropped.
pub(crate) struct WindowPlace(Arc<Window>);

impl Drop for WindowPlace {
    fn drop(&mut self) {
        self.0.downloads.fetch_sub(1, Relaxed);
        self.0.freed.notify_one();
    }
}

impl Schedule {
    /// A schedule for the objects `keys`, in listing order.
    pub(crate) fn new(keys: impl IntoIterator<Item = String>) -> Self {
        let positions: HashMap<String, usize> =
            keys.into_iter().enumerate().map(|(i, k)| (k, i)).collect();
        let count = positions.len();
        Self {
            positions,
            inner: Mutex::new(Inner {
                states: vec![State::Unplanned; count],
                waiting: BTreeMap::new(),
                urgent: VecDeque::new(),
                cursor: 0,
                waiters: HashMap::new(),
                planning_done: false,
                closed: None,
                complete: false,
                streams: Streams::default(),
            }),
            changed: Notify::new(),
            promoted: Notify::new(),
            window: Arc::default(),
            whole_only: false,
        }
    }

    /// The same, whose readers get only whole, verified files when `whole_only`.
    pub(crate) fn whole_files_only(mut self, whole_only: bool) -> Self {
        self.whole_only = whole_only;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The engine planned `planned`; an object the schedule does not know is handed back.
    pub(crate) fn push(&self, planned: Planned) -> Option<Planned> {
        let Some(&at) = self.positions.get(&planned.entry.key) else {
            return Some(planned);
        };
        let mut inner = self.lock();
        inner.states[at] = State::Waiting;
        inner.waiting.insert(at, planned);
        drop(inner);
        self.changed.notify_one();
        None
    }

    /// The engine planned every object.
    pub(crate) fn planning_done(&self) {
        self.lock().planning_done = true;
        self.changed.notify_one();
    }

    /// The next object to fetch, with `slots` request slots in use now; `None` once every
    /// planned object was handed out.
    pub(crate) async fn next(&self, slots: usize) -> Option<Planned> {
        let window = WINDOW_PER_SLOT * slots.max(1);
        loop {
            let changed = self.changed.notified();
            let freed = self.window.freed.notified();
            {
                let mut inner = self.lock();
                match inner.pick(&self.window, window) {
                    Some(planned) => return Some(planned),
                    None if inner.planning_done && inner.waiting.is_empty() => return None,
                    None => {}
                }
            }
            tokio::select! {
                () = changed => {}
                () = freed => {}
            }
        }
    }

    /// The engine finished `key`: local (written, durable, verified), or failed with `reason`.
    pub(crate) fn finished(&self, key: &str, outcome: Result<(), &ObjectError>) {
        let Some(&at) = self.positions.get(key) else {
            return;
        };
        let mut inner = self.lock();
        let outcome = outcome.map_err(|err| Unavailable::from(err.to_string()));
        inner.states[at] = match &outcome {
            Ok(()) => State::Local,
            Err(reason) => State::Failed(reason.clone()),
        };
        for waiter in inner.waiters.remove(&at).unwrap_or_default() {
            let _ = waiter.send(outcome.clone());
        }
        inner.streams.finished(at, &outcome);
        drop(inner);
        self.changed.notify_one();
    }

    /// The engine downloads `key` into the partial file `inode`, `size` bytes in parts of
    /// `part_size`, of which `written` hold their bytes already: readers may read those.
    pub(crate) fn streaming(
        &self,
        key: &str,
        inode: u64,
        sizes: (u64, u64),
        written: impl IntoIterator<Item = u32>,
    ) {
        if let Some(&at) = self.positions.get(key) {
            self.lock().streams.start(at, inode, sizes, written);
        }
    }

    /// `key`'s partial file `inode` was discarded (rejected by a whole-file check, or given
    /// up): readers may read it no more.
    pub(crate) fn discarded(&self, key: &str, inode: u64) {
        if let Some(&at) = self.positions.get(key) {
            self.lock().streams.discarded(at, inode);
        }
    }

    /// Whether a file may be read while it downloads, before its whole-file checks (no when
    /// the operator forbade it: [`Schedule::whole_files_only`]).
    pub(crate) fn streams_unchecked(&self) -> bool {
        !self.whole_only
    }

    /// Part `index` of `key`'s partial file `inode` is written (and checked: `streams.rs`).
    pub(crate) fn part_written(&self, key: &str, inode: u64, index: u32) {
        if let Some(&at) = self.positions.get(key) {
            self.lock().streams.written(at, inode, index);
        }
    }

    /// Nothing more will be fetched: whoever waits, or wants an object not local, gets `reason`.
    pub(crate) fn close(&self, reason: &str) {
        let mut inner = self.lock();
        let reason = Unavailable::from(reason);
        inner.closed = Some(reason.clone());
        for (_, waiters) in inner.waiters.drain() {
            for waiter in waiters {
                let _ = waiter.send(Err(reason.clone()));
            }
        }
        inner.streams.close(&reason);
    }

    /// The run completed: every object not failed is local (a run that found DEST already
    /// READY planned none of them).
    pub(crate) fn all_local(&self) {
        let mut inner = self.lock();
        for at in 0..inner.states.len() {
            if !matches!(inner.states[at], State::Failed(_)) {
                inner.states[at] = State::Local;
                for waiter in inner.waiters.remove(&at).unwrap_or_default() {
                    let _ = waiter.send(Ok(()));
                }
                inner.streams.finished(at, &Ok(()));
            }
        }
        inner.complete = !inner.states.iter().any(|s| matches!(s, State::Failed(_)));
    }

    /// Whether every object is local for good: the run completed and none failed.
    pub(crate) fn is_complete(&self) -> bool {
        self.lock().complete
    }

    /// Whether a reader waits for `key` now (the whole file, or some of its bytes).
    pub(crate) fn is_wanted(&self, key: &str) -> bool {
        self.positions.get(key).is_some_and(|&at| {
            let inner = self.lock();
            inner.waits_whole(at) || inner.streams.waits_any(at)
        })
    }

    /// Whether a reader waits for the part of `key` holding the bytes `part`.
    pub(crate) fn is_part_wanted(&self, key: &str, part: &Range<u64>) -> bool {
        self.positions.get(key).is_some_and(|&at| {
            let inner = self.lock();
            inner.waits_whole(at) || inner.streams.waits_for(at, part)
        })
    }

    /// The place among `parts` (byte ranges of `key`) of the first one a reader waits for
    /// some bytes of (not for the whole file: then every part is wanted alike).
    pub(crate) fn first_wanted<'a>(
        &self,
        key: &str,
        parts: impl Iterator<Item = &'a Range<u64>>,
    ) -> Option<usize> {
        let &at = self.positions.get(key)?;
        let inner = self.lock();
        if !inner.streams.waits_any(at) {
            return None;
        }
        parts
            .enumerate()
            .find(|(_, part)| inner.streams.waits_for(at, part))
            .map(|(place, _)| place)
    }

    /// Resolves once a reader waits for the part of `key` holding the bytes `part` (at once
    /// if one does now).
    pub(crate) async fn wanted(&self, key: &str, part: &Range<u64>) {
        loop {
            let promoted = self.promoted.notified();
            if self.is_part_wanted(key, part) {
                return;
            }
            promoted.await;
        }
    }

    /// A reader wants `key`: local now, failed, or fetched next (the files after it following).
    pub(crate) fn want(&self, key: &str) -> Wanted {
        let Some(&at) = self.positions.get(key) else {
            return Wanted::Now(Err("not in this dataset".into()));
        };
        let mut inner = self.lock();
        match &inner.states[at] {
            State::Local => return Wanted::Now(Ok(())),
            State::Failed(reason) => return Wanted::Now(Err(reason.clone())),
            _ => {}
        }
        if let Some(reason) = &inner.closed {
            return Wanted::Now(Err(reason.clone()));
        }
        let (tell, told) = oneshot::channel();
        inner.waiters.entry(at).or_default().push(tell);
        let fetching = inner.promote(at);
        drop(inner);
        self.wake(fetching);
        Wanted::Later(told)
    }

    /// A reader wants `bytes` of `key`: readable now (published, or those parts written),
    /// failed, or when their parts are written (the object fetched next, those parts first).
    pub(crate) fn want_range(&self, key: &str, bytes: Range<u64>) -> RangeWanted {
        let Some(&at) = self.positions.get(key) else {
            return RangeWanted::Now(Err("not in this dataset".into()));
        };
        let mut inner = self.lock();
        match &inner.states[at] {
            State::Local => return RangeWanted::Now(Ok(Readable::Whole)),
            State::Failed(reason) => return RangeWanted::Now(Err(reason.clone())),
            _ => {}
        }
        if let Some(reason) = &inner.closed {
            return RangeWanted::Now(Err(reason.clone()));
        }
        if let Some(readable) = inner.streams.readable_now(at, &bytes) {
            return RangeWanted::Now(Ok(readable));
        }
        let told = inner.streams.wait(at, bytes);
        let fetching = inner.promote(at);
        drop(inner);
        self.wake(fetching);
        RangeWanted::Later(told)
    }

    /// Wakes the parts waiting for a slot (a reader waits for an object being fetched), or
    /// the dispatcher (for one to fetch next).
    fn wake(&self, fetching: bool) {
        match fetching {
            true => self.promoted.notify_waiters(),
            false => self.changed.notify_one(),
        }
    }
}

impl Inner {
    fn waits_whole(&self, at: usize) -> bool {
        self.waiters.get(&at).is_some_and(|w| !w.is_empty())
    }

    /// A reader now waits for object `at`: dispatched next unless it is being fetched.
    /// Returns whether it is being fetched (its parts waiting for a slot are then promoted).
    fn promote(&mut self, at: usize) -> bool {
        let fetching = matches!(self.states[at], State::Fetching);
        if !fetching {
            self.urgent.push_back(at);
            self.cursor = at + 1;
        }
        fetching
    }

    /// An opened object if one is planned, else the next background one if the window has room.
    fn pick(&mut self, window: &Arc<Window>, size: usize) -> Option<Planned> {
        while let Some(&at) = self.urgent.front() {
            match self.states[at] {
                State::Waiting => {
                    self.urgent.pop_front();
                    self.states[at] = State::Fetching;
                    return self.waiting.remove(&at);
                }
                // Opened before the engine planned it: fetched once planned; the background
                // may go on meanwhile.
                State::Unplanned => break,
                _ => {
                    self.urgent.pop_front();
                }
            }
        }
        if window.downloads.load(Relaxed) >= size {
            return None;
        }
        // Round to the start only once everything is planned: until then the background
        // follows the planner from the cursor, so an object opened before it was planned is
        // not overtaken by the files listed before it.
        let next = self.waiting.range(self.cursor..).next().map(|(&at, _)| at);
        let at = match next {
            Some(at) => at,
            None if self.planning_done => *self.waiting.keys().next()?,
            None => return None,
        };
        let mut planned = self.waiting.remove(&at)?;
        window.downloads.fetch_add(1, Relaxed);
        planned.window = Some(WindowPlace(window.clone()));
        self.states[at] = State::Fetching;
        Some(planned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(key: &str, size: u64) -> Planned {
        Planned {
            entry: ObjectEntry {
                key: key.into(),
                size,
                etag: "\"e\"".into(),
                last_modified: None,
                version_id: None,
                sealed: None,
            },
            rel: match crate::plan::keys::plan_key("", key, size) {
                crate::plan::keys::KeyPlan::File(rel) => rel,
                _ => unreachable!("test keys are plain"),
            },
            known: None,
            window: None,
        }
    }

    fn schedule(n: usize, size: u64) -> Schedule {
        let keys: Vec<String> = (0..n).map(|i| format!("k{i:03}")).collect();
        let schedule = Schedule::new(keys.clone());
        for key in &keys {
            assert!(schedule.push(planned(key, size)).is_none());
        }
        schedule.planning_done();
        schedule
    }

    const SLOTS: usize = 4;

    async fn next_key(schedule: &Schedule) -> String {
        schedule.next(SLOTS).await.expect("one more").entry.key
    }

    #[tokio::test]
    async fn listing_order_then_an_opened_file_first_then_the_files_after_it() {
        let schedule = schedule(10, 1);
        assert_eq!(next_key(&schedule).await, "k000");
        let Wanted::Later(told) = schedule.want("k007") else {
            panic!("k007 is not local yet");
        };
        assert_eq!(next_key(&schedule).await, "k007");
        assert_eq!(next_key(&schedule).await, "k008");
        assert_eq!(next_key(&schedule).await, "k009");
        // Round to the start, skipping what was handed out.
        assert_eq!(next_key(&schedule).await, "k001");
        schedule.finished("k007", Ok(()));
        assert!(told.await.unwrap().is_ok());
        assert!(matches!(schedule.want("k007"), Wanted::Now(Ok(()))));
        schedule.finished("k000", Err(&ObjectError::Refused("access denied".into())));
        match schedule.want("k000") {
            Wanted::Now(Err(reason)) => assert_eq!(&*reason, "refused: access denied"),
            _ => panic!("a failed object fails at once"),
        }
    }

    #[tokio::test]
    async fn the_background_window_holds_back_other_files_but_not_an_opened_one() {
        let schedule = schedule(20, 8 << 20);
        let mut downloading = Vec::new();
        for i in 0..WINDOW_PER_SLOT * SLOTS {
            let planned = schedule.next(SLOTS).await.unwrap();
            assert_eq!(planned.entry.key, format!("k{i:03}"));
            downloading.push(planned);
        }
        let blocked =
            tokio::time::timeout(std::time::Duration::from_millis(50), schedule.next(SLOTS));
        assert!(blocked.await.is_err(), "the window is full");
        let _told = schedule.want("k015");
        assert_eq!(next_key(&schedule).await, "k015");
        // A download that ends (its durable batch may come later) frees its room.
        downloading.pop();
        assert_eq!(next_key(&schedule).await, "k016", "read-ahead after k015");
    }

    #[tokio::test]
    async fn a_file_opened_before_the_engine_planned_it_goes_first_once_planned() {
        let keys: Vec<String> = (0..4).map(|i| format!("k{i:03}")).collect();
        let schedule = Schedule::new(keys.clone());
        let _told = schedule.want("k003");
        for key in &keys {
            assert!(schedule.push(planned(key, 1)).is_none());
        }
        schedule.planning_done();
        assert_eq!(next_key(&schedule).await, "k003");
        assert_eq!(next_key(&schedule).await, "k000", "then round to the start");
        assert!(matches!(schedule.want("nope"), Wanted::Now(Err(_))));
        assert!(schedule.push(planned("nope", 1)).is_some(), "handed back");
    }

    #[tokio::test]
    async fn while_planning_the_background_does_not_overtake_a_file_opened_ahead() {
        let keys: Vec<String> = (0..10).map(|i| format!("k{i:03}")).collect();
        let schedule = Schedule::new(keys.clone());
        let _told = schedule.want("k005");
        let early =
            || tokio::time::timeout(std::time::Duration::from_millis(20), schedule.next(SLOTS));
        for key in &keys[..5] {
            assert!(schedule.push(planned(key, 1)).is_none());
        }
        assert!(
            early().await.is_err(),
            "k000..k004 wait behind the opened k005"
        );
        assert!(schedule.push(planned("k005", 1)).is_none());
        assert_eq!(next_key(&schedule).await, "k005");
        assert!(early().await.is_err(), "k006 is not planned yet");
        assert!(schedule.push(planned("k006", 1)).is_none());
        assert_eq!(next_key(&schedule).await, "k006");
        for key in &keys[7..] {
            assert!(schedule.push(planned(key, 1)).is_none());
        }
        schedule.planning_done();
        let rest: Vec<String> =
            futures::future::join_all((0..8).map(|_| next_key(&schedule))).await;
        assert_eq!(
            rest,
            ["k007", "k008", "k009", "k000", "k001", "k002", "k003", "k004"]
        );
    }

    #[tokio::test]
    async fn opening_a_file_being_fetched_wakes_its_parts_not_the_dispatcher() {
        let schedule = schedule(3, 1);
        assert_eq!(next_key(&schedule).await, "k000");
        let wanted = schedule.wanted("k000", &(0..1));
        tokio::pin!(wanted);
        let within = |ms| std::time::Duration::from_millis(ms);
        let early = tokio::time::timeout(within(20), wanted.as_mut()).await;
        assert!(early.is_err(), "no reader waits for k000 yet");
        let _told = schedule.want("k000");
        let woken = tokio::time::timeout(within(100), wanted).await;
        woken.expect("a reader waits for k000 now");
        assert_eq!(
            next_key(&schedule).await,
            "k001",
            "k000 is not handed out again"
        );
    }

    #[tokio::test]
    async fn a_read_of_a_file_downloading_waits_for_its_parts_only_and_they_start_first() {
        const MIB: u64 = 1 << 20;
        let schedule = schedule(2, 20 * MIB);
        let RangeWanted::Later(told) = schedule.want_range("k001", 9 * MIB..10 * MIB) else {
            panic!("nothing of k001 is written yet");
        };
        assert_eq!(next_key(&schedule).await, "k001", "fetched first");
        let parts = [0..8 * MIB, 8 * MIB..16 * MIB, 16 * MIB..20 * MIB];
        assert_eq!(schedule.first_wanted("k001", parts.iter()), Some(1));
        assert!(schedule.is_part_wanted("k001", &parts[1]));
        assert!(!schedule.is_part_wanted("k001", &parts[0]));
        assert!(schedule.is_wanted("k001"));
        schedule.streaming("k001", 42, (20 * MIB, 8 * MIB), []);
        schedule.part_written("k001", 42, 1);
        let partial = Readable::Partial {
            inode: 42,
            runs: std::iter::once(8 * MIB..16 * MIB).collect(),
        };
        assert_eq!(told.await.unwrap(), Ok(partial.clone()));
        assert!(!schedule.is_wanted("k001"), "nobody waits any more");
        match schedule.want_range("k001", 8 * MIB..9 * MIB) {
            RangeWanted::Now(Ok(readable)) => assert_eq!(readable, partial),
            _ => panic!("written bytes are readable at once"),
        }
        schedule.finished("k001", Ok(()));
        assert!(matches!(
            schedule.want_range("k001", 0..1),
            RangeWanted::Now(Ok(Readable::Whole))
        ));
    }

    #[tokio::test]
    async fn closing_answers_every_waiter_and_the_end_is_none() {
        let schedule = schedule(2, 1);
        let Wanted::Later(told) = schedule.want("k001") else {
            panic!("not local yet");
        };
        schedule.close("stopping");
        assert_eq!(&*told.await.unwrap().unwrap_err(), "stopping");
        assert!(matches!(schedule.want("k000"), Wanted::Now(Err(_))));
        assert_eq!(next_key(&schedule).await, "k001");
        assert_eq!(next_key(&schedule).await, "k000");
        assert!(schedule.next(SLOTS).await.is_none());
    }
}
