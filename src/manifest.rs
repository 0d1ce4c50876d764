//! What DEST holds, durably: the manifest (`.hydrator/manifest.base` and
//! `.hydrator/manifest.journal`), the READY marker and the lock, all inside DEST's
//! `.hydrator/` directory.
//!
//! The manifest is the memory of past runs: per object, the version being mirrored, which
//! parts are durable with their BLAKE3 chaining values (so a killed run resumes at part
//! granularity), and for a published file its hash, inode and mtime (so a warm re-run skips it
//! without reading it).
//!
//! It is never held whole in memory, so memory stays flat in the number of objects (1.28
//! million files is a common dataset). On disk it is a base sorted by key ([`base`]) plus a
//! journal of this run's changes ([`journal`]). A run reads the base in step with the sorted
//! listing ([`base::Cursor`]), keeps only the objects in flight in memory, and at its end folds
//! the journal into a new base ([`fold`]), computing READY's digest in the same pass.

pub(crate) mod base;
pub(crate) mod fold;
pub(crate) mod journal;
pub(crate) mod listed;
pub(crate) mod lock;
pub(crate) mod ready;
pub(crate) mod selected;
pub(crate) mod view;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::sync::{Mutex, MutexGuard};

use blake3::hazmat::ChainingValue;

use base::{BaseReader, Cursor, ObjectStream};
use fold::Folded;
use journal::{JournalWriter, Record, SourceInfo};
use listed::ListedKeys;

use crate::fs::{Dir, OFlags};

pub(crate) const JOURNAL: &str = "manifest.journal";

/// A published, durable file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Completed {
    pub blake3: [u8; 32],
    pub inode: u64,
    pub mtime_ns: u64,
}

/// A part known to be on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DurablePart {
    pub cv: ChainingValue,
    /// The part's CRC, when the object has a full-object checksum.
    pub crc: Option<u64>,
}

/// What the manifest knows of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ObjectState {
    pub path: String,
    pub size: u64,
    pub etag: String,
    pub last_modified_ns: Option<u64>,
    pub part_size: u64,
    /// The download attempt the durable parts belong to.
    pub attempt: u64,
    /// Durable parts of an unfinished download.
    pub parts: BTreeMap<u32, DurablePart>,
    pub complete: Option<Completed>,
}

/// Applies one record to the state of its key (`None`: not known). A journal, or the base
/// followed by the journal, replays into the current state by applying its records in order.
pub(crate) fn apply(slot: &mut Option<ObjectState>, record: Record) {
    match record {
        Record::Header { .. } => {}
        Record::Object {
            path,
            size,
            etag,
            last_modified_ns,
            part_size,
            attempt,
            ..
        } => {
            *slot = Some(ObjectState {
                path,
                size,
                etag,
                last_modified_ns,
                part_size,
                attempt,
                parts: BTreeMap::new(),
                complete: None,
            });
        }
        Record::Parts { attempt, parts, .. } => {
            // Parts recorded after their file was published describe nothing still pending.
            let pending = slot
                .as_mut()
                .filter(|o| o.attempt == attempt && o.complete.is_none());
            if let Some(object) = pending {
                for (index, cv, crc) in parts {
                    if let Some(cv) = parse_hex32(&cv) {
                        object.parts.insert(index, DurablePart { cv, crc });
                    }
                }
            }
        }
        Record::Complete {
            etag,
            blake3,
            inode,
            mtime_ns,
            ..
        } => {
            if let (Some(object), Some(hash)) = (
                slot.as_mut().filter(|o| o.etag == etag),
                parse_hex32(&blake3),
            ) {
                object.parts.clear();
                object.complete = Some(Completed {
                    blake3: hash,
                    inode,
                    mtime_ns,
                });
            }
        }
        Record::Forget { .. } => *slot = None,
    }
}

/// Writes the records that rebuild `key`'s state.
pub(crate) fn write_object(out: &mut JournalWriter, key: &str, o: &ObjectState) -> io::Result<()> {
    out.append(&object_record(key, o))?;
    if !o.parts.is_empty() {
        out.append(&parts_record(
            key,
            o.attempt,
            o.parts.iter().map(|(i, p)| (*i, *p)),
        ))?;
    }
    if let Some(c) = &o.complete {
        out.append(&complete_record(key, &o.etag, c))?;
    }
    Ok(())
}

fn object_record(key: &str, o: &ObjectState) -> Record {
    Record::Object {
        key: key.to_string(),
        path: o.path.clone(),
        size: o.size,
        etag: o.etag.clone(),
        last_modified_ns: o.last_modified_ns,
        part_size: o.part_size,
        attempt: o.attempt,
    }
}

