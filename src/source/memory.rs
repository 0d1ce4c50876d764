//! An in-memory [`ObjectSource`] with scripted faults, for the engine's unit tests: what a
//! misbehaving server does, one request at a time, with every request logged.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};

use super::checksum::{Algorithm, FullObjectChecksum};
use super::list::ObjectEntry;
use super::object_source::{Body, GetResponse, ListPage, ObjectHead, ObjectRef, ObjectSource};
use crate::error::{BoxError, HttpAnswer, SourceError, SourceErrorKind};

/// Bytes per body chunk.
const CHUNK: usize = 64 << 10;

/// What the next GET of a key does instead of answering plainly.
#[derive(Clone, Debug)]
pub(crate) enum Fault {
    /// Answers an HTTP error.
    Status(u16, &'static str),
    /// Sends the headers and this many bytes of the body, then breaks the connection.
    CutAfter(usize),
    /// Claims in `Content-Range` to send the range asked for less its first byte.
    ShiftedContentRange,
    /// Sends this many bytes past the range asked for, announcing no `Content-Length`.
    Longer(usize),
    /// The object is overwritten with these bytes just before the GET is answered.
    Overwrite(Bytes),
}

/// A request the source answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    List,
    Head(String),
    Get(String, Range<u64>),
}

struct Object {
    data: Bytes,
    etag: String,
    generation: u32,
}

#[derive(Default)]
pub(crate) struct MemorySource {
    objects: Mutex<BTreeMap<String, Object>>,
    /// Faults by key, used up in order by that key's GETs.
    faults: Mutex<Vec<(String, Fault)>>,
    log: Mutex<Vec<Request>>,
    /// HEAD answers a full-object CRC64NVME (as AWS and Garage keep).
    with_checksums: bool,
}

impl MemorySource {
    pub(crate) fn new(with_checksums: bool) -> Self {
        Self {
            with_checksums,
            ..Self::default()
        }
    }

    pub(crate) fn put(&self, key: &str, data: impl Into<Bytes>) {
        let mut objects = self.objects.lock().unwrap();
        let generation = objects.get(key).map_or(0, |o| o.generation + 1);
        objects.insert(
            key.to_string(),
            Object {
                data: data.into(),
                etag: format!("\"{key}-{generation}\""),
                generation,
            },
        );
    }

    pub(crate) fn fault(&self, key: &str, fault: Fault) {
        self.faults.lock().unwrap().push((key.to_string(), fault));
    }

    /// The requests answered so far.
    pub(crate) fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }

    fn next_fault(&self, key: &str) -> Option<Fault> {
        let mut faults = self.faults.lock().unwrap();
        let index = faults.iter().position(|(k, _)| k == key)?;
        Some(faults.remove(index).1)
    }

    /// The object's bytes and ETag, when it exists and matches `If-Match`.
    fn current(
        &self,
        object: &ObjectRef<'_>,
        request: &str,
    ) -> Result<(Bytes, String), SourceError> {
        let objects = self.objects.lock().unwrap();
        let found = objects
            .get(object.key)
            .ok_or_else(|| http_error(request, 404, "NoSuchKey"))?;
        if !object.etag.is_empty() && object.etag != found.etag {
            return Err(http_error(request, 412, "PreconditionFailed"));
        }
        Ok((found.data.clone(), found.etag.clone()))
    }
}

fn http_error(request: &str, status: u16, code: &str) -> SourceError {
    let answer = HttpAnswer {
        status,
        code: code.to_string(),
        message: String::new(),
    };
    let kind = match status {
        412 => SourceErrorKind::Changed,
        404 => SourceErrorKind::NotFound(answer),
        429 | 500..=599 => SourceErrorKind::Unavailable(answer),
        _ => SourceErrorKind::Refused(answer),
    };
    SourceError {
        request: request.to_string(),
        kind,
        cause: None,
    }
}

