//! The compute benchmark behind `fulcrum bench compute`: det-s on one engine — forward latency
//! at batch 1, a whole training step (forward, loss, backward, AdamW) at a training batch, time
//! per kernel family, GFLOP/s, and on Vulkan the split between device time and the host's
//! submission overhead. On Vulkan also a training step with its batch's upload: from plain
//! host memory (the CPU copies it first) and from a ring slot the device imported (the GPU
//! copies it in the step's own submission).
//!
//! Inputs are synthetic records (random pixels, a few boxes) written once; weights are the
//! initialisation. Times are medians over the runs after warm-up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::base::thread_cpu_time;
use crate::base::SlotBytes;
use crate::base::SplitMix64;
use crate::compute::cpu::exec::SplitChoice;
use crate::compute::cpu::kernels::KernelSet;
use crate::compute::exec::{Exec, ExecOptions, Result};
use crate::compute::recording::{Recording, Step};
use crate::format::{RecordBox, RecordLayout, RecordMeta};
use crate::model::{
    init, Arch, Freeze, GraphOptions, ModelConfig, ModelGraph, ENTRY_INFER, ENTRY_TRAIN,
};

/// What to measure.
#[derive(Debug, Clone)]
pub struct ComputeBenchConfig {
    pub model: String,
    pub classes: u32,
    pub train_batch: u32,
    /// Runs measured per figure (after two warm-up runs).
    pub runs: usize,
    pub exec: ExecOptions,
    /// Alternate the runs between [`crate::compute::ab`]'s variants A and B (and report both).
    pub ab: bool,
    /// The layers the training step leaves as they are (a fine-tune's step).
    pub freeze: Freeze,
}

/// Time spent in one kernel family per run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelTime {
    pub kernel: String,
    pub calls: usize,
    pub ms: f64,
    pub share: f64,
}

/// One entry's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EntryFigures {
    pub batch: u32,
    /// Median device time per run (GPU timestamps on Vulkan; wall time on the CPU engine).
    pub device_ms: f64,
    /// Median host wall time per run (submission, waiting and readback of nothing included).
    pub wall_ms: f64,
    /// `wall − device`: what the host adds around the device's work.
    pub overhead_ms: f64,
    /// For the forward pass: median wall time of a pass with its transfers, the batch's
    /// records written from host memory before it and the detections and their counts read
    /// back after (what a caller of `infer` waits for; peers that time upload, dispatches and
    /// download together compare with this). `None` for a training step.
    pub with_io_ms: Option<f64>,
    /// Dispatches (Vulkan) or kernel calls (CPU) per run.
    pub kernels: usize,
    pub gflop: f64,
    pub gflops: f64,
    pub per_kernel: Vec<KernelTime>,
    /// With [`ComputeBenchConfig::ab`]: the even runs' figures (variant A) and the odd runs'
    /// (variant B); the medians above are over both.
    pub ab: Option<AbFigures>,
}

/// Runs of one entry alternating between [`crate::compute::ab`]'s variants, each variant's own figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AbFigures {
    pub a: VariantFigures,
    pub b: VariantFigures,
    /// B's median device time over A's.
    pub b_over_a: f64,
}

/// One variant's device times per run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VariantFigures {
    pub runs: usize,
    pub median_ms: f64,
    pub fastest_ms: f64,
}

impl VariantFigures {
    fn of(times: impl Iterator<Item = Duration>) -> VariantFigures {
        let times: Vec<Duration> = times.collect();
        VariantFigures {
            runs: times.len(),
            fastest_ms: times
                .iter()
                .min()
                .copied()
                .unwrap_or_default()
                .as_secs_f64()
                * 1e3,
            median_ms: median(times).as_secs_f64() * 1e3,
        }
    }
}

/// A training step with its batch going to the engine's input tensor (medians per step).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepInputFigures {
    /// The batch's records.
    pub bytes: usize,
    /// From plain host memory: the CPU copies the batch (into mapped memory or staging), then
    /// the step runs. Wall time of both.
    pub host_step_ms: f64,
    /// CPU time of the calling thread for both.
    pub host_cpu_ms: f64,
    /// From a ring slot the device imported: the GPU copies it in the step's submission;
    /// `None` where the device cannot import host memory.
    pub imported_step_ms: Option<f64>,
    pub imported_cpu_ms: Option<f64>,
    /// Command-buffer submissions per step from an imported slot.
    pub imported_submissions: Option<f64>,
}

