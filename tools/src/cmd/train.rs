use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fulcrum::base::human;
use fulcrum::compute::ops::{MAX_NEIGHBOUR_CELLS, MAX_NEIGHBOUR_RADIUS};
use fulcrum::io::{DirectMode, IoKind};
use fulcrum::loader::OnCorrupt;
use fulcrum::model::Progress;
use fulcrum::ring::RingMemory;
use fulcrum::train::autotune::Decision;
use fulcrum::train::recipe::{Recipe, RecipeSettings};
use fulcrum::train::{self, EpochReport, Observer, RunInfo, RunOptions, StepReport, TrainConfig};
use indicatif::ProgressBar;

use super::engine::EngineArgs;

/// Train the detector on a packed dataset.
///
/// Batches come from the input pipeline (io_uring → ring → loaders), the step runs on the
/// chosen engine, and after every epoch the balance equation is evaluated from what was
/// measured (`T_g·B/C` vs `T_step`: which side binds, how long the device waited). The
/// checkpoint OUT/last.safetensors is written atomically after every epoch and when the run
/// is stopped (Ctrl-C or SIGTERM: the current step finishes first); `--resume` continues it
/// to the same weights an uninterrupted run reaches.
///
/// With --autotune fulcrum chooses the loader count, ring depth, I/O queue depth and (within
/// --mem-budget) the batch: it starts from the balance equation with a short probe, then
/// adjusts on measured windows of steps, printing each decision with its reason. The choice
/// is stored in the checkpoint, so --resume starts tuned.
#[derive(clap::Args)]
pub struct Args {
    /// Packed dataset folder (`fulcrum pack`).
    #[arg(long, default_value = "data/synthetic")]
    data: PathBuf,
    /// Settings for a kind of data, so that you need not tune them. photos: real photos of
    /// a few classes, objects small and large (det-m started from the built-in base, batch
    /// 16, lr 0.01 with 50 warm-up steps, mosaic 0.5, gradient norm clipped at 10, box
    /// neighbours weighted 0.75 in the 3×3 block around a centre, epochs for about 1200
    /// steps: at least 30, at most 300). Options you give explicitly win over the recipe's.
    #[arg(long, value_name = "photos")]
    recipe: Option<Recipe>,
    /// Model: det-s (54.8 k parameters, one stride-8 output: the small fast default), det-m
    /// (width 1.5, outputs at strides 8, 16 and 32: small and large objects alike) or det-l
    /// (width 2, every residual block twice, three outputs). The input size is the pack's
    /// --size. [default: det-s; with --init-from, its model]
    #[arg(long)]
    model: Option<String>,
    /// Output folder for the checkpoint.
    #[arg(long, default_value = "runs/det-s")]
    out: PathBuf,
    /// Epochs to train (with --resume: the total, so it may grow), 1 to 1000000. [default:
    /// 30]
    #[arg(long, value_parser = crate::args::epochs())]
    epochs: Option<u64>,
    /// Records per batch (B). [default: 32]
    #[arg(long, value_parser = crate::args::count(crate::args::MAX_BATCH))]
    batch: Option<u32>,
    /// Peak learning rate (AdamW; linear warm-up, then cosine decay). [default: 0.004]
    #[arg(long, value_parser = crate::args::learning_rate)]
    lr: Option<f32>,
    /// Warm-up steps. [default: 100]
    #[arg(long)]
    warmup: Option<u64>,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 5e-4, value_parser = crate::args::weight_decay)]
    weight_decay: f32,
    /// Seed of the initial weights, the epoch order and augmentation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Loader threads (C).
    #[arg(long, default_value_t = 1, value_parser = crate::args::count_usize(crate::args::MAX_LOADERS))]
    loaders: usize,
    /// Ring slots (prefetch depth), each one batch.
    #[arg(long, default_value_t = 4, value_parser = crate::args::count_usize(crate::args::MAX_RING))]
    ring: usize,
    /// io_uring reads in flight per loader.
    #[arg(long, default_value_t = 32, value_parser = crate::args::count(crate::args::MAX_IO_DEPTH))]
    io_depth: u32,
    /// Choose loaders, ring, I/O queue depth and (within --mem-budget, at most --batch) the
    /// batch from measurements, instead of --loaders, --ring and --io-depth.
    #[arg(long)]
    autotune: bool,
    /// Make every loader slower by this much per record (e.g. 2ms): a stand-in for a weaker
    /// board or heavier decoding, to see the balance and the autotuner at work.
    #[arg(long, value_parser = fulcrum::balance::parse_duration, value_name = "TIME")]
    loader_delay: Option<std::time::Duration>,
    /// Turn augmentation off. By default each record is flipped, scaled and shifted, and its
    /// brightness, contrast, saturation and white balance jittered, on the loaders; the last
    /// tenth of the epochs (runs of 10 or more) trains on flips only.
    #[arg(long)]
    no_augment: bool,
    /// Chance (0 to 1) that a record is replaced by a mosaic: it and three other records of
    /// its batch tiled around a random centre and scaled by 0.5 to 1.5, so objects show up
    /// smaller, cut by borders and in new company. Helps small real datasets; off (0) by
    /// default, and off in the flips-only last tenth of a run. [default: 0]
    #[arg(long, value_parser = crate::args::probability, value_name = "P")]
    mosaic: Option<f32>,
    /// Weight of a GIoU term added to the box loss (its L1 terms on offsets and log sizes
    /// weigh 1 each), 0 to 10. Off (0) by default: on the raccoon split it scored lower.
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::loss_weight, value_name = "W")]
    giou: f32,
    /// Clip the gradients' global norm to N before each update (PyTorch's
    /// clip_grad_norm_): a batch whose gradient is far larger than usual then moves the
    /// weights no further than N allows, which keeps a high learning rate's run on track. 0:
    /// off. The epoch lines show the norms and how many steps were clipped. [default: 0;
    /// recipe photos: 10]
    #[arg(long, value_parser = crate::args::clip_norm, value_name = "N")]
    clip_norm: Option<f32>,
    /// Also train the box regression at the cells around each box's centre cell whose
    /// centres lie inside the box, weighted W (0 to below 1; the centre weighs 1). One cell
    /// per box gives a small dataset few box samples; its neighbours multiply them. 0: the
    /// centre alone. [default: 0; recipe photos: 0.75]
    #[arg(long, value_parser = crate::args::neighbour_weight, value_name = "W")]
    neighbours: Option<f32>,
    /// How far those neighbours reach from the centre cell, in cells: 1 is the 3×3 block
    /// around it, 2 the 5×5 (only cells whose centres lie inside the box count, so a wider
    /// reach changes only boxes wider than three cells of their level), up to 4. [default:
    /// 1, and the recipe's]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_NEIGHBOUR_RADIUS)), value_name = "R")]
    neighbour_radius: Option<u32>,
    /// The most of a box's neighbour cells that weigh W each: a box with more (a large box
    /// at a reach above 1) shares N·W among them, so that large boxes do not crowd small
    /// ones out of the box loss (and a smaller box's neighbour wins a cell two boxes share).
    /// 0: no limit, the default and the recipe's (8 scored lower on every set tried:
    /// docs/perf/recipes.md).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_NEIGHBOUR_CELLS)), value_name = "N")]
    neighbour_cells: Option<u32>,
    /// Checkpoint every this many epochs (and always at the end).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_every: u64,
    /// Continue the run whose checkpoint is in --out.
    #[arg(long)]
    resume: bool,
    /// Start from these weights instead of fresh ones (fine-tuning: the same model at the
    /// same size; the optimizer starts over). Where the data's class names differ, the
    /// classes are matched by name: a known class keeps what it learnt, a new one starts
    /// afresh, and the run says which. Ignored with --resume.
    #[arg(long, value_name = "CHECKPOINT")]
    init_from: Option<PathBuf>,
    /// With --recipe photos: start det-m from random weights, not from the built-in base (a
    /// det-m trained on procedural images, carried in the program: docs/perf/recipes.md says
    /// what it buys on which data).
    #[arg(long, requires = "recipe", conflicts_with = "init_from")]
    from_scratch: bool,
    /// Layers left as --init-from gave them (fine-tuning): none, early (the stem and the
    /// blocks up to stride 8, whose edges and textures carry over to new objects; the deeper
    /// blocks, the neck and heads train: the choice for new classes), backbone (the stem and
    /// all the blocks; the neck and heads train: for a new place or light) or backbone+neck
    /// (the heads alone train). Frozen layers get no gradients, optimizer state or weight
    /// average, and the backward pass stops before them: each step is cheaper and the memory
    /// plan smaller. docs/training.md#fine-tuning says what each costs and buys.
    #[arg(long, default_value = "none", value_name = "LAYERS")]
    freeze: fulcrum::model::Freeze,
    /// With --freeze: the frozen layers' biases train all the same (TinyTL's cheapest form).
    /// The backward pass then runs through the frozen layers for their input gradients (no
    /// weight gradients there), so a step costs more than with --freeze alone and keeps their
    /// activations, but the model can follow a change of light or colour that the frozen
    /// weights alone cannot; only the biases get optimizer state.
    #[arg(long)]
    train_biases: bool,
    /// Mix records of this packed data (the base model's own, packed at the same --size) into
    /// every batch, so that fine-tuning does not forget what the base model knew. Classes are
    /// matched by name: the run trains the data's classes and those only the replay data has.
    #[arg(long, value_name = "DATA")]
    replay: Option<PathBuf>,
    /// The share of each batch that --replay fills (rounded to whole records, at least one of
    /// each kind).
    #[arg(long, value_parser = crate::args::replay_fraction, value_name = "F", requires = "replay")]
    replay_fraction: Option<f32>,
    /// Stop after this many steps in all (the checkpoint is written; --resume continues).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_steps: Option<u64>,
    /// Stop once this much time (e.g. 30s, 2m) has gone into training steps in this run, after
    /// the step under way (the checkpoint is written; --resume continues). The learning rate
    /// still follows the schedule of --epochs: set them so that the run fits.
    #[arg(long, value_parser = fulcrum::balance::parse_duration, value_name = "TIME")]
    max_time: Option<std::time::Duration>,
    /// Hard memory limit for the pipeline and the model together (e.g. 64M): a configuration
    /// over it is refused before anything is allocated, naming a batch that fits.
    #[arg(long, value_parser = fulcrum::base::parse_size)]
    mem_budget: Option<u64>,
    /// Read backend.
    #[arg(long, default_value = "auto")]
    io: IoKind,
    /// O_DIRECT reads.
    #[arg(long, default_value = "auto")]
    direct: DirectMode,
    /// Corrupt records: fail stops naming the record; skip replaces and counts it.
    #[arg(long, default_value = "fail")]
    on_corrupt: OnCorrupt,
    /// Where the ring's slots live. auto: on a Vulkan device that imports host memory
    /// (VK_EXT_external_memory_host), the device imports them and copies each batch itself,
    /// the CPU copying nothing (on a unified-memory board the GPU reads the pages the disk
    /// wrote); elsewhere plain host memory. host: plain host memory, the CPU copying each batch
    /// into the engine's input. Both give the same results.
    #[arg(long, default_value = "auto", value_name = "auto|host")]
    ring_memory: RingMemory,
    /// Record loader units, batch waits and device steps, and write them as Chrome trace JSON
    /// (opens in Perfetto) and, beside it with the extension .svg, as the simulator's timeline.
    #[arg(long, value_name = "JSON")]
    trace: Option<PathBuf>,
    /// Capacity of the trace log in events (32 bytes each, allocated up front; later events
    /// are counted and dropped).
    #[arg(long, default_value_t = 65536, value_parser = crate::args::count_usize(crate::args::MAX_TRACE_EVENTS))]
    trace_events: usize,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Draws a progress bar over the steps and prints one line per epoch.
