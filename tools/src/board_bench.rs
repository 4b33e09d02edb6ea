//! `fulcrum-bench`: the report a person copies onto a new board. It identifies the board,
//! then measures, with warm-up and a cool-down between sections, the input pipeline (raw
//! reads vs io_uring vs pread vs loaders), compute (every engine present, the CPU engine at
//! every thread count, its kernel set named) and the balance equation with this board's own
//! `T_g` and `T_step`, all the while watching for throttling. It prints one screen to compare
//! between boards and, with `--json FILE`, the figures under a schema version.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fulcrum::balance::{self, BalanceInput, BalanceReport};
use fulcrum::bench::compute::{self as compute_bench, ComputeBenchConfig};
use fulcrum::bench::serve::{bench_serve, ServeBenchConfig, ServeBenchReport};
use fulcrum::bench::{self, IoBenchConfig, IoBenchReport};
use fulcrum::compute::cpu::kernels::{self, KernelSet};
use fulcrum::compute::exec::{EngineChoice, ExecOptions};
use fulcrum::model::ModelConfig;
use fulcrum_board::protocol::PixelFormat;
use serde::Serialize;

use crate::system::{SystemFacts, ThrottleReport, Watch};

/// The JSON's layout version: raised whenever a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 2;

/// Benchmark a board: what it is, its input pipeline, its compute engines and how they balance.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A short run for CI and a first look: small dataset, short measurements, one CPU thread
    /// count (all cores), one run per figure.
    #[arg(long)]
    quick: bool,
    /// Packed dataset for the input pipeline [default: a synthetic one packed once under
    /// ~/.cache/fulcrum].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Records of the default synthetic dataset [default: 4096; 128 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    records: Option<u64>,
    /// Seconds per input-pipeline measurement [default: 3; 0.3 with --quick].
    #[arg(long, value_parser = crate::args::seconds)]
    seconds: Option<f64>,
    /// Training batch for the compute and balance figures.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch: u32,
    /// Runs per compute figure (medians) [default: 10; 1 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=10_000))]
    runs: Option<u16>,
    /// Seconds of rest between sections, so one section's heat does not slow the next.
    #[arg(long, default_value_t = 2.0, value_parser = cool_down_seconds)]
    cool_down: f64,
    /// Also write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// 0 to 600 seconds.
fn cool_down_seconds(s: &str) -> Result<f64, String> {
    match crate::args::non_negative(s)? {
        v if v <= 600.0 => Ok(v),
        v => Err(format!("{v} s of cool-down is more than 600 s")),
    }
}

/// What the board is and what it offers fulcrum.
#[derive(Debug, Serialize)]
pub struct BoardSection {
    #[serde(flatten)]
    pub facts: SystemFacts,
    /// The CPU kernel set the CPU engine runs, and every set this CPU can run.
    pub cpu_kernels: KernelSet,
    pub cpu_kernel_sets: Vec<KernelSet>,
    pub io_uring: Availability,
    /// Vulkan devices by label; empty with the reason where there is no Vulkan.
    pub vulkan: Vec<String>,
    pub vulkan_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Availability {
    pub available: bool,
    pub error: Option<String>,
}

/// One engine at one thread count.
#[derive(Debug, Clone, Serialize)]
pub struct ComputeRow {
    pub engine: String,
    pub threads: Option<usize>,
    pub cpu_kernels: Option<KernelSet>,
    pub forward_batch1_ms: f64,
    pub train_batch: u32,
    pub train_step_ms: f64,
    pub train_gflops: f64,
    /// CPU: of the batch-1 forward convs, how many split over the threads
    /// (chosen per layer by measurement) and how many were measured.
    pub batch1_split: Option<[usize; 2]>,
}

/// The balance equation for one model on the fastest engine measured.
#[derive(Debug, Serialize)]
pub struct BalanceSection {
    pub model: String,
    /// The model's input side: its records are this many pixels square.
    pub input: u32,
    pub engine: String,
    pub batch: u32,
    /// Loader CPU time per record (`T_g`), from the input-pipeline section.
    pub tg_ms: f64,
    pub loader_cores: usize,
    #[serde(flatten)]
    pub report: BalanceReport,
}

/// The whole report (the JSON file).
#[derive(Debug, Serialize)]
pub struct Report {
    pub schema_version: u32,
    pub fulcrum_version: &'static str,
    pub quick: bool,
    pub seconds: f64,
    pub board: BoardSection,
    pub io: Option<IoBenchReport>,
    pub io_error: Option<String>,
    pub compute: Vec<ComputeRow>,
    pub compute_errors: Vec<String>,
    /// det-s at `--batch`, then the larger [`LARGER_MODEL`] at half of it, each with `T_g`
    /// from loaders reading its own records.
    pub balance: Vec<BalanceSection>,
    pub balance_errors: Vec<String>,
    /// `fulcrumd`'s latency from a client handing over a camera frame to its detections.
    pub serve: Option<ServeBenchReport>,
    pub serve_error: Option<String>,
    pub throttle: ThrottleReport,
}

/// Runs every section and prints the report.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::output_file::check_some("--json", a.json.as_deref())?;
    // A forced kernel set this CPU cannot run would fail every CPU figure: say so once, first.
    let cpu_kernels = kernels::chosen()?;
    let started = Instant::now();
    let quick = a.quick;
    let watch = Watch::start(PathBuf::from("/"), Duration::from_millis(500));
    let cool_down = || std::thread::sleep(Duration::from_secs_f64(a.cool_down));

