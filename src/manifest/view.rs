//! The manifest as the next run would find it, read without writing a byte: the base with an
//! interrupted run's journal applied as it is read, where a run would first fold the journal
//! into a new base. `--dry-run` and `verify` read DEST through it; a long journal's sorted
//! runs spill as the caller says ([`Spill`]): to the state directory under DEST's lock, to the
//! temporary directory in a dry run.

use std::io;

use super::base::{BaseReader, Cursor, ObjectStream};
use super::fold::{Merged, Spill};
use super::journal::{self, SourceInfo};
use super::{same_dataset, JOURNAL};
use crate::fs::{Dir, OFlags};

pub(crate) struct ManifestView {
    dir: Dir,
    source: SourceInfo,
    /// Whether the base, and the journal, are of `source`'s dataset (a run sets others aside).
    use_base: bool,
    use_journal: bool,
    /// Spill to the state directory (else to the temporary directory).
    spill_in_place: bool,
}

impl ManifestView {
    /// Reads the manifest in the state directory `dir` as a run of `source` would; with `None`,
    /// as a run of the source it records. `None` when there is no manifest to read and no
    /// source was given. `spill_in_place` when the caller holds DEST's lock.
    pub(crate) fn open(
        dir: Dir,
        source: Option<&SourceInfo>,
        spill_in_place: bool,
    ) -> io::Result<Option<Self>> {
        let base_source = BaseReader::open(&dir)?.map(|(source, _)| source);
        let journal_source = match dir.open_file(JOURNAL, OFlags::RDONLY) {
            Ok(mut file) => journal::read_from_start(&mut file)?.header()?,
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            Err(err) => return Err(err),
        };
        let Some(source) = source
            .or(base_source.as_ref())
            .or(journal_source.as_ref())
            .cloned()
        else {
            return Ok(None);
        };
        let of_dataset = |found: &Option<SourceInfo>| {
            found
                .as_ref()
                .is_some_and(|found| same_dataset(found, &source))
        };
        Ok(Some(Self {
            use_base: of_dataset(&base_source),
            use_journal: of_dataset(&journal_source),
            source,
            dir,
            spill_in_place,
        }))
    }

    /// The source the view reads the manifest for.
    pub(crate) fn source(&self) -> &SourceInfo {
        &self.source
    }

    /// Every object's state, in key order.
    pub(crate) fn objects(&self) -> io::Result<Merged> {
        let base = match self.use_base {
            true => BaseReader::open(&self.dir)?.map(|(_, reader)| reader),
            false => None,
        };
        let mut journal = match self.use_journal {
            true => Some(self.dir.open_file(JOURNAL, OFlags::RDONLY)?),
            false => None,
        };
        let spill = match self.spill_in_place {
            true => Spill::In(&self.dir),
            false => Spill::Temporary,
        };
        Merged::new(&spill, base, journal.as_mut())
    }

    /// Looks objects up in ascending key order.
    pub(crate) fn cursor(&self) -> io::Result<Cursor> {
        Ok(Cursor::new(Some(
            Box::new(self.objects()?) as Box<dyn ObjectStream>
        )))
    }
}