struct Printer {
    bar: Option<ProgressBar>,
}

impl Observer for Printer {
    fn start(&mut self, info: &RunInfo) {
        crate::outln!(
            "training {} ({} parameters) on {}: {} records, {} steps per epoch, steps {}..{}",
            info.model,
            info.param_count,
            info.engine,
            info.records,
            info.batches_per_epoch,
            info.first_step + 1,
            info.total_steps
        );
        crate::outln!(
            "memory: {} planned up front (pipeline and model); reads: {}; ring slots: {}",
            human(info.memory.total()),
            info.backend,
            info.ring_memory
        );
        crate::out!("{}", info.memory.table());
        if let Some(f) = &info.frozen {
            crate::outln!(
                "frozen ({}{}): {} of {} parameter tensors, with no gradients, optimizer state or \
                 average; the model's plan {} against {} training every layer",
                f.freeze,
                if f.train_biases {
                    ", their biases training"
                } else {
                    ""
                },
                f.tensors,
                f.of,
                human(f.plan_bytes),
                human(f.unfrozen_plan_bytes)
            );
        }
        if let Some(r) = &info.replay {
            crate::outln!(
                "replay: {} of every {} records from {} ({} records{})",
                r.per_batch,
                r.batch,
                r.dir.display(),
                r.records,
                match r.new_classes {
                    0 => String::new(),
                    n => format!(", {n} classes the data lacks trained besides its own"),
                }
            );
        }
        let bar = crate::progress::bar(info.total_steps, "steps");
        bar.set_position(info.first_step);
        self.bar = Some(bar);
    }

