//! A fault injector around the in-process s3s server: each request is matched against scripted
//! rules that answer with an error status, drop the connection, cut or stall the body, replace
//! the object first, or add entries to a listing. It also enforces `If-Match` on GET, which
//! s3s-fs ignores, answering 412 with an empty body as Garage does.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response, StatusCode};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a matching request gets.
#[derive(Clone, Debug)]
pub enum Fault {
    /// An S3 error response with this status and code (e.g. 503 SlowDown).
    Status(u16, &'static str),
    /// The connection is closed without an answer.
    DropConnection,
    /// The body ends with a broken connection after this many bytes.
    TruncateBody(usize),
    /// The body stops for this long after this many bytes.
    StallBody(usize, Duration),
    /// The byte at this offset of the body is flipped in transit.
    CorruptBody(usize),
    /// The object is overwritten with these bytes, then the request is served.
    ReplaceObject(Vec<u8>),
    /// These `(key, size)` entries are added to the listing page.
    InjectListing(Vec<(String, u64)>),
    /// The listing page says it is truncated but gives no continuation token.
    TruncatedWithoutToken,
    /// Every listing page says it continues with the same token, and a request with that token
    /// gets the first page again: a listing that loops.
    LoopingToken,
    /// The `Range` header is dropped: the whole object comes back with 200 instead of 206.
    IgnoreRange,
    /// The response claims this `Content-Range`, whatever was asked.
    LieContentRange(&'static str),
    /// The body trickles: this many bytes, then a pause of this long, and again (slow loris).
    TrickleBody(usize, Duration),
    /// Every listing gives every object a new, random ETag.
    RandomListingEtags,
    /// The first key of the listing page starts with a byte that is not UTF-8.
    InvalidUtf8Key,
}

/// Which requests a rule applies to.
#[derive(Clone, Debug)]
pub struct Rule {
    pub method: &'static str,
    /// Substring of the decoded request path (`/bucket/key`); empty matches all.
    pub path_contains: String,
    /// Only requests with a `Range` header.
    pub ranged_only: bool,
    /// Only requests whose `Range` starts at or after this byte.
    pub range_from: Option<u64>,
    /// Only requests with this query parameter (e.g. `continuation-token`).
    pub query_contains: Option<&'static str>,
    /// Matching requests let through before the fault starts.
    pub skip: usize,
    /// Matching requests that get the fault (usize::MAX: all).
    pub times: usize,
    pub fault: Fault,
}

impl Rule {
    pub fn get(path_contains: &str, fault: Fault) -> Self {
        Self {
            method: "GET",
            path_contains: path_contains.to_string(),
            ranged_only: true,
            range_from: None,
            query_contains: None,
            skip: 0,
            times: 1,
            fault,
        }
    }

    pub fn listing(fault: Fault) -> Self {
        Self {
            ranged_only: false,
            query_contains: Some("list-type=2"),
            ..Self::get("", fault)
        }
    }

    pub fn times(mut self, times: usize) -> Self {
        self.times = times;
        self
    }

    pub fn skip(mut self, skip: usize) -> Self {
        self.skip = skip;
        self
    }

    /// Only GETs of the bytes from `start` on.
    pub fn ranges_from(mut self, start: u64) -> Self {
        self.range_from = Some(start);
        self
    }
}

/// The scripted rules, a count of faults served, and traffic counters.
#[derive(Default)]
pub struct Faults {
    rules: Mutex<VecDeque<(Rule, usize, usize)>>,
    served: Mutex<usize>,
    /// Every request received.
    pub requests: AtomicU64,
    /// Bytes of object bodies sent in answer to GETs.
    pub object_bytes: Arc<AtomicU64>,
    /// Act as a versioned bucket: each object's only version is `v` + its ETag.
    pub versioned: AtomicBool,
    /// GETs that asked for a specific version.
    pub versioned_gets: AtomicU64,
    /// Requests by kind: object GETs, one-byte GETs (`Range: bytes=0-0`, a dfdaemon's stat of
    /// a presigned URL), HEADs and listings.
    pub object_gets: AtomicU64,
    pub stat_gets: AtomicU64,
    pub heads: AtomicU64,
    pub lists: AtomicU64,
}

impl Faults {
    pub fn add(&self, rule: Rule) {
        self.rules.lock().unwrap().push_back((rule, 0, 0));
    }

    /// Drops every rule.
    pub fn clear(&self) {
        self.rules.lock().unwrap().clear();
    }

    pub fn served(&self) -> usize {
        *self.served.lock().unwrap()
    }

    fn take(&self, method: &str, path: &str, query: &str, range: Option<u64>) -> Option<Fault> {
        let ranged = range.is_some();
        let mut rules = self.rules.lock().unwrap();
        for (rule, seen, fired) in rules.iter_mut() {
            let matches = rule.method == method
                && path.contains(&rule.path_contains)
                && (!rule.ranged_only || ranged)
                && rule
                    .range_from
                    .is_none_or(|from| range.is_some_and(|at| at >= from))
                && rule.query_contains.is_none_or(|q| query.contains(q));
            if !matches || *fired >= rule.times {
                continue;
            }
            *seen += 1;
            if *seen <= rule.skip {
                continue;
            }
            *fired += 1;
            *self.served.lock().unwrap() += 1;
            return Some(rule.fault.clone());
        }
        None
    }
}

/// The s3s service with faults in front of it.
#[derive(Clone)]
pub struct FaultyS3 {
    pub inner: s3s::service::S3Service,
    pub faults: Arc<Faults>,
    /// Client of this same server, used to replace objects.
    pub client: Arc<Mutex<Option<aws_sdk_s3::Client>>>,
}

impl hyper::service::Service<Request<Incoming>> for FaultyS3 {
    type Response = Response<FaultBody>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.handle(req).await })
    }
}