/// `data` in chunks, broken off after `cut` bytes when given.
fn body(data: Bytes, cut: Option<usize>) -> Body {
    let sent = data.slice(..cut.unwrap_or(data.len()).min(data.len()));
    let mut chunks: Vec<Result<Bytes, BoxError>> = (0..sent.len())
        .step_by(CHUNK)
        .map(|at| Ok(sent.slice(at..(at + CHUNK).min(sent.len()))))
        .collect();
    if cut.is_some() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        chunks.push(Err(Box::new(reset)));
    }
    let chunks = futures::stream::iter(chunks).map_err(std::io::Error::other);
    Box::pin(tokio_util::io::StreamReader::new(chunks))
}

impl ObjectSource for MemorySource {
    fn list_page<'a>(
        &'a self,
        _bucket: &'a str,
        prefix: &'a str,
        _continuation: Option<String>,
    ) -> BoxFuture<'a, Result<ListPage, SourceError>> {
        self.log.lock().unwrap().push(Request::List);
        let entries = self
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .map(|(key, object)| ObjectEntry {
                key: key.clone(),
                size: object.data.len() as u64,
                etag: object.etag.clone(),
                last_modified: None,
                version_id: None,
                sealed: None,
            })
            .collect();
        let page = ListPage {
            entries,
            truncated: false,
            continuation: None,
        };
        async move { Ok(page) }.boxed()
    }

    fn list_directories<'a>(
        &'a self,
        _bucket: &'a str,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, SourceError>> {
        self.log.lock().unwrap().push(Request::List);
        let objects = self.objects.lock().unwrap();
        let directories = (objects.keys())
            .filter_map(|key| key.strip_prefix(prefix))
            .filter_map(|rest| rest.split_once('/'))
            .map(|(name, _)| format!("{prefix}{name}/"))
            .collect::<std::collections::BTreeSet<_>>();
        let directories = directories.into_iter().collect();
        async move { Ok(directories) }.boxed()
    }

    fn head<'a>(
        &'a self,
        object: ObjectRef<'a>,
        _checksum: bool,
    ) -> BoxFuture<'a, Result<ObjectHead, SourceError>> {
        self.log
            .lock()
            .unwrap()
            .push(Request::Head(object.key.to_string()));
        let head = self
            .current(&object, &format!("HEAD {}", object.key))
            .map(|(data, etag)| ObjectHead {
                etag,
                size: data.len() as u64,
                last_modified: None,
                checksum: self.with_checksums.then(|| {
                    let mut crc = Algorithm::Crc64Nvme.digest();
                    crc.update(&data);
                    FullObjectChecksum {
                        algorithm: Algorithm::Crc64Nvme,
                        value: crc.finalize(),
                    }
                }),
            });
        async move { head }.boxed()
    }

    fn get<'a>(
        &'a self,
        object: ObjectRef<'a>,
        range: Range<u64>,
        whole: bool,
    ) -> BoxFuture<'a, Result<GetResponse, SourceError>> {
        let key = object.key.to_string();
        // Logged and faulted under one lock, so the first GET logged is the one faulted.
        let fault = {
            let mut log = self.log.lock().unwrap();
            log.push(Request::Get(key.clone(), range.clone()));
            self.next_fault(&key)
        };
        let request = format!("GET {key} {range:?}");
        if let Some(Fault::Overwrite(data)) = &fault {
            self.put(&key, data.clone());
        }
        let response = match fault {
            Some(Fault::Status(status, code)) => Err(http_error(&request, status, code)),
            _ => self.current(&object, &request).map(|(data, etag)| {
                let size = data.len() as u64;
                let shift = u64::from(matches!(fault, Some(Fault::ShiftedContentRange)));
                let cut = match fault {
                    Some(Fault::CutAfter(n)) => Some(n),
                    _ => None,
                };
                let mut sent = data.slice(range.start as usize..range.end as usize);
                let mut content_length = Some(sent.len() as i64);
                if let Some(Fault::Longer(extra)) = fault {
                    sent = [&sent[..], &vec![b'X'; extra]].concat().into();
                    content_length = None;
                }
                GetResponse {
                    etag: Some(etag),
                    content_range: (!whole).then(|| {
                        let (first, last) = (range.start + shift, range.end - 1);
                        format!("bytes {first}-{last}/{size}")
                    }),
                    content_length,
                    body: body(sent, cut),
                }
            }),
        };
        async move { response }.boxed()
    }
}
