//! The TLS configuration of hydrator's own HTTPS connections (the lean path, and the SDK's
//! client under `--no-verify-ssl`). It trusts exactly what the SDK's client trusts, so that a
//! request either path may carry meets the same certificate checks: the system's roots (which
//! honour `SSL_CERT_FILE` and `SSL_CERT_DIR`) and the `--ca-bundle` certificates, or with
//! `--no-verify-ssl` any certificate. TLS 1.3 and 1.2; rustls keeps the sessions of a config
//! (256 by default) and resumes them, so a connection the server closed reopens with an
//! abbreviated handshake.

use std::sync::{Arc, LazyLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The system's roots, read once per process (each read parses the whole store).
static SYSTEM_ROOTS: LazyLock<Vec<CertificateDer<'static>>> = LazyLock::new(|| {
    let found = rustls_native_certs::load_native_certs();
    if !found.errors.is_empty() {
        tracing::warn!("reading the system's CA certificates: {:?}", found.errors);
    }
    found.certs
});

/// The client configuration: certificates checked against the system's roots and the
/// `ca_bundle` (PEM, checked to hold certificates when it was read), or, with `no_verify`
/// (`--no-verify-ssl`), not checked at all. The crypto is aws-lc's, as the SDK client's.
/// (Offering AES-128-GCM before AES-256-GCM measured no difference on a CPU with vector AES:
/// 0.34–0.44 against 0.28–0.42 user CPU-s per 2 GiB through the lean path.)
pub(crate) fn client_config(ca_bundle: Option<&[u8]>, no_verify: bool) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("aws-lc supports TLS 1.2 and 1.3");
    if no_verify {
        return builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
            .with_no_client_auth();
    }
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(SYSTEM_ROOTS.iter().cloned());
    let bundle = ca_bundle.unwrap_or_default();
    roots.add_parsable_certificates(CertificateDer::pem_slice_iter(bundle).flatten());
    builder.with_root_certificates(roots).with_no_client_auth()
}

/// Every certificate is taken; only the handshake's signatures are checked.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls12_signature(message, cert, signature, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls13_signature(message, cert, signature, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
