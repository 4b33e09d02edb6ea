//! A client's frame ring: a memfd the client created, filled with frames and passed once with
//! `SCM_RIGHTS`. The daemon accepts it only sealed against shrinking (so the mapping can never
//! lose pages under it: no SIGBUS), maps it read-only and checks every frame's range against
//! the mapped length before reading.

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::stat::fstat;

/// Why a ring was refused; the text goes back to the client.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    #[error(
        "the ring fd is not a sealable memfd ({0}); create it with memfd_create(MFD_ALLOW_SEALING)"
    )]
    NotMemfd(nix::Error),
    #[error(
        "the ring memfd is not sealed against shrinking; add F_SEAL_SHRINK with fcntl(F_ADD_SEALS)"
    )]
    NotSealed,
    #[error("the ring announces {announced} bytes but the memfd holds {actual}")]
    TooShort { announced: u64, actual: u64 },
    #[error("a ring of {0} bytes is outside 1..={1} bytes")]
    BadSize(u64, u64),
    #[error("mapping the ring failed: {0}")]
    Map(nix::Error),
}

/// A client's ring, mapped read-only for as long as the client is connected.
pub struct ClientRing {
    ptr: NonNull<u8>,
    len: usize,
    // Kept open for the mapping's life (not needed by mmap, but it names the ring in
    // /proc/PID/fd while the client is connected).
    _fd: OwnedFd,
}

// SAFETY: the mapping is read-only, owned by this value and unmapped only in Drop; moving it
// to another thread moves that ownership.
unsafe impl Send for ClientRing {}

impl ClientRing {
    /// Checks and maps a ring of `len` bytes (at most `max_len`).
    pub fn map(fd: OwnedFd, len: u64, max_len: u64) -> Result<Self, RingError> {
        if len == 0 || len > max_len {
            return Err(RingError::BadSize(len, max_len));
        }
        let seals = fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS).map_err(RingError::NotMemfd)?;
        if !SealFlag::from_bits_truncate(seals).contains(SealFlag::F_SEAL_SHRINK) {
            return Err(RingError::NotSealed);
        }
        let actual = fstat(fd.as_fd()).map_err(RingError::NotMemfd)?.st_size as u64;
        if actual < len {
            return Err(RingError::TooShort {
                announced: len,
                actual,
            });
        }
        let size = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or(RingError::BadSize(len, max_len))?;
        // SAFETY: a fresh shared read-only mapping at an address the kernel picks, of a memfd
        // at least `len` bytes long that can no longer shrink, so every page stays backed.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }
        .map_err(RingError::Map)?;
        Ok(ClientRing {
            ptr: ptr.cast(),
            len: size.get(),
            _fd: fd,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ring's bytes. The client may write to its memfd at any time: a frame it changes
    /// while the daemon reads it gives that client wrong detections, nothing worse (every byte
    /// value is a valid pixel, and the length never changes).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives (unmapped only
        // in Drop); u8 has no invalid values, so concurrent writes by the client cannot make
        // the slice hold an invalid value.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ClientRing {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `map`, and no slice of it
        // outlives `self` (`bytes` borrows `self`).
        if let Err(e) = unsafe { munmap(self.ptr.cast(), self.len) } {
            log::warn!("unmapping a client's ring: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::memfd::{memfd_create, MFdFlags};
    use std::io::Write;

    fn memfd(bytes: &[u8], seal: bool) -> OwnedFd {
        let fd = memfd_create("fulcrum-test-ring", MFdFlags::MFD_ALLOW_SEALING).unwrap();
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes).unwrap();
        let fd = OwnedFd::from(file);
        if seal {
            fcntl(fd.as_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).unwrap();
        }
        fd
    }

    #[test]
    fn maps_a_sealed_memfd_and_reads_it() {
        let ring = ClientRing::map(memfd(&[1, 2, 3, 4, 5], true), 4, 1 << 20).unwrap();
        assert_eq!(ring.bytes(), &[1, 2, 3, 4]);
    }

    #[test]
    fn refuses_unsealed_short_and_oversized_rings_and_plain_files() {
        let e = ClientRing::map(memfd(&[0; 16], false), 16, 1 << 20).err();
        assert_eq!(e, Some(RingError::NotSealed));
        let e = ClientRing::map(memfd(&[0; 16], true), 17, 1 << 20).err();
        assert_eq!(
            e,
            Some(RingError::TooShort {
                announced: 17,
                actual: 16
            })
        );
        let e = ClientRing::map(memfd(&[0; 16], true), 16, 8).err();
        assert_eq!(e, Some(RingError::BadSize(16, 8)));
        let e = ClientRing::map(memfd(&[0; 16], true), 0, 8).err();
        assert_eq!(e, Some(RingError::BadSize(0, 8)));
        let file = tempfile::tempfile().unwrap();
        // A plain file: EINVAL on ext4; on tmpfs sealing exists but was never allowed.
        assert!(matches!(
            ClientRing::map(OwnedFd::from(file), 16, 1 << 20),
            Err(RingError::NotMemfd(_) | RingError::NotSealed)
        ));
    }
}
