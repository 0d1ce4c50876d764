//! A stand-in for Dragonfly's `dfdaemon`, for the failure tests of the peer path: its
//! `DfdaemonDownload.DownloadTask` on a unix socket, from the protocol hydrator vendors. It
//! plays the whole peer network of one task: the first request for a task reads the presigned
//! URL from the store (as the back-to-source peer does), later ones for the same task (the
//! same URL without its signature, tag and application) get the copy it keeps, as a peer
//! would. It keeps each task's bytes in a file of its storage and hard-links that file to the
//! output path, as the dfdaemon does when its storage is on the output's filesystem. A mode
//! makes it fail, corrupt or cut short what it delivers, deliver a FIFO, or never answer. The
//! real dfdaemon is exercised by `tests/fleet.sh`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::Stream;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::dragonfly_api as proto;
use proto::common::v2::{Download, Piece};
use proto::dfdaemon::v2::dfdaemon_download_server::{DfdaemonDownload, DfdaemonDownloadServer};
use proto::dfdaemon::v2::download_task_response::Response as Answer;
use proto::dfdaemon::v2::{
    DownloadPieceFinishedResponse, DownloadTaskRequest, DownloadTaskResponse,
    DownloadTaskStartedResponse,
};

/// What the stand-in does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Delivers the task's bytes.
    Deliver,
    /// Delivers them with one byte flipped (a bad peer, a torn piece).
    Corrupt,
    /// Delivers all but the last byte, and says it finished.
    Short,
    /// Fails the call (its scheduler is unreachable and back-to-source is disabled).
    Fail,
    /// Makes a FIFO at the output path, and says it finished.
    Fifo,
    /// Takes the call and never answers it.
    Hang,
}

const PIECE: usize = 4 << 20;

#[derive(Default)]
struct State {
    mode: Mutex<Option<Mode>>,
    /// Every download asked for.
    requests: Mutex<Vec<Download>>,
    /// Each task's bytes, read from the store once, and the file of the storage holding them.
    tasks: Mutex<HashMap<String, (Bytes, PathBuf)>>,
    storage: PathBuf,
}

