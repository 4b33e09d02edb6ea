//! One loader thread: claim a unit of work, read its records into the slot, verify, augment,
//! complete; until the ring has no more work or stops.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::augment::Augmenter;
use super::mosaic::{Mosaic, GROUP};
use super::order::EpochOrder;
use super::replay::Replay;
use super::{substitute_record, Dataset, Error, LoaderConfig, OnCorrupt};
use crate::balance::PipelineCounters;
use crate::base::derive_seed;
use crate::base::thread_cpu_time;
use crate::format::{RecordLayout, HEADER_SIZE};
use crate::io::{self, ControlFlow, ReadBackend, RecordLoc, ShardSet};
use crate::ring::Ring;
use crate::trace::{Kind, TraceLog};
use fulcrum_board::CoreSet;

/// Heap bytes of a worker's per-record work lists ([`RecordLoc`] + record index).
pub(super) const WORK_BYTES_PER_RECORD: usize =
    std::mem::size_of::<RecordLoc>() + std::mem::size_of::<u64>();

pub(super) struct Worker {
    /// This loader's index: its row in the trace.
    row: u16,
    trace: Option<Arc<TraceLog>>,
    ring: Arc<Ring>,
    counters: Arc<PipelineCounters>,
    backend: Box<dyn ReadBackend>,
    files: Arc<ShardSet>,
    /// The replay data and the backend that reads it, with replay.
    replay: Option<(Arc<Replay>, Box<dyn ReadBackend>)>,
    /// Records per batch from the training data; the batch's last positions are replay's.
    fresh: u64,
    layout: RecordLayout,
    augmenter: Augmenter,
    augment: bool,
    /// Present when mosaics are on: records are then augmented by groups once the unit's
    /// reads are done, not one by one as they arrive.
    mosaic: Option<Mosaic>,
    verify: bool,
    on_corrupt: OnCorrupt,
    num_classes: u32,
    records: u64,
    batch: u64,
    batches_per_epoch: u64,
    start_batch: u64,
    seed: u64,
    shuffle: bool,
    pin: CoreSet,
    slow_down: Duration,
    /// Where this unit's records live; capacity for a whole part, allocated once.
    locs: Vec<RecordLoc>,
    /// Global record index of each of this unit's records.
    indices: Vec<u64>,
}

impl Worker {
    pub(super) fn new(
        dataset: &Dataset,
        config: &LoaderConfig,
        row: usize,
        ring: Arc<Ring>,
        counters: Arc<PipelineCounters>,
        // The training data's backend, and the replay data's with replay.
        (backend, replay_backend): (Box<dyn ReadBackend>, Option<Box<dyn ReadBackend>>),
        batches_per_epoch: u64,
    ) -> Self {
        let part = ring.shape().part_records;
        Worker {
            row: row as u16,
            trace: config.trace.clone(),
            ring,
            counters,
            backend,
            files: dataset.files.clone(),
            replay: config.replay.clone().zip(replay_backend),
            fresh: config.fresh_per_batch() as u64,
            layout: dataset.layout,
            augmenter: Augmenter::new(dataset.layout, config.augment),
            augment: config.augment.enabled,
            mosaic: config
                .augment
                .mosaics()
                .then(|| Mosaic::new(dataset.layout, &config.augment)),
            verify: config.verify,
            on_corrupt: config.on_corrupt,
            num_classes: dataset.manifest.num_classes(),
            records: dataset.records(),
            batch: config.batch as u64,
            batches_per_epoch,
            start_batch: config.start_batch,
            seed: config.seed,
            shuffle: config.shuffle,
            pin: config.pin,
            slow_down: config.slow_down,
            locs: Vec::with_capacity(part),
            indices: Vec::with_capacity(part),
        }
    }