/// A fine-tune's training step (`--freeze`) against the step that trains every layer, both
/// at the same batch, their runs alternating in one process (the host's moments fall on both).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FreezeFigures {
    /// What the fine-tune leaves as it is (`--freeze`'s name).
    pub freeze: String,
    /// Median device time of the fine-tune's step and of the full step.
    pub frozen_ms: f64,
    pub full_ms: f64,
    /// `frozen_ms / full_ms`.
    pub ratio: f64,
    /// Runs of each.
    pub runs: usize,
}

/// The figures of one engine.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ComputeBenchReport {
    pub engine: String,
    /// The CPU engine's kernel set (`FULCRUM_CPU_KERNELS` forces one); `None` on a GPU.
    pub cpu_kernels: Option<KernelSet>,
    /// The CPU engine's batch-1 forward convs split over the threads (the stem, pointwise
    /// convs and separable pairs by rows, others by channels; chosen per layer by
    /// measurement); `None` on a GPU.
    pub cpu_batch1_split: Option<SplitChoice>,
    pub model: String,
    pub params: usize,
    pub forward_batch1: EntryFigures,
    pub train_step: EntryFigures,
    /// Vulkan only: the training step with its batch, from host memory and from an imported
    /// ring slot.
    pub step_input: Option<StepInputFigures>,
    /// With a freeze: its step against the full step (`train_step` is the frozen one's).
    pub freeze: Option<FreezeFigures>,
}

/// Floating-point work of an entry: convolutions forward (`flops`) and backward (twice that).
fn entry_flops(rec: &Recording, entry: usize) -> u64 {
    rec.entries[entry]
        .steps
        .iter()
        .map(|s| match s {
            Step::ConvForward { op, .. } => op.flops(),
            Step::ConvBackward { op, .. } => 2 * op.flops(),
            _ => 0,
        })
        .sum()
}

/// Synthetic records: random pixels and one or two boxes each.
fn records(layout: &RecordLayout, n: u32, classes: u32, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let mut out = vec![0u8; n as usize * layout.record_size];
    let mut image = vec![0u8; layout.image_bytes];
    let side = layout.width as f32;
    for (i, record) in out.chunks_exact_mut(layout.record_size).enumerate() {
        image
            .iter_mut()
            .for_each(|b| *b = (rng.next_u64() >> 56) as u8);
        let boxes: Vec<RecordBox> = (0..1 + i % 2)
            .map(|_| {
                let (x, y) = (rng.next_f32() * side * 0.6, rng.next_f32() * side * 0.6);
                let s = 8.0 + rng.next_f32() * side * 0.3;
                RecordBox {
                    class: (rng.next_u64() % classes as u64) as u32,
                    x0: x,
                    y0: y,
                    x1: (x + s).min(side),
                    y1: (y + s).min(side),
                }
            })
            .collect();
        let meta = RecordMeta {
            index: i as u64,
            ..RecordMeta::default()
        };
        layout.encode(record, &image, &meta, &boxes);
    }
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Median wall and calling-thread CPU time of `runs` calls of `f`, after one warm-up call.
fn timed(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    f()?;
    let (mut wall, mut cpu) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        let (c0, t0) = (thread_cpu_time(), Instant::now());
        f()?;
        wall.push(t0.elapsed());
        cpu.push(thread_cpu_time().saturating_sub(c0));
    }
    let ms = |v| median(v).as_secs_f64() * 1e3;
    Ok((ms(wall), ms(cpu)))
}

/// A training step (entry `entry`) with its batch `batch` for the records tensor: written by
/// the host first, and read from a ring slot the device imported (filled with the same bytes).
fn measure_step_input(
    exec: &mut Exec,
    graph: &ModelGraph,
    entry: usize,
    batch: &[u8],
    runs: usize,
) -> Result<StepInputFigures> {
    let (host_step_ms, host_cpu_ms) = timed(runs, || {
        exec.write_bytes(graph.records, batch)?;
        exec.run(entry).map(drop)
    })?;
    // A device that offers imports but refuses this one is measured as one without.
    let slot = exec
        .slot_allocator()
        .and_then(|a| match a.allocate(batch.len()) {
            Ok(slot) => Some(slot),
            Err(e) => {
                log::warn!("bench: no imported ring slot: {e}");
                None
            }
        });
    let mut imported = None;
    let mut imported_submissions = None;
    if let Some(mut slot) = slot {
        slot.bytes_mut()[..batch.len()].copy_from_slice(batch);
        let input = SlotBytes::in_memory(&mut *slot, 0..batch.len())
            .expect("the slot was allocated with the batch's size");
        let before = exec.submissions();
        imported = Some(timed(runs, || {
            exec.run_reading(entry, graph.records, input).map(drop)
        })?);
        // `timed` makes one warm-up call before the runs.
        imported_submissions = Some((exec.submissions() - before) as f64 / (runs + 1) as f64);
    }
    Ok(StepInputFigures {
        bytes: batch.len(),
        host_step_ms,
        host_cpu_ms,
        imported_step_ms: imported.map(|i| i.0),
        imported_cpu_ms: imported.map(|i| i.1),
        imported_submissions,
    })
}

