//! An S3 server in-process: s3s with the s3s-fs filesystem backend, served over HTTP/1.1 on a
//! loopback port. The demo uses it as is; the tests wrap its service in a fault injector.

use std::error::Error as StdError;
use std::io;
use std::path::Path;

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::source::client::StaticCredentials;

type BoxError = Box<dyn StdError + Send + Sync>;

/// A running embedded server; it stops when dropped.
pub(crate) struct EmbeddedS3 {
    pub endpoint: String,
    pub credentials: StaticCredentials,
    task: JoinHandle<()>,
}

impl EmbeddedS3 {
    /// Serves the directory `root` (one subdirectory per bucket) on `127.0.0.1:<free port>`.
    pub(crate) async fn start(root: &Path) -> io::Result<Self> {
        let credentials = StaticCredentials {
            access_key: format!("demo{:016x}", fastrand::u64(..)),
            secret_key: format!("{:032x}", fastrand::u128(..)),
            session_token: None,
        };
        let service = s3_service(root, &credentials, None)?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let task = spawn_server(listener, service);
        Ok(Self {
            endpoint,
            credentials,
            task,
        })
    }
}

impl Drop for EmbeddedS3 {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The s3s service over `root`, accepting only `credentials`, and unsigned reads of
/// `public_bucket` if given (as an open-data bucket allows).
pub fn s3_service(
    root: &Path,
    credentials: &StaticCredentials,
    public_bucket: Option<&str>,
) -> io::Result<s3s::service::S3Service> {
    let fs = s3s_fs::FileSystem::new(root).map_err(|e| io::Error::other(format!("{e:?}")))?;
    let mut builder = s3s::service::S3ServiceBuilder::new(fs);
    builder.set_auth(s3s::auth::SimpleAuth::from_single(
        credentials.access_key.as_str(),
        credentials.secret_key.as_str(),
    ));
    builder.set_access(PublicRead {
        bucket: public_bucket.map(str::to_string),
    });
    Ok(builder.build())
}

/// Signed requests may do anything; unsigned ones may only read the public bucket.
struct PublicRead {
    bucket: Option<String>,
}

#[tonic::async_trait]
impl s3s::access::S3Access for PublicRead {
    async fn check(&self, cx: &mut s3s::access::S3AccessContext<'_>) -> s3s::S3Result<()> {
        if cx.credentials().is_some() {
            return Ok(());
        }
        let bucket = match cx.s3_path() {
            s3s::path::S3Path::Bucket { bucket } | s3s::path::S3Path::Object { bucket, .. } => {
                Some(&**bucket)
            }
            s3s::path::S3Path::Root => None,
        };
        let read = matches!(
            cx.s3_op().name(),
            "ListObjectsV2" | "ListObjects" | "HeadObject" | "GetObject" | "HeadBucket"
        );
        match read && bucket.is_some() && bucket == self.bucket.as_deref() {
            true => Ok(()),
            false => Err(s3s::s3_error!(
                AccessDenied,
                "Anonymous access is not allowed"
            )),
        }
    }
}

/// Accepts HTTP/1.1 connections on `listener` and serves each with a clone of `service`.
pub fn spawn_server<S, B>(listener: TcpListener, service: S) -> JoinHandle<()>
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let service = service.clone();
            tokio::spawn(async move {
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service);
                let _ = connection.await;
            });
        }
    })
}
