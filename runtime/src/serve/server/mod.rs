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
//!
//! This file holds the server's state, its start and its loop; `clients.rs` the connections,
//! `requests.rs` the answer to each request, and `reload.rs` how new weights replace the
//! served ones.

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

mod clients;
mod reload;
mod requests;

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
