//! `fulcrum bench serve`: a daemon on det-s (a given checkpoint, or untrained synthetic-shape
//! weights: latency does not depend on what the weights learnt) and N clients on this
//! machine, frames inline and through memfd rings, paced (latency at a rate the daemon can
//! keep) and flat out (throughput). Latency is measured by each client from handing a frame
//! over to receiving its detections; the engine's own time for the same frame, measured in
//! process before the daemon starts, is the baseline beside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_board::protocol::{FrameDesc, FrameSource, PixelFormat};
use serde::Serialize;

use crate::compute::exec::ExecOptions;
use crate::infer::predict::{FramePlace, Predictor};
use crate::infer::Scored;
use crate::model::Checkpoint;
use crate::model::ModelConfig;
use crate::serve::client::Client;
use crate::serve::frame::{encode_frame, FrameView};
use crate::serve::stats::LatencyHistogram;
use crate::serve::{Control, Error, Notifier, ServeConfig, Server};

#[derive(Clone, Debug)]
pub struct ServeBenchConfig {
    /// Served checkpoint; `None`: untrained `model` with two classes.
    pub weights: Option<PathBuf>,
    /// The preset served when no weights are given (det-s, det-m or det-l).
    pub model: String,
    pub exec: ExecOptions,
    pub clients: usize,
    /// Seconds per run.
    pub seconds: f64,
    /// Frames per second over all clients in the paced runs.
    pub rate: f64,
    pub width: u16,
    pub height: u16,
    pub format: PixelFormat,
    /// Also measure while the daemon fine-tunes (packs a small set and trains in the gaps).
    pub fine_tune: bool,
    /// The floors on fine-tuning's share of engine time to measure it at (`fulcrumd
    /// --fine-tune-share`; 0 is inference first alone).
    pub fine_tune_shares: Vec<f32>,
    /// Fine-tune on this folder (packed `train/` and `val/` with the served model's classes)
    /// instead of a synthetic set packed for the purpose. Each floor then starts a fresh
    /// fine-tune from the served weights (reloaded), and its held-out mAP is followed.
    pub fine_tune_data: Option<PathBuf>,
    /// The layers the fine-tune leaves frozen.
    pub fine_tune_freeze: fulcrum_board::protocol::FineTuneFreeze,
    /// Whether the fine-tune also trains the frozen layers' biases.
    pub fine_tune_train_biases: bool,
    /// Seconds of each run while fine-tuning; `None`: `seconds`.
    pub fine_tune_seconds: Option<f64>,
    /// While fine-tuning, only the paced runs (a long curve at a camera's rate).
    pub paced_only: bool,
    /// The daemon's `--fine-tune-slice`; `None`: its default.
    pub fine_tune_slice: Option<Duration>,
    /// Also measure a paced memfd run while the weights are reloaded (SIGHUP's path) every
    /// this many seconds: what a swap costs the requests around it.
    pub reload_every: Option<f64>,
}

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct ServeRun {
    /// `inline` or `memfd`.
    pub transport: &'static str,
    /// `paced` (at the configured rate) or `flat out`.
    pub load: &'static str,
    /// The daemon fine-tuned during the run (in the gaps between requests).
    pub fine_tuning: bool,
    /// Training steps the fine-tune took during the run.
    pub fine_tune_steps: u32,
    /// The floor on fine-tuning's share of engine time during the run.
    pub fine_tune_share: f32,
    /// With a fresh fine-tune per run: its progress, sampled through the run.
    pub fine_tune_curve: Vec<CurvePoint>,
    /// Weights reloaded and swapped in during the run.
    pub reloads: u32,
    pub frames: u64,
    pub frames_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ServeBenchReport {
    pub schema: u32,
    pub engine: String,
    pub model_input: u32,
    pub clients: usize,
    pub frame: String,
    pub seconds_per_run: f64,
    pub paced_rate: f64,
    /// The engine's forward (normalise, network, decode) for one frame, in process.
    pub forward_p50_ms: f64,
    pub forward_p99_ms: f64,
    /// The frame pass, in process: on the host, or on the GPU (its kernel's time, and planning
    /// its windows on the host), as [`ServeBenchReport::frame_pass_on`] says.
    pub prepare_p50_ms: f64,
    /// Where the frame pass ran: `cpu` or `gpu`.
    pub frame_pass_on: &'static str,
    pub runs: Vec<ServeRun>,
    /// Training steps per second the fine-tune took with no frames coming (the unloaded
    /// rate the runs' steps compare with).
    pub fine_tune_idle_steps_per_s: Option<f64>,
    /// Runs left out, and why.
    pub skipped: Vec<String>,
}

/// A fine-tune's progress at a moment of a run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CurvePoint {
    /// Since the fine-tune was asked for.
    pub seconds: f64,
    pub step: u32,
    /// Held-out mAP@0.5 of its latest checkpoint (`None` before the first).
    pub held_out_map: Option<f32>,
}

