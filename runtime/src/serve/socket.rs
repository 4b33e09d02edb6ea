//! The daemon's `SOCK_SEQPACKET` Unix socket: binding it with mode 0660 under a lock that one
//! daemon alone holds, accepting clients with their kernel-reported credentials, and
//! one-packet sends and receives (with an fd as `SCM_RIGHTS` where the protocol passes one).
//! Every socket is non-blocking and close-on-exec.

use std::io::Write as _;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::socket::{
    accept4, bind, connect, getsockopt, listen, recvmsg, sendmsg, socket, sockopt, AddressFamily,
    Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};

/// Who is on the other end, as the kernel says (`SO_PEERCRED`), not as the peer claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// The daemon's listening socket, and the lock (`flock` on `SOCKET.lock`) that makes it this
/// daemon's alone: a second daemon on the same path is refused instead of binding over a live
/// socket, and the socket file is removed at the end only if it is still the one bound here.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
    /// (device, inode) of the socket file as bound.
    bound: (u64, u64),
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// The lock on a socket path, taken before anything slow (loading the model) so that a second
/// daemon is refused at once; [`SocketClaim::bind`] then binds under it.
#[derive(Debug)]
pub struct SocketClaim {
    path: PathBuf,
    lock: nix::fcntl::Flock<std::fs::File>,
}

impl SocketClaim {
    /// Takes the lock beside `path`. A daemon that holds it already is named in the error (its
    /// pid, as it wrote it into the lock).
    pub fn take(path: &Path) -> std::io::Result<SocketClaim> {
        Ok(SocketClaim {
            path: path.to_path_buf(),
            lock: lock_beside(path)?,
        })
    }

    /// Binds the claimed path (see [`bind_listener`]).
    pub fn bind(self, backlog: i32) -> std::io::Result<Listener> {
        let fd = bind_listener(&self.path, backlog)?;
        let meta = std::fs::symlink_metadata(&self.path)?;
        Ok(Listener {
            fd,
            bound: (meta.dev(), meta.ino()),
            path: self.path,
            _lock: self.lock,
        })
    }
}

impl Listener {
    /// Takes the lock beside `path`, then binds there.
    pub fn bind(path: &Path, backlog: i32) -> std::io::Result<Listener> {
        SocketClaim::take(path)?.bind(backlog)
    }

    /// Removes the socket file if it is still the one this listener bound (someone may have
    /// replaced it, by hand or with another daemon after deleting the lock); says what it did.
    pub fn remove(&self) -> std::io::Result<bool> {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.bound => {
                std::fs::remove_file(&self.path)?;
                Ok(true)
            }
            Ok(_) => Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `SOCKET.lock` beside the socket path.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// An exclusive `flock` on `SOCKET.lock` (created with mode 0600), with this process's pid
/// written into it for the message a second daemon gets. The kernel drops the lock when the
/// process dies, however it dies, so a crashed daemon never leaves a stale claim.
fn lock_beside(socket: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = lock_path(socket);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("opening the lock {}: {e}", path.display()),
            )
        })?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            // The pid is only for messages: failing to write it does not matter.
            let _ = lock.set_len(0);
            let _ = writeln!(&mut *lock, "{}", std::process::id());
            Ok(lock)
        }
        Err((_, Errno::EWOULDBLOCK)) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let who = if holder.is_empty() {
                "another fulcrumd".to_owned()
            } else {
                format!("another fulcrumd (pid {holder})")
            };
            Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!(
                    "{who} serves {} (it holds {}): stop it first, or give this one another \
                     --socket",
                    socket.display(),
                    path.display()
                ),
            ))
        }
        Err((_, e)) => Err(std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("locking {}: {e}", path.display()),
        )),
    }
}

/// Binds a listening socket at `path` with mode 0660. A stale socket file left by a dead
/// daemon is replaced; any other file there is an error (never deleted). Callers that may
/// race another daemon hold its lock first ([`Listener::bind`]).
pub fn bind_listener(path: &Path, backlog: i32) -> std::io::Result<OwnedFd> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; remove it or choose another --socket",
                    path.display()
                ),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    bind(fd.as_raw_fd(), &addr)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    let backlog = Backlog::new(backlog).unwrap_or(Backlog::MAXCONN);
    listen(&fd, backlog)?;
    Ok(fd)
}