    fn step(&mut self, r: &StepReport) {
        if let Some(bar) = &self.bar {
            bar.set_position(r.step);
            if r.step.is_multiple_of(10) || r.step == 1 {
                bar.set_message(format!("loss {:.3}", r.loss[0]));
            }
        }
    }

    fn epoch(&mut self, e: &EpochReport) {
        let clipping = match e.grad_norm {
            Some(g) => format!(
                ", grad norm {:.3} (max {:.3}, clipped {} of {} steps)",
                g.mean, g.max, g.clipped, e.steps
            ),
            None => String::new(),
        };
        let line = format!(
            "epoch {:>3}: loss {:.4}{clipping}, {:.0} samples/s, {:.1} s; {}",
            e.epoch + 1,
            e.mean_loss,
            e.samples_per_s,
            e.wall.as_secs_f64(),
            e.balance_line()
        );
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => crate::outln!("{line}"),
        }
    }

    fn tuned(&mut self, d: &Decision) {
        let line = format!("autotune (step {}): {} — {}", d.step, d.what, d.why);
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => crate::outln!("{line}"),
        }
    }

    fn checkpoint(&mut self, path: &Path, p: &Progress) {
        log::debug!("checkpoint {} at step {}", path.display(), p.step);
    }
}

/// Says, before a recipe's run starts, when most of the pack's boxes are too small for the
/// model's finest level, and what size to pack at instead.
fn warn_of_small_boxes(manifest: &fulcrum::format::Manifest, model: &str) {
    use fulcrum::model::ModelConfig;
    let (Some(sides), Ok(config)) = (
        &manifest.summary.box_sides,
        ModelConfig::named_at(model, manifest.num_classes(), manifest.width),
    ) else {
        return;
    };
    let finest = config.strides()[0];
    if let Some(advice) = fulcrum::format::box_sides::size_advice(
        sides,
        manifest.width,
        finest,
        ModelConfig::MAX_INPUT,
    ) {
        log::warn!("{advice}");
    }
}

