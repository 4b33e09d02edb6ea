//! What a job of the CPU engine's thread pool costs beyond its work: a two-piece job on a
//! two-thread pool (spinning on, as for a batch-1 forward pass) against one piece run alone,
//! for pieces of a few sizes, three rounds each. A developer's measurement, not a test:
//!
//!     cargo run --release --example pool_overhead

use fulcrum::compute::cpu::pool::Pool;
use std::hint::black_box;
use std::time::Instant;

/// A piece of `n` dependent multiply-adds (about 1 ns each).
fn piece(n: usize) -> f32 {
    let mut x = 1.0f32;
    for _ in 0..n {
        x = black_box(x * 1.000_000_1 + 0.1);
    }
    x
}

fn main() {
    let pool = Pool::new(2);
    pool.set_spinning(true);
    let iters = 20_000;
    for n in [0usize, 1000, 5000] {
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..iters {
                pool.run(2, &|_| {
                    black_box(piece(n));
                });
            }
            let job = t.elapsed().as_secs_f64() / iters as f64 * 1e6;
            let t = Instant::now();
            for _ in 0..iters {
                black_box(piece(n));
            }
            let alone = t.elapsed().as_secs_f64() / iters as f64 * 1e6;
            println!(
                "piece of {n:>4} steps: two-piece job {job:.2} µs, one piece alone {alone:.2} µs, \
                 overhead {:.2} µs",
                job - alone
            );
        }
    }
}
