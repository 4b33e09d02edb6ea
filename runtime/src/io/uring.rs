//! The io_uring backend: registered files, registered buffers (the ring's slot memory), and up
//! to `queue_depth` reads in flight per submit.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};

use super::{
    is_unavailable, BackendKind, ControlFlow, Error, ReadBackend, RecordLoc, Result, ShardSet,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringOptions {
    /// Reads in flight at once per loader thread.
    pub queue_depth: u32,
    /// Kernel-side submission polling: saves syscalls but keeps a core busy, so opt-in.
    pub sqpoll: bool,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            queue_depth: 32,
            sqpoll: false,
        }
    }
}

/// Test and fault-injection hook: `FULCRUM_FAULT_URING=EPERM|ENOSYS|ENOMEM` makes io_uring
/// setup fail with that errno, as a seccomp sandbox, an old kernel or a memory limit would.
fn injected_fault() -> Option<std::io::Error> {
    let errno = match std::env::var("FULCRUM_FAULT_URING").ok()?.as_str() {
        "EPERM" => nix::libc::EPERM,
        "ENOSYS" => nix::libc::ENOSYS,
        "ENOMEM" => nix::libc::ENOMEM,
        _ => return None,
    };
    Some(std::io::Error::from_raw_os_error(errno))
}

fn build_ring(options: &UringOptions) -> Result<IoUring> {
    let depth = options.queue_depth.clamp(1, 4096);
    let built = match injected_fault() {
        Some(e) => Err(e),
        None => {
            let mut builder = IoUring::builder();
            if options.sqpoll {
                builder.setup_sqpoll(50);
            }
            builder.build(depth)
        }
    };
    built.map_err(|e| setup_error("creating the ring", e))
}

fn setup_error(what: &'static str, e: std::io::Error) -> Error {
    if is_unavailable(&e) {
        let why = match e.raw_os_error() {
            Some(nix::libc::EPERM) => {
                format!("{what}: {e}: blocked by a seccomp sandbox or kernel.io_uring_disabled")
            }
            Some(nix::libc::ENOSYS) => {
                format!("{what}: {e}: the kernel (or qemu-user) has no io_uring")
            }
            _ => format!("{what}: {e}: the kernel lacks a needed io_uring feature"),
        };
        Error::UringUnavailable { why }
    } else {
        let hint = match e.raw_os_error() {
            Some(nix::libc::ENOMEM) => {
                "raise the locked-memory limit (ulimit -l, LimitMEMLOCK=) or lower --ring / --batch"
            }
            Some(nix::libc::EMFILE) | Some(nix::libc::ENFILE) => {
                "raise the open-file limit (ulimit -n, LimitNOFILE=)"
            }
            _ => "check the system logs; `--io pread` avoids io_uring",
        };
        Error::UringResource {
            what,
            source: e,
            hint,
        }
    }
}

/// Errors of `io_uring_enter` that only mean "try again".
fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::EINTR) | Some(nix::libc::EAGAIN) | Some(nix::libc::EBUSY)
    )
}

/// Memory of one io_uring backend with these options: the kernel's submission entries (64
/// bytes), completion entries (16 bytes, twice as many), both rounded up to powers of two as the
/// kernel does, and the submission index array (charged to the process), plus the backend's own
/// progress lists.
pub fn uring_queue_bytes(options: &UringOptions) -> usize {
    let sq = options.queue_depth.clamp(1, 4096).next_power_of_two() as usize;
    sq * 64 + 2 * sq * 16 + sq * 4 + 2 * PROGRESS_CAPACITY * std::mem::size_of::<u32>()
}

/// Requests per call the backend tracks without reallocating (`done` and `pending`).
const PROGRESS_CAPACITY: usize = 256;

/// Checks once, at start, whether io_uring can be set up here; `Err` says why not.
pub fn probe_uring() -> Result<()> {
    build_ring(&UringOptions {
        queue_depth: 2,
        sqpoll: false,
    })
    .map(drop)
}

/// One thread's io_uring instance.
pub struct UringBackend {
    ring: IoUring,
    files: Arc<ShardSet>,
    /// Registered buffers, by index: (start address, length).
    regions: Vec<(usize, usize)>,
    queue_depth: u32,
    /// Bytes done so far, per request of the current call (capacity kept between calls).
    done: Vec<u32>,
    /// Requests waiting to be (re)submitted: short reads continue where they stopped.
    pending: Vec<u32>,
    /// Set when the ring itself failed; every later call errors out.
    broken: bool,
}

