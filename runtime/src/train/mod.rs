//! Training: the step loop, the learning-rate schedule and checkpoints.

pub mod checkpoint;
pub mod schedule;

pub use checkpoint::{Checkpoint, Progress};
pub use schedule::Schedule;
