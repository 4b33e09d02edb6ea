//! The step loop: Ready slots from the ring → the recorded training step → the slot back.
//!
//! A run is sized before anything is allocated ([`super::plan`]); [`train`] then sets up the
//! engine, the autotuner and the starting weights, and `Steps` runs the loop.
//!
//! Per step: wait for the next batch (the time waited is the device's idle time), copy its
//! records into the step's input tensor and give the slot back at once (so the loaders fill
//! it while the device computes), write the step's hyper-parameters ([`AdamW::hyper`]), run
//! the `train` entry, read the loss (and, with `clip_norm`, the gradients' norm and the scale
//! the clip step applied). Nothing is allocated per step: every buffer is sized before the
//! first step.
//!
//! Per epoch the balance equation is evaluated from what was measured: `T_g` (a loader's wall
//! time per record, with the share of it that was CPU), `C` (loader threads), `B` and
//! `T_step` (device time per step: GPU timestamps on Vulkan, the step's wall time on the CPU
//! engine).
//!
//! Checkpoints (`last.safetensors` in the output folder) are written atomically at the end of
//! every `checkpoint_every` epochs, at the end, and when a stop is requested (SIGINT/SIGTERM:
//! the current step finishes first). `resume` continues from one to the same weights an
//! uninterrupted run reaches: the epoch order and augmentation are functions of (seed, epoch,
//! position), the schedule of the step, and the loader starts at the saved batch. The same
//! property lets `--autotune` (see [`super::autotune`]) restart the loader with another
//! configuration mid-run without changing what is trained.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::autotune::{Autotuner, Limits, Probe, Tuning, Window};
use super::config::{Error, Result, RunOptions, TrainConfig, CHECKPOINT_FILE};
use super::plan::{self, loader_tuning, tuned_loader_config, Planner};
use super::report::{
    EpochReport, Frozen, GradNorm, GradNormSummary, Observer, ReplayInfo, RunInfo, StepReport,
    TrainReport,
};
use super::schedule::Schedule;
use super::start::{initial_state, starting_point};
use crate::balance::{self, BalanceInput, StageSnapshot};
use crate::base::MemoryPlan;
use crate::compute::exec::Exec;
use crate::compute::ops::{AdamW, CLIP_NORM, CLIP_SCALE};
use crate::compute::recording::LOSS_LEN;
use crate::io::DirectMode;
use crate::loader::{self, AugmentConfig, Dataset, Loader, LoaderConfig};
use crate::model::checkpoint::{Checkpoint, Progress, StateTensor};
use crate::model::{Arch, GraphOptions, ModelConfig, ModelGraph, ENTRY_TRAIN};
use crate::ring::RingMemory;

