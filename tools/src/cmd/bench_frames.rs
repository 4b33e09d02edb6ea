//! `fulcrum bench frames`: the frame pass alone, every pixel format at camera sizes into the
//! det-s and det-m inputs, on every kernel set this CPU runs (portable first, the baseline),
//! and with `--gpu` on the Vulkan device.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use fulcrum::compute::cpu::kernels::KernelSet;
use fulcrum::compute::recording::{Elem, Recording, Role, TensorId};
use fulcrum::compute::vulkan::{Engine, FrameJob, Options, VulkanExec};
use fulcrum::pixels::{ColourSpace, FramePass, GpuFramePlan, PixelFormat, Pixels};
use fulcrum::serve::frame::encode_frame;

/// The frame pass alone (colour conversion, area resampling, letterbox, into the engine's
/// input): each pixel format at 640×480, 1280×720 and 1920×1080 into det-s (128 px) and
/// det-m (256 px) inputs, median and p99 over --runs runs, for every kernel set this CPU
/// runs, with each set's time as a ratio to the portable set's in the same run. On one
/// thread, or with --threads N split in bands over a pool of N as the daemon does where
/// that measured faster (the bands it chose are printed). With --gpu, also the pass as the
/// Vulkan engine runs it for a model on a GPU: the frame copied into a host-visible buffer,
/// its windows planned, the `frame_pass` kernel submitted alone and waited for (the forward
/// pass would follow in the same submission).
#[derive(clap::Args)]
pub struct FramesArgs {
    /// Runs per figure, 10 to 100000.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    runs: u32,
    /// Only these pixel formats (comma-separated) [default: all seven].
    #[arg(long, value_delimiter = ',', value_parser = super::client::parse_format)]
    formats: Vec<PixelFormat>,
    /// Only the best kernel set (and the portable baseline).
    #[arg(long)]
    best_only: bool,
    /// Threads of the pool the pass may split a frame over, 1 to 16.
    #[arg(long, default_value_t = 1, value_parser = crate::args::threads)]
    threads: usize,
    /// Also time the pass on the Vulkan device (see `fulcrum devices`; --device picks one).
    #[arg(long)]
    gpu: bool,
    /// Vulkan device index for --gpu [default: the best].
    #[arg(long, requires = "gpu")]
    device: Option<usize>,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// One figure.
#[derive(serde::Serialize)]
struct Figure {
    format: &'static str,
    frame: String,
    input: u32,
    /// The CPU kernel set, or `gpu`.
    kernels: String,
    threads: usize,
    /// Bands the pass chose for this frame (1: one thread).
    bands: usize,
    median_us: f64,
    p99_us: f64,
    /// This set's median over the portable set's for the same work.
    ratio_to_portable: f64,
    /// On the GPU: the kernel's own median from GPU timestamps (the rest of the time is the
    /// frame's copy, the submission and the wait).
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_median_us: Option<f64>,
}

const FRAMES: [(u16, u16); 3] = [(640, 480), (1280, 720), (1920, 1080)];
const INPUTS: [(u32, &str); 2] = [(128, "det-s"), (256, "det-m")];

/// A camera-like scene: smooth gradients, edges and a little noise (a flat frame would make
/// every window equal; noise alone is unlike any camera's).
fn scene(w: usize, h: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9u32;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state >> 27) as u8
    };
    let mut rgb = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let edge = if (x / 97 + y / 61) % 2 == 0 { 60 } else { 0 };
            rgb.push(((x * 255 / w) as u8).wrapping_add(noise()));
            rgb.push(((y * 255 / h) as u8 / 2 + edge).wrapping_add(noise()));
            rgb.push((((x + y) * 128 / (w + h)) as u8 + 40).wrapping_add(noise()));
        }
    }
    rgb
}

/// The pass on a Vulkan device: a records tensor for the largest input, the plan, the stage.
struct GpuPass {
    exec: VulkanExec,
    records: TensorId,
    plans: Vec<GpuFramePlan>,
    label: String,
}

