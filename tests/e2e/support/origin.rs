//! A near-free S3 origin: it answers ListObjectsV2, HEAD, GetBucketVersioning and ranged GETs
//! of generated objects from memory, checks no signature, and so spends next to no CPU on a
//! request. `benches/origin.rs` runs it for client-cost runs; the suite runs it in-process where
//! a test needs hundreds of thousands of objects at once (the in-process s3s server keeps them
//! as files). A set `NAME=COUNTxSIZE` is bucket `bench`, keys `NAME/f000000.bin`… (with
//! `dNNNN/` directories of 1,000 files when COUNT > 1,000). Object bytes are a 1 MiB random
//! block read cyclically from an offset that depends on the object, so bodies are slices of one
//! shared buffer: no copy and no disk. The ETag is derived from the key and size, so it is
//! stable across runs.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

pub const BUCKET: &str = "bench";
const BLOCK: usize = 1 << 20;
const PER_DIR: u64 = 1000;
const LAST_MODIFIED: &str = "Tue, 01 Dec 2026 00:00:00 GMT";
const LAST_MODIFIED_ISO: &str = "2026-12-01T00:00:00.000Z";

/// `COUNT` objects of `SIZE` bytes under `NAME/`.
pub struct Set {
    name: String,
    count: u64,
    size: u64,
    digits: usize,
}

impl Set {
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (name, shape) = spec.split_once('=').ok_or("expected NAME=COUNTxSIZE")?;
        let (count, size) = shape.split_once('x').ok_or("expected NAME=COUNTxSIZE")?;
        let count: u64 = count.parse().map_err(|e| format!("count {count:?}: {e}"))?;
        let size = size.parse().map_err(|e| format!("size {size:?}: {e}"))?;
        if name.is_empty() || name.contains('/') || count == 0 {
            return Err(format!("bad set {spec:?}"));
        }
        let digits = (count - 1).to_string().len().max(6);
        Ok(Self {
            name: name.to_string(),
            count,
            size,
            digits,
        })
    }

    fn key(&self, index: u64) -> String {
        let file = format!("f{index:0width$}.bin", width = self.digits);
        match self.count > PER_DIR {
            true => format!("{}/d{:04}/{file}", self.name, index / PER_DIR),
            false => format!("{}/{file}", self.name),
        }
    }

    /// The object a key names, if it is one of this set's.
    fn index_of(&self, key: &str) -> Option<u64> {
        let rest = key.strip_prefix(&self.name)?.strip_prefix('/')?;
        let file = rest.rsplit('/').next()?;
        let index: u64 = file.strip_prefix('f')?.strip_suffix(".bin")?.parse().ok()?;
        (index < self.count && self.key(index) == key).then_some(index)
    }

    /// The first index whose key is not `before` (keys grow with the index).
    fn first_not(&self, before: impl Fn(&str) -> bool) -> u64 {
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let mid = low + (high - low) / 2;
            match before(&self.key(mid)) {
                true => low = mid + 1,
                false => high = mid,
            }
        }
        low
    }

    fn etag(&self, index: u64) -> String {
        let digest = blake3::hash(format!("{}\0{}", self.key(index), self.size).as_bytes());
        format!("\"{}\"", &digest.to_hex()[..32])
    }
}

pub struct Origin {
    /// Sorted by `NAME/`, so walking them in order lists keys in order.
    sets: Vec<Set>,
}

impl Origin {
    /// An origin serving `sets`.
    pub fn new(mut sets: Vec<Set>) -> Self {
        sets.sort_by_key(|set| format!("{}/", set.name)); // the order of their keys
        Self { sets }
    }

    pub fn object(&self, key: &str) -> Option<(&Set, u64)> {
        self.sets
            .iter()
            .find_map(|set| Some((set, set.index_of(key)?)))
    }

