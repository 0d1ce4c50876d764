//! The manifest's base (`manifest.base`): every object's state, sorted by key, written whole
//! by [`super::fold`] and never appended to. After a `Header`, each object is the records that
//! rebuild it: `Object`, then `Parts` while it is unfinished, then `Complete` once published.
//!
//! S3 lists keys in ascending order, so a run looks objects up with a [`Cursor`] that moves
//! forward through the base in step with the listing: a merge-join that holds one object in
//! memory, where a table of the whole base would hold hundreds of bytes per object. A base
//! whose keys are not ascending is read up to the first one out of order, like a torn tail.

use std::fs::File;
use std::io::{self, BufReader};

use super::journal::{JournalWriter, Record, RecordReader, SourceInfo};
use super::{apply, write_object, ObjectState};
use crate::fs::{Dir, OFlags};

pub(crate) const BASE: &str = "manifest.base";

/// Reads the base's objects in key order.
pub(crate) struct BaseReader {
    records: RecordReader<BufReader<File>>,
    /// The first record of the next object, read while looking for the end of the last one.
    next: Option<Record>,
    last_key: Option<String>,
}

impl BaseReader {
    /// Opens the base in `dir` and reads its source; `None` when there is none or its header
    /// is unreadable or of another format.
    pub(crate) fn open(dir: &Dir) -> io::Result<Option<(SourceInfo, Self)>> {
        let file = match dir.open_file(BASE, OFlags::RDONLY) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        let mut records = RecordReader::new(BufReader::with_capacity(1 << 20, file));
        let Some(source) = records.header()? else {
            return Ok(None);
        };
        let reader = Self {
            records,
            next: None,
            last_key: None,
        };
        Ok(Some((source, reader)))
    }

    /// The next object and its state.
    pub(crate) fn next_object(&mut self) -> io::Result<Option<(String, ObjectState)>> {
        loop {
            let first = match self.next.take() {
                Some(record) => record,
                None => match self.records.next_record()? {
                    Some(record) => record,
                    None => return Ok(None),
                },
            };
            let Some(key) = first.key().map(str::to_string) else {
                continue;
            };
            if self.last_key.as_ref().is_some_and(|last| key <= *last) {
                tracing::warn!(
                    "the manifest base is out of order after {:?}; reading stops there",
                    self.last_key
                );
                return Ok(None);
            }
            let mut state = None;
            apply(&mut state, first);
            while let Some(record) = self.records.next_record()? {
                if record.key() != Some(&key) {
                    self.next = Some(record);
                    break;
                }
                apply(&mut state, record);
            }
            self.last_key = Some(key.clone());
            if let Some(state) = state {
                return Ok(Some((key, state)));
            }
        }
    }
}

/// Objects and their state, in ascending key order: the base as written, or the base with a
/// journal applied ([`super::fold::Merged`]).
pub(crate) trait ObjectStream: Send {
    fn next_object(&mut self) -> io::Result<Option<(String, ObjectState)>>;
}

impl ObjectStream for BaseReader {
    fn next_object(&mut self) -> io::Result<Option<(String, ObjectState)>> {
        BaseReader::next_object(self)
    }
}

/// Looks objects up in an [`ObjectStream`] in ascending key order.
pub(crate) struct Cursor {
    reader: Option<Box<dyn ObjectStream>>,
    head: Option<(String, ObjectState)>,
    last_asked: Option<String>,
}

impl Cursor {
    pub(crate) fn new(reader: Option<Box<dyn ObjectStream>>) -> Self {
        Self {
            reader,
            head: None,
            last_asked: None,
        }
    }

    /// Moves to the first object at or after `key`. Keys must be asked in ascending order
    /// (the same key again is fine); going back is an error, never a wrong answer.
    fn advance_to(&mut self, key: &str) -> io::Result<Option<&mut (String, ObjectState)>> {
        if self.last_asked.as_deref().is_some_and(|last| key < last) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "manifest looked up out of key order: {key:?} after {:?}",
                    self.last_asked
                ),
            ));
        }
        // Reuses the buffer: this runs once per listed object.
        match &mut self.last_asked {
            Some(last) if last != key => {
                last.clear();
                last.push_str(key);
            }
            Some(_) => {}
            None => self.last_asked = Some(key.to_string()),
        }
        while self
            .head
            .as_ref()
            .is_none_or(|(head, _)| head.as_str() < key)
        {
            self.head = match &mut self.reader {
                Some(reader) => reader.next_object()?,
                None => None,
            };
            if self.head.is_none() {
                self.reader = None;
                return Ok(None);
            }
        }
        Ok(self.head.as_mut())
    }

    /// The state of `key`, if the base holds it.
    pub(crate) fn find(&mut self, key: &str) -> io::Result<Option<&ObjectState>> {
        Ok(self
            .advance_to(key)?
            .filter(|(head, _)| head == key)
            .map(|(_, state)| &*state))
    }

    /// Takes the state of `key` out of the cursor, if the base holds it.
    pub(crate) fn take(&mut self, key: &str) -> io::Result<Option<ObjectState>> {
        let found = self.advance_to(key)?.is_some_and(|(head, _)| head == key);
        Ok(found.then(|| self.head.take().expect("found").1))
    }
}

/// Writes a base: the header, then objects in strictly ascending key order.
pub(crate) struct BaseWriter {
    out: JournalWriter,
    last_key: Option<String>,
}

impl BaseWriter {
    pub(crate) fn new(file: File, source: &SourceInfo) -> io::Result<Self> {
        Ok(Self {
            out: JournalWriter::start(file, source)?,
            last_key: None,
        })
    }

    pub(crate) fn push(&mut self, key: &str, state: &ObjectState) -> io::Result<()> {
        if self.last_key.as_deref().is_some_and(|last| key <= last) {
            return Err(io::Error::other(format!(
                "manifest base written out of key order: {key:?} after {:?}",
                self.last_key
            )));
        }
        write_object(&mut self.out, key, state)?;
        self.last_key = Some(key.to_string());
        Ok(())
    }

    pub(crate) fn finish(mut self) -> io::Result<()> {
        self.out.flush()
    }
}
