//! Sleeping until another thread has pushed to a lock-free queue, without lost wake-ups.
//!
//! The queues themselves are lock-free; this is only for the idle case. A waiter reads the
//! generation *before* it checks its queue, and sleeps only while the generation is unchanged,
//! so a push that lands between the check and the sleep is never missed.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub struct Doorbell {
    generation: Mutex<u64>,
    rung: Condvar,
}

impl Doorbell {
    pub fn generation(&self) -> u64 {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn ring(&self) {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.rung.notify_all();
    }

    /// Sleeps until the generation moves past `seen` or `timeout` passes.
    pub fn wait(&self, seen: u64, timeout: Duration) {
        let guard = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.rung.wait_timeout_while(guard, timeout, |g| *g == seen);
    }
}