impl ServeRun {
    pub fn fine_tune_steps_per_s(&self) -> f64 {
        if self.frames_per_s > 0.0 {
            self.fine_tune_steps as f64 * self.frames_per_s / self.frames as f64
        } else {
            0.0
        }
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn bench_frame(config: &ServeBenchConfig) -> Result<(FrameDesc, Vec<u8>), Error> {
    let (w, h) = (config.width, config.height);
    let rgb: Vec<u8> = (0..u32::from(h))
        .flat_map(|y| {
            (0..u32::from(w)).flat_map(move |x| {
                // Two bright blobs on a textured background: detections to decode and send.
                let blob = |cx: u32, cy: u32, r: u32| {
                    x.abs_diff(cx).pow(2) + y.abs_diff(cy).pow(2) < r * r
                };
                if blob(u32::from(w) / 3, u32::from(h) / 3, u32::from(w) / 8) {
                    [230, 40, 40]
                } else if blob(2 * u32::from(w) / 3, 2 * u32::from(h) / 3, u32::from(w) / 6) {
                    [40, 220, 60]
                } else {
                    [((x * 7) ^ (y * 5)) as u8 / 2, 100, 120]
                }
            })
        })
        .collect();
    let desc = FrameDesc::packed(config.format, FrameSource::Inline, w, h)?;
    let mut bytes = vec![0; desc.length as usize];
    encode_frame(&rgb, w, h, config.format, 0, &mut bytes);
    Ok((desc, bytes))
}

/// The engine's own time on the frame, in process (the baseline for the daemon's latency).
fn forward_baseline(
    checkpoint: &Checkpoint,
    config: &ServeBenchConfig,
    desc: FrameDesc,
    bytes: &[u8],
) -> Result<(LatencyHistogram, LatencyHistogram, String, &'static str), Error> {
    let model = Path::new("(benchmark model)");
    let mut predictor = Predictor::new(checkpoint, &config.exec, 0.3, 100)
        .map_err(|e| Error::from_infer(model, e))?;
    predictor
        .reserve_sources(u32::from(config.width.max(config.height)))
        .map_err(|e| Error::from_infer(model, e))?;
    let view =
        FrameView::new(desc, bytes).ok_or_else(|| Error::Config("bad benchmark frame".into()))?;
    let mut out: Vec<Scored> = Vec::with_capacity(100);
    let (mut forward, mut prepare) = (LatencyHistogram::default(), LatencyHistogram::default());
    for i in 0..220 {
        let t = predictor
            .predict_into(&view.pixels(), view.crop(), &mut out)
            .map_err(|e| Error::from_infer(model, e))?;
        if i >= 20 {
            forward.record(t.device.as_micros() as u64);
            prepare.record(t.frame_pass().as_micros() as u64);
        }
    }
    let on = match predictor.frame_place() {
        FramePlace::Cpu => "cpu",
        FramePlace::Gpu => "gpu",
    };
    Ok((forward, prepare, predictor.engine(), on))
}

/// One run: every client sends frames (paced at `rate` frames/s in all, or flat out when
/// `rate` is 0) for `seconds`; latencies merged.
fn run_clients(
    socket: &Path,
    config: &ServeBenchConfig,
    frame: &Arc<(FrameDesc, Vec<u8>)>,
    memfd: bool,
    rate: f64,
) -> Result<ServeRun, Error> {
    run_clients_for(socket, config, frame, (memfd, rate), config.seconds)
}

/// [`run_clients`] for `seconds`; `(memfd, rate)` as there.
fn run_clients_for(
    socket: &Path,
    config: &ServeBenchConfig,
    frame: &Arc<(FrameDesc, Vec<u8>)>,
    (memfd, rate): (bool, f64),
    seconds: f64,
) -> Result<ServeRun, Error> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..config.clients)
        .map(|i| {
            let socket = socket.to_path_buf();
            let frame = frame.clone();
            let clients = config.clients;
            std::thread::Builder::new()
                .name(format!("bench-client-{i}"))
                .spawn(move || -> Result<LatencyHistogram, Error> {
                    let (desc, bytes) = (&frame.0, &frame.1);
                    let mut client = Client::connect(&socket)?;
                    if memfd {
                        client.attach_ring(u64::from(desc.length))?;
                    }
                    let mut latency = LatencyHistogram::default();
                    let period =
                        (rate > 0.0).then(|| Duration::from_secs_f64(clients as f64 / rate));
                    // Clients start spread over one period, so paced frames do not arrive together.
                    let mut next = Instant::now()
                        + period.map_or(Duration::ZERO, |p| p.mul_f64(i as f64 / clients as f64));
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        if let Some(p) = period {
                            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                                std::thread::sleep(wait);
                            }
                            next += p;
                        }
                        if memfd {
                            // What a camera's DMA does; not part of the handover measured.
                            client.write_ring(0, bytes)?;
                        }
                        let t = Instant::now();
                        if memfd {
                            client.infer_ring(FrameDesc { offset: 0, ..*desc }, n)?;
                        } else {
                            client.infer_inline(*desc, bytes, n)?;
                        }
                        latency.record(t.elapsed().as_micros() as u64);
                        n += 1;
                    }
                    Ok(latency)
                })
                .expect("spawn a benchmark client")
        })
        .collect();
    let mut all = LatencyHistogram::default();
    for h in handles {
        let latency = h
            .join()
            .map_err(|_| Error::Unexpected("a benchmark client panicked".into()))??;
        all.merge(&latency);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(ServeRun {
        transport: if memfd { "memfd" } else { "inline" },
        load: if rate > 0.0 { "paced" } else { "flat out" },
        fine_tuning: false,
        fine_tune_steps: 0,
        fine_tune_share: 0.0,
        fine_tune_curve: Vec::new(),
        reloads: 0,
        frames: all.count(),
        frames_per_s: all.count() as f64 / seconds,
        p50_ms: ms(all.quantile(0.5)),
        p99_ms: ms(all.quantile(0.99)),
        p999_ms: ms(all.quantile(0.999)),
    })
}

