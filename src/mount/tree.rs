//! The names a lazy view shows: a directory tree built once from the listing, before any data.
//! It never changes while mounted, so the kernel may cache every entry and attribute.
//!
//! Inode numbers are positions in one table (the root is 1). A directory's entries are kept
//! sorted by name: a lookup is a binary search and `readdir` resumes at an index, so a directory
//! of 100,000 files lists in one pass.
//!
//! Besides the listed files, a lazy view shows one file of its own, [`LAZY_MARKER`] under
//! `.hydrator/`, held in memory: no key can take that path, as the same rules as `sync`'s
//! refuse every key under the top-level `.hydrator/`. The hydrated cache bound over the view
//! has no such file, and READY instead.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use crate::plan::filter::KeyFilter;
use crate::plan::keys::{plan_key, KeyConflict, KeyPlan, Placement, RelPath, STATE_DIR};
use crate::source::list::ObjectEntry;

/// The root's inode number, as the kernel knows it.
pub(crate) const ROOT: u64 = fuser::INodeNo::ROOT.0;

/// The name, under `.hydrator/`, of the file a lazy view shows from the start: a trainer may
/// begin on it, or wait for READY (which only a complete dataset has).
pub(crate) const LAZY_MARKER: &str = "LAZY";

pub(crate) enum Kind {
    Dir {
        entries: Vec<(String, u64)>,
    },
    File(FileNode),
    /// A file of the view's own, served from these bytes.
    Memory(Vec<u8>),
}

pub(crate) struct FileNode {
    pub key: String,
    pub rel: RelPath,
    pub size: u64,
    pub mtime: SystemTime,
}

pub(crate) struct Node {
    pub parent: u64,
    pub kind: Kind,
}

pub(crate) struct Tree {
    nodes: Vec<Node>,
    files: usize,
    bytes: u64,
}

/// A listed file left out of the view: a file listed before it holds its path.
#[derive(Debug)]
pub(crate) struct Collision {
    pub key: String,
    pub why: KeyConflict,
}

impl Tree {
    /// The view of a listing under `prefix`: the files `sync` would write, by the same path
    /// rules and `filter` (a hostile key is not in it), and their keys in listing order (what
    /// the engine will fetch). A key below a file of the listing is logged and left out, as
    /// the engine refuses it.
    pub(crate) fn of_listing(
        prefix: &str,
        filter: &KeyFilter,
        listed: &[ObjectEntry],
    ) -> (Self, Vec<String>) {
        let files: Vec<_> = listed
            .iter()
            .filter_map(|entry| match plan_key(prefix, &entry.key, entry.size) {
                KeyPlan::File(rel) if filter.accepts(rel.as_str()) => Some((entry.clone(), rel)),
                _ => None,
            })
            .collect();
        let keys: Vec<String> = files.iter().map(|(entry, _)| entry.key.clone()).collect();
        let (tree, collisions) = Self::build(files);
        for conflict in &collisions {
            tracing::warn!(key = %conflict.key, "not in the view: {}", conflict.why);
        }
        let left_out: HashSet<&str> = collisions.iter().map(|c| c.key.as_str()).collect();
        let keys = keys
            .iter()
            .filter(|key| !left_out.contains(key.as_str()))
            .cloned()
            .collect();
        (tree, keys)
    }

    /// The tree of `files` (listed objects and the paths `sync` gives them), placed in key
    /// order whatever order they come in, by the engine's rule ([`Placement`]): a key below a
    /// file of the listing (`a/b` beside `a`) is left out of the view and returned.
    pub(crate) fn build(
        files: impl IntoIterator<Item = (ObjectEntry, RelPath)>,
    ) -> (Self, Vec<Collision>) {
        let mut files: Vec<_> = files.into_iter().collect();
        files.sort_unstable_by(|(a, _), (b, _)| a.key.cmp(&b.key));
        let mut tree = Self {
            nodes: vec![Node {
                parent: ROOT,
                kind: Kind::Dir {
                    entries: Vec::new(),
                },
            }],
            files: 0,
            bytes: 0,
        };
        let mut index: HashMap<(u64, String), u64> = HashMap::new();
        let mut collisions = Vec::new();
        let mut placement = Placement::default();
        for (entry, rel) in files {
            if let Err(why) = placement.place(&rel) {
                collisions.push(Collision {
                    key: entry.key,
                    why,
                });
                continue;
            }
            let mut parent = ROOT;
            for segment in rel.parents() {
                parent = match index.get(&(parent, segment.to_owned())) {
                    Some(&ino) => ino,
                    None => {
                        let ino = tree.add(
                            parent,
                            segment,
                            Kind::Dir {
                                entries: Vec::new(),
                            },
                        );
                        index.insert((parent, segment.to_owned()), ino);
                        ino
                    }
                };
            }
            let name = rel.file_name().to_owned();
            tree.files += 1;
            tree.bytes += entry.size;
            let file = FileNode {
                mtime: entry.last_modified.unwrap_or(SystemTime::UNIX_EPOCH),
                size: entry.size,
                key: entry.key,
                rel,
            };
            let ino = tree.add(parent, &name, Kind::File(file));
            index.insert((parent, name), ino);
        }
        for node in &mut tree.nodes {
            if let Kind::Dir { entries } = &mut node.kind {
                entries.sort_unstable();
            }
        }
        (tree, collisions)
    }