impl GpuPass {
    fn new(device: Option<usize>) -> anyhow::Result<Self> {
        let engine = Engine::new(&Options {
            device,
            ..Options::default()
        })?;
        let label = engine.info().label();
        let largest = INPUTS.iter().map(|i| i.0).max().unwrap_or(0) as usize;
        let mut rec = Recording::new();
        let records = rec.tensor("records", largest * largest * 3, Elem::Bytes, Role::Input);
        let exec = VulkanExec::new(engine, &rec, false, None)?;
        let plans = INPUTS
            .iter()
            .map(|&(input, _)| {
                GpuFramePlan::new(input).ok_or_else(|| anyhow::anyhow!("input {input}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(GpuPass {
            exec,
            records,
            plans,
            label,
        })
    }

    /// Times `runs` passes of `pixels` into `input`, microseconds into `times` (sorted);
    /// returns the median, and the kernel's own median where the queue has timestamps.
    fn time(
        &mut self,
        pixels: &Pixels<'_>,
        input: u32,
        runs: u32,
        times: &mut Vec<f64>,
    ) -> anyhow::Result<(f64, Option<f64>)> {
        let mut kernel = Vec::with_capacity(runs as usize);
        let plan = self
            .plans
            .iter_mut()
            .find(|p| p.size() == input)
            .ok_or_else(|| anyhow::anyhow!("no plan for input {input}"))?;
        times.clear();
        for run in 0..runs + 10 {
            let t = Instant::now();
            let frame = plan
                .plan(pixels, None)?
                .ok_or_else(|| anyhow::anyhow!("the frame is over 4 GiB"))?;
            let job = FrameJob {
                target: self.records,
                out_bytes: (input * input * 3) as usize,
                frame: pixels.picture_bytes(),
                windows: frame.windows,
                push: frame.push,
                groups: frame.groups,
                tail: &[],
                tail_offset: 0,
            };
            let timing = self.exec.run_frame(&job, None)?;
            if run >= 10 {
                times.push(t.elapsed().as_secs_f64() * 1e6);
                kernel.extend(timing.frame_gpu.map(|d| d.as_secs_f64() * 1e6));
            }
        }
        times.sort_by(f64::total_cmp);
        kernel.sort_by(f64::total_cmp);
        let kernel = (!kernel.is_empty()).then(|| percentile(&kernel, 0.5));
        Ok((percentile(times, 0.5), kernel))
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub fn run(a: FramesArgs) -> anyhow::Result<ExitCode> {
    crate::output_file::check_some("--json", a.json.as_deref())?;
    let formats = if a.formats.is_empty() {
        PixelFormat::ALL.to_vec()
    } else {
        a.formats.clone()
    };
    let sets: Vec<KernelSet> = if a.best_only {
        let mut s = vec![KernelSet::Portable, KernelSet::best()];
        s.dedup();
        s
    } else {
        KernelSet::here()
    };
    let pool = (a.threads > 1).then(|| fulcrum::compute::cpu::pool::Pool::new(a.threads));
    crate::outln!(
        "fulcrum bench frames: the frame pass on {} thread(s), {} runs a figure; kernel sets: {} \
         (best: {})",
        a.threads,
        a.runs,
        fulcrum::compute::cpu::kernels::names(&sets),
        KernelSet::best()
    );
    crate::outln!(
        "  {:<6} {:>10} {:>12} {:<9} {:>5} {:>10} {:>10} {:>12}",
        "format",
        "frame",
        "input",
        "kernels",
        "bands",
        "median µs",
        "p99 µs",
        "× portable"
    );
    let mut gpu = if a.gpu {
        let gpu = GpuPass::new(a.device)?;
        crate::outln!("  gpu: {}", gpu.label);
        Some(gpu)
    } else {
        None
    };
    let mut figures = Vec::new();
    let mut times = Vec::with_capacity(a.runs as usize);
    for &(w, h) in &FRAMES {
        let rgb = scene(usize::from(w), usize::from(h));
        for &format in &formats {
            let len = format.frame_len(w, h, 0)? as usize;
            let mut bytes = vec![0u8; len];
            encode_frame(&rgb, w, h, format, 0, &mut bytes);
            let pixels = Pixels::new(
                format,
                u32::from(w),
                u32::from(h),
                0,
                ColourSpace::Bt601Limited,
                &bytes,
            )?;
            for &(input, model) in &INPUTS {
                let mut out = vec![0u8; (input * input * 3) as usize];
                let mut portable = None;
                for &set in &sets {
                    let Some(mut pass) = FramePass::on_kernel_set(input, set) else {
                        continue;
                    };
                    pass.reserve(u32::from(w.max(h)), a.threads);
                    // Warm-up, and the pass's own trials of one band against all.
                    for _ in 0..10 {
                        pass.run_on(pool.as_ref(), &pixels, None, &mut out)?;
                    }
                    times.clear();
                    for _ in 0..a.runs {
                        let t = Instant::now();
                        pass.run_on(pool.as_ref(), &pixels, None, &mut out)?;
                        times.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    times.sort_by(f64::total_cmp);
                    let median = percentile(&times, 0.5);
                    let base = *portable.get_or_insert(median);
                    let figure = Figure {
                        format: format.name(),
                        frame: format!("{w}x{h}"),
                        input,
                        kernels: set.name().to_owned(),
                        threads: a.threads,
                        bands: pass.bands_chosen().unwrap_or(1),
                        median_us: median,
                        p99_us: percentile(&times, 0.99),
                        ratio_to_portable: median / base,
                        kernel_median_us: None,
                    };
                    crate::outln!(
                        "  {:<6} {:>10} {:>12} {:<9} {:>5} {:>10.1} {:>10.1} {:>12.2}",
                        figure.format,
                        figure.frame,
                        format!("{input} ({model})"),
                        set.name(),
                        figure.bands,
                        figure.median_us,
                        figure.p99_us,
                        figure.ratio_to_portable
                    );
                    figures.push(figure);
                }
                if let Some(gpu) = &mut gpu {
                    let (median, kernel) = gpu.time(&pixels, input, a.runs, &mut times)?;
                    let figure = Figure {
                        format: format.name(),
                        frame: format!("{w}x{h}"),
                        input,
                        kernels: "gpu".to_owned(),
                        threads: 0,
                        bands: 1,
                        median_us: median,
                        p99_us: percentile(&times, 0.99),
                        ratio_to_portable: median / portable.unwrap_or(median),
                        kernel_median_us: kernel,
                    };
                    crate::outln!(
                        "  {:<6} {:>10} {:>12} {:<9} {:>5} {:>10.1} {:>10.1} {:>12.2}{}",
                        figure.format,
                        figure.frame,
                        format!("{input} ({model})"),
                        "gpu",
                        "",
                        figure.median_us,
                        figure.p99_us,
                        figure.ratio_to_portable,
                        kernel.map_or(String::new(), |k| format!("  (kernel {k:.1} µs)"))
                    );
                    figures.push(figure);
                }
            }
        }
    }
    if let Some(path) = &a.json {
        crate::output_file::write_json(path, &figures)?;
    }
    Ok(ExitCode::SUCCESS)
}
