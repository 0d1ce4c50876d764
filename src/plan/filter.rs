//! `--include` / `--exclude` globs, matched against the path relative to the prefix, and the
//! `--shard`. A path is taken when it matches some include (or there are none) and no exclude,
//! and is in the shard (if one is given).

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::shard::Shard;
use crate::error::UsageError;

pub(crate) struct KeyFilter {
    include: Option<GlobSet>,
    exclude: GlobSet,
    shard: Option<Shard>,
}

impl KeyFilter {
    pub(crate) fn new(include: &[String], exclude: &[String]) -> Result<Self, UsageError> {
        let include = if include.is_empty() {
            None
        } else {
            Some(build(include, "--include")?)
        };
        Ok(Self {
            include,
            exclude: build(exclude, "--exclude")?,
            shard: None,
        })
    }

    /// Takes only the paths in `shard`, too.
    pub(crate) fn in_shard(self, shard: Option<Shard>) -> Self {
        Self { shard, ..self }
    }

    pub(crate) fn accepts(&self, relative: &str) -> bool {
        self.include
            .as_ref()
            .is_none_or(|set| set.is_match(relative))
            && !self.exclude.is_match(relative)
            && self.shard.is_none_or(|shard| shard.holds(relative))
    }
}

fn build(patterns: &[String], flag: &str) -> Result<GlobSet, UsageError> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let glob = Glob::new(pattern)
            .map_err(|err| UsageError::new(format!("{flag} {pattern:?}: {err}")))?;
        builder.add(glob);
    }
    builder
        .build()
        .map_err(|err| UsageError::new(format!("{flag}: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_then_exclude() {
        let f = KeyFilter::new(&["**/*.bin".into()], &["tmp/**".into()]).unwrap();
        assert!(f.accepts("a/b.bin"));
        assert!(f.accepts("b.bin"));
        assert!(!f.accepts("tmp/b.bin"));
        assert!(!f.accepts("a/b.txt"));
        let all = KeyFilter::new(&[], &[]).unwrap();
        assert!(all.accepts("anything"));
        assert!(KeyFilter::new(&["a[".into()], &[]).is_err());
    }
}