impl UringBackend {
    /// Sets up a ring with the shards as fixed files and `registered` as fixed buffers.
    ///
    /// `registered` regions must stay valid for as long as the backend lives; the ring's slot
    /// memory does (the backend is dropped before the ring).
    pub fn new(
        files: Arc<ShardSet>,
        registered: &[(NonNull<u8>, usize)],
        options: &UringOptions,
    ) -> Result<Self> {
        let ring = build_ring(options)?;
        let fds: Vec<i32> = files.raw_fds();
        ring.submitter()
            .register_files(&fds)
            .map_err(|e| setup_error("registering shard files", e))?;
        let iovecs: Vec<nix::libc::iovec> = registered
            .iter()
            .map(|(p, len)| nix::libc::iovec {
                iov_base: p.as_ptr().cast(),
                iov_len: *len,
            })
            .collect();
        let mut regions = Vec::new();
        if !iovecs.is_empty() {
            // SAFETY: every iovec describes memory the caller keeps valid and unmoved for the
            // backend's lifetime (documented above); the kernel pins those pages.
            match unsafe { ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => regions = registered.iter().map(|(p, l)| (p.as_ptr() as usize, *l)).collect(),
                // Pinning is charged to RLIMIT_MEMLOCK; without it reads still work, just not
                // zero-setup: plain reads into the same memory. Resource, not availability.
                Err(e) => log::warn!("io_uring: buffers not registered ({e}); using unregistered reads. Raise the locked-memory limit (ulimit -l, LimitMEMLOCK=) for fixed buffers"),
            }
        }
        let depth = ring.params().sq_entries();
        Ok(UringBackend {
            ring,
            files,
            regions,
            queue_depth: depth.min(options.queue_depth.max(1)),
            done: Vec::with_capacity(PROGRESS_CAPACITY),
            pending: Vec::with_capacity(PROGRESS_CAPACITY),
            broken: false,
        })
    }

    /// The registered buffer holding `[ptr, ptr + len)`, if any.
    fn buffer_index(&self, ptr: *const u8, len: usize) -> Option<u16> {
        let start = ptr as usize;
        self.regions
            .iter()
            .position(|&(base, size)| start >= base && start + len <= base + size)
            .map(|i| i as u16)
    }
}

