//! The keeper of lazy views (`hydrator csi-keeper`): a small process that holds a duplicate of
//! each lazy view's `/dev/fuse` descriptor, so that a view outlives the CSI plugin serving it.
//!
//! Why it is built this way:
//! - A FUSE connection lives as long as one descriptor of it is open anywhere. While the keeper
//!   holds one, a kill -9, an upgrade or a rollout of the plugin leaves the mount in place: the
//!   kernel queues the pod's requests meanwhile (reads of files already open do not even wait:
//!   passthrough sends them to the local file), and the restarted plugin takes the descriptors
//!   back over `SCM_RIGHTS` and serves them again ([`crate::mount::resume`]).
//! - The keeper does nothing else, so it has no reason to change: it runs as a DaemonSet of its
//!   own, replaced only when its pod is deleted, and a rollout of the plugin's DaemonSet (a new
//!   image, a new catalog) does not touch it. Either may restart alone: the plugin hands its
//!   descriptors to the keeper again every few seconds, so only both ending at once ends a view.
//! - A descriptor whose connection ended (its view was unmounted) polls as an error, and the
//!   keeper drops it then: there is no release message to forget.
//! - Only the keeper's own user (and root) may reach it: its socket is in a directory only that
//!   user may enter (0700), and is that user's alone (0600), as a FUSE descriptor lets its
//!   holder answer for the view. (Not `SO_PEERCRED`: across containers the caller's pid is in
//!   another namespace, and the permission already says who may connect.)
//! - One datagram per message (`SOCK_SEQPACKET`), a JSON body and at most one descriptor, with
//!   `rustix`'s `sendmsg`/`recvmsg`: no framing to write, and one blocking thread serves it all.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::net::sockopt::Timeout;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

/// The largest message either side sends (a view's names and paths).
const MAX_MESSAGE: usize = 16 * 1024;
/// How long the keeper waits for a caller that connected to say what it wants.
const CALLER_PATIENCE: Duration = Duration::from_secs(2);
/// How long the plugin waits for the keeper to take or list views.
const KEEPER_PATIENCE: Duration = Duration::from_secs(5);

/// What the plugin needs to serve a kept view again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeptView {
    pub volume: String,
    pub dataset: String,
    pub snapshot: String,
    /// The snapshot's directory in the cache, which the view serves.
    pub dir: PathBuf,
    /// Whether the kernel took FUSE passthrough when the view was mounted.
    pub passthrough: bool,
}

