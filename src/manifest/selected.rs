//! `DEST/.hydrator/selected`: how many objects, and bytes, the last run's listing selected.
//! The manifest holds only the objects a run has begun, so without this record a DEST with no
//! READY could not say how far from complete it is. A run removes it as it starts and writes
//! it once its listing has ended: when it is missing, the last run stopped before that (or
//! DEST was written by a hydrator that did not keep it). `verify` reads it.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use crate::fs::{self, Dir};

const SELECTED: &str = "selected";

/// What a whole listing selected (the filters and the shard applied; refused keys count).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Selected {
    pub objects: u64,
    pub bytes: u64,
}

/// Forgets the last run's figures, before a run changes DEST.
pub(crate) fn remove(state_dir: &Dir) -> io::Result<()> {
    state_dir.unlink(SELECTED)
}

pub(crate) fn write(state_dir: &Dir, selected: Selected) -> io::Result<()> {
    fs::write_atomic(state_dir, SELECTED, |file| {
        file.write_all(&serde_json::to_vec(&selected)?)
    })
}

/// The last run's figures, if its listing ended.
pub(crate) fn read(state_dir: &Dir) -> Option<Selected> {
    super::read_json(state_dir, SELECTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_read_back_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        assert_eq!(read(&dir), None);
        let selected = Selected {
            objects: 365,
            bytes: 250 << 20,
        };
        write(&dir, selected).unwrap();
        assert_eq!(read(&dir), Some(selected));
        remove(&dir).unwrap();
        assert_eq!(read(&dir), None);
        remove(&dir).unwrap();
    }
}