impl FaultyS3 {
    async fn handle(self, req: Request<Incoming>) -> Result<Response<FaultBody>, BoxError> {
        self.faults.requests.fetch_add(1, Relaxed);
        let method = req.method().as_str().to_string();
        let path = percent_decode(req.uri().path());
        let query = req.uri().query().unwrap_or("").to_string();
        // Object GETs only (`/bucket/key`): not listings or bucket settings.
        let is_object = path
            .trim_start_matches('/')
            .split_once('/')
            .is_some_and(|(_, key)| !key.is_empty());
        let counter = (method == "GET" && is_object).then(|| self.faults.object_bytes.clone());
        let range = req.headers().get("range").and_then(|v| v.to_str().ok());
        // The first byte a `Range: bytes=N-M` asks for.
        let range_start = req.headers().get("range").map(|_| {
            let first = range.unwrap_or_default().trim_start_matches("bytes=");
            first
                .split('-')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        });
        let kind = match (method.as_str(), is_object) {
            ("GET", true) if range == Some("bytes=0-0") => Some(&self.faults.stat_gets),
            ("GET", true) => Some(&self.faults.object_gets),
            ("HEAD", _) => Some(&self.faults.heads),
            ("GET", false) if query.contains("list-type") => Some(&self.faults.lists),
            _ => None,
        };
        if let Some(kind) = kind {
            kind.fetch_add(1, Relaxed);
        }
        let if_match = req
            .headers()
            .get("if-match")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if self.faults.versioned.load(Relaxed) && method == "GET" && has_param(&query, "versions") {
            return self.list_versions(&path, &query).await;
        }
        let wanted_version = param(&query, "versionId").map(str::to_string);
        if wanted_version.is_some() && method == "GET" {
            self.faults.versioned_gets.fetch_add(1, Relaxed);
        }
        let fault = self.faults.take(&method, &path, &query, range_start);
        let mut body_fault = None;
        match fault {
            Some(Fault::Status(status, code)) => return Ok(error_response(status, code)),
            Some(Fault::DropConnection) => return Err("fault: connection dropped".into()),
            Some(Fault::ReplaceObject(data)) => self.replace(&path, data).await?,
            Some(
                f @ (Fault::TruncateBody(_)
                | Fault::StallBody(..)
                | Fault::CorruptBody(_)
                | Fault::InjectListing(_)
                | Fault::TruncatedWithoutToken
                | Fault::LieContentRange(_)
                | Fault::TrickleBody(..)
                | Fault::RandomListingEtags
                | Fault::InvalidUtf8Key),
            ) => body_fault = Some(f),
            // The request is signed, so it cannot be changed: the whole object is fetched anew.
            Some(Fault::IgnoreRange) => return self.whole_object(&path, counter).await,
            // s3s-fs continues after the token as if it were a key: "again" sorts before every
            // test key, so the first page comes back.
            Some(f @ Fault::LoopingToken) => body_fault = Some(f),
            None => {}
        }
        let response = self.inner.call(req.map(s3s::Body::from)).await?;
        if let (Some(expected), "GET" | "HEAD") = (&if_match, method.as_str()) {
            let etag = response.headers().get("etag").and_then(|v| v.to_str().ok());
            if response.status().is_success() && etag != Some(expected.as_str()) {
                let mut refused = Response::new(FaultBody::full(Bytes::new()));
                *refused.status_mut() = StatusCode::PRECONDITION_FAILED;
                return Ok(refused);
            }
        }
        if let Some(wanted) = wanted_version {
            let etag = response.headers().get("etag").and_then(|v| v.to_str().ok());
            if response.status().is_success() && etag.map(version_of) != Some(wanted) {
                return Ok(error_response(404, "NoSuchVersion"));
            }
        }
        let (mut parts, body) = response.into_parts();
        let listing = method == "GET" && query.contains("list-type=2") && parts.status.is_success();
        let body = match body_fault {
            _ if listing => {
                let bytes = http_body_util::BodyExt::collect(body).await?.to_bytes();
                let mut xml = self
                    .add_etags(&path, &String::from_utf8_lossy(&bytes))
                    .await?;
                match &body_fault {
                    Some(Fault::InjectListing(extra)) => xml = inject_listing(&xml, extra),
                    Some(Fault::TruncatedWithoutToken) => {
                        xml = xml.replace(
                            "<IsTruncated>false</IsTruncated>",
                            "<IsTruncated>true</IsTruncated>",
                        )
                    }
                    Some(Fault::RandomListingEtags) => {
                        let mut pieces = xml.split("<ETag>");
                        let mut out = pieces.next().unwrap_or_default().to_string();
                        for piece in pieces {
                            let rest = piece.split_once("</ETag>").map_or("", |(_, r)| r);
                            out += &format!(
                                "<ETag>&quot;{:032x}&quot;</ETag>{rest}",
                                fastrand::u128(..)
                            );
                        }
                        xml = out;
                    }
                    Some(Fault::LoopingToken) => {
                        xml = xml
                            .replace(
                                "<IsTruncated>false</IsTruncated>",
                                "<IsTruncated>true</IsTruncated>",
                            )
                            .replace(
                                "</ListBucketResult>",
                                "<NextContinuationToken>again</NextContinuationToken></ListBucketResult>",
                            )
                    }
                    _ => {}
                }
                parts.headers.remove("content-length");
                let mut bytes = xml.into_bytes();
                if let Some(Fault::InvalidUtf8Key) = body_fault {
                    if let Some(at) = bytes.windows(5).position(|w| w == b"<Key>") {
                        bytes.insert(at + 5, 0xff);
                    }
                }
                FaultBody::full(Bytes::from(bytes))
            }
            Some(Fault::LieContentRange(range)) => {
                parts.headers.insert(
                    "content-range",
                    hyper::header::HeaderValue::from_static(range),
                );
                FaultBody::wrap(body, usize::MAX, None, counter)
            }
            Some(Fault::TrickleBody(bytes, pause)) => {
                let mut body = FaultBody::wrap(body, usize::MAX, None, counter);
                body.trickle = Some((bytes, pause));
                body
            }
            Some(Fault::TruncateBody(after)) => FaultBody::wrap(body, after, None, counter),
            Some(Fault::StallBody(after, pause)) => {
                FaultBody::wrap(body, after, Some(pause), counter)
            }
            Some(Fault::CorruptBody(at)) => {
                let mut body = FaultBody::wrap(body, usize::MAX, None, counter);
                body.flip_at = Some(at);
                body
            }
            _ => FaultBody::wrap(body, usize::MAX, None, counter),
        };
        Ok(Response::from_parts(parts, body))
    }