/// What a recipe decides for a run, and the pack's image size where it read the pack.
struct RecipeChoice {
    settings: RecipeSettings,
    input: Option<u32>,
}

/// The settings a recipe decides: given explicitly, else the recipe's, else the defaults.
fn recipe_settings(a: &Args) -> anyhow::Result<RecipeChoice> {
    let d = TrainConfig::default();
    let mut records = None;
    let mut input = None;
    let base = match a.recipe {
        Some(recipe) => {
            let dataset = fulcrum::loader::Dataset::open(&a.data, DirectMode::Auto)?;
            records = Some(dataset.records());
            input = Some(dataset.layout.width);
            let settings = recipe.settings(dataset.records(), a.batch);
            warn_of_small_boxes(
                &dataset.manifest,
                a.model.as_deref().unwrap_or(&settings.model),
            );
            settings
        }
        None => RecipeSettings {
            model: d.model,
            batch: d.batch,
            epochs: d.epochs,
            lr: d.lr,
            warmup: d.warmup,
            mosaic: d.mosaic,
            clip_norm: d.clip_norm,
            neighbours: d.neighbours,
            neighbour_radius: d.neighbour_radius,
            neighbour_cells: d.neighbour_cells,
        },
    };
    let settings = RecipeSettings {
        model: a.model.clone().unwrap_or(base.model),
        batch: a.batch.unwrap_or(base.batch),
        epochs: a.epochs.unwrap_or(base.epochs),
        lr: a.lr.unwrap_or(base.lr),
        warmup: a.warmup.unwrap_or(base.warmup),
        mosaic: a.mosaic.unwrap_or(base.mosaic),
        clip_norm: a.clip_norm.unwrap_or(base.clip_norm),
        neighbours: a.neighbours.unwrap_or(base.neighbours),
        neighbour_radius: a.neighbour_radius.unwrap_or(base.neighbour_radius),
        neighbour_cells: a.neighbour_cells.unwrap_or(base.neighbour_cells),
    };
    if let (Some(recipe), Some(records)) = (a.recipe, records) {
        crate::outln!("recipe {recipe}: {settings} (for {records} records)");
    }
    Ok(RecipeChoice { settings, input })
}