pub struct Dfdaemon {
    pub socket: PathBuf,
    /// Where the delivered tasks' files are kept (on `dir`'s filesystem).
    pub storage: PathBuf,
    state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl Dfdaemon {
    /// Listens on `dir/dfdaemon.sock`, delivering.
    pub fn start(dir: &Path) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let socket = dir.join("dfdaemon.sock");
        let storage = dir.join("dfdaemon-storage");
        std::fs::create_dir(&storage).unwrap();
        let state = Arc::new(State {
            storage: storage.clone(),
            ..State::default()
        });
        *state.mode.lock().unwrap() = Some(Mode::Deliver);
        let listener = {
            let _guard = runtime.enter();
            tokio::net::UnixListener::bind(&socket).unwrap()
        };
        let service = DfdaemonDownloadServer::new(Service {
            state: state.clone(),
        });
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
        Self {
            socket,
            storage,
            state,
            _runtime: runtime,
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = Some(mode);
    }

    /// The downloads asked for so far.
    pub fn requests(&self) -> Vec<Download> {
        self.state.requests.lock().unwrap().clone()
    }
}

struct Service {
    state: Arc<State>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<DownloadTaskResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DfdaemonDownload for Service {
    async fn download_task(
        &self,
        request: Request<DownloadTaskRequest>,
    ) -> Result<Response<Answers>, Status> {
        let download = (request.into_inner().download)
            .ok_or_else(|| Status::invalid_argument("no download"))?;
        self.state.requests.lock().unwrap().push(download.clone());
        let mode = self.state.mode.lock().unwrap().expect("a mode");
        match mode {
            Mode::Fail => return Err(Status::unavailable("the scheduler cannot be reached")),
            Mode::Hang => {
                return Ok(Response::new(Box::pin(futures::stream::pending::<
                    Result<DownloadTaskResponse, Status>,
                >())))
            }
            _ => {}
        }
        let output = download
            .output_path
            .as_deref()
            .ok_or_else(|| Status::invalid_argument("no output path"))?;
        let written = |e: std::io::Error| Status::internal(format!("writing {output}: {e}"));
        if mode == Mode::Fifo {
            let fifo = rustix::fs::Mode::from_raw_mode(0o644);
            rustix::fs::mkfifoat(rustix::fs::CWD, output, fifo).map_err(|e| written(e.into()))?;
            return Ok(Response::new(Box::pin(futures::stream::iter(
                answers(1).into_iter().map(Ok),
            ))));
        }
        let task = task_id(&download);
        let known = self.state.tasks.lock().unwrap().get(&task).cloned();
        let (bytes, stored) = match known {
            Some(known) => known,
            None => {
                let bytes = back_to_source(&download).await?;
                let mut tasks = self.state.tasks.lock().unwrap();
                let stored = self.state.storage.join(tasks.len().to_string());
                std::fs::write(&stored, &bytes).map_err(written)?;
                tasks.insert(task, (bytes.clone(), stored.clone()));
                (bytes, stored)
            }
        };
        let mut delivered = bytes.to_vec();
        match mode {
            Mode::Corrupt => delivered[bytes.len() / 2] ^= 1,
            Mode::Short => {
                delivered.pop();
            }
            Mode::Deliver | Mode::Fail | Mode::Fifo | Mode::Hang => {}
        }
        // As the dfdaemon: the output must not exist unless `overwrite`.
        match mode {
            Mode::Deliver => std::fs::hard_link(&stored, output),
            _ => std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(output)
                .and_then(|mut file| std::io::Write::write_all(&mut file, &delivered)),
        }
        .map_err(written)?;
        Ok(Response::new(Box::pin(futures::stream::iter(
            answers(bytes.len()).into_iter().map(Ok),
        ))))
    }
}

/// The task a download names: its URL without the filtered query parameters, its tag and its
/// application, as the dfdaemon computes it.
fn task_id(download: &Download) -> String {
    let (path, query) = download.url.split_once('?').unwrap_or((&download.url, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            !download.filtered_query_params.iter().any(|f| f == name)
        })
        .collect();
    format!(
        "{path}?{}\0{:?}\0{:?}",
        kept.join("&"),
        download.tag,
        download.application
    )
}

/// A GET of the presigned URL with the headers it was signed with.
async fn back_to_source(download: &Download) -> Result<Bytes, Status> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut request = hyper::Request::get(&download.url);
    for (name, value) in &download.request_header {
        request = request.header(name, value);
    }
    let request = request
        .body(Empty::new())
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| Status::unavailable(format!("the source: {e}")))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| Status::unavailable(format!("the source's body: {e}")))?
        .to_bytes();
    match status.is_success() {
        true => Ok(body),
        false => Err(Status::failed_precondition(format!(
            "the source answered {status}: {}",
            String::from_utf8_lossy(&body)
        ))),
    }
}

/// What the dfdaemon streams for a task of `len` bytes: started, then each piece finished.
fn answers(len: usize) -> Vec<DownloadTaskResponse> {
    let pieces: Vec<Piece> = (0..len.div_ceil(PIECE))
        .map(|n| Piece {
            number: n as u32,
            offset: (n * PIECE) as u64,
            length: (PIECE.min(len - n * PIECE)) as u64,
            ..Default::default()
        })
        .collect();
    let answer = |response| DownloadTaskResponse {
        host_id: "stand-in".into(),
        task_id: "task".into(),
        peer_id: "peer".into(),
        response: Some(response),
    };
    let mut all = vec![answer(Answer::DownloadTaskStartedResponse(
        DownloadTaskStartedResponse {
            content_length: len as u64,
            pieces: pieces.clone(),
            ..Default::default()
        },
    ))];
    all.extend(pieces.into_iter().map(|piece| {
        answer(Answer::DownloadPieceFinishedResponse(
            DownloadPieceFinishedResponse { piece: Some(piece) },
        ))
    }));
    all
}