/// Trains per `config`; `stop` is polled between steps (set it from a signal handler).
pub fn train(
    config: &TrainConfig,
    options: &RunOptions,
    stop: &AtomicBool,
    observer: &mut dyn Observer,
) -> Result<TrainReport> {
    let dataset = Dataset::open(&config.data, options.direct)?;
    let (replay, classes) = open_replay(config, &dataset, options.direct)?;
    let model = model_for(&config.model, &dataset, classes.len() as u32)?;
    let checkpoint_path = config.out.join(CHECKPOINT_FILE);
    // One run per output folder: a second would overwrite the first's checkpoints.
    let _claim = crate::durable::FolderLock::claim(&config.out, "training run")?;

    let (config, resumed) = starting_point(config, options, &model, &checkpoint_path)?;
    let config = &config;

    let arch = Arch::new(&model);
    let graph_options = config.graph_options();
    let exec_options = options.exec.resolved()?;
    let planner = Planner {
        dataset: &dataset,
        arch: &arch,
        graph_options: &graph_options,
        exec: &exec_options,
        io: loader::resolve_backend(options.io)?.0,
        starting_weights: match (&resumed, &options.init_from) {
            (None, Some(base)) => base.value_bytes(),
            _ => 0,
        },
    };
    // The autotuner picks the batch first: the largest up to the requested that fits.
    let fresh_tuning = config.autotune && resumed.is_none();
    let sized = plan::size_run(
        &planner,
        config,
        LoaderConfig {
            replay: replay.clone(),
            ..loader_config_of(config, options)
        },
        options.mem_budget,
        fresh_tuning,
    )?;
    let graph = &sized.graph;
    let batches_per_epoch = batches_per_epoch(config, &dataset, &sized.loader)?;
    let total_steps = batches_per_epoch * config.epochs;

    let mut exec = Exec::new(&graph.recording, &exec_options)?;
    let mut loader_config = sized.loader.clone();
    if options.ring_memory == RingMemory::Auto {
        loader_config.slot_allocator = exec.slot_allocator();
    }
    let first_step = resumed.as_ref().map_or(0, |c| c.progress.step);
    if first_step >= total_steps {
        return Err(Error::Config(format!(
            "{}: the run already finished {first_step} steps of {total_steps}; raise --epochs to train on",
            checkpoint_path.display(),
        )));
    }

    // The autotuner's start: the equation from a probe, or the checkpoint's tuning; over
    // the configuration as it is now (the tuned fields are the tuning's, the rest stays).
    let tuning_base = TuningBase {
        planner: &planner,
        loader: loader_config.clone(),
        engine: &sized.engine,
        budget: options.mem_budget,
    };
    let (tuner, probe_time) = if config.autotune {
        let (tuner, probe_time) = start_tuner(
            &mut exec,
            &sized,
            &tuning_base,
            resumed.is_none().then_some(&dataset),
            config,
            observer,
        )?;
        loader_config = tuned_loader_config(&loader_config, &tuner.tuning());
        (Some(tuner), probe_time)
    } else {
        (None, None)
    };

    let progress = initial_state(
        &mut exec,
        graph,
        config,
        resumed.as_ref(),
        options.init_from.as_deref(),
        &classes,
    )?;
    let saver = Saver {
        graph,
        config,
        classes: &classes,
        path: &checkpoint_path,
    };
    let mut steps = Steps::start(
        exec,
        graph,
        &dataset,
        config,
        options,
        loader_config,
        tuner,
        progress,
        batches_per_epoch,
    )?;
    let frozen = match config.freeze {
        crate::model::Freeze::None => None,
        freeze => {
            let every_layer = GraphOptions {
                freeze: crate::model::Freeze::None,
                train_biases: false,
                ..graph_options
            };
            let unfrozen = Planner {
                graph_options: &every_layer,
                ..planner
            };
            Some(Frozen {
                freeze,
                train_biases: config.train_biases,
                tensors: graph.params.iter().filter(|p| p.frozen).count(),
                of: graph.params.len(),
                plan_bytes: sized.engine.total(),
                unfrozen_plan_bytes: unfrozen.engine(sized.batch)?.total(),
            })
        }
    };
    let engine = steps.exec.describe();
    let loader = running(&mut steps.loader)?;
    let (backend, ring_memory) = (loader.backend().name(), loader.ring_memory().to_owned());
    observer.start(&RunInfo {
        model: model.name.clone(),
        engine: engine.clone(),
        records: dataset.records(),
        batches_per_epoch,
        total_steps,
        first_step: steps.progress.step,
        memory: steps
            .exec
            .with_driver(planner.run(&steps.loader_config, &sized.engine)),
        backend: backend.to_owned(),
        ring_memory,
        param_count: arch.param_count(),
        frozen,
        replay: replay.as_ref().map(|r| ReplayInfo {
            dir: r.dataset.dir.clone(),
            records: r.dataset.records(),
            per_batch: r.per_batch(sized.batch as usize),
            batch: sized.batch as usize,
            new_classes: classes.len() - dataset.manifest.classes.len(),
        }),
    });

    let run_started = Instant::now();
    let interrupted = steps.run(stop, &tuning_base, &saver, observer)?;
    let Steps {
        mut exec,
        loader,
        loader_config,
        tuner,
        progress,
        record,
        ..
    } = steps;
    drop(loader);
    let tuning = loader_tuning(&loader_config);
    saver.save(&mut exec, &progress, &tuning, observer)?;
    let loop_time = run_started.elapsed();
    let waited = record.total_waited;
    let input_wait = waited.as_secs_f64() / loop_time.as_secs_f64().max(1e-9);
    Ok(TrainReport {
        progress,
        checkpoint: checkpoint_path.clone(),
        epochs: record.epochs,
        interrupted,
        engine,
        final_loss: record.final_loss,
        tuning,
        decisions: tuner
            .as_ref()
            .map_or_else(Vec::new, |t| t.decisions().to_vec()),
        unbalanced: tuner
            .as_ref()
            .and_then(|t| t.unbalanced().map(str::to_owned)),
        input_wait,
        input_wait_settled: record.settled_at.and_then(|(at, waited_then)| {
            let wall = at.elapsed().as_secs_f64();
            (wall > 0.0).then(|| (waited - waited_then).as_secs_f64() / wall)
        }),
        loop_time,
        probe_time,
        imported_uploads: exec.imported_uploads(),
        step_submissions: record.step_submissions,
        memory: exec.with_driver(planner.run(&loader_config, &sized.engine)),
        peak_resident: crate::base::peak_resident(),
    })
}

