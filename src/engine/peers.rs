//! An object of a sealed dataset through the node's peers (`crate::p2p`): the dfdaemon writes
//! it into DEST's `.hydrator/peers/`, and only once its size and BLAKE3 match the seal is it
//! moved to the object's `.NAME.partial`, from where it is published like a downloaded file.
//! Anything else (the dfdaemon absent or failing, a short file, other bytes) removes what came
//! and leaves the object to the store, so a peer can delay a file but never publish a wrong one.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::context::Ctx;
use super::stats::Stats;
use crate::fs::{Dir, OFlags, FILE_MODE};
use crate::p2p::{PeerError, Peers};
use crate::plan::keys::{RelPath, STATE_DIR};
use crate::source::fetch::PinnedObject;
use crate::write::dest::Dest;

/// Where the dfdaemon writes, under DEST's state directory.
const STAGING_DIR: &str = "peers";

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
    let staging = Arc::new(staging);
    let fetched = peers.download(object, &output).await;
    let (size, rel) = (object.size, rel.clone());
    let checked = match fetched {
        Ok(()) => {
            let (staging, name) = (staging.clone(), name.clone());
            blocking(move || check_and_place(&dest, &staging, &name, &rel, size, sealed, modified))
                .await
        }
        Err(err) => Err(err),
    };
    if checked.is_err() {
        if let Err(err) = staging.unlink(&name) {
            tracing::warn!("removing what the peers delivered of {}: {err}", object.key);
        }
    } else {
        Stats::add(&ctx.fetch.stats.bytes_from_peers, size);
    }
    checked
}

/// The staging directory, with nothing left at `name`, and the path the dfdaemon writes to.
fn staging(dest: &Dest, name: &str) -> io::Result<(Dir, PathBuf)> {
    let state = dest.state_dir()?;
    state.create_dir(STAGING_DIR)?;
    let staging = state.open_dir(STAGING_DIR)?;
    staging.unlink(name)?;
    let output = std::path::absolute(dest.path())?
        .join(STATE_DIR)
        .join(STAGING_DIR)
        .join(name);
    Ok((staging, output))
}

/// Checks the delivered file against the seal, then moves it to `rel`'s partial file with the
/// mode and mtime a downloaded file gets.
fn check_and_place(
    dest: &Dest,
    staging: &Dir,
    name: &str,
    rel: &RelPath,
    size: u64,
    sealed: [u8; 32],
    modified: Option<SystemTime>,
) -> Result<blake3::Hash, PeerError> {
    let mut file = staging.open_file(name, OFlags::RDONLY)?;
    let got = file.metadata()?.len();
    if got != size {
        return Err(PeerError::WrongSize { got, size });
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader((&mut file).take(size))?;
    let hash = hasher.finalize();
    if hash.as_bytes() != &sealed {
        return Err(PeerError::NotAsSealed {
            sealed: crate::manifest::hex(&sealed),
            got: hash.to_hex().to_string(),
        });
    }
    rustix::fs::fchmod(&file, rustix::fs::Mode::from_raw_mode(FILE_MODE))
        .map_err(io::Error::from)?;
    if let Some(modified) = modified {
        file.set_modified(modified)?;
    }
    let parent = dest
        .open_parent(rel, true)?
        .expect("open_parent with create returns a directory");
    staging.move_to(name, &parent, rel.partial_name())?;
    Ok(hash)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, PeerError> + Send + 'static,
) -> Result<T, PeerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| PeerError::Local(io::Error::other(err)))?
}