    pub(super) fn run(mut self) {
        self.pin_to_cores();
        let ring = self.ring.clone();
        while let Some(claim) = ring.claim() {
            let started = Instant::now();
            if let Some(log) = &self.trace {
                let at = log.at(started);
                log.record(
                    Kind::SlotWait,
                    self.row,
                    claim.batch + self.start_batch,
                    at.saturating_sub(claim.waited.as_nanos() as u64),
                    at,
                );
            }
            let cpu_before = thread_cpu_time();
            let global = claim.batch + self.start_batch;
            let epoch = global / self.batches_per_epoch;
            let in_epoch = global % self.batches_per_epoch;
            // Position in the epoch's stream of batch positions (the augmentation's seed).
            let first = in_epoch * self.batch + claim.first as u64;
            let count = claim.records.len() / self.layout.record_size;
            // The unit's positions in its batch: those before `fresh` hold the training data's
            // records, the rest replay records.
            let at = claim.first as u64;
            let split = self.fresh.saturating_sub(at).min(count as u64) as usize;
            let order = EpochOrder::new(self.records, self.seed, epoch, self.shuffle);
            self.locs.clear();
            self.indices.clear();
            for p in at..at + split as u64 {
                let index = order.get(in_epoch * self.fresh + p);
                self.indices.push(index);
                self.locs.push(self.files.locate(index));
            }
            if let Some((replay, _)) = &self.replay {
                let per_batch = self.batch - self.fresh;
                for p in at + split as u64..at + count as u64 {
                    let k = global * per_batch + (p - self.fresh);
                    let index = replay.record(self.seed, self.shuffle, k);
                    self.indices.push(index);
                    self.locs.push(replay.dataset.files.locate(index));
                }
            }

            // Records are verified and augmented as their reads complete, while the rest of
            // the unit's reads are still in flight.
            let read_started = Instant::now();
            let mut processing = Duration::ZERO;
            let mut failure: Option<Error> = None;
            let layout = self.layout;
            let augment_each = self.augment && self.mosaic.is_none();
            let (seed, slow_down) = (self.seed, self.slow_down);
            let rs = layout.record_size;
            let (fresh_records, replay_records) = claim.records.split_at_mut(split * rs);
            let training = Intake {
                layout,
                files: &self.files,
                classes: self.num_classes,
                class_map: None,
                verify: self.verify,
                on_corrupt: self.on_corrupt,
                counters: &self.counters,
            };
            // Two sources at most, the training data's records first: nothing allocated.
            let sources = [
                Some((&mut self.backend, training, fresh_records, 0)),
                self.replay.as_mut().map(|(replay, backend)| {
                    let intake = Intake {
                        layout,
                        files: &replay.dataset.files,
                        classes: replay.dataset.manifest.num_classes(),
                        class_map: Some(&replay.classes),
                        verify: self.verify,
                        on_corrupt: self.on_corrupt,
                        counters: &self.counters,
                    };
                    (backend, intake, replay_records, split)
                }),
            ];
            let mut read = Ok(());
            for (backend, intake, records, offset) in sources.into_iter().flatten() {
                let locs = &self.locs[offset..offset + records.len() / rs];
                if locs.is_empty() {
                    continue;
                }
                let (indices, augmenter) = (&self.indices, &mut self.augmenter);
                read = backend.read_records(locs, rs, records, &mut |j, record| {
                    let t = Instant::now();
                    let j = offset + j;
                    if let Err(e) = intake.take(record, indices[j]) {
                        failure = Some(e);
                        return ControlFlow::Break(());
                    }
                    if augment_each {
                        augmenter.apply(record, derive_seed(&[seed, epoch, first + j as u64]));
                    }
                    if !slow_down.is_zero() {
                        std::thread::sleep(slow_down);
                    }
                    processing += t.elapsed();
                    ControlFlow::Continue(())
                });
                if read.is_err() || failure.is_some() {
                    break;
                }
            }
            if let Err(e) = read {
                ring.stop(Some(Box::new(self.read_error(e))));
                return;
            }
            if let Some(e) = failure {
                ring.stop(Some(Box::new(e)));
                return;
            }
            if let Some(mosaic) = &mut self.mosaic {
                // The unit starts at a multiple of GROUP in its batch (see part_records).
                let t = Instant::now();
                let group_bytes = GROUP * self.layout.record_size;
                for (g, group) in claim.records.chunks_mut(group_bytes).enumerate() {
                    let at = first + (g * GROUP) as u64;
                    mosaic.apply_group(&mut self.augmenter, group, |m| {
                        derive_seed(&[seed, epoch, at + m as u64])
                    });
                }
                processing += t.elapsed();
            }
            let bytes = (count * self.layout.record_size) as u64;
            let reading = read_started.elapsed().saturating_sub(processing);
            self.counters
                .disk
                .add(count as u64, bytes, Duration::ZERO, reading, Duration::ZERO);
            let cpu = thread_cpu_time().saturating_sub(cpu_before);
            self.counters
                .loaders
                .add(count as u64, bytes, cpu, started.elapsed(), claim.waited);
            if let Some(log) = &self.trace {
                log.record(
                    Kind::Load,
                    self.row,
                    claim.batch + self.start_batch,
                    log.at(started),
                    log.now(),
                );
            }
            claim.complete();
        }
    }

