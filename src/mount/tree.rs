//! The names a lazy view shows: a directory tree built once from the listing, before any data.
//! It never changes while mounted, so the kernel may cache every entry and attribute.
//!
//! Inode numbers are positions in one table (the root is 1). A directory's entries are kept
//! sorted by name: a lookup is a binary search and `readdir` resumes at an index, so a directory
//! of 100,000 files lists in one pass.

use std::collections::HashMap;
use std::time::SystemTime;

use crate::plan::filter::KeyFilter;
use crate::plan::keys::{plan_key, KeyPlan, RelPath};
use crate::source::list::ObjectEntry;

/// The root's inode number, as the kernel knows it.
pub(crate) const ROOT: u64 = fuser::INodeNo::ROOT.0;

pub(crate) enum Kind {
    Dir { entries: Vec<(String, u64)> },
    File(FileNode),
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

impl Tree {
    /// The view of a listing under `prefix`: the files `sync` would write, by the same path
    /// rules and `filter` (a hostile key is not in it), and their keys in listing order (what
    /// the engine will fetch). A path that collides with another is logged and left out.
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
        let keys = files.iter().map(|(entry, _)| entry.key.clone()).collect();
        let (tree, collisions) = Self::build(files);
        for key in collisions {
            tracing::warn!(key = %key, "not in the view: its path collides with another file or directory");
        }
        (tree, keys)
    }

    /// The tree of `files` (listed objects and the paths `sync` gives them). A path that
    /// collides with another (a file where a directory is, or the reverse) is left out of the
    /// view and returned; the engine fails it when it writes.
    pub(crate) fn build(
        files: impl IntoIterator<Item = (ObjectEntry, RelPath)>,
    ) -> (Self, Vec<String>) {
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
        'files: for (entry, rel) in files {
            let mut parent = ROOT;
            for segment in rel.parents() {
                let ino = match index.get(&(parent, segment.to_owned())) {
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
                if !matches!(tree.node(ino).map(|n| &n.kind), Some(Kind::Dir { .. })) {
                    collisions.push(entry.key);
                    continue 'files;
                }
                parent = ino;
            }
            let name = rel.file_name().to_owned();
            if index.contains_key(&(parent, name.clone())) {
                collisions.push(entry.key);
                continue;
            }
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

    #[test]
    fn nested_names_resolve_and_collisions_are_left_out() {
        let (tree, collisions) = Tree::build(listed(&["b/2", "a", "b/1", "a/x", "b/1/y", "c/d/e"]));
        assert_eq!(collisions, ["a/x", "b/1/y"]);
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
}
