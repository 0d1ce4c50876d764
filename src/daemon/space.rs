//! Disk space of the cache: what it uses, what evicting a snapshot would free, and which
//! snapshots to evict.
//!
//! Snapshots of one dataset share unchanged files through hard links, so sizes do not add up:
//! a file counts `size / links` towards the cache's use, and evicting a snapshot frees only
//! its files that have no other link.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes on disk under a directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Each file's allocated bytes divided among its links: sums to the truth across the cache.
    pub shared: u64,
    /// Allocated bytes of files with no other link: what removing the directory frees.
    pub exclusive: u64,
    /// The files' bytes already written, whole whatever their links: each file's length, or
    /// as much of it as is allocated (a sparse file holds only that). What a snapshot
    /// directory already holds of its dataset.
    pub held: u64,
}

/// Walks `dir` (never following symlinks) and adds up its files' allocated bytes; in the same
/// walk, the usage of each of `parts` (directories inside `dir`), so measuring a dataset and
/// its snapshots reads each file once.
pub(crate) fn usage_within(dir: &Path, parts: &[PathBuf]) -> io::Result<(Usage, Vec<Usage>)> {
    let mut total = Usage::default();
    let mut of_parts = vec![Usage::default(); parts.len()];
    let mut pending = vec![(dir.to_path_buf(), None)];
    while let Some((dir, part)) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        for entry in entries {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            let bytes = meta.blocks() * 512;
            let counted = Usage {
                shared: bytes / meta.nlink().max(1),
                exclusive: if meta.nlink() <= 1 || meta.is_dir() {
                    bytes
                } else {
                    0
                },
                held: match meta.is_file() {
                    true => bytes.min(meta.len()),
                    false => 0,
                },
            };
            for usage in std::iter::once(&mut total).chain(part.map(|i| &mut of_parts[i])) {
                usage.shared += counted.shared;
                usage.exclusive += counted.exclusive;
                usage.held += counted.held;
            }
            if meta.is_dir() {
                // A part counts what is inside it, as `usage` of it would.
                let path = entry.path();
                let inside = part.or_else(|| parts.iter().position(|p| *p == path));
                pending.push((path, inside));
            }
        }
    }
    Ok((total, of_parts))
}

/// What a hydration of `bytes` still has to write into a snapshot directory that already
/// holds `held` (its usage's [`Usage::held`]). A hydration resumed after a restart, or given
/// the previous snapshot's unchanged files as hard links, finds part of its dataset on disk:
/// those bytes are in the cache's use already (or, linked, add nothing to it), so booking the
/// whole dataset again would count them twice.
pub(crate) fn still_to_come(bytes: u64, held: u64) -> u64 {
    bytes.saturating_sub(held)
}

/// Bytes an unprivileged writer can still use on `path`'s filesystem.
pub(crate) fn free_bytes(path: &Path) -> io::Result<u64> {
    crate::fs::free_bytes(std::fs::File::open(path)?)
}

/// The cache's limits and where it stands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    pub quota: u64,
    pub free_space_floor: u64,
    pub used: u64,
    pub free: u64,
    /// Bytes promised to hydrations already running and not on disk yet.
    pub reserved: u64,
}

/// Why space must be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pressure {
    Quota,
    FreeSpace,
}

impl Pressure {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Pressure::Quota => "quota",
            Pressure::FreeSpace => "free_space_floor",
        }
    }
}

impl Budget {
    /// Bytes to free before `need` more bytes fit, and the limit that asks for it.
    pub(crate) fn deficit(&self, need: u64) -> Option<(u64, Pressure)> {
        let over_quota = (self.used + self.reserved + need).saturating_sub(self.quota);
        let under_floor = (self.free_space_floor + self.reserved + need).saturating_sub(self.free);
        match (over_quota, under_floor) {
            (0, 0) => None,
            (q, f) if q >= f => Some((q, Pressure::Quota)),
            (_, f) => Some((f, Pressure::FreeSpace)),
        }
    }
}

