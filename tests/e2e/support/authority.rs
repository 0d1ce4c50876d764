//! A certificate authority made at test time, for the HTTPS endpoints of the tests and of the
//! near-free origin (`benches/origin.rs` includes this file).

/// A CA made at test time and the certificate it signed for `localhost` (and only that name).
pub struct Authority {
    pub ca_pem: String,
    pub server: rcgen::Certificate,
    pub server_key: rcgen::KeyPair,
}

impl Authority {
    pub fn new() -> Self {
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
        Self {
            ca_pem: ca.pem(),
            server,
            server_key,
        }
    }

    /// A rustls server configuration presenting the `localhost` certificate, TLS 1.3 and 1.2.
    pub fn server_config(&self) -> rustls::ServerConfig {
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![self.server.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(self.server_key.serialize_der().into()),
            )
            .unwrap()
    }
}
