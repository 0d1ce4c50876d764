//! `s3://BUCKET/PREFIX/` URLs: parsed once, with the bucket name checked against S3's rules; and
//! a command line's source, which may also be written `ALIAS/BUCKET/PREFIX/` with one of mc's
//! aliases.

use super::mc_alias::{self, McAlias};
use crate::error::UsageError;

/// The two ways a command line may name a source, for messages.
const SOURCE_FORMS: &str =
    "expected s3://BUCKET/PREFIX/, or ALIAS/BUCKET/PREFIX/ with an mc alias (MC_HOST_ALIAS or mc's config file)";

/// `s3://bucket/prefix/`: the prefix, if not empty, always ends with `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct S3Url {
    pub bucket: String,
    pub prefix: String,
}

impl S3Url {
    pub(crate) fn parse(url: &str) -> Result<Self, UsageError> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| {
            UsageError::new(format!(
                "invalid source URL {url:?}: expected s3://BUCKET/PREFIX/"
            ))
        })?;
        Self::from_bucket_and_prefix(rest)
            .map_err(|why| UsageError::new(format!("invalid source URL {url:?}: {why}")))
    }

    /// `BUCKET/PREFIX/`, what follows `s3://` or an alias.
    fn from_bucket_and_prefix(rest: &str) -> Result<Self, BucketAndPrefixError> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(BucketAndPrefixError::NoBucket);
        }
        validate_bucket_name(bucket)?;
        if prefix.contains('\0') {
            return Err(BucketAndPrefixError::NulInPrefix);
        }
        let mut prefix = prefix.to_string();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Self {
            bucket: bucket.to_string(),
            prefix,
        })
    }
}

/// A source as the command line takes it: `s3://BUCKET/PREFIX/`, or `ALIAS/BUCKET/PREFIX/` as
/// `mc mirror` takes it, with the server and keys of mc's alias.
#[derive(Debug)]
pub(crate) struct CliSource {
    pub url: S3Url,
    pub alias: Option<McAlias>,
}

