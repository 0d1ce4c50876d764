//! Failed objects, each said once. A run that fails a million objects (a bucket policy that
//! refuses every GET) must leave a log that a person can read and a pod's log can hold: the
//! first [`SHOWN`] failures are printed as they happen, with their reason; the others are
//! counted by cause and summed up in one line at the end. A cause is a typed kind (what the
//! request met, with the HTTP status and S3 code), never the message, which names the key and
//! so would make every failure a cause of its own. The report keeps every failure: they are
//! spooled to disk beside the file records (`ReportSink`), so memory does not grow with them.
//!
//! `--max-errors N` stops a run whose failures are plainly systematic: N objects failed one
//! after the other, none succeeding in between. Failures among successes (a few keys that a
//! policy denies among many it allows) never stop a run: they are the objects' own problems,
//! and the run mirrors everything else.

use std::collections::BTreeMap;
use std::fmt;

use crate::console::{self, Level};
use crate::error::{ObjectError, PartError, SourceErrorKind, TooManyFailures, WriteError};
use crate::report::Failure;

/// Failures printed one by one, with their reason.
pub(crate) const SHOWN: usize = 20;

/// What a failure comes from, for counting: the request's verb (GET, HEAD), what it met and
/// the server's answer (HTTP status, S3 error code).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cause {
    request: Option<&'static str>,
    what: &'static str,
    answer: Option<(u16, String)>,
}

impl Cause {
    fn named(what: &'static str) -> Self {
        Self {
            request: None,
            what,
            answer: None,
        }
    }

    pub(crate) fn of(err: &ObjectError) -> Self {
        match err {
            ObjectError::Part(part) => Self::of_part(part),
            ObjectError::ChangedSinceSnapshot { .. } => Self::named("changed since the snapshot"),
            ObjectError::NotAsSealed { .. } => Self::named("not as sealed"),
            ObjectError::KeptChanging { .. } => Self::named("kept changing"),
            ObjectError::Local(_) => Self::named("local error"),
            ObjectError::Refused(_) => Self::named("key refused"),
            ObjectError::Task(_) => Self::named("task failed"),
        }
    }

    fn of_part(err: &PartError) -> Self {
        match err {
            PartError::GaveUp { last, .. } => Self::of_part(last),
            PartError::Source(source) => {
                let verb = source.request.split(' ').next();
                let request = ["GET", "HEAD"].into_iter().find(|v| Some(*v) == verb);
                Self {
                    request,
                    ..Self::of_source(&source.kind)
                }
            }
            PartError::Changed => Self::named("changed during the download"),
            PartError::Body(_) => Self::named("broken body"),
            PartError::Protocol(_) => Self::named("wrong answer to a ranged GET"),
            PartError::ChecksumMismatch { .. } => Self::named("checksum mismatch"),
            PartError::Md5Mismatch { .. } => Self::named("MD5 mismatch"),
            PartError::Write(WriteError::Full { .. }) => Self::named("filesystem full"),
            PartError::Write(_) => Self::named("write failed"),
            PartError::Local(_) => Self::named("local error"),
            PartError::Task(..) => Self::named("task failed"),
        }
    }

    fn of_source(kind: &SourceErrorKind) -> Self {
        use SourceErrorKind::*;
        let (what, answer) = match kind {
            Changed => ("changed", None),
            NoSuchBucket => ("no such bucket", None),
            CredentialsRejected(a) => ("credentials rejected", Some(a)),
            WrongSecretKey(a) => ("wrong secret key", Some(a)),
            AccessDenied(a) => ("denied", Some(a)),
            NotPublic(a) => ("refused to anonymous callers", Some(a)),
            WrongRegion(a) => ("wrong region", Some(a)),
            NotFound(a) => ("not found", Some(a)),
            Unavailable(a) => ("unavailable", Some(a)),
            Refused(a) => ("refused", Some(a)),
            Timeout => ("timed out", None),
            NoCredentials(_) => ("no credentials", None),
            Connection(_) => ("cannot connect", None),
            PlainHttp(_) => ("plain HTTP", None),
            UntrustedCertificate(_) => ("untrusted certificate", None),
            Dispatch(_) => ("request failed", None),
            BrokenResponse(_) => ("broken response", None),
            Construction(_) => ("cannot build the request", None),
        };
        Self {
            request: None,
            what,
            answer: answer.map(|a| (a.status, a.code.clone())),
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(request) = self.request {
            write!(f, "{request} ")?;
        }
        f.write_str(self.what)?;
        match &self.answer {
            Some((status, code)) if code.is_empty() => write!(f, " (HTTP {status})"),
            Some((status, code)) => write!(f, " (HTTP {status} {code})"),
            None => Ok(()),
        }
    }
}

/// The run's failures as they are booked: the first [`SHOWN`] kept (and printed), the others
/// counted by cause; and the current run of failures with no success in between.
pub(crate) struct Book {
    /// `failed`, or `would fail` in a dry run.
    verb: &'static str,
    /// `--max-errors`; 0: never stop.
    max_errors: u64,
    shown: Vec<Failure>,
    unshown: BTreeMap<Cause, u64>,
    streak: u64,
    /// The first failure of the streak: `KEY: reason`.
    streak_first: Option<String>,
}

impl Book {
    pub(crate) fn new(dry_run: bool, max_errors: u64) -> Self {
        Self {
            verb: if dry_run { "would fail" } else { "failed" },
            max_errors,
            shown: Vec::new(),
            unshown: BTreeMap::new(),
            streak: 0,
            streak_first: None,
        }
    }