    eprintln!("fulcrum-bench: identifying the board");
    let data = match &a.data {
        Some(d) => d.clone(),
        None => {
            let records = a.records.unwrap_or(if quick { 128 } else { 4096 });
            bench::ensure_bench_data(records, &|note| eprintln!("{note}"))?
        }
    };
    let board = board_section(&data, cpu_kernels);

    eprintln!("fulcrum-bench: input pipeline");
    let io_config = IoBenchConfig {
        data,
        batch: a.batch as usize,
        loaders: fulcrum_board::host_cores(),
        ring_slots: 4,
        queue_depth: 32,
        seconds: a.seconds.unwrap_or(if quick { 0.3 } else { 3.0 }),
    };
    let (io, io_error) = match bench::bench_io(&io_config, &|step| eprintln!("  io: {step}")) {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(crate::describe(&anyhow::Error::from(e)))),
    };
    cool_down();

    eprintln!("fulcrum-bench: compute");
    let runs = a.runs.map_or(if quick { 1 } else { 10 }, usize::from);
    let (compute, compute_errors) = compute_section(&board, a.batch, runs, quick, &cool_down);

    let fastest = compute
        .iter()
        .min_by(|x, y| x.train_step_ms.total_cmp(&y.train_step_ms));
    let mut balance: Vec<BalanceSection> = io
        .as_ref()
        .zip(fastest)
        .and_then(|(io, row)| balance_section("det-s", io, row, row.train_step_ms))
        .into_iter()
        .collect();
    let mut balance_errors = Vec::new();
    cool_down();
    eprintln!("fulcrum-bench: balance for {LARGER_MODEL}");
    match larger_balance(&a, quick, runs, fastest) {
        Ok(b) => balance.push(b),
        Err(e) => balance_errors.push(format!("{LARGER_MODEL}: {e}")),
    }
    cool_down();

    eprintln!("fulcrum-bench: serve");
    let serve_config = ServeBenchConfig {
        weights: None,
        model: "det-s".into(),
        exec: ExecOptions::default(),
        clients: 4,
        seconds: if quick { 0.3 } else { 3.0 },
        rate: 200.0,
        width: 320,
        height: 240,
        format: PixelFormat::Rgb8,
        // Fine-tuning beside serving needs its own set packed and minutes: not in a quick run.
        fine_tune: !quick,
        fine_tune_shares: vec![0.0, 0.25],
        fine_tune_data: None,
        fine_tune_freeze: fulcrum_board::protocol::FineTuneFreeze::None,
        fine_tune_train_biases: false,
        fine_tune_seconds: None,
        paced_only: false,
        fine_tune_slice: None,
        reload_every: None,
    };
    let (serve, serve_error) = match bench_serve(&serve_config, |what| eprintln!("  serve: {what}"))
    {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let throttle = watch.finish();
    let report = Report {
        schema_version: SCHEMA_VERSION,
        fulcrum_version: env!("CARGO_PKG_VERSION"),
        quick,
        seconds: started.elapsed().as_secs_f64(),
        board,
        io,
        io_error,
        compute,
        compute_errors,
        balance,
        balance_errors,
        serve,
        serve_error,
        throttle,
    };
    print(&report);
    if let Some(path) = &a.json {
        crate::output_file::write_json(path, &report)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn board_section(data: &Path, cpu_kernels: KernelSet) -> BoardSection {
    let facts = SystemFacts::read(Path::new("/"), Some(data));
    let io_uring = match fulcrum::io::probe_uring() {
        Ok(()) => Availability {
            available: true,
            error: None,
        },
        Err(e) => Availability {
            available: false,
            error: Some(e.to_string()),
        },
    };
    let (vulkan, vulkan_error) =
        match fulcrum::compute::vulkan::list_devices(&fulcrum::compute::vulkan::Options::default())
        {
            Ok(list) => (list.devices.iter().map(|d| d.label()).collect(), None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
    BoardSection {
        facts,
        cpu_kernels,
        cpu_kernel_sets: KernelSet::here(),
        io_uring,
        vulkan,
        vulkan_error,
    }
}

/// det-s on the CPU engine at every thread count (all cores only with `quick`), then on the
/// Vulkan engine where there is a device.
fn compute_section(
    board: &BoardSection,
    batch: u32,
    runs: usize,
    quick: bool,
    cool_down: &dyn Fn(),
) -> (Vec<ComputeRow>, Vec<String>) {
    let cores = fulcrum_board::host_cores();
    let mut threads: Vec<Option<usize>> = if quick {
        vec![Some(cores)]
    } else {
        (1..=cores).map(Some).collect()
    };
    if !board.vulkan.is_empty() {
        threads.push(None);
    }
    let (mut rows, mut errors) = (Vec::new(), Vec::new());
    for t in threads {
        let config = ComputeBenchConfig {
            model: "det-s".into(),
            classes: 2,
            train_batch: batch,
            runs,
            exec: engine_options(t),
            ab: false,
            freeze: Default::default(),
        };
        let what = engine_name(t);
        match compute_bench::run(&config, &|step| eprintln!("  {what}: {step}")) {
            Ok(r) => rows.push(ComputeRow::new(&r, t, batch)),
            Err(e) => errors.push(format!("{what}: {e}")),
        }
        cool_down();
    }
    (rows, errors)
}

/// The CPU engine on `threads`, or the Vulkan engine for `None`.
fn engine_options(threads: Option<usize>) -> ExecOptions {
    ExecOptions {
        engine: if threads.is_some() {
            EngineChoice::Cpu
        } else {
            EngineChoice::Vulkan
        },
        threads: threads.unwrap_or(0),
        ..ExecOptions::default()
    }
}

fn engine_name(threads: Option<usize>) -> String {
    threads.map_or("vulkan".to_owned(), |t| format!("cpu, {t} thread(s)"))
}

impl ComputeRow {
    fn new(r: &compute_bench::ComputeBenchReport, threads: Option<usize>, batch: u32) -> Self {
        ComputeRow {
            engine: r.engine.clone(),
            threads,
            cpu_kernels: r.cpu_kernels,
            forward_batch1_ms: r.forward_batch1.device_ms,
            train_batch: batch,
            train_step_ms: r.train_step.device_ms,
            train_gflops: r.train_step.gflops,
            batch1_split: r
                .cpu_batch1_split
                .as_ref()
                .map(|s| [s.split.len(), s.measured]),
        }
    }
}

/// The larger model the balance section also works out: the one a board would train when
/// det-s is not enough, with four times det-s's pixels per record and far more work per step.
pub const LARGER_MODEL: &str = "det-m";

/// The balance equation for [`LARGER_MODEL`] at half `--batch`, on the engine whose det-s step
/// was fastest (`best`): its own synthetic records packed at its input size (an eighth of
/// det-s's record count, at least 64), the loaders measured on them, and its training step.
fn larger_balance(
    a: &Args,
    quick: bool,
    runs: usize,
    best: Option<&ComputeRow>,
) -> Result<BalanceSection, String> {
    let best = best.ok_or("no engine measured det-s")?;
    let model = ModelConfig::named(LARGER_MODEL, 2).map_err(|e| e.to_string())?;
    let records = (a.records.unwrap_or(if quick { 128 } else { 4096 }) / 8).max(64);
    let data = bench::ensure_bench_data_sized(records, model.input, &|note| {
        eprintln!("  {LARGER_MODEL}: {note}")
    })
    .map_err(|e| e.to_string())?;
    let batch = (a.batch / 2).max(1);
    let io_config = IoBenchConfig {
        data,
        batch: batch as usize,
        loaders: fulcrum_board::host_cores(),
        ring_slots: 4,
        queue_depth: 32,
        seconds: a.seconds.unwrap_or(if quick { 0.3 } else { 3.0 }),
    };
    let io = bench::bench_io(&io_config, &|step| eprintln!("  {LARGER_MODEL} io: {step}"))
        .map_err(|e| e.to_string())?;
    let config = ComputeBenchConfig {
        model: LARGER_MODEL.into(),
        classes: 2,
        train_batch: batch,
        runs,
        exec: engine_options(best.threads),
        ab: false,
        freeze: Default::default(),
    };
    let what = format!("{LARGER_MODEL} on {}", engine_name(best.threads));
    let step = compute_bench::run_step(&config, &|step| eprintln!("  {what}: {step}"))
        .map_err(|e| e.to_string())?;
    let at_batch = ComputeRow {
        train_batch: batch,
        ..best.clone()
    };
    balance_section(LARGER_MODEL, &io, &at_batch, step.device_ms)
        .ok_or_else(|| format!("the equation could not be evaluated for {LARGER_MODEL}"))
}

/// The equation for `model` with the loaders' measured `T_g` and a training step of `step_ms`
/// at `best.train_batch` on `best`'s engine.
fn balance_section(
    model: &str,
    io: &IoBenchReport,
    best: &ComputeRow,
    step_ms: f64,
) -> Option<BalanceSection> {
    let tg = Duration::from_secs_f64(io.loader_cpu_us_per_record * 1e-6);
    // The CPU engine's threads and the loaders share the cores; a GPU leaves them all to the
    // loaders.
    let cores = fulcrum_board::host_cores();
    let input = BalanceInput {
        tg,
        cores: cores as f64,
        batch: best.train_batch,
        step: Duration::from_secs_f64(step_ms * 1e-3),
        decode: None,
        augment: None,
        disk: Some((io.record_bytes as f64, io.raw.mb_per_s * 1e6)),
    };
    let report = balance::evaluate(&input).ok()?;
    Some(BalanceSection {
        model: model.into(),
        input: ModelConfig::named(model, 2).ok()?.input,
        engine: best.engine.clone(),
        batch: best.train_batch,
        tg_ms: tg.as_secs_f64() * 1e3,
        loader_cores: cores,
        report,
    })
}

fn print(r: &Report) {
    let b = &r.board;
    let f = &b.facts;
    crate::outln!(
        "fulcrum-bench {} — {}{}",
        r.fulcrum_version,
        f.model.as_deref().unwrap_or(&f.board),
        if r.quick { " (quick)" } else { "" }
    );
    crate::outln!(
        "  board      {} ({}), kernel {}",
        f.board,
        f.arch,
        f.kernel.as_deref().unwrap_or("?")
    );
    for c in &f.clusters {
        let mhz = match (c.min_mhz, c.max_mhz) {
            (Some(lo), Some(hi)) => format!("{lo}–{hi} MHz"),
            _ => "frequency unknown".to_owned(),
        };
        crate::outln!(
            "  cpu        {}× {} ({mhz}{})",
            c.cpus.len(),
            c.core,
            c.governor
                .as_deref()
                .map_or(String::new(), |g| format!(", {g}"))
        );
    }
    crate::outln!(
        "  kernels    {} (this CPU runs: {})",
        b.cpu_kernels,
        kernels::names(&b.cpu_kernel_sets)
    );
    if let Some(m) = f.memory {
        crate::outln!(
            "  memory     {} MiB{}",
            m.total_mib,
            m.available_mib
                .map_or(String::new(), |a| format!(", {a} MiB available"))
        );
    }
    if let Some(s) = &f.storage {
        crate::outln!(
            "  storage    {} on {} ({}{})",
            s.mount_point,
            s.device,
            s.filesystem,
            s.kind
                .as_deref()
                .map_or(String::new(), |k| format!(", {k}"))
        );
    }
    match &b.io_uring.error {
        None => crate::outln!("  io_uring   available"),
        Some(e) => crate::outln!("  io_uring   unavailable: {e}"),
    }
    match (&b.vulkan_error, b.vulkan.is_empty()) {
        (Some(e), _) => crate::outln!("  vulkan     unavailable: {e}"),
        (None, true) => crate::outln!("  vulkan     no devices"),
        (None, false) => crate::outln!("  vulkan     {}", b.vulkan.join("; ")),
    }
    match (&r.io, &r.io_error) {
        (Some(io), _) => {
            let uring = io
                .uring
                .map_or("-".to_owned(), |t| format!("{:.0}", t.mb_per_s));
            crate::outln!(
                "  io         raw ({}) {:.0} MB/s, io_uring {uring} MB/s, pread {:.0} MB/s, \
                 loaders {:.0} records/s (T_g {:.1} µs/record)",
                io.raw_method,
                io.raw.mb_per_s,
                io.pread.mb_per_s,
                io.loaders_augment.records_per_s,
                io.loader_cpu_us_per_record
            );
        }
        (None, Some(e)) => crate::outln!("  io         not measured: {e}"),
        (None, None) => {}
    }
    let width = r.compute.iter().map(|c| c.engine.len()).max().unwrap_or(0);
    for c in &r.compute {
        let split = match c.batch1_split {
            Some([s, m]) if m > 0 => format!(", {s}/{m} b=1 convs split"),
            _ => String::new(),
        };
        crate::outln!(
            "  compute    {:<width$}  forward b=1 {:>8.3} ms, step b={} {:>8.2} ms ({:.1} GFLOP/s{split})",
            c.engine, c.forward_batch1_ms, c.train_batch, c.train_step_ms, c.train_gflops
        );
    }
    for e in &r.compute_errors {
        crate::outln!("  compute    not measured: {e}");
    }
    for bal in &r.balance {
        let rep = &bal.report;
        crate::outln!(
            "  balance    {}@{} b={} on {}: load {:.2} ms vs step {:.2} ms per batch → {} binds, \
             {:.1} loader core(s) needed of {}",
            bal.model,
            bal.input,
            bal.batch,
            bal.engine,
            rep.load_per_batch_ms,
            rep.step_ms,
            rep.binding.describe(),
            rep.cores_needed,
            bal.loader_cores
        );
    }
    for e in &r.balance_errors {
        crate::outln!("  balance    not worked out: {e}");
    }
    match (&r.serve, &r.serve_error) {
        (Some(s), _) => {
            let memfd = s
                .runs
                .iter()
                .find(|run| run.transport == "memfd" && run.load == "paced" && !run.fine_tuning);
            crate::outln!(
                "  serve      {} clients, {} frames, on {}: forward p50 {:.3} ms{}",
                s.clients,
                s.frame,
                s.engine,
                s.forward_p50_ms,
                memfd.map_or(String::new(), |m| format!(
                    "; memfd at {} frames/s: p50 {:.3} ms, p99 {:.3} ms",
                    s.paced_rate, m.p50_ms, m.p99_ms
                ))
            );
            for why in &s.skipped {
                crate::outln!("             left out {why}");
            }
        }
        (None, Some(e)) => crate::outln!("  serve      not measured: {e}"),
        (None, None) => {}
    }
    let t = &r.throttle;
    let temp = t
        .max_temp_c
        .map_or(String::new(), |c| format!(", hottest {c:.1} °C"));
    if t.throttled {
        crate::outln!(
            "  throttle   THROTTLED: {}{temp} — the figures above are low",
            t.notes.join("; ")
        );
    } else if t.notes.is_empty() {
        crate::outln!("  throttle   none seen{temp}");
    } else {
        crate::outln!("  throttle   {}{temp}", t.notes.join("; "));
    }
    crate::outln!("  ({:.0} s)", r.seconds);
}
