//! `hydrator verify DEST [--repair]`: re-hashes every file the manifest holds, in parallel,
//! and reports files that are missing or corrupt (size or BLAKE3 differ), which make the exit
//! code non-zero, and files that are not in the source (not in the manifest), which are only
//! named: the same rule as `sync`, whose READY covers the source's files and whose summary
//! counts the others. A plain `verify` only reads, without the lock, so it runs where trainers
//! mount the data (read-only, as another uid); `--repair` removes READY, forgets the missing
//! and corrupt files in the manifest and runs a sync of the manifest's source, which fetches
//! exactly those again and writes READY once the dataset is whole. The manifest is read as a
//! run would find it, without folding it ([`ManifestView`]).
//!
//! A DEST without READY fails the check too, however sound its files: it is not a dataset a
//! trainer may start on. What it holds is said against what the last run's listing selected
//! ([`selected`]), so "72 of 365 objects" tells an interrupted hydration from a finished one.
//! hydrator's own `.NAME.partial` files (downloads in progress, or left by a run cut short) are
//! not files "not in the source": they are the dataset's, on their way.

use std::fmt;
use std::io;
use std::sync::Mutex;

use crate::error::{IoContext, SyncError, UsageError};
use crate::manifest::base::ObjectStream;
use crate::manifest::journal::SourceInfo;
use crate::manifest::selected::{self, Selected};
use crate::manifest::view::ManifestView;
use crate::manifest::{lock, ready, Manifest};
use crate::plan::keys::{is_partial_name, plan_key, KeyPlan, STATE_DIR};
use crate::units::human_bytes;
use crate::write::dest::Dest;
use crate::write::walk::walk;

/// What `verify` found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub checked: u64,
    /// Bytes of the files checked: the published objects' sizes.
    pub checked_bytes: u64,
    /// READY was missing: how incomplete DEST is.
    pub incomplete: Option<Incomplete>,
    pub missing: Vec<String>,
    pub corrupt: Vec<String>,
    /// Files in DEST the manifest does not hold: not part of the dataset, not an error.
    pub foreign: Vec<String>,
    /// Keys of the missing and corrupt files.
    pub bad_keys: Vec<String>,
}

impl Findings {
    /// Nothing missing or corrupt.
    pub(crate) fn clean(&self) -> bool {
        self.missing.is_empty() && self.corrupt.is_empty()
    }

    /// Clean, and READY there: the check passes.
    pub(crate) fn passes(&self) -> bool {
        self.clean() && self.incomplete.is_none()
    }
}

/// A DEST without READY: the published objects its manifest records, against what the last
/// run's listing selected (`None`: that run stopped before its listing ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Incomplete {
    pub objects: u64,
    pub bytes: u64,
    pub selected: Option<Selected>,
}

impl fmt::Display for Incomplete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (objects, bytes) = (self.objects, human_bytes(self.bytes));
        match self.selected {
            Some(all) => write!(
                f,
                "READY missing: the manifest records {objects} of {} objects ({bytes} of {})",
                all.objects,
                human_bytes(all.bytes)
            ),
            None => write!(
                f,
                "READY missing: the manifest records {objects} objects ({bytes}); the last run did not finish listing, so the total is not known"
            ),
        }
    }
}

struct Expected {
    key: String,
    path: String,
    size: u64,
    blake3: [u8; 32],
}

/// What `verify` may change in DEST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Remove READY when a file is missing or corrupt, and forget those files in the
    /// manifest, so the next sync fetches them again.
    Repair,
    /// Change nothing, take no lock.
    ReadOnly,
}

/// Checks DEST against its manifest, as `mode` allows. Returns the findings and the manifest's
/// source.
pub(crate) async fn verify(
    dest_path: &std::path::Path,
    mode: Mode,
) -> Result<(Findings, SourceInfo), SyncError> {
    let no_manifest = || {
        UsageError::new(format!(
            "{} has no hydrator manifest to verify against",
            dest_path.display()
        ))
    };
    if !dest_path.is_dir() {
        return Err(UsageError::new(format!("{} is not a directory", dest_path.display())).into());
    }
    let state_path = dest_path.join(STATE_DIR);
    let dest = Dest::open_existing(dest_path)
        .map_err(|e| UsageError::new(format!("{}: {e}", dest_path.display())))?
        .ok_or_else(|| UsageError::new(format!("{} is gone", dest_path.display())))?;
    let (state_dir, lock) = match mode {
        Mode::ReadOnly => {
            let dir = dest
                .existing_state_dir()
                .local("opening", &state_path)?
                .ok_or_else(no_manifest)?;
            (dir, None)
        }
        Mode::Repair => {
            let dir = dest.state_dir().local("opening", &state_path)?;
            let lock = lock::acquire(&dir, None).await?;
            (dir, Some(lock))
        }
    };
    let view = state_dir
        .try_clone()
        .and_then(|dir| ManifestView::open(dir, None, lock.is_some()))
        .local("reading the manifest in", &state_path)?
        .ok_or_else(no_manifest)?;
    let source = view.source().clone();
    let findings = tokio::task::spawn_blocking(move || -> io::Result<Findings> {
        let has_ready = ready::exists(&state_dir)?;
        let selected = selected::read(&state_dir);
        let mut findings = check(&dest, &view)?;
        if !has_ready {
            findings.incomplete = Some(Incomplete {
                objects: findings.checked,
                bytes: findings.checked_bytes,
                selected,
            });
        }
        if findings.clean() || mode == Mode::ReadOnly {
            return Ok(findings);
        }
        ready::remove(&state_dir)?;
        let (_, manifest) = Manifest::open_existing(state_dir)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the manifest is gone"))?;
        for key in &findings.bad_keys {
            manifest.forget(key)?;
        }
        manifest.sync()?;
        drop(lock);
        Ok(findings)
    })
    .await
    .map_err(|e| SyncError::Task("verify task", e))?
    .local("verifying", dest_path)?;
    Ok((findings, source))
}

