//! Working memory and threads for the CPU kernels.
//!
//! A [`Scratch`] is a thread budget plus the working memory of that many threads. It is sized
//! once, at set-up, with [`Scratch::reserve`] from the kernels' `*_scratch_len` functions (the
//! largest over a model's layers); the kernels then only borrow it, and panic with the name of
//! the function to call when it is too small, so a step never allocates behind the caller's
//! back.
//!
//! Threads: kernels that split work (the convolutions, over the batch) use up to
//! [`Scratch::threads`] threads, through [`run_parts`]: the first part runs on the calling
//! thread, the others on scoped threads (`std::thread::scope`). With one thread, or one part of
//! work, nothing is spawned and nothing is allocated. Spawning does allocate (the threads'
//! stacks and handles) and costs some tens of microseconds per kernel call: worth it for a
//! training batch, not for one image. Results with different thread counts can differ in the
//! last bits (sums are added in a different order); with the same count they are identical.

use std::ops::Range;

/// Working memory for `threads` threads (see the module docs).
#[derive(Debug, Clone)]
pub struct Scratch {
    buf: Vec<f32>,
    threads: usize,
}

impl Default for Scratch {
    /// One thread, no memory yet.
    fn default() -> Self {
        Scratch::new(1)
    }
}

impl Scratch {
    /// A scratch for `threads` threads (0 is taken as 1), with no memory yet.
    pub fn new(threads: usize) -> Self {
        Scratch {
            buf: Vec::new(),
            threads: threads.max(1),
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Makes room for `per_thread` floats for each thread. Allocates only when it grows: call
    /// it at set-up with each kernel's `*_scratch_len`.
    pub fn reserve(&mut self, per_thread: usize) {
        let want = per_thread * self.threads;
        if self.buf.len() < want {
            self.buf.resize(want, 0.0);
        }
    }

    /// Floats available to each thread.
    pub fn per_thread(&self) -> usize {
        self.buf.len() / self.threads
    }

    /// The first `per_thread × parts` floats, or a panic naming `len_fn` when they are not
    /// there (a set-up bug, not a runtime condition).
    pub(crate) fn take(&mut self, per_thread: usize, parts: usize, len_fn: &str) -> &mut [f32] {
        assert!(
            parts <= self.threads && self.per_thread() >= per_thread,
            "CPU kernel scratch too small: {} floats per thread for {} threads, {per_thread} \
             needed for {parts} (call Scratch::reserve({len_fn}(op)) at set-up)",
            self.per_thread(),
            self.threads,
        );
        &mut self.buf[..per_thread * parts]
    }
}

/// Part `i` of `0..n` split into `parts` contiguous ranges whose lengths differ by at most 1
/// (the first `n % parts` ranges are the longer ones).
pub(crate) fn part_range(n: usize, parts: usize, i: usize) -> Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Splits `data` (`n` items of `per_item` elements each) into the `parts` pieces of
/// [`part_range`], paired with their item ranges.
pub(crate) fn split_parts<T>(
    data: &mut [T],
    n: usize,
    per_item: usize,
    parts: usize,
) -> impl Iterator<Item = (Range<usize>, &mut [T])> {
    assert!(data.len() >= n * per_item, "tensor shorter than its shape");
    let mut rest = data;
    (0..parts).map(move |i| {
        let range = part_range(n, parts, i);
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(range.len() * per_item);
        rest = tail;
        (range, head)
    })
}

/// Runs `f` on every item, the first on the calling thread and the others on scoped threads;
/// with a single item nothing is spawned (and nothing allocated).
pub(crate) fn run_parts<T: Send, F: Fn(T) + Sync>(items: impl Iterator<Item = T>, f: F) {
    let mut items = items.peekable();
    let Some(first) = items.next() else {
        return;
    };
    if items.peek().is_none() {
        f(first);
        return;
    }
    let f = &f;
    std::thread::scope(|s| {
        for item in items {
            s.spawn(move || f(item));
        }
        f(first);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn parts_cover_the_range_evenly() {
        for n in 0..20 {
            for parts in 1..5 {
                let mut next = 0;
                for i in 0..parts {
                    let r = part_range(n, parts, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() == n / parts || r.len() == n / parts + 1);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn run_parts_visits_every_piece_once() {
        let mut data: Vec<u32> = vec![0; 7 * 3];
        let seen = AtomicUsize::new(0);
        run_parts(split_parts(&mut data, 7, 3, 3), |(range, piece)| {
            assert_eq!(piece.len(), range.len() * 3);
            for (j, v) in piece.iter_mut().enumerate() {
                *v = (range.start * 3 + j) as u32;
            }
            seen.fetch_add(range.len(), Ordering::Relaxed);
        });
        assert_eq!(seen.into_inner(), 7);
        assert!(data.iter().enumerate().all(|(i, &v)| v == i as u32));
    }

    #[test]
    #[should_panic(expected = "Scratch::reserve(some_len(op))")]
    fn too_small_scratch_names_the_fix() {
        let mut s = Scratch::new(2);
        s.reserve(10);
        assert_eq!(s.per_thread(), 10);
        s.take(11, 2, "some_len");
    }
}
