//! One GET on one of the lean path's connections, in HTTP/1.1: the request head in one write,
//! the answer's head parsed with `httparse`, and the body read straight into the caller's
//! buffer. Through `hyper` each byte was copied twice in user space (from the socket into
//! hyper's read buffer, then from the `Bytes` it hands out into the engine's pooled buffer: 17 %
//! of a large download's CPU); here, over plain HTTP, the kernel's copy out of the socket is the
//! only one, and over TLS the copy out of the buffer each record is decrypted in (`records`).
//! Only an answer framed by `Content-Length` alone is taken (what S3 servers send to a GET);
//! its body is read to exactly that length, so a connection goes back to the pool at a request
//! boundary.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

use super::connections::{Connections, Origin, Stream};
use crate::source::checksum::FullObjectChecksum;

/// An answer's head larger than this is refused (S3's answers to a GET carry about 1 KiB).
const MAX_HEAD: usize = 64 << 10;
/// Read at a time while the head is incomplete; what follows the head starts the body.
const HEAD_READ: usize = 4 << 10;
/// Headers of an answer parsed at most.
const MAX_HEADERS: usize = 100;

/// What an answer's head says.
#[derive(Debug)]
pub(super) struct ResponseHead {
    pub status: u16,
    /// Names in lower case.
    headers: Vec<(String, String)>,
    /// The body's length, where `Content-Length` alone frames it.
    pub body_length: Option<u64>,
    /// The connection may carry another request once the body is read.
    pub reusable: bool,
}

impl ResponseHead {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        let (_, value) = self.headers.iter().find(|(n, _)| n == name)?;
        Some(value)
    }

    fn parse(response: &httparse::Response<'_, '_>) -> io::Result<Self> {
        let status = response.code.ok_or_else(|| invalid("no status"))?;
        let headers: Vec<(String, String)> = response
            .headers
            .iter()
            .map(|h| {
                let value = String::from_utf8_lossy(h.value).trim().to_string();
                (h.name.to_ascii_lowercase(), value)
            })
            .collect();
        fn all<'a>(
            headers: &'a [(String, String)],
            name: &'a str,
        ) -> impl Iterator<Item = &'a (String, String)> {
            headers.iter().filter(move |(n, _)| n == name)
        }
        let body_length = {
            let mut lengths = all(&headers, "content-length").map(|(_, v)| v.parse::<u64>().ok());
            match (lengths.next(), lengths.next()) {
                (Some(length), None) if all(&headers, "transfer-encoding").next().is_none() => {
                    length
                }
                _ => None,
            }
        };
        let close =
            all(&headers, "connection").any(|(_, v)| v.to_ascii_lowercase().contains("close"));
        Ok(Self {
            status,
            reusable: response.version == Some(1) && !close && body_length.is_some(),
            headers,
            body_length,
        })
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the answer's head: {what}"),
    )
}

/// A GET's request head: `path` (with its query) on `host`, with `headers`.
pub(super) fn request_head<'a>(
    path: &str,
    host: &str,
    headers: impl Iterator<Item = (&'a str, &'a str)>,
) -> Vec<u8> {
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n");
    for (name, value) in headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// An answer whose head has been read, on the connection it came by.
pub(super) struct Answer {
    pub stream: Stream,
    pub head: ResponseHead,
    /// Read with the head: `read[head_length..]` starts the body.
    read: Vec<u8>,
    head_length: usize,
}

/// Writes `request` on `stream` and reads the answer's head.
pub(super) async fn round_trip(mut stream: Stream, request: &[u8]) -> io::Result<Answer> {
    stream.write_all(request).await?;
    stream.flush().await?;
    let mut read = Vec::new();
    loop {
        read.reserve(HEAD_READ);
        if stream.read_buf(&mut read).await? == 0 {
            let closed = "the connection closed before an answer";
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, closed));
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        match response
            .parse(&read)
            .map_err(|err| invalid(&err.to_string()))?
        {
            httparse::Status::Complete(head_length) => {
                let head = ResponseHead::parse(&response)?;
                return Ok(Answer {
                    stream,
                    head,
                    read,
                    head_length,
                });
            }
            httparse::Status::Partial if read.len() > MAX_HEAD => return Err(invalid("too large")),
            httparse::Status::Partial => {}
        }
    }
}

