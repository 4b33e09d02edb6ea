//! The serving loop: one thread owns the listening socket, every client and the model. Each
//! round it polls, accepts (checking credentials before reading anything), then reads at most
//! one request per client and answers it, so clients are served in turn and none can starve
//! the others. A reply that does not fit in a client's socket buffer waits in that client's
//! one-reply outbox, and the client is not read again until it drains: a client that stops
//! reading stalls only itself, and is dropped after `stall_timeout`. A connection that sends
//! no `Hello` within `hello_timeout` is closed, and one uid holds at most its share of the
//! slots. New weights (a reload, a fine-tune's swap) load and warm up on a thread beside the
//! loop and are swapped in by a move. Every buffer is sized at start: after warm-up a request
//! allocates nothing.

use std::fmt::Write as _;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fulcrum_board::protocol::{
    self, decode, Detection, DetectionList, DetectionsReply, EngineKind, ErrorCode, ErrorReply,
    Frame, Header, Health, Kind, Message, ServiceState, Stats, Welcome, WireError, HEADER_LEN,
    MAX_INLINE_BYTES, MAX_MESSAGE_LEN, MAX_TEXT, SCHEMA_HASH,
};
use nix::libc;

use super::fine_tune::{self, FineTuner};
use super::frame;
use super::metrics;
use super::notify::Notifier;
use super::ring::ClientRing;
use super::share::{ShareDial, ShareFloor};
use super::socket::{self, PeerCredentials, Received};
use super::stats::LatencyHistogram;
use super::Error;
use crate::base::MemoryPlan;
use crate::compute::exec::ExecOptions;
use crate::infer::predict::Predictor;
use crate::infer::Scored;
use crate::model::Checkpoint;

/// What the daemon serves and its limits.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub socket: PathBuf,
    pub weights: PathBuf,
    pub exec: ExecOptions,
    /// Lowest score returned when a request does not ask for more.
    pub threshold: f32,
    /// Most detections a frame gives.
    pub top_k: u32,
    /// Duplicate suppression's IoU limit (see [`crate::infer::nms`]; 1: none).
    pub nms_iou: f32,
    /// Peers allowed besides the daemon's own uid and gid.
    pub allow_uids: Vec<u32>,
    pub allow_gids: Vec<u32>,
    pub max_clients: usize,
    /// Most connections one uid may hold at once; `None`: three quarters of `max_clients`
    /// (see [`ServeConfig::per_uid_limit`]).
    pub max_clients_per_uid: Option<usize>,
    /// A connection that has not sent `Hello` this long after it was accepted is closed.
    pub hello_timeout: Duration,
    /// Largest frame side accepted (scratch for letterboxing is sized for it).
    pub max_frame_side: u16,
    /// Largest memfd ring a client may attach.
    pub max_ring_bytes: u64,
    /// A client whose reply has waited this long for it to read is dropped.
    pub stall_timeout: Duration,
    /// Where fine-tuning keeps its checkpoints; `None`: no fine-tuning.
    pub state_dir: Option<PathBuf>,
    /// Most time one fine-tuning step may hold the engine.
    pub fine_tune_slice: Duration,
    /// The share of engine time fine-tuning keeps under load (0: inference first alone). See
    /// [`super::share`].
    pub fine_tune_share: f32,
    /// The base model's own packed data, mixed into every fine-tune's batches so that it keeps
    /// what it knew (`train --replay`); `None`: fine-tunes see the new data alone.
    pub fine_tune_replay: Option<PathBuf>,
    /// The share of each batch the replay data takes.
    pub fine_tune_replay_fraction: f32,
    /// A client's `Reload` may name a file only inside this folder (after links are
    /// resolved); `None`: clients reload the configured weights only.
    pub client_reload_dir: Option<PathBuf>,
    /// A reload (or a fine-tuned swap) not loaded and warmed up within this is abandoned and
    /// the old weights keep serving.
    pub reload_timeout: Duration,
    /// Where to write the counters for Prometheus ([`super::metrics`]), and how often.
    pub metrics: Option<PathBuf>,
    pub metrics_every: Duration,
}

impl ServeConfig {
    pub fn new(socket: PathBuf, weights: PathBuf, exec: ExecOptions) -> Self {
        ServeConfig {
            socket,
            weights,
            exec,
            threshold: 0.3,
            top_k: 100,
            nms_iou: crate::infer::nms::DEFAULT_NMS_IOU,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            max_clients: 16,
            max_clients_per_uid: None,
            hello_timeout: Duration::from_secs(2),
            max_frame_side: DEFAULT_MAX_FRAME_SIDE,
            max_ring_bytes: 256 << 20,
            stall_timeout: Duration::from_secs(10),
            state_dir: None,
            fine_tune_slice: Duration::from_millis(50),
            fine_tune_share: 0.0,
            fine_tune_replay: None,
            fine_tune_replay_fraction: crate::train::DEFAULT_REPLAY_FRACTION,
            client_reload_dir: None,
            reload_timeout: Duration::from_secs(60),
            metrics: None,
            metrics_every: Duration::from_secs(5),
        }
    }

    /// Everything the daemon allocates to serve `model`, item by item, computed before any of
    /// it is: the engine's tensors, the letterbox scratch for the largest frame, the buffers
    /// for requests and replies, every client's outbox, and a second model while a reload
    /// warms up. (Clients' memfd rings are the clients' memory, mapped, not allocated here.)
    pub fn plan(&self, model: &crate::model::ModelConfig) -> Result<MemoryPlan, Error> {
        let max_side = u32::from(self.max_frame_side);
        let engine =
            Predictor::plan(model, &self.exec, self.top_k, max_side).map_err(|e| match e {
                crate::infer::Error::Exec(e) => Error::Engine(e),
                e => Error::Config(format!("planning {}: {e}", self.weights.display())),
            })?;
        let mut plan = engine.clone();
        plan.add("request buffer", 1, (MAX_MESSAGE_LEN + 1) as u64);
        plan.add("reply buffer", 1, self.max_reply() as u64);
        plan.add(
            "client outboxes",
            self.max_clients as u64,
            self.max_reply() as u64,
        );
        plan.add(
            "detections on the host",
            2,
            u64::from(self.top_k) * std::mem::size_of::<Scored>() as u64,
        );
        plan.add("second model while a reload warms up", 1, engine.total());
        Ok(plan)
    }

    /// Most connections one uid may hold: as set, else three quarters of all the slots (at
    /// least one), so that one careless program cannot take every slot from the others.
    pub fn per_uid_limit(&self) -> usize {
        self.max_clients_per_uid
            .unwrap_or_else(|| (self.max_clients * 3).div_ceil(4))
            .clamp(1, self.max_clients.max(1))
    }

