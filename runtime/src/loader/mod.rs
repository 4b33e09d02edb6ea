//! Loader threads: they fill the ring's slots with records in epoch order, verify every record's
//! checksum and labels, and augment it in place, cooperating on the next batch.
//!
//! A [`Loader`] owns the ring, the threads and the counters. The consumer calls
//! [`Loader::next_batch`] and gets batches strictly in order; a failure in any loader (a corrupt
//! record under `--on-corrupt fail`, a read error) stops the loaders and comes out of
//! `next_batch` as an error naming the file and record, never as a hang or a panic.
//!
//! Nothing here allocates per batch once the threads run: reads land in slot memory, the epoch
//! order is computed on the fly, and all scratch space is allocated at start.

pub mod augment;
mod dataset;
pub mod mosaic;
pub mod order;
pub mod preview;
pub mod replay;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use fulcrum_board::CoreSet;

pub use augment::AugmentConfig;
pub use dataset::{Dataset, VerifyReport};
pub use replay::Replay;

use crate::balance::{PipelineCounters, PipelineSnapshot};
use crate::base::{human, largest_fitting, MemoryPlan};
use crate::format::{RecordBox, RecordLayout, RecordMeta, RecordProblem};
use crate::io::{self, BackendKind, IoKind, UringOptions};
use crate::ring::{self, Consumer, ReadyBatch, Ring, RingShape};
use crate::trace::{Kind, TraceLog, CONSUMER_ROW};

/// What to do with a record that fails verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnCorrupt {
    /// Stop with an error naming the file and record.
    #[default]
    Fail,
    /// Replace it by a deterministic substitute (grey image, no boxes) and count it.
    Skip,
}

impl std::str::FromStr for OnCorrupt {
    type Err = crate::base::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fail" => Ok(OnCorrupt::Fail),
            "skip" => Ok(OnCorrupt::Skip),
            _ => Err(crate::base::UnknownChoice::new(
                "--on-corrupt policy",
                s,
                "fail or skip",
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LoaderConfig {
    /// Records per batch (`B`).
    pub batch: usize,
    /// Ring slots (`D`).
    pub ring_slots: usize,
    /// Loader threads (`C`).
    pub loaders: usize,
    /// Records per unit of work; 0 picks one from batch and loader count.
    pub part_records: usize,
    pub seed: u64,
    /// Epochs to deliver; each has `records / batch` batches (the remainder is dropped).
    pub epochs: u64,
    /// Global batch number to start at (resuming a run): batches before it are skipped, the
    /// rest are exactly those an uninterrupted run delivers (the epoch order and the
    /// augmentation are functions of seed, epoch and position).
    pub start_batch: u64,
    /// Shuffle the epoch order (off for evaluation).
    pub shuffle: bool,
    pub augment: AugmentConfig,
    pub on_corrupt: OnCorrupt,
    pub io: IoKind,
    pub uring: UringOptions,
    /// Cores to pin loader threads to; empty lets the OS schedule them.
    pub pin: CoreSet,
    /// Verify checksums and labels of every record (on by default; costs ~5 % of loader CPU).
    pub verify: bool,
    /// Where to record loader and consumer spans, if anywhere.
    pub trace: Option<Arc<TraceLog>>,
    /// Hard limit on the memory the pipeline may hold; checked before anything is allocated.
    pub mem_budget: Option<u64>,
    /// Extra wall time per record, slept by the loader after augmenting it: a stand-in for a
    /// slower board or heavier decoding, to test and demonstrate the autotuner. Zero normally.
    pub slow_down: std::time::Duration,
    /// Count into these (a loader restarted with another configuration keeps the run's
    /// totals); `None` starts from zero.
    pub counters: Option<Arc<PipelineCounters>>,
    /// Makes the ring's memory (an engine that reads batches straight from it); `None`:
    /// plain host memory.
    pub slot_allocator: Option<Arc<dyn crate::base::SlotAllocator>>,
    /// Records of a second dataset mixed into every batch (see [`replay`]); `None`: none.
    pub replay: Option<Arc<Replay>>,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch: 32,
            ring_slots: 4,
            loaders: std::thread::available_parallelism().map_or(1, |n| n.get()),
            part_records: 0,
            seed: 0,
            epochs: 1,
            start_batch: 0,
            shuffle: true,
            augment: AugmentConfig::default(),
            on_corrupt: OnCorrupt::Fail,
            io: IoKind::Auto,
            uring: UringOptions::default(),
            pin: CoreSet::EMPTY,
            verify: true,
            trace: None,
            mem_budget: None,
            slow_down: std::time::Duration::ZERO,
            counters: None,
            slot_allocator: None,
            replay: None,
        }
    }
}

impl LoaderConfig {
    /// Records per unit of work a loader claims: whole mosaic groups when mosaics are on (see
    /// [`mosaic`]), so that what a record becomes does not depend on the loader count.
    pub fn part_records(&self) -> usize {
        let part = match self.part_records {
            0 => self.batch.div_ceil(2 * self.loaders.max(1)).clamp(1, 32),
            n => n,
        };
        let part = if self.augment.mosaics() {
            part.next_multiple_of(mosaic::GROUP)
        } else {
            part
        };
        part.min(self.batch)
    }

