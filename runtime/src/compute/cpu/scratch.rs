//! Working memory and threads for the CPU kernels.
//!
//! A [`Scratch`] is a thread budget plus the working memory of that many threads. It is sized
//! once, at set-up, with [`Scratch::reserve`] from the kernels' `*_scratch_len` functions (the
//! largest over a model's layers); the kernels then only borrow it, and panic with the name of
//! the function to call when it is too small, so a step never allocates behind the caller's
//! back.
//!
//! Threads: kernels that split work (the convolutions, over the batch) use up to
//! [`Scratch::threads`] threads, through `run_parts`, on the scratch's own [`Pool`] of
//! threads started once at set-up: a kernel call neither spawns nor allocates. With one
//! thread there is no pool and everything runs on the calling thread. Results with different
//! thread counts can differ in the last bits (sums are added in a different order); with the
//! same count they are identical.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::pool::{Pool, MAX_THREADS};

/// Working memory for `threads` threads (see the module docs).
#[derive(Clone)]
pub struct Scratch {
    buf: Vec<f32>,
    threads: usize,
    /// The worker threads (none with one thread); shared by clones.
    pool: Option<Arc<Pool>>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("floats", &self.buf.len())
            .field("threads", &self.threads)
            .finish()
    }
}

impl Default for Scratch {
    /// One thread, no memory yet.
    fn default() -> Self {
        Scratch::new(1)
    }
}

impl Scratch {
    /// A scratch for `threads` threads (clamped to `1..=MAX_THREADS`), with no memory yet;
    /// more than one thread starts a [`Pool`].
    pub fn new(threads: usize) -> Self {
        let threads = Self::threads_for(threads);
        Scratch {
            buf: Vec::new(),
            threads,
            pool: (threads > 1).then(|| Arc::new(Pool::new(threads))),
        }
    }

    /// A scratch with no memory yet on `other`'s threads (its pool, shared): for an
    /// executor that runs only inside another's run.
    pub fn sharing_threads(other: &Scratch) -> Self {
        Scratch {
            buf: Vec::new(),
            threads: other.threads,
            pool: other.pool.clone(),
        }
    }

    /// The threads a scratch made for `threads` runs: `threads` clamped to `1..=MAX_THREADS`.
    pub fn threads_for(threads: usize) -> usize {
        threads.clamp(1, MAX_THREADS)
    }

    /// The thread pool kernels split their work over (`None`: run on the calling thread).
    /// Cloning the handle does not allocate.
    pub fn pool(&self) -> Option<Arc<Pool>> {
        self.pool.clone()
    }

    /// Floats held in all.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
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

    /// `per_part` floats for each of `parts` parts, or a panic naming `len_fn` when they
    /// are not there (a set-up bug, not a runtime condition). Part `k`'s floats start at
    /// `k ×` [`Scratch::per_thread`] whatever `per_part` is, so every kernel's part `k` works
    /// in the same memory (the pool's first part runs on the calling thread, the next on the
    /// first worker): packed end to end, one layer's second part began inside what another
    /// layer's first part had written on the other core, and every store to it fetched the
    /// line from there first (det-s's forward at two threads: 0.97–0.99× the time with
    /// this layout, runs alternating in one process).
    pub(crate) fn take(
        &mut self,
        per_part: usize,
        parts: usize,
        len_fn: &str,
    ) -> impl Iterator<Item = &mut [f32]> {
        assert!(
            parts <= self.threads && self.per_thread() >= per_part,
            "CPU kernel scratch too small: {} floats per thread for {} threads, {per_part} \
             needed for {parts} (call Scratch::reserve({len_fn}(op)) at set-up)",
            self.per_thread(),
            self.threads,
        );
        let stride = self.per_thread();
        let mut rest = &mut self.buf[..stride * parts];
        (0..parts).map(move |_| {
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(stride);
            rest = tail;
            &mut part[..per_part]
        })
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

/// Runs `f` on every item (at most [`MAX_THREADS`]) on `pool`'s threads and the calling
/// thread; without a pool, or with a single item, all on the calling thread. Allocates
/// nothing: the items wait in a stack array for the thread that takes them.
pub(crate) fn run_parts<T: Send, F: Fn(T) + Sync>(
    pool: Option<&Pool>,
    items: impl Iterator<Item = T>,
    f: F,
) {
    let mut slots: [Mutex<Option<T>>; MAX_THREADS] = std::array::from_fn(|_| Mutex::new(None));
    let mut count = 0;
    for item in items {
        assert!(
            count < MAX_THREADS,
            "run_parts: more than {MAX_THREADS} parts"
        );
        *slots[count].get_mut().unwrap_or_else(|e| e.into_inner()) = Some(item);
        count += 1;
    }
    let run = |i: usize| {
        let item = slots[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        f(item.expect("each part is taken once"));
    };
    match pool {
        Some(pool) if count > 1 => pool.run(count, &run),
        _ => (0..count).for_each(run),
    }
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
        let pool = Pool::new(3);
        run_parts(
            Some(&pool),
            split_parts(&mut data, 7, 3, 3),
            |(range, piece)| {
                assert_eq!(piece.len(), range.len() * 3);
                for (j, v) in piece.iter_mut().enumerate() {
                    *v = (range.start * 3 + j) as u32;
                }
                seen.fetch_add(range.len(), Ordering::Relaxed);
            },
        );
        assert_eq!(seen.into_inner(), 7);
        assert!(data.iter().enumerate().all(|(i, &v)| v == i as u32));
    }

    #[test]
    fn each_part_works_in_the_same_place_whatever_its_length() {
        let mut s = Scratch::new(3);
        s.reserve(10);
        let base = s.buf.as_ptr() as usize;
        for (per, parts) in [(10, 3), (4, 3), (7, 2), (0, 3)] {
            let starts: Vec<usize> = s
                .take(per, parts, "some_len")
                .map(|p| {
                    assert_eq!(p.len(), per);
                    (p.as_ptr() as usize - base) / 4
                })
                .collect();
            assert_eq!(starts, (0..parts).map(|k| 10 * k).collect::<Vec<_>>());
        }
    }

    #[test]
    #[should_panic(expected = "Scratch::reserve(some_len(op))")]
    fn too_small_scratch_names_the_fix() {
        let mut s = Scratch::new(2);
        s.reserve(10);
        assert_eq!(s.per_thread(), 10);
        let _ = s.take(11, 2, "some_len");
    }
}