/// Accepts one pending client (non-blocking), or `None` when there is none.
pub fn accept(listener: BorrowedFd<'_>) -> std::io::Result<Option<(OwnedFd, PeerCredentials)>> {
    match accept4(
        listener.as_raw_fd(),
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
    ) {
        Ok(raw) => {
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let cred = peer_credentials(fd.as_fd())?;
            Ok(Some((fd, cred)))
        }
        Err(Errno::EAGAIN | Errno::ECONNABORTED | Errno::EINTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub fn peer_credentials(fd: BorrowedFd<'_>) -> std::io::Result<PeerCredentials> {
    let cred = getsockopt(&fd, sockopt::PeerCredentials)?;
    Ok(PeerCredentials {
        pid: cred.pid(),
        uid: cred.uid(),
        gid: cred.gid(),
    })
}

/// Connects to a daemon's socket (blocking, close-on-exec), for clients.
pub fn connect_seqpacket(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(fd)
}

/// One received packet.
#[derive(Debug)]
pub enum Received {
    /// `len` bytes, and the descriptor that came with them, if any.
    Packet { len: usize, fd: Option<OwnedFd> },
    /// Larger than the buffer: the packet was cut (and its fds closed).
    Oversized,
    /// The peer closed the connection.
    Closed,
    /// Nothing to read now (non-blocking socket).
    Empty,
}

/// Receives one packet into `buf`. `cmsg` is the reusable control buffer (see
/// [`cmsg_buffer`]), so receiving allocates nothing unless a descriptor arrives.
pub fn recv_packet(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    cmsg: &mut [u8],
) -> std::io::Result<Received> {
    let mut iov = [IoSliceMut::new(buf)];
    let flags = MsgFlags::MSG_CMSG_CLOEXEC;
    let msg = match recvmsg::<()>(fd.as_raw_fd(), &mut iov, Some(&mut *cmsg), flags) {
        Ok(msg) => msg,
        Err(Errno::EAGAIN | Errno::EINTR) => return Ok(Received::Empty),
        // A peer that closed with our last packet unread resets the connection, and Linux
        // reports that before the packets it sent us last (a refusal's error reply): read on.
        Err(Errno::ECONNRESET) => {
            match recvmsg::<()>(fd.as_raw_fd(), &mut iov, Some(cmsg), flags) {
                Ok(msg) if msg.bytes > 0 => msg,
                _ => return Ok(Received::Closed),
            }
        }
        Err(e) => return Err(e.into()),
    };
    let (len, flags) = (msg.bytes, msg.flags);
    let mut passed: Option<OwnedFd> = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel installed these descriptors in this process for us; each
                // is owned once (extra ones are closed right here).
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if passed.is_none() {
                    passed = Some(owned);
                }
            }
        }
    }
    if flags.contains(MsgFlags::MSG_TRUNC) {
        return Ok(Received::Oversized);
    }
    if len == 0 && passed.is_none() {
        return Ok(Received::Closed);
    }
    Ok(Received::Packet { len, fd: passed })
}

/// Whether a packet waits to be read on `fd` (a peer that has hung up has none).
pub fn has_pending(fd: BorrowedFd<'_>) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        nix::sys::socket::recv(
            fd.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Ok(n) if n > 0
    )
}

/// A control buffer with room for one descriptor.
pub fn cmsg_buffer() -> Vec<u8> {
    nix::cmsg_space!([RawFd; 1])
}