    /// Books a failed object, printing it if it is among the first [`SHOWN`]; says when this
    /// failure makes `--max-errors` in a row (once).
    pub(crate) fn failed(&mut self, failure: Failure, cause: Cause) -> Option<TooManyFailures> {
        self.streak += 1;
        if self.streak == 1 {
            self.streak_first = Some(format!("{}: {}", failure.key, failure.reason));
        }
        if self.shown.len() < SHOWN {
            let line = format_args!("{}: {}: {}", self.verb, failure.key, failure.reason);
            console::say(Level::Error, line, Some(&failure));
            self.shown.push(failure);
        } else {
            *self.unshown.entry(cause).or_default() += 1;
        }
        (self.max_errors > 0 && self.streak == self.max_errors).then(|| TooManyFailures {
            max_errors: self.max_errors,
            first: self.streak_first.clone().unwrap_or_default(),
        })
    }

    /// An object succeeded (downloaded or up to date): the failures before it are no streak.
    pub(crate) fn succeeded(&mut self) {
        self.streak = 0;
        self.streak_first = None;
    }

    /// The failures that were printed, and the count of the others by cause.
    pub(crate) fn finish(self) -> (Vec<Failure>, Unshown) {
        let mut unshown: Vec<(Cause, u64)> = self.unshown.into_iter().collect();
        unshown.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        (self.shown, Unshown(unshown))
    }
}

/// The failures not printed one by one, counted by cause, most frequent first.
#[derive(Debug, Default)]
pub(crate) struct Unshown(Vec<(Cause, u64)>);

impl Unshown {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Unshown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: u64 = self.0.iter().map(|(_, n)| n).sum();
        write!(f, "... and {total} more failures: ")?;
        for (i, (cause, n)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{n} × {cause}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{HttpAnswer, SourceError};

    fn denied(key: &str) -> (Failure, Cause) {
        let err = ObjectError::Part(PartError::Source(SourceError {
            request: format!("GET {key} bytes=0-99"),
            kind: SourceErrorKind::AccessDenied(HttpAnswer {
                status: 403,
                code: "AccessDenied".into(),
                message: format!("no reading {key}"),
            }),
            cause: None,
        }));
        let failure = Failure {
            key: key.into(),
            reason: err.to_string(),
        };
        (failure, Cause::of(&err))
    }

    fn refused(key: &str) -> (Failure, Cause) {
        let err = ObjectError::Refused("key has a \"..\" path segment".into());
        let failure = Failure {
            key: key.into(),
            reason: err.to_string(),
        };
        (failure, Cause::of(&err))
    }

    #[test]
    fn failures_past_the_first_twenty_are_counted_by_cause_not_by_message() {
        let mut book = Book::new(false, 0);
        for i in 0..310 {
            let (failure, cause) = denied(&format!("k/{i}"));
            assert!(book.failed(failure, cause).is_none());
        }
        for i in 0..3 {
            let (failure, cause) = refused(&format!("../{i}"));
            book.failed(failure, cause);
        }
        let (shown, unshown) = book.finish();
        assert_eq!(shown.len(), SHOWN);
        assert_eq!(shown[0].key, "k/0");
        assert_eq!(
            unshown.to_string(),
            "... and 293 more failures: 290 × GET denied (HTTP 403 AccessDenied), 3 × key refused"
        );
    }

    #[test]
    fn max_errors_failures_in_a_row_stop_and_a_success_between_them_resets_the_count() {
        let mut book = Book::new(false, 5);
        for round in 0..10 {
            for i in 0..4 {
                let (failure, cause) = denied(&format!("r{round}/{i}"));
                assert!(book.failed(failure, cause).is_none(), "4 in a row");
            }
            book.succeeded();
        }
        let mut tripped = None;
        for i in 0..7 {
            let (failure, cause) = denied(&format!("last/{i}"));
            if let Some(stop) = book.failed(failure, cause) {
                tripped = Some((i, stop));
            }
        }
        let (at, stop) = tripped.expect("5 in a row stop the run");
        assert_eq!(at, 4, "at the fifth failure in a row, once");
        assert_eq!(
            stop.to_string(),
            "5 objects failed in a row and none succeeded since (--max-errors 5); first cause: last/0: GET last/0 bytes=0-99: access denied (HTTP 403 AccessDenied: no reading last/0)"
        );
        let mut never = Book::new(false, 0);
        for i in 0..1000 {
            let (failure, cause) = denied(&i.to_string());
            assert!(never.failed(failure, cause).is_none(), "--max-errors 0");
        }
    }
}
