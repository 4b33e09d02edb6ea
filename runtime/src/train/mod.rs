//! Training: the step loop and the learning-rate schedule (checkpoints are the model's:
//! [`crate::model::checkpoint`]).
//!
//! [`config`] holds what a run is configured by, [`plan`] sizes it before anything is
//! allocated, [`start`] chooses its first weights, [`trainer`] runs the steps, and [`report`]
//! is what it tells its caller.

pub mod autotune;
pub mod config;
pub mod plan;
pub mod recipe;
pub mod report;
pub mod schedule;
pub mod start;
pub mod trainer;

pub use config::{
    Error, Result, RunOptions, TrainConfig, CHECKPOINT_FILE, DEFAULT_REPLAY_FRACTION,
};
pub use report::{
    EpochReport, Frozen, GradNorm, GradNormSummary, Observer, Quiet, ReplayInfo, RunInfo,
    StepReport, TrainReport,
};
pub use schedule::Schedule;
pub use trainer::train;
