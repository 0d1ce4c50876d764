//! Progress for people: indicatif bars on a terminal, one log line every few seconds in a pod
//! log, or nothing.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::stats::Stats;
use crate::config::ProgressMode;
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
        if listing && stats.listing_done() {
            listing = false;
            bar.set_style(transfer_style());
        }
        bar.set_length(Stats::get(&stats.bytes_listed));
        bar.set_position(done_bytes(&stats));
        bar.set_message(format!(
            "{}/{} files",
            stats.objects_finished(),
            Stats::get(&stats.objects_listed)
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
        let done = done_bytes(&stats);
        let rate = (done - last.1) as f64 / (now - last.0).as_secs_f64();
        last = (now, done);
        let listed = match stats.listing_done() {
            true => "listed",
            false => "listed so far",
        };
        tracing::info!(
            "progress: {}/{} objects, {} of {} {listed}, {}/s",
            stats.objects_finished(),
            Stats::get(&stats.objects_listed),
            human_bytes(done),
            human_bytes(Stats::get(&stats.bytes_listed)),
            human_bytes(rate as u64),
        );
    }
}
