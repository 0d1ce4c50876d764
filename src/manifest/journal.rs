//! The manifest's records, and the journal: the append-only file of this run's changes.
//!
//! Each record is `u32 length (LE) | 8-byte BLAKE3 prefix of the payload | JSON payload`; the
//! base ([`super::base`]) is framed the same way. A crash can leave a torn last record; reading
//! stops at the first record that is short or whose checksum does not match, and the file is
//! cut back to the last good record before anything is appended, so a torn tail is ignored
//! and never trusted.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use serde::{Deserialize, Serialize};

use crate::config::SyncConfig;

pub(crate) const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 12;
/// Longest record accepted when reading; anything longer is corruption.
const MAX_RECORD: usize = 64 << 20;

/// Where a dataset comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SourceInfo {
    pub endpoint: Option<String>,
    pub bucket: String,
    pub prefix: String,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// Digest of the snapshot the dataset was hydrated from, if any.
    #[serde(default)]
    pub snapshot: Option<String>,
}

impl From<&SyncConfig> for SourceInfo {
    /// What the manifest records as the source of a dataset synced with `cfg`.
    fn from(cfg: &SyncConfig) -> Self {
        Self {
            endpoint: cfg.client_settings().endpoint.clone(),
            bucket: cfg.source.bucket.clone(),
            prefix: cfg.source.prefix.clone(),
            include: cfg.include.clone(),
            exclude: cfg.exclude.clone(),
            snapshot: cfg.snapshot.as_ref().map(|s| s.digest.clone()),
        }
    }
}

/// One journal entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Record {
    /// First record: format version and source.
    Header { version: u32, source: SourceInfo },
    /// A download of this version of the object starts; earlier parts are void.
    Object {
        key: String,
        path: String,
        size: u64,
        etag: String,
        last_modified_ns: Option<u64>,
        part_size: u64,
        /// Identifies this download attempt: parts of an earlier attempt never count for it.
        attempt: u64,
    },
    /// Parts of the object's current version that are durable: index, chaining value and, when
    /// the object has a full-object checksum, the part's CRC.
    Parts {
        key: String,
        attempt: u64,
        parts: Vec<(u32, String, Option<u64>)>,
    },
    /// The file is published and durable under its final name.
    Complete {
        key: String,
        etag: String,
        blake3: String,
        inode: u64,
        mtime_ns: u64,
    },
    /// The object is no longer mirrored (deleted locally, or found corrupt).
    Forget { key: String },
}

impl Record {
    /// The object the record is about (`None` for the header).
    pub(crate) fn key(&self) -> Option<&str> {
        match self {
            Record::Header { .. } => None,
            Record::Object { key, .. }
            | Record::Parts { key, .. }
            | Record::Complete { key, .. }
            | Record::Forget { key } => Some(key),
        }
    }
}

/// Reads the intact records of a journal or base file in order: iteration ends at the first
/// record that is short, too long, fails its checksum or does not parse, so a torn or corrupt
/// tail is never trusted. Memory stays at one record.
pub(crate) struct RecordReader<R> {
    reader: R,
    payload: Vec<u8>,
    /// Records read so far.
    pub count: u64,
    /// Length of the intact prefix read so far.
    pub intact: u64,
}

impl<R: Read> RecordReader<R> {
    pub(crate) fn new(reader: R) -> Self {
        Self {
            reader,
            payload: Vec::new(),
            count: 0,
            intact: 0,
        }
    }

    /// The first record, as the header of this format: the dataset's source, or `None` when
    /// it is missing, unreadable or of another format.
    pub(crate) fn header(&mut self) -> io::Result<Option<SourceInfo>> {
        Ok(match self.next_record()? {
            Some(Record::Header {
                version: FORMAT_VERSION,
                source,
            }) => Some(source),
            _ => None,
        })
    }