    /// Adds `.hydrator/LAZY`, naming the dataset and the snapshot digest whose view this is,
    /// one `key=value` a line.
    pub(crate) fn mark_lazy(&mut self, dataset: &str, snapshot: &str) {
        let dir = self.add(
            ROOT,
            STATE_DIR,
            Kind::Dir {
                entries: Vec::new(),
            },
        );
        let text = format!("dataset={dataset}\nsnapshot={snapshot}\n");
        self.add(dir, LAZY_MARKER, Kind::Memory(text.into_bytes()));
        if let Kind::Dir { entries } = &mut self.nodes[0].kind {
            entries.sort_unstable();
        }
    }

    fn add(&mut self, parent: u64, name: &str, kind: Kind) -> u64 {
        self.nodes.push(Node { parent, kind });
        let ino = self.nodes.len() as u64;
        if let Some(Node {
            kind: Kind::Dir { entries },
            ..
        }) = self.nodes.get_mut(parent as usize - 1)
        {
            entries.push((name.to_owned(), ino));
        }
        ino
    }

    pub(crate) fn node(&self, ino: u64) -> Option<&Node> {
        self.nodes.get((ino as usize).checked_sub(1)?)
    }

    /// The entry `name` of directory `parent`.
    pub(crate) fn lookup(&self, parent: u64, name: &str) -> Option<u64> {
        let Kind::Dir { entries } = &self.node(parent)?.kind else {
            return None;
        };
        let at = entries
            .binary_search_by(|(entry, _)| entry.as_str().cmp(name))
            .ok()?;
        Some(entries[at].1)
    }

    pub(crate) fn files(&self) -> usize {
        self.files
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::keys::{plan_key, KeyPlan};

    fn listed(keys: &[&str]) -> Vec<(ObjectEntry, RelPath)> {
        keys.iter()
            .map(|key| {
                let KeyPlan::File(rel) = plan_key("", key, 1) else {
                    panic!("{key} is a plain key");
                };
                let entry = ObjectEntry {
                    key: (*key).into(),
                    size: 1,
                    etag: "\"e\"".into(),
                    last_modified: None,
                    version_id: None,
                    sealed: None,
                };
                (entry, rel)
            })
            .collect()
    }

    fn left_out(collisions: &[Collision]) -> Vec<&str> {
        collisions.iter().map(|c| c.key.as_str()).collect()
    }

    #[test]
    fn nested_names_resolve_and_collisions_are_left_out() {
        let (tree, collisions) = Tree::build(listed(&["b/2", "a", "b/1", "a/x", "b/1/y", "c/d/e"]));
        assert_eq!(left_out(&collisions), ["a/x", "b/1/y"]);
        assert_eq!(collisions[0].why.file, "a");
        assert_eq!(tree.files(), 4);
        let b = tree.lookup(ROOT, "b").unwrap();
        let Kind::Dir { entries } = &tree.node(b).unwrap().kind else {
            panic!("b is a directory");
        };
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["1", "2"]);
        let d = tree.lookup(tree.lookup(ROOT, "c").unwrap(), "d").unwrap();
        let e = tree.lookup(d, "e").unwrap();
        assert!(matches!(&tree.node(e).unwrap().kind, Kind::File(f) if f.key == "c/d/e"));
        assert_eq!(tree.node(e).unwrap().parent, d);
        assert!(tree.lookup(ROOT, "zz").is_none());
        assert!(tree.lookup(e, "x").is_none(), "a file has no entries");
    }

    #[test]
    fn the_lazy_marker_is_in_memory_under_hydrator_beside_the_files() {
        let (mut tree, _) = Tree::build(listed(&["a", "z"]));
        tree.mark_lazy("imagenet", "d1ce");
        let Kind::Dir { entries } = &tree.node(ROOT).unwrap().kind else {
            panic!("the root is a directory");
        };
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [".hydrator", "a", "z"], "sorted for the lookups");
        let state = tree.lookup(ROOT, ".hydrator").unwrap();
        let marker = tree.lookup(state, "LAZY").unwrap();
        assert!(matches!(
            &tree.node(marker).unwrap().kind,
            Kind::Memory(text) if text == b"dataset=imagenet\nsnapshot=d1ce\n"
        ));
        assert_eq!(tree.node(marker).unwrap().parent, state);
        assert!(tree.lookup(state, "READY").is_none());
        assert_eq!(
            (tree.files(), tree.bytes()),
            (2, 2),
            "the dataset's files only"
        );
    }

    #[test]
    fn a_file_and_a_directory_of_one_name_resolve_the_same_whatever_the_order() {
        for keys in [
            ["a", "a/b", "a-c"],
            ["a/b", "a", "a-c"],
            ["a-c", "a/b", "a"],
        ] {
            let (tree, collisions) = Tree::build(listed(&keys));
            assert_eq!(left_out(&collisions), ["a/b"], "{keys:?}");
            let a = tree.lookup(ROOT, "a").unwrap();
            assert!(
                matches!(&tree.node(a).unwrap().kind, Kind::File(f) if f.key == "a"),
                "{keys:?}: the file keeps its name"
            );
            assert_eq!(tree.files(), 2);
        }
    }
}
