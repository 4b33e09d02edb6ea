//! A developer's switch for A/B timings on a noisy host.
//!
//! Timings of separate processes, even alternating, compare moments of the host as much as
//! code: on a shared 2-core VM whose speed swings by a third from one second to the next,
//! they could not see a GEMM change that made det-s's forward pass 16 % faster. `bench
//! compute --ab` alternates its runs between variant A and variant B inside one process
//! instead, so both see the same moments, and reports each one's figures. Code under trial
//! asks [`is_b`] which variant to run, for the length of the trial; nothing that lands
//! branches on it. With nothing switching, A and B are the same code, and their difference is
//! the host's noise floor.
//!
//! Ask it outside the hot loops, to choose between variants that are each compiled whole (a
//! const generic, a second function): a test of it inside a register tile changes how both
//! variants compile. A GEMM tile that stores its rows only after computing all its values
//! (variant B) took 0.93–0.95× the forward time of one that stores each row when it is done
//! (A), B's time over A's, with `is_b()` tested in the tile; with each variant its own
//! monomorph it took 1.05–1.06×, which builds of each alone confirmed.

use std::sync::atomic::{AtomicBool, Ordering};

static B: AtomicBool = AtomicBool::new(false);

/// Whether the run in progress is variant B (always false outside `bench compute --ab`).
pub fn is_b() -> bool {
    B.load(Ordering::Relaxed)
}

/// Makes the next runs variant B (`true`) or A.
pub(crate) fn set_b(b: bool) {
    B.store(b, Ordering::Relaxed);
}
