//! The lean path's TLS records against a rustls server whose bytes each test delivers as it
//! scripts them: records split across reads, TLS 1.2 and 1.3 and their ciphers, a connection
//! cut without `close_notify` or closed with it mid-body, bytes after the body in the body's
//! own record, and a fatal alert after the handshake.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::{CipherSuite, ServerConfig, SupportedProtocolVersion};

use super::connections::{Connections, Origin};
use super::exchange::{request_head, round_trip};
use super::test_support::{get, large, lean_for, partial, settings};
use super::LeanGets;
use crate::source::client::StaticCredentials;

// Its `server_config` serves every version; these tests build theirs per version and cipher.
#[allow(dead_code)]
#[path = "../../../tests/e2e/support/authority.rs"]
mod authority;

const BODY: &[u8] = b"0123456789abcdefghij";

/// How the server ends its answer.
#[derive(Clone, Copy, PartialEq)]
enum End {
    KeepOpen,
    CloseNotify,
    /// The TCP connection closed without `close_notify`.
    Cut,
}

/// The server's `n`th answer (counted over all connections).
struct Answer {
    plaintext: Vec<u8>,
    end: End,
}

/// How the server speaks TLS.
#[derive(Clone, Copy)]
struct Server {
    version: &'static SupportedProtocolVersion,
    /// The one cipher suite offered, if not the default ones.
    suite: Option<CipherSuite>,
    /// The socket written this many bytes at a time, with a pause after each, so the client
    /// reads records in pieces.
    chunk: usize,
    /// Client certificates required: a TLS 1.3 client sees the refusal after its handshake.
    client_auth: bool,
}

const TLS13: Server = Server {
    version: &rustls::version::TLS13,
    suite: None,
    chunk: usize::MAX,
    client_auth: false,
};
const TLS12: Server = Server {
    version: &rustls::version::TLS12,
    ..TLS13
};

fn config(server: Server, authority: &authority::Authority) -> ServerConfig {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(suite) = server.suite {
        provider.cipher_suites.retain(|s| s.suite() == suite);
    }
    let builder = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[server.version])
        .unwrap();
    let builder = match server.client_auth {
        false => builder.with_no_client_auth(),
        true => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(authority.server.der().clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder
        .with_single_cert(
            vec![authority.server.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(authority.server_key.serialize_der().into()),
        )
        .unwrap()
}

/// A TLS server on a local port answering with `script`; returns its endpoint, its CA (PEM)
/// and counts of the connections it accepted and the requests it answered.
fn scripted(
    server: Server,
    script: fn(usize) -> Answer,
) -> (String, Vec<u8>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let authority = authority::Authority::new();
    let config = Arc::new(config(server, &authority));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!(
        "https://localhost:{}",
        listener.local_addr().unwrap().port()
    );
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (accepted, answered) = (connections.clone(), requests.clone());
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            accepted.fetch_add(1, Ordering::SeqCst);
            let (config, requests) = (config.clone(), requests.clone());
            std::thread::spawn(move || serve(socket.unwrap(), config, server, script, &requests));
        }
    });
    (
        endpoint,
        authority.ca_pem.into_bytes(),
        connections,
        answered,
    )
}

/// One connection: the handshake, then an answer per request as `script` says.
fn serve(
    mut socket: std::net::TcpStream,
    config: Arc<ServerConfig>,
    server: Server,
    script: fn(usize) -> Answer,
    requests: &AtomicUsize,
) {
    let mut tls = rustls::ServerConnection::new(config).unwrap();
    // A whole answer is buffered before any of it is written.
    tls.set_buffer_limit(None);
    loop {
        let mut read = Vec::new();
        while !read.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 4096];
            // A refused handshake's alert is written before the error returns.
            match rustls::Stream::new(&mut tls, &mut socket).read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&chunk[..n]),
            }
        }
        let answer = script(requests.fetch_add(1, Ordering::SeqCst));
        tls.writer().write_all(&answer.plaintext).unwrap();
        if answer.end == End::CloseNotify {
            tls.send_close_notify();
        }
        let mut bytes = Vec::new();
        while tls.wants_write() {
            tls.write_tls(&mut bytes).unwrap();
        }
        for piece in bytes.chunks(server.chunk) {
            if socket.write_all(piece).is_err() {
                return;
            }
            if server.chunk != usize::MAX {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if answer.end != End::KeepOpen {
            return;
        }
    }
}

async fn lean(endpoint: &str, ca: Vec<u8>) -> LeanGets {
    let credentials = StaticCredentials {
        access_key: "a".to_string(),
        secret_key: "b".to_string(),
        session_token: None,
    };
    let mut settings = settings(endpoint, credentials);
    settings.ca_bundle = Some(ca);
    lean_for(&settings).await.0.expect("an HTTPS endpoint")
}

