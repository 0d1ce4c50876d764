//! mc's aliases: a source written `ALIAS/BUCKET/PREFIX/`, as `mc mirror` takes it, finds its
//! server and keys where mc keeps them, so an init container that ran `mc alias set` and
//! `mc mirror` runs one `hydrator sync` with the same secret.
//!
//! Looked up as mc looks them up: `MC_HOST_<ALIAS>` first (`https://ACCESS:SECRET@HOST:PORT`,
//! or `https://ACCESS:SECRET:TOKEN@HOST` with a session token; keys taken as written, not
//! percent-decoded, as mc takes them), then the `aliases` of mc's config file (version 10:
//! `$MC_CONFIG_DIR/config.json`, by default `~/.mc/config.json`). The keys are secrets: no error
//! here quotes a value read from either place, and [`McAlias`]'s `Debug` leaves them out.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::client::StaticCredentials;

/// The environment variable prefix mc reads an alias from.
pub(crate) const ENV_PREFIX: &str = "MC_HOST_";
/// The environment variable naming mc's configuration directory.
pub(crate) const CONFIG_DIR_ENV: &str = "MC_CONFIG_DIR";

/// Where an alias was found, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `MC_HOST_<ALIAS>`.
    Environment(String),
    /// mc's config file.
    ConfigFile(PathBuf),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Environment(variable) => write!(f, "{variable}"),
            Origin::ConfigFile(file) => write!(f, "{}", file.display()),
        }
    }
}

/// What an alias says about its server.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct McAlias {
    /// `http(s)://HOST[:PORT]`, without keys.
    pub endpoint: String,
    /// `None`: the alias holds no keys, so its requests go unsigned (as mc sends them).
    pub credentials: Option<StaticCredentials>,
    /// mc's `path`: `on` (path-style), `off` (virtual-hosted), `auto` (`None`).
    pub path_style: Option<bool>,
    pub origin: Origin,
}

/// The keys never reach a log or a panic message.
impl std::fmt::Debug for McAlias {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McAlias")
            .field("endpoint", &self.endpoint)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<redacted>"),
            )
            .field("path_style", &self.path_style)
            .field("origin", &self.origin)
            .finish()
    }
}

/// Why an alias that is there cannot be used. No variant holds a value read from the
/// environment or the file: they may hold keys.
#[derive(Debug, thiserror::Error)]
pub(crate) enum McAliasError {
    #[error("{variable} is not of the form http(s)://ACCESS:SECRET@HOST:PORT (or http(s)://ACCESS:SECRET:TOKEN@HOST:PORT): {why}")]
    Environment { variable: String, why: &'static str },
    #[error("mc's config file {}: {why}", file.display())]
    File { file: PathBuf, why: String },
    #[error("alias {alias:?} in mc's config file {}: {why}", file.display())]
    Entry {
        alias: String,
        file: PathBuf,
        why: &'static str,
    },
}

/// mc's `config.json`, version 10.
#[derive(Deserialize)]
struct ConfigFile {
    version: String,
    #[serde(default)]
    aliases: BTreeMap<String, ConfigEntry>,
}

#[derive(Deserialize)]
struct ConfigEntry {
    url: String,
    #[serde(default, rename = "accessKey")]
    access_key: String,
    #[serde(default, rename = "secretKey")]
    secret_key: String,
    #[serde(default, rename = "sessionToken")]
    session_token: String,
    #[serde(default)]
    api: String,
    #[serde(default)]
    path: String,
}

/// Whether `name` can be an mc alias (mc's rule: a letter, then letters, digits, `-` or `_`).
pub(crate) fn is_alias_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// mc's config file: `$MC_CONFIG_DIR/config.json`, else `$HOME/.mc/config.json`.
pub(crate) fn config_file(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let dir = match env(CONFIG_DIR_ENV).filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env("HOME").filter(|h| !h.is_empty())?).join(".mc"),
    };
    Some(dir.join("config.json"))
}