/// What the autotuner weighs a tuning against: the loaders' configuration it tunes, the
/// engine's plan beside them and the memory budget.
struct TuningBase<'a> {
    planner: &'a Planner<'a>,
    loader: LoaderConfig,
    engine: &'a MemoryPlan,
    budget: Option<u64>,
}

impl TuningBase<'_> {
    /// Records each of `loaders` loaders prepares at a time.
    fn part_records(&self, loaders: usize) -> usize {
        LoaderConfig {
            loaders,
            ..self.loader.clone()
        }
        .part_records()
    }

    /// Whether the run fits the budget with the loaders tuned as `t`.
    fn fits(&self, t: &Tuning) -> bool {
        let loader = tuned_loader_config(&self.loader, t);
        self.planner.run(&loader, self.engine).fits(self.budget)
    }
}

/// The autotuner a run starts with, and how long its probe took: for a fresh run
/// (`fresh_data` given), from a probe of the balance equation run before the weights are
/// written (its steps leave nothing behind), after the batch decisions [`plan::size_run`]
/// made; for a resumed run, from the checkpoint's tuning. Each decision is reported.
fn start_tuner(
    exec: &mut Exec,
    sized: &plan::Sized,
    base: &TuningBase<'_>,
    fresh_data: Option<&Dataset>,
    config: &TrainConfig,
    observer: &mut dyn Observer,
) -> Result<(Autotuner, Option<Duration>)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limits = Limits::for_machine(cores, exec.host_threads());
    let (tuner, probe_time) = match fresh_data {
        Some(dataset) => {
            let started = Instant::now();
            let train = sized.graph.entry(ENTRY_TRAIN);
            let probe = probe(exec, train, &sized.graph, dataset, &base.loader)?;
            let probe_time = started.elapsed();
            let part_records = |loaders| base.part_records(loaders);
            let fits = |t: &Tuning| base.fits(t);
            let mut t = Autotuner::start(sized.batch, &probe, limits, part_records, &fits);
            t.prepend(sized.decisions.clone());
            (t, Some(probe_time))
        }
        None => (Autotuner::resumed(config.tuning(), limits), None),
    };
    for d in tuner.decisions() {
        observer.tuned(d);
    }
    Ok((tuner, probe_time))
}

/// Writes a run's checkpoint (atomically: see [`Checkpoint::save`]).
struct Saver<'a> {
    graph: &'a ModelGraph,
    config: &'a TrainConfig,
    classes: &'a [String],
    path: &'a Path,
}

