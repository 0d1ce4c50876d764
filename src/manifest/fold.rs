//! Folding the journal into a new base, at the end of a run and when a run finds a journal
//! an earlier one left behind.
//!
//! The journal's records arrive in completion order, so they are sorted first: in runs of
//! [`RUN_RECORDS`] that are spilled to unlinked files, then merged (a stable external sort,
//! so each key's records keep their journal order). The sorted changes, the old base and the
//! run's listed keys are then three ascending streams, walked together once: each object's
//! base state has its changes applied, an unlisted one may be dropped (`--delete`), and the
//! result is written to the new base and, when listed and published, hashed into READY's
//! digest. Memory is one run of records, whatever the number of objects.
//!
//! A crash before the new base is renamed into place leaves the old base and the journal; one
//! after it but before the journal is emptied folds the same journal again, which changes
//! nothing: every record sets state rather than adding to it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufReader, Seek, SeekFrom};
use std::time::Instant;

use super::base::{BaseReader, BaseWriter, ObjectStream, BASE};
use super::journal::{self, JournalWriter, Record, RecordReader, SourceInfo};
use super::listed::ListedReader;
use super::ready::DatasetDigest;
use super::{apply, ObjectState, JOURNAL};
use crate::fs::{self, Dir, OFlags};

/// Journal records sorted in memory at a time (a few hundred bytes each); a handful in unit
/// tests, so that they sort through spilled runs.
const RUN_RECORDS: usize = if cfg!(test) { 7 } else { 50_000 };
const SORT_SPILL: &str = "manifest.sort";

/// READY's figures: the objects the run listed that the new base holds published. Only
/// meaningful when the fold was given the listed keys.
#[derive(Debug)]
pub(crate) struct Folded {
    pub digest: blake3::Hash,
    pub objects: u64,
    pub bytes: u64,
    /// Objects in the new base.
    pub kept: u64,
}

/// Writes the new base from `base` (with the source its header names), the records of
/// `journal` (whose header the caller has checked) and `listed`, then empties the journal.
/// `forget_unlisted` says which unlisted objects (by path) to drop. When nothing would change,
/// the base is only read (a warm run rewrites nothing).
pub(crate) fn fold(
    dir: &Dir,
    source: &SourceInfo,
    base: Option<(SourceInfo, BaseReader)>,
    journal: Option<&mut File>,
    listed: Option<ListedReader>,
    forget_unlisted: Option<&dyn Fn(&str) -> bool>,
) -> io::Result<Folded> {
    let started = Instant::now();
    let (base_source, base) = base.unzip();
    let objects = Merged::new(&Spill::In(dir), base, journal)?;
    let unchanged =
        !objects.has_changes() && forget_unlisted.is_none() && base_source.as_ref() == Some(source);
    let mut merge = Merge {
        objects,
        listed,
        forget_unlisted,
    };
    let folded = match unchanged {
        true => merge.run(&mut |_, _| Ok(()))?,
        false => {
            let mut folded = None;
            fs::write_atomic(dir, BASE, |tmp| {
                let mut out = BaseWriter::new(tmp.try_clone()?, source)?;
                folded = Some(merge.run(&mut |key, state| out.push(key, state))?);
                out.finish()
            })?;
            folded.expect("the base was written")
        }
    };
    fs::write_atomic(dir, JOURNAL, |tmp| {
        JournalWriter::start(tmp.try_clone()?, source)?.flush()
    })?;
    tracing::debug!(
        objects = folded.kept,
        rewritten = !unchanged,
        "manifest folded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(folded)
}

/// The ascending streams a fold walks together: the merged objects and the listed keys.
struct Merge<'a> {
    objects: Merged,
    listed: Option<ListedReader>,
    forget_unlisted: Option<&'a dyn Fn(&str) -> bool>,
}

impl Merge<'_> {
    /// Hands every object of the new base to `keep`, in key order.
    fn run(
        &mut self,
        keep: &mut dyn FnMut(&str, &ObjectState) -> io::Result<()>,
    ) -> io::Result<Folded> {
        let mut listed_head = next_listed(&mut self.listed)?;
        let mut digest = DatasetDigest::default();
        let (mut objects, mut bytes, mut kept) = (0, 0, 0);
        while let Some((key, state)) = self.objects.next_object()? {
            while listed_head.as_ref().is_some_and(|head| *head < key) {
                listed_head = next_listed(&mut self.listed)?;
            }
            let is_listed = listed_head.as_ref() == Some(&key);
            if !is_listed
                && self
                    .forget_unlisted
                    .is_some_and(|forget| forget(&state.path))
            {
                continue;
            }
            keep(&key, &state)?;
            kept += 1;
            if let (true, Some(done)) = (is_listed, state.complete) {
                digest.add(&state.path, state.size, &done.blake3);
                objects += 1;
                bytes += state.size;
            }
        }
        Ok(Folded {
            digest: digest.finish(),
            objects,
            bytes,
            kept,
        })
    }
}

/// Where a long journal's sorted runs spill: unlinked files in a directory (the state
/// directory, when the caller holds DEST's lock), or anonymous files in the temporary
/// directory (a dry run, which writes nothing in DEST). Nothing is created until a journal
/// outgrows one run.
pub(crate) enum Spill<'a> {
    In(&'a Dir),
    Temporary,
}

impl Spill<'_> {
    fn file(&self) -> io::Result<File> {
        match self {
            Spill::In(dir) => {
                let flags = OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC;
                let file = dir.open_file(SORT_SPILL, flags)?;
                dir.unlink(SORT_SPILL)?;
                Ok(file)
            }
            Spill::Temporary => tempfile::tempfile(),
        }
    }
}

