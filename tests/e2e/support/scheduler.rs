//! A stand-in for Dragonfly's scheduler, for the fleet test's real dfdaemons where Dragonfly's
//! own (`support::dragonfly_scheduler`) is not installed or not wanted. Like moto, a fixture of
//! the test tree, never shipped. Its policy:
//! - `AnnounceHost` records each dfdaemon's host (its address and upload port);
//! - the first peer registered for a task is told to go back to the source; every later one
//!   gets the task's earlier peers as candidate parents (a dfdaemon syncs pieces from a parent
//!   as they arrive there, so a parent still downloading is a good one);
//! - a peer that fails is no one's parent any more; one that asks to be rescheduled gets the
//!   same answer as at its registration, without the peers that failed since;
//! - a peer's announcement ends when it says it finished or failed: the dfdaemon waits for
//!   the scheduler to end that call before it answers its own download request;
//! - `fail(true)` refuses every call, as a scheduler that is down.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::dragonfly_api::common::v2::{Host, Peer};
use super::dragonfly_api::scheduler::v2::announce_peer_request::Request as Said;
use super::dragonfly_api::scheduler::v2::announce_peer_response::Response as Answer;
use super::dragonfly_api::scheduler::v2::scheduler_server::{Scheduler, SchedulerServer};
use super::dragonfly_api::scheduler::v2::{
    AnnounceHostRequest, AnnouncePeerRequest, AnnouncePeerResponse, NeedBackToSourceResponse,
    NormalTaskResponse,
};

type Answers =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<AnnouncePeerResponse, Status>> + Send>>;

#[derive(Default)]
struct State {
    failing: AtomicBool,
    hosts: Mutex<HashMap<String, Host>>,
    /// Each task's peers, in the order they registered: (peer id, host id).
    tasks: Mutex<HashMap<String, Vec<(String, String)>>>,
    /// Peers told to go back to the source.
    back_to_source: AtomicU64,
    /// Peers given parents.
    with_parents: AtomicU64,
}

pub struct SchedulerDouble {
    pub addr: SocketAddr,
    state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl SchedulerDouble {
    /// Listens on `127.0.0.1`, an ephemeral port.
    pub fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let service = SchedulerServer::new(Service {
            state: state.clone(),
        });
        // A dfdaemon uses only the schedulers whose gRPC health check says serving.
        let (_, health) = tonic_health::server::health_reporter();
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self {
            addr,
            state,
            _runtime: runtime,
        }
    }

    /// Refuses every call from now on (`true`), or answers again.
    pub fn fail(&self, failing: bool) {
        self.state.failing.store(failing, Relaxed);
    }

    /// Peers sent back to the source, and peers given parents.
    pub fn decisions(&self) -> (u64, u64) {
        let state = &self.state;
        (
            state.back_to_source.load(Relaxed),
            state.with_parents.load(Relaxed),
        )
    }

    pub fn hosts(&self) -> usize {
        self.state.hosts.lock().unwrap().len()
    }
}

struct Service {
    state: Arc<State>,
}

impl State {
    fn check(&self) -> Result<(), Status> {
        match self.failing.load(Relaxed) {
            true => Err(Status::unavailable("the scheduler is down")),
            false => Ok(()),
        }
    }

    /// Registers `peer` for `task` (again, for a reschedule): its parents are the task's other
    /// peers on other hosts, registered earlier.
    fn register(&self, task: &str, peer: &str, host: &str) -> Answer {
        let mut tasks = self.tasks.lock().unwrap();
        let peers = tasks.entry(task.to_string()).or_default();
        let hosts = self.hosts.lock().unwrap();
        let earlier = peers.iter().position(|(id, _)| id == peer);
        let parents: Vec<Peer> = peers[..earlier.unwrap_or(peers.len())]
            .iter()
            .filter(|(_, parent_host)| parent_host != host)
            .filter_map(|(id, parent_host)| {
                Some(Peer {
                    id: id.clone(),
                    host: Some(hosts.get(parent_host)?.clone()),
                    ..Default::default()
                })
            })
            .collect();
        if earlier.is_none() {
            peers.push((peer.to_string(), host.to_string()));
        }
        match parents.is_empty() {
            true => {
                self.back_to_source.fetch_add(1, Relaxed);
                Answer::NeedBackToSourceResponse(NeedBackToSourceResponse {
                    description: Some("the task's first peer".into()),
                })
            }
            false => {
                self.with_parents.fetch_add(1, Relaxed);
                Answer::NormalTaskResponse(NormalTaskResponse {
                    candidate_parents: parents,
                })
            }
        }
    }

    /// A peer that failed is no one's parent.
    fn forget(&self, task: &str, peer: &str) {
        if let Some(peers) = self.tasks.lock().unwrap().get_mut(task) {
            peers.retain(|(id, _)| id != peer);
        }
    }
}

#[tonic::async_trait]
impl Scheduler for Service {
    async fn announce_host(
        &self,
        request: Request<AnnounceHostRequest>,
    ) -> Result<Response<()>, Status> {
        self.state.check()?;
        let host =
            (request.into_inner().host).ok_or_else(|| Status::invalid_argument("no host"))?;
        self.state
            .hosts
            .lock()
            .unwrap()
            .insert(host.id.clone(), host);
        Ok(Response::new(()))
    }

    async fn announce_peer(
        &self,
        request: Request<Streaming<AnnouncePeerRequest>>,
    ) -> Result<Response<Answers>, Status> {
        self.state.check()?;
        let mut said = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let state = self.state.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = said.next().await {
                let (task, peer, host) = (&message.task_id, &message.peer_id, &message.host_id);
                let answer = match message.request {
                    Some(Said::RegisterPeerRequest(_) | Said::ReschedulePeerRequest(_)) => {
                        state.register(task, peer, host)
                    }
                    Some(
                        Said::DownloadPeerFailedRequest(_)
                        | Said::DownloadPeerBackToSourceFailedRequest(_),
                    ) => {
                        state.forget(task, peer);
                        break;
                    }
                    // The peer's last word: it waits for this call to end before it answers
                    // its own client.
                    Some(
                        Said::DownloadPeerFinishedRequest(_)
                        | Said::DownloadPeerBackToSourceFinishedRequest(_),
                    ) => break,
                    _ => continue,
                };
                let response = AnnouncePeerResponse {
                    response: Some(answer),
                };
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
