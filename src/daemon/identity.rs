//! Who is asking. A caller on the unix socket is the peer's uid, read from the connection
//! (`SO_PEERCRED`), which a pod cannot forge; a caller over TCP is the name of the bearer
//! token it sent. A lease belongs to the identity that took it: only that identity, or one the
//! catalog names as an admin, can renew or release it. A token may also be limited to some
//! datasets (one token per namespace).

use std::collections::BTreeSet;
use std::sync::Arc;

/// The identity of a request, attached to it by the listener (socket) or the token check (TCP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    /// `uid:<n>` or `token:<name>`.
    pub identity: String,
    /// The datasets it may use; `None`: all of the catalog.
    pub datasets: Option<Arc<BTreeSet<String>>>,
}

impl Caller {
    pub(crate) fn uid(uid: u32) -> Self {
        Self {
            identity: format!("uid:{uid}"),
            datasets: None,
        }
    }

    /// A socket peer whose credentials could not be read: it may use no dataset.
    pub(crate) fn unknown_peer() -> Self {
        Self {
            identity: "uid:unknown".into(),
            datasets: Some(Arc::default()),
        }
    }

    pub(crate) fn token(token: &Token) -> Self {
        Self {
            identity: format!("token:{}", token.name),
            datasets: token.datasets.clone(),
        }
    }

    pub(crate) fn may_use(&self, dataset: &str) -> bool {
        self.datasets.as_ref().is_none_or(|d| d.contains(dataset))
    }
}

/// A bearer token the TCP listener accepts.
#[derive(Clone, PartialEq)]
pub(crate) struct Token {
    pub name: String,
    pub secret: String,
    pub datasets: Option<Arc<BTreeSet<String>>>,
}

/// The secret never reaches a log or a panic message.
impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .field("datasets", &self.datasets)
            .finish()
    }
}

/// The token whose secret is `given`. Every token is compared, by BLAKE3 digests whose
/// equality is constant-time, so the time taken tells neither how much of a secret matched nor
/// how long it is.
pub(crate) fn find_token<'a>(tokens: &'a [Token], given: &str) -> Option<&'a Token> {
    let given = blake3::hash(given.as_bytes());
    tokens.iter().fold(None, |found, token| {
        match blake3::hash(token.secret.as_bytes()) == given {
            true => Some(token),
            false => found,
        }
    })
}

/// How a connection names its caller.
pub(crate) trait Peer {
    /// The caller on this connection, when the transport tells (the socket does; TCP callers
    /// are named by their token).
    fn caller(&self) -> Option<Caller>;

    /// Whom the connection counts against for the connection caps: a socket peer's uid
    /// (`uid:N`, root as any other), a TCP peer's address.
    fn counted_as(&self) -> String;

    /// Whether it came over loopback TCP: the CSI plugin's door in the manifests (the plugin
    /// runs in the daemon's pod, and no other pod reaches that pod's loopback).
    fn is_loopback(&self) -> bool;
}

impl Peer for tokio::net::UnixStream {
    fn caller(&self) -> Option<Caller> {
        Some(match self.peer_cred() {
            Ok(credentials) => Caller::uid(credentials.uid()),
            Err(err) => {
                tracing::warn!("cannot read a socket peer's credentials: {err}");
                Caller::unknown_peer()
            }
        })
    }

    fn counted_as(&self) -> String {
        match self.peer_cred() {
            Ok(credentials) => Caller::uid(credentials.uid()).identity,
            Err(_) => Caller::unknown_peer().identity,
        }
    }

    fn is_loopback(&self) -> bool {
        false
    }
}

impl Peer for tokio::net::TcpStream {
    fn caller(&self) -> Option<Caller> {
        None
    }

    fn counted_as(&self) -> String {
        match self.peer_addr() {
            Ok(addr) => addr.ip().to_canonical().to_string(),
            Err(_) => "unknown".into(),
        }
    }

    fn is_loopback(&self) -> bool {
        // 127.0.0.1 and ::1 only (also as ::ffff:127.0.0.1 on a dual-stack listener): the
        // rest of 127.0.0.0/8 is counted like any address.
        self.peer_addr().is_ok_and(|addr| {
            let ip = addr.ip().to_canonical();
            ip == std::net::Ipv4Addr::LOCALHOST || ip == std::net::Ipv6Addr::LOCALHOST
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, secret: &str) -> Token {
        Token {
            name: name.into(),
            secret: secret.into(),
            datasets: None,
        }
    }

    #[test]
    fn tokens_compare_whole() {
        let tokens = [token("a", "secret-token"), token("b", "other-secret")];
        assert_eq!(find_token(&tokens, "secret-token").unwrap().name, "a");
        assert_eq!(find_token(&tokens, "other-secret").unwrap().name, "b");
        assert!(find_token(&tokens, "secret-toke").is_none());
        assert!(find_token(&tokens, "secret-tokem").is_none());
        assert!(find_token(&tokens, "").is_none());
    }

    #[test]
    fn a_scoped_token_uses_only_its_datasets() {
        let scoped = Token {
            datasets: Some(Arc::new(["coco".to_string()].into())),
            ..token("team-a", "s")
        };
        let caller = Caller::token(&scoped);
        assert_eq!(caller.identity, "token:team-a");
        assert!(caller.may_use("coco"));
        assert!(!caller.may_use("imagenet"));
        assert!(Caller::uid(1000).may_use("imagenet"));
        assert!(!Caller::unknown_peer().may_use("imagenet"));
    }

    #[tokio::test]
    async fn a_socket_peer_is_its_uid() {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(a.caller(), Some(Caller::uid(uid)));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(tcp.local_addr().unwrap())
            .await
            .unwrap();
        assert_eq!(stream.caller(), None);
    }

    #[tokio::test]
    async fn root_on_the_socket_is_counted_as_its_uid_and_only_loopback_tcp_is_the_plugins_door() {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(a.counted_as(), format!("uid:{uid}"), "root too");
        assert!(!a.is_loopback());
        for (listen, from, loopback) in [
            ("127.0.0.1:0", "127.0.0.1:0", true),
            ("127.0.0.1:0", "127.0.0.2:0", false),
        ] {
            let tcp = tokio::net::TcpListener::bind(listen).await.unwrap();
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(from.parse().unwrap()).unwrap();
            let _client = socket.connect(tcp.local_addr().unwrap()).await.unwrap();
            let (accepted, peer) = tcp.accept().await.unwrap();
            assert_eq!(accepted.is_loopback(), loopback, "{from}");
            assert_eq!(accepted.counted_as(), peer.ip().to_string());
        }
    }
}
