//! `hydrator verify DEST [--repair]`: re-hashes every file the manifest holds, in parallel,
//! and reports files that are missing, corrupt (size or BLAKE3 differ) or unexpected (not in
//! the manifest). Any finding removes READY and makes the exit code non-zero; `--repair`
//! forgets the missing and corrupt files in the manifest and runs a sync of the manifest's
//! source, which fetches exactly those again and writes READY once the dataset is whole.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use crate::error::{IoContext, SyncError, UsageError};
use crate::manifest::{lock, ready, Manifest};
use crate::plan::keys::{plan_key, KeyPlan, STATE_DIR};
use crate::write::dest::Dest;
use crate::write::walk::walk;

/// What `verify` found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub checked: u64,
    pub missing: Vec<String>,
    pub corrupt: Vec<String>,
    pub unexpected: Vec<String>,
    /// Keys of the missing and corrupt files.
    pub bad_keys: Vec<String>,
}

impl Findings {
    pub(crate) fn clean(&self) -> bool {
        self.missing.is_empty() && self.corrupt.is_empty() && self.unexpected.is_empty()
    }
}

struct Expected {
    key: String,
    path: String,
    size: u64,
    blake3: [u8; 32],
}

/// Checks DEST against its manifest; with `forget_bad`, missing and corrupt files are forgotten
/// in the manifest so the next sync fetches them again. Returns the findings and the manifest's
/// source.
pub(crate) async fn verify(
    dest_path: &std::path::Path,
    forget_bad: bool,
) -> Result<(Findings, crate::manifest::journal::SourceInfo), SyncError> {
    if !dest_path.is_dir() {
        return Err(UsageError::new(format!("{} is not a directory", dest_path.display())).into());
    }
    let dest = Dest::open(dest_path)
        .map_err(|e| UsageError::new(format!("{}: {e}", dest_path.display())))?;
    let state_dir = dest
        .state_dir()
        .local("opening", dest_path.join(STATE_DIR))?;
    let _lock = lock::acquire(&state_dir, None).await?;
    let (source, manifest) = state_dir
        .try_clone()
        .and_then(Manifest::open_existing)
        .local("reading the manifest in", dest_path.join(STATE_DIR))?
        .ok_or_else(|| {
            UsageError::new(format!(
                "{} has no hydrator manifest to verify against",
                dest_path.display()
            ))
        })?;
    let findings = tokio::task::spawn_blocking(move || -> io::Result<Findings> {
        let findings = check(&dest, &manifest)?;
        if !findings.clean() {
            ready::remove(&state_dir)?;
        }
        if forget_bad {
            for key in &findings.bad_keys {
                manifest.forget(key)?;
            }
            manifest.sync()?;
        }
        Ok(findings)
    })
    .await
    .map_err(|e| SyncError::Task("verify task", e))?
    .local("verifying", dest_path)?;
    Ok((findings, source))
}

fn check(dest: &Dest, manifest: &Manifest) -> io::Result<Findings> {
    let expected: Vec<Expected> = manifest
        .state()
        .objects
        .iter()
        .filter_map(|(key, o)| {
            o.complete.map(|c| Expected {
                key: key.clone(),
                path: o.path.clone(),
                size: o.size,
                blake3: c.blake3,
            })
        })
        .collect();
    let findings = Mutex::new(Findings {
        checked: expected.len() as u64,
        ..Default::default()
    });
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(file) = expected.get(next.fetch_add(1, Relaxed)) {
                    let verdict = check_file(dest, file);
                    let mut f = findings.lock().expect("findings lock");
                    match verdict {
                        Verdict::Good => continue,
                        Verdict::Missing => f.missing.push(file.path.clone()),
                        Verdict::Corrupt(why) => f.corrupt.push(format!("{} ({why})", file.path)),
                    }
                    f.bad_keys.push(file.key.clone());
                }
            });
        }
    });
    let mut findings = findings.into_inner().expect("findings lock");
    let known: HashSet<&str> = expected.iter().map(|e| e.path.as_str()).collect();
    walk(dest, false, &mut |entry| {
        if !known.contains(entry.path) {
            findings.unexpected.push(entry.path.to_string());
        }
        Ok(())
    })?;
    findings.missing.sort();
    findings.corrupt.sort();
    findings.unexpected.sort();
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
