//! `s3://BUCKET/PREFIX/` URLs: parsed once, with the bucket name checked against S3's rules.

use crate::error::UsageError;

/// `s3://bucket/prefix/`: the prefix, if not empty, always ends with `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct S3Url {
    pub bucket: String,
    pub prefix: String,
}

impl S3Url {
    pub(crate) fn parse(url: &str) -> Result<Self, UsageError> {
        let bad = |why: &dyn std::fmt::Display| {
            UsageError::new(format!("invalid source URL {url:?}: {why}"))
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad(&"expected s3://BUCKET/PREFIX/"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad(&"the bucket name is missing"));
        }
        validate_bucket_name(bucket).map_err(|why| bad(&why))?;
        if prefix.contains('\0') {
            return Err(bad(&"the prefix contains a NUL byte"));
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

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
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
}