/// The alias `name`, from `MC_HOST_<name>` or else mc's config file; `Ok(None)` when neither
/// defines it (or there is no config file).
pub(crate) fn resolve(
    name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<McAlias>, McAliasError> {
    let variable = format!("{ENV_PREFIX}{name}");
    if let Some(value) = env(&variable) {
        return from_env_value(&value, variable).map(Some);
    }
    let Some(file) = config_file(env) else {
        return Ok(None);
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(McAliasError::File {
                file,
                why: err.to_string(),
            })
        }
    };
    from_config_text(&text, name, file)
}

/// An alias from `MC_HOST_<ALIAS>`'s value, split as mc splits it: the keys end at the last `@`,
/// the access key at the first `:`, and a second `:` starts a session token.
fn from_env_value(value: &str, variable: String) -> Result<McAlias, McAliasError> {
    let bad = |why| McAliasError::Environment {
        variable: variable.clone(),
        why,
    };
    let (scheme, rest) = value
        .split_once("://")
        .filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
        .ok_or_else(|| bad("it must start with http:// or https://"))?;
    let (keys, host) = match rest.rsplit_once('@') {
        Some((keys, host)) => (Some(keys), host),
        None => (None, rest),
    };
    let credentials = match keys {
        None => None,
        Some(keys) => {
            let (access_key, secret) = keys
                .split_once(':')
                .ok_or_else(|| bad("the keys before '@' must be ACCESS:SECRET"))?;
            let (secret_key, session_token) = match secret.split_once(':') {
                Some((secret, token)) => (secret, Some(token.to_string())),
                None => (secret, None),
            };
            keys_to_credentials(access_key, secret_key, session_token)
        }
    };
    let endpoint = endpoint(scheme, host).map_err(bad)?;
    Ok(McAlias {
        endpoint,
        credentials,
        path_style: None,
        origin: Origin::Environment(variable),
    })
}

/// The alias `name` in the text of mc's config file.
fn from_config_text(
    text: &str,
    name: &str,
    file: PathBuf,
) -> Result<Option<McAlias>, McAliasError> {
    let parsed: ConfigFile = serde_json::from_str(text).map_err(|err| McAliasError::File {
        file: file.clone(),
        // serde's message may quote a value (a key): only where and what kind of fault.
        why: format!(
            "not mc's JSON ({:?} error at line {}, column {})",
            err.classify(),
            err.line(),
            err.column()
        ),
    })?;
    if parsed.version != "10" {
        return Err(McAliasError::File {
            file,
            why: format!(
                "version {:?}; hydrator reads version \"10\" (run any mc command to upgrade it)",
                parsed.version
            ),
        });
    }
    let Some(entry) = parsed.aliases.get(name) else {
        return Ok(None);
    };
    let bad = |why| McAliasError::Entry {
        alias: name.to_string(),
        file: file.clone(),
        why,
    };
    let (scheme, host) = entry
        .url
        .split_once("://")
        .filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
        .ok_or_else(|| bad("its url must start with http:// or https://"))?;
    if host.contains('@') {
        return Err(bad(
            "its url must not hold keys (accessKey and secretKey do)",
        ));
    }
    if entry.api.eq_ignore_ascii_case("s3v2") {
        tracing::warn!(
            "alias {name:?} in {} asks for S3v2 signatures: hydrator signs with S3v4",
            file.display()
        );
    }
    let path_style = match entry.path.to_ascii_lowercase().as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    };
    let session_token = Some(entry.session_token.clone()).filter(|t| !t.is_empty());
    Ok(Some(McAlias {
        endpoint: endpoint(scheme, host).map_err(bad)?,
        credentials: keys_to_credentials(&entry.access_key, &entry.secret_key, session_token),
        path_style,
        origin: Origin::ConfigFile(file),
    }))
}

