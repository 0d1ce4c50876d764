//! The TLS handshake of a lean connection, by rustls's unbuffered client: the certificate is
//! checked by the configuration the SDK's client trusts (`source::tls`), exactly as through
//! rustls's buffered connection. Once it is done, rustls hands over the traffic keys and keeps
//! what it still needs for tickets and key updates (its kernel-connection API), and the records
//! are read and written by `records`.

use std::io;
use std::sync::Arc;

use rustls::client::ClientConnectionData;
use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, UnbufferedStatus};
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::records::{invalid, tls_error, TlsRecords};

/// The server's flights are read into a buffer this large at first; it grows to
/// `MAX_FLIGHT` for a long certificate chain.
const FLIGHT: usize = 16 << 10;
const MAX_FLIGHT: usize = 128 << 10;

/// The handshake with `name` on `tcp`; `config` must allow the keys to be extracted.
pub(super) async fn handshake(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    mut tcp: TcpStream,
) -> io::Result<TlsRecords> {
    let mut tls = UnbufferedClientConnection::new(config, name).map_err(tls_error)?;
    let mut incoming = vec![0u8; FLIGHT];
    let mut used = 0;
    let mut outgoing = Vec::new();
    loop {
        let UnbufferedStatus { discard, state } = tls.process_tls_records(&mut incoming[..used]);
        let mut done = false;
        let mut read = false;
        match state.map_err(tls_error)? {
            ConnectionState::EncodeTlsData(mut data) => encode(&mut data, &mut outgoing)?,
            ConnectionState::TransmitTlsData(data) => {
                tcp.write_all(&outgoing).await?;
                outgoing.clear();
                data.done();
            }
            ConnectionState::BlockedHandshake => read = true,
            ConnectionState::WriteTraffic(_) => done = true,
            state => return Err(invalid(format!("{state:?} during the handshake"))),
        }
        incoming.copy_within(discard..used, 0);
        used -= discard;
        if done {
            break;
        }
        if read {
            if used == incoming.len() {
                if used >= MAX_FLIGHT {
                    return Err(invalid("the server's handshake is too large"));
                }
                incoming.resize(used * 2, 0);
            }
            let n = tcp.read(&mut incoming[used..]).await?;
            if n == 0 {
                let closed = "the connection closed during the TLS handshake";
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, closed));
            }
            used += n;
        }
    }
    let (secrets, kernel) = tls.dangerous_into_kernel_connection().map_err(tls_error)?;
    TlsRecords::new(tcp, secrets, kernel, &incoming[..used])
}

/// Appends a handshake record to `outgoing`.
fn encode(
    data: &mut EncodeTlsData<'_, ClientConnectionData>,
    outgoing: &mut Vec<u8>,
) -> io::Result<()> {
    let start = outgoing.len();
    let mut room = 4 << 10;
    loop {
        outgoing.resize(start + room, 0);
        match data.encode(&mut outgoing[start..]) {
            Ok(n) => {
                outgoing.truncate(start + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(size)) => room = size.required_size,
            Err(err) => return Err(invalid(err)),
        }
    }
}
