//! TLS records on a lean connection once rustls has done the handshake (`handshake`): rustls
//! keeps the keys, the session tickets and key updates (its kernel-connection API, made for
//! kernel TLS), and its own record ciphers seal and open the records; this module only frames
//! them. The point is the read side: rustls's own connection reads the socket 4 KiB at a time
//! (16 to 20 reads for a 64 KiB object), decrypts each record in place and then copies its
//! plaintext into a new allocation, which the reader copies again (13 % of a 2 GiB download's
//! samples over HTTPS in user-space copies, 2 % in freeing). Here the socket is read into one
//! buffer per connection, sized for several whole records, each record is decrypted in place
//! there and its plaintext copied once, into the caller's buffer: no allocation per record, and
//! a read per few records.
//!
//! What the record layer owes the HTTP layer above: a connection that ends without a
//! `close_notify` (truncation) or mid-record is an error, never an end of stream; `close_notify`
//! ends the stream (the body's framing then decides whether that was early); any other alert
//! is an error; plaintext not yet read stays here, so a connection with bytes nobody asked for is
//! not quiet (`connections::is_quiet`) and never reused.

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustls::client::ClientConnectionData;
use rustls::crypto::cipher::{
    InboundOpaqueMessage, MessageDecrypter, MessageEncrypter, OutboundChunks, OutboundPlainMessage,
};
use rustls::kernel::KernelConnection;
use rustls::{
    AlertDescription, ConnectionTrafficSecrets, ContentType, ExtractedSecrets, HandshakeType,
    ProtocolVersion, SupportedCipherSuite,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A record's header: type, version, length.
const HEADER: usize = 5;
/// The largest record payload TLS allows (2^14 plaintext and 2,048 of expansion, TLS 1.2's
/// bound; TLS 1.3's is smaller).
const MAX_PAYLOAD: usize = 16_384 + 2_048;
/// Plaintext per record written.
const MAX_FRAGMENT: usize = 16_384;
/// The read buffer: several whole records, so that one read takes what the socket holds.
const INPUT: usize = 4 * (HEADER + MAX_PAYLOAD);
/// A post-handshake message larger than this is refused (tickets are a few hundred bytes).
const MAX_HANDSHAKE_MESSAGE: usize = 64 << 10;

/// A TLS connection past its handshake, read and written record by record.
pub(super) struct TlsRecords {
    tcp: TcpStream,
    kernel: KernelConnection<ClientConnectionData>,
    suite: SupportedCipherSuite,
    decrypter: Box<dyn MessageDecrypter>,
    read_seq: u64,
    encrypter: Box<dyn MessageEncrypter>,
    write_seq: u64,
    /// Ciphertext read and not yet opened: `input[start..end]`; before it, `input[plain]` is
    /// plaintext opened in place and not yet read.
    input: Box<[u8]>,
    start: usize,
    end: usize,
    plain: Range<usize>,
    /// The largest record seen, on the wire: reads are sized to end on a record's end.
    record: usize,
    /// Records sealed and not yet all written: `output[written..]`.
    output: Vec<u8>,
    written: usize,
    /// A post-handshake message arriving over several records.
    handshake: Vec<u8>,
    /// The server sent `close_notify`.
    closed: bool,
    /// The server asked for a key update: ours goes before our next record.
    update_ours: bool,
    /// A read failed: the stream is out of step with the records and reads fail from then on.
    failed: bool,
}

impl TlsRecords {
    /// The connection `tcp` after a handshake that left `secrets`, `kernel` and `early`
    /// (ciphertext read past the handshake's last record).
    pub(super) fn new(
        tcp: TcpStream,
        secrets: ExtractedSecrets,
        kernel: KernelConnection<ClientConnectionData>,
        early: &[u8],
    ) -> io::Result<Self> {
        let suite = kernel.negotiated_cipher_suite();
        let (write_seq, tx) = secrets.tx;
        let (read_seq, rx) = secrets.rx;
        if early.len() > INPUT {
            return Err(invalid(format!("{} bytes past the handshake", early.len())));
        }
        let mut input = vec![0; INPUT].into_boxed_slice();
        input[..early.len()].copy_from_slice(early);
        Ok(Self {
            tcp,
            kernel,
            suite,
            decrypter: decrypter(suite, rx)?,
            read_seq,
            encrypter: encrypter(suite, tx, write_seq)?,
            write_seq,
            input,
            start: 0,
            end: early.len(),
            plain: 0..0,
            record: HEADER + MAX_FRAGMENT,
            output: Vec::new(),
            written: 0,
            handshake: Vec::new(),
            closed: false,
            update_ours: false,
            failed: false,
        })
    }

    /// Plaintext into `buf`, opening records and reading the socket as needed.
    fn read_into(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.plain.is_empty() {
                let n = self.plain.len().min(buf.remaining());
                let from = self.plain.start;
                buf.put_slice(&self.input[from..from + n]);
                self.plain.start += n;
                return Poll::Ready(Ok(()));
            }
            if self.closed {
                return Poll::Ready(Ok(()));
            }
            if !self.open_record()? {
                ready!(self.poll_fill(cx))?;
            }
        }
    }

    /// Opens the next whole record read, if there is one: `false` when more must be read.
    fn open_record(&mut self) -> io::Result<bool> {
        let ciphertext = &self.input[self.start..self.end];
        if ciphertext.len() < HEADER {
            return Ok(false);
        }
        let length = u16::from_be_bytes([ciphertext[3], ciphertext[4]]) as usize;
        if length > MAX_PAYLOAD {
            return Err(invalid(format!("a record of {length} bytes")));
        }
        if ciphertext.len() < HEADER + length {
            return Ok(false);
        }
        let typ = ContentType::from(ciphertext[0]);
        let version = ProtocolVersion::from(u16::from_be_bytes([ciphertext[1], ciphertext[2]]));
        let tls13 = matches!(self.suite, SupportedCipherSuite::Tls13(_));
        let outer_ok = match tls13 {
            true => typ == ContentType::ApplicationData,
            false => matches!(
                typ,
                ContentType::ApplicationData | ContentType::Alert | ContentType::Handshake
            ),
        };
        if !outer_ok {
            return Err(invalid(format!("a {typ:?} record after the handshake")));
        }
        let payload = self.start + HEADER..self.start + HEADER + length;
        self.start = payload.end;
        self.record = self.record.max(HEADER + length);
        let seq = self.read_seq;
        self.read_seq = seq
            .checked_add(1)
            .ok_or_else(|| invalid("the read sequence wrapped"))?;
        let base = self.input.as_ptr() as usize;
        let message = InboundOpaqueMessage::new(typ, version, &mut self.input[payload]);
        let opened = self.decrypter.decrypt(message, seq).map_err(tls_error)?;
        let at = opened.payload.as_ptr() as usize - base;
        let (plain, typ) = (at..at + opened.payload.len(), opened.typ);
        match typ {
            ContentType::ApplicationData => self.plain = plain,
            ContentType::Alert => self.alert(plain)?,
            ContentType::Handshake if tls13 => {
                self.handshake.extend_from_slice(&self.input[plain]);
                self.post_handshake()?;
            }
            typ => return Err(invalid(format!("a {typ:?} message after the handshake"))),
        }
        Ok(true)
    }

    /// An alert: `close_notify` ends the stream, any other fails it.
    fn alert(&mut self, plain: Range<usize>) -> io::Result<()> {
        let &[_level, description] = &self.input[plain] else {
            return Err(invalid("a malformed alert"));
        };
        match AlertDescription::from(description) {
            AlertDescription::CloseNotify => {
                self.closed = true;
                Ok(())
            }
            alert => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("the server sent the TLS alert {alert:?}"),
            )),
        }
    }

    /// TLS 1.3's messages after the handshake: session tickets (kept by rustls for the next
    /// connection) and key updates.
    fn post_handshake(&mut self) -> io::Result<()> {
        while let [typ, a, b, c, rest @ ..] = &self.handshake[..] {
            let length = u32::from_be_bytes([0, *a, *b, *c]) as usize;
            if length > MAX_HANDSHAKE_MESSAGE {
                return Err(invalid(format!("a handshake message of {length} bytes")));
            }
            if rest.len() < length {
                return Ok(());
            }
            let body = &rest[..length];
            match HandshakeType::from(*typ) {
                HandshakeType::NewSessionTicket => self
                    .kernel
                    .handle_new_session_ticket(body)
                    .map_err(tls_error)?,
                HandshakeType::KeyUpdate => {
                    let requested = match body {
                        [0] => false,
                        [1] => true,
                        _ => return Err(invalid("a malformed key update")),
                    };
                    if rest.len() > length {
                        // RFC 8446 §5.1: a key change ends its record; the next record is
                        // under the new key.
                        return Err(invalid("a key update not at a record's end"));
                    }
                    let (seq, rx) = self.kernel.update_rx_secret().map_err(tls_error)?;
                    self.decrypter = decrypter(self.suite, rx)?;
                    self.read_seq = seq;
                    self.update_ours |= requested;
                }
                typ => return Err(invalid(format!("a {typ:?} message after the handshake"))),
            }
            self.handshake.drain(..4 + length);
        }
        Ok(())
    }

    /// Reads more ciphertext: at least the rest of the record begun, and as many whole records
    /// more as fit.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        let begun = self.end - self.start;
        let need = match begun >= HEADER {
            true => {
                HEADER
                    + u16::from_be_bytes([self.input[self.start + 3], self.input[self.start + 4]])
                        as usize
                    - begun
            }
            false => self.record - begun,
        };
        if INPUT - self.end < need {
            self.input.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, begun);
        }
        let whole = (INPUT - self.end - need) / self.record * self.record;
        let mut read = ReadBuf::new(&mut self.input[self.end..self.end + need + whole]);
        ready!(Pin::new(&mut self.tcp).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        if n == 0 {
            let what = match begun {
                0 => "the connection closed without a TLS close_notify",
                _ => "the connection closed within a TLS record",
            };
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::UnexpectedEof, what)));
        }
        self.end += n;
        Poll::Ready(Ok(()))
    }

    /// Writes what was sealed and not yet written.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.output.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.output[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.output.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Seals `plaintext` (at most a record's) as one record of type `typ`.
    fn seal(&mut self, typ: ContentType, plaintext: &[u8]) -> io::Result<()> {
        let limit = match self.suite {
            SupportedCipherSuite::Tls13(suite) => suite.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(suite) => suite.common.confidentiality_limit,
        };
        if self.write_seq >= limit {
            return Err(invalid("the key's confidentiality limit is reached"));
        }
        let message = OutboundPlainMessage {
            typ,
            version: ProtocolVersion::TLSv1_2,
            payload: OutboundChunks::Single(plaintext),
        };
        let sealed = self
            .encrypter
            .encrypt(message, self.write_seq)
            .map_err(tls_error)?;
        self.write_seq += 1;
        self.output.extend_from_slice(&sealed.encode());
        Ok(())
    }

    /// Our key update, answering the server's request for one.
    fn update_our_key(&mut self) -> io::Result<()> {
        // KeyUpdate, 1 byte long: update_not_requested.
        self.seal(ContentType::Handshake, &[24, 0, 0, 1, 0])?;
        let (seq, tx) = self.kernel.update_tx_secret().map_err(tls_error)?;
        self.encrypter = encrypter(self.suite, tx, seq)?;
        self.write_seq = seq;
        self.update_ours = false;
        Ok(())
    }
}