impl Saver<'_> {
    fn save(
        &self,
        exec: &mut Exec,
        progress: &Progress,
        tuning: &Tuning,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        let config = self.config.with_tuning(tuning);
        let c = snapshot(exec, self.graph, &config, self.classes, progress)?;
        c.save(self.path)?;
        observer.checkpoint(self.path, progress);
        Ok(())
    }
}

/// What the step loop has measured for the run's report.
struct StepRecord {
    epochs: Vec<EpochReport>,
    step_submissions: u64,
    final_loss: Option<f32>,
    /// Time the loop waited for batches, all told.
    total_waited: Duration,
    /// When the autotuner settled, and the time waited until then.
    settled_at: Option<(Instant, Duration)>,
}

/// The step loop (see the module docs) and what it owns while it runs: the engine, the
/// loader, the autotuner, the progress, and the buffers a step's outputs are read into.
struct Steps<'a> {
    exec: Exec,
    graph: &'a ModelGraph,
    dataset: &'a Dataset,
    config: &'a TrainConfig,
    options: &'a RunOptions,
    /// The optimizer's settings, for each step's hyper-parameters.
    graph_options: GraphOptions,
    schedule: Schedule,
    batches_per_epoch: u64,
    /// The first epoch of the last tenth, which trains on flips only.
    quiet_from: u64,
    /// `None` only while [`Steps::restart_loader`] replaces it (the old one's threads and
    /// ring go before the new one's start: both at once would be over the memory plan).
    loader: Option<Loader>,
    loader_config: LoaderConfig,
    tuner: Option<Autotuner>,
    /// The autotuner's window so far, until it settles.
    window: Option<WindowAcc>,
    progress: Progress,
    epoch_acc: EpochAcc,
    loss: [f32; LOSS_LEN],
    /// The clip's norm, scale and per-tensor sums (read whole after each step).
    clip: Vec<f32>,
    record: StepRecord,
}

