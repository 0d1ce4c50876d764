//! An object of a sealed dataset through the node's peers (`crate::p2p`): the dfdaemon writes
//! it into DEST's `.hydrator/peers/`, hydrator makes the object's `.NAME.partial` from it, and
//! only once that file's size and BLAKE3 match the seal is it published like a downloaded file.
//! Anything else (the dfdaemon absent or failing, a short file, other bytes, something that is
//! not a regular file) removes what came and leaves the object to the store, so a peer can delay
//! a file but never publish a wrong one.
//!
//! Why it is built this way:
//! - What the dfdaemon delivered is opened once, without following a link and without blocking
//!   (`O_NOFOLLOW|O_NONBLOCK`, relative to the staging directory), and `fstat`ed: only a regular
//!   file is taken. A FIFO opened plainly would block the open, and then every read, outside
//!   every timeout, and a thread stuck there keeps the process from exiting after SIGTERM.
//! - The partial file is an inode of hydrator's own, filled from that descriptor: a reflink
//!   (`FICLONE`: the blocks are shared copy-on-write, so still one copy on disk) where the
//!   filesystem has them (XFS, btrfs), a copy otherwise. The dfdaemon may hard-link its
//!   storage's file to the output path; publishing that inode would let a later write to the
//!   dfdaemon's copy change a READY, sealed snapshot. What is checked against the seal is our
//!   inode's bytes (read back after a reflink) or the very bytes written to it (a copy), and
//!   that inode is what the committer publishes: a peer that swaps the delivered name after
//!   the download changes nothing that is published.
//! - The copy and the hash run on a blocking thread that looks, between chunks, whether the
//!   object's task is gone (the run stopping): a stop never waits for a large file's copy.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

use super::context::Ctx;
use super::stats::Stats;
use crate::fs::{Dir, OFlags};
use crate::p2p::{PeerError, Peers};
use crate::plan::keys::{RelPath, STATE_DIR};
use crate::source::fetch::PinnedObject;
use crate::write::dest::{self, Dest};

/// Where the dfdaemon writes, under DEST's state directory.
const STAGING_DIR: &str = "peers";
/// Bytes read (and, for a copy, written) at a time: between two chunks, a stopped run is seen.
const CHUNK: usize = 1 << 20;

/// What the peers' file must be to count: its size and sealed BLAKE3, and the mtime a
/// downloaded file gets.
struct Expected {
    size: u64,
    sealed: [u8; 32],
    modified: Option<SystemTime>,
}

/// Fetches `object` through `peers` into `rel`'s partial file, checked against `sealed`.
pub(super) async fn fetch(
    ctx: &Ctx,
    peers: &dyn Peers,
    object: &PinnedObject,
    rel: &RelPath,
    sealed: [u8; 32],
    modified: Option<SystemTime>,
) -> Result<blake3::Hash, PeerError> {
    let name = blake3::hash(object.key.as_bytes()).to_hex()[..32].to_string();
    let dest = ctx.write.dest.clone();
    let (staging, output) = {
        let (dest, name) = (dest.clone(), name.clone());
        blocking(move || Ok(staging(&dest, &name)?)).await?
    };
    let fetched = peers.download(object, &output).await;
    // Dropped, and so set, when this task is: the blocking work below then stops.
    let abandoned = AbandonedOnDrop::default();
    let (expected, rel) = (
        Expected {
            size: object.size,
            sealed,
            modified,
        },
        rel.clone(),
    );
    let abandoned_flag = abandoned.0.clone();
    let taken = blocking(move || {
        let taken = fetched.and_then(|()| {
            take_delivered(&dest, &staging, &name, &rel, &expected, &abandoned_flag)
        });
        remove_delivered(&staging, &name);
        taken
    })
    .await;
    if taken.is_ok() {
        Stats::add(&ctx.fetch.stats.bytes_from_peers, object.size);
    }
    taken
}

/// Set when the object's task is dropped before its blocking work ends (the run stopping):
/// that work then stops at its next chunk.
#[derive(Default)]
struct AbandonedOnDrop(Arc<AtomicBool>);

impl Drop for AbandonedOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// The staging directory, with nothing left at `name`, and the path the dfdaemon writes to.
fn staging(dest: &Dest, name: &str) -> io::Result<(Dir, PathBuf)> {
    let state = dest.state_dir()?;
    state.create_dir(STAGING_DIR)?;
    let staging = state.open_dir(STAGING_DIR)?;
    remove(&staging, name)?;
    let output = std::path::absolute(dest.path())?
        .join(STATE_DIR)
        .join(STAGING_DIR)
        .join(name);
    Ok((staging, output))
}

