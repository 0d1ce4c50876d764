//! Progress for people: indicatif bars on a terminal, one log line every few seconds in a pod
//! log, or nothing.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::stats::Stats;
use crate::config::ProgressMode;
use crate::console::{self, Level};
use crate::units::human_bytes;

const BAR_TICK: Duration = Duration::from_millis(150);
const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(5);

pub(crate) struct Progress {
    ticker: Option<tokio::task::JoinHandle<()>>,
    bar: Option<ProgressBar>,
}

impl Progress {
    pub(crate) fn start(mode: ProgressMode, stats: Arc<Stats>) -> Self {
        let mode = match mode {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Log,
            other => other,
        };
        match mode {
            ProgressMode::Bar => {
                let bar = ProgressBar::new(0);
                bar.set_style(listing_style());
                let ticker = tokio::spawn(tick_bar(bar.clone(), stats));
                Self {
                    ticker: Some(ticker),
                    bar: Some(bar),
                }
            }
            ProgressMode::Log => Self {
                ticker: Some(tokio::spawn(tick_log(stats))),
                bar: None,
            },
            ProgressMode::None | ProgressMode::Auto => Self {
                ticker: None,
                bar: None,
            },
        }
    }

    pub(crate) fn finish(self) {
        if let Some(ticker) = self.ticker {
            ticker.abort();
        }
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

fn done_bytes(stats: &Stats) -> u64 {
    Stats::get(&stats.bytes_received) + Stats::get(&stats.bytes_skipped)
}

/// One progress reading: the fields of a JSON progress line.
#[derive(Debug, PartialEq, serde::Serialize)]
struct Reading {
    objects_done: u64,
    objects_total: u64,
    bytes_done: u64,
    bytes_total: u64,
    /// The totals are final: the listing has ended (its read-ahead runs ahead of the
    /// downloads, so this comes early).
    totals_final: bool,
    /// Over the last interval.
    bytes_per_second: u64,
    /// At the run's average pace so far; `null` until the totals are final.
    eta_seconds: Option<u64>,
}

impl Reading {
    /// `since_start` bytes were received in `elapsed`, `recent` in the last `interval`.
    fn take(stats: &Stats, elapsed: Duration, recent: (u64, Duration)) -> Self {
        let selection = stats.selection();
        let bytes_done = done_bytes(stats);
        let received = Stats::get(&stats.bytes_received);
        let pace = received as f64 / elapsed.as_secs_f64().max(1e-3);
        let left = selection.bytes.saturating_sub(bytes_done);
        let eta_seconds = (selection.complete && (left == 0 || pace >= 1.0))
            .then(|| (left as f64 / pace.max(1.0)).ceil() as u64);
        Self {
            objects_done: stats.objects_finished(),
            objects_total: selection.objects,
            bytes_done,
            bytes_total: selection.bytes,
            totals_final: selection.complete,
            bytes_per_second: (recent.0 as f64 / recent.1.as_secs_f64().max(1e-3)) as u64,
            eta_seconds,
        }
    }

    /// The line for a person: with a percentage and an ETA once the totals are final, the
    /// totals marked `+` before.
    fn line(&self) -> String {
        let rate = human_bytes(self.bytes_per_second);
        match self.totals_final {
            true => format!(
                "progress: {}/{} objects, {} of {} ({:.1} %), {rate}/s{}",
                self.objects_done,
                self.objects_total,
                human_bytes(self.bytes_done),
                human_bytes(self.bytes_total),
                percent(self.bytes_done, self.bytes_total),
                match self.eta_seconds {
                    Some(eta) => format!(", ETA {}", human_duration(eta)),
                    None => String::new(),
                }
            ),
            false => format!(
                "progress: {}/{}+ objects, {} of {}+ listed so far, {rate}/s",
                self.objects_done,
                self.objects_total,
                human_bytes(self.bytes_done),
                human_bytes(self.bytes_total),
            ),
        }
    }
}

fn percent(done: u64, total: u64) -> f64 {
    match total {
        0 => 100.0,
        total => done as f64 * 100.0 / total as f64,
    }
}

/// `42 s`, `3 min 05 s`, `2 h 07 min`.
fn human_duration(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {:02} s", s / 60, s % 60),
        s => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
    }
}

/// While the listing streams, the totals grow: no bar (it would jump back) and no ETA, the
/// total marked `+` as provisional. The bar takes what the terminal's width leaves, so a line
/// fits 80 columns even at ImageNet's object count.
fn listing_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner} listing {bytes}/{total_bytes}+ {binary_bytes_per_sec} {msg}",
    )
    .expect("valid template")
}

fn transfer_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner} [{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
    )
    .expect("valid template")
    .progress_chars("=> ")
}

async fn tick_bar(bar: ProgressBar, stats: Arc<Stats>) {
    let mut listing = true;
    loop {
        let selection = stats.selection();
        if listing && selection.complete {
            listing = false;
            bar.set_style(transfer_style());
        }
        bar.set_length(selection.bytes);
        bar.set_position(done_bytes(&stats));
        bar.set_message(format!(
            "{}/{} files",
            stats.objects_finished(),
            selection.objects
        ));
        tokio::time::sleep(BAR_TICK).await;
    }
}

async fn tick_log(stats: Arc<Stats>) {
    let start = Instant::now();
    let mut last = (start, 0u64);
    loop {
        tokio::time::sleep(PROGRESS_LOG_INTERVAL).await;
        let now = Instant::now();
        let received = Stats::get(&stats.bytes_received);
        let recent = (received.saturating_sub(last.1), now - last.0);
        last = (now, received);
        let reading = Reading::take(&stats, now - start, recent);
        console::say(Level::Info, reading.line(), Some(&reading));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_show_a_percentage_and_an_eta_once_final() {
        let stats = Stats::default();
        Stats::add(&stats.ahead_objects, 295);
        Stats::add(&stats.ahead_bytes, 200 << 20);
        Stats::add(&stats.objects_downloaded, 121);
        Stats::add(&stats.bytes_received, 50 << 20);
        let early = Reading::take(
            &stats,
            Duration::from_secs(10),
            (10 << 20, Duration::from_secs(2)),
        );
        assert_eq!(early.eta_seconds, None, "totals still growing");
        assert!(
            early.line().contains("121/295+ objects"),
            "{}",
            early.line()
        );
        stats
            .ahead_done
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let reading = Reading::take(
            &stats,
            Duration::from_secs(10),
            (10 << 20, Duration::from_secs(2)),
        );
        // 150 MiB left at 5 MiB/s on average.
        assert_eq!(reading.eta_seconds, Some(30));
        assert_eq!(reading.bytes_per_second, 5 << 20);
        assert_eq!(
            reading.line(),
            "progress: 121/295 objects, 50.0 MiB of 200.0 MiB (25.0 %), 5.0 MiB/s, ETA 30 s"
        );
        let json = serde_json::to_value(&reading).unwrap();
        for field in [
            "objects_done",
            "objects_total",
            "bytes_done",
            "bytes_total",
            "bytes_per_second",
            "eta_seconds",
        ] {
            assert!(json.get(field).is_some(), "{field} in {json}");
        }
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human_duration(42), "42 s");
        assert_eq!(human_duration(185), "3 min 05 s");
        assert_eq!(human_duration(7620), "2 h 07 min");
    }
}
