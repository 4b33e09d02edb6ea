//! The memory behind ring slots: page-aligned, allocated once, behind a trait so that
//! host-visible device memory (Vulkan, unified-memory boards) can back the ring later.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::format::PAGE_SIZE;

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
    /// Where it lives, for logs and the memory budget report ("host", "vulkan host-visible").
    fn kind(&self) -> &'static str;
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
        let len = crate::format::page_align(len.max(1));
        let layout = Layout::from_size_align(len, PAGE_SIZE).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(HostMemory { ptr, layout })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `layout.size()` initialised (zeroed) bytes while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only live view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
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
}
