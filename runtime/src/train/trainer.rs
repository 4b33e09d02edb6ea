//! The step loop: Ready slots from the ring → the recorded training step → the slot back.
//!
//! Per step: wait for the next batch (the time waited is the device's idle time), copy its
//! records into the step's input tensor and give the slot back at once (so the loaders fill
//! it while the device computes), write `[lr, step, c1, c2]`, run the `train` entry, read the
//! loss. Nothing is allocated per step: every buffer is sized before the first step.
//!
//! Per epoch the balance equation is evaluated from what was measured: `T_g` (loader CPU per
//! record), `C` (loader threads), `B` and `T_step` (device time per step: GPU timestamps on
//! Vulkan, the step's wall time on the CPU engine).
//!
//! Checkpoints (`last.safetensors` in the output folder) are written atomically at the end of
//! every `checkpoint_every` epochs, at the end, and when a stop is requested (SIGINT/SIGTERM:
//! the current step finishes first). `resume` continues from one to the same weights an
//! uninterrupted run reaches: the epoch order and augmentation are functions of (seed, epoch,
//! position), the schedule of the step, and the loader starts at the saved batch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::checkpoint::{self, Checkpoint, Progress};
use super::schedule::Schedule;
use crate::balance::{self, BalanceInput, BalanceReport, MemoryPlan};
use crate::compute::exec::{self, Exec, ExecOptions};
use crate::compute::ops::AdamW;
use crate::compute::recording::{HYPER_LEN, LOSS_LEN};
use crate::io::{DirectMode, IoKind};
use crate::loader::{self, AugmentConfig, Dataset, Loader, LoaderConfig, OnCorrupt};
use crate::model::{init, Arch, GraphOptions, ModelConfig, ModelGraph, ENTRY_TRAIN};

