//! The memory behind ring slots, and the bytes of a slot as an engine receives them:
//! page-aligned, allocated once, behind a trait so that memory a device can read (host memory
//! imported into Vulkan) can back the ring: the loaders' reads then land where the GPU copies
//! each batch from, and the CPU never copies a batch. Here, below the ring, io and the
//! engines, because all three handle it.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use super::PAGE_SIZE;

/// A fixed, page-aligned block of memory that outlives every slot view handed out from it.
///
/// # Safety
///
/// Implementors guarantee that `base()` points to `len()` bytes that are valid for reads and
/// writes, aligned to [`PAGE_SIZE`], not moved or freed while `self` lives, and not accessed
/// through any other path than the pointer returned here.
pub unsafe trait SlotMemory: Send + Sync {
    fn base(&self) -> NonNull<u8>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where it lives, for logs and the run's start line ("host", "host, imported into Vulkan").
    fn kind(&self) -> &'static str;

    /// The device's name for this memory where a device imported it: how an engine finds the
    /// import a slot lies in ([`SlotBytes`]) without searching by address. `None` for plain
    /// host memory.
    fn import_id(&self) -> Option<ImportId> {
        None
    }

    /// All of it, for its owner to fill before any ring is made over it (a ring owns its
    /// memory, so `&mut` access here is exclusive).
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: per the trait's contract `base()` points to `len()` bytes valid for reads
        // and writes, reached by no other path; `&mut self` makes this the only live view.
        unsafe { std::slice::from_raw_parts_mut(self.base().as_ptr(), self.len()) }
    }
}

/// Which device import a block of slot memory is (see [`SlotMemory::import_id`]): unique
/// among the imports of one device for as long as the process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImportId(pub u64);

/// Bytes handed to an engine as a step's input, with where they lie in device-imported slot
/// memory when they do: the engine then copies them on the device from that import (found by
/// its id, not by address), and the CPU copies nothing. Made from a ring slot
/// ([`crate::ring::ReadyBatch::slot_bytes`]), from slot memory its owner holds
/// ([`SlotBytes::in_memory`]), or from any bytes ([`SlotBytes::plain`]).
#[derive(Debug, Clone, Copy)]
pub struct SlotBytes<'a> {
    bytes: &'a [u8],
    imported: Option<ImportedAt>,
}

/// Where [`SlotBytes`] start in an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportedAt {
    pub import: ImportId,
    /// Byte offset from the start of the imported memory.
    pub offset: u64,
}

impl<'a> SlotBytes<'a> {
    /// Bytes in no import: engines copy them with the CPU.
    pub fn plain(bytes: &'a [u8]) -> SlotBytes<'a> {
        SlotBytes {
            bytes,
            imported: None,
        }
    }

    /// `range` of `memory`, which the caller holds exclusively (so no one writes it while
    /// these bytes are borrowed). `None` where the range is not inside it.
    pub fn in_memory(
        memory: &'a mut dyn SlotMemory,
        range: std::ops::Range<usize>,
    ) -> Option<SlotBytes<'a>> {
        let import = memory.import_id();
        let offset = range.start as u64;
        let bytes: &'a [u8] = memory.bytes_mut().get(range)?;
        Some(SlotBytes {
            bytes,
            imported: import.map(|import| ImportedAt { import, offset }),
        })
    }

    /// Bytes at `offset` in `memory`, whose own invariants (the ring's slot states) keep
    /// anyone from writing them while they are borrowed.
    pub(crate) fn in_slot(memory: &dyn SlotMemory, bytes: &'a [u8], offset: usize) -> Self {
        debug_assert_eq!(
            memory.base().as_ptr() as usize + offset,
            bytes.as_ptr() as usize
        );
        SlotBytes {
            bytes,
            imported: memory.import_id().map(|import| ImportedAt {
                import,
                offset: offset as u64,
            }),
        }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Where they lie in an import, if they do.
    pub fn imported(&self) -> Option<ImportedAt> {
        self.imported
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Why an allocator could not hand out slot memory: its own error type, boxed (the Vulkan
/// engine's says what the driver refused), which callers show and fall back from.
pub type SlotError = Box<dyn std::error::Error + Send + Sync>;

/// Makes the ring's memory: the loader asks it for one block of the ring's size at start (and
/// at every restart with another shape). An engine hands one out when batches should land in
/// memory it reads directly.
pub trait SlotAllocator: Send + Sync + std::fmt::Debug {
    /// A zeroed block of at least `bytes` bytes, or why not (the loader then falls back to
    /// plain host memory, with a warning).
    fn allocate(&self, bytes: usize) -> Result<Box<dyn SlotMemory>, SlotError>;
}

/// Plain host memory from the global allocator, zeroed, page-aligned.
pub struct HostMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl HostMemory {
    /// Allocates `len` bytes (rounded up to whole pages). Returns `None` if the allocator
    /// refuses; callers turn that into a budget error, never an abort.
    pub fn zeroed(len: usize) -> Option<Self> {
        Self::zeroed_aligned(len, PAGE_SIZE)
    }

    /// As [`HostMemory::zeroed`], with start and length aligned to `align` (a power of two;
    /// at least a page is used): what a device importing the block may require.
    pub fn zeroed_aligned(len: usize, align: usize) -> Option<Self> {
        let align = align.max(PAGE_SIZE);
        if !align.is_power_of_two() {
            return None;
        }
        let len = len.max(1).checked_next_multiple_of(align)?;
        let layout = Layout::from_size_align(len, align).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(HostMemory { ptr, layout })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `layout.size()` initialised (zeroed) bytes while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.bytes_mut()
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout and freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: HostMemory owns its allocation exclusively; the ring synchronises access to regions.
unsafe impl Send for HostMemory {}
// SAFETY: see Send; shared references only hand out the base pointer.
unsafe impl Sync for HostMemory {}

// SAFETY: the allocation is page-aligned, `layout.size()` long, and lives until drop.
unsafe impl SlotMemory for HostMemory {
    fn base(&self) -> NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
    fn kind(&self) -> &'static str {
        "host"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_aligned_zeroed_and_rounded() {
        let mut m = HostMemory::zeroed(5000).unwrap();
        assert_eq!(m.base().as_ptr() as usize % PAGE_SIZE, 0);
        assert_eq!(m.len(), 8192);
        assert!(m.as_slice().iter().all(|&b| b == 0));
        m.as_mut_slice()[8191] = 7;
        assert_eq!(m.as_slice()[8191], 7);
    }

    #[test]
    fn larger_alignments_round_start_and_length() {
        let m = HostMemory::zeroed_aligned(5000, 65536).unwrap();
        assert_eq!(m.base().as_ptr() as usize % 65536, 0);
        assert_eq!(m.len(), 65536);
        assert!(HostMemory::zeroed_aligned(10, 3 * PAGE_SIZE).is_none());
    }
}