    pub fn list(
        &self,
        prefix: &str,
        after: &str,
        max_keys: usize,
    ) -> (Vec<(String, &Set, u64)>, bool) {
        let mut listed = Vec::new();
        for set in &self.sets {
            let set_prefix = format!("{}/", set.name);
            if !(set_prefix.starts_with(prefix) || prefix.starts_with(&set_prefix)) {
                continue;
            }
            let past_token = set.first_not(|key| key <= after);
            let in_prefix = set.first_not(|key| key < prefix);
            let start = past_token.max(in_prefix);
            for index in start..set.count {
                let key = set.key(index);
                if !key.starts_with(prefix) {
                    break;
                }
                if listed.len() == max_keys {
                    return (listed, true);
                }
                listed.push((key, set, index));
            }
        }
        (listed, false)
    }
}

/// `bytes` of object `index`'s content from `offset`, as slices of the shared block.
struct ObjectBody {
    block: Bytes,
    position: usize,
    left: u64,
}

impl ObjectBody {
    fn new(index: u64, offset: u64, len: u64) -> Self {
        let shift = index.wrapping_mul(7919) as usize;
        Self {
            block: block().clone(),
            position: (shift + offset as usize) % BLOCK,
            left: len,
        }
    }
}

impl Body for ObjectBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let take = (BLOCK - self.position).min(self.left.min(BLOCK as u64) as usize);
        let chunk = self.block.slice(self.position..self.position + take);
        self.position = (self.position + take) % BLOCK;
        self.left -= take as u64;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

fn block() -> &'static Bytes {
    static BLOCK_BYTES: OnceLock<Bytes> = OnceLock::new();
    BLOCK_BYTES.get_or_init(|| {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        Bytes::from((0..BLOCK).map(|_| rng.u8(..)).collect::<Vec<u8>>())
    })
}

type Answer = Response<http_body_util::Either<Full<Bytes>, ObjectBody>>;

fn small(status: StatusCode, body: String) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", "application/xml")
        .body(http_body_util::Either::Left(Full::new(Bytes::from(body))))
        .expect("response")
}

fn error(status: StatusCode, code: &str) -> Answer {
    small(
        status,
        format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code></Error>"),
    )
}

fn query_value(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| decode(v))
    })
}

/// Percent-decoding of a path or query value (the generated keys need nothing more).
pub fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match (bytes[i], escaped) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn list_answer(origin: &Origin, query: &str) -> Answer {
    let prefix = query_value(query, "prefix").unwrap_or_default();
    let token = query_value(query, "continuation-token");
    let after = token
        .clone()
        .or_else(|| query_value(query, "start-after"))
        .unwrap_or_default();
    let max_keys = query_value(query, "max-keys")
        .and_then(|m| m.parse().ok())
        .unwrap_or(1000usize)
        .min(1000);
    let (listed, truncated) = origin.list(&prefix, &after, max_keys);
    let mut xml = String::with_capacity(300 * listed.len() + 400);
    let _ = write!(
        xml,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
         <ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
         <Name>{BUCKET}</Name><Prefix>{prefix}</Prefix><KeyCount>{}</KeyCount>\
         <MaxKeys>{max_keys}</MaxKeys><IsTruncated>{truncated}</IsTruncated>",
        listed.len()
    );
    if let Some(token) = &token {
        let _ = write!(xml, "<ContinuationToken>{token}</ContinuationToken>");
    }
    if truncated {
        let last = &listed.last().expect("a truncated page lists something").0;
        let _ = write!(xml, "<NextContinuationToken>{last}</NextContinuationToken>");
    }
    for (key, set, index) in &listed {
        let _ = write!(
            xml,
            "<Contents><Key>{key}</Key><LastModified>{LAST_MODIFIED_ISO}</LastModified>\
             <ETag>{}</ETag><Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
            set.etag(*index).replace('"', "&quot;"),
            set.size
        );
    }
    xml.push_str("</ListBucketResult>");
    small(StatusCode::OK, xml)
}