impl<'a> Steps<'a> {
    /// Starts the loader at `progress` (quiet already where a resumed run is past
    /// `quiet_from`).
    #[allow(clippy::too_many_arguments)]
    fn start(
        exec: Exec,
        graph: &'a ModelGraph,
        dataset: &'a Dataset,
        config: &'a TrainConfig,
        options: &'a RunOptions,
        mut loader_config: LoaderConfig,
        tuner: Option<Autotuner>,
        progress: Progress,
        batches_per_epoch: u64,
    ) -> Result<Steps<'a>> {
        let total_steps = batches_per_epoch * config.epochs;
        let quiet_from = quiet_from(config.epochs);
        if progress.epoch >= quiet_from {
            loader_config.augment = loader_config.augment.quiet();
        }
        let loader = start_loader(dataset, &loader_config, progress.step)?;
        let clip_len = graph.grad_norm.map_or(0, |id| graph.recording.get(id).len);
        Ok(Steps {
            exec,
            graph,
            dataset,
            config,
            options,
            graph_options: config.graph_options(),
            schedule: Schedule {
                base: config.lr,
                floor: config.lr * config.lr_floor,
                warmup: config.warmup.min(total_steps / 2),
                total: total_steps,
            },
            batches_per_epoch,
            quiet_from,
            epoch_acc: EpochAcc::new(loader.counters()),
            window: tuner.as_ref().map(|_| WindowAcc::new(&loader_config, None)),
            loader: Some(loader),
            loader_config,
            tuner,
            progress,
            loss: [0f32; LOSS_LEN],
            clip: vec![0f32; clip_len],
            record: StepRecord {
                epochs: Vec::new(),
                step_submissions: 0,
                final_loss: None,
                total_waited: Duration::ZERO,
                settled_at: None,
            },
        })
    }

    /// Runs steps until the data ends, `--max-steps` or `--max-time` is reached or `stop` is
    /// set; whether it was `stop`.
    fn run(
        &mut self,
        stop: &AtomicBool,
        tuning: &TuningBase<'_>,
        saver: &Saver<'_>,
        observer: &mut dyn Observer,
    ) -> Result<bool> {
        let started = Instant::now();
        loop {
            let at_max = (self.options.max_steps).is_some_and(|m| self.progress.step >= m)
                || (self.options.max_time).is_some_and(|t| started.elapsed() >= t);
            if stop.load(Ordering::Relaxed) || at_max {
                return Ok(stop.load(Ordering::Relaxed));
            }
            let Some(report) = self.step()? else {
                return Ok(false);
            };
            observer.step(&report);
            self.retune(&report, tuning, observer)?;
            if self.progress.batch_in_epoch == 0 {
                self.end_epoch(report.epoch, saver, observer)?;
            }
        }
    }

    /// One training step on the next batch; `None` where the data has ended.
    fn step(&mut self) -> Result<Option<StepReport>> {
        let started = Instant::now();
        let Some(batch) = running(&mut self.loader)?.next_batch()? else {
            return Ok(None);
        };
        let waited = started.elapsed();
        let (epoch, batch_index) = (batch.epoch, batch.index);
        let (graph, exec) = (self.graph, &mut self.exec);

        let step = self.progress.step + 1;
        let lr = self.schedule.lr(step);
        // Everything the step moves in and out (hyper-parameters, batch, loss) is counted.
        let submitted = exec.submissions();
        exec.write_f32(graph.hyper, &self.graph_options.hyper(lr, step as u32))?;
        let trace = self.options.trace.as_ref();
        let step_started = trace.map(|log| log.now());
        // The batch is read where the loader put it (on Vulkan, copied from its slot in the
        // step's own submission), so its slot goes back to the loaders after the step.
        let train = graph.entry(ENTRY_TRAIN);
        let timing = exec.run_reading(train, graph.records, batch.slot_bytes())?;
        drop(batch);
        if let (Some(log), Some(t0)) = (trace, step_started) {
            let row = crate::trace::CONSUMER_ROW;
            log.record(crate::trace::Kind::Step, row, batch_index, t0, log.now());
        }
        let grad_norm = read_step_outputs(exec, graph, &mut self.loss, &mut self.clip)?;
        self.record.step_submissions += exec.submissions() - submitted;
        check_finite(&self.loss, grad_norm, step, epoch, self.config.lr)?;
        self.progress.step = step;
        self.progress.epoch = step / self.batches_per_epoch;
        self.progress.batch_in_epoch = step % self.batches_per_epoch;
        self.record.final_loss = Some(self.loss[0]);
        let report = StepReport {
            step,
            epoch,
            loss: self.loss,
            lr,
            waited,
            device: timing.device,
            wall: started.elapsed(),
            grad_norm,
        };
        self.record.total_waited += waited;
        self.epoch_acc.add(&report);
        Ok(Some(report))
    }

    /// The autotuner looks at whole windows and may restart the loader at the next batch.
    fn retune(
        &mut self,
        report: &StepReport,
        base: &TuningBase<'_>,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        let counters = running(&mut self.loader)?.counters();
        let (Some(tuner), Some(acc)) = (&mut self.tuner, &mut self.window) else {
            return Ok(());
        };
        let Some(w) = acc.add(report, &counters) else {
            return Ok(());
        };
        let seen = tuner.decisions().len();
        let part_records = |loaders| base.part_records(loaders);
        let change = tuner.observe(report.step, &w, part_records, &|t| base.fits(t));
        for d in &tuner.decisions()[seen..] {
            observer.tuned(d);
        }
        let settled = tuner.settled();
        if let Some(t) = change {
            self.loader_config = tuned_loader_config(&self.loader_config, &t);
            self.restart_loader()?;
        }
        if settled {
            self.record.settled_at = Some((Instant::now(), self.record.total_waited));
            self.window = None;
        } else {
            self.window = Some(WindowAcc::new(&self.loader_config, Some(w.step_mean)));
        }
        Ok(())
    }

    /// The end of an epoch: its report; augmentation down to flips for the last tenth of the
    /// epochs; a checkpoint every `checkpoint_every` epochs (the last one is the run's).
    fn end_epoch(
        &mut self,
        epoch: u64,
        saver: &Saver<'_>,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        // One snapshot ends this epoch's counts and starts the next one's.
        let counters = running(&mut self.loader)?.counters();
        let acc = std::mem::replace(&mut self.epoch_acc, EpochAcc::new(counters));
        let e = acc.finish(
            epoch,
            counters,
            self.loader_config.loaders,
            self.graph.batch,
        );
        observer.epoch(&e);
        self.record.epochs.push(e);
        let (done, epochs) = (self.progress.epoch, self.config.epochs);
        if done == self.quiet_from && done < epochs && self.loader_config.augment.enabled {
            log::info!(
                "epoch {}: augmentation down to flips for the last {} epochs",
                done + 1,
                epochs - done
            );
            self.loader_config.augment = self.loader_config.augment.quiet();
            self.restart_loader()?;
        }
        if done % self.config.checkpoint_every.max(1) == 0 && done < epochs {
            let tuning = loader_tuning(&self.loader_config);
            saver.save(&mut self.exec, &self.progress, &tuning, observer)?;
        }
        Ok(())
    }

    /// The loader stopped, then started again at the next batch with `loader_config`.
    fn restart_loader(&mut self) -> Result<()> {
        drop(self.loader.take());
        let at = self.progress.step;
        self.loader = Some(start_loader(self.dataset, &self.loader_config, at)?);
        Ok(())
    }
}