/// Runs the benchmark; `progress` hears what is being measured.
pub fn bench_serve(
    config: &ServeBenchConfig,
    mut progress: impl FnMut(&str),
) -> Result<ServeBenchReport, Error> {
    let seconds_ok = config.seconds.is_finite() && config.seconds > 0.0;
    let rate_ok = config.rate.is_finite() && config.rate >= 0.0;
    if config.clients == 0 || !seconds_ok || !rate_ok {
        return Err(Error::Config(
            "--clients and --seconds must be positive, --rate not negative".into(),
        ));
    }
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        what: "creating a temporary folder".into(),
        source: e,
    })?;
    let (weights, checkpoint) = match &config.weights {
        Some(path) => (
            path.clone(),
            Checkpoint::load(path).map_err(|e| Error::Weights {
                path: path.clone(),
                reason: e.to_string(),
            })?,
        ),
        None => {
            let model =
                ModelConfig::named(&config.model, 2).map_err(|e| Error::Config(e.to_string()))?;
            let c = Checkpoint::initial(model, vec!["disc".into(), "square".into()], 0);
            let path = dir.path().join(format!("{}.safetensors", config.model));
            c.save(&path).map_err(|e| Error::Weights {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            (path, c)
        }
    };
    let frame = Arc::new(bench_frame(config)?);
    progress("engine forward, in process");
    let (forward, prepare, engine, frame_pass_on) =
        forward_baseline(&checkpoint, config, frame.0, &frame.1)?;
    let socket = dir.path().join("fulcrumd.sock");
    let mut serve = ServeConfig::new(socket.clone(), weights, config.exec.clone());
    serve.state_dir = Some(dir.path().join("state"));
    serve.max_frame_side = config.width.max(config.height);
    // The control client, the curve's sampler, this run's clients, and room for the last
    // run's while the daemon sees them hang up (it may be in a fine-tuning turn when they do).
    serve.max_clients = 2 * config.clients + 4;
    if let Some(slice) = config.fine_tune_slice {
        serve.fine_tune_slice = slice;
    }
    // Every client here is this process's uid: the per-uid share would refuse the last.
    serve.max_clients_per_uid = Some(serve.max_clients);
    let mut server = Server::start(serve, Notifier::default())?;
    let share = server.fine_tune_share();
    let control = Arc::new(Control::new());
    let stop = control.clone();
    let reload = control.clone();
    let serving = std::thread::Builder::new()
        .name("fulcrumd".into())
        .spawn(move || server.run(&control))
        .expect("spawn the server thread");
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    let inline_fits = frame.0.length <= fulcrum_board::protocol::MAX_INLINE_BYTES;
    if !inline_fits {
        skipped.push(format!(
            "inline: a {} frame is {} bytes, over the {} bytes a message carries (memfd only)",
            config.format.name(),
            frame.0.length,
            fulcrum_board::protocol::MAX_INLINE_BYTES
        ));
    }
    let mut outcome = Ok(());
    'runs: for memfd in [false, true] {
        if !memfd && !inline_fits {
            continue;
        }
        for rate in [config.rate, 0.0] {
            let what = format!(
                "{} frames, {}",
                if memfd { "memfd" } else { "inline" },
                if rate > 0.0 {
                    format!("paced at {rate} frames/s")
                } else {
                    "flat out".into()
                }
            );
            progress(&what);
            match run_clients(&socket, config, &frame, memfd, rate) {
                Ok(run) => runs.push(run),
                Err(e) => {
                    outcome = Err(e);
                    break 'runs;
                }
            }
        }
    }
    if let (true, Some(every)) = (outcome.is_ok(), config.reload_every) {
        progress(&format!(
            "memfd frames paced at {} frames/s, reloading the weights every {every} s",
            config.rate
        ));
        match reloading_run(&socket, config, &frame, &reload, every) {
            Ok(run) => runs.push(run),
            Err(e) => outcome = Err(e),
        }
    }
    let mut fine_tune_idle_steps_per_s = None;
    if outcome.is_ok() && !config.fine_tune {
        skipped.push("while fine-tuning: not asked for".into());
    } else if outcome.is_ok() {
        let data = match &config.fine_tune_data {
            Some(data) => Ok(data.clone()),
            None => {
                progress("packing a synthetic set to fine-tune on");
                fine_tune_data(&checkpoint, dir.path())
            }
        };
        match data {
            Ok(data) => {
                let tuning = FineTuning {
                    data: &data,
                    share: &share,
                };
                match fine_tuning_runs(&socket, config, &frame, &tuning, &mut runs, &mut progress) {
                    Ok(FineTuneRuns::Measured { idle_steps_per_s }) => {
                        fine_tune_idle_steps_per_s = Some(idle_steps_per_s)
                    }
                    Ok(FineTuneRuns::TooSlow(why)) => {
                        skipped.push(format!("while fine-tuning: {why}"))
                    }
                    Err(e) => outcome = Err(e),
                }
            }
            Err(why) => skipped.push(format!("while fine-tuning: {why}")),
        }
    }
    stop.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    serving
        .join()
        .map_err(|_| Error::Unexpected("the server thread panicked".into()))??;
    outcome?;
    Ok(ServeBenchReport {
        schema: 1,
        engine,
        model_input: checkpoint.model.input,
        clients: config.clients,
        frame: format!(
            "{}x{} {}",
            config.width,
            config.height,
            config.format.name()
        ),
        seconds_per_run: config.seconds,
        paced_rate: config.rate,
        forward_p50_ms: ms(forward.quantile(0.5)),
        forward_p99_ms: ms(forward.quantile(0.99)),
        prepare_p50_ms: ms(prepare.quantile(0.5)),
        frame_pass_on,
        runs,
        fine_tune_idle_steps_per_s,
        skipped,
    })
}

