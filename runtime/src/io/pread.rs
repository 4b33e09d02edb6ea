//! The portable backend: one `pread` per record, in order, on the calling thread.

use std::sync::Arc;

use super::files::read_full_at;
use super::{BackendKind, ControlFlow, Error, ReadBackend, RecordLoc, Result, ShardSet};

pub struct PreadBackend {
    files: Arc<ShardSet>,
}

impl PreadBackend {
    pub fn new(files: Arc<ShardSet>) -> Self {
        PreadBackend { files }
    }
}

impl ReadBackend for PreadBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Pread
    }

    fn read_records(
        &mut self,
        locs: &[RecordLoc],
        record_size: usize,
        dst: &mut [u8],
        on_read: &mut dyn FnMut(usize, &mut [u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        for (i, (loc, buf)) in locs
            .iter()
            .zip(dst.chunks_exact_mut(record_size))
            .enumerate()
        {
            let file = self.files.file(loc.shard);
            let path = || self.files.path(loc.shard).to_owned();
            let got = read_full_at(file, buf, loc.offset).map_err(|source| Error::Read {
                path: path(),
                offset: loc.offset,
                len: record_size,
                source,
            })?;
            if got < record_size {
                return Err(Error::ShortRead {
                    path: path(),
                    offset: loc.offset,
                    len: record_size,
                });
            }
            if on_read(i, buf).is_break() {
                break;
            }
        }
        Ok(())
    }
}

/// Reads every shard front to back with plain `pread`, `block` bytes at a time: the raw limit
/// where io_uring is unavailable. Returns the bytes read.
pub fn raw_sequential_pread(files: &ShardSet, block: usize, scratch: &mut [u8]) -> Result<u64> {
    let buf = &mut scratch[..block];
    let mut total = 0u64;
    for shard in 0..files.len() as u32 {
        let file = files.file(shard);
        let mut offset = 0u64;
        loop {
            let got = read_full_at(file, buf, offset).map_err(|source| Error::Read {
                path: files.path(shard).to_owned(),
                offset,
                len: block,
                source,
            })?;
            total += got as u64;
            offset += got as u64;
            if got < block {
                break;
            }
        }
    }
    Ok(total)
}