/// A complete, unleased snapshot that may go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub dataset: String,
    pub digest: String,
    /// Unix seconds of its last use.
    pub last_used: u64,
    /// What evicting it frees.
    pub frees: u64,
}

/// The least recently used candidates that together free `deficit` bytes, or `None` when all
/// of them would not be enough (then nothing should be evicted).
pub(crate) fn choose(mut candidates: Vec<Candidate>, deficit: u64) -> Option<Vec<Candidate>> {
    candidates.sort_by_key(|c| c.last_used);
    let mut freed = 0;
    let mut chosen = Vec::new();
    for candidate in candidates {
        if freed >= deficit {
            break;
        }
        freed += candidate.frees;
        chosen.push(candidate);
    }
    (freed >= deficit).then_some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(dir: &Path) -> io::Result<Usage> {
        Ok(usage_within(dir, &[])?.0)
    }

    fn candidate(name: &str, last_used: u64, frees: u64) -> Candidate {
        Candidate {
            dataset: name.into(),
            digest: "d".into(),
            last_used,
            frees,
        }
    }

    #[test]
    fn least_recently_used_go_first_and_only_as_many_as_needed() {
        let all = vec![
            candidate("new", 30, 100),
            candidate("old", 10, 100),
            candidate("mid", 20, 100),
        ];
        let chosen = choose(all.clone(), 150).unwrap();
        let names: Vec<_> = chosen.iter().map(|c| c.dataset.as_str()).collect();
        assert_eq!(names, ["old", "mid"]);
        assert_eq!(choose(all.clone(), 0).unwrap(), vec![]);
        assert_eq!(choose(all, 301), None, "not enough: evict nothing");
    }

    #[test]
    fn deficit_names_the_tighter_limit() {
        let budget = Budget {
            quota: 1000,
            free_space_floor: 100,
            used: 800,
            free: 500,
            reserved: 50,
        };
        assert_eq!(budget.deficit(100), None);
        assert_eq!(budget.deficit(300), Some((150, Pressure::Quota)));
        let tight_disk = Budget {
            free: 250,
            ..budget
        };
        assert_eq!(tight_disk.deficit(150), Some((50, Pressure::FreeSpace)));
    }

    #[test]
    fn hard_linked_files_are_shared_not_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("shared"), vec![1u8; 64 << 10]).unwrap();
        std::fs::write(a.join("own"), vec![2u8; 64 << 10]).unwrap();
        std::fs::hard_link(a.join("shared"), b.join("shared")).unwrap();
        let (ua, ub, all) = (
            usage(&a).unwrap(),
            usage(&b).unwrap(),
            usage(dir.path()).unwrap(),
        );
        let (total, parts) = usage_within(dir.path(), &[b.clone(), a.clone()]).unwrap();
        assert_eq!(
            (total, parts),
            (all, vec![ub, ua]),
            "one walk, the same figures"
        );
        let file = std::fs::metadata(a.join("own")).unwrap().blocks() * 512;
        assert!(ua.exclusive >= file && ua.exclusive < 2 * file, "{ua:?}");
        assert!(ub.exclusive < file, "{ub:?}");
        assert!(all.shared >= 2 * file && all.shared < 3 * file, "{all:?}");
    }

    #[test]
    fn a_directory_holds_its_linked_files_whole_and_a_sparse_file_by_what_is_allocated() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        std::fs::create_dir_all(&old).unwrap();
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(old.join("same"), vec![1u8; 64 << 10]).unwrap();
        std::fs::hard_link(old.join("same"), new.join("same")).unwrap();
        let mut partial = std::fs::File::create(new.join(".big.partial")).unwrap();
        partial.set_len(1 << 20).unwrap();
        partial.write_all(&[2u8; 64 << 10]).unwrap();
        partial.sync_all().unwrap();
        let held = usage(&new).unwrap().held;
        let written = 2 * (64 << 10);
        assert!(held >= written && held < written + (512 << 10), "{held}");
        let dataset = (64 << 10) + (1 << 20);
        assert_eq!(still_to_come(dataset, held), dataset - held);
        assert_eq!(still_to_come(held, dataset), 0);
    }
}