/// Keys as mc reads them: none at all means unsigned requests.
fn keys_to_credentials(
    access_key: &str,
    secret_key: &str,
    session_token: Option<String>,
) -> Option<StaticCredentials> {
    (!access_key.is_empty() || !secret_key.is_empty()).then(|| StaticCredentials {
        access_key: access_key.to_string(),
        secret_key: secret_key.to_string(),
        session_token,
    })
}

/// `scheme://host[:port]`, from the part after `://`: a host, at most a `/` after it.
fn endpoint(scheme: &str, host: &str) -> Result<String, &'static str> {
    let host = host.strip_suffix('/').unwrap_or(host);
    if host.is_empty() {
        return Err("the host is missing");
    }
    if host.contains(['/', '?', '#']) || host.chars().any(char::is_whitespace) {
        return Err("only a host and port may follow the keys (no path, query or spaces)");
    }
    Ok(format!("{scheme}://{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_env(value: &str) -> Result<McAlias, McAliasError> {
        from_env_value(value, "MC_HOST_depot".into())
    }

    fn keys(alias: &McAlias) -> (&str, &str, Option<&str>) {
        let c = alias.credentials.as_ref().expect("keys");
        (&c.access_key, &c.secret_key, c.session_token.as_deref())
    }

    #[test]
    fn reads_mc_host_as_mc_does() {
        let alias = from_env("https://ACCESS:SECRET@minio.example:9000").unwrap();
        assert_eq!(alias.endpoint, "https://minio.example:9000");
        assert_eq!(keys(&alias), ("ACCESS", "SECRET", None));
        assert_eq!(alias.path_style, None);
        assert_eq!(alias.origin, Origin::Environment("MC_HOST_depot".into()));

        let token = from_env("http://AK:SK:TOKEN@minio:9000/").unwrap();
        assert_eq!(token.endpoint, "http://minio:9000");
        assert_eq!(keys(&token), ("AK", "SK", Some("TOKEN")));

        // Keys as written: a '@' or a '/' in the secret, nothing percent-decoded.
        let odd = from_env("http://AK:se/cr@t%2F@10.0.0.1:9000").unwrap();
        assert_eq!(keys(&odd), ("AK", "se/cr@t%2F", None));
        assert_eq!(odd.endpoint, "http://10.0.0.1:9000");

        // No keys: unsigned, as mc sends them.
        let public = from_env("https://play.example").unwrap();
        assert!(public.credentials.is_none());
    }

    #[test]
    fn a_bad_mc_host_names_the_variable_and_never_its_value() {
        for (value, why) in [
            ("minio:9000", "http:// or https://"),
            ("ftp://AK:SK@minio", "http:// or https://"),
            ("http://AKSK@minio:9000", "ACCESS:SECRET"),
            ("http://AK:SK@", "the host is missing"),
            ("http://AK:SK@minio:9000/bucket", "no path"),
        ] {
            let err = from_env(value).unwrap_err().to_string();
            assert!(err.starts_with("MC_HOST_depot is not of the form"), "{err}");
            assert!(err.contains(why), "{value}: {err}");
            assert!(!err.contains("SK") && !err.contains("AKSK"), "{err}");
        }
    }

    const CONFIG: &str = r#"{
        "version": "10",
        "aliases": {
            "depot": {"url": "http://minio:9000", "accessKey": "KEY", "secretKey": "SECRET",
                      "api": "s3v4", "path": "auto"},
            "vhost": {"url": "https://s3.example.com/", "accessKey": "K", "secretKey": "S",
                      "sessionToken": "T", "api": "S3v4", "path": "off"},
            "pathy": {"url": "http://garage:3900", "accessKey": "K", "secretKey": "S",
                      "api": "S3v4", "path": "on"},
            "anon": {"url": "https://play.example", "accessKey": "", "secretKey": "",
                     "api": "S3v4", "path": "auto"}
        }
    }"#;

    fn from_config(name: &str) -> Result<Option<McAlias>, McAliasError> {
        from_config_text(CONFIG, name, "/home/u/.mc/config.json".into())
    }

    #[test]
    fn reads_mc_config_version_10() {
        let depot = from_config("depot").unwrap().unwrap();
        assert_eq!(depot.endpoint, "http://minio:9000");
        assert_eq!(keys(&depot), ("KEY", "SECRET", None));
        assert_eq!(depot.path_style, None);
        assert_eq!(
            depot.origin,
            Origin::ConfigFile("/home/u/.mc/config.json".into())
        );
        let vhost = from_config("vhost").unwrap().unwrap();
        assert_eq!(vhost.endpoint, "https://s3.example.com");
        assert_eq!(keys(&vhost), ("K", "S", Some("T")));
        assert_eq!(vhost.path_style, Some(false));
        assert_eq!(
            from_config("pathy").unwrap().unwrap().path_style,
            Some(true)
        );
        assert!(from_config("anon").unwrap().unwrap().credentials.is_none());
        assert!(from_config("nope").unwrap().is_none());
    }

    #[test]
    fn a_bad_config_file_says_where_and_never_quotes_a_key() {
        let file = PathBuf::from("/c/config.json");
        let old = from_config_text(r#"{"version":"9","hosts":{}}"#, "depot", file.clone());
        assert!(old.unwrap_err().to_string().contains("version \"9\""));
        // A key where an object belongs: serde would quote it.
        let broken = r#"{"version":"10","aliases":{"depot":"TOPSECRET"}}"#;
        let err = from_config_text(broken, "depot", file.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1, column"), "{err}");
        assert!(!err.contains("TOPSECRET"), "{err}");
        let keyed = r#"{"version":"10","aliases":{"d":{"url":"http://K:S@h:9000"}}}"#;
        let err = from_config_text(keyed, "d", file).unwrap_err().to_string();
        assert!(
            err.contains("must not hold keys") && !err.contains("K:S"),
            "{err}"
        );
    }

    #[test]
    fn the_environment_comes_before_the_file_and_the_file_is_found_as_mc_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".mc")).unwrap();
        std::fs::write(dir.path().join(".mc/config.json"), CONFIG).unwrap();
        let home = dir.path().to_str().unwrap().to_string();
        let env = |vars: &'static [(&'static str, &'static str)]| {
            let home = home.clone();
            move |name: &str| match name {
                "HOME" => Some(home.clone()),
                _ => vars
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string()),
            }
        };
        let from_file = resolve("depot", &env(&[])).unwrap().unwrap();
        assert_eq!(from_file.endpoint, "http://minio:9000");
        let from_env = resolve("depot", &env(&[("MC_HOST_depot", "http://A:B@other:9000")]))
            .unwrap()
            .unwrap();
        assert_eq!(from_env.endpoint, "http://other:9000");
        assert!(resolve("nope", &env(&[])).unwrap().is_none());
        // MC_CONFIG_DIR moves the file: none there.
        let elsewhere = resolve("depot", &env(&[("MC_CONFIG_DIR", "/nonexistent")])).unwrap();
        assert!(elsewhere.is_none());
        assert_eq!(
            config_file(&env(&[("MC_CONFIG_DIR", "/etc/mc")])),
            Some(PathBuf::from("/etc/mc/config.json"))
        );
    }

    #[test]
    fn alias_names_follow_mc() {
        for good in ["depot", "my-minio", "s3", "A_1"] {
            assert!(is_alias_name(good), "{good}");
        }
        for bad in ["d", "1abc", "", "a.b", "a b", "."] {
            assert!(!is_alias_name(bad), "{bad}");
        }
    }

    #[test]
    fn debug_hides_the_keys() {
        let alias = from_env("http://ACCESSKEY:SECRETKEY:TOKEN@minio:9000").unwrap();
        let debug = format!("{alias:?}");
        for secret in ["SECRETKEY", "TOKEN"] {
            assert!(!debug.contains(secret), "{debug}");
        }
    }
}
