use std::path::PathBuf;
use std::process::ExitCode;

use fulcrum::balance::{self, IoBenchConfig, IoBenchReport};

/// Benchmarks, reported as ratios to a baseline measured in the same run.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand)]
enum Which {
    Io(IoArgs),
}

/// Disk → ring → loaders: raw O_DIRECT read limit, io_uring and pread backends, loaders with
/// augmentation; MB/s, records/s and ratios to the raw limit.
#[derive(clap::Args)]
pub struct IoArgs {
    /// Packed dataset to read [default: a synthetic one packed once under ~/.cache/fulcrum].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Records of the default synthetic dataset.
    #[arg(long, default_value_t = 4096)]
    records: u64,
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Loader threads for the augmentation run [default: one per core].
    #[arg(long)]
    loaders: Option<usize>,
    #[arg(long, default_value_t = 4)]
    ring: usize,
    /// Reads in flight (and records per read unit) for raw and backend runs.
    #[arg(long, default_value_t = 32)]
    queue_depth: u32,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.which {
        Which::Io(io) => run_io(io),
    }
}

pub fn run_io(a: IoArgs) -> anyhow::Result<ExitCode> {
    let data = match a.data {
        Some(d) => d,
        None => balance::ensure_bench_data(a.records, &|note| eprintln!("{note}"))?,
    };
    let config = IoBenchConfig {
        data,
        batch: a.batch,
        loaders: a.loaders.unwrap_or_else(fulcrum_board::host_cores),
        ring_slots: a.ring,
        queue_depth: a.queue_depth,
        seconds: a.seconds,
    };
    let report = balance::bench_io(&config, &|step| eprintln!("measuring: {step}"))?;
    print_io(&report);
    if let Some(path) = a.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn print_io(r: &IoBenchReport) {
    println!(
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
    println!(
        "  {:<34} {:>10} {:>12} {:>9}",
        "", "MB/s", "records/s", "× raw"
    );
    let row = |name: &str, t: &balance::Throughput| {
        println!(
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
        (None, why) => println!(
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
    println!(
        "  loader CPU per record (T_g): {:.1} µs",
        r.loader_cpu_us_per_record
    );
}
