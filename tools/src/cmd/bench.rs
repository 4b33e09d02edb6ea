use std::path::PathBuf;
use std::process::ExitCode;

use fulcrum::bench::{self as benches, IoBenchConfig, IoBenchReport};

/// Benchmarks, reported as ratios to a baseline measured in the same run.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand)]
enum Which {
    Io(IoArgs),
    Compute(ComputeArgs),
    Balance(BalanceArgs),
    Serve(ServeArgs),
    Frames(super::bench_frames::FramesArgs),
}

/// fulcrumd under load on this machine: a daemon on det-s and --clients clients, frames
/// inline and through memfd rings, paced at --rate (latency) and flat out (throughput);
/// latency from handing a frame over to receiving its detections, beside the engine's own
/// forward time for the same frame measured in process.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Checkpoint to serve [default: an untrained --model; latency does not depend on
    /// training].
    #[arg(long)]
    weights: Option<PathBuf>,
    /// The model served when no --weights are given: det-s, det-m or det-l.
    #[arg(long, default_value = "det-s", value_parser = ["det-s", "det-m", "det-l"])]
    model: String,
    /// Also run the paced memfd frames while the daemon reloads its weights every S seconds
    /// (as SIGHUP does): what a swap costs the requests around it.
    #[arg(long, value_name = "S", value_parser = crate::args::seconds)]
    reload_every: Option<f64>,
    /// The floors on fine-tuning's share of engine time (fulcrumd --fine-tune-share) to run
    /// the fine-tuning runs at, comma-separated; 0 is inference first alone.
    #[arg(long, value_name = "P,...", value_delimiter = ',', default_value = "0,0.1,0.25", value_parser = crate::args::fine_tune_share)]
    fine_tune_shares: Vec<f32>,
    /// Fine-tune on this folder (packed train/ and val/ with the served model's classes, as
    /// `fulcrum client --fine-tune` takes) instead of a synthetic set; each floor then starts a
    /// fresh fine-tune from the served weights and its held-out mAP is followed (give
    /// --weights).
    #[arg(long, value_name = "DATA", requires = "weights")]
    fine_tune_data: Option<PathBuf>,
    /// Layers the fine-tune leaves frozen: none, early, backbone or backbone+neck (auto: the
    /// daemon's choice).
    #[arg(long, default_value = "none", value_parser = super::client::freeze, value_name = "LAYERS")]
    fine_tune_freeze: fulcrum_board::protocol::FineTuneFreeze,
    /// Also train the frozen layers' biases (`fulcrum train --train-biases`); needs
    /// --fine-tune-freeze early, backbone or backbone+neck.
    #[arg(long)]
    fine_tune_train_biases: bool,
    /// Seconds of each run while fine-tuning [default: --seconds].
    #[arg(long, value_name = "S", value_parser = crate::args::seconds)]
    fine_tune_seconds: Option<f64>,
    /// While fine-tuning, only the paced runs (no flat-out runs).
    #[arg(long)]
    paced_only: bool,
    /// The daemon's --fine-tune-slice in milliseconds [default: the daemon's, 50].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    fine_tune_slice: Option<u64>,
    /// Clients connected at once, 1 to 1000.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1000))]
    clients: u16,
    /// Seconds per run (six runs: two transports, paced and flat out, and two while fine-tuning).
    #[arg(long, default_value_t = 3.0, value_parser = crate::args::seconds)]
    seconds: f64,
    /// Frames per second over all clients in the paced runs (0: unpaced).
    #[arg(long, default_value_t = 200.0, value_parser = crate::args::non_negative)]
    rate: f64,
    /// Frame width sent, pixels (the model's input is 128 × 128).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..))]
    width: u16,
    /// Frame height sent, pixels.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..))]
    height: u16,
    /// Pixel format sent: rgb8, bgr8, rgba8, bgra8, gray8, yuyv or nv12.
    #[arg(long, default_value = "rgb8", value_parser = super::client::parse_format)]
    format: fulcrum_board::protocol::PixelFormat,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    engine: super::engine::EngineArgs,
}

