//! The lean path's connections: TCP, or TLS over it (`handshake`, then `records`) with the
//! configuration the SDK's client trusts (`source::tls`), kept open between GETs. A connection
//! goes back to the pool only after its response was read to the end with nothing left over, so
//! a pooled one is always at a request boundary; one that has since been closed, or has bytes
//! nobody asked for, is dropped when taken. One the server closes just as a request goes out
//! fails before an answer; `LeanGets::ask` then asks again on a new connection (a GET is safe
//! to repeat).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::either::Either;

use super::handshake::handshake;
use super::records::TlsRecords;
use crate::source::client::CONNECT_TIMEOUT;

/// A connection idle this long is closed rather than reused: most servers close theirs sooner
/// or later, and a request on one they closed costs a round trip before it is sent again.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a connection goes: the host and port, over TLS or not.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Origin {
    pub tls: bool,
    /// As in the URL (an IPv6 address in brackets).
    pub host: String,
    pub port: u16,
}

impl Origin {
    /// The origin of an `http` or `https` URL.
    pub(super) fn of(uri: &hyper::Uri) -> Option<Self> {
        let tls = match uri.scheme_str()? {
            "http" => false,
            "https" => true,
            _ => return None,
        };
        let default_port = if tls { 443 } else { 80 };
        Some(Self {
            tls,
            host: uri.host()?.to_string(),
            port: uri.port_u16().unwrap_or(default_port),
        })
    }

    /// The `Host` header, as hyper sends it and SigV4 signs it: the port only when it is not
    /// the scheme's default.
    pub(super) fn host_header(&self) -> String {
        match (self.tls, self.port) {
            (false, 80) | (true, 443) => self.host.clone(),
            (_, port) => format!("{}:{port}", self.host),
        }
    }

    /// The host without an IPv6 address's brackets: what DNS and TLS take.
    fn bare_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// One connection, plain or TLS.
pub(super) type Stream = Either<TcpStream, Box<TlsRecords>>;

/// Nothing to read and not closed, without waiting: a connection at a request boundary.
fn is_quiet(stream: &mut Stream) -> bool {
    let mut byte = [0u8; 1];
    let mut read = ReadBuf::new(&mut byte);
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(stream).poll_read(&mut cx, &mut read).is_pending()
}

/// Open connections and the idle ones kept for reuse.
pub(super) struct Connections {
    /// With the traffic keys extractable, for `records`.
    tls: Arc<rustls::ClientConfig>,
    idle: Mutex<HashMap<Origin, Vec<(Stream, Instant)>>>,
    /// Idle connections kept per origin (as many as requests may be in flight).
    max_idle: usize,
}

impl Connections {
    pub(super) fn new(mut tls: rustls::ClientConfig, max_idle: usize) -> Arc<Self> {
        tls.enable_secret_extraction = true;
        Arc::new(Self {
            tls: Arc::new(tls),
            idle: Mutex::default(),
            max_idle,
        })
    }

    /// The connection to `origin` idle for the shortest time, if one is idle and quiet: one the
    /// server closed, or sent to unasked, is dropped.
    pub(super) fn idle(&self, origin: &Origin) -> Option<Stream> {
        let mut idle = self.idle.lock().expect("pool lock");
        let streams = idle.get_mut(origin)?;
        while let Some((mut stream, since)) = streams.pop() {
            if since.elapsed() >= IDLE_TIMEOUT {
                streams.clear(); // the others have been idle longer still
                return None;
            }
            if is_quiet(&mut stream) {
                return Some(stream);
            }
            tracing::debug!("a kept connection was closed or spoke unasked: dropped");
        }
        None
    }

    /// A new connection to `origin`, with the TLS handshake done where it is `https`.
    pub(super) async fn connect(&self, origin: &Origin) -> io::Result<Stream> {
        let address = (origin.bare_host(), origin.port);
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        tcp.set_nodelay(true)?;
        if !origin.tls {
            return Ok(Either::Left(tcp));
        }
        let name = ServerName::try_from(origin.bare_host().to_string())
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, handshake(self.tls.clone(), name, tcp))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        Ok(Either::Right(Box::new(tls)))
    }

    /// Keeps `stream`, at a request boundary, for the next GET to `origin`.
    pub(super) fn put_back(&self, origin: Origin, stream: Stream) {
        let mut idle = self.idle.lock().expect("pool lock");
        let streams = idle.entry(origin).or_default();
        if streams.len() < self.max_idle {
            streams.push((stream, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_names_the_port_unless_it_is_the_default() {
        let origin = |url: &str| Origin::of(&url.parse().unwrap()).unwrap();
        assert_eq!(origin("http://h:9000/b/k").host_header(), "h:9000");
        assert_eq!(origin("http://h/b/k").host_header(), "h");
        assert_eq!(origin("http://h:80/b/k").host_header(), "h");
        assert_eq!(origin("https://h:443/b/k").host_header(), "h");
        assert_eq!(origin("https://h:80/b/k").host_header(), "h:80");
        let v6 = origin("https://[::1]:9443/b");
        assert_eq!(
            (v6.host_header().as_str(), v6.bare_host()),
            ("[::1]:9443", "::1")
        );
        assert!(Origin::of(&"ftp://h/b".parse().unwrap()).is_none());
    }
}