#[tokio::test]
async fn gets_follow_one_another_on_a_connection_in_every_version_and_cipher() {
    for (server, name) in [
        (TLS13, "TLS 1.3"),
        (TLS12, "TLS 1.2"),
        (
            Server {
                suite: Some(CipherSuite::TLS13_AES_128_GCM_SHA256),
                ..TLS13
            },
            "TLS 1.3 AES-128-GCM",
        ),
        (
            Server {
                suite: Some(CipherSuite::TLS13_CHACHA20_POLY1305_SHA256),
                ..TLS13
            },
            "TLS 1.3 ChaCha20-Poly1305",
        ),
        (
            Server {
                suite: Some(CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
                ..TLS12
            },
            "TLS 1.2 ChaCha20-Poly1305",
        ),
    ] {
        // Bodies of many records, of lengths that differ by a byte.
        let (endpoint, ca, connections, _) = scripted(server, |n| Answer {
            plaintext: partial(&large(n), ""),
            end: End::KeepOpen,
        });
        let lean = lean(&endpoint, ca).await;
        // More than two: aws-lc refuses a TLS 1.2 sealer's third record unless its count
        // starts where the handshake left it.
        for n in 0..5 {
            let body = get(&lean, large(n).len() as u64).await.expect(name);
            assert!(body.unwrap() == large(n), "{name}: body {n}");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn records_split_across_reads_are_put_together() {
    for (version, name) in [(TLS13, "TLS 1.3"), (TLS12, "TLS 1.2")] {
        // Pieces of 7 bytes split every header and tag; of 5,001 the records' bodies.
        for chunk in [7, 5_001] {
            let server = Server { chunk, ..version };
            let (endpoint, ca, connections, _) = scripted(server, |n| Answer {
                plaintext: partial(
                    &large(n)[..match n {
                        0 => 1_000,
                        _ => 40_000 + n,
                    }],
                    "",
                ),
                end: End::KeepOpen,
            });
            let lean = lean(&endpoint, ca).await;
            for n in 0..2 {
                let len = if n == 0 { 1_000 } else { 40_000 + n };
                let body = get(&lean, len as u64).await.expect(name);
                assert!(
                    body.unwrap() == large(n)[..len],
                    "{name} by {chunk}: body {n}"
                );
            }
            assert_eq!(connections.load(Ordering::SeqCst), 1, "{name} by {chunk}");
        }
    }
}

#[tokio::test]
async fn a_connection_cut_without_close_notify_mid_body_fails_the_body() {
    for (server, name) in [(TLS13, "TLS 1.3"), (TLS12, "TLS 1.2")] {
        let (endpoint, ca, _, _) = scripted(server, |_| {
            let mut plaintext = partial(&large(0), "");
            plaintext.truncate(plaintext.len() - 5);
            Answer {
                plaintext,
                end: End::Cut,
            }
        });
        let lean = lean(&endpoint, ca).await;
        let err = get(&lean, large(0).len() as u64)
            .await
            .expect(name)
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{name}");
        assert!(err.to_string().contains("close_notify"), "{name}: {err}");
    }
}

#[tokio::test]
async fn a_close_notify_mid_body_fails_the_body_with_what_was_missing() {
    for (server, name) in [(TLS13, "TLS 1.3"), (TLS12, "TLS 1.2")] {
        let (endpoint, ca, _, _) = scripted(server, |_| {
            let mut plaintext = partial(BODY, "");
            plaintext.truncate(plaintext.len() - 5);
            Answer {
                plaintext,
                end: End::CloseNotify,
            }
        });
        let lean = lean(&endpoint, ca).await;
        let err = get(&lean, BODY.len() as u64)
            .await
            .expect(name)
            .unwrap_err();
        assert!(err.to_string().contains("5 bytes before"), "{name}: {err}");
    }
}

#[tokio::test]
async fn bytes_after_the_body_in_its_own_record_keep_the_connection_from_the_pool() {
    for (server, name) in [(TLS13, "TLS 1.3"), (TLS12, "TLS 1.2")] {
        // A whole answer of the right length follows the first body in the same record: taken
        // as the second GET's answer, it would hand over its X's.
        let (endpoint, ca, connections, _) = scripted(server, |n| Answer {
            plaintext: match n {
                0 => [partial(BODY, ""), partial(&[b'X'; 20], "")].concat(),
                _ => partial(BODY, ""),
            },
            end: End::KeepOpen,
        });
        let lean = lean(&endpoint, ca).await;
        for _ in 0..2 {
            let body = get(&lean, BODY.len() as u64).await.expect(name);
            assert_eq!(body.unwrap(), BODY, "{name}");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 2, "{name}");
    }
}

#[tokio::test]
async fn a_fatal_alert_after_the_handshake_fails_the_get() {
    // A server that wants a client certificate says so by an alert once the client's side of
    // the TLS 1.3 handshake is over: the GET fails with it rather than reading an answer.
    let server = Server {
        client_auth: true,
        ..TLS13
    };
    let (endpoint, ca, _, requests) = scripted(server, |_| Answer {
        plaintext: partial(BODY, ""),
        end: End::KeepOpen,
    });
    let config = crate::source::tls::client_config(Some(&ca), false);
    let connections = Connections::new(config, 1);
    let origin = Origin::of(&endpoint.parse().unwrap()).unwrap();
    let stream = connections.connect(&origin).await.unwrap();
    let request = request_head("/b/k", &origin.host_header(), std::iter::empty());
    let err = round_trip(stream, &request).await.err().expect("refused");
    assert!(err.to_string().contains("CertificateRequired"), "{err}");
    assert_eq!(requests.load(Ordering::SeqCst), 0);
}