/// Sends one packet, with `fd` as `SCM_RIGHTS` if given. `Ok(false)`: the socket's buffer is
/// full (EAGAIN), nothing was sent.
pub fn send_packet(
    fd: BorrowedFd<'_>,
    bytes: &[u8],
    pass: Option<BorrowedFd<'_>>,
) -> std::io::Result<bool> {
    let iov = [IoSlice::new(bytes)];
    let raw = pass.map(|f| [f.as_raw_fd()]);
    let cmsgs: &[ControlMessage<'_>] = match &raw {
        Some(fds) => &[ControlMessage::ScmRights(fds)],
        None => &[],
    };
    match sendmsg::<()>(fd.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::socketpair;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn packets_keep_their_boundaries_and_oversize_is_seen() {
        let (a, b) = pair();
        let mut cmsg = cmsg_buffer();
        let mut buf = [0u8; 8];
        assert!(matches!(
            recv_packet(b.as_fd(), &mut buf, &mut cmsg).unwrap(),
            Received::Empty
        ));
        assert!(send_packet(a.as_fd(), b"hello", None).unwrap());
        assert!(send_packet(a.as_fd(), b"0123456789", None).unwrap());
        match recv_packet(b.as_fd(), &mut buf, &mut cmsg).unwrap() {
            Received::Packet { len: 5, fd: None } => assert_eq!(&buf[..5], b"hello"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            recv_packet(b.as_fd(), &mut buf, &mut cmsg).unwrap(),
            Received::Oversized
        ));
        drop(a);
        assert!(matches!(
            recv_packet(b.as_fd(), &mut buf, &mut cmsg).unwrap(),
            Received::Closed
        ));
    }

    #[test]
    fn pending_packets_are_seen_without_being_taken() {
        let (a, b) = pair();
        assert!(!has_pending(b.as_fd()));
        assert!(send_packet(a.as_fd(), b"hi", None).unwrap());
        assert!(has_pending(b.as_fd()));
        assert!(has_pending(b.as_fd()), "peeking takes nothing");
        let mut buf = [0u8; 4];
        let mut cmsg = cmsg_buffer();
        assert!(matches!(
            recv_packet(b.as_fd(), &mut buf, &mut cmsg).unwrap(),
            Received::Packet { len: 2, .. }
        ));
        drop(a);
        assert!(!has_pending(b.as_fd()), "a hang-up is no packet");
    }

    #[test]
    fn a_reply_sent_before_a_reset_is_still_read() {
        // The daemon refuses: it answers and closes with the client's request unread, which
        // Linux reports to the client as ECONNRESET ahead of the answer.
        let (daemon, client) = pair();
        assert!(send_packet(client.as_fd(), b"hello", None).unwrap());
        assert!(send_packet(daemon.as_fd(), b"refused", None).unwrap());
        drop(daemon);
        let mut cmsg = cmsg_buffer();
        let mut buf = [0u8; 16];
        match recv_packet(client.as_fd(), &mut buf, &mut cmsg).unwrap() {
            Received::Packet { len: 7, fd: None } => assert_eq!(&buf[..7], b"refused"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            recv_packet(client.as_fd(), &mut buf, &mut cmsg).unwrap(),
            Received::Closed
        ));
    }

    #[test]
    fn a_descriptor_travels_with_its_packet() {
        let (a, b) = pair();
        let file = tempfile::tempfile().unwrap();
        assert!(send_packet(a.as_fd(), b"ring", Some(file.as_fd())).unwrap());
        let mut cmsg = cmsg_buffer();
        let mut buf = [0u8; 8];
        match recv_packet(b.as_fd(), &mut buf, &mut cmsg).unwrap() {
            Received::Packet {
                len: 4,
                fd: Some(fd),
            } => {
                let same = nix::sys::stat::fstat(fd.as_fd()).unwrap().st_ino;
                assert_eq!(same, nix::sys::stat::fstat(file.as_fd()).unwrap().st_ino);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            peer_credentials(b.as_fd()).unwrap().uid,
            nix::unistd::getuid().as_raw()
        );
    }

    #[test]
    fn binding_replaces_a_stale_socket_but_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let first = bind_listener(&path, 4).unwrap();
        drop(first);
        let listener = bind_listener(&path, 4).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let client = connect_seqpacket(&path).unwrap();
        let (server_side, cred) = accept(listener.as_fd()).unwrap().unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert!(send_packet(client.as_fd(), b"x", None).unwrap());
        drop(server_side);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"keep me").unwrap();
        assert!(bind_listener(&plain, 4).is_err());
        assert_eq!(std::fs::read(&plain).unwrap(), b"keep me");
    }

    #[test]
    fn a_second_listener_on_a_live_socket_is_refused_naming_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let first = Listener::bind(&path, 4).unwrap();
        let e = Listener::bind(&path, 4).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        let text = e.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())) && text.contains("d.sock"),
            "{text}"
        );
        // The first still answers.
        let client = connect_seqpacket(&path).unwrap();
        assert!(accept(first.as_fd()).unwrap().is_some());
        drop(client);
        // Its lock goes with it; then another may bind.
        assert!(first.remove().unwrap());
        drop(first);
        let second = Listener::bind(&path, 4).unwrap();
        drop(second);
    }

    #[test]
    fn a_listener_removes_only_its_own_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let listener = Listener::bind(&path, 4).unwrap();
        // Someone replaced the socket meanwhile (deleted it and bound another).
        std::fs::remove_file(&path).unwrap();
        let other = bind_listener(&path, 4).unwrap();
        assert!(!listener.remove().unwrap());
        assert!(
            connect_seqpacket(&path).is_ok(),
            "the other socket must stay"
        );
        drop(other);
    }
}
