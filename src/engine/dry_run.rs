//! `--dry-run`: what a sync would do, decided by the checks the run itself makes, from the same
//! listing (or snapshot) and the manifest as the run would find it, with nothing written. DEST
//! is not created; `.hydrator/` and its lock are only read; an interrupted run's journal is
//! applied in memory ([`ManifestView`]); the keys `--delete` compares against spool to an
//! unlinked temporary file outside DEST.
//!
//! Each selected object gets the verdict the run would give it: up to date (published at the
//! listed version, the file unchanged on disk), resume (durable parts of this version and a
//! partial file that fits them) or download. With `--delete`, DEST is walked in the order the
//! run's removal walks it, against the listed keys.

use std::collections::HashSet;
use std::time::Instant;

use tokio::sync::watch;

use super::failures::Book;
use super::object::{published, resumable, still_on_disk};
use super::run::{
    dest_unusable, empty_selection, refuse_another_dataset, report_sink, snapshot_already_there,
    stopped, summarize, Hooks, Outcome, Tally,
};
use super::stats::Stats;
use crate::config::{DirectIo, SyncConfig};
use crate::error::{Exit, IoContext, LocalError, SyncError};
use crate::manifest::base::Cursor;
use crate::manifest::journal::SourceInfo;
use crate::manifest::listed::{ListedKeys, ListedReader};
use crate::manifest::view::ManifestView;
use crate::manifest::{lock, ObjectState};
use crate::plan::filter::KeyFilter;
use crate::plan::keys::{is_partial_name, RelPath, STATE_DIR};
use crate::plan::parts::part_ranges;
use crate::report::{FileRecord, FileStatus};
use crate::snapshot;
use crate::source::client;
use crate::source::list::{self, ObjectEntry};
use crate::source::s3::S3Source;
use crate::units::human_bytes;
use crate::write::dest::Dest;
use crate::write::walk::walk;