    /// s3s-fs lists objects without their ETags; S3 servers list them, and hydrator pins every
    /// GET to the listed ETag, so the listing gets them from a HEAD of each object.
    async fn add_etags(&self, path: &str, xml: &str) -> Result<String, BoxError> {
        let bucket = path.trim_matches('/');
        let client = self.client.lock().unwrap().clone().ok_or("no client")?;
        let mut chunks = xml.split("<Contents>");
        let mut out = chunks.next().unwrap_or_default().to_string();
        for chunk in chunks {
            out.push_str("<Contents>");
            let key = chunk
                .split("<Key>")
                .nth(1)
                .and_then(|k| k.split("</Key>").next());
            match key {
                Some(key) if !chunk.contains("<ETag>") => {
                    let unescaped = key
                        .replace("&lt;", "<")
                        .replace("&gt;", ">")
                        .replace("&quot;", "\"")
                        .replace("&amp;", "&");
                    let head = client
                        .head_object()
                        .bucket(bucket)
                        .key(unescaped)
                        .send()
                        .await?;
                    let etag = head.e_tag().unwrap_or_default().replace('"', "&quot;");
                    out.push_str(&chunk.replacen(
                        "</Key>",
                        &format!("</Key><ETag>{etag}</ETag>"),
                        1,
                    ));
                }
                _ => out.push_str(chunk),
            }
        }
        Ok(out)
    }