#[derive(Debug, Serialize, Deserialize)]
enum Message {
    /// Keep the descriptor sent with this message for the view (replacing one kept for it).
    Keep(KeptView),
    /// Send every view kept, each with its descriptor, then `End`.
    List,
    Entry(KeptView),
    End,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum KeeperError {
    #[error("the keeper at {}: {source}", .socket.display())]
    Io {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the keeper at {}: unexpected answer {answer}", .socket.display())]
    Protocol { socket: PathBuf, answer: String },
}

/// The plugin's side: hands descriptors to the keeper at `socket` and takes them back.
#[derive(Clone, Debug)]
pub(crate) struct Keeper {
    socket: PathBuf,
}

impl Keeper {
    pub(crate) fn new(socket: PathBuf) -> Self {
        Self { socket }
    }

    /// Gives the keeper a duplicate of `fuse`, the connection of `view` (blocking).
    pub(crate) fn keep(&self, view: &KeptView, fuse: BorrowedFd<'_>) -> Result<(), KeeperError> {
        let conn = self.connect()?;
        send(&conn, &Message::Keep(view.clone()), Some(fuse)).map_err(|e| self.io(e))?;
        match receive(&conn).map_err(|e| self.io(e))? {
            (Message::End, _) => Ok(()),
            (other, _) => Err(self.unexpected(&other)),
        }
    }

    /// Every view the keeper holds, with a duplicate of its connection (blocking).
    pub(crate) fn list(&self) -> Result<Vec<(KeptView, OwnedFd)>, KeeperError> {
        let conn = self.connect()?;
        send(&conn, &Message::List, None).map_err(|e| self.io(e))?;
        let mut kept = Vec::new();
        loop {
            match receive(&conn).map_err(|e| self.io(e))? {
                (Message::Entry(view), Some(fd)) => kept.push((view, fd)),
                (Message::End, _) => return Ok(kept),
                (other, _) => return Err(self.unexpected(&other)),
            }
        }
    }

    fn connect(&self) -> Result<OwnedFd, KeeperError> {
        let conn = seqpacket().map_err(|e| self.io(e))?;
        let address = SocketAddrUnix::new(&self.socket).map_err(|e| self.io(e.into()))?;
        rustix::net::connect(&conn, &address).map_err(|e| self.io(e.into()))?;
        // A keeper that stops answering must not hold up a publish.
        for direction in [Timeout::Send, Timeout::Recv] {
            rustix::net::sockopt::set_socket_timeout(&conn, direction, Some(KEEPER_PATIENCE))
                .map_err(|e| self.io(e.into()))?;
        }
        Ok(conn)
    }

    fn io(&self, source: io::Error) -> KeeperError {
        KeeperError::Io {
            socket: self.socket.clone(),
            source,
        }
    }

    fn unexpected(&self, answer: &Message) -> KeeperError {
        KeeperError::Protocol {
            socket: self.socket.clone(),
            answer: format!("{answer:?}"),
        }
    }
}

/// Serves the keeper on `socket` (made only its user's) until the process is killed.
pub(crate) fn serve(socket: &Path) -> io::Result<Infallible> {
    let listener = listen(socket)?;
    tracing::info!(
        "keeping the CSI plugin's lazy views on unix:{}",
        socket.display()
    );
    let mut kept: BTreeMap<String, (KeptView, OwnedFd)> = BTreeMap::new();
    loop {
        let (caller, ended) = wait(&listener, &kept)?;
        for volume in ended {
            kept.remove(&volume);
            tracing::info!(volume = %volume, "the lazy view ended (unmounted): its descriptor is dropped");
        }
        if caller {
            let conn = match rustix::net::accept_with(&listener, SocketFlags::CLOEXEC) {
                Ok(conn) => conn,
                Err(err) => {
                    tracing::warn!("accepting a caller: {err}");
                    continue;
                }
            };
            if let Err(err) = answer(&conn, &mut kept) {
                tracing::warn!("answering a caller: {err}");
            }
        }
    }
}

/// Binds `socket`, replacing a stale one, in a directory and with a mode only this user may use.
fn listen(socket: &Path) -> io::Result<OwnedFd> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    match std::fs::remove_file(socket) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
        _ => {}
    }
    let listener = seqpacket()?;
    rustix::net::bind(&listener, &SocketAddrUnix::new(socket)?)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    rustix::net::listen(&listener, 64)?;
    Ok(listener)
}

/// Waits for a caller or for kept connections to end: whether a caller waits, and the volumes
/// whose connection ended.
fn wait(
    listener: &OwnedFd,
    kept: &BTreeMap<String, (KeptView, OwnedFd)>,
) -> io::Result<(bool, Vec<String>)> {
    // A FUSE descriptor is always writable and readable while requests wait: asked for no
    // event, it reports only the error (POLLERR) that says its connection ended.
    let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(listener, PollFlags::IN))
        .chain(
            kept.values()
                .map(|(_, fd)| PollFd::new(fd, PollFlags::empty())),
        )
        .collect();
    loop {
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    let caller = !fds[0].revents().is_empty();
    let ended = (kept.keys().zip(&fds[1..]))
        .filter(|(_, fd)| !fd.revents().is_empty())
        .map(|(volume, _)| volume.clone())
        .collect();
    Ok((caller, ended))
}

