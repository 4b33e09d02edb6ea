//! `fulcrumd`: the service the robot's firmware talks to. The serving logic is
//! `fulcrum::serve`; this parses options (and a TOML file), wires signals and systemd's
//! directories, and reports.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::Parser;
use fulcrum::compute::exec::EngineChoice;
use fulcrum::serve::settings::{Defaults, Settings};
use fulcrum::serve::{Control, Notifier, ServeConfig, Server};
use fulcrum_tools::{describe, logger};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// Serve detections to the robot's firmware over a Unix socket, as a systemd service.
///
/// Clients (the firmware in C, C++ or Rust, or `fulcrum client`) connect to a SOCK_SEQPACKET
/// socket, are checked by their kernel-reported uid/gid, greet with the protocol's schema
/// hash, then send camera frames (RGB8, BGR8, GRAY8, YUYV, NV12; inline, or zero-copy through
/// a sealed memfd ring) and get detections back in the frame's own pixels.
///
/// Under systemd (Type=notify): READY=1 after the weights are loaded and one warm-up inference
/// ran; STATUS= lines; WATCHDOG=1 from the serving loop at half of WatchdogSec; SIGTERM sends
/// STOPPING=1, finishes in-flight replies and exits 0; SIGHUP (or a client's Reload) loads the
/// weights file again (beside the serving loop, which serves on) and swaps it in only if it is
/// a regular file no larger than a checkpoint can be, loads, and passes a warm-up inference.
/// A second fulcrumd on the same --socket is refused (a lock in SOCKET.lock names its pid).
///
/// Fine-tuning while serving (a client's FineTuneStart, or `fulcrum client --fine-tune DATA`)
/// trains on DATA/train from the served weights in the gaps between requests (at SCHED_IDLE,
/// never starting a step during a request unless --fine-tune-share says training is owed a turn,
/// a step no longer than --fine-tune-slice), checkpoints
/// into the state folder every epoch, scores every checkpoint on DATA/val and swaps it in
/// when its mAP@0.5 beats the served weights'. A daemon killed mid-run resumes at its next start.
///
/// Every option can also be set in a TOML file given with --config (same names, with
/// underscores: `weights = "/var/lib/fulcrumd/model.safetensors"`, `allow_gid = [44]`);
/// options on the command line win.
#[derive(Parser, Debug)]
#[command(name = "fulcrumd", version)]
struct Args {
    /// Checkpoint to serve (`fulcrum train` writes OUT/last.safetensors).
    #[arg(long, value_name = "CHECKPOINT")]
    weights: Option<PathBuf>,
    /// Socket path [default: $RUNTIME_DIRECTORY/fulcrumd.sock, else /run/fulcrumd/fulcrumd.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Compute engine: auto, cpu or vulkan [default: auto].
    #[arg(long)]
    engine: Option<EngineChoice>,
    /// CPU engine threads [default: every core].
    #[arg(long)]
    threads: Option<usize>,
    /// Vulkan device index, as `fulcrum devices` lists them [default: the best].
    #[arg(long)]
    device: Option<usize>,
    /// Run the Vulkan engine's forward convolutions with fp16 operands and f32 sums where the
    /// device offers shaderFloat16, when serving and fine-tuning alike (faster on most GPUs;
    /// about 5e-4 of the largest output in error; gradients stay f32). Ignored, with a log
    /// line, on a device without it; the CPU engine is always f32. `--fp16=false` turns off
    /// the config file's `fp16 = true`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    fp16: Option<bool>,
    /// Also allow clients running as this uid (repeatable); the daemon's own uid and gid are
    /// always allowed.
    #[arg(long = "allow-uid", value_name = "UID")]
    allow_uid: Vec<u32>,
    /// Also allow clients whose primary gid is this (repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    allow_gid: Vec<u32>,
    /// Memory budget (e.g. 64M): the engine, the letterbox scratch, request and reply buffers,
    /// every client's outbox and a second model for reloads are planned before anything is
    /// allocated, and a plan over the budget is refused at start (the plan is logged).
    #[arg(long, value_parser = fulcrum::base::parse_size)]
    mem_budget: Option<u64>,
    /// State folder: fine-tuning's job, checkpoints and swapped-in weights live in its
    /// `fine-tune/` [default: $STATE_DIRECTORY; without either, fine-tuning is refused].
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Most milliseconds one fine-tuning step may hold the engine: the batch is chosen so a
    /// step fits [default: 50].
    #[arg(long, value_name = "MS")]
    fine_tune_slice: Option<u64>,
    /// The share of engine time fine-tuning keeps under load, from 0 to 0.9: while frames keep
    /// coming, the serving loop lets a waiting step run right after its answers whenever
    /// training had less than this share of the last second [default: 0, inference first].
    #[arg(long, value_name = "P")]
    fine_tune_share: Option<f32>,
    /// The base model's own packed training data: every fine-tune mixes records of it into
    /// each batch (as `fulcrum train --replay`), so the model keeps its old places and
    /// classes while it learns the new data. Its classes must be the served model's.
    #[arg(long, value_name = "DIR")]
    fine_tune_replay: Option<PathBuf>,
    /// The share of each fine-tuning batch taken from --fine-tune-replay, above 0 and below 1
    /// [default: 0.25].
    #[arg(long, value_name = "F")]
    fine_tune_replay_fraction: Option<f32>,
    /// Most clients connected at once [default: 16]. When every slot is taken, the oldest
    /// connection that has not sent Hello is closed to make room.
    #[arg(long)]
    max_clients: Option<usize>,
    /// Most connections one uid may hold at once [default: three quarters of --max-clients],
    /// so that one careless program cannot lock the others out.
    #[arg(long, value_name = "N")]
    max_clients_per_uid: Option<usize>,
    /// Milliseconds a new connection has to send Hello before it is closed [default: 2000].
    #[arg(long, value_name = "MS")]
    hello_timeout: Option<u64>,
    /// Largest frame side accepted, pixels [default: 1920].
    #[arg(long)]
    max_frame_side: Option<u16>,
    /// Lowest score returned unless a request asks otherwise [default: 0.3].
    #[arg(long)]
    threshold: Option<f32>,
    /// Most detections per frame [default: 100].
    #[arg(long)]
    top_k: Option<u32>,
    /// Of two detections of a class overlapping by an IoU above this, only the better is
    /// returned; 1 returns every detection [default: 0.6].
    #[arg(long, value_name = "IOU")]
    nms: Option<f32>,
    /// Let clients' Reload name a weights file inside this folder (links resolved); without
    /// it a client's Reload reloads the configured --weights only.
    #[arg(long, value_name = "DIR")]
    client_reload_dir: Option<PathBuf>,
    /// Seconds a reload may take to load and warm up before it is abandoned and the old
    /// weights keep serving [default: 60].
    #[arg(long, value_name = "S")]
    reload_timeout: Option<u64>,
    /// Write the daemon's counters (requests, errors by kind, latency, frame-pass and forward
    /// histograms, fine-tune progress, planned memory and resident memory) to FILE in
    /// Prometheus' text format every --metrics-every seconds, replacing it whole, for
    /// node_exporter's textfile collector (no network listener). The names are listed in the
    /// README.
    #[arg(long, value_name = "FILE")]
    metrics: Option<PathBuf>,
    /// Seconds between metrics writes [default: 5].
    #[arg(long, value_name = "S")]
    metrics_every: Option<u64>,
    /// TOML file with any of the options above.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

static CONTROL: Control = Control::new();

extern "C" fn on_signal(signal: nix::libc::c_int) {
    // Only atomic stores: async-signal-safe.
    if signal == nix::libc::SIGHUP {
        CONTROL.reload.store(true, Ordering::SeqCst);
    } else {
        CONTROL.stop.store(true, Ordering::SeqCst);
    }
}

fn install_signals() {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        if let Err(e) = unsafe { sigaction(sig, &action) } {
            log::warn!("cannot handle {sig}: {e}");
        }
    }
}