/// The loader running now ([`Steps::loader`]).
fn running(loader: &mut Option<Loader>) -> Result<&mut Loader> {
    loader
        .as_mut()
        .ok_or_else(|| Error::Config("the loader is not running: its restart failed".to_owned()))
}

/// The loader over `dataset` per `lc`, starting at batch `at`.
fn start_loader(dataset: &Dataset, lc: &LoaderConfig, at: u64) -> Result<Loader> {
    Ok(Loader::start(
        dataset,
        &LoaderConfig {
            start_batch: at,
            ..lc.clone()
        },
    )?)
}

/// The loaders' configuration for `config` (before any autotuning).
fn loader_config_of(config: &TrainConfig, options: &RunOptions) -> LoaderConfig {
    LoaderConfig {
        batch: config.batch as usize,
        ring_slots: config.ring,
        loaders: config.loaders,
        seed: config.seed,
        epochs: config.epochs,
        start_batch: 0,
        shuffle: true,
        augment: AugmentConfig {
            enabled: config.augment,
            mosaic_prob: config.mosaic,
            ..AugmentConfig::default()
        },
        on_corrupt: options.on_corrupt,
        io: options.io,
        uring: crate::io::UringOptions {
            queue_depth: config.io_depth,
            ..Default::default()
        },
        trace: options.trace.clone(),
        slow_down: options.loader_slow_down,
        counters: Some(Default::default()),
        ..LoaderConfig::default()
    }
}

/// Whole batches the loaders of `lc` make of an epoch of `dataset` (at least one, or an
/// error).
fn batches_per_epoch(config: &TrainConfig, dataset: &Dataset, lc: &LoaderConfig) -> Result<u64> {
    match lc.batches_per_epoch(dataset.records()) {
        0 => Err(Error::Config(format!(
            "{} has {} records, fewer than one batch of {}",
            config.data.display(),
            dataset.records(),
            lc.fresh_per_batch()
        ))),
        n => Ok(n),
    }
}

/// The replay data `config` names, opened and checked against the training data, and the
/// classes the run trains: the data's, and with replay those only the replay data has.
fn open_replay(
    config: &TrainConfig,
    dataset: &Dataset,
    direct: DirectMode,
) -> Result<(Option<std::sync::Arc<loader::Replay>>, Vec<String>)> {
    let Some(dir) = &config.replay else {
        return Ok((None, dataset.manifest.classes.clone()));
    };
    let replay = Dataset::open(dir, direct)?;
    let classes =
        loader::replay::union_classes(&dataset.manifest.classes, &replay.manifest.classes);
    let replay = loader::Replay::new(replay, config.replay_fraction, &dataset.layout, &classes)?;
    Ok((Some(std::sync::Arc::new(replay)), classes))
}

