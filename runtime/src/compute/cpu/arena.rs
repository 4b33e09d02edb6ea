//! The CPU engine's tensor memory: one allocation of floats ([`Arena`]) that a
//! [`crate::compute::storage::ArenaPlan`] divides among the recording's `f32` tensors, those
//! whose lifetimes never overlap at overlapping offsets.
//!
//! A step reads some tensors and writes others, all parts of the one allocation, so they
//! cannot be borrowed from it the usual way (one `&mut` of the whole would forbid every
//! other view). Views are made from the raw pointer instead, each over its tensor's range;
//! what keeps them apart is the plan, which places every two tensors that are ever live at
//! once (every two tensors one step touches among them) at disjoint offsets.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// One zeroed allocation of `len` floats, freed on drop, starting on a cache line: the plan's
/// offsets are multiples of 64 bytes, which lands every tensor on a line only if the arena
/// starts on one (an allocator's large blocks start 16 bytes past a page, which had split every
/// other 32-byte load of a row across two lines).
#[derive(Debug)]
pub(super) struct Arena {
    ptr: NonNull<f32>,
    len: usize,
}

/// The arena's alignment in bytes: a cache line.
const LINE: usize = 64;

// SAFETY: the arena owns its allocation (no thread-local or shared state); moving it to
// another thread moves that ownership.
unsafe impl Send for Arena {}

impl Arena {
    pub fn zeroed(len: usize) -> Arena {
        let Some(layout) = Self::layout(len) else {
            return Arena {
                ptr: NonNull::dangling(),
                len: 0,
            };
        };
        // SAFETY: the layout's size is not zero (`layout` gives none for an empty arena).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<f32>()) else {
            std::alloc::handle_alloc_error(layout)
        };
        Arena { ptr, len }
    }

    /// The allocation of `len` floats on a cache line; none for an empty arena. Panics where
    /// `len` floats cannot be one allocation (as `vec!` would).
    fn layout(len: usize) -> Option<std::alloc::Layout> {
        let layout = std::alloc::Layout::array::<f32>(len)
            .and_then(|l| l.align_to(LINE))
            .unwrap_or_else(|_| panic!("an arena of {len} floats is too large"));
        (len > 0).then_some(layout)
    }

    /// The first of floats `offset..offset + len`, for kernels whose threads each write
    /// parts of them that no `&mut` slice can be cut for (the copies of
    /// [`super::band_copies`]): what keeps those writes apart is the caller's to show.
    pub fn at(&self, offset: usize, len: usize) -> *mut f32 {
        assert!(offset + len <= self.len, "{offset}+{len} of {}", self.len);
        // SAFETY: in bounds (checked above; a zero-length arena has offset 0 and len 0).
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// Floats `offset..offset + len`, to read.
    pub fn slice(&self, offset: usize, len: usize) -> &[f32] {
        assert!(offset + len <= self.len, "{offset}+{len} of {}", self.len);
        // SAFETY: in bounds (checked), initialised (zeroed at allocation, written only as
        // floats since); no `TensorMut` over these floats exists while a step reads them
        // (the contract of `slice_mut`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// Floats `offset..offset + len`, to write.
    ///
    /// # Safety
    /// While the returned view lives, no other view (from `slice` or `slice_mut`) may cover
    /// any of these floats, and the arena must not be dropped.
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> TensorMut {
        assert!(offset + len <= self.len, "{offset}+{len} of {}", self.len);
        TensorMut {
            // SAFETY: in bounds (checked above).
            ptr: unsafe { self.ptr.as_ptr().add(offset) },
            len,
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: `ptr` came from `alloc_zeroed` with this same layout in `zeroed` (an
            // empty arena allocated nothing and has no layout), and is freed once, here.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
        }
    }
}

/// A tensor's floats in the [`Arena`], to write (see [`Arena::slice_mut`]).
#[derive(Debug)]
pub(crate) struct TensorMut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the view is exclusive over its floats (the contract of `Arena::slice_mut`), as a
// `&mut [f32]` is, and that is `Send`.
unsafe impl Send for TensorMut {}

impl Deref for TensorMut {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: in bounds and exclusive (the contract of `Arena::slice_mut`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for TensorMut {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: in bounds and exclusive (the contract of `Arena::slice_mut`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_views_read_and_write_their_own_floats() {
        let arena = Arena::zeroed(64);
        {
            // SAFETY: 0..16 and 32..48 are disjoint; no other view exists in this block.
            let (mut a, mut b) = unsafe { (arena.slice_mut(0, 16), arena.slice_mut(32, 16)) };
            a.fill(1.0);
            b.fill(2.0);
        }
        assert_eq!(arena.slice(0, 16), &[1.0; 16]);
        assert_eq!(arena.slice(16, 16), &[0.0; 16]);
        assert_eq!(arena.slice(32, 16), &[2.0; 16]);
    }

    #[test]
    fn arenas_start_on_a_cache_line_and_empty_ones_allocate_nothing() {
        for len in [1, 5, 4096, 1 << 20] {
            let arena = Arena::zeroed(len);
            assert_eq!(
                arena.slice(0, len).as_ptr() as usize % LINE,
                0,
                "{len} floats"
            );
            assert!(arena.slice(0, len).iter().all(|&v| v == 0.0));
        }
        assert_eq!(Arena::zeroed(0).slice(0, 0), &[] as &[f32]);
    }

    #[test]
    #[should_panic(expected = "too large")]
    fn an_arena_past_the_address_space_is_refused() {
        Arena::zeroed(usize::MAX / 2);
    }

    #[test]
    #[should_panic]
    fn views_past_the_end_are_refused() {
        Arena::zeroed(8).slice(4, 8);
    }
}
