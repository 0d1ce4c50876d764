//! The kubelet's registration calls, made acceptable to the plugin's HTTP/2 server.
//!
//! Why this exists: the kubelet's plugin watcher dials a registration socket by its bare path,
//! and grpc-go then sends that path as the request's `:authority`
//! (`/var/lib/kubelet/plugins_registry/…-reg.sock`). That is not a valid authority, and h2
//! (under tonic) refuses such a request as malformed, with `PROTOCOL_ERROR`: the kubelet never
//! learns the driver's name. Go servers accept it, which is why the registrar sidecar exists.
//!
//! So each registration connection goes through a relay: bytes from the server to the kubelet
//! pass untouched; from the kubelet, every frame passes untouched except the header blocks
//! (`HEADERS` and its `CONTINUATION`s), which are decoded, given `:authority: localhost` (what
//! grpc-go sends to `unix://` targets), encoded again and sent as one `HEADERS` frame. Both HPACK
//! contexts stay consistent: the relay decodes everything the kubelet encoded and is the only
//! encoder the server's decoder sees. Padding and the deprecated priority fields of a
//! `HEADERS` frame are dropped, which HTTP/2 allows a relay to do.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::Connected;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HTTP/2's default frame size limit, which the server keeps: a larger rewritten header block
/// is refused rather than split.
const MAX_FRAME: usize = 16_384;
/// The largest frame the relay reads from the kubelet (registration calls are tiny).
const MAX_READ: usize = 1 << 20;
const AUTHORITY: &[u8] = b":authority";
const LOCALHOST: &[u8] = b"localhost";

/// Room for the bytes in flight between the relay and the server, each way.
const RELAY_BUFFER: usize = 64 * 1024;

/// The connections `listener` accepts, each through its relay: what the server serves. Ends
/// at the first error accepting, as the plugin's own listener does.
pub(crate) fn relayed(listener: UnixListener) -> impl Stream<Item = io::Result<Relayed>> {
    futures::stream::unfold(listener, |listener| async move {
        let kubelet = match listener.accept().await {
            Ok((kubelet, _)) => kubelet,
            Err(err) => {
                tracing::error!("accepting registration connections: {err}");
                return None;
            }
        };
        let (ours, theirs) = tokio::io::duplex(RELAY_BUFFER);
        tokio::spawn(async move {
            if let Err(err) = relay(kubelet, ours).await {
                tracing::warn!("a registration connection ended: {err}");
            }
        });
        Some((Ok(Relayed(theirs)), listener))
    })
}

/// The server's end of one relayed connection.
pub(crate) struct Relayed(DuplexStream);

