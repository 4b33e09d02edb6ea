//! What a training run is configured by: [`TrainConfig`] (stored in its checkpoints, and
//! the same on resume), [`RunOptions`] (what changes only how it runs), and its errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::autotune::Tuning;
use crate::compute::exec::{self, ExecOptions};
use crate::io::{DirectMode, IoKind};
use crate::loader::{self, OnCorrupt};
use crate::model::checkpoint::{self, Checkpoint, LoadError};
use crate::model::GraphOptions;
use crate::ring::RingMemory;

/// Name of the checkpoint file in the output folder.
pub const CHECKPOINT_FILE: &str = "last.safetensors";

/// The share of each batch replay data fills unless told otherwise.
pub const DEFAULT_REPLAY_FRACTION: f32 = 0.25;

/// Everything a training run is configured by (stored in its checkpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub data: PathBuf,
    pub model: String,
    pub batch: u32,
    pub epochs: u64,
    /// Peak learning rate (AdamW).
    pub lr: f32,
    /// Learning rate at the end of the cosine decay, as a fraction of `lr`.
    pub lr_floor: f32,
    /// Warm-up steps (linear from 0 to `lr`).
    pub warmup: u64,
    pub weight_decay: f32,
    pub seed: u64,
    pub loaders: usize,
    pub ring: usize,
    pub augment: bool,
    /// Chance of a mosaic per record (see [`crate::loader::mosaic`]); runs from before
    /// mosaics read as 0.
    #[serde(default)]
    pub mosaic: f32,
    /// Weight of a GIoU term in the box loss (0: none, the default; runs from before it
    /// read as 0).
    #[serde(default)]
    pub giou: f32,
    /// Clip the gradients' global norm to this before each update (0: no clipping, the
    /// default; runs from before it read as 0). See [`crate::compute::ops::GradClip`].
    #[serde(default)]
    pub clip_norm: f32,
    /// Regression weight of the cells around each box's centre (0: the centre alone, the
    /// default; runs from before it read as 0). See [`crate::compute::ops::Targets`].
    #[serde(default)]
    pub neighbours: f32,
    /// How far those cells reach from the centre, in cells (1: the 3×3 block, the default;
    /// runs from before it read as 1).
    #[serde(default = "one_cell")]
    pub neighbour_radius: u32,
    /// The most neighbour cells a box weighs in full (0: no limit, the default; runs from
    /// before it read as 0). See [`crate::compute::ops::Targets::neighbour_cells`].
    #[serde(default)]
    pub neighbour_cells: u32,
    /// The layers that do not train (fine-tuning; runs from before it read as none). See
    /// [`crate::model::Freeze`].
    #[serde(default)]
    pub freeze: crate::model::Freeze,
    /// The frozen layers' biases train (runs from before it read as false). See
    /// [`GraphOptions::train_biases`].
    #[serde(default)]
    pub train_biases: bool,
    /// Packed data whose records fill [`TrainConfig::replay_fraction`] of every batch (the base
    /// model's own data, so that a fine-tune does not forget it; runs from before it read as
    /// none). See [`crate::loader::replay`].
    #[serde(default)]
    pub replay: Option<PathBuf>,
    /// The share of each batch the replay data fills.
    #[serde(default)]
    pub replay_fraction: f32,
    /// Write a checkpoint every this many epochs (and at the end).
    pub checkpoint_every: u64,
    pub out: PathBuf,
    /// io_uring reads in flight per loader.
    #[serde(default = "default_io_depth")]
    pub io_depth: u32,
    /// Let the autotuner choose batch (within the budget), loaders, ring and I/O queue depth;
    /// the checkpoint then stores what it chose.
    #[serde(default)]
    pub autotune: bool,
}

fn one_cell() -> u32 {
    1
}

pub(super) fn default_io_depth() -> u32 {
    crate::io::UringOptions::default().queue_depth
}

