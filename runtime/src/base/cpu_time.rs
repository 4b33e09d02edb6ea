//! The calling thread's CPU time: what the balance equation's `T_g`, the benches and the
//! engines' own timings count beside wall time.

use std::time::Duration;

/// CPU time of the calling thread (zero where the clock is unavailable).
pub fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32))
        .unwrap_or_default()
}
