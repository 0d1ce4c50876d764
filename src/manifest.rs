//! What DEST holds, durably: the manifest (`.hydrator/manifest.journal`), the READY marker and
//! the lock, all inside DEST's `.hydrator/` directory.
//!
//! The manifest is the memory of past runs: per object, the version being mirrored, which
//! parts are durable with their BLAKE3 chaining values (so a killed run resumes at part
//! granularity), and for a published file its hash, inode and mtime (so a warm re-run skips it
//! without reading it). Its state lives in memory during a run and on disk as a journal (see
//! [`journal`]); a completed file keeps only its hash, not its parts.

pub(crate) mod journal;
pub(crate) mod lock;
pub(crate) mod ready;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::sync::{Mutex, MutexGuard};

use blake3::hazmat::ChainingValue;

use journal::{JournalWriter, Record, SourceInfo, FORMAT_VERSION};

use crate::fs::{self, Dir, OFlags};

const JOURNAL: &str = "manifest.journal";
/// Compact when the journal holds this many more records than the live state needs.
const COMPACT_SLACK: u64 = 10_000;

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
    /// Listed (and mirrored or found up to date) by this run.
    pub seen: bool,
}

/// The manifest's state in memory.
#[derive(Default)]
pub(crate) struct State {
    /// Boxed: the table then holds 24-byte entries, so growing it (old and new table both
    /// alive) costs little; inline states made that peak 78 MiB at 200,000 objects.
    pub objects: HashMap<String, Box<ObjectState>>,
}

