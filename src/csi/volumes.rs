//! What the plugin has published, one small file per volume under `STATE_DIR/volumes/`, so a
//! restarted plugin knows each volume's dataset, snapshot, lease holder and target: it can
//! unpublish a volume it did not publish in this life, and renew or drop leases to match what
//! is mounted.

use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fs;
use crate::snapshot::is_digest;

/// One published (or being published) volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Volume {
    pub id: String,
    pub dataset: String,
    pub snapshot: String,
    /// The daemon lease that pins the snapshot: `POD_UID:VOLUME_ID`.
    pub holder: String,
    pub target: PathBuf,
    /// Published as a lazy view served by this plugin (the dataset was hydrating), not as a
    /// bind mount.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
}

impl Volume {
    /// The UID of the pod it is published for (its holder is `POD_UID:VOLUME_ID`).
    pub(crate) fn pod(&self) -> &str {
        let suffix = self.id.len() + 1;
        &self.holder[..self.holder.len().saturating_sub(suffix)]
    }
}

pub(crate) struct Volumes {
    dir: PathBuf,
}

impl Volumes {
    pub(crate) fn open(state_dir: &Path) -> io::Result<Self> {
        let dir = state_dir.join("volumes");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    pub(crate) fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The record of volume `id`, checked: a record is trusted no more than a request (its
    /// id names its file, its holder ends with its id, its target is a plain absolute path).
    pub(crate) fn read(&self, id: &str) -> io::Result<Option<Volume>> {
        if !valid_id(id) {
            return Err(io::Error::other(format!("{id:?} is not a volume id")));
        }
        let volume: Volume = match std::fs::read(self.path(id)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(io::Error::other)?,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        let plain_target = volume.target.is_absolute()
            && (volume.target.components())
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        let holder_ok = (volume.holder.strip_suffix(&format!(":{id}")))
            .is_some_and(|pod| !pod.is_empty() && valid_id(pod));
        match volume.id == id && plain_target && holder_ok && is_digest(&volume.snapshot) {
            true => Ok(Some(volume)),
            false => Err(io::Error::other(
                "it does not match its file name, or its holder, target or snapshot is malformed",
            )),
        }
    }

    pub(crate) fn write(&self, volume: &Volume) -> io::Result<()> {
        let json = serde_json::to_vec(volume).map_err(io::Error::other)?;
        fs::write_atomic_path(&self.path(&volume.id), |file| file.write_all(&json))
    }

    /// The journal of the passthrough backings of volume `id`'s lazy view
    /// ([`crate::mount::backings`]).
    pub(crate) fn backings_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.backings"))
    }

    pub(crate) fn remove(&self, id: &str) -> io::Result<()> {
        for path in [self.backings_path(id), self.path(id)] {
            match std::fs::remove_file(path) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
                _ => {}
            }
        }
        Ok(())
    }

    /// Every recorded volume; a record that cannot be read or fails its checks is logged and
    /// removed (its file name is one of this directory's, so the removal stays in it).
    pub(crate) fn all(&self) -> io::Result<Vec<Volume>> {
        let mut volumes = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            match self.read(id) {
                Ok(Some(volume)) => volumes.push(volume),
                Ok(None) => {}
                Err(err) => {
                    tracing::error!("dropping the volume record {name}: {err}");
                    std::fs::remove_file(self.dir.join(&name))?;
                }
            }
        }
        Ok(volumes)
    }
}

/// A volume id names a record file: letters, digits, `-`, `_` and `.`, not starting with `.`.
pub(crate) fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_ids_are_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let volumes = Volumes::open(dir.path()).unwrap();
        let volume = Volume {
            id: "csi-0123abcd".into(),
            dataset: "coco".into(),
            snapshot: "ab".repeat(32),
            holder: "pod:csi-0123abcd".into(),
            target: "/var/lib/kubelet/pods/p/volumes/v/mount".into(),
            lazy: true,
        };
        volumes.write(&volume).unwrap();
        assert_eq!(volume.pod(), "pod");
        assert_eq!(volumes.read(&volume.id).unwrap(), Some(volume.clone()));
        assert_eq!(volumes.all().unwrap(), vec![volume.clone()]);
        volumes.remove(&volume.id).unwrap();
        volumes.remove(&volume.id).unwrap();
        assert_eq!(volumes.read(&volume.id).unwrap(), None);
        for bad in ["", "../x", ".hidden", "a/b", "a\0b"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
        assert!(valid_id("csi-5f2e9a.v1_x"));
    }
}