/// Reads what a step leaves for the host: the loss into `loss` and, with clipping, the
/// clip's tensor into `clip` (sized for it up front), of which the norm and scale are returned.
fn read_step_outputs(
    exec: &mut Exec,
    graph: &ModelGraph,
    loss: &mut [f32; LOSS_LEN],
    clip: &mut [f32],
) -> Result<Option<GradNorm>> {
    exec.read_f32(graph.loss, loss)?;
    let Some(id) = graph.grad_norm else {
        return Ok(None);
    };
    exec.read_f32(id, clip)?;
    Ok(Some(GradNorm {
        norm: clip[CLIP_NORM],
        scale: clip[CLIP_SCALE],
    }))
}

/// Stops a run whose loss or gradient norm stopped being a number (it diverged).
fn check_finite(
    loss: &[f32; LOSS_LEN],
    grad_norm: Option<GradNorm>,
    step: u64,
    epoch: u64,
    lr: f32,
) -> Result<()> {
    let diverged = [loss[0], grad_norm.map_or(0.0, |g| g.norm)]
        .into_iter()
        .zip(["loss", "gradient norm"])
        .find(|(v, _)| !v.is_finite());
    match diverged {
        Some((value, what)) => Err(Error::Config(format!(
            "the {what} became {value} at step {step} (epoch {}): lower --lr (now {lr})",
            epoch + 1,
        ))),
        None => Ok(()),
    }
}

/// Model `name` for `classes` classes at `dataset`'s records' size (the input size is the pack's
/// `--size`: it flows from the data into the checkpoint, and from there to eval, infer and
/// export).
fn model_for(name: &str, dataset: &Dataset, classes: u32) -> Result<ModelConfig> {
    let layout = &dataset.layout;
    let (w, h) = (layout.width, layout.height);
    let sizes = format!(
        "a multiple of 32 from {} to {}",
        ModelConfig::MIN_INPUT,
        ModelConfig::MAX_INPUT
    );
    if w != h || layout.channels != 3 {
        return Err(Error::Config(format!(
            "{}: records are {w}×{h}×{}; a model trains on square RGB records: pack again \
             with --size N ({sizes})",
            dataset.dir.display(),
            layout.channels
        )));
    }
    ModelConfig::named_at(name, classes, w).map_err(|e| {
        Error::Config(format!(
            "{}: records are {w}×{w} px, and {e}: pack again with --size {}",
            dataset.dir.display(),
            (w.clamp(ModelConfig::MIN_INPUT, ModelConfig::MAX_INPUT) + 16) / 32 * 32
        ))
    })
}

/// Runs a few steps and loads a few batches to measure `T_step` and `T_g` for the autotuner.
/// Runs before the weights are written: the steps' updates are overwritten (and run at lr 0).
fn probe(
    exec: &mut Exec,
    train_entry: usize,
    graph: &ModelGraph,
    dataset: &Dataset,
    lc: &LoaderConfig,
) -> Result<Probe> {
    const STEPS: usize = 3;
    const BATCHES: u64 = 3;
    // Learning rate 0, and decay 1 for the weight average: the probe leaves both alone.
    exec.write_f32(graph.hyper, &AdamW::frozen_hyper())?;
    let mut step = Duration::MAX;
    for i in 0..STEPS {
        let t = exec.run(train_entry)?;
        // The first run pays one-time costs (pipelines, page faults).
        if i > 0 {
            step = step.min(t.device);
        }
    }
    let mut loader = Loader::start(
        dataset,
        &LoaderConfig {
            counters: None,
            trace: None,
            epochs: lc.epochs.max(1),
            ..lc.clone()
        },
    )?;
    let before = loader.counters().loaders;
    let mut taken = 0;
    while taken < BATCHES.min(loader.batches_per_epoch() * lc.epochs) {
        if loader.next_batch()?.is_none() {
            break;
        }
        taken += 1;
    }
    let loaders = loader.counters().loaders.since(&before);
    Ok(Probe { step, loaders })
}