    /// ListObjectVersions, answered from a ListObjectsV2 of the same prefix.
    async fn list_versions(
        &self,
        path: &str,
        query: &str,
    ) -> Result<Response<FaultBody>, BoxError> {
        let bucket = path.trim_matches('/');
        let prefix = percent_decode(param(query, "prefix").unwrap_or(""));
        let client = self.client.lock().unwrap().clone().ok_or("no client")?;
        let listing = client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(&prefix)
            .send()
            .await?;
        let mut xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListVersionsResult><Name>{bucket}</Name>\
             <Prefix>{prefix}</Prefix><IsTruncated>false</IsTruncated>"
        );
        for object in listing.contents() {
            let etag = object.e_tag().unwrap_or_default();
            xml.push_str(&format!(
                "<Version><Key>{}</Key><VersionId>{}</VersionId><IsLatest>true</IsLatest>\
                 <LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>{}</ETag><Size>{}</Size>\
                 <StorageClass>STANDARD</StorageClass></Version>",
                object.key().unwrap_or_default(),
                version_of(etag),
                etag.replace('"', "&quot;"),
                object.size().unwrap_or(0)
            ));
        }
        xml.push_str("</ListVersionsResult>");
        Ok(xml_response(xml))
    }

    /// A 200 answer with the whole object, as a server that ignores `Range` sends.
    async fn whole_object(
        &self,
        path: &str,
        counter: Option<Arc<AtomicU64>>,
    ) -> Result<Response<FaultBody>, BoxError> {
        let (bucket, key) = path
            .trim_start_matches('/')
            .split_once('/')
            .ok_or("no key")?;
        let client = self.client.lock().unwrap().clone().ok_or("no client")?;
        let object = client.get_object().bucket(bucket).key(key).send().await?;
        let etag = object.e_tag().unwrap_or_default().to_string();
        let data = object.body.collect().await?.into_bytes();
        if let Some(counter) = counter {
            counter.fetch_add(data.len() as u64, Relaxed);
        }
        let mut response = Response::new(FaultBody::full(data));
        response
            .headers_mut()
            .insert("etag", hyper::header::HeaderValue::from_str(&etag)?);
        Ok(response)
    }

    async fn replace(&self, path: &str, data: Vec<u8>) -> Result<(), BoxError> {
        let (bucket, key) = path
            .trim_start_matches('/')
            .split_once('/')
            .ok_or("no key")?;
        let client = self
            .client
            .lock()
            .unwrap()
            .clone()
            .ok_or("no client to replace with")?;
        client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(data.into())
            .send()
            .await?;
        Ok(())
    }
}

/// The version id the emulated versioned bucket gives an object with this ETag.
fn version_of(etag: &str) -> String {
    format!("v{}", etag.trim_matches('"'))
}

fn param<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

fn has_param(query: &str, name: &str) -> bool {
    param(query, name).is_some()
}

fn xml_response(xml: String) -> Response<FaultBody> {
    Response::new(FaultBody::full(Bytes::from(xml)))
}

fn error_response(status: u16, code: &str) -> Response<FaultBody> {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected fault</Message></Error>"
    );
    let mut response = Response::new(FaultBody::full(Bytes::from(xml)));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
}

