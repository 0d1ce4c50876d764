//! Object keys are untrusted input. A key becomes a path under DEST only if every segment is a
//! plain file name; anything that could escape DEST or be ambiguous is refused and reported.
//!
//! Rules (documented in docs/internals.md, "How keys become paths"):
//! - the listing prefix is stripped; the rest is split on `/`;
//! - refused: NUL anywhere, a leading `/`, empty segments (`a//b`), `.` or `..` segments,
//!   segments over 255 bytes, the reserved top-level `.hydrator` directory, and names of
//!   hydrator's own in-flight files (`.NAME.partial`);
//! - a key ending in `/` is a directory marker: an empty one is skipped (directories exist
//!   through their files), one with data is refused, since no file can carry that name;
//! - a key that is a file and the directory of other keys (`a` and `a/b`): the first in key
//!   order keeps the path, which is always the file (`a` sorts before `a/...`); the keys below
//!   it are refused, each naming it ([`Placement`]). Listings come in key order (a listing that
//!   does not is an error), so the rule gives the same files every run, whatever the timing of
//!   the downloads, and decides each key as it is listed: nothing is held back, and what is
//!   remembered is a chain of the current key's own prefixes.

use std::fmt;
use std::path::Path;

/// Name of hydrator's state directory inside DEST.
pub(crate) const STATE_DIR: &str = ".hydrator";
const PARTIAL_SUFFIX: &str = ".partial";
const MAX_NAME_LEN: usize = 255;
/// The file name itself must leave room for `.NAME.partial` within the 255-byte limit.
const MAX_FILE_NAME_LEN: usize = MAX_NAME_LEN - 1 - PARTIAL_SUFFIX.len();

/// A relative path under DEST (segments joined by `/`) whose segments are all plain names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RelPath {
    path: String,
}

impl RelPath {
    /// The directories leading to the file.
    pub(crate) fn parents(&self) -> impl Iterator<Item = &str> {
        let dirs = self.path.rsplit_once('/').map(|(dirs, _)| dirs);
        dirs.into_iter().flat_map(|dirs| dirs.split('/'))
    }

    pub(crate) fn file_name(&self) -> &str {
        self.path
            .rsplit_once('/')
            .map_or(&self.path, |(_, name)| name)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.path
    }

    /// Whether `path` (segments joined by `/`) names this path.
    pub(crate) fn is(&self, path: &str) -> bool {
        self.path == path
    }

    /// Name of the in-flight sibling: `.NAME.partial`.
    pub(crate) fn partial_name(&self) -> String {
        format!(".{}{PARTIAL_SUFFIX}", self.file_name())
    }

    /// Path of the in-flight sibling relative to DEST.
    pub(crate) fn partial_path(&self) -> String {
        match self.path.rsplit_once('/') {
            Some((dirs, _)) => format!("{dirs}/{}", self.partial_name()),
            None => self.partial_name(),
        }
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)
    }
}

impl AsRef<Path> for RelPath {
    fn as_ref(&self) -> &Path {
        Path::new(&self.path)
    }
}

/// What to do with a key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyPlan {
    File(RelPath),
    /// An empty `dir/` marker (or the prefix itself): nothing to write.
    DirectoryMarker,
    /// The key cannot be written safely; the reason says why.
    Refused(String),
}

/// Maps `key` (listed under `prefix`) to a path under DEST. `size` tells markers from data.
pub(crate) fn plan_key(prefix: &str, key: &str, size: u64) -> KeyPlan {
    let Some(relative) = key.strip_prefix(prefix) else {
        return KeyPlan::Refused(format!("key is outside the prefix {prefix:?}"));
    };
    if relative.contains('\0') {
        return KeyPlan::Refused("key contains a NUL byte".into());
    }
    if relative.is_empty() || relative.ends_with('/') {
        return if size == 0 {
            KeyPlan::DirectoryMarker
        } else {
            KeyPlan::Refused(format!(
                "key ends with '/' but holds {size} bytes: no file can have that name"
            ))
        };
    }
    if relative.starts_with('/') {
        return KeyPlan::Refused("key is an absolute path".into());
    }
    let mut segments = relative.split('/').peekable();
    while let Some(segment) = segments.next() {
        let limit = match segments.peek() {
            None => MAX_FILE_NAME_LEN,
            Some(_) => MAX_NAME_LEN,
        };
        let why = match segment {
            "" => Some("key has an empty path segment ('//')".to_string()),
            "." | ".." => Some(format!("key has a {segment:?} path segment")),
            s if s.len() > limit => Some(format!(
                "key has a path segment of {} bytes (the limit is {limit})",
                s.len()
            )),
            s if is_partial_name(s) => Some(format!(
                "name {s:?} is reserved for hydrator's in-flight files"
            )),
            _ => None,
        };
        if let Some(why) = why {
            return KeyPlan::Refused(why);
        }
    }
    if relative.split('/').next() == Some(STATE_DIR) {
        return KeyPlan::Refused(format!("{STATE_DIR}/ is reserved for hydrator's state"));
    }
    KeyPlan::File(RelPath {
        path: relative.to_string(),
    })
}

/// A key refused because a file listed before it holds its path or one of its directories.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "key conflict: {file:?} is a file of this listing, so it cannot also be a directory (the key \
     listed first keeps the path)"
)]
pub(crate) struct KeyConflict {
    /// The path of the file listed first.
    pub file: String,
}

/// The files of one listing, placed in key order so that no path is both a file and a
/// directory. It remembers only the files placed that may still be the directory of a later
/// key: a chain of prefixes of the last path placed.
#[derive(Debug, Default)]
pub(crate) struct Placement {
    files: Vec<String>,
}

