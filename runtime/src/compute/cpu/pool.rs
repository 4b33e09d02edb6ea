//! A fixed pool of worker threads that runs one job of `parts` pieces at a time, without
//! allocating per job.
//!
//! Spawning threads per kernel call (as `std::thread::scope` does) allocates their stacks and
//! handles every time and costs tens of microseconds; a training step calls dozens of kernels.
//! The pool's threads are started once and sleep on a condition variable; [`Pool::run`]
//! publishes a borrowed closure, the calling thread and the workers take pieces by an index
//! counter, and `run` returns only when every piece is done, so the borrow it published is
//! never used after it returns. A piece that panics is caught in its worker and re-raised on
//! the calling thread.
//!
//! Waking a sleeping thread costs tens of microseconds (more in a VM): as much as a small
//! layer of a batch-1 forward pass takes. So, where the owner turns it on
//! ([`Pool::set_spinning`]), a worker that finished a job spins for [`SPIN`] watching for the
//! next one before it sleeps, and the caller spins for its workers' last pieces before it
//! sleeps: a forward pass's small jobs, which follow each other closely, find their threads
//! awake. The cost is a core kept busy for at most [`SPIN`] after the last job, and a
//! spinning thread slows its SMT sibling: off for the long jobs of training.
//!
//! A job is announced with a notify only where a thread sleeps, and its end only where the
//! caller sleeps: a notify is a system call even when nobody waits (an empty job took 1.1 µs
//! with every thread awake, most of it in two of them).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle thread of the pool watches for work before it sleeps (see the module
/// docs).
pub const SPIN: Duration = Duration::from_micros(200);

/// Spins until `done()` or [`SPIN`] has passed, where `on`; whether `done()` came true.
fn spin_until(on: &AtomicBool, done: impl Fn() -> bool) -> bool {
    if !on.load(Ordering::Relaxed) {
        return done();
    }
    let start = Instant::now();
    // One pause between looks, the clock read every 64 looks: a pause takes tens of cycles
    // on current x86 cores, and looking only every 32 of them (with the clock read each
    // time) left a job unseen for long enough that a two-piece job cost 1.2–1.4 µs more than
    // its piece, where it now costs 0.3–0.45 µs (`cargo run --release --example
    // pool_overhead`, 2-core x86 VM).
    for look in 1u32.. {
        if done() {
            return true;
        }
        if look % 64 == 0 && start.elapsed() > SPIN {
            return false;
        }
        std::hint::spin_loop();
    }
    unreachable!("the looks run out only after 2³² pauses, far beyond SPIN")
}

/// Most threads a pool (and so a kernel split) uses.
pub const MAX_THREADS: usize = 16;

/// The job being run: a pointer to the caller's closure, valid while `Pool::run` waits.
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn(usize) + Sync));

// SAFETY: the pointee is `Sync` (callable from any thread through `&`), and `Pool::run` keeps
// it alive until every worker has finished with it.
unsafe impl Send for Job {}

struct State {
    job: Option<Job>,
    parts: usize,
    /// Next piece to hand out.
    next: usize,
    /// Pieces not yet finished.
    remaining: usize,
    panicked: bool,
    shutdown: bool,
    /// Workers waiting on `Shared::work`: a job is announced to them only (a notify is a
    /// system call even when nobody waits, and most jobs find every worker spinning).
    sleeping: usize,
    /// Whether the caller waits on `Shared::done` for the last pieces, likewise.
    caller_waiting: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    /// Jobs published so far: what a spinning worker watches (it changes under the lock).
    jobs: AtomicUsize,
    /// `State::remaining`, readable without the lock: what a spinning caller watches.
    unfinished: AtomicUsize,
    /// Whether idle threads spin before they sleep.
    spinning: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Pieces run outside the lock, so a panic never poisons it mid-update.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes and runs pieces of the current job until none is left. Returns with the lock.
    fn work<'a>(&'a self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while let Some(job) = state.job.filter(|_| state.next < state.parts) {
            let i = state.next;
            state.next += 1;
            drop(state);
            // SAFETY: `job` points at the closure `Pool::run` published; `run` does not return
            // (and so the closure stays alive) until `remaining` reaches 0, which needs this
            // piece to finish first.
            let f = unsafe { &*job.0 };
            let ok = catch_unwind(AssertUnwindSafe(|| f(i))).is_ok();
            state = self.lock();
            state.panicked |= !ok;
            state.remaining -= 1;
            self.unfinished.store(state.remaining, Ordering::Release);
            if state.remaining == 0 && state.caller_waiting {
                self.done.notify_all();
            }
        }
        state
    }
}

/// See the module docs.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Serialises callers: one job at a time.
    caller: Mutex<()>,
}

