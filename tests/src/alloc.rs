//! A counting global allocator for the no-allocation tests. Each such test is its own binary
//! and declares `#[global_allocator] static GLOBAL: Counting = Counting;`; it then reads
//! [`allocations`] around the measured work. [`ignore_this_thread`] leaves a thread out (a test
//! that plays a client of the code under test), and [`trace`] prints where the first few
//! counted allocations come from (`FULCRUM_ALLOC_TRACE=1`, with `--nocapture`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Forwards to the system allocator, counting every allocation and reallocation.
pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Set while measuring with FULCRUM_ALLOC_TRACE=1: print where allocations come from.
static TRACE: AtomicBool = AtomicBool::new(false);
/// Backtraces left to print.
static TRACES_LEFT: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Set while this thread prints a trace (which allocates): those allocations are not traced.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
    /// Set on threads whose allocations are not the subject of the test.
    static IGNORED: Cell<bool> = const { Cell::new(false) };
}

/// Allocations counted so far, on every thread not ignored.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Relaxed)
}

/// Leaves the calling thread's allocations out of the count from now on.
pub fn ignore_this_thread() {
    IGNORED.with(|i| i.set(true));
}

/// With `FULCRUM_ALLOC_TRACE` set, prints a backtrace for each of the next `n` counted
/// allocations (`n` = 0 stops).
pub fn trace(n: u32) {
    TRACES_LEFT.store(n, Relaxed);
    TRACE.store(
        n > 0 && std::env::var_os("FULCRUM_ALLOC_TRACE").is_some(),
        Relaxed,
    );
}

fn note_allocation(size: usize) {
    // `try_with`: thread-local storage may be gone while a thread exits.
    if IGNORED.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    if !TRACE.load(Relaxed) {
        ALLOCATIONS.fetch_add(1, Relaxed);
        return;
    }
    let _ = IN_TRACE.try_with(|busy| {
        if busy.get() {
            // The trace's own allocations are not counted.
            return;
        }
        ALLOCATIONS.fetch_add(1, Relaxed);
        if TRACES_LEFT.load(Relaxed) == 0 {
            return;
        }
        TRACES_LEFT.fetch_sub(1, Relaxed);
        busy.set(true);
        let thread = std::thread::current();
        eprintln!(
            "allocation of {size} bytes on thread {:?}:\n{}",
            thread.name(),
            std::backtrace::Backtrace::force_capture()
        );
        busy.set(false);
    });
}

// SAFETY: every call is forwarded unchanged to `System`; counting has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation(new_size);
        // SAFETY: as for `alloc`; `ptr` was allocated by `System` through this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}