/// Collects one autotuner window: skips the steps right after a (re)start, while the ring
/// fills, then sums a window's steps.
struct WindowAcc {
    skip: u64,
    steps_wanted: u64,
    started: Option<(Instant, StageSnapshot)>,
    steps: u64,
    waited: Duration,
    device_s: f64,
    device_s2: f64,
}

impl WindowAcc {
    fn new(lc: &LoaderConfig, step: Option<Duration>) -> Self {
        WindowAcc {
            skip: lc.ring_slots as u64 + 1,
            steps_wanted: step.map_or(8, Autotuner::window_steps),
            started: None,
            steps: 0,
            waited: Duration::ZERO,
            device_s: 0.0,
            device_s2: 0.0,
        }
    }

    /// Adds a step; returns the window when it is complete.
    fn add(&mut self, r: &StepReport, counters: &balance::PipelineSnapshot) -> Option<Window> {
        if self.skip > 0 {
            self.skip -= 1;
            if self.skip == 0 {
                self.started = Some((Instant::now(), counters.loaders));
            }
            return None;
        }
        let (since, at_start) = self.started?;
        self.steps += 1;
        self.waited += r.waited;
        let d = r.device.as_secs_f64();
        self.device_s += d;
        self.device_s2 += d * d;
        if self.steps < self.steps_wanted {
            return None;
        }
        Some(Window {
            steps: self.steps,
            wall: since.elapsed(),
            waited: self.waited,
            step_mean: Duration::from_secs_f64(self.device_s / self.steps as f64),
            step_cv: balance::coefficient_of_variation(self.steps, self.device_s, self.device_s2)
                .unwrap_or(0.0),
            loaders: counters.loaders.since(&at_start),
        })
    }
}

/// Sums over one epoch.
struct EpochAcc {
    started: Instant,
    steps: u64,
    loss: f64,
    /// Sum and largest of the gradient norms, and the steps clipped (with clipping).
    grad_norm: Option<(f64, f32, u64)>,
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
            grad_norm: None,
            waited: Duration::ZERO,
            device: Duration::ZERO,
            counters_at_start: counters,
        }
    }

    fn add(&mut self, r: &StepReport) {
        self.steps += 1;
        self.loss += r.loss[0] as f64;
        if let Some(g) = r.grad_norm {
            let (sum, max, clipped) = self.grad_norm.get_or_insert((0.0, 0.0, 0));
            *sum += f64::from(g.norm);
            *max = max.max(g.norm);
            *clipped += u64::from(g.scale < 1.0);
        }
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
        // T_g is a loader's wall time per record: its CPU plus whatever its work waited on
        // (reads, a core shared with the engine), which is what sets a loader's rate.
        let loaders = counters.loaders.since(&self.counters_at_start.loaders);
        let tg = loaders.busy_per_item().unwrap_or_default();
        let loader_cpu_share = loaders.cpu_share();
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
            loader_cpu_share,
            grad_norm: self.grad_norm.map(|(sum, max, clipped)| GradNormSummary {
                mean: (sum / self.steps.max(1) as f64) as f32,
                max,
                clipped,
            }),
        }
    }
}

/// The first epoch (from 0) of a run of `epochs` whose augmentation is turned down to flips:
/// the last tenth (none in runs under 10 epochs).
fn quiet_from(epochs: u64) -> u64 {
    epochs - epochs / 10
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
            read(StateTensor::AdamM.name(&spec.name), m)?;
            read(StateTensor::AdamV.name(&spec.name), v)?;
        }
        if let Some(ema) = p.ema {
            read(StateTensor::Ema.name(&spec.name), ema)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_tenth_of_the_epochs_is_quiet() {
        assert_eq!(quiet_from(60), 54);
        assert_eq!(quiet_from(10), 9);
        assert_eq!(quiet_from(9), 9, "no quiet epoch under 10");
        assert_eq!(quiet_from(1), 1);
    }
}
