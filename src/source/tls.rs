//! The TLS configuration of hydrator's own HTTPS connections (the lean path, and the SDK's
//! client under `--no-verify-ssl`). It trusts exactly what the SDK's client trusts, so that a
//! request either path may carry meets the same certificate checks: the system's roots (which
//! honour `SSL_CERT_FILE` and `SSL_CERT_DIR`) and the `--ca-bundle` certificates, or with
//! `--no-verify-ssl` any certificate. TLS 1.3 and 1.2; rustls keeps the sessions of a config
//! (256 by default) and resumes them, so a connection the server closed reopens with an
//! abbreviated handshake.

use std::sync::{Arc, LazyLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

use super::client::ClientSettings;

/// The system's roots, read once per process (each read parses the whole store).
static SYSTEM_ROOTS: LazyLock<Vec<CertificateDer<'static>>> = LazyLock::new(|| {
    let found = rustls_native_certs::load_native_certs();
    if !found.errors.is_empty() {
        tracing::warn!("reading the system's CA certificates: {:?}", found.errors);
    }
    found.certs
});

/// The crypto hydrator's TLS uses: aws-lc, as the SDK's client. (Offering AES-128-GCM before
/// AES-256-GCM measured no difference on a CPU with vector AES: 0.35–0.44 against 0.28–0.42
/// user CPU-s per 2 GiB through the lean path.)
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The client configuration for `settings`: certificates checked against the system's roots
/// and the CA bundle, or not checked at all with `--no-verify-ssl`.
pub(crate) fn client_config(settings: &ClientSettings) -> rustls::ClientConfig {
    if settings.no_verify_ssl {
        return super::unverified_tls::client_config();
    }
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(SYSTEM_ROOTS.iter().cloned());
    let bundle = settings.ca_bundle.as_deref().unwrap_or_default();
    // `--ca-bundle` was checked to hold PEM certificates when it was read.
    roots.add_parsable_certificates(CertificateDer::pem_slice_iter(bundle).flatten());
    rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("aws-lc supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth()
}
