//! `--no-verify-ssl`: an HTTPS client for the SDK that accepts any server certificate. The
//! SDK's own client takes a trust store but no certificate verifier, so this is hyper-util's
//! pooled client over hyper-rustls with the verifier of `source::tls` that accepts every
//! certificate.

use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

type Https = hyper_rustls::HttpsConnector<TcpConnector>;

#[derive(Clone, Debug)]
struct UnverifiedClient(Client<Https, SdkBody>);

/// One pooled client, with the SDK's connect and read timeouts applied as the SDK's own
/// connector applies them: until the response's head has arrived (the body is guarded by the
/// SDK's stalled-stream protection).
#[derive(Clone, Debug)]
struct Connector {
    client: Client<Https, SdkBody>,
    head_timeout: Option<Duration>,
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let (client, head_timeout) = (self.client.clone(), self.head_timeout);
        HttpConnectorFuture::new(async move {
            let request = request
                .try_into_http1x()
                .map_err(|err| ConnectorError::user(err.into()))?;
            let sent = client.request(request);
            let response = match head_timeout {
                Some(limit) => tokio::time::timeout(limit, sent)
                    .await
                    .map_err(|elapsed| ConnectorError::timeout(elapsed.into()))?,
                None => sent.await,
            };
            // Connection failures and broken answers alike are worth another attempt.
            let response = response.map_err(|err| ConnectorError::io(err.into()))?;
            HttpResponse::try_from(response.map(SdkBody::from_body_1_x))
                .map_err(|err| ConnectorError::other(err.into(), None))
        })
    }
}

impl HttpClient for UnverifiedClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _: &RuntimeComponents,
    ) -> SharedHttpConnector {
        let head_timeout = match (settings.connect_timeout(), settings.read_timeout()) {
            (None, None) => None,
            (connect, read) => Some(connect.unwrap_or_default() + read.unwrap_or_default()),
        };
        SharedHttpConnector::new(Connector {
            client: self.0.clone(),
            head_timeout,
        })
    }
}

/// An HTTP(S) client for the SDK that does not check server certificates.
pub(crate) fn client() -> SharedHttpClient {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(super::tls::client_config(None, true))
        .https_or_http()
        .enable_http1()
        .build();
    SharedHttpClient::new(UnverifiedClient(
        Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .build(https),
    ))
}