    /// Bytes of the largest reply (a full detections reply, or an error with the longest text).
    fn max_reply(&self) -> usize {
        let detections = DetectionsReply::FIXED_LEN + self.top_k as usize * Detection::LEN;
        HEADER_LEN + detections.max(4 + MAX_TEXT).max(Stats::LEN)
    }
}

/// The largest frame side a daemon accepts unless told otherwise (`--max-frame-side`).
pub const DEFAULT_MAX_FRAME_SIDE: u16 = 1920;

/// Asks a running [`Server`] to stop or reload; set from signal handlers or another thread.
#[derive(Debug, Default)]
pub struct Control {
    pub stop: AtomicBool,
    pub reload: AtomicBool,
}

impl Control {
    /// For a `static` that signal handlers set.
    pub const fn new() -> Self {
        Control {
            stop: AtomicBool::new(false),
            reload: AtomicBool::new(false),
        }
    }
}

/// Counters since start.
#[derive(Clone, Default)]
struct Counters {
    requests: u64,
    errors: u64,
    refused: u32,
    /// Connections closed for not sending `Hello` in time, or to make room for a new one.
    hello_timeouts: u64,
    evicted: u64,
    reload_failures: u64,
    errors_by_code: [u64; metrics::ERROR_KINDS],
    latency: LatencyHistogram,
    engine: LatencyHistogram,
    frame_pass: LatencyHistogram,
}

/// A model loaded and warmed up, with its memory plan, or why not.
type LoadedModel = Result<(Model, MemoryPlan), Error>;

/// The model being served and what it was loaded from.
struct Model {
    predictor: Predictor,
    /// The engine as `Predictor::engine` describes it.
    engine: String,
    classes: u16,
    /// Class names, one a line, as `Classes` sends them (cut to the protocol's limit).
    names: String,
    path: PathBuf,
}

impl Model {
    /// Loads `path`, checks the memory plan for its model against the budget, sizes every
    /// buffer for the largest frame, runs one warm-up inference on a grey frame and checks
    /// its output.
    fn load(path: &Path, config: &ServeConfig) -> LoadedModel {
        let checkpoint = Checkpoint::load(path).map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let plan = config.plan(&checkpoint.model)?;
        if !plan.fits(config.exec.mem_budget) {
            return Err(Error::Budget {
                needed: plan.total(),
                budget: config.exec.mem_budget.unwrap_or(0),
                table: plan.table(),
            });
        }
        // Decoded at a threshold of 0 and filtered per request: a request may ask for less
        // than the daemon's default. Top-K by score, then the threshold, keeps what the
        // threshold, then top-K, would; suppression only ever removes a lower score.
        let mut predictor = Predictor::new(&checkpoint, &config.exec, 0.0, config.top_k)
            .map_err(|e| Error::from_infer(path, e))?;
        predictor
            .set_nms_iou(config.nms_iou)
            .map_err(|e| Error::Config(format!("--nms: {e}")))?;
        // Buffers sized for the largest frame up front; the warm-up frame itself is the
        // model's input size (a largest-size frame was 10.5 MiB at 1920 px, held only for
        // the warm-up and the process's peak resident memory ever after).
        predictor
            .reserve_sources(u32::from(config.max_frame_side))
            .map_err(|e| Error::from_infer(path, e))?;
        let side = checkpoint.model.input;
        let grey = image::RgbImage::from_pixel(side, side, image::Rgb([114, 114, 114]));
        let mut out = Vec::with_capacity(predictor.top_k());
        predictor
            .predict_into(
                &crate::pixels::Pixels::rgb8(&grey).expect("a model input is not empty"),
                None,
                &mut out,
            )
            .map_err(|e| Error::from_infer(path, e).while_doing("warm-up inference failed"))?;
        if let Some(bad) = out
            .iter()
            .find(|d| !d.score.is_finite() || !d.x0.is_finite())
        {
            return Err(Error::Weights {
                path: path.to_path_buf(),
                reason: format!(
                    "warm-up inference gave a non-finite detection {bad:?}: corrupt weights?"
                ),
            });
        }
        // The Vulkan driver's own resident memory, measured as it loaded, as a line of its own.
        let plan = predictor.with_driver(plan);
        let model = Model {
            engine: predictor.engine(),
            classes: checkpoint.classes.len().min(usize::from(u16::MAX)) as u16,
            names: class_lines(&checkpoint.classes),
            predictor,
            path: path.to_path_buf(),
        };
        Ok((model, plan))
    }
}

/// Class names one a line, as many as fit in a `Classes` message; names are cleaned of
/// newlines and NULs (they come from dataset files).
fn class_lines(classes: &[String]) -> String {
    let mut out = String::new();
    for name in classes {
        let clean: String = name
            .chars()
            .map(|c| if c == '\n' || c == '\0' { ' ' } else { c })
            .collect();
        if out.len() + clean.len() + 1 > protocol::MAX_CLASS_TEXT {
            log::warn!(
                "class names past {} bytes are not sent to clients",
                protocol::MAX_CLASS_TEXT
            );
            break;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&clean);
    }
    out
}

struct Client {
    fd: OwnedFd,
    cred: PeerCredentials,
    greeted: bool,
    /// When it was accepted: the `Hello` deadline counts from here.
    connected: Instant,
    /// Unique for the daemon's life: tells a connection from a later one in the same slot.
    id: u64,
    ring: Option<ClientRing>,
    /// A reply the socket had no room for, and since when.
    pending: Vec<u8>,
    pending_since: Option<Instant>,
}

/// What to do with a connection after a reply.
#[derive(PartialEq, Eq)]
enum After {
    KeepOpen,
    Close,
}

pub struct Server {
    config: ServeConfig,
    listener: socket::Listener,
    own: PeerCredentials,
    model: Model,
    generation: u32,
    state: ServiceState,
    clients: Vec<Option<Client>>,
    pollfds: Vec<libc::pollfd>,
    recv: Vec<u8>,
    cmsg: Vec<u8>,
    send: Vec<u8>,
    scored: Vec<Scored>,
    wire: Vec<Detection>,
    text: heapless::String<MAX_TEXT>,
    counters: Counters,
    started: Instant,
    last_progress: Instant,
    notifier: Notifier,
    plan: MemoryPlan,
    fine_tune: Option<FineTuner>,
    /// The books of fine-tuning's floor on engine time.
    share_floor: ShareFloor,
    /// Weights loading and warming up on a thread of their own.
    loading: Option<Loading>,
    /// Connections accepted since start (each client's `id`).
    connections: u64,
    /// When writing the metrics last failed (to log it once a minute at most).
    metrics_failed: Option<Instant>,
}