/// Predicts the run `cfg` describes. `hooks.forgotten` are keys to take as unknown to the
/// manifest (`verify --repair --dry-run`: the files found bad).
pub(super) async fn run(
    cfg: &SyncConfig,
    hooks: Hooks,
    mut stop: Option<watch::Receiver<bool>>,
) -> Result<Outcome, SyncError> {
    let started = Instant::now();
    let filter = cfg.key_filter()?;
    let dest = Dest::open_existing(&cfg.dest).map_err(|err| dest_unusable(cfg, err))?;
    let state_path = cfg.dest.join(STATE_DIR);
    let state_dir = match &dest {
        Some(dest) => dest.existing_state_dir().local("opening", &state_path)?,
        None => None,
    };
    if let Some(dir) = &state_dir {
        if lock::held_elsewhere(dir) {
            tracing::warn!(
                "another hydrator is working on DEST now: what it changes meanwhile is not in this prediction"
            );
        }
        // verify --repair removes READY before its sync: then no shortcut.
        let shortcut = (!hooks.ready_removed)
            .then(|| snapshot_already_there(cfg, dir, started))
            .flatten();
        if let Some(outcome) = shortcut {
            return Ok(outcome);
        }
        refuse_another_dataset(cfg, dir)?;
    }
    let view = state_dir
        .map(|dir| ManifestView::open(dir, Some(&SourceInfo::from(cfg)), false))
        .transpose()
        .local("reading the manifest in", &state_path)?
        .flatten();
    let base = match &view {
        Some(view) => view
            .cursor()
            .local("reading the manifest in", &state_path)?,
        None => Cursor::new(None),
    };
    let mut sink = report_sink(cfg)?;
    let source = match hooks.source {
        Some(source) => source,
        None => std::sync::Arc::new(S3Source::new(
            client::build(cfg.client_settings(), Default::default()).await,
            cfg.client_settings().anonymous,
        )),
    };
    let mut listing = match &cfg.snapshot {
        Some(snapshot) => snapshot::spawn_entries(snapshot.clone()),
        None => list::spawn(source.clone(), cfg.source.clone()),
    };
    let stats = hooks.stats;
    let mut plan = Plan {
        cfg,
        dest: dest.as_ref(),
        base,
        forgotten: &hooks.forgotten,
        listed: ListedKeys::in_file(
            tempfile::tempfile().local("creating a spool in", std::env::temp_dir())?,
        ),
        replaced_partials: HashSet::new(),
    };
    let mut tally = Tally {
        stats: &stats,
        sink: &mut sink,
        // A prediction goes through the whole listing: --max-errors stops real runs only.
        failures: Book::new(true, 0),
        tripped: None,
        sink_error: None,
        schedule: None,
        placement: Default::default(),
        full_disk: None,
    };
    let mut fatal = loop {
        let item = tokio::select! {
            item = listing.recv() => item,
            () = stopped(&mut stop) => break Some(SyncError::Stopped),
        };
        let entry = match item {
            Some(Ok(entry)) => entry,
            Some(Err(err)) => break Some(err),
            None => {
                stats
                    .listing_done
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                break None;
            }
        };
        let Some(rel) = tally.select(&cfg.source.prefix, &filter, &entry) else {
            continue;
        };
        match plan.object(&entry, &rel, &stats) {
            Ok(record) => tally.done(record),
            Err(Verdict::Failed(err)) => tally.failed(entry.key, err.into()),
            Err(Verdict::Fatal(err)) => break Some(err.into()),
        }
    };
    if let (None, Some(err)) = (&fatal, tally.sink_error.take()) {
        let report = cfg.report.clone().unwrap_or_default();
        fatal = Some(LocalError::new("writing the report spool for", report, err).into());
    }
    if fatal.is_none() {
        fatal = empty_selection(cfg, &stats, source.as_ref())
            .await
            .map(Into::into);
    }
    let (failures, unshown) = tally.failures.finish();
    let any_failed = Stats::get(&stats.objects_failed) > 0;
    let complete = fatal.is_none() && !any_failed;
    if cfg.delete && fatal.is_none() && !complete {
        tracing::warn!(
            "--delete would be skipped: some objects would fail, so their local copies are kept"
        );
    }
    if let (true, Some(dest)) = (complete, plan.dest) {
        let unlisted = plan.listed.into_reader().and_then(|listed| {
            unlisted_files(
                dest,
                &filter,
                &cfg.source.prefix,
                listed,
                &plan.replaced_partials,
                cfg.delete,
            )
        });
        match (unlisted, cfg.delete) {
            (Ok(n), true) => Stats::add(&stats.files_deleted, n),
            (Ok(n), false) => Stats::add(&stats.files_foreign, n),
            (Err(err), _) => fatal = Some(LocalError::new("walking", &cfg.dest, err).into()),
        }
    }
    let exit = fatal.as_ref().map_or(Exit::Success, SyncError::exit);
    // The summary says how the run would end; the dry run itself succeeded.
    let predicted = match any_failed {
        false => exit,
        true => Exit::Failed,
    };
    let mut summary = summarize(
        cfg,
        &stats,
        predicted,
        fatal.as_ref(),
        None,
        failures,
        started,
    );
    // `result` and `error_kind` are the prediction; `exit_code` is the dry run's own.
    summary.exit_code = exit as u8;
    if let Err(err) = sink.finish(&summary) {
        tracing::error!("writing the report: {err}");
        summary.exit_code = Exit::Failed as u8;
        return Ok(Outcome {
            summary,
            exit: Exit::Failed,
            error: fatal,
            unshown,
        });
    }
    Ok(Outcome {
        summary,
        exit,
        error: fatal,
        unshown,
    })
}

/// Why an object has no verdict.
enum Verdict {
    /// The run would fail this object.
    Failed(LocalError),
    /// The manifest cannot be read: the prediction stops.
    Fatal(LocalError),
}

/// The listing's objects, judged one at a time in key order.
struct Plan<'a> {
    cfg: &'a SyncConfig,
    dest: Option<&'a Dest>,
    base: Cursor,
    forgotten: &'a HashSet<String>,
    /// The keys listed, for the walk that finds files not in the source.
    listed: ListedKeys,
    /// Partial files the run would replace and publish, so `--delete` would not find them.
    replaced_partials: HashSet<String>,
}