fn env_dir(var: &str) -> Option<PathBuf> {
    // systemd may list several folders separated by ':'; the first is ours.
    let value = std::env::var_os(var)?;
    let first = value.to_string_lossy().split(':').next()?.to_string();
    (!first.is_empty()).then(|| PathBuf::from(first))
}

/// The options given on the command line, as settings (unset where not given).
fn settings(args: Args) -> Settings {
    Settings {
        weights: args.weights,
        socket: args.socket,
        engine: args.engine,
        threads: args.threads,
        device: args.device,
        fp16: args.fp16,
        allow_uid: args.allow_uid,
        allow_gid: args.allow_gid,
        mem_budget: args.mem_budget,
        state_dir: args.state_dir,
        fine_tune_slice: args.fine_tune_slice,
        fine_tune_share: args.fine_tune_share,
        fine_tune_replay: args.fine_tune_replay,
        fine_tune_replay_fraction: args.fine_tune_replay_fraction,
        max_clients: args.max_clients,
        max_clients_per_uid: args.max_clients_per_uid,
        hello_timeout: args.hello_timeout,
        max_frame_side: args.max_frame_side,
        threshold: args.threshold,
        top_k: args.top_k,
        nms: args.nms,
        client_reload_dir: args.client_reload_dir,
        reload_timeout: args.reload_timeout,
        metrics: args.metrics,
        metrics_every: args.metrics_every,
    }
}

fn config(args: Args) -> anyhow::Result<ServeConfig> {
    let file = match &args.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    // The Vulkan pipeline cache goes where systemd's CacheDirectory= says.
    if let Some(cache) = env_dir("CACHE_DIRECTORY") {
        if std::env::var_os("XDG_CACHE_HOME").is_none() {
            std::env::set_var("XDG_CACHE_HOME", cache);
        }
    }
    let defaults = Defaults {
        socket: env_dir("RUNTIME_DIRECTORY")
            .unwrap_or_else(|| PathBuf::from("/run/fulcrumd"))
            .join("fulcrumd.sock"),
        state_dir: env_dir("STATE_DIRECTORY"),
        threads: fulcrum_board::host_cores(),
    };
    settings(args)
        .or(file)
        .into_config(defaults)
        .map_err(anyhow::Error::from)
}

fn run(args: Args) -> anyhow::Result<()> {
    let config = config(args)?;
    install_signals();
    let notifier = Notifier::from_env();
    let mut server = Server::start(config, notifier)?;
    let plan = server.memory_plan();
    log::info!(
        "memory planned up front: {}\n{}",
        fulcrum::base::human(plan.total()),
        plan.table().trim_end()
    );
    log::info!(
        "serving on {} ({})",
        server.socket_path().display(),
        server.status_line()
    );
    server.run(&CONTROL)?;
    use fulcrum::base::{human, peak_resident, resident_files};
    match (peak_resident(), resident_files()) {
        (Some(peak), Some(files)) => log::info!(
            "stopped; peak resident memory {} ({} of it the program's code and libraries; \
             planned {})",
            human(peak),
            human(files),
            human(server.memory_plan().total())
        ),
        _ => log::info!("stopped"),
    }
    Ok(())
}

fn main() -> ExitCode {
    logger::init(log::LevelFilter::Info);
    match run(fulcrum_tools::args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{}", describe(&e));
            // As the fulcrum CLI and a bad command line: 2 for every error.
            ExitCode::from(2)
        }
    }
}
