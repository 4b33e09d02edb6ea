//! `train --autotune` against a deliberately slow loader (the loader's delay knob): it raises
//! the loader count from the equation and by hill-climbing, stores its choice in the
//! checkpoint, never changes what is trained, and says when the memory budget leaves no
//! configuration that balances.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use fulcrum::compute::exec::{EngineChoice, ExecOptions};
use fulcrum::io::{DirectMode, IoKind};
use fulcrum::loader::{self, AugmentConfig, Dataset, LoaderConfig};
use fulcrum::model::Checkpoint;
use fulcrum::model::{Arch, GraphOptions, ModelConfig, ModelGraph};
use fulcrum::train::{self, Observer, RunOptions, StepReport, TrainConfig, TrainReport};
use fulcrum_tests::*;

const BATCH: u32 = 8;

fn config(data: &Path, out: &Path) -> TrainConfig {
    TrainConfig {
        batch: BATCH,
        ..small_training(data, out, 3)
    }
}

fn options() -> RunOptions {
    RunOptions {
        exec: ExecOptions {
            engine: EngineChoice::Cpu,
            // One thread: sums in a fixed order, so runs are bit-for-bit repeatable.
            threads: 1,
            ..ExecOptions::default()
        },
        ..RunOptions::default()
    }
}

/// Keeps the losses and step times.
#[derive(Default)]
struct Steps {
    losses: Vec<f32>,
    device: Vec<Duration>,
}

impl Observer for Steps {
    fn step(&mut self, r: &StepReport) {
        self.losses.push(r.loss[0]);
        self.device.push(r.device);
    }
}

fn train(config: &TrainConfig, options: &RunOptions) -> (TrainReport, Steps) {
    let mut steps = Steps::default();
    let report =
        train::train(config, options, &AtomicBool::new(false), &mut steps).expect("training runs");
    (report, steps)
}

/// A per-record loader delay that makes one loader take `factor` × the step time per batch.
fn slow_loader(data: &Path, out: &Path, factor: f64) -> Duration {
    let (_, steps) = train(
        &config(data, out),
        &RunOptions {
            max_steps: Some(8),
            ..options()
        },
    );
    let mut times = steps.device[2..].to_vec();
    times.sort();
    times[times.len() / 2].mul_f64(factor / BATCH as f64)
}

fn dataset(tmp: &Path) -> PathBuf {
    pack_synthetic(&tmp.join("data"), 128, 128)
}

#[test]
fn a_slow_loader_gets_more_loaders_from_the_equation_and_the_checkpoint_keeps_them() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path());
    let delay = slow_loader(&data, &tmp.path().join("calibrate"), 4.0);
    let out = tmp.path().join("tuned");
    let (report, _) = train(
        &TrainConfig {
            autotune: true,
            ..config(&data, &out)
        },
        &RunOptions {
            max_steps: Some(30),
            loader_slow_down: delay,
            ..options()
        },
    );
    // One loader needs 4 steps per batch: the equation asks for ⌈4 × 1.15⌉ = 5.
    assert!(
        report.tuning.loaders >= 2,
        "{:?}: {:#?}",
        report.tuning,
        report.decisions
    );
    let first = &report.decisions[0];
    assert_eq!(first.step, 0);
    assert!(first.why.contains("T_step"), "{first:?}");
    assert_eq!(report.tuning.batch, BATCH, "no budget: the batch asked for");
    // The checkpoint holds the tuned configuration.
    let saved: TrainConfig =
        serde_json::from_value(Checkpoint::load(&report.checkpoint).unwrap().train.unwrap())
            .unwrap();
    assert!(saved.autotune);
    assert_eq!(
        (saved.loaders, saved.ring, saved.io_depth, saved.batch),
        (
            report.tuning.loaders,
            report.tuning.ring,
            report.tuning.io_depth,
            report.tuning.batch
        )
    );
    // A resumed run starts from it.
    let (resumed, _) = train(
        &TrainConfig {
            autotune: true,
            ..config(&data, &out)
        },
        &RunOptions {
            resume: true,
            max_steps: Some(34),
            loader_slow_down: delay,
            ..options()
        },
    );
    let start = &resumed.decisions[0];
    assert!(
        start
            .what
            .contains(&format!("{} loader(s)", report.tuning.loaders)),
        "{start:?}"
    );
    assert!(start.why.contains("checkpoint"), "{start:?}");
}