/// Measures one entry of a freshly built graph at `batch` (and, for a training step on
/// Vulkan, the batch upload); `breakdown` adds the time per kernel family, from a second
/// executor timing every kernel.
/// `config`'s model at `batch`, its records' layout and its graph (with the `train` entry
/// where asked, `freeze` left as it is).
fn build(
    config: &ComputeBenchConfig,
    batch: u32,
    train: bool,
    freeze: Freeze,
) -> Result<(Arch, RecordLayout, ModelGraph)> {
    let model_error = |e: String| crate::compute::exec::Error::Model(e);
    let model = ModelConfig::named(&config.model, config.classes)
        .map_err(|e| model_error(e.to_string()))?;
    let arch = Arch::new(&model);
    let layout = RecordLayout::new(model.input, model.input, 3, 8)
        .map_err(|e| model_error(e.to_string()))?;
    let options = GraphOptions {
        train,
        freeze,
        ..GraphOptions::default()
    };
    let graph = ModelGraph::build(&arch, batch, &layout, &options)
        .map_err(|e| model_error(e.to_string()))?;
    Ok((arch, layout, graph))
}

fn measure(
    config: &ComputeBenchConfig,
    batch: u32,
    train: bool,
    breakdown: bool,
) -> Result<(EntryFigures, Engine, Option<StepInputFigures>)> {
    let (arch, layout, graph) = build(config, batch, train, config.freeze)?;
    let entry = graph.entry(if train { ENTRY_TRAIN } else { ENTRY_INFER });

    // Whole-entry timing: per-step timestamps only (per-kernel timing adds barriers and
    // queries that would inflate the figure).
    let mut exec = Exec::new(
        &graph.recording,
        &ExecOptions {
            per_kernel_timing: false,
            ..config.exec.clone()
        },
    )?;
    let engine = Engine {
        describe: exec.describe(),
        cpu_kernels: exec.cpu_kernels(),
        cpu_split: exec.cpu_split_choice(entry),
    };
    setup(&mut exec, &graph, &arch, &layout, batch, config.classes)?;
    let (mut device, mut wall) = (Vec::new(), Vec::new());
    // The warm-up runs are A and B too; measured run `i − 2` is B where it is odd.
    for i in 0..config.runs + 2 {
        crate::compute::ab::set_b(config.ab && i % 2 == 1);
        let t = exec.run(entry)?;
        if i >= 2 {
            device.push(t.device);
            wall.push(t.wall);
        }
    }
    crate::compute::ab::set_b(false);
    let ab = config.ab.then(|| {
        let variant = |b: usize| VariantFigures::of(device.iter().skip(b).step_by(2).copied());
        let (a, b) = (variant(0), variant(1));
        let b_over_a = b.median_ms / a.median_ms.max(1e-12);
        AbFigures { a, b, b_over_a }
    });
    let step_input = if train && exec.is_vulkan() {
        let batch_records = records(&layout, batch, config.classes, 7);
        Some(measure_step_input(
            &mut exec,
            &graph,
            entry,
            &batch_records,
            config.runs.max(10),
        )?)
    } else {
        None
    };
    let with_io = if train {
        None
    } else {
        Some(forward_with_io(&mut exec, &graph, &layout, batch, config)?)
    };
    let kernels = exec.kernel_names(entry).len();
    drop(exec);
    let per_kernel = if breakdown {
        per_kernel_times(config, &graph, &arch, &layout, batch, entry)?
    } else {
        Vec::new()
    };

    let (device, wall) = (median(device), median(wall));
    let gflop = entry_flops(&graph.recording, entry) as f64 / 1e9;
    Ok((
        EntryFigures {
            batch,
            device_ms: device.as_secs_f64() * 1e3,
            wall_ms: wall.as_secs_f64() * 1e3,
            overhead_ms: wall.saturating_sub(device).as_secs_f64() * 1e3,
            with_io_ms: with_io.map(|t| t.as_secs_f64() * 1e3),
            kernels,
            gflop,
            gflops: gflop / device.as_secs_f64().max(1e-12),
            per_kernel,
            ab,
        },
        engine,
        step_input,
    ))
}

