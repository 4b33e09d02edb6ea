//! det-s forward at batch 1 on the CPU engine in a loop, for a profiler (`perf record`) to
//! see the inference kernels alone (`bench compute` also runs the training step). A
//! developer's tool, not a test:
//!
//!     cargo build --release --example forward_loop
//!     perf record -e cpu-clock target/release/examples/forward_loop 20000 2

use fulcrum::compute::exec::{EngineChoice, Exec, ExecOptions};
use fulcrum::format::RecordLayout;
use fulcrum::model::{init, Arch, GraphOptions, ModelConfig, ModelGraph, ENTRY_INFER};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let threads: usize = args.next().map_or(Ok(0), |a| a.parse())?;
    let model = ModelConfig::named("det-s", 2)?;
    let arch = Arch::new(&model);
    let layout = RecordLayout::new(model.input, model.input, 3, 8)?;
    let graph = ModelGraph::build(&arch, 1, &layout, &GraphOptions::default())?;
    let entry = graph.entry(ENTRY_INFER);
    let mut exec = Exec::new(
        &graph.recording,
        &ExecOptions {
            engine: EngineChoice::Cpu,
            threads,
            ..ExecOptions::default()
        },
    )?;
    for (p, v) in graph.params.iter().zip(init::init_params(&arch, 1)) {
        exec.write_f32(p.value, &v)?;
    }
    let record: Vec<u8> = (0..layout.record_size)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    exec.write_bytes(graph.records, &record)?;
    let t = Instant::now();
    for _ in 0..runs {
        exec.run(entry)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / runs as f64;
    println!(
        "{}: {us:.1} µs a forward pass (mean of {runs})",
        exec.describe()
    );
    Ok(())
}
