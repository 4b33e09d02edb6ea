use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use fulcrum::balance::{evaluate, parse_duration, BalanceInput, BalanceReport, Binding};

/// Evaluate the balance equation T_g·B/C ≤ T_step and say what would balance it.
///
/// Loading a batch takes T_g·B/C (CPU time per sample × batch / loader cores); a training step
/// takes T_step on the device. When loading is slower the device idles, and ring depth does not
/// help (it only absorbs variance). Durations take units: 28ms, 30us, 0.5s (bare: seconds).
/// With --from, T_g, C, B and the disk bandwidth come from a `fulcrum bench io --json` file,
/// and the report names the binding resource among disk, loader CPU and device.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  fulcrum balance --tg 28ms --cores 4 --batch 32 --step 10.4ms\n  fulcrum balance --tg 28ms --decode 25ms --cores 4 --batch 32 --step 10.4ms\n  fulcrum bench io --json io.json && fulcrum balance --from io.json --step 40ms"
)]
pub struct Args {
    /// CPU time to produce one sample (read + decode + augment).
    #[arg(long, value_parser = parse_duration, required_unless_present = "from")]
    tg: Option<Duration>,
    /// Loader cores.
    #[arg(long, required_unless_present = "from", value_parser = crate::args::positive)]
    cores: Option<f64>,
    /// Samples per batch.
    #[arg(long, required_unless_present = "from", value_parser = crate::args::count(crate::args::MAX_BATCH))]
    batch: Option<u32>,
    /// Device time per training step.
    #[arg(long, value_parser = parse_duration)]
    step: Duration,
    /// Part of T_g spent decoding images (removed by packing once).
    #[arg(long, value_parser = parse_duration)]
    decode: Option<Duration>,
    /// Part of T_g spent augmenting (removed by augmenting on the device).
    #[arg(long, value_parser = parse_duration)]
    augment: Option<Duration>,
    /// Measured numbers from `fulcrum bench io --json FILE` (flags given as well override them).
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut input = BalanceInput {
        tg: a.tg.unwrap_or_default(),
        cores: a.cores.unwrap_or(0.0),
        batch: a.batch.unwrap_or(0),
        step: a.step,
        decode: a.decode,
        augment: a.augment,
        disk: None,
    };
    if let Some(path) = &a.from {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let bench: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a bench io JSON file", path.display()))?;
        let number = |key: &str| {
            bench[key].as_f64().with_context(|| {
                format!(
                    "{}: no number {key:?}; was it written by `fulcrum bench io --json`?",
                    path.display()
                )
            })
        };
        input.tg = a.tg.unwrap_or(Duration::from_secs_f64(
            number("loader_cpu_us_per_record")? / 1e6,
        ));
        input.cores = a.cores.unwrap_or(number("loaders")?);
        input.batch = a.batch.unwrap_or(number("batch")? as u32);
        let raw = bench["raw"]["mb_per_s"]
            .as_f64()
            .with_context(|| format!("{}: no raw.mb_per_s", path.display()))?;
        input.disk = Some((number("record_bytes")?, raw * 1e6));
    }
    let report = evaluate(&input)?;
    if a.json {
        crate::outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&input, &report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print(i: &BalanceInput, r: &BalanceReport) {
    let tg_ms = i.tg.as_secs_f64() * 1e3;
    crate::outln!(
        "T_g·B/C = {tg_ms:.3} ms × {} / {} = {:.2} ms per batch  vs  T_step = {:.2} ms",
        i.batch,
        i.cores,
        r.load_per_batch_ms,
        r.step_ms
    );
    if let Some(disk) = r.disk_per_batch_ms {
        crate::outln!("disk: {disk:.2} ms to read a batch at the measured bandwidth");
    }
    let side = if r.input_bound {
        "input-bound"
    } else {
        "compute-bound"
    };
    crate::outln!(
        "→ {side}: the {} binds; device idle {:.1} %, utilisation {:.1} %; loaders busy {:.1} %",
        r.binding.describe(),
        r.device_idle * 100.0,
        r.device_utilisation * 100.0,
        r.loader_utilisation * 100.0
    );
    match r.binding {
        Binding::Device => crate::outln!(
            "balanced with room: up to T_g = {:.3} ms per sample still keeps the device busy; {} loader core(s) would do at this batch",
            r.max_tg_ms, r.cores_needed
        ),
        Binding::LoaderCpu => crate::outln!(
            "to balance: {} loader cores at batch {}, or T_g ≤ {:.3} ms per sample (pack features once, augment on the device)",
            r.cores_needed, i.batch, r.max_tg_ms
        ),
        Binding::Disk => crate::outln!("to balance: faster storage, smaller records (lower --size), or a page cache that holds the dataset"),
    }
    for (what, w) in [
        ("packing (no decode)", r.with_packing),
        ("augmenting on the device", r.with_device_augment),
    ] {
        if let Some(w) = w {
            crate::outln!(
                "  with {what}: T_g = {:.3} ms, {:.2} ms per batch, device idle {:.1} %",
                w.tg_ms,
                w.load_per_batch_ms,
                w.device_idle * 100.0
            );
        }
    }
}
