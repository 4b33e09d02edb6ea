use std::path::PathBuf;
use std::process::ExitCode;

use crate::args::{non_negative, positive};
use fulcrum::balance::{
    self, timeline, DistSpec, Distribution, Policy, Role, SimConfig, SimReport,
};

/// Simulate the input pipeline: N loaders, at most D batches outstanding, one consumer.
///
/// A discrete-event simulation under two policies: `inorder` is PyTorch's DataLoader (batch i
/// from loader i mod N, taken strictly in order), `any` is fulcrum's cooperating loaders (an
/// idle loader takes the next batch, the consumer takes whichever is ready). Both see the same
/// batch and step times. It reports batches completed in T, throughput, consumer stall, queue
/// occupancy and loader utilisation, next to the balance equation min(N/load, 1/step) and to
/// the same pipeline with constant times (exact closed form): with constant times they agree
/// exactly; with variance the difference is the throughput variance costs.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  fulcrum simulate --loaders 4 --load-ms 4 --step-ms 1 --seconds 10\n  fulcrum simulate --loaders 4 --load-ms 4 --step-ms 1 --seconds 10 --cv 0.5 --html sim.html\n  fulcrum simulate --loaders 4 --dist trace:load_ms.txt --step-ms 10 --seconds 60 --ring 4 --json sim.json"
)]
pub struct Args {
    /// Loader workers (N), each producing one batch at a time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    loaders: u32,
    /// Mean time for a loader to produce one batch, ms (leave out with --dist trace:FILE).
    #[arg(long, value_name = "MEAN", value_parser = positive)]
    load_ms: Option<f64>,
    /// Mean time of one consumer (training) step, ms.
    #[arg(long, value_name = "MEAN", value_parser = positive)]
    step_ms: Option<f64>,
    /// Simulated seconds (T); a batch counts when its step has completed by T.
    #[arg(long, value_name = "T", value_parser = positive)]
    seconds: f64,
    /// Load-time distribution: const, normal, lognormal, exp, or trace:FILE (durations in ms,
    /// one per line, used in order and cycled) [default: lognormal if --cv > 0, else const].
    #[arg(long, value_name = "DIST")]
    dist: Option<DistSpec>,
    /// Coefficient of variation (std/mean) of the load time, for normal and lognormal.
    #[arg(long, value_name = "X", value_parser = non_negative)]
    cv: Option<f64>,
    /// Step-time distribution, as --dist [default: lognormal if --step-cv > 0, else const].
    #[arg(long, value_name = "DIST")]
    step_dist: Option<DistSpec>,
    /// Coefficient of variation of the step time.
    #[arg(long, value_name = "X", value_parser = non_negative)]
    step_cv: Option<f64>,
    /// Most batches outstanding (D: started and not yet taken by the consumer; PyTorch's
    /// prefetch_factor × num_workers) [default: 2 × loaders].
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    ring: Option<u32>,
    /// Start loader k at k·load/N instead of all at 0.
    #[arg(long)]
    desync: bool,
    /// Which policy to simulate.
    #[arg(long, value_enum, default_value = "both")]
    policy: PolicyArg,
    /// Seed of the random load and step times.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the timeline (loaders, queue, consumer) as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Write an animated, self-contained HTML page of the timeline to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Seconds of timeline to draw, from 0 [default: about 40 batches' worth, at most T].
    #[arg(long, value_name = "S", value_parser = positive)]
    draw_seconds: Option<f64>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PolicyArg {
    /// PyTorch DataLoader: batch i from loader i mod N, taken in order.
    Inorder,
    /// fulcrum: loaders share the work; the consumer takes any ready batch.
    Any,
    /// Both, side by side.
    Both,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::output_file::check_some("--json", a.json.as_deref())?;
    crate::output_file::check_some("--svg", a.svg.as_deref())?;
    crate::output_file::check_some("--html", a.html.as_deref())?;
    let load = Distribution::new(a.dist.as_ref(), a.load_ms, a.cv, Role::Load)?;
    let step = Distribution::new(a.step_dist.as_ref(), a.step_ms, a.step_cv, Role::Step)?;
    let loaders = a.loaders as usize;
    let cfg = SimConfig {
        ring: a.ring.map_or(2 * loaders, |d| d as usize),
        desync: a.desync,
        seed: a.seed,
        draw_seconds: a.draw_seconds,
        ..SimConfig::new(loaders, load, step, a.seconds)
    };
    let policies: &[Policy] = match a.policy {
        PolicyArg::Inorder => &[Policy::Inorder],
        PolicyArg::Any => &[Policy::Any],
        PolicyArg::Both => &[Policy::Inorder, Policy::Any],
    };
    let sims = policies
        .iter()
        .map(|&p| balance::simulate(&cfg, p))
        .collect::<Result<Vec<_>, _>>()?;
    let reports: Vec<&SimReport> = sims.iter().map(|s| &s.report).collect();
    print(&cfg, &reports);
    if let Some(path) = &a.json {
        let doc = serde_json::json!({ "config": cfg, "results": reports });
        crate::output_file::write_json(path, &doc)?;
    }
    let panels: Vec<timeline::Timeline> = sims.iter().map(|s| s.timeline.clone()).collect();
    if let Some(path) = &a.svg {
        crate::output_file::write(path, timeline::svg(&panels).as_bytes())?;
    }
    if let Some(path) = &a.html {
        let title = format!("fulcrum simulate: {}", cfg.describe());
        crate::output_file::write(path, timeline::html(&panels, &title).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn pct(v: f64) -> String {
    format!("{:.2} %", v * 100.0)
}

fn print(cfg: &SimConfig, reports: &[&SimReport]) {
    crate::outln!(
        "simulate: {}, {} s, seed {}",
        cfg.describe(),
        cfg.seconds,
        cfg.seed
    );
    let eq = cfg.equation_batches_per_s();
    let load_rate = cfg.loaders as f64 / (cfg.load.mean_ns() as f64 / 1e9);
    let step_rate = 1e9 / cfg.step.mean_ns() as f64;
    crate::outln!(
        "  equation: min(N/load, 1/step) = min({load_rate:.1}, {step_rate:.1}) = {eq:.1} batches/s ({})",
        if (load_rate - step_rate).abs() <= 1e-9 * step_rate {
            "balanced"
        } else if load_rate < step_rate {
            "input-bound"
        } else {
            "compute-bound"
        }
    );
    if cfg.ring < cfg.loaders {
        crate::outln!(
            "  note: ring {} < {} loaders: at most {} loaders are ever busy at once",
            cfg.ring,
            cfg.loaders,
            cfg.ring
        );
    }
    let c = &reports[0].constant;
    crate::outln!(
        "  constant times of the same means: {} batches in {} s, stall {} ({}, {})",
        c.batches,
        cfg.seconds,
        pct(c.stall_fraction()),
        match c.regime {
            balance::Regime::ComputeBound => "compute-bound",
            balance::Regime::InputBound => "input-bound",
        },
        match c.method {
            balance::Method::ClosedForm => "closed form",
            balance::Method::Recursion => "exact recursion",
        }
    );
    for r in reports {
        crate::outln!(
            "  {}: batches consumed in {} s: {}",
            r.policy.name(),
            cfg.seconds,
            r.batches
        );
    }
    type Cell = Box<dyn Fn(&SimReport) -> String>;
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("n/a".to_owned(), f);
    let rows: Vec<(&str, Cell)> = vec![
        ("batches consumed", Box::new(|r| r.batches.to_string())),
        (
            "throughput (batches/s)",
            Box::new(|r| format!("{:.1}", r.batches_per_s)),
        ),
        (
            "after warm-up (batches/s)",
            Box::new(move |r| opt(r.batches_per_s_after_first, &|v| format!("{v:.1}"))),
        ),
        (
            "lost vs the equation",
            Box::new(move |r| opt(r.lost_vs_equation, &pct)),
        ),
        (
            "lost vs constant times",
            Box::new(move |r| opt(r.lost_vs_constant, &pct)),
        ),
        ("consumer stall", Box::new(|r| pct(r.stall_fraction))),
        (
            "  after the first batch",
            Box::new(move |r| opt(r.stall_fraction_after_first, &pct)),
        ),
        (
            "first batch at (ms)",
            Box::new(move |r| opt(r.first_batch_ms, &|v| format!("{v:.3}"))),
        ),
        (
            "queue occupancy mean / max",
            Box::new(|r| format!("{:.2} / {}", r.queue_mean, r.queue_max)),
        ),
        (
            "loader utilisation",
            Box::new(|r| pct(r.loader_utilisation)),
        ),
    ];
    crate::out!("  {:<28}", "");
    for r in reports {
        crate::out!(" {:>14}", r.policy.name());
    }
    crate::outln!();
    for (name, f) in &rows {
        crate::out!("  {name:<28}");
        for r in reports {
            crate::out!(" {:>14}", f(r));
        }
        crate::outln!();
    }
}