impl AsyncRead for TlsRecords {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.failed {
            let failed = "the TLS connection failed on an earlier read";
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, failed)));
        }
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let read = this.read_into(cx, buf);
        this.failed = matches!(read, Poll::Ready(Err(_)));
        read
    }
}

impl AsyncWrite for TlsRecords {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(this.poll_drain(cx))?;
        if this.update_ours {
            this.update_our_key()?;
        }
        let n = data.len().min(MAX_FRAGMENT);
        this.seal(ContentType::ApplicationData, &data[..n])?;
        // Sent now if the socket takes it, else by the next write or the flush.
        if let Poll::Ready(Err(err)) = this.poll_drain(cx) {
            return Poll::Ready(Err(err));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

/// The key and IV of a direction's secrets.
fn key_and_iv(
    secrets: ConnectionTrafficSecrets,
) -> io::Result<(rustls::crypto::cipher::AeadKey, rustls::crypto::cipher::Iv)> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => Ok((key, iv)),
        _ => Err(invalid("a cipher without extractable keys")),
    }
}

/// rustls's record opener for `suite` with `secrets`. TLS 1.2's IV is the fixed part
/// (GCM's salt) followed by the explicit nonce's start, as rustls extracts it.
fn decrypter(
    suite: SupportedCipherSuite,
    secrets: ConnectionTrafficSecrets,
) -> io::Result<Box<dyn MessageDecrypter>> {
    let (key, iv) = key_and_iv(secrets)?;
    Ok(match suite {
        SupportedCipherSuite::Tls13(suite) => suite.aead_alg.decrypter(key, iv),
        SupportedCipherSuite::Tls12(suite) => {
            let fixed = suite.aead_alg.key_block_shape().fixed_iv_len;
            suite.aead_alg.decrypter(key, &iv.as_ref()[..fixed])
        }
    })
}