/// The balance equation in a real training run: the same training on synthetic data, once
/// with a deliberately starved input pipeline (one loader, a ring of 2, every loader slowed
/// so that one needs --slowdown × the step time per batch) and once with --autotune on the
/// same slowed loaders; device idle waiting for input for both, and the tuner's decisions.
#[derive(clap::Args)]
pub struct BalanceArgs {
    /// Packed dataset [default: a synthetic one packed once under ~/.cache/fulcrum].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Records of the default synthetic dataset.
    #[arg(long, default_value_t = 4096, value_parser = crate::args::count_u64(10_000_000))]
    records: u64,
    #[arg(long, default_value_t = 32, value_parser = crate::args::count(crate::args::MAX_BATCH))]
    batch: u32,
    /// Training steps per run.
    #[arg(long, default_value_t = 150, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    steps: u64,
    /// One loader's time per batch as a multiple of the step time.
    #[arg(long, default_value_t = 3.0, value_parser = crate::args::factor)]
    slowdown: f64,
    /// Memory budget for both runs (the autotuner stays inside it).
    #[arg(long, value_parser = fulcrum::base::parse_size)]
    mem_budget: Option<u64>,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    engine: super::engine::EngineArgs,
}

/// A model (det-s by default) on every engine present, the CPU engine first as the baseline:
/// forward latency at batch 1, training step (forward, loss, backward, AdamW) at --batch, time
/// per kernel family, GFLOP/s, and on Vulkan the split between device time and submission
/// overhead.
#[derive(clap::Args)]
pub struct ComputeArgs {
    /// Model to measure, at its usual input size: det-s (128 px), det-m (256 px, three
    /// output levels; the photos recipe's) or det-l (320 px).
    #[arg(long, default_value = "det-s", value_parser = model_name)]
    model: String,
    /// Training batch.
    #[arg(long, default_value_t = 32, value_parser = crate::args::count(crate::args::MAX_BATCH))]
    batch: u32,
    /// Runs per figure (medians are reported), 1 to 10000.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=10_000))]
    runs: u16,
    /// CPU engine threads, 1 to 16 [default: every core].
    #[arg(long, value_parser = crate::args::threads)]
    threads: Option<usize>,
    /// Skip the Vulkan engine.
    #[arg(long)]
    cpu_only: bool,
    /// Also measure the Vulkan engine with its fp16 kernel variants (where the device has
    /// shaderFloat16).
    #[arg(long)]
    fp16: bool,
    /// Vulkan device index (`fulcrum devices`) [default: the best].
    #[arg(long)]
    device: Option<usize>,
    /// Alternate the runs between variant A and variant B of code under trial
    /// (`fulcrum::compute::ab::is_b`, a developer's switch) and report both: on a noisy host,
    /// runs alternating in one process compare code, where separate processes also compare
    /// moments of the host. With nothing switching, the difference is the noise floor.
    #[arg(long)]
    ab: bool,
    /// Measure a fine-tune's training step: the layers it leaves as they are (`fulcrum train
    /// --freeze`): none, early, backbone or backbone+neck. The step is then also given as a
    /// ratio to the step that trains every layer, the two alternating run by run.
    #[arg(long, default_value = "none", value_name = "LAYERS")]
    freeze: fulcrum::model::Freeze,
    /// Kernels listed per entry.
    #[arg(long, default_value_t = 8, value_parser = crate::args::count_usize(1000))]
    top: usize,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Disk → ring → loaders: raw O_DIRECT read limit, io_uring and pread backends, loaders with
/// augmentation; MB/s, records/s and ratios to the raw limit.
#[derive(clap::Args)]
pub struct IoArgs {
    /// Packed dataset to read [default: a synthetic one packed once under ~/.cache/fulcrum].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Records of the default synthetic dataset.
    #[arg(long, default_value_t = 4096, value_parser = crate::args::count_u64(10_000_000))]
    records: u64,
    #[arg(long, default_value_t = 32, value_parser = crate::args::count_usize(crate::args::MAX_BATCH))]
    batch: usize,
    /// Loader threads for the augmentation run [default: one per core].
    #[arg(long, value_parser = crate::args::count_usize(crate::args::MAX_LOADERS))]
    loaders: Option<usize>,
    #[arg(long, default_value_t = 4, value_parser = crate::args::count_usize(crate::args::MAX_RING))]
    ring: usize,
    /// Reads in flight (and records per read unit) for raw and backend runs.
    #[arg(long, default_value_t = 32, value_parser = crate::args::count(crate::args::MAX_IO_DEPTH))]
    queue_depth: u32,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0, value_parser = crate::args::seconds)]
    seconds: f64,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.which {
        Which::Io(io) => run_io(io),
        Which::Compute(c) => run_compute(c),
        Which::Balance(b) => run_balance(b),
        Which::Serve(s) => run_serve(s),
        Which::Frames(f) => super::bench_frames::run(f),
    }
}

