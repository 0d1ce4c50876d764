//! Serving again a FUSE connection that an earlier process mounted and initialised: a lazy
//! view kept across a restart of the CSI plugin ([`crate::csi`]'s keeper).
//!
//! Why it is built this way:
//! - fuser builds a session only through the INIT handshake, which the kernel sends once per
//!   connection: a kept connection never sends it again. So the session is built on one end of
//!   a socket pair, over which this module plays the kernel's INIT (offering what the kernel
//!   took when the view was mounted: passthrough or not), and the descriptor the session reads
//!   is then pointed at the kept connection (`dup3` onto its number) before any of its threads
//!   starts. The view's `init` thus runs as it did at the mount, and fuser is used unchanged.
//! - Requests the earlier process had read and not answered (an open waiting for its file when
//!   the plugin was killed) would wait forever: they are queued again with
//!   `FUSE_NOTIFY_RESEND` (Linux 6.9) before the session reads.
//! - What the kernel holds still means the same: the view's inode numbers come from the
//!   snapshot, and its file handles carry their inode ([`super::view`]).

use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use fuser::{InitFlags, SessionACL};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use tokio::sync::oneshot;

use super::view::LazyView;

/// `FUSE_INIT` in the kernel's protocol.
const FUSE_INIT: u32 = 26;
/// The notification that queues again the requests read and not answered.
const FUSE_NOTIFY_RESEND: i32 = 7;
/// The protocol version the INIT played here states (7.40 has passthrough).
const PROTOCOL: (u32, u32) = (7, 40);

/// Why a kept view could not be served again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeError {
    #[error("playing the INIT handshake: {0}")]
    Handshake(#[source] std::io::Error),
    #[error("taking over the kept connection: {0}")]
    TakeOver(#[source] std::io::Error),
}

/// Serves `view` on `fuse`, a connection initialised by an earlier process (with passthrough
/// when `passthrough`), on threads of its own; the receiver fires when the session ends.
pub(crate) fn resume(
    view: LazyView,
    fuse: OwnedFd,
    passthrough: bool,
) -> Result<oneshot::Receiver<()>, ResumeError> {
    let (kernel, session_end) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|err| ResumeError::Handshake(err.into()))?;
    rustix::io::write(&kernel, &init_request(passthrough))
        .map_err(|err| ResumeError::Handshake(err.into()))?;
    let session = fuser::Session::from_fd(
        view,
        session_end,
        SessionACL::All,
        super::pinned::config(SessionACL::All),
    )
    .map_err(ResumeError::Handshake)?;
    // The session reads and answers on the descriptor number it was given: that number now
    // names the kept connection (the socket pair's end is closed by the replacement).
    // SAFETY: the number is the session's open descriptor, alive as long as `session`; the
    // `ManuallyDrop` never closes it, so the session alone still owns it.
    let mut number =
        ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(session.as_fd().as_raw_fd()) });
    rustix::io::dup3(&fuse, &mut number, rustix::io::DupFlags::CLOEXEC)
        .map_err(|err| ResumeError::TakeOver(err.into()))?;
    drop(fuse);
    if let Err(err) = rustix::io::write(session.as_fd(), &resend_notification()) {
        tracing::warn!(
            "requests taken by the previous plugin are not asked again ({err}; Linux 6.9 has FUSE_NOTIFY_RESEND): an open in flight at its end may wait until its pod is restarted"
        );
    }
    super::run_session(session).map_err(ResumeError::TakeOver)
}

/// The INIT request the kernel sent when the view was mounted, as far as the view reads it.
fn init_request(passthrough: bool) -> Vec<u8> {
    let mut flags = InitFlags::FUSE_INIT_EXT;
    if passthrough {
        flags |= InitFlags::FUSE_PASSTHROUGH;
    }
    let bits = flags.bits();
    const HEADER: usize = 40;
    const BODY: usize = 64;
    let mut request = Vec::with_capacity(HEADER + BODY);
    // fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, padding.
    request.extend(((HEADER + BODY) as u32).to_ne_bytes());
    request.extend(FUSE_INIT.to_ne_bytes());
    request.extend(1u64.to_ne_bytes());
    request.extend(0u64.to_ne_bytes());
    request.extend([0u8; 16]);
    // fuse_init_in: major, minor, max_readahead, flags, flags2, unused[11].
    request.extend(PROTOCOL.0.to_ne_bytes());
    request.extend(PROTOCOL.1.to_ne_bytes());
    request.extend((128u32 * 1024).to_ne_bytes());
    request.extend((bits as u32).to_ne_bytes());
    request.extend(((bits >> 32) as u32).to_ne_bytes());
    request.extend([0u8; 44]);
    debug_assert_eq!(request.len(), HEADER + BODY);
    request
}

/// fuse_out_header of a notification: len, the code in place of an error, unique 0.
fn resend_notification() -> Vec<u8> {
    let mut notification = Vec::with_capacity(16);
    notification.extend(16u32.to_ne_bytes());
    notification.extend(FUSE_NOTIFY_RESEND.to_ne_bytes());
    notification.extend(0u64.to_ne_bytes());
    notification
}