/// A paced memfd run while `control` asks for a reload every `every` seconds (the serving
/// loop loads beside itself and swaps by a move); the run counts the swaps that happened.
fn reloading_run(
    socket: &Path,
    config: &ServeBenchConfig,
    frame: &Arc<(FrameDesc, Vec<u8>)>,
    control: &Arc<Control>,
    every: f64,
) -> Result<ServeRun, Error> {
    if !(every.is_finite() && every > 0.0) {
        return Err(Error::Config(format!(
            "--reload-every {every}: give a positive number of seconds"
        )));
    }
    let mut watcher = Client::connect(socket)?;
    let before = watcher.stats()?.weights_generation;
    let deadline = Instant::now() + Duration::from_secs_f64(config.seconds);
    let asker = {
        let control = control.clone();
        std::thread::Builder::new()
            .name("bench-reloads".into())
            .spawn(move || {
                while Instant::now() < deadline {
                    control
                        .reload
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(Duration::from_secs_f64(every));
                }
            })
            .expect("spawn the reload thread")
    };
    let mut run = run_clients(socket, config, frame, true, config.rate)?;
    asker
        .join()
        .map_err(|_| Error::Unexpected("the reload thread panicked".into()))?;
    run.reloads = watcher.stats()?.weights_generation.saturating_sub(before);
    Ok(run)
}