fn parts_record(
    key: &str,
    attempt: u64,
    parts: impl Iterator<Item = (u32, DurablePart)>,
) -> Record {
    Record::Parts {
        key: key.to_string(),
        attempt,
        parts: parts.map(|(i, p)| (i, hex(&p.cv), p.crc)).collect(),
    }
}

fn complete_record(key: &str, etag: &str, c: &Completed) -> Record {
    Record::Complete {
        key: key.to_string(),
        etag: etag.to_string(),
        blake3: hex(&c.blake3),
        inode: c.inode,
        mtime_ns: c.mtime_ns,
    }
}

pub(crate) fn hex(bytes: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*bytes).to_hex().to_string()
}

pub(crate) fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    blake3::Hash::from_hex(text).ok().map(|h| *h.as_bytes())
}

/// The JSON file `name` in the state directory, if present and readable.
fn read_json<T: serde::de::DeserializeOwned>(state_dir: &Dir, name: &str) -> Option<T> {
    let mut file = state_dir.open_file(name, OFlags::RDONLY).ok()?;
    let mut text = String::new();
    io::Read::read_to_string(&mut file, &mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether two sources are the same dataset: the same bucket and prefix. The endpoint may
/// differ (a Service name instead of an IP, a second gateway to the same store): every part is
/// pinned to its ETag, so what was mirrored through one address stays valid through another.
/// Filters and snapshot may differ too.
pub(crate) fn same_dataset(a: &SourceInfo, b: &SourceInfo) -> bool {
    a.bucket == b.bucket && a.prefix == b.prefix
}

/// What the manifest in `dir` records: the source it names (its base's, else its journal's)
/// and whether it holds any object, in its base or its journal. A manifest of no object (a run
/// that found nothing to mirror) holds no dataset's files.
pub(crate) fn recorded(dir: &Dir) -> io::Result<Option<(SourceInfo, bool)>> {
    let base_source = match BaseReader::open(dir)? {
        Some((source, mut base)) => match base.next_object()? {
            Some(_) => return Ok(Some((source, true))),
            None => Some(source),
        },
        None => None,
    };
    let (journal_source, journal_holds) = match dir.open_file(JOURNAL, OFlags::RDONLY) {
        Ok(mut file) => {
            let mut records = journal::read_from_start(&mut file)?;
            (records.header()?, records.next_record()?.is_some())
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => (None, false),
        Err(err) => return Err(err),
    };
    Ok(base_source
        .or(journal_source)
        .map(|source| (source, journal_holds)))
}

/// The open manifest of a DEST. The caller holds DEST's lock.
pub(crate) struct Manifest {
    dir: Dir,
    source: SourceInfo,
    /// The objects being mirrored now and their state (`None`: not known yet), adopted from
    /// the base by their tasks; records of other keys go to the journal only.
    in_flight: Mutex<HashMap<String, Option<ObjectState>>>,
    journal: Mutex<JournalWriter>,
}

impl Manifest {
    /// Opens the manifest in DEST's state directory `dir` for `source`. A manifest of another
    /// source (endpoint, bucket or prefix) is set aside: DEST then starts from an empty one. A
    /// journal left by an earlier run (killed, or of an older format that had no base) is
    /// folded into the base first.
    pub(crate) fn open(dir: Dir, source: &SourceInfo) -> io::Result<Self> {
        let base = BaseReader::open(&dir)?;
        let base_source = base.as_ref().map(|(old, _)| old.clone());
        let base = base.filter(|(old, _)| same_dataset(old, source));
        let mut file = dir.open_file(JOURNAL, OFlags::RDWR | OFlags::CREATE)?;
        let (journal_source, has_records, intact) = {
            let mut records = journal::read_from_start(&mut file)?;
            let header = records.header()?;
            if header.is_none() && records.count > 0 {
                tracing::warn!("the manifest journal has an unknown format; setting it aside");
            }
            let has_records = records.next_record()?.is_some();
            (header, has_records, records.intact)
        };
        if let Some(old) = base_source
            .iter()
            .chain(&journal_source)
            .find(|old| !same_dataset(old, source))
        {
            let differs = match old.bucket == source.bucket {
                true => format!("prefix {:?}, now {:?}", old.prefix, source.prefix),
                false => format!("bucket {:?}, now {:?}", old.bucket, source.bucket),
            };
            tracing::warn!(
                "DEST was mirrored from s3://{}/{} before ({differs}); starting a new manifest",
                old.bucket,
                old.prefix,
            );
        }
        let journal_usable = journal_source
            .as_ref()
            .is_some_and(|old| same_dataset(old, source));
        let current = base_source.as_ref() == Some(source)
            && journal_source.as_ref() == Some(source)
            && !has_records;
        if current {
            file.set_len(intact)?;
            file.seek(SeekFrom::End(0))?;
        } else {
            // Also rewrites the headers when the filters or the snapshot changed.
            let journal = journal_usable.then_some(&mut file);
            fold::fold(&dir, source, base, journal, None, None)?;
            file = dir.open_file(JOURNAL, OFlags::RDWR)?;
            file.seek(SeekFrom::End(0))?;
        }
        Ok(Self {
            dir,
            source: source.clone(),
            in_flight: Mutex::default(),
            journal: Mutex::new(JournalWriter::new(file)),
        })
    }

    /// Opens the manifest of DEST as it is, whatever its source (for `verify`).
    pub(crate) fn open_existing(dir: Dir) -> io::Result<Option<(SourceInfo, Self)>> {
        match recorded(&dir)? {
            Some((source, _)) => Ok(Some((source.clone(), Self::open(dir, &source)?))),
            None => Ok(None),
        }
    }

    /// Reads the base in ascending key order, from its start.
    pub(crate) fn cursor(&self) -> io::Result<Cursor> {
        Ok(Cursor::new(BaseReader::open(&self.dir)?.map(
            |(_, reader)| Box::new(reader) as Box<dyn ObjectStream>,
        )))
    }

    fn in_flight(&self) -> MutexGuard<'_, HashMap<String, Option<ObjectState>>> {
        self.in_flight.lock().expect("manifest state lock")
    }

    /// `key` is being mirrored from now on, starting from `known` (what the base holds).
    pub(crate) fn adopt(&self, key: &str, known: Option<ObjectState>) {
        self.in_flight().insert(key.to_string(), known);
    }

    /// `key` is no longer being mirrored by this run; its state lives on in the journal.
    pub(crate) fn release(&self, key: &str) {
        self.in_flight().remove(key);
    }

    /// The state of `key`, which is in flight.
    pub(crate) fn lookup(&self, key: &str) -> Option<ObjectState> {
        self.in_flight().get(key).cloned().flatten()
    }

    /// Looks at the state of `key`, which is in flight, without copying it.
    pub(crate) fn inspect<T>(&self, key: &str, look: impl FnOnce(Option<&ObjectState>) -> T) -> T {
        look(self.in_flight().get(key).and_then(Option::as_ref))
    }

    fn record(&self, record: Record) -> io::Result<()> {
        self.journal.lock().expect("journal lock").append(&record)?;
        let mut in_flight = self.in_flight();
        if let Some(slot) = record.key().and_then(|key| in_flight.get_mut(key)) {
            apply(slot, record);
        }
        Ok(())
    }

    /// A download of this version starts from nothing.
    pub(crate) fn start_object(&self, key: &str, object: &ObjectState) -> io::Result<()> {
        self.record(object_record(key, object))
    }

    /// These parts of `key`'s download `attempt` are durable.
    pub(crate) fn parts_durable(
        &self,
        key: &str,
        attempt: u64,
        parts: &[(u32, DurablePart)],
    ) -> io::Result<()> {
        self.record(parts_record(key, attempt, parts.iter().copied()))
    }

    /// `key` at `etag` is published and durable.
    pub(crate) fn complete(&self, key: &str, etag: &str, completed: Completed) -> io::Result<()> {
        self.record(complete_record(key, etag, &completed))
    }

    pub(crate) fn forget(&self, key: &str) -> io::Result<()> {
        self.record(Record::Forget {
            key: key.to_string(),
        })
    }

    /// Makes every record so far durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.journal.lock().expect("journal lock").sync()
    }

    /// Folds the journal into a new base (see [`fold`]). `listed` holds the keys this run
    /// listed, when it listed the whole source: READY's figures are then those of the listed,
    /// published objects, and with `forget_unlisted` the objects it accepts that were not
    /// listed are dropped.
    pub(crate) fn fold(
        &self,
        listed: Option<ListedKeys>,
        forget_unlisted: Option<&dyn Fn(&str) -> bool>,
    ) -> io::Result<Folded> {
        let mut journal = self.journal.lock().expect("journal lock");
        journal.flush()?;
        let base = BaseReader::open(&self.dir)?;
        let mut file = self.dir.open_file(JOURNAL, OFlags::RDONLY)?;
        let listed = listed.map(ListedKeys::into_reader).transpose()?;
        let folded = fold::fold(
            &self.dir,
            &self.source,
            base,
            Some(&mut file),
            listed,
            forget_unlisted,
        )?;
        let mut file: File = self.dir.open_file(JOURNAL, OFlags::RDWR)?;
        file.seek(SeekFrom::End(0))?;
        *journal = JournalWriter::new(file);
        Ok(folded)
    }
}

#[cfg(test)]
mod tests;
