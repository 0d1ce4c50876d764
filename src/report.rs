//! The run's report: counters, failures and the BLAKE3 of every file, written as JSON with
//! `--report FILE`. File records and failures are spooled to disk as they come, so a run over
//! millions of objects (or with millions of failures) does not hold them in memory; the report
//! is assembled and renamed into place at the end.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bound::{Bound, By};
use crate::error::ErrorKind;
use crate::fs;
use crate::units::human_bytes;
use crate::write::Backend;

pub(crate) const REPORT_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FileStatus {
    Downloaded,
    Skipped,
    /// `--dry-run`: the run would download the file.
    WouldDownload,
    /// `--dry-run`: the run would finish an interrupted download from its durable parts.
    WouldResume,
}

/// One file of the dataset.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FileRecord {
    pub key: String,
    /// Path relative to DEST.
    pub path: String,
    pub size: u64,
    /// Hex BLAKE3 of the file; `null` only for a skipped file whose hash was not stored.
    pub blake3: Option<String>,
    pub status: FileStatus,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Failure {
    pub key: String,
    pub reason: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ObjectCounts {
    /// Objects listed under the prefix (including filtered ones and directory markers).
    pub listed: u64,
    /// Objects the filters selected: downloaded + skipped + failed.
    pub total: u64,
    pub downloaded: u64,
    pub skipped: u64,
    pub failed: u64,
    pub filtered_out: u64,
    pub directory_markers: u64,
    /// Local files removed by `--delete`.
    pub deleted: u64,
    /// Files in DEST (in the filters' scope) that are not part of the source, kept because
    /// `--delete` was not given.
    pub foreign: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ByteCounts {
    /// Bytes of the selected objects.
    pub total: u64,
    pub downloaded: u64,
    pub skipped: u64,
    /// Bytes of interrupted downloads resumed from durable parts (not fetched again).
    pub resumed: u64,
    /// Bytes received from the server, retried bytes included.
    pub received: u64,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RunResult {
    /// Every selected object is mirrored and hashed.
    Complete,
    Failed,
}

/// The selection's size as far as the listing went (which can be further than the objects the
/// run finished).
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct SelectionCounts {
    pub objects: u64,
    pub bytes: u64,
    /// The listing ended: the figures are the whole selection's.
    pub complete: bool,
}

/// Everything but the failures and the file list, which are spooled.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Summary {
    pub version: u32,
    /// A `--dry-run`: the counts say what a run would do; nothing was written.
    pub dry_run: bool,
    pub source: String,
    pub dest: String,
    pub result: RunResult,
    pub error: Option<String>,
    /// The process's exit code.
    pub exit_code: u8,
    /// What kind of problem ended the run; `null` when it is complete.
    pub error_kind: Option<ErrorKind>,
    pub objects: ObjectCounts,
    pub selection: SelectionCounts,
    pub bytes: ByteCounts,
    pub part_retries: u64,
    pub object_restarts: u64,
    /// The write backend that ran; `null` when the run wrote nothing (a snapshot already there).
    pub io_backend: Option<Backend>,
    /// The most GETs this run had in flight at once (the adaptive limit's peak).
    pub peak_requests_in_flight: usize,
    /// Seconds parts spent waiting on `--max-bandwidth` or `--max-requests-per-second`, summed
    /// over parts: well above zero, a cap was the bottleneck.
    pub rate_limited_seconds: f64,
    /// What bounded the run, with the figures it was judged from; `null` when nothing was
    /// fetched (a dry run, a snapshot already there).
    pub bound: Option<Bound>,
    pub io_backend_fallback_reason: Option<String>,
    pub duration_seconds: f64,
    pub throughput_bytes_per_second: f64,
    /// The first failures, as printed; the report's `failures` (spooled) holds them all.
    #[serde(skip)]
    pub failures: Vec<Failure>,
}

impl Summary {
    /// The closing line of a run, for a person or a pod log.
    pub(crate) fn one_line(&self) -> String {
        let o = &self.objects;
        if self.dry_run {
            let line = format!(
                "hydrator: dry run of {} to {}: {} objects ({}): would download {} ({}, {} of it resumed from disk), {} up to date ({}), {} would fail, {} local files would be deleted; nothing written",
                self.source,
                self.dest,
                o.total,
                human_bytes(self.bytes.total),
                o.downloaded,
                human_bytes(self.bytes.downloaded),
                human_bytes(self.bytes.resumed),
                o.skipped,
                human_bytes(self.bytes.skipped),
                o.failed,
                o.deleted,
            );
            return line + &self.foreign_note();
        }
        let mut line = format!(
            "hydrator: {} {} from {} to {}: {} downloaded, {} up to date, {} failed",
            match self.result {
                RunResult::Complete => "mirrored",
                RunResult::Failed => "INCOMPLETE:",
            },
            self.population(),
            self.source,
            self.dest,
            o.downloaded,
            o.skipped,
            o.failed,
        );
        let extras = [
            (
                o.filtered_out > 0,
                format!("{} left out by filters", o.filtered_out),
            ),
            (
                self.bytes.resumed > 0,
                format!("{} resumed from disk", human_bytes(self.bytes.resumed)),
            ),
            (o.deleted > 0, format!("{} local files deleted", o.deleted)),
        ];
        for (_, extra) in extras.iter().filter(|(shown, _)| *shown) {
            line.push_str(", ");
            line.push_str(extra);
        }
        let transferred = self.bytes.received > 0 || self.bytes.downloaded > 0;
        let how = match (self.io_backend, transferred) {
            (None, _) => "nothing written".to_string(),
            (Some(_), false) => "nothing transferred".to_string(),
            (Some(backend), true) => format!(
                "{}/s, {backend} writes{}",
                human_bytes(self.throughput_bytes_per_second as u64),
                match &self.bound {
                    Some(bound) if bound.by == By::None =>
                        format!("; no bound reached: {}", bound.detail),
                    Some(bound) => format!("; bounded by {}: {}", bound.by, bound.detail),
                    None => String::new(),
                },
            ),
        };
        line.push_str(&format!(" in {:.1} s ({how})", self.duration_seconds));
        line + &self.foreign_note()
    }

    /// The objects the closing line speaks of. A run cut short (a signal, a broken listing,
    /// `--max-errors`) finished part of what was listed: the objects it finished and their
    /// bytes, of the selection as far as it was listed, so that both figures count one
    /// population. Otherwise the objects and the bytes of the whole selection.
    fn population(&self) -> String {
        let (o, selection) = (&self.objects, &self.selection);
        if self.error.is_none() || selection.objects == 0 {
            return format!("{} objects ({})", o.total, human_bytes(self.bytes.total));
        }
        let listed = match selection.complete {
            true => format!("{} listed objects", selection.objects),
            false => format!("{} objects listed so far", selection.objects),
        };
        format!(
            "{} of {listed} ({} of {})",
            o.total,
            human_bytes(self.bytes.downloaded + self.bytes.skipped),
            human_bytes(selection.bytes),
        )
    }

    /// What the closing line says of files in DEST that are not in the source.
    fn foreign_note(&self) -> String {
        match self.objects.foreign {
            0 => String::new(),
            n => format!("; {n} files in DEST are not in the source; --delete removes them"),
        }
    }
}

/// Collects file records and failures for the report, each in a spool file beside it.
pub(crate) struct ReportSink {
    target: Option<Target>,
}

struct Target {
    path: PathBuf,
    files: Spool,
    failures: Spool,
}

/// JSON values, one a line, in a temporary file beside the report.
struct Spool {
    path: PathBuf,
    writer: BufWriter<File>,
}

impl Spool {
    fn create(path: PathBuf) -> io::Result<Self> {
        let writer = BufWriter::new(File::create(&path)?);
        Ok(Self { path, writer })
    }

    fn push(&mut self, value: &impl Serialize) -> io::Result<()> {
        serde_json::to_writer(&mut self.writer, value)?;
        self.writer.write_all(b"\n")
    }

    /// Makes the spool durable and returns its path.
    fn close(self) -> io::Result<PathBuf> {
        self.writer
            .into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()?;
        Ok(self.path)
    }
}

impl ReportSink {
    pub(crate) fn new(report: Option<&Path>) -> io::Result<Self> {
        let target = match report {
            None => None,
            Some(path) => Some(Target {
                path: path.to_path_buf(),
                files: Spool::create(sibling(path, ".files.tmp"))?,
                failures: Spool::create(sibling(path, ".failures.tmp"))?,
            }),
        };
        Ok(Self { target })
    }

    pub(crate) fn record(&mut self, record: &FileRecord) -> io::Result<()> {
        match &mut self.target {
            Some(target) => target.files.push(record),
            None => Ok(()),
        }
    }

    pub(crate) fn failure(&mut self, failure: &Failure) -> io::Result<()> {
        match &mut self.target {
            Some(target) => target.failures.push(failure),
            None => Ok(()),
        }
    }

    /// Writes the report (summary, then every spooled failure and record) and renames it into
    /// place.
    pub(crate) fn finish(self, summary: &Summary) -> io::Result<()> {
        let Some(target) = self.target else {
            return Ok(());
        };
        let failures = target.failures.close()?;
        let files = target.files.close()?;
        fs::write_atomic_path(&target.path, |file| {
            let mut out = BufWriter::new(file);
            let head = serde_json::to_string_pretty(summary)?;
            out.write_all(head.trim_end().trim_end_matches('}').trim_end().as_bytes())?;
            for (name, spool) in [("failures", &failures), ("files", &files)] {
                write!(out, ",\n  \"{name}\": [")?;
                let mut empty = true;
                for line in BufReader::new(File::open(spool)?).lines() {
                    out.write_all(if empty { b"\n    " } else { b",\n    " })?;
                    out.write_all(line?.as_bytes())?;
                    empty = false;
                }
                out.write_all(if empty { b"]" } else { b"\n  ]" })?;
            }
            out.write_all(b"\n}\n")?;
            out.flush()
        })?;
        std::fs::remove_file(&failures)?;
        std::fs::remove_file(&files)
    }
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        Summary {
            version: REPORT_VERSION,
            dry_run: false,
            source: "s3://b/p/".into(),
            dest: "/d".into(),
            result: RunResult::Complete,
            error: None,
            exit_code: 0,
            error_kind: None,
            objects: ObjectCounts::default(),
            selection: SelectionCounts::default(),
            bytes: ByteCounts::default(),
            part_retries: 0,
            object_restarts: 0,
            io_backend: Some(Backend::Pwrite),
            peak_requests_in_flight: 4,
            rate_limited_seconds: 0.0,
            bound: None,
            io_backend_fallback_reason: None,
            duration_seconds: 1.0,
            throughput_bytes_per_second: 0.0,
            failures: vec![],
        }
    }

    #[test]
    fn report_is_valid_json_with_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let mut sink = ReportSink::new(Some(&path)).unwrap();
        for i in 0..3 {
            sink.record(&FileRecord {
                key: format!("p/{i}"),
                path: i.to_string(),
                size: i,
                blake3: Some("ab".into()),
                status: FileStatus::Downloaded,
            })
            .unwrap();
        }
        sink.finish(&summary()).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(value["files"].as_array().unwrap().len(), 3);
        assert_eq!(value["io_backend"], "pwrite");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "spool removed"
        );
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn the_closing_line_counts_what_filters_left_out_resumed_bytes_deletions_and_foreign_files() {
        let plain = summary().one_line();
        for absent in [
            "left out",
            "resumed",
            "deleted",
            "not in the source",
            "bounded",
        ] {
            assert!(!plain.contains(absent), "{plain}");
        }
        let mut busy = summary();
        busy.objects.filtered_out = 7;
        busy.objects.deleted = 2;
        busy.objects.foreign = 3;
        busy.bytes.resumed = 3 << 20;
        let line = busy.one_line();
        for present in [
            "7 left out by filters",
            "3.0 MiB resumed from disk",
            "2 local files deleted",
            "; 3 files in DEST are not in the source; --delete removes them",
        ] {
            assert!(line.contains(present), "{present} in {line}");
        }
    }

    #[test]
    fn the_closing_line_and_the_report_say_what_bounded_the_run() {
        let mut bounded = summary();
        bounded.bytes.received = 1;
        bounded.bound = Some(Bound::judge(&crate::bound::Measured {
            seconds: 2.0,
            cpu_seconds: 3.9,
            cores: 2.0,
            ..Default::default()
        }));
        let line = bounded.one_line();
        assert!(
            line.ends_with("(0 B/s, pwrite writes; bounded by cpu: 1.95 of 2 cores busy)"),
            "{line}"
        );
        let json = serde_json::to_value(&bounded).unwrap();
        assert_eq!(json["bound"]["by"], "cpu");
        assert_eq!(json["bound"]["cores_busy"], 1.95);
        assert_eq!(
            serde_json::to_value(summary()).unwrap()["bound"],
            serde_json::Value::Null
        );
        bounded.bound = Some(Bound::judge(&Default::default()));
        let line = bounded.one_line();
        assert!(
            line.contains("writes; no bound reached: 0.00 of 0 cores"),
            "{line}"
        );
    }

    #[test]
    fn the_report_holds_every_failure_from_its_spool_and_says_how_the_run_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let mut sink = ReportSink::new(Some(&path)).unwrap();
        for i in 0..12_345 {
            sink.failure(&Failure {
                key: format!("p/{i}"),
                reason: "GET: access denied".into(),
            })
            .unwrap();
        }
        let mut failed = summary();
        failed.result = RunResult::Failed;
        failed.exit_code = 1;
        failed.error_kind = Some(ErrorKind::ObjectsFailed);
        failed.failures = vec![Failure {
            key: "p/0".into(),
            reason: "kept in memory, not written twice".into(),
        }];
        sink.finish(&failed).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let failures = value["failures"].as_array().unwrap();
        assert_eq!(failures.len(), 12_345);
        assert_eq!(failures[12_344]["key"], "p/12344");
        assert_eq!(value["files"], serde_json::json!([]));
        assert_eq!(value["exit_code"], 1);
        assert_eq!(value["error_kind"], "objects_failed");
        assert_eq!(
            serde_json::to_value(summary()).unwrap()["error_kind"],
            serde_json::Value::Null
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "spools removed"
        );
    }

    #[test]
    fn an_interrupted_run_counts_what_it_finished_of_what_was_listed() {
        let mut stopped = summary();
        stopped.result = RunResult::Failed;
        stopped.error = Some("stopped before the end; a new run resumes".into());
        stopped.objects.total = 121;
        stopped.objects.downloaded = 100;
        stopped.objects.skipped = 21;
        stopped.bytes.total = 80 << 20;
        stopped.bytes.downloaded = 60 << 20;
        stopped.bytes.skipped = 12 << 20;
        stopped.bytes.received = 61 << 20;
        stopped.selection = SelectionCounts {
            objects: 295,
            bytes: 239 << 20,
            complete: true,
        };
        let line = stopped.one_line();
        assert!(
            line.starts_with("hydrator: INCOMPLETE: 121 of 295 listed objects (72.0 MiB of 239.0 MiB) from s3://b/p/ to /d: 100 downloaded, 21 up to date, 0 failed in 1.0 s ("),
            "{line}"
        );
        stopped.selection.complete = false;
        assert!(
            stopped
                .one_line()
                .contains(": 121 of 295 objects listed so far (72.0 MiB of 239.0 MiB) from"),
            "{}",
            stopped.one_line()
        );
    }

    #[test]
    fn a_run_that_transferred_nothing_has_no_throughput_and_no_bound() {
        let mut idle = summary();
        idle.bound = Some(Bound::judge(&Default::default()));
        let line = idle.one_line();
        assert!(line.ends_with(" in 1.0 s (nothing transferred)"), "{line}");
        idle.io_backend = None;
        assert!(idle.one_line().ends_with(" in 1.0 s (nothing written)"));
    }
}