/// A body read straight into the reader's buffer, to exactly its length; the connection goes
/// back to the pool at its end, and a body with a full-object checksum fails there when its CRC
/// is not that checksum.
pub(super) struct DirectBody {
    /// Until the body's end.
    stream: Option<Stream>,
    origin: Origin,
    connections: Arc<Connections>,
    /// Bytes read with the head: `early[taken..]` starts the body.
    early: Vec<u8>,
    taken: usize,
    remaining: u64,
    reusable: bool,
    crc: Option<(FullObjectChecksum, crc_fast::Digest)>,
}

impl DirectBody {
    /// The body of `answer`, checked at its end against `checksum` when there is one.
    pub(super) fn new(
        answer: Answer,
        origin: Origin,
        connections: Arc<Connections>,
        checksum: Option<FullObjectChecksum>,
    ) -> Self {
        Self {
            stream: Some(answer.stream),
            origin,
            connections,
            early: answer.read,
            taken: answer.head_length,
            remaining: answer.head.body_length.unwrap_or(0),
            reusable: answer.head.reusable,
            crc: checksum.map(|expected| (expected, expected.algorithm.digest())),
        }
    }

    /// The last byte is read: the connection goes back to the pool if nothing follows the body
    /// on it.
    fn release(&mut self) {
        if let Some(stream) = self.stream.take() {
            if self.reusable && self.taken == self.early.len() {
                self.connections.put_back(self.origin.clone(), stream);
            }
        }
    }

    /// At the end, the body's CRC against the server's checksum (reported by the read after
    /// the last bytes: a read that fails hands over no bytes).
    fn check(&mut self) -> io::Result<()> {
        let Some((expected, digest)) = self.crc.take() else {
            return Ok(());
        };
        let actual = digest.finalize();
        if actual == expected.value {
            return Ok(());
        }
        let mismatch = format!(
            "{} of the body is {actual:#x}, the server's checksum {:#x}",
            expected.algorithm.name(),
            expected.value
        );
        Err(io::Error::new(io::ErrorKind::InvalidData, mismatch))
    }
}

impl AsyncRead for DirectBody {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            this.release();
            return Poll::Ready(this.check());
        }
        let start = buf.filled().len();
        let want = (buf.remaining() as u64).min(this.remaining) as usize;
        if want == 0 {
            return Poll::Ready(Ok(()));
        }
        if this.taken < this.early.len() {
            let early = &this.early[this.taken..];
            let n = early.len().min(want);
            buf.put_slice(&early[..n]);
            this.taken += n;
        } else {
            let stream = this.stream.as_mut().expect("open until the body's end");
            let mut limited = buf.take(want);
            let into = limited.filled().as_ptr();
            ready!(Pin::new(stream).poll_read(cx, &mut limited))?;
            assert_eq!(into, limited.filled().as_ptr(), "read into its own buffer");
            let n = limited.filled().len();
            if n == 0 {
                let closed = format!(
                    "the connection closed {} bytes before the body's end",
                    this.remaining
                );
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::UnexpectedEof, closed)));
            }
            // SAFETY: `limited` is `buf`'s unfilled part, and the read initialised its first `n`
            // bytes (checked above that it read into that part).
            unsafe { buf.assume_init(n) };
            buf.advance(n);
        }
        let read = &buf.filled()[start..];
        this.remaining -= read.len() as u64;
        if let Some((_, digest)) = &mut this.crc {
            digest.update(read);
        }
        if this.remaining == 0 {
            this.release();
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(head: &[u8]) -> ResponseHead {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        assert!(response.parse(head).unwrap().is_complete());
        ResponseHead::parse(&response).unwrap()
    }

    #[test]
    fn only_a_content_length_frames_a_body_and_only_http_1_1_keeps_the_connection() {
        let head =
            parsed(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nETag: \"e\"\r\n\r\n");
        assert_eq!(
            (head.status, head.body_length, head.reusable),
            (206, Some(10), true)
        );
        assert_eq!(head.header("etag"), Some("\"e\""));
        let chunked =
            parsed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 10\r\n\r\n");
        assert_eq!((chunked.body_length, chunked.reusable), (None, false));
        let twice = parsed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nContent-Length: 11\r\n\r\n");
        assert_eq!(twice.body_length, None);
        let close = parsed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: Close\r\n\r\n");
        assert_eq!((close.body_length, close.reusable), (Some(1), false));
        let old = parsed(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
        assert!(!old.reusable);
    }

    #[test]
    fn the_request_head_carries_the_host_and_every_header() {
        let head = request_head(
            "/b/k%20x?x-id=GetObject",
            "h:9000",
            [("range", "bytes=0-9")].into_iter(),
        );
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /b/k%20x?x-id=GetObject HTTP/1.1\r\nhost: h:9000\r\nrange: bytes=0-9\r\n\r\n"
        );
    }
}