/// The base with the journal's changes applied: every object's current state, in key order.
/// Memory is one sorted run of journal records; longer journals spill as `spill` says.
pub(crate) struct Merged {
    base: Option<BaseReader>,
    base_head: Option<(String, ObjectState)>,
    changes: SortedChanges,
}

impl Merged {
    pub(crate) fn new(
        spill: &Spill,
        mut base: Option<BaseReader>,
        journal: Option<&mut File>,
    ) -> io::Result<Self> {
        let changes = match journal {
            Some(file) => SortedChanges::sort(spill, file)?,
            None => SortedChanges::default(),
        };
        let base_head = next_object(&mut base)?;
        Ok(Self {
            base,
            base_head,
            changes,
        })
    }

    /// Whether the journal changes anything.
    fn has_changes(&self) -> bool {
        !self.changes.order.is_empty()
    }
}

impl ObjectStream for Merged {
    fn next_object(&mut self) -> io::Result<Option<(String, ObjectState)>> {
        loop {
            let key = match (&self.base_head, self.changes.peek_key()) {
                (None, None) => return Ok(None),
                (Some((a, _)), Some(b)) => a.as_str().min(b).to_string(),
                (Some((a, _)), None) => a.clone(),
                (None, Some(b)) => b.to_string(),
            };
            let mut state = None;
            if self
                .base_head
                .as_ref()
                .is_some_and(|(head, _)| *head == key)
            {
                state = self.base_head.take().map(|(_, state)| state);
                self.base_head = next_object(&mut self.base)?;
            }
            while let Some(record) = self.changes.next_for(&key)? {
                apply(&mut state, record);
            }
            if let Some(state) = state {
                return Ok(Some((key, state)));
            }
        }
    }
}

fn next_object(base: &mut Option<BaseReader>) -> io::Result<Option<(String, ObjectState)>> {
    match base {
        Some(reader) => reader.next_object(),
        None => Ok(None),
    }
}

fn next_listed(listed: &mut Option<ListedReader>) -> io::Result<Option<String>> {
    match listed {
        Some(reader) => reader.next_key(),
        None => Ok(None),
    }
}

/// One sorted run of journal records.
enum SortedRun {
    Memory(std::vec::IntoIter<Record>),
    Spilled(RecordReader<BufReader<File>>),
}

impl SortedRun {
    fn next(&mut self) -> io::Result<Option<Record>> {
        match self {
            SortedRun::Memory(records) => Ok(records.next()),
            SortedRun::Spilled(reader) => reader.next_record(),
        }
    }
}

/// The journal's records in key order, each key's in journal order.
#[derive(Default)]
struct SortedChanges {
    runs: Vec<SortedRun>,
    heads: Vec<Option<Record>>,
    /// The head key of each run that has one, with the run's index: runs are consecutive
    /// stretches of the journal, so on equal keys the earlier run's records come first.
    order: BinaryHeap<Reverse<(String, usize)>>,
}

impl SortedChanges {
    fn sort(spill_to: &Spill, journal: &mut File) -> io::Result<Self> {
        let mut records = journal::read_from_start(journal)?;
        let mut runs = Vec::new();
        let mut chunk = Vec::new();
        while let Some(record) = records.next_record()? {
            if record.key().is_none() {
                continue;
            }
            chunk.push(record);
            if chunk.len() == RUN_RECORDS {
                runs.push(spill(spill_to, std::mem::take(&mut chunk))?);
            }
        }
        sort_by_key(&mut chunk);
        runs.push(SortedRun::Memory(chunk.into_iter()));
        let mut sorted = Self {
            heads: (0..runs.len()).map(|_| None).collect(),
            runs,
            order: BinaryHeap::new(),
        };
        for index in 0..sorted.runs.len() {
            sorted.refill(index)?;
        }
        Ok(sorted)
    }

    fn refill(&mut self, index: usize) -> io::Result<()> {
        let record = self.runs[index].next()?;
        if let Some(key) = record.as_ref().and_then(Record::key) {
            self.order.push(Reverse((key.to_string(), index)));
        }
        self.heads[index] = record;
        Ok(())
    }

    fn peek_key(&self) -> Option<&str> {
        self.order.peek().map(|Reverse((key, _))| key.as_str())
    }

    /// The next record, if it is about `key`.
    fn next_for(&mut self, key: &str) -> io::Result<Option<Record>> {
        if self.peek_key() != Some(key) {
            return Ok(None);
        }
        let Reverse((_, index)) = self.order.pop().expect("peeked");
        let record = self.heads[index].take();
        self.refill(index)?;
        Ok(record)
    }
}

/// Sorts by key; stable, so each key's records keep their order.
fn sort_by_key(records: &mut [Record]) {
    records.sort_by(|a, b| a.key().cmp(&b.key()));
}

/// Sorts `chunk` and writes it to an unlinked file to be read back in order.
fn spill(to: &Spill, mut chunk: Vec<Record>) -> io::Result<SortedRun> {
    sort_by_key(&mut chunk);
    let mut file = to.file()?;
    let mut out = JournalWriter::new(file.try_clone()?);
    for record in &chunk {
        out.append(record)?;
    }
    out.flush()?;
    file.seek(SeekFrom::Start(0))?;
    Ok(SortedRun::Spilled(RecordReader::new(
        BufReader::with_capacity(64 << 10, file),
    )))
}
