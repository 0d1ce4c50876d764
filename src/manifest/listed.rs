//! The keys a run listed and mirrors, spooled in listing order to an unlinked file in the
//! state directory. The fold at the end of the run reads them back in step with the base, so
//! it knows which objects are still in the source without a set of every key in memory.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use crate::fs::{Dir, OFlags};

const SPOOL: &str = "listed.spool";

/// Keys being spooled, in the ascending order they were listed.
pub(crate) struct ListedKeys {
    out: BufWriter<File>,
}

impl ListedKeys {
    /// Starts an empty spool in `dir`; its file has no name, so nothing is left behind.
    pub(crate) fn create(dir: &Dir) -> io::Result<Self> {
        let file = dir.open_file(SPOOL, OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC)?;
        dir.unlink(SPOOL)?;
        Ok(Self::in_file(file))
    }

    /// Starts an empty spool in `file` (an anonymous temporary file).
    pub(crate) fn in_file(file: File) -> Self {
        Self {
            out: BufWriter::with_capacity(256 << 10, file),
        }
    }

    pub(crate) fn push(&mut self, key: &str) -> io::Result<()> {
        self.out.write_all(&(key.len() as u32).to_le_bytes())?;
        self.out.write_all(key.as_bytes())
    }

    /// Reads the keys back from the first.
    pub(crate) fn into_reader(self) -> io::Result<ListedReader> {
        let mut file = self.out.into_inner().map_err(|err| err.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        Ok(ListedReader {
            input: BufReader::with_capacity(256 << 10, file),
        })
    }
}

/// The spooled keys, in order.
pub(crate) struct ListedReader {
    input: BufReader<File>,
}

impl ListedReader {
    pub(crate) fn next_key(&mut self) -> io::Result<Option<String>> {
        let mut len = [0u8; 4];
        match self.input.read_exact(&mut len) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(err) => return Err(err),
        }
        let mut key = vec![0u8; u32::from_le_bytes(len) as usize];
        self.input.read_exact(&mut key)?;
        String::from_utf8(key)
            .map(Some)
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
    }
}
