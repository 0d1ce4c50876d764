//! A proxy in front of a real server (MinIO) that does to one object's GETs what the fault
//! injector ([`super::faults`]) does on the in-process server: flips a byte of the body,
//! overwrites the object on the server just before the GET reaches it, or holds the GET back.
//! Requests pass through unchanged (signed for the Host they name, which the proxy keeps), so
//! the server answers them itself: with its own `If-Match`, ranges and checksums.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::{S3Target, Server};

/// What is done to a GET of the object.
#[derive(Clone)]
pub enum Action {
    /// The byte at this offset of the body (or its last byte) is flipped.
    Flip(usize),
    /// The object is overwritten with these bytes, then the GET goes on to the server.
    Replace(Vec<u8>),
    /// The GET reaches the server after this long.
    Hold(Duration),
}

/// `action` on the GETs of `key` after the first `skip`, `times` of them.
pub struct Rule {
    key: String,
    action: Action,
    skip: usize,
    times: usize,
}

impl Rule {
    pub fn get(key: &str, action: Action) -> Self {
        Self {
            key: key.to_string(),
            action,
            skip: 0,
            times: 1,
        }
    }

    pub fn skip(self, skip: usize) -> Self {
        Self { skip, ..self }
    }

    pub fn times(self, times: usize) -> Self {
        Self { times, ..self }
    }
}

/// The proxy; it serves until the server's runtime is dropped.
pub struct Tamper {
    /// The server's bucket and keys, reached through the proxy.
    pub target: S3Target,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: String,
    bucket: String,
    client: aws_sdk_s3::Client,
    rules: Mutex<Vec<Rule>>,
    applied: AtomicUsize,
}

impl Tamper {
    /// A proxy to `server`, on the server's runtime.
    pub fn start(server: &Server) -> Self {
        let listener = server
            .runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .unwrap();
        let mut target = server.target.clone();
        target.endpoint = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            upstream: server.target.endpoint.trim_start_matches("http://").into(),
            bucket: server.target.bucket.clone(),
            client: server.client.clone(),
            rules: Mutex::default(),
            applied: AtomicUsize::new(0),
        });
        server.runtime.spawn(serve(listener, shared.clone()));
        Self { target, shared }
    }

    pub fn add(&self, rule: Rule) {
        self.shared.rules.lock().unwrap().push(rule);
    }

    /// How many GETs a rule was applied to.
    pub fn applied(&self) -> usize {
        self.shared.applied.load(Relaxed)
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(shared.forward(req).await) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

impl Shared {
    /// The action for this request, if a rule takes it.
    fn action(&self, req: &Request<Incoming>) -> Option<(String, Action)> {
        if req.method() != Method::GET {
            return None;
        }
        let key = req
            .uri()
            .path()
            .strip_prefix(&format!("/{}/", self.bucket))?;
        let mut rules = self.rules.lock().unwrap();
        let rule = rules.iter_mut().find(|r| r.key == key && r.times > 0)?;
        if rule.skip > 0 {
            rule.skip -= 1;
            return None;
        }
        rule.times -= 1;
        self.applied.fetch_add(1, Relaxed);
        Some((key.to_string(), rule.action.clone()))
    }

    async fn forward(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let action = self.action(&req);
        match &action {
            Some((key, Action::Replace(data))) => {
                let put = self.client.put_object().bucket(&self.bucket).key(key);
                put.body(data.clone().into()).send().await.unwrap();
            }
            Some((_, Action::Hold(wait))) => tokio::time::sleep(*wait).await,
            _ => {}
        }
        let Ok((parts, mut body)) = self.send(req).await else {
            let mut failed = Response::new(Full::default());
            *failed.status_mut() = StatusCode::BAD_GATEWAY;
            return failed;
        };
        if let Some((_, Action::Flip(at))) = action {
            if parts.status.is_success() && !body.is_empty() {
                let at = at.min(body.len() - 1);
                body[at] ^= 1;
            }
        }
        Response::from_parts(parts, Full::new(body.into()))
    }

    /// `req` sent on to the server on a connection of its own; its answer, read whole.
    async fn send(
        &self,
        req: Request<Incoming>,
    ) -> Result<(hyper::http::response::Parts, Vec<u8>), Box<dyn std::error::Error + Send + Sync>>
    {
        let (parts, body) = req.into_parts();
        let body = body.collect().await?.to_bytes();
        let stream = tokio::net::TcpStream::connect(&self.upstream).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let answer = sender
            .send_request(Request::from_parts(parts, Full::new(body)))
            .await?;
        let (parts, body) = answer.into_parts();
        Ok((parts, body.collect().await?.to_bytes().to_vec()))
    }
}