    /// Names the record behind a failed read: the backend knows the file and offset.
    fn read_error(&self, e: io::Error) -> Error {
        let record_at = |offset: u64| {
            offset.saturating_sub(HEADER_SIZE as u64) / self.layout.record_size as u64
        };
        match e {
            io::Error::Read { path, offset, source, .. } => {
                Error::Read { path, record: record_at(offset), what: format!("read failed: {source}") }
            }
            io::Error::ShortRead { path, offset, .. } => Error::Read {
                path,
                record: record_at(offset),
                what: "the file ends inside this record: it was truncated or replaced while in use; re-pack or restore it".into(),
            },
            other => Error::Io(other),
        }
    }

    fn pin_to_cores(&self) {
        if self.pin.is_empty() {
            return;
        }
        let mut set = nix::sched::CpuSet::new();
        for core in self.pin.iter() {
            if set.set(core).is_err() {
                return;
            }
        }
        if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set) {
            log::warn!("could not pin loader thread to cores {:?}: {e}", self.pin);
        }
    }
}

/// What a record goes through as it comes off disk, before augmentation: the checks of its
/// checksum, index and labels (a bad one is an error or a substitute, per `on_corrupt`), and
/// for replay data its classes rewritten to the run's.
struct Intake<'a> {
    layout: RecordLayout,
    files: &'a ShardSet,
    classes: u32,
    class_map: Option<&'a [u32]>,
    verify: bool,
    on_corrupt: OnCorrupt,
    counters: &'a PipelineCounters,
}

impl Intake<'_> {
    fn take(&self, record: &mut [u8], index: u64) -> Result<(), Error> {
        if self.verify {
            if let Err(problem) = self.layout.verify(record, index, self.classes) {
                let (path, local) = self.files.describe(index);
                if self.on_corrupt == OnCorrupt::Fail {
                    return Err(Error::Corrupt {
                        path,
                        record: local,
                        problem,
                    });
                }
                log::warn!(
                    "{}: record {local}: {problem}; replaced by a substitute",
                    path.display()
                );
                substitute_record(&self.layout, record, index);
                self.counters.substituted.fetch_add(1, Relaxed);
            }
        }
        if let Some(map) = self.class_map {
            // An unverified record's classes are unchecked: one with an id past the map becomes
            // a substitute rather than an index out of bounds.
            if !self.verify && self.layout.check_boxes(record, self.classes).is_err() {
                substitute_record(&self.layout, record, index);
                self.counters.substituted.fetch_add(1, Relaxed);
            }
            self.layout.map_classes(record, map);
        }
        Ok(())
    }
}