impl ReadBackend for UringBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Uring
    }

    fn read_records(
        &mut self,
        locs: &[RecordLoc],
        record_size: usize,
        dst: &mut [u8],
        on_read: &mut dyn FnMut(usize, &mut [u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        if self.broken {
            return Err(Error::UringUnavailable {
                why: "this loader's io_uring failed earlier".into(),
            });
        }
        let n = locs.len();
        assert!(dst.len() >= n * record_size, "destination too small");
        let base = dst.as_mut_ptr();
        let fixed = self.buffer_index(base, n * record_size);
        self.done.clear();
        self.done.resize(n, 0);
        self.pending.clear();
        self.pending.extend((0..n as u32).rev());
        let mut in_flight = 0u32;
        let mut first_error: Option<Error> = None;
        let mut stopped = false;

        loop {
            while in_flight < self.queue_depth && first_error.is_none() && !stopped {
                let Some(i) = self.pending.pop() else { break };
                let (loc, done) = (&locs[i as usize], self.done[i as usize] as usize);
                // SAFETY: `i < n` and `done < record_size`, so the pointer stays inside `dst`.
                let ptr = unsafe { base.add(i as usize * record_size + done) };
                let len = (record_size - done) as u32;
                let file = types::Fixed(loc.shard);
                let entry = match fixed {
                    Some(index) => opcode::ReadFixed::new(file, ptr, len, index)
                        .offset(loc.offset + done as u64)
                        .build(),
                    None => opcode::Read::new(file, ptr, len)
                        .offset(loc.offset + done as u64)
                        .build(),
                };
                // SAFETY: the entry points into `dst`, which this call borrows mutably and does
                // not release before every submitted read has completed (the loop below drains
                // all in-flight reads even after an error).
                let pushed = unsafe { self.ring.submission().push(&entry.user_data(i as u64)) };
                if pushed.is_err() {
                    self.pending.push(i);
                    break;
                }
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if is_transient(&e) => {}
                Err(e) => {
                    // io_uring_enter fails as a whole only when the ring itself is unusable
                    // (per-read errors arrive in completions), so nothing more will complete:
                    // refuse all further use rather than resubmit into memory we gave back.
                    self.broken = true;
                    return Err(Error::Read {
                        path: self.files.dir().to_owned(),
                        offset: 0,
                        len: 0,
                        source: e,
                    });
                }
            }
            for cqe in self.ring.completion() {
                in_flight -= 1;
                let i = cqe.user_data() as usize;
                let res = cqe.result();
                let loc = &locs[i];
                if res < 0 {
                    if res == -nix::libc::EINTR || res == -nix::libc::EAGAIN {
                        self.pending.push(i as u32);
                    } else if first_error.is_none() {
                        first_error = Some(Error::Read {
                            path: self.files.path(loc.shard).to_owned(),
                            offset: loc.offset,
                            len: record_size,
                            source: std::io::Error::from_raw_os_error(-res),
                        });
                    }
                } else if res == 0 {
                    first_error.get_or_insert(Error::ShortRead {
                        path: self.files.path(loc.shard).to_owned(),
                        offset: loc.offset,
                        len: record_size,
                    });
                } else {
                    self.done[i] += res as u32;
                    if (self.done[i] as usize) < record_size {
                        self.pending.push(i as u32);
                    } else if first_error.is_none() && !stopped {
                        // SAFETY: record `i` is inside `dst` and its read has completed; no
                        // read in flight targets it, and no other view of it exists (`dst`
                        // itself is only used through `base` while reads are in flight).
                        let record = unsafe {
                            std::slice::from_raw_parts_mut(base.add(i * record_size), record_size)
                        };
                        stopped = on_read(i, record).is_break();
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Reads every shard file front to back with `O_DIRECT` (as opened), `block` bytes per read and
/// `queue_depth` reads in flight, into one scratch buffer: the raw limit the backends are
/// measured against. Returns the bytes read.
pub fn raw_sequential_read(
    files: &ShardSet,
    block: usize,
    queue_depth: u32,
    scratch: &mut [u8],
) -> Result<u64> {
    let mut ring = build_ring(&UringOptions {
        queue_depth,
        sqpoll: false,
    })?;
    let depth = queue_depth.max(1) as usize;
    assert!(
        scratch.len() >= block * depth,
        "scratch must hold queue_depth blocks"
    );
    let mut total = 0u64;
    for shard in 0..files.len() as u32 {
        let file = files.file(shard);
        let len = file
            .metadata()
            .map_err(|source| Error::Open {
                path: files.path(shard).to_owned(),
                source,
            })?
            .len();
        let fd = types::Fd(file.as_raw_fd());
        let mut next = 0u64;
        let mut in_flight = 0usize;
        let mut slot = 0usize;
        let mut error = None;
        loop {
            while in_flight < depth && next < len && error.is_none() {
                let n = block.min((len - next) as usize);
                // SAFETY: `slot < depth` and `n <= block`, inside `scratch`.
                let ptr = unsafe { scratch.as_mut_ptr().add(slot * block) };
                let entry: squeue::Entry =
                    opcode::Read::new(fd, ptr, n as u32).offset(next).build();
                // SAFETY: `scratch` is borrowed for this whole function, which drains every
                // read before returning. Reads share buffers: the data is discarded.
                if unsafe { ring.submission().push(&entry) }.is_err() {
                    break;
                }
                next += n as u64;
                slot = (slot + 1) % depth;
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            if let Err(e) = ring.submit_and_wait(1) {
                if !is_transient(&e) {
                    return Err(Error::Read {
                        path: files.path(shard).to_owned(),
                        offset: next,
                        len: block,
                        source: e,
                    });
                }
            }
            for cqe in ring.completion() {
                in_flight -= 1;
                if cqe.result() < 0 {
                    error.get_or_insert_with(|| Error::Read {
                        path: files.path(shard).to_owned(),
                        offset: next,
                        len: block,
                        source: std::io::Error::from_raw_os_error(-cqe.result()),
                    });
                } else {
                    total += cqe.result() as u64;
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
    }
    Ok(total)
}