impl State {
    fn apply(&mut self, record: Record) {
        match record {
            Record::Header { .. } => {}
            Record::Object {
                key,
                path,
                size,
                etag,
                last_modified_ns,
                part_size,
                attempt,
            } => {
                let object = ObjectState {
                    path,
                    size,
                    etag,
                    last_modified_ns,
                    part_size,
                    attempt,
                    parts: BTreeMap::new(),
                    complete: None,
                    seen: false,
                };
                self.objects.insert(key, Box::new(object));
            }
            Record::Parts {
                key,
                attempt,
                parts,
            } => {
                if let Some(object) = self.objects.get_mut(&key).filter(|o| o.attempt == attempt) {
                    for (index, cv, crc) in parts {
                        if let Some(cv) = parse_hex32(&cv) {
                            object.parts.insert(index, DurablePart { cv, crc });
                        }
                    }
                }
            }
            Record::Complete {
                key,
                etag,
                blake3,
                inode,
                mtime_ns,
            } => {
                if let (Some(object), Some(hash)) = (
                    self.objects.get_mut(&key).filter(|o| o.etag == etag),
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
            Record::Forget { key } => {
                self.objects.remove(&key);
            }
        }
    }

    /// The records that rebuild this state.
    /// Writes the records that rebuild this state, one at a time.
    fn write_records(&self, source: &SourceInfo, out: &mut JournalWriter) -> io::Result<()> {
        out.append(&Record::Header {
            version: FORMAT_VERSION,
            source: source.clone(),
        })?;
        for (key, o) in &self.objects {
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
        }
        Ok(())
    }
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

/// Whether two sources are the same dataset (filters and snapshot may differ).
fn same_dataset(a: &SourceInfo, b: &SourceInfo) -> bool {
    a.endpoint == b.endpoint && a.bucket == b.bucket && a.prefix == b.prefix
}

/// The open manifest of a DEST.
pub(crate) struct Manifest {
    dir: Dir,
    source: SourceInfo,
    state: Mutex<State>,
    journal: Mutex<JournalWriter>,
}

impl Manifest {
    /// Opens the manifest in DEST's state directory `dir` for `source`. A manifest of another
    /// source (endpoint, bucket or prefix) is set aside: DEST then starts from an empty one.
    pub(crate) fn open(dir: Dir, source: &SourceInfo) -> io::Result<Self> {
        let mut file = dir.open_file(JOURNAL, OFlags::RDWR | OFlags::CREATE)?;
        let mut state = State::default();
        let mut header: Option<Option<SourceInfo>> = None;
        let (count, intact) = journal::replay(&mut file, &mut |record| {
            match &header {
                None => {
                    header = Some(match record {
                        Record::Header {
                            version: FORMAT_VERSION,
                            source: old,
                        } => Some(old),
                        _ => None,
                    });
                    // Records of another source or format are not read at all.
                    header
                        .as_ref()
                        .is_some_and(|h| h.as_ref().is_some_and(|old| same_dataset(old, source)))
                }
                Some(_) => {
                    state.apply(record);
                    true
                }
            }
        })?;
        let header_current = matches!(&header, Some(Some(old)) if old == source);
        match &header {
            Some(Some(old)) if !same_dataset(old, source) => {
                tracing::warn!(
                "DEST was mirrored from s3://{}/{} before; starting a new manifest for s3://{}/{}",
                old.bucket, old.prefix, source.bucket, source.prefix
            )
            }
            Some(None) => tracing::warn!("the manifest has an unknown format; starting a new one"),
            _ => {}
        }
        file.set_len(intact)?;
        file.seek(SeekFrom::End(0))?;
        let manifest = Self {
            dir,
            source: source.clone(),
            state: Mutex::new(state),
            journal: Mutex::new(JournalWriter::new(file)),
        };
        // Compaction also rewrites the header, when filters or the snapshot changed.
        if !header_current || count > manifest.state().objects.len() as u64 * 3 + COMPACT_SLACK {
            manifest.compact()?;
        }
        Ok(manifest)
    }

    /// Opens the manifest of DEST as it is, whatever its source (for `verify`).
    pub(crate) fn open_existing(dir: Dir) -> io::Result<Option<(SourceInfo, Self)>> {
        let mut file = match dir.open_file(JOURNAL, OFlags::RDONLY) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        let mut first = None;
        journal::replay(&mut file, &mut |record| {
            first = Some(record);
            false
        })?;
        let Some(Record::Header {
            version: FORMAT_VERSION,
            source,
        }) = first
        else {
            return Ok(None);
        };
        drop(file);
        Ok(Some((source.clone(), Self::open(dir, &source)?)))
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("manifest state lock")
    }

    pub(crate) fn lookup(&self, key: &str) -> Option<ObjectState> {
        self.state().objects.get(key).map(|o| ObjectState::clone(o))
    }

    /// Looks at `key`'s state without copying it.
    pub(crate) fn inspect<T>(&self, key: &str, look: impl FnOnce(Option<&ObjectState>) -> T) -> T {
        look(self.state().objects.get(key).map(|o| &**o))
    }

    fn record(&self, record: Record) -> io::Result<()> {
        self.journal.lock().expect("journal lock").append(&record)?;
        self.state().apply(record);
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
        self.record(complete_record(key, etag, &completed))?;
        self.mark_seen(key);
        Ok(())
    }

    pub(crate) fn forget(&self, key: &str) -> io::Result<()> {
        self.record(Record::Forget {
            key: key.to_string(),
        })
    }

    pub(crate) fn mark_seen(&self, key: &str) {
        if let Some(object) = self.state().objects.get_mut(key) {
            object.seen = true;
        }
    }

    /// Makes every record so far durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.journal.lock().expect("journal lock").sync()
    }

    /// Rewrites the journal as the live state, atomically ([`fs::write_atomic`]).
    pub(crate) fn compact(&self) -> io::Result<()> {
        let mut journal = self.journal.lock().expect("journal lock");
        fs::write_atomic(&self.dir, JOURNAL, |tmp| {
            let mut writer = JournalWriter::new(tmp.try_clone()?);
            self.state().write_records(&self.source, &mut writer)?;
            writer.flush()
        })?;
        let mut file: File = self.dir.open_file(JOURNAL, OFlags::RDWR)?;
        file.seek(SeekFrom::End(0))?;
        file.flush()?;
        *journal = JournalWriter::new(file);
        Ok(())
    }

    /// Compacts if this run appended many records (end of a run).
    pub(crate) fn compact_if_grown(&self) -> io::Result<()> {
        let appended = self.journal.lock().expect("journal lock").appended;
        if appended > self.state().objects.len() as u64 + COMPACT_SLACK {
            self.compact()?;
        }
        self.sync()
    }
}