/// Weights loading and warming up beside the serving loop, which goes on serving the old
/// ones (and answering SIGTERM and the watchdog) until they are ready or the deadline passes.
struct Loading {
    handle: std::thread::JoinHandle<LoadedModel>,
    started: Instant,
    path: PathBuf,
    why: LoadReason,
}

enum LoadReason {
    /// SIGHUP, or a client's `Reload`, answered when the load ends.
    Reload { requester: Option<Requester> },
    /// Fine-tuned weights that scored `map` on held-out data.
    FineTuned { map: f32 },
}

/// The connection a reply is owed to.
struct Requester {
    slot: usize,
    client: u64,
    header: Header,
}

/// Most clients one daemon serves at once: each holds an outbox and a poll slot.
pub const MAX_CLIENTS: usize = 1024;

impl Server {
    /// Loads and warms up the model, then binds the socket: a daemon that is listening is one
    /// that can answer.
    pub fn start(config: ServeConfig, notifier: Notifier) -> Result<Server, Error> {
        if config.max_clients == 0 || config.top_k == 0 || config.max_frame_side == 0 {
            return Err(Error::Config(
                "--max-clients, --top-k and --max-frame-side must be at least 1".into(),
            ));
        }
        if config.max_clients > MAX_CLIENTS {
            return Err(Error::Config(format!(
                "--max-clients {} is over {MAX_CLIENTS}",
                config.max_clients
            )));
        }
        if config.top_k > u32::from(protocol::MAX_DETECTIONS) {
            return Err(Error::Config(format!(
                "--top-k {} is over the protocol's limit of {} detections per frame",
                config.top_k,
                protocol::MAX_DETECTIONS
            )));
        }
        if config.max_frame_side > protocol::MAX_FRAME_SIDE {
            return Err(Error::Config(format!(
                "--max-frame-side {} is over the protocol's limit of {}",
                config.max_frame_side,
                protocol::MAX_FRAME_SIDE
            )));
        }
        // Before the slow part: a second daemon on a live socket is refused at once.
        let claim = socket::SocketClaim::take(&config.socket).map_err(|e| Error::Io {
            what: format!("claiming {}", config.socket.display()),
            source: e,
        })?;
        log::info!(
            "loading {} and warming up (engine {:?})",
            config.weights.display(),
            config.exec.engine
        );
        let mut fine_tuner = config.state_dir.as_ref().map(|dir| {
            let mut settings = fine_tune::Settings::new(dir.clone(), config.exec.clone());
            settings.slice = config.fine_tune_slice;
            settings.replay = config.fine_tune_replay.clone();
            settings.replay_fraction = config.fine_tune_replay_fraction;
            FineTuner::new(settings)
        });
        let swapped = fine_tuner
            .as_ref()
            .and_then(|f| f.settings().swapped_weights(&config.weights));
        let (model, plan) = match swapped {
            Some(path) => match Model::load(&path, &config) {
                Ok(loaded) => {
                    log::info!(
                        "serving {}, fine-tuned from {} (delete it to serve the original)",
                        path.display(),
                        config.weights.display()
                    );
                    loaded
                }
                Err(e) => {
                    log::warn!("the fine-tuned weights do not load ({e}); serving the original");
                    Model::load(&config.weights, &config)?
                }
            },
            None => Model::load(&config.weights, &config)?,
        };
        if let Some(f) = fine_tuner.as_mut() {
            // Fine-tuning gets what the budget leaves after serving.
            f.settle(
                model.predictor.is_vulkan(),
                config
                    .exec
                    .mem_budget
                    .map(|b| b.saturating_sub(plan.total())),
            );
            if let Err(e) = f.resume_saved(&model.path) {
                log::error!("fine-tune: cannot resume: {e}");
            }
        }
        let listener = claim.bind(64).map_err(|e| Error::Io {
            what: format!("binding {}", config.socket.display()),
            source: e,
        })?;
        let own = PeerCredentials {
            pid: std::process::id() as i32,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        let max_reply = config.max_reply();
        let share_floor = ShareFloor::new(ShareDial::new(config.fine_tune_share));
        let mut clients = Vec::with_capacity(config.max_clients);
        clients.resize_with(config.max_clients, || None);
        Ok(Server {
            pollfds: Vec::with_capacity(config.max_clients + 1),
            recv: vec![0; MAX_MESSAGE_LEN + 1],
            cmsg: socket::cmsg_buffer(),
            send: vec![0; max_reply],
            scored: Vec::with_capacity(config.top_k as usize),
            wire: Vec::with_capacity(config.top_k as usize),
            text: heapless::String::new(),
            clients,
            config,
            listener,
            own,
            model,
            generation: 1,
            state: ServiceState::Ready,
            counters: Counters::default(),
            started: Instant::now(),
            last_progress: Instant::now(),
            notifier,
            plan,
            fine_tune: fine_tuner,
            share_floor,
            loading: None,
            connections: 0,
            metrics_failed: None,
        })
    }

    /// What the daemon planned and allocated up front for the model it serves.
    /// The fine-tune's floor on engine time, settable while the loop runs.
    pub fn fine_tune_share(&self) -> ShareDial {
        self.share_floor.dial.clone()
    }

    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// A one-line summary for logs and systemd's STATUS=.
    pub fn status_line(&self) -> String {
        let mut line = String::new();
        self.write_status(&mut line);
        line
    }

    fn write_status(&self, out: &mut String) {
        let c = &self.counters;
        out.clear();
        let _ = write!(
            out,
            "{} on {}; {} client(s), {} request(s), p99 {} µs, {} error(s), weights generation {}",
            self.model.path.display(),
            self.model.engine,
            self.clients.iter().flatten().count(),
            c.requests,
            c.latency.quantile(0.99),
            c.errors,
            self.generation
        );
        if let Some(f) = &self.fine_tune {
            f.write_status(out);
            let floor = &self.share_floor;
            if floor.turns > 0 {
                let _ = write!(
                    out,
                    "; {} turn(s) for the fine-tune's share, {} ms in all",
                    floor.turns,
                    floor.turned.as_millis()
                );
            }
        }
    }

    /// Writes the counters to `--metrics FILE`, if set; a failure is logged once a minute at
    /// most (a full disk must not flood the journal).
    fn write_metrics(&mut self, exposition: &mut String) {
        let Some(path) = &self.config.metrics else {
            return;
        };
        let c = &self.counters;
        let snapshot = metrics::Snapshot {
            uptime_s: self.started.elapsed().as_secs_f64(),
            requests: c.requests,
            errors_by_code: &c.errors_by_code,
            refused: u64::from(c.refused),
            hello_timeouts: c.hello_timeouts,
            evicted: c.evicted,
            reload_failures: c.reload_failures,
            clients: self.clients.iter().flatten().count(),
            weights_generation: self.generation,
            latency: &c.latency,
            frame_pass: &c.frame_pass,
            forward: &c.engine,
            planned_bytes: self.plan.total(),
            resident_bytes: crate::base::resident(),
            fine_tune: self.fine_tune.as_ref().map(FineTuner::status),
        };
        metrics::render(exposition, &snapshot);
        if let Err(e) = metrics::write(path, exposition) {
            let quiet = self
                .metrics_failed
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60));
            if !quiet {
                log::warn!("writing the metrics to {}: {e}", path.display());
                self.metrics_failed = Some(Instant::now());
            }
        }
    }

    pub fn socket_path(&self) -> &Path {
        &self.config.socket
    }

    /// Serves until `control.stop` is set; then finishes the round, flushes what clients can
    /// take, closes them and removes the socket.
    pub fn run(&mut self, control: &Control) -> Result<(), Error> {
        // Kept between updates, so that a STATUS= line allocates nothing once it has grown.
        let mut status = String::with_capacity(512);
        self.write_status(&mut status);
        self.notifier.ready(&status);
        let mut last_status = Instant::now();
        // Kept too: an exposition allocates nothing once it has grown.
        let mut exposition = String::new();
        let mut last_metrics = Instant::now();
        self.write_metrics(&mut exposition);
        while !control.stop.load(Ordering::SeqCst) {
            // A SIGHUP during a load waits for it to end.
            if self.loading.is_none() && control.reload.swap(false, Ordering::SeqCst) {
                let path = self.config.weights.clone();
                self.start_loading(path, LoadReason::Reload { requester: None });
            }
            self.finish_loading();
            self.swap_fine_tuned();
            self.round()?;
            self.last_progress = Instant::now();
            self.notifier.progress();
            if self.config.metrics.is_some() && last_metrics.elapsed() >= self.config.metrics_every
            {
                self.write_metrics(&mut exposition);
                last_metrics = Instant::now();
            }
            if self.notifier.is_active() && last_status.elapsed() >= Duration::from_secs(5) {
                self.write_status(&mut status);
                self.notifier.status(&status);
                last_status = Instant::now();
            }
        }
        self.write_metrics(&mut exposition);
        self.state = ServiceState::Stopping;
        self.notifier.stopping();
        log::info!("stopping: {}", self.status_line());
        self.shutdown();
        Ok(())
    }

    /// Starts loading `path` on a thread of its own (at normal priority: its engine threads
    /// then serve at that priority). The outcome is installed by [`Server::finish_loading`].
    fn start_loading(&mut self, path: PathBuf, why: LoadReason) {
        let config = self.config.clone();
        let load_path = path.clone();
        let spawned = std::thread::Builder::new()
            .name("weights-load".into())
            .spawn(move || {
                let loaded = Model::load(&load_path, &config);
                release_free_heap();
                loaded
            });
        match spawned {
            Ok(handle) => {
                log::info!("loading {} beside the serving loop", path.display());
                self.notifier.reloading();
                self.state = ServiceState::Reloading;
                self.loading = Some(Loading {
                    handle,
                    started: Instant::now(),
                    path,
                    why,
                });
            }
            Err(e) => {
                let e = Error::Io {
                    what: format!("starting to load {}", path.display()),
                    source: e,
                };
                self.settle_load(why, Err(e), Duration::ZERO);
            }
        }
    }

    /// Installs what finished loading, or gives up on a load past its deadline (its thread is
    /// left to end on its own; what it loads is dropped). Either way the reply owed, the log
    /// line and systemd's state follow.
    fn finish_loading(&mut self) {
        let Some(loading) = &self.loading else {
            return;
        };
        let timed_out = loading.started.elapsed() > self.config.reload_timeout;
        if !loading.handle.is_finished() && !timed_out {
            return;
        }
        let Some(loading) = self.loading.take() else {
            return;
        };
        let loaded = if loading.handle.is_finished() {
            loading
                .handle
                .join()
                .unwrap_or_else(|_| Err(Error::Config("loading the weights panicked".into())))
        } else {
            Err(Error::Weights {
                path: loading.path.clone(),
                reason: format!(
                    "not loaded and warmed up within {:?} (--reload-timeout); abandoned",
                    self.config.reload_timeout
                ),
            })
        };
        let outcome = self.install(loaded);
        self.settle_load(loading.why, outcome, loading.started.elapsed());
    }

    /// Reports a load's outcome: the log, the requester's reply, the fine-tune's bookkeeping.
    fn settle_load(&mut self, why: LoadReason, outcome: Result<(), Error>, took: Duration) {
        self.state = ServiceState::Ready;
        match why {
            LoadReason::Reload { requester } => {
                match &outcome {
                    Ok(()) => log::info!(
                        "reloaded weights from {} (generation {}; loaded and warmed up in {} ms \
                         beside the serving loop)",
                        self.model.path.display(),
                        self.generation,
                        took.as_millis()
                    ),
                    Err(e) => log::error!("reload refused, the old weights keep serving: {e}"),
                }
                if let Some(r) = requester {
                    let still_there = self.clients[r.slot]
                        .as_ref()
                        .is_some_and(|c| c.id == r.client);
                    if still_there {
                        match &outcome {
                            Ok(()) => {
                                self.reply_message(r.slot, &r.header, &Message::Ack(Kind::Reload))
                            }
                            Err(e) => {
                                self.set_text(&e.to_string());
                                self.reply_error(
                                    r.slot,
                                    r.header.sequence,
                                    r.header.timestamp_us,
                                    ErrorCode::RELOAD_FAILED,
                                );
                            }
                        }
                    }
                }
            }
            LoadReason::FineTuned { map } => {
                let swapped = match &outcome {
                    Ok(()) => {
                        log::info!(
                            "swapped in fine-tuned weights {} (held-out mAP {map:.4}, generation {})",
                            self.model.path.display(),
                            self.generation
                        );
                        Some(map)
                    }
                    Err(e) => {
                        log::error!("fine-tuned weights refused, the old ones keep serving: {e}");
                        None
                    }
                };
                if let Some(f) = &self.fine_tune {
                    f.swap_settled(swapped);
                }
            }
        }
        if outcome.is_err() {
            self.counters.reload_failures += 1;
        }
        self.notifier.reloaded(&self.status_line());
    }

    /// Puts a loaded model in service (the old one is dropped on a thread of its own, so that
    /// freeing a large model does not stall requests), or leaves the old one serving.
    fn install(&mut self, loaded: LoadedModel) -> Result<(), Error> {
        let (model, plan) = loaded?;
        let old = std::mem::replace(&mut self.model, model);
        self.plan = plan;
        self.generation += 1;
        let dropped = std::thread::Builder::new()
            .name("weights-drop".into())
            .spawn(move || {
                drop(old);
                release_free_heap();
            });
        if let Err(e) = dropped {
            log::warn!("freeing the old weights on the serving loop ({e})");
        }
        Ok(())
    }

    /// Starts loading weights the fine-tune offers (they scored better on held-out data),
    /// unless another load is under way (the offer then waits).
    fn swap_fine_tuned(&mut self) {
        if self.loading.is_some() {
            return;
        }
        let Some((path, map)) = self.fine_tune.as_ref().and_then(FineTuner::take_swap) else {
            return;
        };
        self.start_loading(path, LoadReason::FineTuned { map });
    }

    /// The file a client's `Reload` names, if it may: empty is the configured weights; any
    /// other path only inside `--client-reload-dir`, links resolved.
    fn client_reload_path(&self, path: &str) -> Result<PathBuf, ReloadRefused> {
        if path.is_empty() {
            return Ok(self.config.weights.clone());
        }
        let Some(dir) = &self.config.client_reload_dir else {
            return Err(ReloadRefused::NoReloadDir(path.to_owned()));
        };
        let dir = dir
            .canonicalize()
            .map_err(|source| ReloadRefused::Unresolved {
                what: format!("--client-reload-dir {}", dir.display()),
                source,
            })?;
        let resolved =
            Path::new(path)
                .canonicalize()
                .map_err(|source| ReloadRefused::Unresolved {
                    what: path.to_owned(),
                    source,
                })?;
        if !resolved.starts_with(&dir) {
            return Err(ReloadRefused::Outside {
                path: path.to_owned(),
                resolved,
                dir,
            });
        }
        Ok(resolved)
    }

    fn timeout(&self) -> libc::c_int {
        // Weights loading on the side are swapped in soon after they are ready.
        let cap = Duration::from_millis(if self.loading.is_some() { 5 } else { 200 });
        let every = self.notifier.watchdog_every().unwrap_or(cap).min(cap);
        every.as_millis().max(1) as libc::c_int
    }

    /// One poll and one turn of every ready client.
    fn round(&mut self) -> Result<(), Error> {
        self.pollfds.clear();
        self.pollfds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for client in &self.clients {
            let (fd, events) = match client {
                Some(c) if c.pending_since.is_some() => (c.fd.as_raw_fd(), libc::POLLOUT),
                Some(c) => (c.fd.as_raw_fd(), libc::POLLIN),
                None => (-1, 0), // poll ignores negative fds
            };
            self.pollfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
        let timeout = self.timeout();
        // SAFETY: the pointer and length describe `pollfds`, a live Vec not touched until poll
        // returns; poll only writes the `revents` fields.
        let n = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                timeout,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(Error::Io {
                what: "poll".into(),
                source: e,
            });
        }
        // No fine-tuning step starts while requests are answered.
        let busy = n > 0;
        let answering = Instant::now();
        if let (true, Some(f)) = (busy, &self.fine_tune) {
            f.set_serving_busy(true);
        }
        // Clients first: a hang-up seen in this poll frees its slot before new connections are
        // accepted (a firmware restarting after a crash must not find its own old slot taken).
        for slot in 0..self.clients.len() {
            let revents = self.pollfds[slot + 1].revents;
            if self.clients[slot].is_none() {
                continue;
            }
            if revents & libc::POLLOUT != 0 {
                self.flush(slot);
            }
            if revents & libc::POLLIN != 0 {
                self.serve_one(slot);
            } else if revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                self.drop_client(slot, "hung up");
            }
            self.check_stall(slot);
            self.check_hello(slot);
        }
        if self.pollfds[0].revents & libc::POLLIN != 0 {
            self.accept_clients();
        }
        if let (true, Some(f)) = (busy, &self.fine_tune) {
            // Right after the answers, when the next request is furthest away: a step owed
            // its share of the engine runs now ([`super::share`]).
            self.share_floor.served(answering.elapsed());
            f.keep_floor(&mut self.share_floor);
            f.set_serving_busy(false);
        }
        Ok(())
    }

    fn allowed(&self, cred: &PeerCredentials) -> bool {
        cred.uid == self.own.uid
            || cred.gid == self.own.gid
            || self.config.allow_uids.contains(&cred.uid)
            || self.config.allow_gids.contains(&cred.gid)
    }

    fn accept_clients(&mut self) {
        loop {
            let (fd, cred) = match socket::accept(self.listener.as_fd()) {
                Ok(Some(c)) => c,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("accepting a client: {e}");
                    return;
                }
            };
            if !self.allowed(&cred) {
                self.counters.refused += 1;
                log::warn!(
                    "refused a client: pid {} uid {} gid {} is not allowed (allow it with --allow-uid {} or --allow-gid {})",
                    cred.pid, cred.uid, cred.gid, cred.uid, cred.gid
                );
                self.text.clear();
                let _ = write!(
                    self.text,
                    "uid {} gid {} may not use this daemon; ask for --allow-uid or --allow-gid",
                    cred.uid, cred.gid
                );
                self.send_error_to(fd.as_fd(), 0, ErrorCode::NOT_ALLOWED);
                continue;
            }
            let Some(slot) = self.free_slot_for(&cred) else {
                self.counters.refused += 1;
                let held = self.held_by(cred.uid);
                let per_uid = self.config.per_uid_limit();
                self.text.clear();
                if held >= per_uid {
                    log::warn!(
                        "refused a client (pid {}): uid {} holds {held} connections, its limit \
                         (--max-clients-per-uid)",
                        cred.pid,
                        cred.uid
                    );
                    let _ = write!(
                        self.text,
                        "uid {} holds {held} connections, its limit; close one and try again",
                        cred.uid
                    );
                } else {
                    log::warn!(
                        "refused a client (pid {}): all {} client slots are taken",
                        cred.pid,
                        self.clients.len()
                    );
                    let _ = write!(
                        self.text,
                        "all {} client slots are taken; try again later",
                        self.clients.len()
                    );
                }
                self.send_error_to(fd.as_fd(), 0, ErrorCode::BUSY);
                continue;
            };
            log::debug!("client {slot}: pid {} uid {} connected", cred.pid, cred.uid);
            self.clients[slot] = Some(Client {
                fd,
                cred,
                greeted: false,
                connected: Instant::now(),
                id: {
                    self.connections += 1;
                    self.connections
                },
                ring: None,
                pending: Vec::with_capacity(self.send.len()),
                pending_since: None,
            });
        }
    }

    /// Connections `uid` holds.
    fn held_by(&self, uid: u32) -> usize {
        self.clients
            .iter()
            .flatten()
            .filter(|c| c.cred.uid == uid)
            .count()
    }

    /// A slot for a new connection from `cred`: a free one within its uid's limit, else one
    /// freed by closing the oldest connection that has sent nothing yet (of the same uid when
    /// the uid is at its limit): connections that never greet cannot lock real clients out.
    fn free_slot_for(&mut self, cred: &PeerCredentials) -> Option<usize> {
        let at_uid_limit = self.held_by(cred.uid) >= self.config.per_uid_limit();
        if !at_uid_limit {
            if let Some(slot) = self.clients.iter().position(Option::is_none) {
                return Some(slot);
            }
        }
        let oldest_silent = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.as_ref().map(|c| (slot, c)))
            // A connection whose Hello waits unread is not silent: it is served next round.
            .filter(|(_, c)| !c.greeted && (!at_uid_limit || c.cred.uid == cred.uid))
            .filter(|(_, c)| !socket::has_pending(c.fd.as_fd()))
            .min_by_key(|(_, c)| c.connected)
            .map(|(slot, _)| slot)?;
        self.counters.evicted += 1;
        log::warn!(
            "client {oldest_silent} (pid {}): closed without a Hello to make room for pid {}",
            self.peer_pid(oldest_silent),
            cred.pid
        );
        self.text.clear();
        let _ = write!(self.text, "closed to make room: no Hello since connecting");
        if let Some(c) = self.clients[oldest_silent].take() {
            self.send_error_to(c.fd.as_fd(), 0, ErrorCode::BUSY);
        }
        Some(oldest_silent)
    }

    /// Best effort: an error to a connection about to be closed.
    fn send_error_to(&mut self, fd: std::os::fd::BorrowedFd<'_>, sequence: u32, code: ErrorCode) {
        self.counters.errors += 1;
        self.counters.errors_by_code[metrics::error_slot(code)] += 1;
        let msg = Message::Error(ErrorReply::new(code, &self.text));
        if let Ok(n) = msg.encode(sequence, 0, &mut self.send) {
            let _ = socket::send_packet(fd, &self.send[..n], None);
        }
    }

    fn drop_client(&mut self, slot: usize, why: &str) {
        if let Some(c) = self.clients[slot].take() {
            log::debug!("client {slot} (pid {}): {why}", c.cred.pid);
        }
    }

    fn check_stall(&mut self, slot: usize) {
        let stalled = matches!(&self.clients[slot], Some(Client { pending_since: Some(t), .. })
            if t.elapsed() > self.config.stall_timeout);
        if stalled {
            log::warn!(
                "client {slot}: not reading its replies for {:?}; disconnected",
                self.config.stall_timeout
            );
            self.drop_client(slot, "stalled");
        }
    }

    fn check_hello(&mut self, slot: usize) {
        let late = matches!(&self.clients[slot], Some(c)
            if !c.greeted && c.connected.elapsed() > self.config.hello_timeout);
        if late {
            self.counters.hello_timeouts += 1;
            log::warn!(
                "client {slot} (pid {}): no Hello within {:?}; disconnected",
                self.peer_pid(slot),
                self.config.hello_timeout
            );
            self.text.clear();
            let _ = write!(
                self.text,
                "no Hello within {} ms of connecting; closed",
                self.config.hello_timeout.as_millis()
            );
            if let Some(c) = self.clients[slot].take() {
                self.send_error_to(c.fd.as_fd(), 0, ErrorCode::UNEXPECTED);
            }
        }
    }

    fn flush(&mut self, slot: usize) {
        let Some(client) = self.clients[slot].as_mut() else {
            return;
        };
        match socket::send_packet(client.fd.as_fd(), &client.pending, None) {
            Ok(true) => {
                client.pending.clear();
                client.pending_since = None;
            }
            Ok(false) => {}
            Err(e) => self.drop_client(slot, &format!("send failed: {e}")),
        }
    }

    /// Sends `self.send[..len]` to a client now, or keeps it in its outbox.
    fn reply(&mut self, slot: usize, len: usize) {
        let Some(client) = self.clients[slot].as_mut() else {
            return;
        };
        match socket::send_packet(client.fd.as_fd(), &self.send[..len], None) {
            Ok(true) => {}
            Ok(false) => {
                client.pending.clear();
                client.pending.extend_from_slice(&self.send[..len]);
                client.pending_since = Some(Instant::now());
            }
            Err(e) => self.drop_client(slot, &format!("send failed: {e}")),
        }
    }

    /// An error reply with `self.text`.
    fn reply_error(&mut self, slot: usize, sequence: u32, timestamp: u64, code: ErrorCode) {
        self.counters.errors += 1;
        self.counters.errors_by_code[metrics::error_slot(code)] += 1;
        let msg = Message::Error(ErrorReply::new(code, &self.text));
        match msg.encode(sequence, timestamp, &mut self.send) {
            Ok(n) => self.reply(slot, n),
            Err(e) => log::error!("encoding an error reply: {e}"),
        }
    }

    fn reply_message(&mut self, slot: usize, header: &Header, msg: &Message<'_>) {
        match msg.encode(header.sequence, header.timestamp_us, &mut self.send) {
            Ok(n) => self.reply(slot, n),
            Err(e) => log::error!("encoding a {:?} reply: {e}", msg.kind()),
        }
    }

    /// Reads one packet from a client and answers it.
    fn serve_one(&mut self, slot: usize) {
        let received = {
            let Some(client) = self.clients[slot].as_ref() else {
                return;
            };
            socket::recv_packet(client.fd.as_fd(), &mut self.recv, &mut self.cmsg)
        };
        let arrived = Instant::now();
        let (len, fd) = match received {
            Ok(Received::Packet { len, fd }) if len <= MAX_MESSAGE_LEN => (len, fd),
            Ok(Received::Empty) => return,
            Ok(Received::Closed) => return self.drop_client(slot, "closed"),
            // One byte more than any message fits the buffer, so that it shows here.
            Ok(Received::Oversized | Received::Packet { .. }) => {
                self.text.clear();
                let _ = write!(
                    self.text,
                    "message over {MAX_MESSAGE_LEN} bytes; frames over {MAX_INLINE_BYTES} bytes go through the memfd ring"
                );
                return self.reply_error(slot, 0, 0, ErrorCode::TOO_LARGE);
            }
            Err(e) => return self.drop_client(slot, &format!("receive failed: {e}")),
        };
        let after = self.handle(slot, len, fd, arrived);
        if after == After::Close {
            self.drop_client(slot, "closed after an error");
        }
    }

    fn handle(&mut self, slot: usize, len: usize, fd: Option<OwnedFd>, arrived: Instant) -> After {
        // Take the packet out of `self` for the duration (no copy: a swap of buffers).
        let packet = std::mem::take(&mut self.recv);
        let after = self.handle_packet(slot, &packet[..len], fd, arrived);
        self.recv = packet;
        after
    }

    fn handle_packet(
        &mut self,
        slot: usize,
        packet: &[u8],
        fd: Option<OwnedFd>,
        arrived: Instant,
    ) -> After {
        let (header, message) = match decode(packet) {
            Ok(m) => m,
            Err(e) => {
                let sequence = Header::decode(packet).map(|h| h.sequence).unwrap_or(0);
                self.text.clear();
                let _ = write!(self.text, "message {sequence}: {e}");
                self.reply_error(slot, sequence, 0, e.code());
                return if e.closes_connection() {
                    After::Close
                } else {
                    After::KeepOpen
                };
            }
        };
        let (seq, ts) = (header.sequence, header.timestamp_us);
        let greeted = self.clients[slot].as_ref().is_some_and(|c| c.greeted);
        if !greeted && header.kind != Kind::Hello {
            self.text.clear();
            let _ = write!(self.text, "send Hello first (got {:?})", header.kind);
            self.reply_error(slot, seq, ts, ErrorCode::UNEXPECTED);
            return After::Close;
        }
        match message {
            Message::Hello(hello) => {
                if hello.schema_hash != SCHEMA_HASH {
                    self.text.clear();
                    let _ = write!(
                        self.text,
                        "schema hash {:#010x}, this daemon speaks {:#010x}: build the client against the same fulcrum-board",
                        hello.schema_hash, SCHEMA_HASH
                    );
                    self.reply_error(slot, seq, ts, ErrorCode::SCHEMA_MISMATCH);
                    return After::Close;
                }
                if let Some(c) = self.clients[slot].as_mut() {
                    c.greeted = true;
                }
                let welcome = Message::Welcome(self.welcome());
                self.reply_message(slot, &header, &welcome);
            }
            Message::Infer(frame) => self.infer(slot, &header, frame, arrived),
            Message::AttachRing(attach) => {
                let Some(fd) = fd else {
                    self.text.clear();
                    let _ = write!(self.text, "AttachRing needs the memfd passed as SCM_RIGHTS");
                    self.reply_error(slot, seq, ts, ErrorCode::NO_RING);
                    return After::KeepOpen;
                };
                match ClientRing::map(fd, attach.len, self.config.max_ring_bytes) {
                    Ok(ring) => {
                        if let Some(c) = self.clients[slot].as_mut() {
                            c.ring = Some(ring);
                        }
                        self.reply_message(slot, &header, &Message::Ack(Kind::AttachRing));
                    }
                    Err(e) => {
                        self.set_text(&e.to_string());
                        self.reply_error(slot, seq, ts, ErrorCode::NO_RING);
                    }
                }
            }
            Message::ClassesRequest => {
                let names = Message::Classes {
                    names: &self.model.names,
                };
                match names.encode(seq, ts, &mut self.send) {
                    Ok(n) => self.reply(slot, n),
                    Err(e) => log::error!("encoding the class names: {e}"),
                }
            }
            Message::StatsRequest => {
                let stats = Message::Stats(self.stats());
                self.reply_message(slot, &header, &stats);
            }
            Message::HealthRequest => {
                let health = Message::Health(self.health());
                self.reply_message(slot, &header, &health);
            }
            Message::Reload { path } => {
                if self.loading.is_some() {
                    self.text.clear();
                    let _ = write!(
                        self.text,
                        "weights are loading already; try again when that ends"
                    );
                    self.reply_error(slot, seq, ts, ErrorCode::BUSY);
                    return After::KeepOpen;
                }
                match self.client_reload_path(path) {
                    Ok(path) => {
                        log::info!(
                            "reload of {} asked by pid {}",
                            path.display(),
                            self.peer_pid(slot)
                        );
                        let requester = self.clients[slot].as_ref().map(|c| Requester {
                            slot,
                            client: c.id,
                            header,
                        });
                        self.start_loading(path, LoadReason::Reload { requester });
                    }
                    Err(e) => {
                        log::warn!("reload refused (pid {}): {e}", self.peer_pid(slot));
                        self.set_text(&e.to_string());
                        self.reply_error(slot, seq, ts, ErrorCode::RELOAD_FAILED);
                    }
                }
            }
            Message::FineTuneStart { params, path } => {
                let started = match &mut self.fine_tune {
                    None => Err(super::fine_tune::FineTuneError::NoStateDir),
                    Some(f) => f.start(
                        &params,
                        Path::new(path),
                        &self.config.weights,
                        &self.model.path,
                    ),
                };
                match started {
                    Ok(()) => {
                        log::info!("fine-tune started on {path} by pid {}", self.peer_pid(slot));
                        self.reply_message(slot, &header, &Message::Ack(Kind::FineTuneStart));
                    }
                    Err(e) => {
                        log::warn!("fine-tune on {path} refused: {e}");
                        self.set_text(&e.to_string());
                        self.reply_error(slot, seq, ts, ErrorCode::FINE_TUNE_FAILED);
                    }
                }
            }
            Message::FineTuneStop => {
                if self.fine_tune.as_ref().is_some_and(FineTuner::stop) {
                    self.reply_message(slot, &header, &Message::Ack(Kind::FineTuneStop));
                } else {
                    self.text.clear();
                    let _ = write!(self.text, "no fine-tune is running");
                    self.reply_error(slot, seq, ts, ErrorCode::FINE_TUNE_FAILED);
                }
            }
            Message::FineTuneStatusRequest => {
                let status = self
                    .fine_tune
                    .as_ref()
                    .map_or_else(FineTuner::idle_status, FineTuner::status);
                self.reply_message(slot, &header, &Message::FineTuneStatus(status));
            }
            reply => {
                self.text.clear();
                let _ = write!(
                    self.text,
                    "{:?} is a reply; clients send requests",
                    reply.kind()
                );
                self.reply_error(slot, seq, ts, ErrorCode::UNEXPECTED);
            }
        }
        After::KeepOpen
    }

    fn infer(&mut self, slot: usize, header: &Header, frame: Frame<'_>, arrived: Instant) {
        let (seq, ts) = (header.sequence, header.timestamp_us);
        let desc = frame.desc;
        let Some(client) = self.clients[slot].as_ref() else {
            return;
        };
        // The ring lives in `self.clients`, which the prediction below does not touch;
        // `ClientRing::bytes` says why the client's own writes are harmless.
        let ring = client.ring.as_ref().map(ClientRing::bytes);
        let view = match frame::resolve(desc, frame.pixels, ring, self.config.max_frame_side) {
            Ok(view) => view,
            Err(refused) => {
                self.text.clear();
                let _ = write!(self.text, "frame {seq}: ");
                refused.describe(&desc, &mut self.text);
                return self.reply_error(slot, seq, ts, refused.code());
            }
        };
        let timing =
            match self
                .model
                .predictor
                .predict_into(&view.pixels(), view.crop(), &mut self.scored)
            {
                Ok(t) => t,
                Err(e) => {
                    self.text.clear();
                    let _ = write!(self.text, "frame {seq}: inference failed: {e}");
                    log::error!("{}", self.text);
                    return self.reply_error(slot, seq, ts, ErrorCode::INTERNAL);
                }
            };
        let min_score = if desc.min_score > 0.0 {
            desc.min_score
        } else {
            self.config.threshold
        };
        let most = match desc.max_detections {
            0 => usize::MAX,
            n => usize::from(n),
        };
        self.wire.clear();
        self.wire.extend(
            self.scored
                .iter()
                .filter(|d| d.score >= min_score)
                .take(most)
                .map(|d| Detection {
                    class: d.class.min(u32::from(u16::MAX)) as u16,
                    score: d.score,
                    x0: d.x0,
                    y0: d.y0,
                    x1: d.x1,
                    y1: d.y1,
                }),
        );
        let engine_us = timing.device.as_micros().min(u128::from(u32::MAX)) as u32;
        let total_us = arrived.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
        let reply = Message::Detections(DetectionsReply {
            frame_width: desc.width,
            frame_height: desc.height,
            engine_us,
            total_us,
            weights_generation: self.generation,
            min_score,
            nms_iou: self.config.nms_iou,
            detections: DetectionList::Records(&self.wire),
        });
        match reply.encode(seq, ts, &mut self.send) {
            Ok(n) => {
                self.reply(slot, n);
                self.counters.requests += 1;
                self.counters
                    .latency
                    .record(arrived.elapsed().as_micros() as u64);
                self.counters.engine.record(u64::from(engine_us));
                self.counters
                    .frame_pass
                    .record(timing.prepare.as_micros() as u64);
            }
            Err(e) => log::error!("encoding detections: {e}"),
        }
    }

    fn engine_kind(&self) -> EngineKind {
        if self.model.predictor.is_vulkan() {
            EngineKind::Vulkan
        } else {
            EngineKind::Cpu
        }
    }

    fn welcome(&self) -> Welcome {
        let side = self.model.predictor.input_size().min(u32::from(u16::MAX)) as u16;
        Welcome {
            schema_hash: SCHEMA_HASH,
            input_width: side,
            input_height: side,
            classes: self.model.classes,
            max_frame_side: self.config.max_frame_side,
            max_inline_bytes: MAX_INLINE_BYTES,
            max_detections: self.config.top_k.min(u32::from(protocol::MAX_DETECTIONS)) as u16,
            engine: self.engine_kind(),
            weights_generation: self.generation,
        }
    }

    fn stats(&self) -> Stats {
        let c = &self.counters;
        let us = |v: u64| v.min(u64::from(u32::MAX)) as u32;
        Stats {
            requests: c.requests,
            errors: c.errors,
            refused: c.refused,
            clients: self.clients.iter().flatten().count() as u16,
            p50_us: us(c.latency.quantile(0.5)),
            p99_us: us(c.latency.quantile(0.99)),
            p999_us: us(c.latency.quantile(0.999)),
            forward_us: us(c.engine.quantile(0.5)),
            uptime_s: self.started.elapsed().as_secs().min(u64::from(u32::MAX)) as u32,
            weights_generation: self.generation,
        }
    }

    fn health(&self) -> Health {
        Health {
            state: self.state,
            engine: self.engine_kind(),
            uptime_s: self.started.elapsed().as_secs().min(u64::from(u32::MAX)) as u32,
            weights_generation: self.generation,
            since_progress_ms: self
                .last_progress
                .elapsed()
                .as_millis()
                .min(u128::from(u32::MAX)) as u32,
        }
    }

    /// An error reply's text: `text`, cut at a character boundary to what a reply carries
    /// (the log has it whole).
    fn set_text(&mut self, text: &str) {
        self.text.clear();
        let mut end = text.len().min(MAX_TEXT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let _ = self.text.push_str(&text[..end]);
    }

    fn peer_pid(&self, slot: usize) -> i32 {
        self.clients[slot].as_ref().map_or(0, |c| c.cred.pid)
    }

    /// Checkpoints a running fine-tune (it resumes at the next start), gives clients up to a
    /// second to take their last replies, then closes everything.
    fn shutdown(&mut self) {
        if let Some(f) = self.fine_tune.as_mut() {
            f.shutdown();
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline
            && self
                .clients
                .iter()
                .flatten()
                .any(|c| c.pending_since.is_some())
        {
            for slot in 0..self.clients.len() {
                self.flush(slot);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.clients.iter_mut().for_each(|c| *c = None);
        match self.listener.remove() {
            Ok(true) => {}
            Ok(false) => log::warn!(
                "{} is no longer the socket this daemon bound; left as it is",
                self.config.socket.display()
            ),
            Err(e) => log::warn!("removing {}: {e}", self.config.socket.display()),
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.status_line())
    }
}

/// Wire errors as the daemon's own error type (for the client, which shares it).
impl From<WireError> for Error {
    fn from(e: WireError) -> Self {
        Error::Protocol(e)
    }
}

/// Why a client's `Reload` of a named file was refused.
#[derive(Debug, thiserror::Error)]
enum ReloadRefused {
    #[error(
        "this daemon reloads only its configured weights: send Reload with no path, or start it \
         with --client-reload-dir DIR for files in DIR ({0} refused)"
    )]
    NoReloadDir(String),
    #[error("{what}: {source}")]
    Unresolved {
        what: String,
        source: std::io::Error,
    },
    #[error("{path} resolves to {}, outside --client-reload-dir {}", resolved.display(), dir.display())]
    Outside {
        path: String,
        resolved: PathBuf,
        dir: PathBuf,
    },
}

/// Hands the heap's free pages back to the kernel. glibc keeps freed memory in per-thread
/// arenas, and the threads that load and drop weights get arenas of their own: without this,
/// a daemon reloaded often (or refused corrupt files under load) keeps each arena's high-water
/// mark resident. Called off the serving loop, after a load and after a drop.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it may be called
    // from any thread at any time and touches no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}
