//! Reading records off disk: the [`ReadBackend`] trait, an io_uring backend and a pread one.
//!
//! io_uring is the fast path: `O_DIRECT` reads straight into the ring's slot memory, which is
//! registered with the kernel (fixed buffers), from registered shard files (fixed files), many
//! reads in flight per submit. Where io_uring is *unavailable* (EPERM from seccomp or
//! `kernel.io_uring_disabled`, ENOSYS on old kernels or under qemu-user, EINVAL from a kernel
//! that lacks a needed feature) [`IoKind::Auto`] falls back to `pread`, says so once, and
//! reports which backend runs. Resource errors (ENOMEM, EMFILE…) are never a reason to fall
//! back: they are reported, since the fallback would hide a misconfigured machine.
//!
//! Each loader thread owns one backend (an io_uring instance is not shared between threads).

mod files;
mod pread;
mod uring;

use std::path::PathBuf;

pub use files::{DirectMode, ShardSet};
pub use pread::{raw_sequential_pread, PreadBackend};
pub use uring::{probe_uring, raw_sequential_read, uring_queue_bytes, UringBackend, UringOptions};

/// Where one record lives: shard index in the [`ShardSet`] and byte offset in that file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordLoc {
    pub shard: u32,
    pub offset: u64,
}

/// Which backend to use; `Auto` prefers io_uring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoKind {
    #[default]
    Auto,
    Uring,
    Pread,
}

impl std::str::FromStr for IoKind {
    type Err = crate::base::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(IoKind::Auto),
            "uring" | "io_uring" => Ok(IoKind::Uring),
            "pread" => Ok(IoKind::Pread),
            _ => Err(crate::base::UnknownChoice::new(
                "I/O backend",
                s,
                "auto, uring or pread",
            )),
        }
    }
}

/// The backend that actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Uring,
    Pread,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Uring => "io_uring",
            BackendKind::Pread => "pread",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Format(#[from] crate::format::Error),
    #[error("{path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: read of {len} bytes at offset {offset} failed: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("{path}: file ends before offset {offset} (+{len} bytes): it was truncated or replaced while in use; re-pack or restore it")]
    ShortRead {
        path: PathBuf,
        offset: u64,
        len: usize,
    },
    #[error("io_uring is unavailable ({why}); use `--io pread` or `--io auto`")]
    UringUnavailable { why: String },
    #[error("io_uring setup failed ({what}: {source}); this is a resource limit, not a missing feature: {hint}")]
    UringResource {
        what: &'static str,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("O_DIRECT was required (--direct on) but {path} refuses it: {source}")]
    DirectRefused {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use std::ops::ControlFlow;

/// Reads whole records into caller memory.
pub trait ReadBackend: Send {
    fn kind(&self) -> BackendKind;

    /// Reads record `i` of `locs` into `dst[i·record_size .. (i+1)·record_size]`, for every `i`,
    /// and calls `on_read(i, record)` as soon as record `i` is complete, in completion order,
    /// while the other reads are still in flight: work on early records overlaps the late
    /// reads. `ControlFlow::Break` stops submitting more reads.
    ///
    /// Returns only when no read is in flight any more, also on error or break, so `dst` is
    /// free again either way. The first read error is returned.
    fn read_records(
        &mut self,
        locs: &[RecordLoc],
        record_size: usize,
        dst: &mut [u8],
        on_read: &mut dyn FnMut(usize, &mut [u8]) -> ControlFlow<()>,
    ) -> Result<()>;
}

/// Opens the backend `kind` asks for, for one thread.
///
/// `registered` are the memory regions reads will land in (the ring's slots); io_uring registers
/// them as fixed buffers. `Auto` falls back to pread only on "unavailable" errors; the caller
/// learns which backend it got from [`ReadBackend::kind`] and the fallback reason, if any.
pub fn open_backend(
    kind: IoKind,
    files: &std::sync::Arc<ShardSet>,
    registered: &[(std::ptr::NonNull<u8>, usize)],
    options: &UringOptions,
) -> Result<(Box<dyn ReadBackend>, Option<String>)> {
    match kind {
        IoKind::Pread => Ok((Box::new(PreadBackend::new(files.clone())), None)),
        IoKind::Uring => Ok((
            Box::new(UringBackend::new(files.clone(), registered, options)?),
            None,
        )),
        IoKind::Auto => match UringBackend::new(files.clone(), registered, options) {
            Ok(b) => Ok((Box::new(b), None)),
            Err(Error::UringUnavailable { why }) => {
                Ok((Box::new(PreadBackend::new(files.clone())), Some(why)))
            }
            Err(e) => Err(e),
        },
    }
}

/// Whether an errno from io_uring setup means "this kernel or sandbox has no io_uring".
pub(crate) fn is_unavailable(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(nix::libc::EPERM)
            | Some(nix::libc::ENOSYS)
            | Some(nix::libc::EINVAL)
            | Some(nix::libc::EOPNOTSUPP)
    )
}
