//! Training: the step loop and the learning-rate schedule (checkpoints are the model's:
//! [`crate::model::checkpoint`]).

pub mod autotune;
pub mod plan;
pub mod recipe;
pub mod schedule;
pub mod trainer;

pub use schedule::Schedule;