impl Connected for Relayed {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Relayed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Relayed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Relays one kubelet connection to `server` until either side closes it.
async fn relay(client: UnixStream, server: DuplexStream) -> io::Result<()> {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let answers = async {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    let requests = async {
        rewrite_requests(&mut client_read, &mut server_write).await?;
        server_write.shutdown().await
    };
    tokio::try_join!(answers, requests).map(|_| ())
}

/// Copies the kubelet's side of the connection, every header block given the authority
/// `localhost`, until the kubelet closes it.
async fn rewrite_requests(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
) -> io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    while let Some(frame) = read_frame(from).await? {
        if frame.kind != HEADERS {
            to.write_all(&frame.encode()).await?;
            continue;
        }
        let mut block = header_fragment(&frame)?.to_vec();
        let mut flags = frame.flags;
        while flags & END_HEADERS == 0 {
            let next = read_frame(from)
                .await?
                .ok_or_else(|| invalid("connection closed inside a header block"))?;
            if next.kind != CONTINUATION || next.stream != frame.stream {
                return Err(invalid("a header block interrupted by another frame"));
            }
            block.extend_from_slice(&next.payload);
            flags = next.flags;
        }
        let rewritten = with_local_authority(&mut decoder, &mut encoder, &block)?;
        let headers = Frame {
            kind: HEADERS,
            flags: (frame.flags & END_STREAM) | END_HEADERS,
            stream: frame.stream,
            payload: rewritten,
        };
        to.write_all(&headers.encode()).await?;
    }
    Ok(())
}

/// Decodes one header block and encodes it again with `:authority: localhost`.
fn with_local_authority(
    decoder: &mut Decoder,
    encoder: &mut Encoder,
    block: &[u8],
) -> io::Result<Vec<u8>> {
    let headers = decoder
        .decode(block)
        .map_err(|e| invalid(&format!("undecodable header block: {e:?}")))?;
    let rewritten = headers.iter().map(|(name, value)| match name.as_slice() {
        AUTHORITY => (name.as_slice(), LOCALHOST),
        _ => (name.as_slice(), value.as_slice()),
    });
    let encoded = encoder.encode(rewritten);
    if encoded.len() > MAX_FRAME {
        return Err(invalid("a header block larger than one frame"));
    }
    Ok(encoded)
}

/// The header block fragment of a `HEADERS` frame, without padding and priority fields.
fn header_fragment(frame: &Frame) -> io::Result<&[u8]> {
    let mut payload = frame.payload.as_slice();
    let mut padding = 0;
    if frame.flags & PADDED != 0 {
        let (&length, rest) = payload
            .split_first()
            .ok_or_else(|| invalid("a padded frame without its pad length"))?;
        padding = usize::from(length);
        payload = rest;
    }
    if frame.flags & PRIORITY != 0 {
        payload = payload
            .get(5..)
            .ok_or_else(|| invalid("a priority frame too short"))?;
    }
    match payload.len().checked_sub(padding) {
        Some(end) => Ok(&payload[..end]),
        None => Err(invalid("padding longer than the frame")),
    }
}

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Frame {
    fn encode(&self) -> Vec<u8> {
        let length = self.payload.len() as u32;
        let mut bytes = Vec::with_capacity(9 + self.payload.len());
        bytes.extend_from_slice(&length.to_be_bytes()[1..]);
        bytes.extend_from_slice(&[self.kind, self.flags]);
        bytes.extend_from_slice(&self.stream.to_be_bytes());
        bytes.extend_from_slice(&self.payload);
        bytes
    }
}

/// The next frame, or `None` where the connection ended between frames.
async fn read_frame(from: &mut (impl AsyncRead + Unpin)) -> io::Result<Option<Frame>> {
    let mut header = [0u8; 9];
    match from.read_exact(&mut header).await {
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err),
    }
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    if length > MAX_READ {
        return Err(invalid("a frame larger than a registration call needs"));
    }
    let mut payload = vec![0u8; length];
    from.read_exact(&mut payload).await?;
    Ok(Some(Frame {
        kind: header[3],
        flags: header[4],
        stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]),
        payload,
    }))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(flags: u8, payload: Vec<u8>) -> Vec<u8> {
        Frame {
            kind: HEADERS,
            flags,
            stream: 1,
            payload,
        }
        .encode()
    }

    /// What grpc-go sends when dialled by path: the socket's path as the authority, in a
    /// padded HEADERS frame continued by a CONTINUATION; other frames around it.
    #[tokio::test]
    async fn a_path_authority_becomes_localhost_and_every_other_byte_passes() {
        let mut kubelet = Encoder::new();
        let request: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (
                b":authority",
                b"/var/lib/kubelet/plugins_registry/x-reg.sock",
            ),
            (b"content-type", b"application/grpc"),
        ];
        let block = kubelet.encode(request.clone());
        let (first, second) = block.split_at(10);
        let mut padded = vec![3u8];
        padded.extend_from_slice(first);
        padded.extend_from_slice(&[0, 0, 0]);
        let settings = Frame {
            kind: 0x4,
            flags: 0,
            stream: 0,
            payload: vec![0, 3, 0, 0, 0, 100],
        }
        .encode();
        let data = Frame {
            kind: 0x0,
            flags: END_STREAM,
            stream: 1,
            payload: b"\0\0\0\0\0".to_vec(),
        }
        .encode();
        let mut wire = PREFACE.to_vec();
        wire.extend_from_slice(&settings);
        wire.extend_from_slice(&headers_frame(PADDED, padded));
        wire.extend_from_slice(
            &Frame {
                kind: CONTINUATION,
                flags: END_HEADERS,
                stream: 1,
                payload: second.to_vec(),
            }
            .encode(),
        );
        wire.extend_from_slice(&data);

        let mut out = Vec::new();
        rewrite_requests(&mut wire.as_slice(), &mut out)
            .await
            .unwrap();

        let mut rest = out.strip_prefix(PREFACE.as_slice()).unwrap();
        assert!(rest.starts_with(&settings), "settings pass as they are");
        rest = &rest[settings.len()..];
        let frame = read_frame(&mut rest).await.unwrap().unwrap();
        assert_eq!(
            (frame.kind, frame.flags, frame.stream),
            (HEADERS, END_HEADERS, 1)
        );
        let decoded = Decoder::new().decode(&frame.payload).unwrap();
        let mut expected: Vec<(Vec<u8>, Vec<u8>)> = request
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        expected[3].1 = b"localhost".to_vec();
        assert_eq!(decoded, expected);
        assert_eq!(rest, data.as_slice(), "data passes as it is");
    }

    #[tokio::test]
    async fn what_is_not_http2_or_breaks_a_header_block_is_refused() {
        let mut out = Vec::new();
        let junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(rewrite_requests(&mut junk.as_slice(), &mut out)
            .await
            .is_err());

        let mut wire = PREFACE.to_vec();
        wire.extend_from_slice(&headers_frame(
            0,
            Encoder::new().encode([(b":path".as_slice(), b"/".as_slice())]),
        ));
        wire.extend_from_slice(
            &Frame {
                kind: 0x0,
                flags: 0,
                stream: 1,
                payload: vec![],
            }
            .encode(),
        );
        let mut out = Vec::new();
        assert!(rewrite_requests(&mut wire.as_slice(), &mut out)
            .await
            .is_err());

        let mut wire = PREFACE.to_vec();
        wire.extend_from_slice(&headers_frame(PADDED | END_HEADERS, vec![200, 1, 2]));
        let mut out = Vec::new();
        assert!(rewrite_requests(&mut wire.as_slice(), &mut out)
            .await
            .is_err());
    }
}
