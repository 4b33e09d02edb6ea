//! The host memory a device has imported and not yet released (`VK_EXT_external_memory_host`;
//! see [`super::host_import`]): kept by the device, so that an upload of a ring slot's bytes
//! finds the import they lie in by the id they carry, and an import cannot be released while
//! an upload copies from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use ash::vk;

use crate::base::{ImportId, ImportedAt, SlotBytes};

/// What the device needs to import host memory, and the imports alive now.
pub(crate) struct HostImport {
    fns: ash::ext::external_memory_host::Device,
    /// `minImportedHostPointerAlignment`: start and size of an import are multiples of it.
    alignment: u64,
    live: Mutex<Vec<LiveImport>>,
    /// The id of the next import.
    next_id: AtomicU64,
}

/// One live import: its id, length and the buffer over it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveImport {
    id: ImportId,
    len: u64,
    buffer: vk::Buffer,
}

impl LiveImport {
    /// Whether `len` bytes at `at` lie wholly inside this import.
    fn holds(&self, at: ImportedAt, len: usize) -> bool {
        at.import == self.id
            && at
                .offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.len)
    }
}

/// The import holding some bytes: its buffer and where the bytes start in it. The guard keeps
/// every import alive (none can be unregistered) until it is dropped.
pub(crate) struct Found<'a> {
    _guard: MutexGuard<'a, Vec<LiveImport>>,
    pub(crate) buffer: vk::Buffer,
    pub(crate) offset: u64,
}

impl HostImport {
    pub(crate) fn new(fns: ash::ext::external_memory_host::Device, alignment: u64) -> HostImport {
        HostImport {
            fns,
            alignment,
            live: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<LiveImport>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live import `data` lies in, found by the id it carries. `None` for plain or empty
    /// bytes, and for an import of another device, one dropped since, or a range past its end.
    pub(crate) fn find(&self, data: SlotBytes<'_>) -> Option<Found<'_>> {
        let at = data.imported()?;
        if data.is_empty() {
            return None;
        }
        let guard = self.lock();
        let Some(&hit) = guard.iter().find(|i| i.holds(at, data.len())) else {
            log::debug!("Vulkan: {at:?} is no live import of this device; copying on the host");
            return None;
        };
        Some(Found {
            _guard: guard,
            buffer: hit.buffer,
            offset: at.offset,
        })
    }

    /// `minImportedHostPointerAlignment`: start and size of an import are multiples of it.
    pub(crate) fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The extension's functions.
    pub(crate) fn fns(&self) -> &ash::ext::external_memory_host::Device {
        &self.fns
    }

    /// The id for a new import.
    pub(crate) fn next_id(&self) -> ImportId {
        ImportId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Lists import `id`, `len` bytes with `buffer` over them, as alive.
    pub(crate) fn add(&self, id: ImportId, len: u64, buffer: vk::Buffer) {
        self.lock().push(LiveImport { id, len, buffer });
    }

    /// Takes the import with `buffer` off the list, after any upload copying from it has
    /// finished (an upload holds the lock, through [`Found`], until its copy is done).
    pub(crate) fn remove(&self, buffer: vk::Buffer) {
        self.lock().retain(|i| i.buffer != buffer);
    }

    /// How many imports are alive.
    pub(crate) fn live(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ranges_wholly_inside_the_named_import_are_found() {
        let import = LiveImport {
            id: ImportId(3),
            len: 0x3000,
            buffer: vk::Buffer::null(),
        };
        let at = |offset| ImportedAt {
            import: ImportId(3),
            offset,
        };
        assert!(import.holds(at(0), 0x3000));
        assert!(import.holds(at(0x2000), 0x1000), "ends at the end");
        assert!(
            !import.holds(at(0x2000), 0x1001),
            "runs one byte past the end"
        );
        assert!(!import.holds(at(0x3000), 1), "starts at the end");
        assert!(!import.holds(at(u64::MAX), 2), "overflows");
        let other = ImportedAt {
            import: ImportId(4),
            offset: 0,
        };
        assert!(!import.holds(other, 1), "another import");
    }
}
