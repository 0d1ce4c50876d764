//! A TLS-terminating proxy in front of a test server, with a CA made at test time: what an
//! on-prem MinIO behind HTTPS signed by an in-house CA looks like to hydrator.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

use super::authority::Authority;

/// A running proxy: `https://localhost:PORT` forwards to the plain server.
pub struct TlsProxy {
    pub port: u16,
    /// The CA's certificate (PEM), for `--ca-bundle`.
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    /// Serves `localhost` (and only that name) with a certificate signed by a fresh CA,
    /// forwarding every connection to `upstream` (`HOST:PORT`), on `runtime`.
    pub fn start(runtime: &tokio::runtime::Runtime, upstream: &str) -> Self {
        let authority = Authority::new();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &authority.ca_pem).unwrap();
        let config = authority.server_config();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = runtime
            .block_on(TcpListener::bind(("127.0.0.1", 0)))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = upstream.to_string();
        let task = runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return; // the client refused the certificate
                    };
                    if let Ok(mut plain) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        Self {
            port,
            ca_file,
            _dir: dir,
            task,
        }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
