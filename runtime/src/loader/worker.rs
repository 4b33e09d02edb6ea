//! One loader thread: claim a unit of work, read its records into the slot, verify, augment,
//! complete; until the ring has no more work or stops.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::augment::Augmenter;
use super::mosaic::{Mosaic, GROUP};
use super::order::EpochOrder;
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
        backend: Box<dyn ReadBackend>,
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
            let first = (global % self.batches_per_epoch) * self.batch + claim.first as u64;
            let count = claim.records.len() / self.layout.record_size;
            let order = EpochOrder::new(self.records, self.seed, epoch, self.shuffle);
            self.locs.clear();
            self.indices.clear();
            for j in 0..count as u64 {
                let index = order.get(first + j);
                self.indices.push(index);
                self.locs.push(self.files.locate(index));
            }

            // Records are verified and augmented as their reads complete, while the rest of
            // the unit's reads are still in flight.
            let read_started = Instant::now();
            let mut processing = Duration::ZERO;
            let mut failure: Option<Error> = None;
            let (layout, files, counters) = (&self.layout, &self.files, &self.counters);
            let (indices, augmenter) = (&self.indices, &mut self.augmenter);
            let augment_each = self.augment && self.mosaic.is_none();
            let (verify, on_corrupt, classes) = (self.verify, self.on_corrupt, self.num_classes);
            let (seed, slow_down) = (self.seed, self.slow_down);
            let read = self.backend.read_records(
                &self.locs,
                layout.record_size,
                claim.records,
                &mut |j, record| {
                    let t = Instant::now();
                    let index = indices[j];
                    if verify {
                        if let Err(problem) = layout.verify(record, index, classes) {
                            let (path, local) = files.describe(index);
                            if on_corrupt == OnCorrupt::Fail {
                                failure = Some(Error::Corrupt {
                                    path,
                                    record: local,
                                    problem,
                                });
                                return ControlFlow::Break(());
                            }
                            log::warn!(
                                "{}: record {local}: {problem}; replaced by a substitute",
                                path.display()
                            );
                            substitute_record(layout, record, index);
                            counters.substituted.fetch_add(1, Relaxed);
                        }
                    }
                    if augment_each {
                        augmenter.apply(record, derive_seed(&[seed, epoch, first + j as u64]));
                    }
                    if !slow_down.is_zero() {
                        std::thread::sleep(slow_down);
                    }
                    processing += t.elapsed();
                    ControlFlow::Continue(())
                },
            );
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