impl CliSource {
    /// Parses `text`; an alias is looked up with `env` (`MC_HOST_<ALIAS>`, mc's config file).
    pub(crate) fn parse(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, UsageError> {
        if text.starts_with("s3://") {
            return Ok(Self {
                url: S3Url::parse(text)?,
                alias: None,
            });
        }
        let bad = |why: &str| UsageError::new(format!("invalid source {text:?}: {why}"));
        let aliased = text
            .split_once('/')
            .filter(|(alias, _)| !text.contains("://") && mc_alias::is_alias_name(alias));
        let Some((name, rest)) = aliased else {
            return Err(bad(SOURCE_FORMS));
        };
        let alias = mc_alias::resolve(name, env)
            .map_err(|err| bad(&err.to_string()))?
            .ok_or_else(|| {
                let file = mc_alias::config_file(env).map_or_else(
                    || "mc's config file".to_string(),
                    |file| file.display().to_string(),
                );
                bad(&format!(
                    "{name:?} is no mc alias (MC_HOST_{name} is not set and {file} defines no alias {name:?}): {SOURCE_FORMS}"
                ))
            })?;
        let url = S3Url::from_bucket_and_prefix(rest).map_err(|why| bad(&why.to_string()))?;
        Ok(Self {
            url,
            alias: Some(alias),
        })
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// Why `BUCKET/PREFIX/` cannot name a source.
#[derive(Debug, thiserror::Error)]
enum BucketAndPrefixError {
    #[error("the bucket name is missing")]
    NoBucket,
    #[error(transparent)]
    Bucket(#[from] BucketNameError),
    #[error("the prefix contains a NUL byte")]
    NulInPrefix,
}

/// Why a bucket name breaks S3's naming rules.
#[derive(Debug, thiserror::Error)]
enum BucketNameError {
    #[error("bucket name {0:?} must be 3 to 63 characters long")]
    Length(String),
    #[error("bucket name {0:?} may only hold letters, digits, '.', '-' and '_'")]
    Characters(String),
    #[error("bucket name {0:?} must start and end with a letter or digit")]
    Edges(String),
}

/// S3 bucket naming rules (3–63 characters of lowercase letters, digits, `.` and `-`,
/// starting and ending with a letter or digit). Underscores and capitals are accepted too,
/// as some on-premise servers allow legacy names.
fn validate_bucket_name(name: &str) -> Result<(), BucketNameError> {
    if !(3..=63).contains(&name.len()) {
        return Err(BucketNameError::Length(name.into()));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if !name.chars().all(ok_char) {
        return Err(BucketNameError::Characters(name.into()));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(name.chars().next()) || !edge_ok(name.chars().last()) {
        return Err(BucketNameError::Edges(name.into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = S3Url::parse("s3://my-bucket/data/train").unwrap();
        assert_eq!(u.bucket, "my-bucket");
        assert_eq!(u.prefix, "data/train/");
        assert_eq!(S3Url::parse("s3://my-bucket").unwrap().prefix, "");
        assert_eq!(S3Url::parse("s3://my-bucket/").unwrap().prefix, "");
        for bad in [
            "my-bucket/x",
            "s3://",
            "s3:///x",
            "s3://ab/x",
            "s3://Bad Bucket/",
            "http://b/x",
        ] {
            assert!(S3Url::parse(bad).is_err(), "{bad}");
        }
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn a_source_is_an_s3_url_or_an_mc_alias_path() {
        let env = env_of(&[
            ("MC_HOST_depot", "http://KEY:SECRET@minio:9000"),
            ("MC_CONFIG_DIR", "/nonexistent"),
        ]);
        let plain = CliSource::parse("s3://jeux-data/vision-2026/", &env).unwrap();
        assert_eq!(plain.url.to_string(), "s3://jeux-data/vision-2026/");
        assert!(plain.alias.is_none());

        let aliased = CliSource::parse("depot/jeux-data/vision-2026", &env).unwrap();
        assert_eq!(aliased.url.to_string(), "s3://jeux-data/vision-2026/");
        let alias = aliased.alias.unwrap();
        assert_eq!(alias.endpoint, "http://minio:9000");
        assert_eq!(alias.credentials.unwrap().secret_key, "SECRET");
        let bucket_only = CliSource::parse("depot/jeux-data", &env).unwrap();
        assert_eq!(bucket_only.url.prefix, "");
    }

    #[test]
    fn a_source_of_neither_form_names_both() {
        let env = env_of(&[
            ("MC_HOST_depot", "http://KEY:SECRET@minio:9000"),
            ("MC_CONFIG_DIR", "/etc/mc"),
        ]);
        for (text, says) in [
            ("/data/imagenet", "expected s3://BUCKET/PREFIX/, or ALIAS/BUCKET/PREFIX/"),
            ("http://minio:9000/b/p", "expected s3://BUCKET/PREFIX/, or ALIAS/BUCKET/PREFIX/"),
            ("jeux-data", "expected s3://BUCKET/PREFIX/, or ALIAS/BUCKET/PREFIX/"),
            (
                "minio/jeux-data/x/",
                "\"minio\" is no mc alias (MC_HOST_minio is not set and /etc/mc/config.json defines no alias \"minio\"): expected s3://BUCKET/PREFIX/, or ALIAS/BUCKET/PREFIX/",
            ),
            ("depot//x", "the bucket name is missing"),
            ("depot/ab/x", "3 to 63 characters"),
        ] {
            let err = CliSource::parse(text, &env).unwrap_err().to_string();
            assert!(err.starts_with(&format!("invalid source {text:?}: ")), "{err}");
            assert!(err.contains(says), "{text}: {err}");
            assert!(!err.contains("SECRET"), "{err}");
        }
        let broken = env_of(&[("MC_HOST_depot", "minio:9000")]);
        let err = CliSource::parse("depot/b1/p", &broken)
            .unwrap_err()
            .to_string();
        assert!(err.contains("MC_HOST_depot is not of the form"), "{err}");
    }
}