/// Removes what is at `name` in the staging directory, an (empty) directory included.
fn remove(staging: &Dir, name: &str) -> io::Result<()> {
    match staging.unlink(name) {
        Err(err) if err.raw_os_error() == Some(libc::EISDIR) => staging.remove_dir(name),
        other => other,
    }
}

/// [`remove`], logging a failure: the next fetch of the object removes it again.
fn remove_delivered(staging: &Dir, name: &str) {
    if let Err(err) = remove(staging, name) {
        tracing::warn!("removing what the peers delivered at .hydrator/peers/{name}: {err}");
    }
}

/// Makes `rel`'s partial file from the regular file the peers delivered at `name`, checked
/// against `expected`; on failure no partial file is left.
fn take_delivered(
    dest: &Dest,
    staging: &Dir,
    name: &str,
    rel: &RelPath,
    expected: &Expected,
    abandoned: &AtomicBool,
) -> Result<blake3::Hash, PeerError> {
    let delivered = open_delivered(staging, name, expected.size)?;
    let (dir, ours) = dest.create_partial(rel, false)?;
    let made = own_copy(&delivered, &ours, expected.size, abandoned).and_then(|hash| {
        if hash.as_bytes() != &expected.sealed {
            return Err(PeerError::NotAsSealed {
                sealed: crate::manifest::hex(&expected.sealed),
                got: hash.to_hex().to_string(),
            });
        }
        if let Some(modified) = expected.modified {
            ours.set_modified(modified)?;
        }
        Ok(hash)
    });
    if made.is_err() {
        drop(ours);
        let partial = rel.partial_name();
        if let Err(err) = dir.unlink(&partial) {
            tracing::warn!("removing {partial} made from the peers' file: {err}");
        }
    }
    made
}

/// Opens the file at `name` if it is a regular file of `size` bytes.
fn open_delivered(staging: &Dir, name: &str, size: u64) -> Result<File, PeerError> {
    let delivered = match staging.open_file(name, OFlags::RDONLY | OFlags::NONBLOCK) {
        Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
            return Err(PeerError::NotRegular { found: "a symlink" })
        }
        // A unix socket cannot be opened.
        Err(err) if err.raw_os_error() == Some(libc::ENXIO) => {
            return Err(PeerError::NotRegular { found: "a socket" })
        }
        other => other?,
    };
    let meta = delivered.metadata()?;
    let kind = meta.file_type();
    let found = match () {
        () if kind.is_file() => None,
        () if kind.is_fifo() => Some("a FIFO"),
        () if kind.is_dir() => Some("a directory"),
        () if kind.is_block_device() || kind.is_char_device() => Some("a device"),
        () => Some("neither a file nor a directory"),
    };
    if let Some(found) = found {
        return Err(PeerError::NotRegular { found });
    }
    match meta.len() {
        got if got == size => Ok(delivered),
        got => Err(PeerError::WrongSize { got, size }),
    }
}

/// Fills `ours` with the first `size` bytes of `delivered`, sharing its blocks where the
/// filesystem can (a reflink), copying them otherwise; returns the BLAKE3 of what `ours` holds.
fn own_copy(
    delivered: &File,
    ours: &File,
    size: u64,
    abandoned: &AtomicBool,
) -> Result<blake3::Hash, PeerError> {
    match rustix::fs::ioctl_ficlone(ours, delivered) {
        Ok(()) => {
            // The reflink took the whole file as it was then, which a writer may have changed.
            let got = ours.metadata()?.len();
            if got != size {
                return Err(PeerError::WrongSize { got, size });
            }
            hash_chunks(ours, size, abandoned, |_, _| Ok(()))
        }
        // No reflinks on this filesystem (ext4, tmpfs, overlayfs), or not between these two.
        Err(err) => {
            tracing::debug!("no reflink of the peers' file ({err}): copying it");
            dest::preallocate(ours, size)?;
            hash_chunks(delivered, size, abandoned, |chunk, at| {
                ours.write_all_at(chunk, at)
            })
        }
    }
}