/// The weights a run starts from: --init-from's, else (a recipe's det-m) the built-in base,
/// else none (the initial weights for the seed). A resumed run reads its own checkpoint.
fn starting_weights(
    a: &Args,
    recipe: &RecipeChoice,
) -> anyhow::Result<Option<std::sync::Arc<fulcrum::model::Checkpoint>>> {
    use fulcrum::model::builtin_base;
    if a.resume {
        return Ok(None);
    }
    if let Some(path) = &a.init_from {
        return Ok(Some(std::sync::Arc::new(fulcrum::model::Checkpoint::load(
            path,
        )?)));
    }
    let (Some(input), false) = (recipe.input, a.from_scratch) else {
        return Ok(None);
    };
    let model = a.model.as_deref().unwrap_or(&recipe.settings.model);
    let Some(base) = builtin_base::for_model(model, input) else {
        return Ok(None);
    };
    crate::outln!(
        "starting from the built-in base: {model} trained on procedural images, no photos \
         (--from-scratch: random weights)"
    );
    Ok(Some(std::sync::Arc::new(base?)))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::signals::install();
    let recipe = recipe_settings(&a)?;
    let init_from = starting_weights(&a, &recipe)?;
    let r = recipe.settings;
    if a.train_biases && a.freeze == fulcrum::model::Freeze::None {
        anyhow::bail!(
            "--train-biases trains the biases of frozen layers, and --freeze is none: give \
             --freeze early, backbone or backbone+neck as well"
        );
    }
    if a.freeze != fulcrum::model::Freeze::None && init_from.is_none() && !a.resume {
        log::warn!(
            "--freeze {} without --init-from: the frozen layers keep their random initial \
             weights, and the rest learns on top of features that never improve",
            a.freeze
        );
    }
    // Fine-tuning keeps the model it starts from unless told otherwise.
    let model = match (&a.model, &init_from) {
        (None, Some(w)) => w.model.name.clone(),
        _ => r.model,
    };
    let config = TrainConfig {
        data: a.data.clone(),
        model,
        batch: r.batch,
        epochs: r.epochs,
        lr: r.lr,
        warmup: r.warmup,
        weight_decay: a.weight_decay,
        seed: a.seed,
        loaders: a.loaders,
        ring: a.ring,
        io_depth: a.io_depth,
        autotune: a.autotune,
        augment: !a.no_augment,
        mosaic: r.mosaic,
        giou: a.giou,
        clip_norm: r.clip_norm,
        neighbours: r.neighbours,
        neighbour_radius: r.neighbour_radius,
        neighbour_cells: r.neighbour_cells,
        freeze: a.freeze,
        train_biases: a.train_biases,
        replay: a.replay.clone(),
        replay_fraction: a
            .replay_fraction
            .unwrap_or(fulcrum::train::DEFAULT_REPLAY_FRACTION),
        checkpoint_every: a.checkpoint_every,
        out: a.out.clone(),
        ..TrainConfig::default()
    };
    let options = RunOptions {
        exec: a.engine.options(a.mem_budget),
        io: a.io,
        direct: a.direct,
        on_corrupt: a.on_corrupt,
        mem_budget: a.mem_budget,
        resume: a.resume,
        max_steps: a.max_steps,
        max_time: a.max_time,
        trace: a
            .trace
            .as_ref()
            .map(|_| std::sync::Arc::new(fulcrum::trace::TraceLog::new(a.trace_events))),
        loader_slow_down: a.loader_delay.unwrap_or_default(),
        ring_memory: a.ring_memory,
        init_from: init_from.clone(),
    };
    let mut printer = Printer { bar: None };
    let started = std::time::Instant::now();
    let report = train::train(&config, &options, &crate::signals::STOP, &mut printer)?;
    if let Some(bar) = printer.bar.take() {
        bar.finish_and_clear();
    }
    if let (Some(path), Some(log)) = (&a.trace, &options.trace) {
        fulcrum::durable::write_atomic(path, log.to_chrome_json().as_bytes())
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let t = report.tuning;
        let title = format!(
            "fulcrum train: {} loader(s), batch {}, ring {} on {}",
            t.loaders, t.batch, t.ring, report.engine
        );
        let svg = fulcrum::balance::timeline::svg(&[log.to_timeline(&title, t.ring as u32)]);
        let svg_path = path.with_extension("svg");
        fulcrum::durable::write_atomic(&svg_path, svg.as_bytes())
            .map_err(|e| anyhow::anyhow!("{}: {e}", svg_path.display()))?;
        crate::outln!(
            "trace: {} (Perfetto) and {} ({} events{})",
            path.display(),
            svg_path.display(),
            log.events().len(),
            match log.dropped() {
                0 => String::new(),
                d => format!(", {d} dropped: raise --trace-events"),
            }
        );
    }
    if a.autotune {
        crate::outln!(
            "autotune: {}; device idle waiting for input {:.1} % over the run{}",
            report.tuning,
            100.0 * report.input_wait,
            report.input_wait_settled.map_or(String::new(), |w| format!(
                ", {:.1} % after it settled",
                100.0 * w
            ))
        );
        if let Some(why) = &report.unbalanced {
            crate::outln!("autotune: {why}");
        }
    }
    crate::outln!(
        "{} at step {} (epoch {}) after {:.0} s, loss {}; checkpoint {}",
        if report.interrupted {
            "stopped"
        } else {
            "done"
        },
        report.progress.step,
        report.progress.epoch,
        started.elapsed().as_secs_f64(),
        report
            .final_loss
            .map_or("-".to_owned(), |l| format!("{l:.4}")),
        report.checkpoint.display()
    );
    if let Some(peak) = report.peak_resident {
        let code = fulcrum::base::resident_files().map_or(String::new(), |files| {
            format!("{} of it the program's code and libraries; ", human(files))
        });
        crate::outln!(
            "memory: peak resident {} ({code}planned {})",
            human(peak),
            human(report.memory.total())
        );
    }
    if report.interrupted {
        crate::outln!(
            "continue with: fulcrum train --data {} --out {} --resume",
            a.data.display(),
            a.out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
