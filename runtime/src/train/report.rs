//! What a training run tells its caller: [`RunInfo`] before the first step, a [`StepReport`]
//! per step and an [`EpochReport`] per epoch to an [`Observer`], and the [`TrainReport`] at
//! the end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::autotune::{Decision, Tuning};
use crate::balance::BalanceReport;
use crate::base::MemoryPlan;
use crate::compute::recording::LOSS_LEN;
use crate::model::checkpoint::Progress;

/// What the run is about to do, for the observer.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub model: String,
    pub engine: String,
    pub records: u64,
    pub batches_per_epoch: u64,
    pub total_steps: u64,
    pub first_step: u64,
    pub memory: MemoryPlan,
    pub backend: String,
    /// Where the ring's slots live ([`crate::loader::Loader::ring_memory`]).
    pub ring_memory: String,
    pub param_count: usize,
    /// With frozen layers: what freezing saves.
    pub frozen: Option<Frozen>,
    /// With replay: where its records come from and how many a batch holds.
    pub replay: Option<ReplayInfo>,
}

/// The replay data a run mixes into its batches.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayInfo {
    pub dir: PathBuf,
    pub records: u64,
    /// Replay records in each batch of `batch`.
    pub per_batch: usize,
    pub batch: usize,
    /// Classes only the replay data has, trained besides the data's own.
    pub new_classes: usize,
}

/// What a run with frozen layers leaves out, against the same run training every layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Frozen {
    pub freeze: crate::model::Freeze,
    /// The frozen layers' biases train ([`super::TrainConfig::train_biases`]).
    pub train_biases: bool,
    /// Parameter tensors frozen, of all.
    pub tensors: usize,
    pub of: usize,
    /// The engine's plan at the run's batch, frozen and with every layer training.
    pub plan_bytes: u64,
    pub unfrozen_plan_bytes: u64,
}

/// One step's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    pub step: u64,
    pub epoch: u64,
    pub loss: [f32; LOSS_LEN],
    pub lr: f32,
    /// Waiting for the batch (device idle).
    pub waited: Duration,
    /// The step on the device.
    pub device: Duration,
    /// Wall time of the whole iteration.
    pub wall: Duration,
    /// With gradient clipping: the gradients' global norm before clipping and the factor
    /// they were multiplied by (1 where the norm was within the limit).
    pub grad_norm: Option<GradNorm>,
}

/// A step's gradient norm ([`crate::compute::ops::GradClip`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradNorm {
    pub norm: f32,
    pub scale: f32,
}

/// An epoch's gradient norms, with clipping.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradNormSummary {
    pub mean: f32,
    pub max: f32,
    /// Steps whose gradients were scaled down.
    pub clipped: u64,
}

/// An epoch's summary.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochReport {
    pub epoch: u64,
    pub steps: u64,
    pub mean_loss: f32,
    pub samples_per_s: f64,
    pub wall: Duration,
    /// Time the step loop waited for batches, as a fraction of the epoch's wall time.
    pub input_wait: f64,
    pub balance: Option<BalanceReport>,
    /// `T_g`, `C`, `B`, `T_step` as measured.
    pub tg: Duration,
    pub cores: usize,
    pub batch: u32,
    pub step_time: Duration,
    /// Share of the loaders' `T_g` that was CPU time (low: they waited on reads or sleeps).
    pub loader_cpu_share: f64,
    /// With gradient clipping: the epoch's gradient norms.
    pub grad_norm: Option<GradNormSummary>,
}

impl EpochReport {
    /// `T_g·B/C = … ms vs T_step = … ms → input-bound|compute-bound, device idle …%`.
    pub fn balance_line(&self) -> String {
        match &self.balance {
            Some(b) => format!(
                "T_g·B/C = {:.2} ms ({:.1} µs × {} / {}, loader CPU {:.0} %) vs T_step = {:.2} ms → {}, device idle {:.1} % (measured wait {:.1} %)",
                b.load_per_batch_ms,
                self.tg.as_secs_f64() * 1e6,
                self.batch,
                self.cores,
                100.0 * self.loader_cpu_share,
                b.step_ms,
                if b.input_bound { "input-bound" } else { "compute-bound" },
                100.0 * b.device_idle,
                100.0 * self.input_wait,
            ),
            None => "balance: not enough measurements yet".to_owned(),
        }
    }
}

/// Receives progress; the CLI draws it.
pub trait Observer {
    fn start(&mut self, _info: &RunInfo) {}
    fn step(&mut self, _report: &StepReport) {}
    fn epoch(&mut self, _report: &EpochReport) {}
    fn checkpoint(&mut self, _path: &Path, _progress: &Progress) {}
    /// The autotuner chose something (`--autotune`).
    fn tuned(&mut self, _decision: &Decision) {}
}

/// An observer that ignores everything.
pub struct Quiet;

impl Observer for Quiet {}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct TrainReport {
    pub progress: Progress,
    pub checkpoint: PathBuf,
    pub epochs: Vec<EpochReport>,
    /// A stop was requested and honoured.
    pub interrupted: bool,
    pub engine: String,
    pub final_loss: Option<f32>,
    /// The configuration the run ended with (the autotuner's choice with `--autotune`).
    pub tuning: Tuning,
    /// The autotuner's decisions, in order, with their reasons.
    pub decisions: Vec<Decision>,
    /// Why the autotuner found no configuration within the limits that balances, if it did not.
    pub unbalanced: Option<String>,
    /// Steps the step loop waited for input, over all steps, as a fraction of the loop's wall
    /// time; and the same after the autotuner settled (`None` without `--autotune`, or if it
    /// never settled).
    pub input_wait: f64,
    pub input_wait_settled: Option<f64>,
    /// Wall time of the step loop.
    pub loop_time: Duration,
    /// Wall time of the autotuner's probe before the first step, if it ran one.
    pub probe_time: Option<Duration>,
    /// Batches the engine copied itself from imported ring slots, the CPU copying nothing
    /// ([`crate::compute::exec::Exec::imported_uploads`]; the probe's included).
    pub imported_uploads: u64,
    /// Command-buffer submissions the training steps made, all told, their hyper-parameters'
    /// upload and loss's download included (each waited for with one fence;
    /// [`crate::compute::exec::Exec::submissions`]): one per step on Vulkan, 0 on the CPU engine.
    pub step_submissions: u64,
    /// The run's memory plan, and the process's peak resident memory at the end
    /// ([`crate::base::peak_resident`]; `None` where the system does not report it).
    pub memory: MemoryPlan,
    pub peak_resident: Option<u64>,
}