impl TrainConfig {
    /// The batch, loaders, ring and queue depth it holds.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            batch: self.batch,
            loaders: self.loaders,
            ring: self.ring,
            io_depth: self.io_depth,
        }
    }

    /// The model graph's training options: the optimizer's and the loss's settings.
    pub fn graph_options(&self) -> GraphOptions {
        GraphOptions {
            train: true,
            weight_decay: self.weight_decay,
            giou_weight: self.giou,
            clip_norm: (self.clip_norm > 0.0).then_some(self.clip_norm),
            neighbour_weight: self.neighbours,
            neighbour_radius: self.neighbour_radius,
            neighbour_cells: self.neighbour_cells,
            freeze: self.freeze,
            train_biases: self.train_biases,
            ..GraphOptions::default()
        }
    }

    /// The same configuration with tuning `t`.
    pub fn with_tuning(&self, t: &Tuning) -> TrainConfig {
        TrainConfig {
            batch: t.batch,
            loaders: t.loaders,
            ring: t.ring,
            io_depth: t.io_depth,
            ..self.clone()
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            data: PathBuf::from("data/synthetic"),
            model: "det-s".into(),
            batch: 32,
            epochs: 30,
            lr: 4e-3,
            lr_floor: 0.02,
            warmup: 100,
            weight_decay: 5e-4,
            seed: 0,
            loaders: 1,
            ring: 4,
            augment: true,
            mosaic: 0.0,
            giou: 0.0,
            clip_norm: 0.0,
            neighbours: 0.0,
            neighbour_radius: 1,
            neighbour_cells: 0,
            freeze: crate::model::Freeze::None,
            train_biases: false,
            replay: None,
            replay_fraction: DEFAULT_REPLAY_FRACTION,
            checkpoint_every: 1,
            out: PathBuf::from("runs/det-s"),
            io_depth: default_io_depth(),
            autotune: false,
        }
    }
}

/// Settings that do not change the result (not stored with the checkpoint).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub exec: ExecOptions,
    pub io: IoKind,
    pub direct: DirectMode,
    pub on_corrupt: OnCorrupt,
    /// Hard memory limit for the pipeline and the engine together.
    pub mem_budget: Option<u64>,
    /// Continue from the checkpoint in the output folder.
    pub resume: bool,
    /// Stop after this many steps in total (tests; the checkpoint is written).
    pub max_steps: Option<u64>,
    /// Stop after the step that brings this run's time in the step loop to this (a fine-tune
    /// with a time budget on the board; the checkpoint is written, `resume` continues).
    pub max_time: Option<Duration>,
    /// Record loader, wait and device-step spans here (allocated up front by the caller).
    pub trace: Option<std::sync::Arc<crate::trace::TraceLog>>,
    /// Extra wall time per record in the loaders (tests and `bench balance`: a slow loader).
    pub loader_slow_down: Duration,
    /// Where the ring's slots live: memory the engine reads directly where it offers it, or
    /// plain host memory.
    pub ring_memory: RingMemory,
    /// Start a fresh run from these weights (fine-tuning) instead of the initial ones; the
    /// optimizer's moments start at zero. Ignored when resuming.
    pub init_from: Option<std::sync::Arc<Checkpoint>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Loader(#[from] loader::Error),
    #[error(transparent)]
    Exec(#[from] exec::Error),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Graph(#[from] crate::model::GraphError),
    #[error(transparent)]
    Lock(#[from] crate::durable::LockError),
    #[error("{0}")]
    Config(String),
    #[error("memory budget {budget} is too small: the run needs {needed} ({detail}); {advice}")]
    Budget {
        budget: String,
        needed: String,
        detail: String,
        advice: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Refuses to resume a run of `saved`'s options with other ones (an autotuned run takes the
/// saved tuning into `config`).
pub(super) fn same_options(
    saved: &serde_json::Value,
    config: &mut TrainConfig,
    path: &Path,
) -> Result<()> {
    let saved: TrainConfig = serde_json::from_value(saved.clone())
        .map_err(|e| Error::Config(format!("{}: training config: {e}", path.display())))?;
    if config.autotune {
        *config = config.with_tuning(&saved.tuning());
    }
    // Loaders, ring and queue depth change only the speed, never the result.
    let same = TrainConfig {
        epochs: config.epochs,
        out: config.out.clone(),
        data: config.data.clone(),
        loaders: config.loaders,
        ring: config.ring,
        io_depth: config.io_depth,
        autotune: config.autotune,
        ..saved.clone()
    };
    if &same != config {
        return Err(Error::Config(format!(
            "{}: the run was started with other options ({}); resume with the same \
             options (only --epochs may grow)",
            path.display(),
            describe_difference(&saved, config)
        )));
    }
    Ok(())
}

/// Which options of `saved` differ from `now` (for the resume error).
fn describe_difference(saved: &TrainConfig, now: &TrainConfig) -> String {
    let a = serde_json::to_value(saved).unwrap_or_default();
    let b = serde_json::to_value(now).unwrap_or_default();
    let mut diffs = Vec::new();
    if let (Some(a), Some(b)) = (a.as_object(), b.as_object()) {
        for (k, va) in a {
            if matches!(k.as_str(), "epochs" | "out" | "data") {
                continue;
            }
            if b.get(k) != Some(va) {
                diffs.push(format!(
                    "{k}: was {va}, now {}",
                    b.get(k).cloned().unwrap_or_default()
                ));
            }
        }
    }
    diffs.join(", ")
}