/// `bytes=A-B`, `bytes=A-` or `bytes=-N` against an object of `size` bytes.
pub fn parse_range(header: &str, size: u64) -> Option<(u64, u64)> {
    let spec = header.strip_prefix("bytes=")?;
    let (first, last) = spec.split_once('-')?;
    let (first, last) = match (first, last) {
        ("", n) => (size.checked_sub(n.parse().ok()?)?, size - 1),
        (a, "") => (a.parse().ok()?, size - 1),
        (a, b) => (a.parse().ok()?, b.parse::<u64>().ok()?.min(size - 1)),
    };
    (first <= last && last < size).then_some((first, last))
}

fn object_answer(origin: &Origin, req: &Request<Incoming>, key: &str) -> Answer {
    let Some((set, index)) = origin.object(key) else {
        return error(StatusCode::NOT_FOUND, "NoSuchKey");
    };
    let etag = set.etag(index);
    if let Some(wanted) = req.headers().get("if-match").and_then(|v| v.to_str().ok()) {
        if wanted != etag && wanted != "*" {
            return error(StatusCode::PRECONDITION_FAILED, "PreconditionFailed");
        }
    }
    let range = req.headers().get("range").and_then(|v| v.to_str().ok());
    let (status, first, last) = match range {
        Some(header) => match parse_range(header, set.size) {
            Some((first, last)) => (StatusCode::PARTIAL_CONTENT, first, last),
            None => return error(StatusCode::RANGE_NOT_SATISFIABLE, "InvalidRange"),
        },
        None => (StatusCode::OK, 0, set.size.wrapping_sub(1)),
    };
    let len = if set.size == 0 { 0 } else { last - first + 1 };
    let mut answer = Response::builder()
        .status(status)
        .header("etag", &etag)
        .header("last-modified", LAST_MODIFIED)
        .header("accept-ranges", "bytes")
        .header("content-type", "application/octet-stream")
        .header("content-length", len);
    if status == StatusCode::PARTIAL_CONTENT {
        answer = answer.header(
            "content-range",
            format!("bytes {first}-{last}/{}", set.size),
        );
    }
    let body = match req.method() == Method::HEAD {
        true => ObjectBody::new(index, 0, 0),
        false => ObjectBody::new(index, first, len),
    };
    answer
        .body(http_body_util::Either::Right(body))
        .expect("response")
}

fn answer(origin: &Origin, req: &Request<Incoming>) -> Answer {
    let path = decode(req.uri().path());
    let query = req.uri().query().unwrap_or("");
    let Some(rest) = path.strip_prefix('/').and_then(|p| p.strip_prefix(BUCKET)) else {
        return error(StatusCode::NOT_FOUND, "NoSuchBucket");
    };
    match (req.method(), rest.strip_prefix('/').unwrap_or(rest)) {
        (&Method::GET, "") if query_value(query, "versioning").is_some() => small(
            StatusCode::OK,
            "<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"/>".into(),
        ),
        (&Method::GET, "") if query_value(query, "list-type").as_deref() == Some("2") => {
            list_answer(origin, query)
        }
        (&Method::HEAD, "") | (&Method::GET, "") => small(StatusCode::OK, String::new()),
        (&Method::GET | &Method::HEAD, key) => object_answer(origin, req, key),
        _ => error(StatusCode::NOT_IMPLEMENTED, "NotImplemented"),
    }
}

/// Answers S3 requests for `origin` on `listener`'s connections, over TLS with `tls`.
pub async fn serve(
    origin: Arc<Origin>,
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (origin, tls) = (origin.clone(), tls.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let answer = answer(&origin, &req);
                async move { Ok::<_, Infallible>(answer) }
            });
            let http = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .clone();
            let _ = match tls {
                None => http.serve_connection(TokioIo::new(stream), service).await,
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => http.serve_connection(TokioIo::new(stream), service).await,
                    Err(_) => return, // the client refused the certificate
                },
            };
        });
    }
}