pub fn run_serve(a: ServeArgs) -> anyhow::Result<ExitCode> {
    use fulcrum::bench::serve::{bench_serve, ServeBenchConfig};
    crate::output_file::check_some("--json", a.json.as_deref())?;
    if a.fine_tune_train_biases && !a.fine_tune_freeze.freezes_layers() {
        anyhow::bail!(
            "--fine-tune-train-biases trains the biases of frozen layers: give \
             --fine-tune-freeze early, backbone or backbone+neck with it (it is {})",
            a.fine_tune_freeze.name()
        );
    }
    let config = ServeBenchConfig {
        weights: a.weights.clone(),
        model: a.model.clone(),
        exec: a.engine.options(None),
        clients: usize::from(a.clients),
        seconds: a.seconds,
        rate: a.rate,
        width: a.width,
        height: a.height,
        format: a.format,
        fine_tune: true,
        fine_tune_shares: a.fine_tune_shares.clone(),
        fine_tune_data: a.fine_tune_data.clone(),
        fine_tune_freeze: a.fine_tune_freeze,
        fine_tune_train_biases: a.fine_tune_train_biases,
        fine_tune_seconds: a.fine_tune_seconds,
        paced_only: a.paced_only,
        fine_tune_slice: a.fine_tune_slice.map(std::time::Duration::from_millis),
        reload_every: a.reload_every,
    };
    let r = bench_serve(&config, |what| eprintln!("measuring: {what}"))?;
    crate::outln!(
        "fulcrum bench serve: {} on {}, {} clients, {} frames, {} s per run",
        if a.weights.is_some() {
            "given weights".to_string()
        } else {
            format!("{} (untrained weights)", a.model)
        },
        r.engine,
        r.clients,
        r.frame,
        r.seconds_per_run
    );
    crate::outln!(
        "  engine forward, in process: median {:.3} ms, p99 {:.3} ms (frame pass on the {} {:.3} ms)",
        r.forward_p50_ms,
        r.forward_p99_ms,
        if r.frame_pass_on == "gpu" { "GPU" } else { "host" },
        r.prepare_p50_ms
    );
    crate::outln!("  transport  load                  daemon           frames  frames/s   p50 ms   p99 ms  p99.9 ms");
    for run in &r.runs {
        let load = if run.load == "paced" {
            format!("paced ({} /s)", r.paced_rate)
        } else {
            run.load.to_string()
        };
        let daemon = if run.fine_tuning {
            format!(
                "tuning {} ({}, {:.1}/s)",
                run.fine_tune_share,
                run.fine_tune_steps,
                run.fine_tune_steps_per_s()
            )
        } else if run.reloads > 0 {
            format!("reloading ({})", run.reloads)
        } else {
            "idle".to_string()
        };
        crate::outln!(
            "  {:<9}  {:<20}  {:<15} {:>7} {:>9.0} {:>8.3} {:>8.3} {:>9.3}",
            run.transport,
            load,
            daemon,
            run.frames,
            run.frames_per_s,
            run.p50_ms,
            run.p99_ms,
            run.p999_ms
        );
    }
    crate::outln!("  (tuning P (N, R/s): the daemon fine-tuned meanwhile with a floor of P on its share of the");
    crate::outln!("   engine and took N training steps, R a second;");
    crate::outln!("   reloading (N): it reloaded and swapped in its weights N times meanwhile)");
    for why in &r.skipped {
        crate::outln!("  skipped: {why}");
    }
    let find = |t: &str, l: &str| {
        r.runs
            .iter()
            .find(|x| x.transport == t && x.load == l && !x.fine_tuning && x.reloads == 0)
    };
    let reloading = r.runs.iter().find(|x| x.reloads > 0);
    if let (Some(idle), Some(reloading)) = (find("memfd", "paced"), reloading) {
        crate::outln!(
            "  goal: while reloading, memfd p99 ≤ idle p99 + 5 ms: {} ({:.3} ms; idle {:.3} ms; {} swaps)",
            if reloading.p99_ms <= idle.p99_ms + 5.0 {
                "met"
            } else {
                "NOT met"
            },
            reloading.p99_ms,
            idle.p99_ms,
            reloading.reloads
        );
    }
    if let Some(paced) = find("memfd", "paced") {
        let limit = r.forward_p50_ms + r.prepare_p50_ms + 1.0;
        crate::outln!(
            "  goal: memfd p99 ≤ engine forward + frame pass + 1 ms ({limit:.3} ms) at {} frames/s: {} ({:.3} ms)",
            r.paced_rate,
            if paced.p99_ms <= limit { "met" } else { "NOT met" },
            paced.p99_ms
        );
    }
    if let Some(flat) = find("memfd", "flat out") {
        crate::outln!(
            "  goal: ≥ 1500 frames/s over {} clients (memfd): {} ({:.0} frames/s)",
            r.clients,
            if flat.frames_per_s >= 1500.0 {
                "met"
            } else {
                "NOT met"
            },
            flat.frames_per_s
        );
    }
    if let Some(rate) = r.fine_tune_idle_steps_per_s {
        crate::outln!("  fine-tuning with no frames coming: {rate:.1} steps/s");
    }
    for run in r.runs.iter().filter(|x| !x.fine_tune_curve.is_empty()) {
        let at = |t: f64| {
            run.fine_tune_curve
                .iter()
                .rev()
                .find(|p| p.seconds <= t)
                .and_then(|p| p.held_out_map)
                .map_or("-".to_owned(), |m| format!("{m:.3}"))
        };
        crate::outln!(
            "  fine-tune from the served weights, share {} {}: held-out mAP@0.5 at 15 / 30 / 60 / 120 s: {} / {} / {} / {} ({} steps)",
            run.fine_tune_share,
            run.load,
            at(15.0),
            at(30.0),
            at(60.0),
            at(120.0),
            run.fine_tune_steps
        );
    }
    let tuning = r
        .runs
        .iter()
        .find(|x| x.transport == "memfd" && x.load == "paced" && x.fine_tuning);
    let floor = r.runs.iter().find(|x| {
        x.transport == "memfd" && x.load == "paced" && x.fine_tuning && x.fine_tune_share == 0.25
    });
    if let (Some(idle), Some(floor), Some(unloaded)) =
        (find("memfd", "paced"), floor, r.fine_tune_idle_steps_per_s)
    {
        let rate = floor.fine_tune_steps_per_s();
        crate::outln!(
            "  goal: with a share of 0.25, memfd p99 ≤ 2 × idle p99 ({:.3} ms) and ≥ 20 % of the unloaded steps/s ({:.1}): {} ({:.3} ms, {:.1} steps/s)",
            2.0 * idle.p99_ms,
            0.2 * unloaded,
            if floor.p99_ms <= 2.0 * idle.p99_ms && rate >= 0.2 * unloaded {
                "met"
            } else {
                "NOT met"
            },
            floor.p99_ms,
            rate
        );
    }
    if let (Some(idle), Some(tuning)) = (find("memfd", "paced"), tuning) {
        crate::outln!(
            "  goal: while fine-tuning, memfd p99 ≤ 2 × idle p99 ({:.3} ms): {} ({:.3} ms, {} training steps meanwhile)",
            2.0 * idle.p99_ms,
            if tuning.p99_ms <= 2.0 * idle.p99_ms {
                "met"
            } else {
                "NOT met"
            },
            tuning.p99_ms,
            tuning.fine_tune_steps
        );
    }
    if let Some(path) = &a.json {
        crate::output_file::write_json(path, &r)?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_balance(a: BalanceArgs) -> anyhow::Result<ExitCode> {
    use fulcrum::bench::balance::{self as bench_balance, BalanceBenchConfig, RunFigures};
    use fulcrum::train::RunOptions;

    crate::output_file::check_some("--json", a.json.as_deref())?;
    // --batch, --slowdown and --steps are in range by their parsers.
    let data = match a.data {
        Some(d) => d,
        None => benches::ensure_bench_data(a.records, &|note| eprintln!("{note}"))?,
    };
    crate::signals::install();
    let config = BalanceBenchConfig {
        data,
        batch: a.batch,
        steps: a.steps,
        slowdown: a.slowdown,
        scratch: std::env::temp_dir().join(format!("fulcrum-bench-balance-{}", std::process::id())),
        options: RunOptions {
            exec: a.engine.options(a.mem_budget),
            mem_budget: a.mem_budget,
            ..RunOptions::default()
        },
    };
    let r = bench_balance::run(&config, &|what| eprintln!("bench balance: {what}"))?;
    crate::outln!(
        "bench balance: det-s, batch {} on {}; step {:.2} ms; loaders slowed by {:.3} ms per record \
         (one loader: {:.1}× a step per batch)",
        r.batch, r.engine, r.step_ms, r.delay_per_record_ms, a.slowdown
    );
    crate::outln!(
        "  {:<10} {:<50} {:>7} {:>10} {:>12} {:>14}",
        "run",
        "configuration",
        "steps",
        "samples/s",
        "device idle",
        "after settling"
    );
    let row = |f: &RunFigures| {
        crate::outln!(
            "  {:<10} {:<50} {:>7} {:>10.0} {:>11.1}% {:>14}",
            f.name,
            f.tuning.to_string(),
            f.steps,
            f.samples_per_s,
            100.0 * f.device_idle,
            f.device_idle_settled
                .map_or("-".to_owned(), |w| format!("{:.1}%", 100.0 * w)),
        );
    };
    row(&r.starved);
    row(&r.autotuned);
    crate::outln!(
        "  autotuned / starved throughput: {:.2}×{}",
        r.autotuned.samples_per_s / r.starved.samples_per_s.max(1e-9),
        r.autotuned.probe_seconds.map_or(String::new(), |p| format!(
            " (the autotuner's probe took {p:.2} s before its first step)"
        ))
    );
    for d in &r.autotuned.decisions {
        crate::outln!("  autotune (step {}): {} — {}", d.step, d.what, d.why);
    }
    if let Some(why) = &r.autotuned.unbalanced {
        crate::outln!("  autotune: {why}");
    }
    let goal = 0.02;
    crate::outln!(
        "  goal: device idle from input waits ≤ {:.0} % with autotune: {} ({:.1} %)",
        100.0 * goal,
        if r.autotuned.device_idle <= goal {
            "met"
        } else {
            "NOT met"
        },
        100.0 * r.autotuned.device_idle
    );
    if let Some(path) = &a.json {
        crate::output_file::write_json(path, &r)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A preset's name, refused here with the list when it is none.
fn model_name(s: &str) -> Result<String, String> {
    fulcrum::model::ModelConfig::named(s, 1)
        .map(|m| m.name)
        .map_err(|e| e.to_string())
}

pub fn run_compute(a: ComputeArgs) -> anyhow::Result<ExitCode> {
    use fulcrum::bench::compute::{self as bench, ComputeBenchConfig, EntryFigures};
    use fulcrum::compute::exec::{EngineChoice, ExecOptions};

    crate::output_file::check_some("--json", a.json.as_deref())?;
    if let Some(threads) = a.threads {
        crate::args::warn_threads("--threads", threads);
    }
    let base = ComputeBenchConfig {
        model: a.model.clone(),
        classes: 2,
        train_batch: a.batch,
        runs: usize::from(a.runs),
        exec: ExecOptions {
            engine: EngineChoice::Cpu,
            threads: a.threads.unwrap_or_else(fulcrum_board::host_cores),
            device: a.device,
            ..ExecOptions::default()
        },
        ab: a.ab,
        freeze: a.freeze,
    };
    let mut reports = vec![bench::run(&base, &|what| eprintln!("cpu: {what}"))?];
    if !a.cpu_only {
        let vulkan = ComputeBenchConfig {
            exec: ExecOptions {
                engine: EngineChoice::Vulkan,
                ..base.exec.clone()
            },
            ..base.clone()
        };
        match bench::run(&vulkan, &|what| eprintln!("vulkan: {what}")) {
            Ok(r) => reports.push(r),
            Err(e) => eprintln!("vulkan: not measured: {e}"),
        }
        if a.fp16 {
            let fp16 = ComputeBenchConfig {
                exec: ExecOptions {
                    fp16: true,
                    ..vulkan.exec.clone()
                },
                ..vulkan.clone()
            };
            match bench::run(&fp16, &|what| eprintln!("vulkan fp16: {what}")) {
                Ok(r) => reports.push(r),
                Err(e) => eprintln!("vulkan fp16: not measured: {e}"),
            }
        }
    }
    let cpu = &reports[0];
    let input = fulcrum::model::ModelConfig::named(&a.model, base.classes)?.input;
    crate::outln!(
        "{} at {input}×{input} ({} parameters), medians of {} runs",
        a.model,
        cpu.params,
        base.runs
    );
    crate::outln!(
        "{:<52} {:>12} {:>12} {:>9} {:>10} {:>8}",
        "engine",
        "fwd b=1 ms",
        format!("step b={} ms", a.batch),
        "GFLOP/s",
        "overhead",
        "vs cpu"
    );
    for r in &reports {
        crate::outln!(
            "{:<52} {:>12.3} {:>12.2} {:>9.1} {:>9.1}% {:>7.2}×",
            r.engine,
            r.forward_batch1.device_ms,
            r.train_step.device_ms,
            r.train_step.gflops,
            100.0 * r.train_step.overhead_ms / r.train_step.wall_ms.max(1e-9),
            cpu.train_step.device_ms / r.train_step.device_ms.max(1e-9),
        );
    }
    let show = |name: &str, f: &EntryFigures| {
        crate::outln!(
            "  {name}: device {:.3} ms, wall {:.3} ms (host overhead {:.3} ms), {} kernels, {:.3} GFLOP",
            f.device_ms, f.wall_ms, f.overhead_ms, f.kernels, f.gflop
        );
        if let Some(io) = f.with_io_ms {
            crate::outln!("    with the records written and the detections read back: {io:.3} ms");
        }
        if let Some(ab) = &f.ab {
            crate::outln!(
                "    A/B, alternating runs: A median {:.3} ms (fastest {:.3}, {} runs), B median \
                 {:.3} ms (fastest {:.3}, {} runs): B/A {:.3}×",
                ab.a.median_ms,
                ab.a.fastest_ms,
                ab.a.runs,
                ab.b.median_ms,
                ab.b.fastest_ms,
                ab.b.runs,
                ab.b_over_a
            );
        }
        for k in f.per_kernel.iter().take(a.top) {
            crate::outln!(
                "    {:<22} {:>4}× {:>9.3} ms {:>5.1}%",
                k.kernel,
                k.calls,
                k.ms,
                100.0 * k.share
            );
        }
    };
    for r in &reports {
        crate::outln!("{}:", r.engine);
        show("forward, batch 1", &r.forward_batch1);
        if let Some(s) = r.cpu_batch1_split.as_ref().filter(|s| s.measured > 0) {
            crate::outln!(
                "    {} of {} convs split over the threads (measured faster, the stem always; the stem, the pointwise convs and the separable pairs by rows, each thread in its own copy of the activations; others by channels): {}",
                s.split.len(),
                s.measured,
                if s.split.is_empty() {
                    "none".to_owned()
                } else {
                    s.split.join(", ")
                }
            );
        }
        let step = match a.freeze {
            fulcrum::model::Freeze::None => format!("training step, batch {}", a.batch),
            f => format!("training step with --freeze {f}, batch {}", a.batch),
        };
        show(&step, &r.train_step);
        if let Some(f) = &r.freeze {
            crate::outln!(
                "    against every layer training, runs alternating: {:.2} ms / {:.2} ms = {:.3}× ({} runs each)",
                f.frozen_ms,
                f.full_ms,
                f.ratio,
                f.runs
            );
        }
        if let Some(u) = &r.step_input {
            let imported = match (
                u.imported_step_ms,
                u.imported_cpu_ms,
                u.imported_submissions,
            ) {
                (Some(ms), Some(cpu), Some(submissions)) => format!(
                    "from an imported ring slot (GPU copy in the step's submission) {ms:.3} ms, \
                     CPU {cpu:.3} ms, {submissions:.2} submissions per step"
                ),
                _ => "no imported ring slots (the device has no VK_EXT_external_memory_host)"
                    .to_owned(),
            };
            crate::outln!(
                "  step with its batch ({:.2} MB): from host memory (CPU copy, then the step) \
                 {:.3} ms, CPU {:.3} ms; {imported}",
                u.bytes as f64 / 1e6,
                u.host_step_ms,
                u.host_cpu_ms
            );
        }
    }
    if let Some(path) = &a.json {
        let json = serde_json::json!({ "model": a.model, "input": input, "runs": base.runs, "engines": reports });
        crate::output_file::write_json(path, &json)?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_io(a: IoArgs) -> anyhow::Result<ExitCode> {
    crate::output_file::check_some("--json", a.json.as_deref())?;
    let data = match a.data {
        Some(d) => d,
        None => benches::ensure_bench_data(a.records, &|note| eprintln!("{note}"))?,
    };
    let config = IoBenchConfig {
        data,
        batch: a.batch,
        loaders: a.loaders.unwrap_or_else(fulcrum_board::host_cores),
        ring_slots: a.ring,
        queue_depth: a.queue_depth,
        seconds: a.seconds,
    };
    let report = benches::bench_io(&config, &|step| eprintln!("measuring: {step}"))?;
    print_io(&report);
    if let Some(path) = &a.json {
        crate::output_file::write_json(path, &report)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_io(r: &IoBenchReport) {
    crate::outln!(
        "bench io: {} ({} records of {} bytes), queue depth {}, {}",
        r.data,
        r.records_in_dataset,
        r.record_bytes,
        r.queue_depth,
        if r.direct {
            "O_DIRECT"
        } else {
            "buffered (O_DIRECT refused)"
        }
    );
    crate::outln!(
        "  {:<34} {:>10} {:>12} {:>9}",
        "",
        "MB/s",
        "records/s",
        "× raw"
    );
    let row = |name: &str, t: &benches::Throughput| {
        crate::outln!(
            "  {:<34} {:>10.0} {:>12.0} {:>9.2}",
            name,
            t.mb_per_s,
            t.records_per_s,
            t.mb_per_s / r.raw.mb_per_s
        );
    };
    row(
        &format!("raw sequential read, {} (limit)", r.raw_method),
        &r.raw,
    );
    match (&r.uring, &r.uring_unavailable) {
        (Some(u), _) => row("io_uring backend → ring", u),
        (None, why) => crate::outln!(
            "  io_uring backend → ring            unavailable: {}",
            why.as_deref().unwrap_or("?")
        ),
    }
    row("pread backend → ring", &r.pread);
    if let Some(u) = &r.uring_shuffled {
        row("io_uring → ring, shuffled order", u);
    }
    row(
        &format!("loaders ×{} + augment (warm cache)", r.loaders),
        &r.loaders_augment,
    );
    crate::outln!(
        "  loader CPU per record (T_g): {:.1} µs",
        r.loader_cpu_us_per_record
    );
}