impl Plan<'_> {
    /// The record the run would report for `entry`; the bytes it would resume are counted.
    fn object(
        &mut self,
        entry: &ObjectEntry,
        rel: &RelPath,
        stats: &Stats,
    ) -> Result<FileRecord, Verdict> {
        self.listed.push(&entry.key).map_err(|err| {
            let spool = std::env::temp_dir();
            Verdict::Fatal(LocalError::new("spooling keys in", spool, err))
        })?;
        let known = self
            .base
            .take(&entry.key)
            .map_err(|err| {
                let state_path = self.cfg.dest.join(STATE_DIR);
                Verdict::Fatal(LocalError::new("reading the manifest in", state_path, err))
            })?
            .filter(|_| !self.forgotten.contains(&entry.key));
        let record = |status, blake3: Option<[u8; 32]>| FileRecord {
            key: entry.key.clone(),
            path: rel.to_string(),
            size: entry.size,
            blake3: blake3.map(|hash| crate::manifest::hex(&hash)),
            status,
        };
        let Some(dest) = self.dest else {
            self.say_download(entry, rel, 0);
            return Ok(record(FileStatus::WouldDownload, None));
        };
        let checked = self.judge(dest, entry, rel, known.as_ref());
        let (hash, resumed) = checked.local("checking", rel).map_err(Verdict::Failed)?;
        if let Some(hash) = hash {
            return Ok(record(FileStatus::Skipped, Some(hash)));
        }
        Stats::add(&stats.bytes_resumed, resumed);
        self.say_download(entry, rel, resumed);
        let status = match resumed {
            0 => FileStatus::WouldDownload,
            _ => FileStatus::WouldResume,
        };
        Ok(record(status, None))
    }

    /// The hash of an up-to-date file, or the bytes a download would resume.
    fn judge(
        &mut self,
        dest: &Dest,
        entry: &ObjectEntry,
        rel: &RelPath,
        known: Option<&ObjectState>,
    ) -> std::io::Result<(Option<[u8; 32]>, u64)> {
        // The run would fail to publish it.
        dest.check_in_the_way(rel)?;
        if let Some(done) = published(known, rel, entry) {
            if let Some(hash) = still_on_disk(dest, rel, entry.size, done)? {
                return Ok((Some(hash), 0));
            }
        }
        if self.cfg.delete && dest.has_partial(rel)? {
            self.replaced_partials.insert(rel.partial_path());
        }
        // Without probing DEST (a dry run writes nothing): `auto` writes large files directly.
        let direct = self.cfg.direct_io != DirectIo::Never;
        let part_size = self.cfg.part_size();
        let Some(known) = known.filter(|k| resumable(k, &entry.etag, entry.size, part_size)) else {
            return Ok((None, 0));
        };
        if dest.resumable_partial(rel, direct, entry.size)?.is_none() {
            return Ok((None, 0));
        }
        // As the run: a single-part object is fetched whole, never resumed.
        let ranges: Vec<_> = part_ranges(entry.size, part_size).collect();
        let resumed = match ranges.len() {
            1 => 0,
            _ => ranges
                .iter()
                .enumerate()
                .filter(|(index, _)| known.parts.contains_key(&(*index as u32)))
                .map(|(_, range)| range.end - range.start)
                .sum(),
        };
        Ok((None, resumed))
    }

    fn say_download(&self, entry: &ObjectEntry, rel: &RelPath, resumed: u64) {
        let (bucket, dest) = (&self.cfg.source.bucket, self.cfg.dest.display());
        match resumed {
            0 => crate::out!(
                "hydrator: would download s3://{bucket}/{} -> {dest}/{rel} ({})",
                entry.key,
                human_bytes(entry.size)
            ),
            _ => crate::out!(
                "hydrator: would resume s3://{bucket}/{} -> {dest}/{rel} ({} of {} left)",
                entry.key,
                human_bytes(entry.size - resumed),
                human_bytes(entry.size)
            ),
        }
    }
}

/// Walks DEST as `--delete` would after the run and counts the files that are not in the
/// source, naming them as ones `--delete` would remove when `name_them`: those the filters
/// select whose key the run did not list (and that are not partial files the run would
/// publish). Without `name_them` it counts foreign files as the run would, hydrator's own
/// leftover `.partial` files aside. `listed` holds the listed keys in ascending order, as the
/// walk's paths.
fn unlisted_files(
    dest: &Dest,
    filter: &KeyFilter,
    prefix: &str,
    mut listed: ListedReader,
    replaced_partials: &HashSet<String>,
    name_them: bool,
) -> std::io::Result<u64> {
    let mut head = listed.next_key()?;
    let mut unlisted = 0;
    walk(dest, false, &mut |entry| {
        if !filter.accepts(entry.path) || replaced_partials.contains(entry.path) {
            return Ok(());
        }
        let key = format!("{prefix}{}", entry.path);
        while head.as_ref().is_some_and(|head| *head < key) {
            head = listed.next_key()?;
        }
        if head.as_ref() != Some(&key) {
            if name_them {
                crate::out!(
                    "hydrator: would delete {}/{}",
                    dest.path().display(),
                    entry.path
                );
            }
            unlisted += u64::from(name_them || !is_partial_name(entry.name));
        }
        Ok(())
    })?;
    Ok(unlisted)
}