/// Files handed to the hashing threads ahead of them: the manifest is streamed, never loaded.
const QUEUED_FILES: usize = 1024;

fn check(dest: &Dest, manifest: &ManifestView) -> io::Result<Findings> {
    let prefix = &manifest.source().prefix;
    let findings = Mutex::new(Findings::default());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (queue, files) = std::sync::mpsc::sync_channel::<Expected>(QUEUED_FILES);
    let files = Mutex::new(files);
    let streamed = std::thread::scope(|scope| -> io::Result<(u64, u64)> {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let Ok(file) = files.lock().expect("queue lock").recv() else {
                    return;
                };
                let verdict = check_file(dest, &file);
                let mut f = findings.lock().expect("findings lock");
                match verdict {
                    Verdict::Good => continue,
                    Verdict::Missing => f.missing.push(file.path.clone()),
                    Verdict::Corrupt(why) => f.corrupt.push(format!("{} ({why})", file.path)),
                }
                f.bad_keys.push(file.key);
            });
        }
        let (mut checked, mut checked_bytes) = (0, 0);
        let mut objects = manifest.objects()?;
        while let Some((key, o)) = objects.next_object()? {
            if let Some(done) = o.complete {
                let file = Expected {
                    key,
                    path: o.path,
                    size: o.size,
                    blake3: done.blake3,
                };
                checked += 1;
                checked_bytes += file.size;
                if queue.send(file).is_err() {
                    break;
                }
            }
        }
        drop(queue);
        Ok((checked, checked_bytes))
    });
    let mut findings = findings.into_inner().expect("findings lock");
    (findings.checked, findings.checked_bytes) = streamed?;
    let mut base = manifest.cursor()?;
    walk(dest, false, &mut |entry| {
        if is_partial_name(entry.name) {
            return Ok(());
        }
        let key = format!("{prefix}{}", entry.path);
        if base.find(&key)?.is_none_or(|o| o.complete.is_none()) {
            findings.foreign.push(entry.path.to_string());
        }
        Ok(())
    })?;
    findings.missing.sort();
    findings.corrupt.sort();
    findings.foreign.sort();
    Ok(findings)
}

enum Verdict {
    Good,
    Missing,
    Corrupt(String),
}

fn check_file(dest: &Dest, file: &Expected) -> Verdict {
    let KeyPlan::File(rel) = plan_key("", &file.path, file.size) else {
        return Verdict::Corrupt("the manifest holds an invalid path".into());
    };
    let opened = match dest.open_final(&rel) {
        Ok(Some(opened)) => opened,
        Ok(None) => return Verdict::Missing,
        Err(err) => return Verdict::Corrupt(format!("cannot open: {err}")),
    };
    match opened.metadata() {
        Ok(meta) if meta.len() != file.size => {
            return Verdict::Corrupt(format!("{} bytes, expected {}", meta.len(), file.size))
        }
        Err(err) => return Verdict::Corrupt(format!("cannot stat: {err}")),
        Ok(_) => {}
    }
    let mut hasher = blake3::Hasher::new();
    if let Err(err) = hasher.update_reader(opened) {
        return Verdict::Corrupt(format!("cannot read: {err}"));
    }
    if hasher.finalize().as_bytes() == &file.blake3 {
        Verdict::Good
    } else {
        Verdict::Corrupt("BLAKE3 differs".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_says_what_the_manifest_holds_against_the_selection_or_that_it_is_unknown() {
        let mut incomplete = Incomplete {
            objects: 72,
            bytes: 72 << 20,
            selected: Some(Selected {
                objects: 365,
                bytes: 365 << 20,
            }),
        };
        assert_eq!(
            incomplete.to_string(),
            "READY missing: the manifest records 72 of 365 objects (72.0 MiB of 365.0 MiB)"
        );
        incomplete.selected = None;
        assert_eq!(
            incomplete.to_string(),
            "READY missing: the manifest records 72 objects (72.0 MiB); the last run did not finish listing, so the total is not known"
        );
    }
}