/// Time per kernel family of `entry`, in a second executor with per-kernel timing.
fn per_kernel_times(
    config: &ComputeBenchConfig,
    graph: &ModelGraph,
    arch: &Arch,
    layout: &RecordLayout,
    batch: u32,
    entry: usize,
) -> Result<Vec<KernelTime>> {
    let mut exec = Exec::new(
        &graph.recording,
        &ExecOptions {
            per_kernel_timing: true,
            ..config.exec.clone()
        },
    )?;
    setup(&mut exec, graph, arch, layout, batch, config.classes)?;
    let names = exec.kernel_names(entry);
    let mut sums: BTreeMap<String, (usize, Duration)> = BTreeMap::new();
    let runs = config.runs.clamp(1, 5);
    exec.run(entry)?;
    for _ in 0..runs {
        let t = exec.run(entry)?;
        for (name, d) in names.iter().zip(&t.per_kernel) {
            let e = sums.entry(name.clone()).or_default();
            e.0 += 1;
            e.1 += *d;
        }
    }
    let total: Duration = sums.values().map(|v| v.1).sum();
    let mut per_kernel: Vec<KernelTime> = sums
        .into_iter()
        .map(|(kernel, (calls, d))| KernelTime {
            kernel,
            calls: calls / runs,
            ms: d.as_secs_f64() * 1e3 / runs as f64,
            share: d.as_secs_f64() / total.as_secs_f64().max(1e-12),
        })
        .collect();
    per_kernel.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    Ok(per_kernel)
}

/// The median wall time of the inference entry with its transfers: the records written, the
/// pass run, the detections and their counts read back ([`EntryFigures::with_io_ms`]).
fn forward_with_io(
    exec: &mut Exec,
    graph: &ModelGraph,
    layout: &RecordLayout,
    batch: u32,
    config: &ComputeBenchConfig,
) -> Result<Duration> {
    let input = records(layout, batch, config.classes, 7);
    let tensors = &graph.recording.tensors;
    let mut dets = vec![0u8; tensors[graph.dets.index()].len];
    let mut counts = vec![0u8; tensors[graph.counts.index()].len];
    let entry = graph.entry(ENTRY_INFER);
    let mut times = Vec::with_capacity(config.runs);
    for i in 0..config.runs + 2 {
        let start = Instant::now();
        exec.write_bytes(graph.records, &input)?;
        exec.run(entry)?;
        exec.read_bytes(graph.dets, &mut dets)?;
        exec.read_bytes(graph.counts, &mut counts)?;
        if i >= 2 {
            times.push(start.elapsed());
        }
    }
    Ok(median(times))
}

fn setup(
    exec: &mut Exec,
    graph: &ModelGraph,
    arch: &Arch,
    layout: &RecordLayout,
    batch: u32,
    classes: u32,
) -> Result<()> {
    for (p, v) in graph.params.iter().zip(init::init_params(arch, 1)) {
        exec.write_f32(p.value, &v)?;
    }
    exec.write_bytes(graph.records, &records(layout, batch, classes, 7))?;
    exec.write_f32(graph.hyper, &GraphOptions::default().hyper(1e-3, 1))
}

/// Which engine a measurement ran on.
struct Engine {
    describe: String,
    cpu_kernels: Option<KernelSet>,
    cpu_split: Option<SplitChoice>,
}

/// Only the training step at `config.train_batch`, on the engine `config.exec` chooses, with
/// no time per kernel (`per_kernel` is empty): what the balance equation needs, without the
/// batch-1 forward, its set-up and the second executor of the breakdown.
pub fn run_step(config: &ComputeBenchConfig, progress: &dyn Fn(&str)) -> Result<EntryFigures> {
    progress(&format!("training step at batch {}", config.train_batch));
    Ok(measure(config, config.train_batch, true, false)?.0)
}

