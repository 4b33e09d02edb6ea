//! det-s forward at batch 1 on the CPU engine in a loop, for a profiler (`perf record`) to
//! see the inference kernels alone (`bench compute` also runs the training step). A
//! developer's tool, not a test:
//!
//!     cargo build --release --example forward_loop
//!     perf record -e cpu-clock target/release/examples/forward_loop 20000 2
//!
//! With `layers RUNS THREADS` it prints each kernel's median time over that many passes, in
//! the pass's order (a layer-by-layer comparison with another runtime's profile).
//!
//! With `serve THREADS` it reads a count of passes per line from stdin and answers each with
//! the median and the fastest pass of that many, in µs: `tools/scripts/compare-cpu-peers.py`
//! alternates such short chunks with LiteRT's, so that each pair of chunks meets the host in
//! one state (a shared host's speed changes from one second to the next).

use fulcrum::compute::exec::{EngineChoice, Exec, ExecOptions};
use fulcrum::format::RecordLayout;
use fulcrum::model::{init, Arch, GraphOptions, ModelConfig, ModelGraph, ENTRY_INFER};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    let serve = args.next_if(|a| a == "serve").is_some();
    let layers = !serve && args.next_if(|a| a == "layers").is_some();
    let runs: usize = match serve {
        true => 0,
        false => args.next().map_or(Ok(10_000), |a| a.parse())?,
    };
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
            per_kernel_timing: layers,
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
    if serve {
        return serve_chunks(&mut exec, entry);
    }
    if layers {
        return layer_medians(&mut exec, entry, runs);
    }
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

/// Answers each line of stdin (a count of passes) with the median and the fastest of that many
/// passes, timed one by one, in µs; the first line out names the engine.
fn serve_chunks(exec: &mut Exec, entry: usize) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{BufRead, Write};
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", exec.describe())?;
    out.flush()?;
    let mut times = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let passes: usize = line?.trim().parse()?;
        times.clear();
        for _ in 0..passes.max(1) {
            let t = Instant::now();
            exec.run(entry)?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_by(f64::total_cmp);
        writeln!(out, "{:.2} {:.2}", times[times.len() / 2], times[0])?;
        out.flush()?;
    }
    Ok(())
}

/// The median time of each kernel of the pass over `runs` passes, in µs, in the pass's order.
fn layer_medians(
    exec: &mut Exec,
    entry: usize,
    runs: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let names = exec.kernel_names(entry);
    let mut times = vec![Vec::with_capacity(runs); names.len()];
    for _ in 0..runs.max(1) {
        let t = exec.run(entry)?;
        for (v, d) in times.iter_mut().zip(&t.per_kernel) {
            v.push(d.as_secs_f64() * 1e6);
        }
    }
    let mut total = 0.0;
    for (name, mut v) in names.iter().zip(times) {
        v.sort_by(f64::total_cmp);
        total += v[v.len() / 2];
        println!("{:8.2} µs  {name}", v[v.len() / 2]);
    }
    println!("{total:8.2} µs  sum of medians ({})", exec.describe());
    Ok(())
}