/// Name of the checkpoint file in the output folder.
pub const CHECKPOINT_FILE: &str = "last.safetensors";

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
    /// Write a checkpoint every this many epochs (and at the end).
    pub checkpoint_every: u64,
    pub out: PathBuf,
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
            checkpoint_every: 1,
            out: PathBuf::from("runs/det-s"),
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
    /// Record loader, wait and device-step spans here (allocated up front by the caller).
    pub trace: Option<std::sync::Arc<crate::trace::TraceLog>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Loader(#[from] loader::Error),
    #[error(transparent)]
    Exec(#[from] exec::Error),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
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
    pub param_count: usize,
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
}

impl EpochReport {
    /// `T_g·B/C = … ms vs T_step = … ms → input-bound|compute-bound, device idle …%`.
    pub fn balance_line(&self) -> String {
        match &self.balance {
            Some(b) => format!(
                "T_g·B/C = {:.2} ms ({:.1} µs × {} / {}) vs T_step = {:.2} ms → {}, device idle {:.1} % (measured wait {:.1} %)",
                b.load_per_batch_ms,
                self.tg.as_secs_f64() * 1e6,
                self.batch,
                self.cores,
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
}

/// Trains per `config`; `stop` is polled between steps (set it from a signal handler).
pub fn train(
    config: &TrainConfig,
    options: &RunOptions,
    stop: &AtomicBool,
    observer: &mut dyn Observer,
) -> Result<TrainReport> {
    let dataset = Dataset::open(&config.data, options.direct)?;
    let classes = dataset.manifest.classes.clone();
    let model =
        ModelConfig::named(&config.model, dataset.manifest.num_classes()).map_err(Error::Config)?;
    let checkpoint_path = config.out.join(CHECKPOINT_FILE);

    // Where to start: fresh, or from the checkpoint.
    let resumed = if options.resume {
        let c = Checkpoint::load(&checkpoint_path)?;
        if c.model != model {
            return Err(Error::Config(format!(
                "{}: the checkpoint is a {} for {} classes; --data has {} classes",
                checkpoint_path.display(),
                c.model.name,
                c.model.classes,
                model.classes
            )));
        }
        if let Some(saved) = &c.train {
            let saved: TrainConfig = serde_json::from_value(saved.clone()).map_err(|e| {
                Error::Config(format!(
                    "{}: training config: {e}",
                    checkpoint_path.display()
                ))
            })?;
            let same = TrainConfig {
                epochs: config.epochs,
                out: config.out.clone(),
                data: config.data.clone(),
                ..saved.clone()
            };
            if &same != config {
                return Err(Error::Config(format!(
                    "{}: the run was started with other options ({}); resume with the same \
                     options (only --epochs may grow)",
                    checkpoint_path.display(),
                    describe_difference(&saved, config)
                )));
            }
        }
        Some(c)
    } else {
        if checkpoint_path.exists() {
            return Err(Error::Config(format!(
                "{} exists: pass --resume to continue that run, or choose another --out",
                checkpoint_path.display()
            )));
        }
        None
    };

    let arch = Arch::new(&model);
    let graph_options = GraphOptions {
        train: true,
        weight_decay: config.weight_decay,
        ..GraphOptions::default()
    };
    let graph = ModelGraph::build(&arch, config.batch, &dataset.layout, &graph_options)
        .map_err(Error::Config)?;
    let loader_config = LoaderConfig {
        batch: config.batch as usize,
        ring_slots: config.ring,
        loaders: config.loaders,
        seed: config.seed,
        epochs: config.epochs,
        start_batch: 0,
        shuffle: true,
        augment: AugmentConfig {
            enabled: config.augment,
            ..AugmentConfig::default()
        },
        on_corrupt: options.on_corrupt,
        io: options.io,
        trace: options.trace.clone(),
        ..LoaderConfig::default()
    };

    // The budget covers the pipeline and the engine together, checked before allocating.
    let pipeline_plan = loader::plan(&dataset, &loader_config, options.io);
    let mut memory = pipeline_plan.clone();
    memory.add(
        "model tensors (weights, optimizer, activations, gradients)",
        1,
        graph.recording.bytes(),
    );
    if let Some(budget) = options.mem_budget {
        if !memory.fits(Some(budget)) {
            return Err(budget_error(
                budget,
                &memory,
                &dataset,
                &loader_config,
                &arch,
                &graph_options,
                options,
            ));
        }
    }

    let batches_per_epoch = dataset.records() / config.batch as u64;
    if batches_per_epoch == 0 {
        return Err(Error::Config(format!(
            "{} has {} records, fewer than one batch of {}",
            config.data.display(),
            dataset.records(),
            config.batch
        )));
    }
    let total_steps = batches_per_epoch * config.epochs;
    let schedule = Schedule {
        base: config.lr,
        floor: config.lr * config.lr_floor,
        warmup: config.warmup.min(total_steps / 2),
        total: total_steps,
    };

    let mut exec = Exec::new(&graph.recording, &options.exec)?;
    let mut progress = Progress {
        seed: config.seed,
        ..Progress::default()
    };
    match &resumed {
        Some(c) => {
            load_tensors(&mut exec, &graph, c, true)?;
            progress = c.progress;
        }
        None => {
            let values = init::init_params(&arch, config.seed);
            for (p, v) in graph.params.iter().zip(&values) {
                exec.write_f32(p.value, v)?;
                let zeros = vec![0.0; v.len()];
                for t in [p.m, p.v].into_iter().flatten() {
                    exec.write_f32(t, &zeros)?;
                }
            }
        }
    }
    if progress.step >= total_steps {
        return Err(Error::Config(format!(
            "{}: the run already finished {} steps of {total_steps}; raise --epochs to train on",
            checkpoint_path.display(),
            progress.step
        )));
    }

    let mut loader = Loader::start(
        &dataset,
        &LoaderConfig {
            start_batch: progress.step,
            ..loader_config.clone()
        },
    )?;
    let engine = exec.describe();
    observer.start(&RunInfo {
        model: model.name.clone(),
        engine: engine.clone(),
        records: dataset.records(),
        batches_per_epoch,
        total_steps,
        first_step: progress.step,
        memory,
        backend: loader.backend().name().to_owned(),
        param_count: arch.param_count(),
    });

    let train_entry = graph.entry(ENTRY_TRAIN);
    let adam = AdamW {
        len: 1,
        lr: 0.0,
        beta1: graph_options.beta1,
        beta2: graph_options.beta2,
        eps: graph_options.eps,
        weight_decay: 0.0,
        step: 1,
    };
    let save = |exec: &mut Exec, progress: &Progress, observer: &mut dyn Observer| -> Result<()> {
        let c = snapshot(exec, &graph, config, &classes, progress)?;
        c.save(&checkpoint_path)?;
        observer.checkpoint(&checkpoint_path, progress);
        Ok(())
    };

    let mut epochs = Vec::new();
    let mut hyper = [0f32; HYPER_LEN];
    let mut loss = [0f32; LOSS_LEN];
    let mut interrupted = false;
    let mut final_loss = None;
    let mut epoch_acc = EpochAcc::new(loader.counters());
    loop {
        if stop.load(Ordering::Relaxed) || options.max_steps.is_some_and(|m| progress.step >= m) {
            interrupted = stop.load(Ordering::Relaxed);
            break;
        }
        let started = Instant::now();
        let Some(batch) = loader.next_batch()? else {
            break;
        };
        let waited = started.elapsed();
        exec.write_bytes(graph.records, batch.records())?;
        let (epoch, batch_index) = (batch.epoch, batch.index);
        drop(batch);

        let step = progress.step + 1;
        let lr = schedule.lr(step);
        let (c1, c2) = AdamW {
            step: step as u32,
            ..adam
        }
        .bias_corrections();
        hyper.copy_from_slice(&[lr, step as f32, c1, c2]);
        exec.write_f32(graph.hyper, &hyper)?;
        let step_started = options.trace.as_ref().map(|log| log.now());
        let timing = exec.run(train_entry)?;
        if let (Some(log), Some(t0)) = (&options.trace, step_started) {
            log.record(
                crate::trace::Kind::Step,
                crate::trace::CONSUMER_ROW,
                batch_index,
                t0,
                log.now(),
            );
        }
        exec.read_f32(graph.loss, &mut loss)?;
        if !loss[0].is_finite() {
            return Err(Error::Config(format!(
                "the loss became {} at step {step} (epoch {}): lower --lr (now {})",
                loss[0],
                epoch + 1,
                config.lr
            )));
        }
        progress.step = step;
        progress.epoch = step / batches_per_epoch;
        progress.batch_in_epoch = step % batches_per_epoch;
        final_loss = Some(loss[0]);
        let report = StepReport {
            step,
            epoch,
            loss,
            lr,
            waited,
            device: timing.device,
            wall: started.elapsed(),
        };
        epoch_acc.add(&report);
        observer.step(&report);

        if progress.batch_in_epoch == 0 {
            let e = epoch_acc.finish(epoch, loader.counters(), config.loaders, config.batch);
            observer.epoch(&e);
            epochs.push(e);
            epoch_acc = EpochAcc::new(loader.counters());
            let done = progress.epoch;
            if done % config.checkpoint_every.max(1) == 0 && done < config.epochs {
                save(&mut exec, &progress, observer)?;
            }
        }
    }
    drop(loader);
    save(&mut exec, &progress, observer)?;
    Ok(TrainReport {
        progress,
        checkpoint: checkpoint_path.clone(),
        epochs,
        interrupted,
        engine,
        final_loss,
    })
}

/// Sums over one epoch.
struct EpochAcc {
    started: Instant,
    steps: u64,
    loss: f64,
    waited: Duration,
    device: Duration,
    counters_at_start: balance::PipelineSnapshot,
}

impl EpochAcc {
    fn new(counters: balance::PipelineSnapshot) -> Self {
        EpochAcc {
            started: Instant::now(),
            steps: 0,
            loss: 0.0,
            waited: Duration::ZERO,
            device: Duration::ZERO,
            counters_at_start: counters,
        }
    }

    fn add(&mut self, r: &StepReport) {
        self.steps += 1;
        self.loss += r.loss[0] as f64;
        self.waited += r.waited;
        self.device += r.device;
    }

    fn finish(
        &self,
        epoch: u64,
        counters: balance::PipelineSnapshot,
        cores: usize,
        batch: u32,
    ) -> EpochReport {
        let wall = self.started.elapsed();
        let records = counters.loaders.items - self.counters_at_start.loaders.items;
        let cpu = counters
            .loaders
            .cpu
            .saturating_sub(self.counters_at_start.loaders.cpu);
        let tg = if records > 0 {
            cpu / records as u32
        } else {
            Duration::ZERO
        };
        let step_time = if self.steps > 0 {
            self.device / self.steps as u32
        } else {
            Duration::ZERO
        };
        let balance = balance::evaluate(&BalanceInput {
            tg,
            cores: cores as f64,
            batch,
            step: step_time,
            decode: None,
            augment: None,
            disk: None,
        })
        .ok();
        EpochReport {
            epoch,
            steps: self.steps,
            mean_loss: (self.loss / self.steps.max(1) as f64) as f32,
            samples_per_s: (self.steps * batch as u64) as f64 / wall.as_secs_f64(),
            wall,
            input_wait: self.waited.as_secs_f64() / wall.as_secs_f64(),
            balance,
            tg,
            cores,
            batch,
            step_time,
        }
    }
}

/// The checkpoint of the run as it stands.
fn snapshot(
    exec: &mut Exec,
    graph: &ModelGraph,
    config: &TrainConfig,
    classes: &[String],
    progress: &Progress,
) -> Result<Checkpoint> {
    let specs = graph.arch.params();
    let mut tensors = Vec::with_capacity(3 * specs.len());
    for (spec, p) in specs.iter().zip(&graph.params) {
        let mut read = |name: String, id| -> Result<()> {
            let mut v = vec![0.0; spec.len()];
            exec.read_f32(id, &mut v)?;
            tensors.push((name, spec.shape.clone(), v));
            Ok(())
        };
        read(spec.name.clone(), p.value)?;
        if let (Some(m), Some(v)) = (p.m, p.v) {
            read(format!("adam.m.{}", spec.name), m)?;
            read(format!("adam.v.{}", spec.name), v)?;
        }
    }
    Ok(Checkpoint {
        model: graph.arch.config.clone(),
        progress: *progress,
        train: Some(serde_json::to_value(config).expect("plain data serialises")),
        classes: classes.to_vec(),
        tensors,
    })
}

/// Writes a checkpoint's weights (and, with `optimizer`, its AdamW moments) into `exec`.
pub fn load_tensors(
    exec: &mut Exec,
    graph: &ModelGraph,
    c: &Checkpoint,
    optimizer: bool,
) -> Result<()> {
    for (spec, p) in graph.arch.params().iter().zip(&graph.params) {
        let mut put = |name: &str, id| -> Result<()> {
            let v = c
                .get(name)
                .ok_or_else(|| Error::Config(format!("the checkpoint has no tensor {name:?}")))?;
            if v.len() != spec.len() {
                return Err(Error::Config(format!(
                    "checkpoint tensor {name:?} has {} values; the model's has {}",
                    v.len(),
                    spec.len()
                )));
            }
            exec.write_f32(id, v)?;
            Ok(())
        };
        put(&spec.name, p.value)?;
        if optimizer {
            if let (Some(m), Some(v)) = (p.m, p.v) {
                put(&format!("adam.m.{}", spec.name), m)?;
                put(&format!("adam.v.{}", spec.name), v)?;
            }
        }
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

#[allow(clippy::too_many_arguments)]
fn budget_error(
    budget: u64,
    memory: &MemoryPlan,
    dataset: &Dataset,
    loader_config: &LoaderConfig,
    arch: &Arch,
    graph_options: &GraphOptions,
    options: &RunOptions,
) -> Error {
    let fits_batch = |b: u64| {
        let lc = LoaderConfig {
            batch: b as usize,
            ..loader_config.clone()
        };
        let mut plan = loader::plan(dataset, &lc, options.io);
        match ModelGraph::build(arch, b as u32, &dataset.layout, graph_options) {
            Ok(g) => {
                plan.add("model", 1, g.recording.bytes());
                plan.fits(Some(budget))
            }
            Err(_) => false,
        }
    };
    let best = balance::largest_fitting(loader_config.batch as u64, fits_batch);
    Error::Budget {
        budget: balance::human(budget),
        needed: balance::human(memory.total()),
        detail: match memory.items.iter().max_by_key(|i| i.bytes()) {
            Some(i) => format!(
                "largest: {} ×{} = {}",
                i.name,
                i.count,
                balance::human(i.bytes())
            ),
            None => "nothing planned".to_owned(),
        },
        advice: match best {
            Some(b) => format!("--batch {b} fits at this ring depth"),
            None => "no batch fits: raise --mem-budget or lower --ring".to_owned(),
        },
    }
}
