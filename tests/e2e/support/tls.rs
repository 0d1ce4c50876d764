//! A TLS-terminating proxy in front of a test server, with a CA made at test time: what an
//! on-prem MinIO behind HTTPS signed by an in-house CA looks like to hydrator.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

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
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "hydrator test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server_params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let server = server_params.signed_by(&server_key, &issuer).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![server.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )
        .unwrap();
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
