//! The daemon's `SOCK_SEQPACKET` Unix socket: binding it with mode 0660, accepting clients
//! with their kernel-reported credentials, and one-packet sends and receives (with an fd as
//! `SCM_RIGHTS` where the protocol passes one). Every socket is non-blocking and close-on-exec.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

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

/// Binds a listening socket at `path` with mode 0660. A stale socket file left by a dead
/// daemon is replaced; any other file there is an error (never deleted).
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
}