/// The BLAKE3 of the first `size` bytes of `file`, read a chunk at a time, each chunk also
/// handed to `also` with its offset.
fn hash_chunks(
    file: &File,
    size: u64,
    abandoned: &AtomicBool,
    mut also: impl FnMut(&[u8], u64) -> io::Result<()>,
) -> Result<blake3::Hash, PeerError> {
    let mut buffer = vec![0u8; CHUNK.min(size as usize)];
    let mut hasher = blake3::Hasher::new();
    let mut at = 0u64;
    while at < size {
        if abandoned.load(Relaxed) {
            return Err(PeerError::Abandoned);
        }
        let want = buffer.len().min((size - at) as usize);
        let read = match file.read_at(&mut buffer[..want], at) {
            Ok(0) => return Err(PeerError::WrongSize { got: at, size }),
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err.into()),
        };
        let chunk = &buffer[..read];
        hasher.update(chunk);
        also(chunk, at)?;
        at += read as u64;
    }
    Ok(hasher.finalize())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, PeerError> + Send + 'static,
) -> Result<T, PeerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| PeerError::Local(io::Error::other(err)))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::keys::{plan_key, KeyPlan};
    use std::os::unix::fs::MetadataExt;

    const DATA: &[u8] = b"the sealed bytes of one object";

    /// DEST, its staging directory, and what a sealed `obj.bin` holding [`DATA`] must be.
    struct Staged {
        root: tempfile::TempDir,
        dest: Dest,
        staging: Dir,
        expected: Expected,
    }

    impl Staged {
        fn new() -> Self {
            let root = tempfile::tempdir().unwrap();
            let dest = Dest::open(root.path()).unwrap();
            let (staging, _) = staging(&dest, "delivered").unwrap();
            let expected = Expected {
                size: DATA.len() as u64,
                sealed: *blake3::hash(DATA).as_bytes(),
                modified: None,
            };
            Self {
                root,
                dest,
                staging,
                expected,
            }
        }

        fn delivered(&self) -> PathBuf {
            self.root.path().join(".hydrator/peers/delivered")
        }

        fn take(&self, abandoned: bool) -> Result<blake3::Hash, PeerError> {
            let rel = match plan_key("", "obj.bin", 1) {
                KeyPlan::File(rel) => rel,
                other => panic!("{other:?}"),
            };
            let abandoned = AtomicBool::new(abandoned);
            take_delivered(
                &self.dest,
                &self.staging,
                "delivered",
                &rel,
                &self.expected,
                &abandoned,
            )
        }

        fn partial(&self) -> PathBuf {
            self.root.path().join(".obj.bin.partial")
        }
    }

    #[test]
    fn a_regular_file_is_taken_into_an_inode_of_our_own() {
        let staged = Staged::new();
        std::fs::write(staged.delivered(), DATA).unwrap();
        let hash = staged.take(false).unwrap();
        assert_eq!(hash.as_bytes(), &staged.expected.sealed);
        assert_eq!(std::fs::read(staged.partial()).unwrap(), DATA);
        let (ours, theirs) = (
            std::fs::metadata(staged.partial()).unwrap(),
            std::fs::metadata(staged.delivered()).unwrap(),
        );
        assert_ne!(ours.ino(), theirs.ino());
        assert_eq!(ours.nlink(), 1);
    }

    #[test]
    fn only_a_regular_file_is_taken() {
        let staged = Staged::new();
        let outside = staged.root.path().join("outside");
        std::fs::write(&outside, DATA).unwrap();
        let delivered = staged.delivered();
        for found in ["a FIFO", "a symlink", "a directory"] {
            match found {
                "a FIFO" => {
                    let mode = rustix::fs::Mode::from_raw_mode(0o600);
                    rustix::fs::mkfifoat(rustix::fs::CWD, &delivered, mode).unwrap()
                }
                "a symlink" => std::os::unix::fs::symlink(&outside, &delivered).unwrap(),
                _ => std::fs::create_dir(&delivered).unwrap(),
            }
            match staged.take(false) {
                Err(PeerError::NotRegular { found: got }) => assert_eq!(got, found),
                other => panic!("{found}: {other:?}"),
            }
            assert!(!staged.partial().exists(), "{found}");
            remove(&staged.staging, "delivered").unwrap();
        }
        assert_eq!(std::fs::read(&outside).unwrap(), DATA);
    }

    #[test]
    fn a_file_of_another_size_or_other_bytes_leaves_no_partial_file() {
        let staged = Staged::new();
        let mut other = DATA.to_vec();
        other[3] ^= 1;
        for (delivered, short) in [(&DATA[1..], true), (&other[..], false)] {
            std::fs::write(staged.delivered(), delivered).unwrap();
            match (staged.take(false), short) {
                (Err(PeerError::WrongSize { got, size }), true) => {
                    assert_eq!((got, size), (DATA.len() as u64 - 1, DATA.len() as u64))
                }
                (Err(PeerError::NotAsSealed { .. }), false) => {}
                (other, _) => panic!("{other:?}"),
            }
            assert!(!staged.partial().exists());
            remove(&staged.staging, "delivered").unwrap();
        }
    }

    #[test]
    fn a_stopped_run_stops_taking_the_file() {
        let staged = Staged::new();
        std::fs::write(staged.delivered(), DATA).unwrap();
        assert!(matches!(staged.take(true), Err(PeerError::Abandoned)));
        assert!(!staged.partial().exists());
    }
}