impl Placement {
    /// Places `rel`, the next file of a listing in key order; `Err` when a file placed before
    /// is `rel` itself or one of its directories.
    pub(crate) fn place(&mut self, rel: &RelPath) -> Result<(), KeyConflict> {
        let path = rel.as_str();
        // A file stays while later paths may still lie under it: this one starts with it and
        // goes on with a byte that sorts no later than '/'.
        while let Some(file) = self.files.last() {
            let next = path.as_bytes().get(file.len());
            match path.starts_with(file.as_str()) && next.is_none_or(|b| *b <= b'/') {
                true => break,
                false => self.files.pop(),
            };
        }
        let taken = self.files.iter().find(|file| {
            let next = path.as_bytes().get(file.len());
            next.is_none_or(|b| *b == b'/')
        });
        if let Some(file) = taken {
            return Err(KeyConflict { file: file.clone() });
        }
        self.files.push(path.to_string());
        Ok(())
    }
}

/// Whether `name` is that of one of hydrator's in-flight files, `.NAME.partial`.
pub(crate) fn is_partial_name(name: &str) -> bool {
    name.len() > 1 + PARTIAL_SUFFIX.len() && name.starts_with('.') && name.ends_with(PARTIAL_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(prefix: &str, key: &str) -> String {
        match plan_key(prefix, key, 1) {
            KeyPlan::File(p) => p.to_string(),
            other => panic!("{key:?}: {other:?}"),
        }
    }

    fn refused(key: &str) -> bool {
        matches!(plan_key("", key, 1), KeyPlan::Refused(_))
    }

    #[test]
    fn plain_keys_map_below_prefix() {
        assert_eq!(file("data/", "data/a/b.bin"), "a/b.bin");
        assert_eq!(file("", "x y+z%20=é.txt"), "x y+z%20=é.txt");
        assert_eq!(file("", "..a/b..c/.d"), "..a/b..c/.d");
    }

    #[test]
    fn hostile_keys_are_refused() {
        for key in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "a/./b",
            "a\0b",
            ".hydrator/READY",
            "a/.b.partial",
            "a/..",
        ] {
            assert!(refused(key), "{key:?} should be refused");
        }
        assert!(refused(&"n".repeat(256)));
        assert!(refused(&"n".repeat(247)), "no room for .NAME.partial");
        assert!(!refused(&"n".repeat(246)));
        assert!(!refused(&format!("{}/x", "d".repeat(255))));
    }

    #[test]
    fn compares_with_joined_paths() {
        let KeyPlan::File(p) = plan_key("", "a/b c/d", 1) else {
            panic!()
        };
        assert!(p.is("a/b c/d"));
        assert!(!p.is("a/b c"));
        assert!(!p.is("a/b c/d/e"));
        assert!(!p.is("a/b c/x"));
    }

    #[test]
    fn parents_and_file_name() {
        let KeyPlan::File(nested) = plan_key("", "a/b c/d", 1) else {
            panic!()
        };
        assert_eq!(nested.parents().collect::<Vec<_>>(), ["a", "b c"]);
        assert_eq!(nested.file_name(), "d");
        let KeyPlan::File(top) = plan_key("", "d", 1) else {
            panic!()
        };
        assert_eq!(top.parents().count(), 0);
        assert_eq!(top.file_name(), "d");
        assert_eq!(top.partial_name(), ".d.partial");
    }

    fn place_all(keys: &[&str]) -> Vec<Result<(), KeyConflict>> {
        let mut placement = Placement::default();
        keys.iter()
            .map(|key| {
                let KeyPlan::File(rel) = plan_key("", key, 1) else {
                    panic!("{key} is a plain key")
                };
                placement.place(&rel)
            })
            .collect()
    }

    #[test]
    fn a_file_keeps_its_path_and_the_keys_below_it_are_refused_naming_it() {
        let keys = [
            "a", "a b", "a b/c", "a-1", "a.txt", "a/b", "a/c/d", "a0", "ab", "b/x", "b/y",
        ];
        let conflict = |file: &str| {
            Err(KeyConflict {
                file: file.to_string(),
            })
        };
        assert_eq!(
            place_all(&keys),
            [
                Ok(()),
                Ok(()),
                conflict("a b"),
                Ok(()),
                Ok(()),
                conflict("a"),
                conflict("a"),
                Ok(()),
                Ok(()),
                Ok(()),
                Ok(()),
            ]
        );
        assert_eq!(
            place_all(&["d/e", "d/e"])[1],
            conflict("d/e"),
            "a path twice"
        );
        let message = conflict("a").unwrap_err().to_string();
        assert!(message.contains("\"a\" is a file"), "{message}");
    }

    #[test]
    fn what_is_remembered_is_a_chain_of_the_current_keys_prefixes() {
        let mut placement = Placement::default();
        for i in 0..10_000 {
            let KeyPlan::File(rel) = plan_key("", &format!("f-{i:05}"), 1) else {
                panic!()
            };
            placement.place(&rel).unwrap();
        }
        assert_eq!(placement.files.len(), 1);
    }

    #[test]
    fn directory_markers() {
        assert_eq!(plan_key("p/", "p/dir/", 0), KeyPlan::DirectoryMarker);
        assert_eq!(plan_key("p/", "p/", 0), KeyPlan::DirectoryMarker);
        assert!(matches!(plan_key("p/", "p/dir/", 5), KeyPlan::Refused(_)));
    }
}