impl Pool {
    /// A pool whose jobs run on `threads` threads in all: the caller plus `threads − 1`
    /// workers (`threads` is clamped to `1..=MAX_THREADS`).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                job: None,
                parts: 0,
                next: 0,
                remaining: 0,
                panicked: false,
                shutdown: false,
                sleeping: 0,
                caller_waiting: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            jobs: AtomicUsize::new(0),
            unfinished: AtomicUsize::new(0),
            spinning: AtomicBool::new(false),
        });
        let workers = (1..threads)
            .map(|k| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("fulcrum-compute-{k}"))
                    .spawn(move || {
                        let mut state = shared.lock();
                        loop {
                            state = shared.work(state);
                            if state.shutdown {
                                return;
                            }
                            let seen = shared.jobs.load(Ordering::Relaxed);
                            drop(state);
                            let woken = spin_until(&shared.spinning, || {
                                shared.jobs.load(Ordering::Acquire) != seen
                            });
                            state = shared.lock();
                            // No job and no shutdown came while spinning (both change under
                            // the lock, so this check and the wait miss neither): sleep.
                            let idle = !woken && shared.jobs.load(Ordering::Relaxed) == seen;
                            if idle && !state.shutdown {
                                state.sleeping += 1;
                                state = shared.work.wait(state).unwrap_or_else(|e| e.into_inner());
                                state.sleeping -= 1;
                            }
                        }
                    })
                    .expect("spawning a compute thread")
            })
            .collect();
        Pool {
            shared,
            threads: workers,
            caller: Mutex::new(()),
        }
    }

    /// Idle threads spin for [`SPIN`] before they sleep (see the module docs).
    pub fn set_spinning(&self, on: bool) {
        self.shared.spinning.store(on, Ordering::Relaxed);
    }

    /// Threads a job runs on (the caller included).
    pub fn threads(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `f(0) … f(parts − 1)`, spread over the pool's threads and the caller, and returns
    /// when all are done. Panics (on this thread) if any piece panicked.
    pub fn run(&self, parts: usize, f: &(dyn Fn(usize) + Sync)) {
        if parts == 0 {
            return;
        }
        if parts == 1 || self.threads.is_empty() {
            (0..parts).for_each(f);
            return;
        }
        let _one_at_a_time = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let job: *const (dyn Fn(usize) + Sync + '_) = f;
        // SAFETY: only the lifetime is erased. The pointer is dereferenced by pieces only, and
        // this function waits below until every piece has finished, so `f` outlives them.
        let job = Job(unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(job)
        });
        let mut state = self.shared.lock();
        state.job = Some(job);
        state.parts = parts;
        state.next = 0;
        state.remaining = parts;
        state.panicked = false;
        self.shared.unfinished.store(parts, Ordering::Relaxed);
        self.shared.jobs.fetch_add(1, Ordering::Release);
        if state.sleeping > 0 {
            self.shared.work.notify_all();
        }
        state = self.shared.work(state);
        if state.remaining > 0 {
            drop(state);
            spin_until(&self.shared.spinning, || {
                self.shared.unfinished.load(Ordering::Acquire) == 0
            });
            state = self.shared.lock();
        }
        while state.remaining > 0 {
            state.caller_waiting = true;
            state = self
                .shared
                .done
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
            state.caller_waiting = false;
        }
        state.job = None;
        let panicked = state.panicked;
        drop(state);
        if panicked {
            panic!("a compute thread panicked (see its message above)");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.threads())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_piece_runs_once_on_several_threads() {
        let pool = Pool::new(3);
        assert_eq!(pool.threads(), 3);
        for parts in [1, 2, 3, 7, 64] {
            let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            let names = Mutex::new(std::collections::HashSet::new());
            pool.run(parts, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
                names
                    .lock()
                    .unwrap()
                    .insert(std::thread::current().name().map(str::to_owned));
                std::thread::sleep(std::time::Duration::from_millis(2));
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "parts {parts}"
            );
            if parts >= 7 {
                assert!(names.lock().unwrap().len() >= 2, "work was spread");
            }
        }
    }

    #[test]
    fn borrows_of_the_caller_are_safe_to_write_through_pieces() {
        let pool = Pool::new(4);
        let mut data = vec![0u32; 1000];
        let chunks: Vec<Mutex<&mut [u32]>> = data.chunks_mut(100).map(Mutex::new).collect();
        pool.run(chunks.len(), &|i| {
            for (j, v) in chunks[i].lock().unwrap().iter_mut().enumerate() {
                *v = (i * 100 + j) as u32;
            }
        });
        drop(chunks);
        assert!(data.iter().enumerate().all(|(i, &v)| v == i as u32));
    }

    #[test]
    fn a_panicking_piece_is_reported_and_the_pool_keeps_working() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(4, &|i| assert!(i != 2, "piece two fails"));
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(5, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 5);
    }

    /// With spinning on, jobs in quick succession still run every piece once, and the pool
    /// still shuts down (a worker spinning when the pool is dropped must see the shutdown).
    #[test]
    fn spinning_threads_take_every_job_and_still_shut_down() {
        let pool = Pool::new(3);
        pool.set_spinning(true);
        let count = AtomicUsize::new(0);
        for _ in 0..2000 {
            pool.run(3, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(count.load(Ordering::Relaxed), 6000);
        drop(pool);
        let pool = Pool::new(2);
        pool.set_spinning(true);
        pool.run(2, &|_| {});
        // Dropped while its worker spins (within SPIN of the last job): join must not hang.
    }
}