    /// Records per batch that come from the training data (the rest are replay records).
    pub fn fresh_per_batch(&self) -> usize {
        match &self.replay {
            Some(replay) => self.batch - replay.per_batch(self.batch),
            None => self.batch,
        }
    }

    /// Batches in an epoch (a pass over the training data's `records`; the remainder is
    /// dropped).
    pub fn batches_per_epoch(&self, records: u64) -> u64 {
        records / self.fresh_per_batch().max(1) as u64
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Augment(#[from] augment::AugmentError),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Format(#[from] crate::format::Error),
    #[error(transparent)]
    Ring(#[from] ring::Error),
    #[error("{path}: record {record}: {problem}; re-pack the dataset, or pass --on-corrupt skip to replace bad records")]
    Corrupt {
        path: PathBuf,
        record: u64,
        problem: RecordProblem,
    },
    #[error("{path}: record {record}: {what}")]
    Read {
        path: PathBuf,
        record: u64,
        what: String,
    },
    #[error("{dir} is being written by `fulcrum pack` in another process; wait for it to finish")]
    BeingPacked { dir: PathBuf },
    #[error("bad loader option: {0}")]
    Config(String),
    #[error("the dataset has {records} records, fewer than one batch of {batch}; lower --batch or pack more data")]
    TooFewRecords { records: u64, batch: usize },
    #[error("loader stopped: {0}")]
    Stopped(String),
    #[error("the input pipeline needs {} but --mem-budget is {}; {fits}. `fulcrum load --memory-report` lists every allocation:\n{table}", human(*.need), human(*.budget))]
    OverBudget {
        need: u64,
        budget: u64,
        fits: String,
        table: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Most loader threads: far more than any board has cores.
pub const MAX_LOADERS: usize = 256;

/// The running input pipeline.
pub struct Loader {
    ring: Arc<Ring>,
    consumer: Consumer,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<PipelineCounters>,
    backend: BackendKind,
    fallback_note: Option<String>,
    layout: RecordLayout,
    batch: usize,
    batches_per_epoch: u64,
    start_batch: u64,
    trace: Option<Arc<TraceLog>>,
    plan: MemoryPlan,
}

/// One delivered batch; the slot goes back to the loaders when this is dropped.
pub struct Batch<'l> {
    slot: ReadyBatch<'l>,
    layout: RecordLayout,
    /// Global batch number, counting from 0 across epochs.
    pub index: u64,
    pub epoch: u64,
    /// Batch number within its epoch.
    pub step: u64,
    /// Where to record how long the consumer held the batch, and since when.
    trace: Option<(&'l TraceLog, u64)>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if let Some((log, since)) = self.trace {
            log.record(Kind::Consume, CONSUMER_ROW, self.index, since, log.now());
        }
    }
}

impl Batch<'_> {
    pub fn len(&self) -> usize {
        self.slot.records().len() / self.layout.record_size
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All records, back to back, `layout.record_size` bytes each.
    pub fn records(&self) -> &[u8] {
        self.slot.records()
    }

    /// [`Batch::records`] with their slot's identity, for an engine to read them where they
    /// are ([`crate::compute::exec::Exec::run_reading`]).
    pub fn slot_bytes(&self) -> crate::base::SlotBytes<'_> {
        self.slot.slot_bytes()
    }

    pub fn record(&self, i: usize) -> &[u8] {
        let rs = self.layout.record_size;
        &self.slot.records()[i * rs..(i + 1) * rs]
    }

    /// Record `i`'s image, HWC u8.
    pub fn image(&self, i: usize) -> &[u8] {
        self.layout.image(self.record(i))
    }

    pub fn meta(&self, i: usize) -> RecordMeta {
        self.layout.read_meta(self.record(i))
    }

    pub fn box_count(&self, i: usize) -> usize {
        self.layout.box_count(self.record(i)) as usize
    }

    pub fn boxes(&self, i: usize) -> impl Iterator<Item = RecordBox> + '_ {
        let rec = self.record(i);
        (0..self.layout.box_count(rec) as usize).map(move |b| self.layout.read_box(rec, b))
    }

    pub fn layout(&self) -> &RecordLayout {
        &self.layout
    }
}

impl Loader {
    /// Checks the configuration, sizes and allocates the ring, opens one read backend per
    /// thread and starts the threads. Everything that can fail for a configuration reason
    /// fails here, before any record is read.
    pub fn start(dataset: &Dataset, config: &LoaderConfig) -> Result<Self> {
        config.augment.validate()?;
        if config.batch == 0 || config.loaders == 0 || config.epochs == 0 {
            return Err(Error::Config(
                "--batch, --loaders and --epochs must be at least 1".into(),
            ));
        }
        if config.loaders > MAX_LOADERS {
            return Err(Error::Config(format!(
                "--loaders {}: use at most {MAX_LOADERS}",
                config.loaders
            )));
        }
        if let Some(replay) = &config.replay {
            replay.check_batch(config.batch)?;
        }
        let records = dataset.records();
        let fresh = config.fresh_per_batch();
        if records < fresh as u64 {
            return Err(Error::TooFewRecords {
                records,
                batch: fresh,
            });
        }
        let batches_per_epoch = config.batches_per_epoch(records);
        let (kind, fallback_note) = resolve_backend(config.io)?;
        let plan = plan(dataset, config, kind);
        check_budget(dataset, config, kind, &plan)?;
        let shape = RingShape {
            slots: config.ring_slots,
            batch: config.batch,
            record_size: dataset.layout.record_size,
            part_records: config.part_records(),
        };
        let total = batches_per_epoch * config.epochs;
        if config.start_batch >= total {
            return Err(Error::Config(format!(
                "start batch {} is past the end of the run ({total} batches: {} epochs of {batches_per_epoch})",
                config.start_batch, config.epochs
            )));
        }
        let ring = Arc::new(new_ring(shape, total - config.start_batch, config)?);

        let regions = ring.slot_regions();
        let mut backends = Vec::with_capacity(config.loaders);
        for _ in 0..config.loaders {
            let (backend, _) = io::open_backend(kind, &dataset.files, &regions, &config.uring)?;
            let replay = match &config.replay {
                Some(r) => {
                    Some(io::open_backend(kind, &r.dataset.files, &regions, &config.uring)?.0)
                }
                None => None,
            };
            backends.push((backend, replay));
        }

        let backend_kind = backends[0].0.kind();
        let counters = config.counters.clone().unwrap_or_default();
        let threads = backends
            .into_iter()
            .enumerate()
            .map(|(k, backends)| {
                let job = worker::Worker::new(
                    dataset,
                    config,
                    k,
                    ring.clone(),
                    counters.clone(),
                    backends,
                    batches_per_epoch,
                );
                std::thread::Builder::new()
                    .name(format!("fulcrum-loader-{k}"))
                    .spawn(move || job.run())
                    .map_err(|e| Error::Config(format!("cannot start loader thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Loader {
            ring,
            consumer: Consumer::default(),
            threads,
            counters,
            backend: backend_kind,
            fallback_note,
            layout: dataset.layout,
            batch: config.batch,
            batches_per_epoch,
            start_batch: config.start_batch,
            trace: config.trace.clone(),
            plan,
        })
    }

    /// Every allocation the pipeline made, as planned before making them.
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The next batch in order, `None` after the last epoch, or the error that stopped loading.
    pub fn next_batch(&mut self) -> Result<Option<Batch<'_>>> {
        match self.consumer.next(&self.ring) {
            Ok(Some(slot)) => {
                self.counters.consumer.add(
                    1,
                    0,
                    Default::default(),
                    Default::default(),
                    slot.waited,
                );
                let index = slot.batch + self.start_batch;
                let trace = self.trace.as_deref().map(|log| {
                    let now = log.now();
                    log.record(
                        Kind::ConsumerWait,
                        CONSUMER_ROW,
                        index,
                        now.saturating_sub(slot.waited.as_nanos() as u64),
                        now,
                    );
                    (log, now)
                });
                Ok(Some(Batch {
                    trace,
                    slot,
                    layout: self.layout,
                    index,
                    epoch: index / self.batches_per_epoch,
                    step: index % self.batches_per_epoch,
                }))
            }
            Ok(None) => Ok(None),
            Err(failure) => Err(match failure.downcast::<Error>() {
                Ok(e) => *e,
                Err(other) => Error::Stopped(other.to_string()),
            }),
        }
    }

    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    /// Why io_uring is not in use although `--io auto` preferred it.
    pub fn fallback_note(&self) -> Option<&str> {
        self.fallback_note.as_deref()
    }

    pub fn counters(&self) -> PipelineSnapshot {
        self.counters.snapshot()
    }

    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_per_epoch
    }

    pub fn batch_size(&self) -> usize {
        self.batch
    }

    pub fn ring_bytes(&self) -> usize {
        self.ring.shape().bytes()
    }

    /// Where the ring's slots live ("host", "host, imported into Vulkan").
    pub fn ring_memory(&self) -> &'static str {
        self.ring.memory_kind()
    }
}

/// The ring over the configured allocator's memory, or over plain host memory where there is
/// none or it refuses (slower, never wrong: the engine then copies each batch itself).
fn new_ring(shape: RingShape, batches: u64, config: &LoaderConfig) -> Result<Ring> {
    if let Some(allocator) = &config.slot_allocator {
        match allocator.allocate(shape.bytes()) {
            Ok(memory) => return Ok(Ring::with_memory(shape, batches, memory)?),
            Err(e) => log::warn!("ring slots: {e}; using plain host memory"),
        }
    }
    Ok(Ring::new(shape, batches)?)
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.ring.stop(None);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The memory a pipeline with this configuration will hold, item by item. Kept next to the
/// code that allocates it; `Loader::start` allocates exactly this (tested).
pub fn plan(dataset: &Dataset, config: &LoaderConfig, backend: IoKind) -> MemoryPlan {
    let layout = &dataset.layout;
    let loaders = config.loaders as u64;
    let part = config.part_records() as u64;
    let mut plan = MemoryPlan::default();
    plan.add(
        "ring slots (batch × record)",
        config.ring_slots as u64,
        crate::format::page_align(config.batch * layout.record_size) as u64,
    );
    plan.add(
        "ring bookkeeping",
        1,
        Ring::bookkeeping_bytes(config.ring_slots) as u64,
    );
    if config.augment.enabled {
        plan.add(
            "augmentation scratch per loader",
            loaders,
            augment::Augmenter::scratch_bytes(layout) as u64,
        );
    }
    if config.augment.mosaics() {
        plan.add(
            "mosaic scratch per loader (a group of records)",
            loaders,
            mosaic::Mosaic::scratch_bytes(layout) as u64,
        );
    }
    plan.add(
        "loader work lists",
        loaders,
        part * worker::WORK_BYTES_PER_RECORD as u64,
    );
    if backend == IoKind::Uring {
        plan.add(
            "io_uring queues per loader (kernel)",
            loaders,
            io::uring_queue_bytes(&config.uring) as u64,
        );
        if config.replay.is_some() {
            plan.add(
                "io_uring queues per loader for the replay data (kernel)",
                loaders,
                io::uring_queue_bytes(&config.uring) as u64,
            );
        }
    }
    if let Some(log) = &config.trace {
        plan.add("trace log", 1, log.bytes() as u64);
    }
    plan
}

/// Refuses a plan over the budget, saying which batch or ring depth would fit.
fn check_budget(
    dataset: &Dataset,
    config: &LoaderConfig,
    kind: IoKind,
    plan: &MemoryPlan,
) -> Result<()> {
    let Some(budget) = config.mem_budget else {
        return Ok(());
    };
    if plan.fits(Some(budget)) {
        return Ok(());
    }
    let with = |batch: usize, ring: usize| LoaderConfig {
        batch,
        ring_slots: ring,
        ..config.clone()
    };
    let fits = |c: &LoaderConfig| plan_total(dataset, c, kind) <= budget;
    let batch = largest_fitting(config.batch as u64, |b| {
        fits(&with(b as usize, config.ring_slots))
    });
    let ring = largest_fitting(config.ring_slots as u64, |d| {
        fits(&with(config.batch, d as usize))
    });
    let fits = match (batch, ring) {
        (None, None) if !fits(&with(1, 1)) => {
            "not even batch 1 with ring 1 fits: raise --mem-budget".to_owned()
        }
        (None, None) => "lower both --batch and --ring".to_owned(),
        (b, r) => {
            let mut ways = Vec::new();
            if let Some(b) = b {
                ways.push(format!("--batch {b} fits at --ring {}", config.ring_slots));
            }
            if let Some(r) = r {
                ways.push(format!("--ring {r} fits at --batch {}", config.batch));
            }
            ways.join(", or ")
        }
    };
    Err(Error::OverBudget {
        need: plan.total(),
        budget,
        fits,
        table: plan.table(),
    })
}

fn plan_total(dataset: &Dataset, config: &LoaderConfig, kind: IoKind) -> u64 {
    plan(dataset, config, kind).total()
}

/// Decides the backend once for all threads; `auto` falls back only if io_uring is unavailable.
/// [`Loader::start`] asks it, and so does a plan made before the loaders start (so that it
/// counts the io_uring queues `auto` will make); the fallback's note is logged once.
pub fn resolve_backend(kind: IoKind) -> Result<(IoKind, Option<String>)> {
    match kind {
        IoKind::Pread => Ok((IoKind::Pread, None)),
        IoKind::Uring => {
            io::probe_uring()?;
            Ok((IoKind::Uring, None))
        }
        IoKind::Auto => match io::probe_uring() {
            Ok(()) => Ok((IoKind::Uring, None)),
            Err(io::Error::UringUnavailable { why }) => {
                let note = format!("io_uring unavailable ({why}); reading with pread");
                // Said once per process, however many loaders start (benches start several).
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| log::warn!("{note}"));
                Ok((IoKind::Pread, Some(note)))
            }
            Err(e) => Err(e.into()),
        },
    }
}

/// Fills `record` with the deterministic stand-in for corrupt record `index`.
pub fn substitute_record(layout: &RecordLayout, record: &mut [u8], index: u64) {
    layout
        .image_mut(record)
        .fill(crate::pack::letterbox::PAD_COLOUR[0]);
    let meta = RecordMeta {
        index,
        flags: crate::format::FLAG_SUBSTITUTE,
        source_width: layout.width,
        source_height: layout.height,
        scale: 1.0,
        pad_x: 0.0,
        pad_y: 0.0,
    };
    layout.write_meta(record, &meta, &[]);
}