    /// The next intact record; `Ok(None)` at the end of the intact prefix.
    pub(crate) fn next_record(&mut self) -> io::Result<Option<Record>> {
        let mut header = [0u8; HEADER_LEN];
        if read_full(&mut self.reader, &mut header)? < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        if len > MAX_RECORD {
            return Ok(None);
        }
        self.payload.resize(len, 0);
        if read_full(&mut self.reader, &mut self.payload)? < len
            || blake3::hash(&self.payload).as_bytes()[..8] != header[4..]
        {
            return Ok(None);
        }
        let Ok(record) = serde_json::from_slice::<Record>(&self.payload) else {
            return Ok(None);
        };
        self.count += 1;
        self.intact += (HEADER_LEN + len) as u64;
        Ok(Some(record))
    }
}

/// Opens `file` from its start for [`RecordReader`].
pub(crate) fn read_from_start(file: &mut File) -> io::Result<RecordReader<BufReader<&mut File>>> {
    file.seek(SeekFrom::Start(0))?;
    Ok(RecordReader::new(BufReader::with_capacity(1 << 20, file)))
}

/// Reads as much of `buf` as the file still holds.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Frames one record.
pub(crate) fn encode(record: &Record) -> Vec<u8> {
    let payload = serde_json::to_vec(record).expect("records serialise");
    let mut framed = Vec::with_capacity(HEADER_LEN + payload.len());
    framed.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    framed.extend_from_slice(&blake3::hash(&payload).as_bytes()[..8]);
    framed.extend_from_slice(&payload);
    framed
}

/// Appends framed records to the journal file.
pub(crate) struct JournalWriter {
    out: BufWriter<File>,
}

impl JournalWriter {
    pub(crate) fn new(file: File) -> Self {
        Self {
            out: BufWriter::with_capacity(256 << 10, file),
        }
    }

    /// A writer of a new file, which starts with the header naming `source`.
    pub(crate) fn start(file: File, source: &SourceInfo) -> io::Result<Self> {
        let mut out = Self::new(file);
        out.append(&Record::Header {
            version: FORMAT_VERSION,
            source: source.clone(),
        })?;
        Ok(out)
    }

    pub(crate) fn append(&mut self, record: &Record) -> io::Result<()> {
        self.out.write_all(&encode(record))
    }

    /// Hands everything appended so far to the kernel.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Makes everything appended so far durable.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.flush()?;
        self.out.get_ref().sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_records(file: &mut File) -> io::Result<(Vec<Record>, u64)> {
        let mut records = Vec::new();
        let mut reader = read_from_start(file)?;
        while let Some(record) = reader.next_record()? {
            records.push(record);
        }
        Ok((records, reader.intact))
    }

    fn forget(i: usize) -> Record {
        Record::Forget {
            key: format!("k{i}"),
        }
    }

    #[test]
    fn torn_and_corrupt_tails_are_ignored() {
        let mut file = tempfile::tempfile().unwrap();
        let mut all = Vec::new();
        for i in 0..3 {
            all.extend(encode(&forget(i)));
        }
        let good_len = all.len();
        let last = encode(&forget(3));
        // Torn: only part of the last record reached the disk.
        for cut in [1, 5, HEADER_LEN, last.len() - 1] {
            file.set_len(0).unwrap();
            file.seek(SeekFrom::Start(0)).unwrap();
            file.write_all(&all).unwrap();
            file.write_all(&last[..cut]).unwrap();
            file.seek(SeekFrom::Start(0)).unwrap();
            let (records, intact) = read_records(&mut file).unwrap();
            assert_eq!(records, (0..3).map(forget).collect::<Vec<_>>());
            assert_eq!(intact, good_len as u64);
        }
        // Corrupt: a flipped byte in the last record's payload.
        let mut flipped = last.clone();
        *flipped.last_mut().unwrap() ^= 0x20;
        file.set_len(0).unwrap();
        file.seek(SeekFrom::Start(0)).unwrap();
        file.write_all(&all).unwrap();
        file.write_all(&flipped).unwrap();
        file.seek(SeekFrom::Start(0)).unwrap();
        let (records, intact) = read_records(&mut file).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(intact, good_len as u64);
    }
}