/// Adds `extra` entries to a listing page, keeping the keys in order as S3 lists them.
fn inject_listing(xml: &str, extra: &[(String, u64)]) -> String {
    let unescape = |k: &str| {
        k.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    };
    let mut entries: Vec<(String, String)> = extra
        .iter()
        .map(|(key, size)| {
            let escaped = key
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            let entry = format!(
                "<Contents><Key>{escaped}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>\
                 <ETag>\"00000000000000000000000000000000\"</ETag><Size>{size}</Size>\
                 <StorageClass>STANDARD</StorageClass></Contents>"
            );
            (key.clone(), entry)
        })
        .collect();
    let start = xml
        .find("<Contents>")
        .or_else(|| xml.find("</ListBucketResult>"))
        .expect("a listing");
    let (head, mut rest) = xml.split_at(start);
    while rest.starts_with("<Contents>") {
        let end = rest.find("</Contents>").expect("closed Contents") + "</Contents>".len();
        let entry = &rest[..end];
        let key = entry
            .split("<Key>")
            .nth(1)
            .and_then(|k| k.split("</Key>").next())
            .unwrap_or_default();
        entries.push((unescape(key), entry.to_string()));
        rest = &rest[end..];
    }
    entries.sort();
    let blocks: String = entries.into_iter().map(|(_, entry)| entry).collect();
    format!("{head}{blocks}{rest}")
}

fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&path[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A response body that may end early with an error or pause midway.
pub struct FaultBody {
    inner: Option<s3s::Body>,
    full: Option<Bytes>,
    remaining: usize,
    stall: Option<Duration>,
    sleeping: Option<Pin<Box<tokio::time::Sleep>>>,
    counter: Option<Arc<AtomicU64>>,
    /// Offset of a byte to flip, and how many bytes went by so far.
    flip_at: Option<usize>,
    position: usize,
    /// Bytes per frame and the pause after each, with what is left of the last inner frame.
    trickle: Option<(usize, Duration)>,
    pending: Bytes,
}

impl FaultBody {
    fn full(bytes: Bytes) -> Self {
        Self {
            inner: None,
            full: Some(bytes),
            remaining: usize::MAX,
            stall: None,
            sleeping: None,
            counter: None,
            flip_at: None,
            position: 0,
            trickle: None,
            pending: Bytes::new(),
        }
    }

    fn wrap(
        body: s3s::Body,
        after: usize,
        stall: Option<Duration>,
        counter: Option<Arc<AtomicU64>>,
    ) -> Self {
        Self {
            inner: Some(body),
            full: None,
            remaining: after,
            stall,
            sleeping: None,
            counter,
            flip_at: None,
            position: 0,
            trickle: None,
            pending: Bytes::new(),
        }
    }
}

impl Body for FaultBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(bytes) = this.full.take() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        if this.remaining == 0 {
            match this.stall.take() {
                None => return Poll::Ready(Some(Err("fault: body cut short".into()))),
                Some(pause) => {
                    this.sleeping = Some(Box::pin(tokio::time::sleep(pause)));
                    this.remaining = usize::MAX;
                }
            }
        }
        if let Some(sleep) = &mut this.sleeping {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.sleeping = None;
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some((per_frame, pause)) = this.trickle {
            while this.pending.is_empty() {
                match Pin::new(&mut *inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        this.pending = frame.into_data().unwrap_or_default();
                    }
                    other => return other,
                }
            }
            let data = this.pending.split_to(per_frame.min(this.pending.len()));
            if let Some(counter) = &this.counter {
                counter.fetch_add(data.len() as u64, Relaxed);
            }
            this.sleeping = Some(Box::pin(tokio::time::sleep(pause)));
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(mut data) = frame.into_data() else {
                    return Poll::Ready(None);
                };
                if data.len() > this.remaining {
                    data.truncate(this.remaining);
                }
                if this.remaining != usize::MAX {
                    this.remaining -= data.len();
                }
                if let Some(at) = this
                    .flip_at
                    .filter(|at| (this.position..this.position + data.len()).contains(at))
                {
                    let mut flipped = data.to_vec();
                    flipped[at - this.position] ^= 0x01;
                    data = Bytes::from(flipped);
                }
                this.position += data.len();
                if let Some(counter) = &this.counter {
                    counter.fetch_add(data.len() as u64, Relaxed);
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
