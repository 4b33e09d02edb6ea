use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use fulcrum::loader::{Dataset, Loader};

use super::pipeline::PipelineArgs;

/// Stream a packed dataset through the input pipeline (io → ring → loaders) and report rates.
///
/// This is what a training run's input side does, without the model: it shows how many
/// records per second the loaders deliver, which backend runs, and where time goes.
#[derive(clap::Args)]
pub struct Args {
    /// Packed dataset folder.
    dir: PathBuf,
    /// Epochs to stream, 1 to 1000000.
    #[arg(long, default_value_t = 1, value_parser = crate::args::epochs())]
    epochs: u64,
    /// Record loader and consumer spans and write them as Chrome trace JSON (open in Perfetto).
    #[arg(long, value_name = "JSON")]
    trace: Option<PathBuf>,
    /// Capacity of the trace log in events (32 bytes each, allocated up front).
    #[arg(long, default_value_t = 65536, value_parser = crate::args::count_usize(crate::args::MAX_TRACE_EVENTS))]
    trace_events: usize,
    /// List every allocation of the pipeline (planned before it is made).
    #[arg(long)]
    memory_report: bool,
    /// Draw the first batch as delivered (augmented) with its boxes into this PNG.
    #[arg(long, value_name = "PNG")]
    preview: Option<PathBuf>,
    #[command(flatten)]
    pipeline: PipelineArgs,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let dataset = Dataset::open(&a.dir, a.pipeline.direct)?;
    let mut config = a.pipeline.loader_config(a.epochs);
    let trace = a
        .trace
        .as_ref()
        .map(|_| std::sync::Arc::new(fulcrum::trace::TraceLog::new(a.trace_events)));
    config.trace = trace.clone();
    let mut loader = Loader::start(&dataset, &config)?;
    crate::outln!(
        "{}: {} records, batch {}, {} batches per epoch; {} loaders, ring {} slots ({}), {} reads{}",
        a.dir.display(),
        dataset.records(),
        config.batch,
        loader.batches_per_epoch(),
        config.loaders,
        config.ring_slots,
        fulcrum::base::human(loader.ring_bytes() as u64),
        loader.backend().name(),
        if dataset.files.is_direct() { " with O_DIRECT" } else { " (buffered)" },
    );
    let plan = loader.memory_plan();
    crate::outln!(
        "memory: {} planned and allocated up front{}",
        fulcrum::base::human(plan.total()),
        match a.pipeline.mem_budget {
            Some(b) => format!(" (budget {})", fulcrum::base::human(b)),
            None => String::new(),
        }
    );
    if a.memory_report {
        crate::out!("{}", plan.table());
    }
    let total = loader.batches_per_epoch() * a.epochs;
    let bar = crate::progress::bar(total, "batches");
    let started = Instant::now();
    let mut boxes = 0u64;
    while let Some(batch) = loader.next_batch()? {
        if batch.index == 0 {
            if let Some(png) = &a.preview {
                let rs = batch.layout().record_size;
                let picture = fulcrum::loader::preview::grid(
                    batch.layout(),
                    batch.records().chunks_exact(rs),
                    8,
                );
                picture
                    .save(png)
                    .with_context(|| format!("writing {}", png.display()))?;
            }
        }
        boxes += (0..batch.len())
            .map(|i| batch.box_count(i) as u64)
            .sum::<u64>();
        bar.inc(1);
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let c = loader.counters();
    let records = c.loaders.items;
    crate::outln!(
        "delivered {records} records ({boxes} boxes) in {secs:.2} s: {:.0} records/s, {:.0} MB/s",
        records as f64 / secs,
        c.disk.bytes as f64 / secs / 1e6
    );
    let per_record_us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / records.max(1) as f64;
    crate::outln!(
        "  loader CPU per record (T_g): {:.1} µs; reads: {:.1} µs wall per record (many in flight, overlapped)",
        per_record_us(c.loaders.cpu),
        per_record_us(c.disk.busy)
    );
    crate::outln!(
        "  loaders waited for a free slot {:.2} s; consumer waited for a ready batch {:.2} s",
        c.loaders.wait.as_secs_f64(),
        c.consumer.wait.as_secs_f64()
    );
    if let (Some(path), Some(log)) = (&a.trace, &trace) {
        drop(loader); // joins the loaders: every span is recorded
        std::fs::write(path, log.to_chrome_json())
            .with_context(|| format!("writing {}", path.display()))?;
        let (n, dropped) = (log.events().len(), log.dropped());
        eprintln!(
            "wrote {} ({n} events, {dropped} dropped); open it in Perfetto (ui.perfetto.dev)",
            path.display()
        );
    }
    if c.substituted > 0 {
        crate::outln!(
            "  {} corrupt records replaced by substitutes (--on-corrupt skip)",
            c.substituted
        );
    }
    Ok(ExitCode::SUCCESS)
}