/// Synthetic `train/` (512 images) and `val/` (32) at the model's input size, if the model
/// detects the synthetic set's two classes.
fn fine_tune_data(checkpoint: &Checkpoint, dir: &Path) -> Result<PathBuf, NoFineTuneData> {
    use crate::pack::{pack, PackOptions, Source};
    if checkpoint.model.classes != 2 {
        return Err(NoFineTuneData::Classes(checkpoint.model.classes));
    }
    let data = dir.join("fine-tune");
    for (split, count, seed) in [("train", 512, 101), ("val", 32, 102)] {
        let mut options = PackOptions::new(Source::Synthetic { count, seed }, data.join(split));
        options.size = checkpoint.model.input;
        pack(&options, &|_, _| {})?;
    }
    Ok(data)
}

/// Why the bench skips its fine-tuning runs.
#[derive(Debug, thiserror::Error)]
enum NoFineTuneData {
    #[error("the weights detect {0} classes; the synthetic set has 2 (leave --weights out)")]
    Classes(u32),
    #[error(transparent)]
    Pack(#[from] crate::pack::Error),
}

/// What the fine-tuning runs train on, and the daemon's floor on their share.
struct FineTuning<'a> {
    data: &'a Path,
    share: &'a crate::serve::share::ShareDial,
}

