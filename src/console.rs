//! What hydrator prints, and where. stdout carries what scripts capture (a result a line:
//! `warm`'s directory, a sync's closing line, a dry run's plan); stderr is for people and log
//! pipelines: plain text, or with `--log-format json` one JSON object a line, in the shape of
//! the log's own lines, so a pod's log parses whole.
//!
//! A reader of stdout that goes away (`hydrator sync … --dry-run | head -1`) is not an error:
//! printing stops quietly and the work that matters (the run, its report, its exit code) goes
//! on. Colour only on a terminal, and never with `NO_COLOR` or `TERM=dumb`.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::OnceLock;

use serde::Serialize;

/// How stderr's lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Text,
    Json,
}

static FORMAT: OnceLock<Format> = OnceLock::new();
/// stdout's reader has gone: nothing more is printed there.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Sets the format of stderr's lines, once, at start-up.
pub fn init(format: Format) {
    let _ = FORMAT.set(format);
}

fn format() -> Format {
    FORMAT.get().copied().unwrap_or_default()
}

/// Whether stderr's lines are JSON.
pub fn json() -> bool {
    format() == Format::Json
}

/// Whether stderr's lines may carry colour: a terminal, no `NO_COLOR`, a `TERM` that is not
/// `dumb`.
pub fn colour() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
    !no_color && !dumb && std::io::stderr().is_terminal()
}

/// Prints one line on stdout; once its reader has gone, prints nothing more.
pub fn out(line: fmt::Arguments) {
    if STDOUT_GONE.load(Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(line)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    if written.is_err() {
        // A closed pipe, or stdout redirected to a full or broken file: either way no one
        // reads what would follow. What matters goes on.
        STDOUT_GONE.store(true, Relaxed);
    }
}

/// `out!("...", args)`: [`out`] with `format!`'s arguments.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::console::out(format_args!($($arg)*))
    };
}

/// How much a line on stderr matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// One line on stderr: `hydrator: MESSAGE` as text, or a JSON object with the log's keys
/// (`timestamp`, `level`, `fields.message`, `target`) and `extra`'s fields beside `message`.
pub fn say(level: Level, message: impl fmt::Display, extra: Option<&dyn ErasedFields>) {
    let line = match format() {
        Format::Text => format!("hydrator: {message}\n"),
        Format::Json => json_line(level, &message.to_string(), extra),
    };
    // Nothing to do if stderr itself is gone.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `note!(Level::Warn, "...", args)`: [`say`] of a formatted message with no extra fields.
#[macro_export]
macro_rules! note {
    ($level:expr, $($arg:tt)*) => {
        $crate::console::say($level, format_args!($($arg)*), None)
    };
}

/// Fields a JSON line carries beside its message.
pub trait ErasedFields {
    fn to_json(&self) -> serde_json::Value;
}

impl<T: Serialize> ErasedFields for T {
    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

fn json_line(level: Level, message: &str, extra: Option<&dyn ErasedFields>) -> String {
    let mut fields = serde_json::Map::new();
    fields.insert("message".into(), message.into());
    if let Some(serde_json::Value::Object(extra)) = extra.map(ErasedFields::to_json) {
        fields.extend(extra);
    }
    let line = serde_json::json!({
        "timestamp": crate::units::now_rfc3339(),
        "level": level.as_str(),
        "fields": fields,
        "target": "hydrator",
    });
    format!("{line}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_is_one_object_with_the_extra_fields_beside_the_message() {
        #[derive(Serialize)]
        struct Extra {
            key: &'static str,
            count: u64,
        }
        let line = json_line(
            Level::Error,
            "failed: a \"quoted\"\nline",
            Some(&Extra {
                key: "a/b",
                count: 3,
            }),
        );
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["level"], "ERROR");
        assert_eq!(value["fields"]["message"], "failed: a \"quoted\"\nline");
        assert_eq!(value["fields"]["key"], "a/b");
        assert_eq!(value["fields"]["count"], 3);
    }
}
