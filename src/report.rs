//! The run's report: counters, failures and the BLAKE3 of every file, written as JSON with
//! `--report FILE`. File records are spooled to disk as they complete, so a run over millions
//! of objects does not hold them in memory; the report is assembled and renamed into place at
//! the end.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bound::{Bound, By};
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

/// Everything but the file list.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Summary {
    pub version: u32,
    /// A `--dry-run`: the counts say what a run would do; nothing was written.
    pub dry_run: bool,
    pub source: String,
    pub dest: String,
    pub result: RunResult,
    pub error: Option<String>,
    pub objects: ObjectCounts,
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
            "hydrator: {} {} objects ({}) from {} to {}: {} downloaded, {} up to date, {} failed",
            match self.result {
                RunResult::Complete => "mirrored",
                RunResult::Failed => "INCOMPLETE:",
            },
            o.total,
            human_bytes(self.bytes.total),
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
        line.push_str(&format!(
            " in {:.1} s ({}/s, {}{})",
            self.duration_seconds,
            human_bytes(self.throughput_bytes_per_second as u64),
            match self.io_backend {
                Some(backend) => format!("{backend} writes"),
                None => "nothing written".to_string(),
            },
            match &self.bound {
                Some(bound) if bound.by == By::None =>
                    format!("; no bound reached: {}", bound.detail),
                Some(bound) => format!("; bounded by {}: {}", bound.by, bound.detail),
                None => String::new(),
            },
        ));
        line + &self.foreign_note()
    }

    /// What the closing line says of files in DEST that are not in the source.
    fn foreign_note(&self) -> String {
        match self.objects.foreign {
            0 => String::new(),
            n => format!("; {n} files in DEST are not in the source; --delete removes them"),
        }
    }
}

/// Collects file records for the report.
pub(crate) struct ReportSink {
    target: Option<(PathBuf, PathBuf, BufWriter<File>)>,
}

impl ReportSink {
    pub(crate) fn new(report: Option<&Path>) -> io::Result<Self> {
        let target = match report {
            None => None,
            Some(path) => {
                let spool = sibling(path, ".files.tmp");
                let writer = BufWriter::new(File::create(&spool)?);
                Some((path.to_path_buf(), spool, writer))
            }
        };
        Ok(Self { target })
    }

    pub(crate) fn record(&mut self, record: &FileRecord) -> io::Result<()> {
        if let Some((_, _, spool)) = &mut self.target {
            serde_json::to_writer(&mut *spool, record)?;
            spool.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Writes the report (summary, then every spooled record) and renames it into place.
    pub(crate) fn finish(self, summary: &Summary) -> io::Result<()> {
        let Some((path, spool_path, spool)) = self.target else {
            return Ok(());
        };
        spool.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        fs::write_atomic_path(&path, |file| {
            let mut out = BufWriter::new(file);
            let head = serde_json::to_string_pretty(summary)?;
            out.write_all(head.trim_end().trim_end_matches('}').trim_end().as_bytes())?;
            out.write_all(b",\n  \"files\": [")?;
            for (i, line) in BufReader::new(File::open(&spool_path)?).lines().enumerate() {
                out.write_all(if i == 0 { b"\n    " } else { b",\n    " })?;
                out.write_all(line?.as_bytes())?;
            }
            out.write_all(b"\n  ]\n}\n")?;
            out.flush()
        })?;
        std::fs::remove_file(&spool_path)
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
            objects: ObjectCounts::default(),
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
}