/// Answers one caller's message.
fn answer(conn: &OwnedFd, kept: &mut BTreeMap<String, (KeptView, OwnedFd)>) -> io::Result<()> {
    rustix::net::sockopt::set_socket_timeout(conn, Timeout::Recv, Some(CALLER_PATIENCE))?;
    match receive(conn)? {
        (Message::Keep(view), Some(fuse)) => {
            let volume = view.volume.clone();
            if kept.insert(volume.clone(), (view, fuse)).is_none() {
                tracing::info!(volume = %volume, "keeping the lazy view");
            }
            send(conn, &Message::End, None)
        }
        (Message::List, _) => {
            for (view, fuse) in kept.values() {
                send(conn, &Message::Entry(view.clone()), Some(fuse.as_fd()))?;
            }
            send(conn, &Message::End, None)
        }
        (other, _) => Err(io::Error::other(format!("unexpected message {other:?}"))),
    }
}

/// A unix socket that keeps message boundaries.
fn seqpacket() -> io::Result<OwnedFd> {
    let flags = SocketFlags::CLOEXEC;
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        flags,
        None,
    )?)
}

fn send(conn: &OwnedFd, message: &Message, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    if !fds.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    rustix::net::sendmsg(
        conn,
        &[IoSlice::new(&body)],
        &mut control,
        SendFlags::empty(),
    )?;
    Ok(())
}

fn receive(conn: &OwnedFd) -> io::Result<(Message, Option<OwnedFd>)> {
    let mut body = vec![0; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        conn,
        &mut [IoSliceMut::new(&mut body)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fd = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            // More than one descriptor is out of protocol: the rest are closed here.
            for received in fds {
                fd.get_or_insert(received);
            }
        }
    }
    if got.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the other side closed",
        ));
    }
    let message = serde_json::from_slice(&body[..got.bytes]).map_err(io::Error::other)?;
    Ok((message, fd))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn view(volume: &str) -> KeptView {
        KeptView {
            volume: volume.into(),
            dataset: "imagenet".into(),
            snapshot: "a".repeat(64),
            dir: PathBuf::from("/var/cache/hydrator/imagenet/x"),
            passthrough: true,
        }
    }

    fn start(socket: &Path) {
        let served = socket.to_path_buf();
        std::thread::spawn(move || serve(&served));
        for _ in 0..100 {
            if socket_ready(socket) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the keeper did not start");
    }

    fn socket_ready(socket: &Path) -> bool {
        Keeper::new(socket.to_path_buf()).list().is_ok()
    }

    /// The identity of the open file a descriptor refers to (a pipe's inode).
    fn inode(fd: BorrowedFd<'_>) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    #[test]
    fn a_kept_descriptor_comes_back_as_the_same_open_file_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("keeper/keeper.sock");
        start(&socket);
        let keeper = Keeper::new(socket.clone());
        // A pipe stands for a FUSE connection: once its write end is closed, its read end
        // polls as hung up, as an ended connection polls as an error.
        let (read_end, write_end) = rustix::pipe::pipe().unwrap();
        keeper.keep(&view("vol-1"), read_end.as_fd()).unwrap();
        let listed = keeper.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, view("vol-1"));
        assert_eq!(inode(listed[0].1.as_fd()), inode(read_end.as_fd()));
        assert_ne!(listed[0].1.as_raw_fd(), read_end.as_raw_fd());
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only the keeper's user may connect");
        let dir_mode = (std::fs::metadata(socket.parent().unwrap())
            .unwrap()
            .permissions())
        .mode();
        assert_eq!(dir_mode & 0o777, 0o700, "only the keeper's user may enter");
        // Kept again: replaced, not doubled.
        keeper.keep(&view("vol-1"), read_end.as_fd()).unwrap();
        assert_eq!(keeper.list().unwrap().len(), 1);
        drop(write_end);
        for _ in 0..100 {
            if keeper.list().unwrap().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("a descriptor whose other end closed is still kept");
    }
}