#[test]
fn hill_climbing_restarts_the_loader_without_changing_what_is_trained() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path());
    let delay = slow_loader(&data, &tmp.path().join("calibrate"), 4.0);
    const FIRST: u64 = 6;
    const ALL: u64 = 40;

    // Six steps starved (one loader), then resumed with --autotune: it starts from the
    // checkpoint's one loader and must raise it from what the windows measure.
    let out = tmp.path().join("climbed");
    let (_, before) = train(
        &config(&data, &out),
        &RunOptions {
            max_steps: Some(FIRST),
            loader_slow_down: delay,
            ..options()
        },
    );
    let (climbed, after) = train(
        &TrainConfig {
            autotune: true,
            ..config(&data, &out)
        },
        &RunOptions {
            resume: true,
            max_steps: Some(ALL),
            loader_slow_down: delay,
            ..options()
        },
    );
    let raise = climbed
        .decisions
        .iter()
        .find(|d| d.step > FIRST && d.what.contains("loaders"))
        .unwrap_or_else(|| panic!("no loader change: {:#?}", climbed.decisions));
    assert!(raise.why.contains("ring never filled"), "{raise:?}");
    assert!(climbed.tuning.loaders > 1, "{:?}", climbed.tuning);

    // The same steps without any of it.
    let (_, plain) = train(
        &config(&data, &tmp.path().join("plain")),
        &RunOptions {
            max_steps: Some(ALL),
            ..options()
        },
    );
    let tuned: Vec<f32> = before.losses.into_iter().chain(after.losses).collect();
    assert_eq!(tuned.len(), ALL as usize);
    assert_eq!(tuned, plain.losses, "autotuning changed the training");
}

/// Bytes the trainer plans for `loaders` loaders, a ring of 2 and the model at `BATCH` (on
/// the engine `options()` choose).
fn planned(data: &Path, loaders: usize) -> u64 {
    let dataset = Dataset::open(data, DirectMode::Auto).unwrap();
    let lc = LoaderConfig {
        batch: BATCH as usize,
        ring_slots: 2,
        loaders,
        augment: AugmentConfig {
            enabled: true,
            ..AugmentConfig::default()
        },
        ..LoaderConfig::default()
    };
    let model = ModelConfig::named("det-s", dataset.manifest.num_classes()).unwrap();
    let graph = ModelGraph::build(
        &Arch::new(&model),
        BATCH,
        &dataset.layout,
        &GraphOptions {
            train: true,
            ..GraphOptions::default()
        },
    )
    .unwrap();
    loader::plan(&dataset, &lc, IoKind::Auto).total()
        + fulcrum::train::plan::model_memory_plan(&graph, &options().exec)
            .unwrap()
            .total()
}

#[test]
fn a_budget_with_room_for_one_loader_is_reported_as_unbalanced() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path());
    let delay = slow_loader(&data, &tmp.path().join("calibrate"), 4.0);
    let (one, two) = (planned(&data, 1), planned(&data, 2));
    assert!(two > one);
    let budget = one + (two - one) / 2;
    let (report, _) = train(
        &TrainConfig {
            autotune: true,
            ..config(&data, &tmp.path().join("tight"))
        },
        &RunOptions {
            max_steps: Some(30),
            loader_slow_down: delay,
            mem_budget: Some(budget),
            ..options()
        },
    );
    assert_eq!(report.tuning.loaders, 1, "{:#?}", report.decisions);
    assert_eq!(report.tuning.batch, BATCH);
    let why = report
        .unbalanced
        .expect("the tuner says it could not balance");
    assert!(why.contains("memory budget"), "{why}");
}