/// The memfd runs again while the daemon fine-tunes, at each floor on its share; returns the
/// steps per second it takes with no frames coming, or why the runs were left out. With given
/// data, each floor's runs start a fresh fine-tune from the served weights (reloaded first)
/// and follow its held-out mAP.
fn fine_tuning_runs(
    socket: &Path,
    config: &ServeBenchConfig,
    frame: &Arc<(FrameDesc, Vec<u8>)>,
    tuning: &FineTuning<'_>,
    runs: &mut Vec<ServeRun>,
    progress: &mut impl FnMut(&str),
) -> Result<FineTuneRuns, Error> {
    use fulcrum_board::protocol::{FineTuneParams, FineTuneState};
    let mut control = Client::connect(socket)?;
    let text = tuning
        .data
        .to_str()
        .ok_or_else(|| Error::Config(format!("{}: not UTF-8", tuning.data.display())))?;
    let params = FineTuneParams {
        max_steps: 0,
        epochs: 1000,
        swap_always: false,
        freeze: config.fine_tune_freeze,
        train_biases: config.fine_tune_train_biases,
    };
    control.fine_tune_start(text, params)?;
    // Past its set-up (scoring the served weights, sizing the batch): steps are being taken.
    let started = Instant::now();
    loop {
        let status = control.fine_tune_status()?;
        if status.step >= 2 {
            break;
        }
        if status.state != FineTuneState::Running {
            return Err(Error::Unexpected(
                "the benchmark's fine-tune did not start".into(),
            ));
        }
        if started.elapsed() > Duration::from_secs(120) {
            // A machine this slow (an emulator) has the idle runs; say why these are missing.
            control.fine_tune_stop()?;
            return Ok(FineTuneRuns::TooSlow(format!(
                "the fine-tune took {} step(s) in 120 s: too slow to measure beside",
                status.step
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    progress("fine-tuning with no frames coming");
    let before = (control.fine_tune_status()?.step, Instant::now());
    std::thread::sleep(Duration::from_secs_f64(config.seconds));
    let idle_rate = f64::from(control.fine_tune_status()?.step.saturating_sub(before.0))
        / before.1.elapsed().as_secs_f64();
    let fresh_each = config.fine_tune_data.is_some();
    let seconds = config.fine_tune_seconds.unwrap_or(config.seconds);
    let rates: &[f64] = if config.paced_only {
        &[config.rate]
    } else {
        &[config.rate, 0.0]
    };
    for &share in &config.fine_tune_shares {
        tuning.share.set(share);
        for &rate in rates {
            progress(&format!(
                "memfd frames while fine-tuning with a share of {share}, {}",
                if rate > 0.0 {
                    format!("paced at {rate} frames/s")
                } else {
                    "flat out".into()
                }
            ));
            let asked = if fresh_each {
                // From the served weights again, as a robot's fine-tune would start.
                stop_fine_tune(&mut control)?;
                control.reload(None)?;
                control.fine_tune_start(text, params)?;
                Some(Instant::now())
            } else {
                None
            };
            let before = control.fine_tune_status()?.step;
            let curve = asked.map(|t| CurveSampler::start(socket, t)).transpose()?;
            let mut run = run_clients_for(socket, config, frame, (true, rate), seconds)?;
            run.fine_tuning = true;
            run.fine_tune_share = tuning.share.get();
            let after = control.fine_tune_status()?.step;
            run.fine_tune_steps = if fresh_each {
                after
            } else {
                after.saturating_sub(before)
            };
            if let Some(curve) = curve {
                run.fine_tune_curve = curve.finish()?;
            }
            runs.push(run);
        }
    }
    control.fine_tune_stop()?;
    Ok(FineTuneRuns::Measured {
        idle_steps_per_s: idle_rate,
    })
}

/// How [`fine_tuning_runs`] ended when nothing failed.
enum FineTuneRuns {
    /// The runs are in the report; the fine-tune's steps per second with no frames coming.
    Measured { idle_steps_per_s: f64 },
    /// The machine is too slow to fine-tune beside the frames (an emulator); why.
    TooSlow(String),
}

/// Stops the running fine-tune and waits until it has.
fn stop_fine_tune(control: &mut Client) -> Result<(), Error> {
    use fulcrum_board::protocol::FineTuneState;
    let _ = control.fine_tune_stop();
    let since = Instant::now();
    while matches!(
        control.fine_tune_status()?.state,
        FineTuneState::Running | FineTuneState::Stopping
    ) {
        if since.elapsed() > Duration::from_secs(120) {
            return Err(Error::Unexpected(
                "the benchmark's fine-tune did not stop within 120 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Samples a fine-tune's status four times a second on a connection of its own.
struct CurveSampler {
    done: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Result<Vec<CurvePoint>, Error>>,
}

impl CurveSampler {
    fn start(socket: &Path, asked: Instant) -> Result<Self, Error> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let mut client = Client::connect(socket)?;
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        let thread = std::thread::Builder::new()
            .name("bench-curve".into())
            .spawn(move || {
                let mut points = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let s = client.fine_tune_status()?;
                    points.push(CurvePoint {
                        seconds: asked.elapsed().as_secs_f64(),
                        step: s.step,
                        held_out_map: s.candidate_map.is_finite().then_some(s.candidate_map),
                    });
                    std::thread::sleep(Duration::from_millis(250));
                }
                Ok(points)
            })
            .expect("spawn the curve sampler");
        Ok(CurveSampler { done, thread })
    }

    fn finish(self) -> Result<Vec<CurvePoint>, Error> {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread
            .join()
            .map_err(|_| Error::Unexpected("the curve sampler panicked".into()))?
    }
}