/// The training step of `config.freeze` and the full step at `config.train_batch`, on two
/// executors whose runs alternate ([`FreezeFigures`]).
pub fn freeze_ratio(config: &ComputeBenchConfig) -> Result<FreezeFigures> {
    let batch = config.train_batch;
    let mut steps = Vec::new();
    for freeze in [config.freeze, Freeze::None] {
        let (arch, layout, graph) = build(config, batch, true, freeze)?;
        let mut exec = Exec::new(&graph.recording, &config.exec)?;
        setup(&mut exec, &graph, &arch, &layout, batch, config.classes)?;
        steps.push((exec, graph.entry(ENTRY_TRAIN), Vec::new()));
    }
    for i in 0..config.runs + 2 {
        for (exec, entry, times) in &mut steps {
            let t = exec.run(*entry)?;
            if i >= 2 {
                times.push(t.device);
            }
        }
    }
    let mut medians = steps
        .into_iter()
        .map(|(.., times)| median(times).as_secs_f64() * 1e3);
    let (frozen_ms, full_ms) = (medians.next().unwrap_or(0.0), medians.next().unwrap_or(0.0));
    Ok(FreezeFigures {
        freeze: config.freeze.name().to_owned(),
        frozen_ms,
        full_ms,
        ratio: frozen_ms / full_ms.max(1e-12),
        runs: config.runs,
    })
}

/// Runs the benchmark on the engine `config.exec` chooses.
pub fn run(config: &ComputeBenchConfig, progress: &dyn Fn(&str)) -> Result<ComputeBenchReport> {
    progress("forward at batch 1");
    let (forward_batch1, engine, _) = measure(config, 1, false, true)?;
    progress(&format!("training step at batch {}", config.train_batch));
    let (train_step, _, step_input) = measure(config, config.train_batch, true, true)?;
    let freeze = if config.freeze == Freeze::None {
        None
    } else {
        progress(&format!(
            "--freeze {} against every layer training, alternating",
            config.freeze
        ));
        Some(freeze_ratio(config)?)
    };
    let model = ModelConfig::named(&config.model, config.classes)
        .map_err(|e| crate::compute::exec::Error::Model(e.to_string()))?;
    Ok(ComputeBenchReport {
        engine: engine.describe,
        cpu_kernels: engine.cpu_kernels,
        cpu_batch1_split: engine.cpu_split,
        model: config.model.clone(),
        params: Arch::new(&model).param_count(),
        forward_batch1,
        train_step,
        step_input,
        freeze,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::exec::EngineChoice;

    /// With a freeze, the training step measured is the fine-tune's (fewer kernels and less
    /// work than every layer training), and its time is given against the full step's.
    #[test]
    fn a_freeze_measures_the_fine_tunes_step_against_the_full_one() {
        let config = |freeze| ComputeBenchConfig {
            model: "det-s".into(),
            classes: 2,
            train_batch: 2,
            runs: 3,
            exec: ExecOptions {
                engine: EngineChoice::Cpu,
                threads: 1,
                ..ExecOptions::default()
            },
            ab: false,
            freeze,
        };
        let full = run(&config(Freeze::None), &|_| {}).expect("full");
        let frozen = run(&config(Freeze::BackboneNeck), &|_| {}).expect("frozen");
        assert!(full.freeze.is_none());
        let (f, t) = (&frozen.train_step, &full.train_step);
        assert!(
            f.kernels < t.kernels && f.gflop < 0.6 * t.gflop,
            "{f:?} {t:?}"
        );
        let ratio = frozen.freeze.expect("against the full step");
        assert_eq!((ratio.freeze.as_str(), ratio.runs), ("backbone+neck", 3));
        assert!(ratio.frozen_ms > 0.0 && ratio.full_ms > 0.0);
        assert!((ratio.ratio - ratio.frozen_ms / ratio.full_ms).abs() < 1e-9);
    }

    /// `ab` splits each entry's runs between the variants, A first, and leaves variant A
    /// set; without it there are no A/B figures.
    #[test]
    fn ab_runs_alternate_between_the_variants() {
        for ab in [false, true] {
            let config = ComputeBenchConfig {
                model: "det-s".into(),
                classes: 2,
                train_batch: 2,
                runs: 5,
                exec: ExecOptions {
                    engine: EngineChoice::Cpu,
                    threads: 1,
                    ..ExecOptions::default()
                },
                ab,
                freeze: Freeze::None,
            };
            let report = run(&config, &|_| {}).expect("bench");
            for f in [&report.forward_batch1, &report.train_step] {
                match (&f.ab, ab) {
                    (None, false) => {}
                    (Some(v), true) => {
                        assert_eq!((v.a.runs, v.b.runs), (3, 2));
                        assert!(v.a.fastest_ms <= v.a.median_ms && v.b.fastest_ms <= v.b.median_ms);
                        assert!(v.b_over_a > 0.0 && v.b_over_a.is_finite());
                    }
                    (got, _) => panic!("ab {ab}: {got:?}"),
                }
            }
            assert!(!crate::compute::ab::is_b(), "variant A after the bench");
        }
    }
}