/// rustls's record sealer for `suite` with `secrets` (see `decrypter`), whose next record is
/// `next_seq`.
///
/// Why a throwaway record when `next_seq` is not 0: aws-lc's sealing key checks that each nonce
/// comes after the last one, counting from the first it seals as sequence 0. TLS 1.2 hands its
/// key over after the Finished message was sealed with it at sequence 0, so a new sealer would
/// take sequence 1 as its 0 and refuse the third record. One record sealed at 0 and dropped
/// (never sent: a nonce used twice on the wire would be a break, one used for nothing is not)
/// starts its count where the connection's is.
fn encrypter(
    suite: SupportedCipherSuite,
    secrets: ConnectionTrafficSecrets,
    next_seq: u64,
) -> io::Result<Box<dyn MessageEncrypter>> {
    let (key, iv) = key_and_iv(secrets)?;
    let mut encrypter = match suite {
        SupportedCipherSuite::Tls13(suite) => suite.aead_alg.encrypter(key, iv),
        SupportedCipherSuite::Tls12(suite) => {
            let shape = suite.aead_alg.key_block_shape();
            let (fixed, explicit) = iv.as_ref().split_at(shape.fixed_iv_len);
            let explicit = &explicit[..shape.explicit_nonce_len];
            suite.aead_alg.encrypter(key, fixed, explicit)
        }
    };
    if next_seq > 0 {
        let throwaway = OutboundPlainMessage {
            typ: ContentType::ApplicationData,
            version: ProtocolVersion::TLSv1_2,
            payload: OutboundChunks::Single(&[]),
        };
        encrypter.encrypt(throwaway, 0).map_err(tls_error)?;
    }
    Ok(encrypter)
}

pub(super) fn invalid(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

pub(super) fn tls_error(err: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err)
}
