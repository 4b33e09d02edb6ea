//! Training: the step loop, the learning-rate schedule and checkpoints.

pub mod autotune;
pub mod bench_balance;
pub mod checkpoint;
pub mod schedule;
pub mod trainer;

pub use checkpoint::{Checkpoint, Progress};
pub use schedule::Schedule;
