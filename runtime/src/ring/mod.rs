//! The fixed prefetch ring: `D` slots of one batch each, allocated once.
//!
//! Slots move `Free → Filling → Ready → InUse → Free`. Free and Ready slot indices travel
//! through `heapless` lock-free MPMC queues; nothing here allocates after [`Ring::new`].
//!
//! Loader threads *cooperate* on the next batch instead of owning every N-th one: work is a
//! global sequence of units (batch `t`, part `p`), claimed with one atomic increment. The first
//! thread to touch batch `t` takes a Free slot for it; the others find that slot in a small
//! assignment table. A part covers `part_records` consecutive records of the batch, so the parts
//! of one slot are disjoint, and every unit is claimed by exactly one thread: that is what makes
//! the mutable views handed out by [`Ring::claim`] exclusive. The thread that finishes a slot's
//! last part marks it Ready. The consumer takes batches strictly in order (`t = 0, 1, 2…`), so a
//! run is deterministic whatever thread filled what.

mod doorbell;
mod memory;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use heapless::mpmc::Queue;

use crate::base::{HostMemory, SlotBytes, SlotMemory};
use doorbell::Doorbell;
pub use memory::RingMemory;

/// Most slots a ring can have (the capacity of the lock-free index queues).
pub const MAX_SLOTS: usize = 64;
/// Entries of the batch → slot table; more than slots + loader threads can ever have in flight.
const ASSIGN_CAP: usize = 256;
const UNASSIGNED: u64 = 0;
const RESERVING: u64 = 0xFF;
const SLEEP: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SlotState {
    Free = 0,
    Filling = 1,
    Ready = 2,
    InUse = 3,
}

/// Shape of a ring, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingShape {
    /// Slots (`D`), 1..=MAX_SLOTS.
    pub slots: usize,
    /// Records per batch (`B`).
    pub batch: usize,
    /// Bytes per record (page-aligned for `O_DIRECT`).
    pub record_size: usize,
    /// Records per unit of loader work; the last part of a batch may be shorter.
    pub part_records: usize,
}

impl RingShape {
    pub fn slot_bytes(&self) -> usize {
        self.batch * self.record_size
    }
    pub fn bytes(&self) -> usize {
        self.slots * self.slot_bytes()
    }
    pub fn parts_per_batch(&self) -> usize {
        self.batch.div_ceil(self.part_records)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a ring of {slots} slots (--ring): use 1 to {MAX_SLOTS}")]
    Slots { slots: usize },
    #[error("ring shape has a zero batch, record size or part size")]
    EmptyShape,
    #[error("ring slot memory is {have} bytes but {need} are needed")]
    MemoryTooSmall { have: usize, need: usize },
    #[error("could not allocate {bytes} bytes of ring memory")]
    Alloc { bytes: usize },
}

/// The failure that stopped the loaders, handed to the consumer.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

pub struct Ring {
    shape: RingShape,
    memory: Box<dyn SlotMemory>,
    states: Box<[AtomicU8]>,
    /// Parts still being filled, per slot.
    remaining: Box<[AtomicU32]>,
    /// Batch held by each slot.
    slot_batch: Box<[AtomicU64]>,
    /// Batch `t` → `(t + 1) << 8 | slot`, at `t % ASSIGN_CAP`.
    assign: Box<[AtomicU64]>,
    free: Queue<u8, MAX_SLOTS>,
    ready: Queue<u8, MAX_SLOTS>,
    next_unit: AtomicU64,
    /// The next batch to be given a slot.
    next_assign: AtomicU64,
    total_batches: u64,
    free_bell: Doorbell,
    ready_bell: Doorbell,
    stopped: AtomicBool,
    failure: Mutex<Option<Failure>>,
}

/// A unit of loader work: part `part` of batch `batch`, to be written into `records`.
pub struct Claim<'r> {
    ring: &'r Ring,
    pub batch: u64,
    pub part: usize,
    pub slot: usize,
    /// Index within the batch of the first record of this part.
    pub first: usize,
    /// This part's records, `record_size` bytes each, exclusively this thread's.
    pub records: &'r mut [u8],
    /// Time spent waiting for a Free slot while claiming.
    pub waited: Duration,
    completed: bool,
}

impl Claim<'_> {
    /// Marks the part done; the last part of a batch makes its slot Ready.
    pub fn complete(mut self) {
        self.completed = true;
        self.ring.part_done(self.slot);
    }
}

impl Drop for Claim<'_> {
    /// A claim dropped unfinished (its thread returned early or panicked) would leave its batch
    /// Filling forever and the consumer waiting: stop the ring instead, so it gets an error.
    fn drop(&mut self) {
        if !self.completed {
            let why = format!(
                "a loader gave up on batch {} without finishing it",
                self.batch
            );
            self.ring.stop(Some(why.into()));
        }
    }
}

impl Ring {
    /// A ring over fresh, zeroed, page-aligned host memory.
    pub fn new(shape: RingShape, total_batches: u64) -> Result<Self, Error> {
        let bytes = shape.bytes();
        let memory = HostMemory::zeroed(bytes).ok_or(Error::Alloc { bytes })?;
        Self::with_memory(shape, total_batches, Box::new(memory))
    }

    /// A ring over caller-provided memory (e.g. Vulkan host-visible memory).
    pub fn with_memory(
        shape: RingShape,
        total_batches: u64,
        memory: Box<dyn SlotMemory>,
    ) -> Result<Self, Error> {
        if shape.slots == 0 || shape.slots > MAX_SLOTS {
            return Err(Error::Slots { slots: shape.slots });
        }
        if shape.batch == 0 || shape.record_size == 0 || shape.part_records == 0 {
            return Err(Error::EmptyShape);
        }
        if memory.len() < shape.bytes() {
            return Err(Error::MemoryTooSmall {
                have: memory.len(),
                need: shape.bytes(),
            });
        }
        let ring = Ring {
            shape,
            memory,
            states: (0..shape.slots)
                .map(|_| AtomicU8::new(SlotState::Free as u8))
                .collect(),
            remaining: (0..shape.slots).map(|_| AtomicU32::new(0)).collect(),
            slot_batch: (0..shape.slots).map(|_| AtomicU64::new(u64::MAX)).collect(),
            assign: (0..ASSIGN_CAP)
                .map(|_| AtomicU64::new(UNASSIGNED))
                .collect(),
            free: new_queue(),
            ready: new_queue(),
            next_unit: AtomicU64::new(0),
            next_assign: AtomicU64::new(0),
            total_batches,
            free_bell: Doorbell::default(),
            ready_bell: Doorbell::default(),
            stopped: AtomicBool::new(false),
            failure: Mutex::new(None),
        };
        for s in 0..shape.slots {
            push(&ring.free, s);
        }
        Ok(ring)
    }

    /// Heap bytes of a ring's bookkeeping (states, counters, the assignment table) besides
    /// its slot memory.
    pub fn bookkeeping_bytes(slots: usize) -> usize {
        slots * (1 + 4 + 8) + ASSIGN_CAP * 8 + std::mem::size_of::<Ring>()
    }

    pub fn shape(&self) -> &RingShape {
        &self.shape
    }

    pub fn total_batches(&self) -> u64 {
        self.total_batches
    }

    pub fn memory_kind(&self) -> &'static str {
        self.memory.kind()
    }

    /// Each slot's memory, for registering with io_uring (or importing into a device).
    pub fn slot_regions(&self) -> Vec<(std::ptr::NonNull<u8>, usize)> {
        let bytes = self.shape.slot_bytes();
        (0..self.shape.slots)
            // SAFETY: `s * bytes < memory.len()` (checked in `with_memory`), so in bounds.
            .map(|s| (unsafe { self.memory.base().add(s * bytes) }, bytes))
            .collect()
    }

    pub fn state(&self, slot: usize) -> SlotState {
        match self.states[slot].load(Acquire) {
            0 => SlotState::Free,
            1 => SlotState::Filling,
            2 => SlotState::Ready,
            _ => SlotState::InUse,
        }
    }

    fn transition(&self, slot: usize, from: SlotState, to: SlotState) {
        let moved = self.states[slot].compare_exchange(from as u8, to as u8, AcqRel, Acquire);
        assert!(
            moved.is_ok(),
            "ring slot {slot}: {:?} → {to:?} from {:?}",
            from,
            self.state(slot)
        );
    }

    /// Stops everything; the first failure is kept for the consumer. Wakes all sleepers.
    pub fn stop(&self, failure: Option<Failure>) {
        if let Some(f) = failure {
            let mut kept = self.failure.lock().unwrap_or_else(|p| p.into_inner());
            kept.get_or_insert(f);
        }
        self.stopped.store(true, Release);
        self.free_bell.ring();
        self.ready_bell.ring();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Acquire)
    }

    fn take_failure(&self) -> Option<Failure> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Claims the next unit of work, or `None` when every batch is claimed or the ring stopped.
    /// Blocks while no slot is free (back-pressure from a slow consumer).
    pub fn claim(&self) -> Option<Claim<'_>> {
        if self.is_stopped() {
            return None;
        }
        let parts = self.shape.parts_per_batch() as u64;
        let unit = self.next_unit.fetch_add(1, Relaxed);
        let (batch, part) = (unit / parts, (unit % parts) as usize);
        if batch >= self.total_batches {
            return None;
        }
        let started = Instant::now();
        let slot = self.slot_for(batch)?;
        let first = part * self.shape.part_records;
        let count = self.shape.part_records.min(self.shape.batch - first);
        let rs = self.shape.record_size;
        let offset = slot * self.shape.slot_bytes() + first * rs;
        // SAFETY: the range lies inside slot `slot` (first + count <= batch), which is Filling
        // for `batch` until all its parts complete; unit (batch, part) was handed to this thread
        // alone by the atomic increment above and parts of a batch are disjoint, so no other
        // live reference to these bytes exists until `complete`.
        let records = unsafe {
            std::slice::from_raw_parts_mut(self.memory.base().as_ptr().add(offset), count * rs)
        };
        Some(Claim {
            ring: self,
            batch,
            part,
            slot,
            first,
            records,
            waited: started.elapsed(),
            completed: false,
        })
    }

    /// The slot holding `batch`, taking a Free one if this thread is the first to need it.
    fn slot_for(&self, batch: u64) -> Option<usize> {
        let entry = &self.assign[(batch % ASSIGN_CAP as u64) as usize];
        let tag = (batch + 1) << 8;
        loop {
            let v = entry.load(Acquire);
            if v & !0xFF == tag {
                if v & 0xFF != RESERVING {
                    return Some((v & 0xFF) as usize);
                }
                // Another thread is getting the slot for this batch.
                if self.is_stopped() {
                    return None;
                }
                std::thread::yield_now();
                continue;
            }
            if entry
                .compare_exchange(v, tag | RESERVING, AcqRel, Acquire)
                .is_err()
            {
                continue;
            }
            // Slots go to batches strictly in order. Otherwise later batches could take every
            // slot while batch `t` waits for one, and the in-order consumer would wait for `t`
            // forever. The thread assigning `t - 1` is already inside this function (all units of
            // `t - 1` were claimed before any of `t`), so the turn always comes.
            if !self.wait_for_turn(batch) {
                return None;
            }
            let slot = self.pop_free()?;
            self.transition(slot, SlotState::Free, SlotState::Filling);
            self.slot_batch[slot].store(batch, Relaxed);
            self.remaining[slot].store(self.shape.parts_per_batch() as u32, Relaxed);
            entry.store(tag | slot as u64, Release);
            self.next_assign.store(batch + 1, Release);
            self.free_bell.ring();
            return Some(slot);
        }
    }

    /// Waits until every batch before `batch` has its slot; false if the ring stopped.
    fn wait_for_turn(&self, batch: u64) -> bool {
        loop {
            let seen = self.free_bell.generation();
            if self.next_assign.load(Acquire) == batch {
                return true;
            }
            if self.is_stopped() {
                return false;
            }
            self.free_bell.wait(seen, SLEEP);
        }
    }

    fn pop_free(&self) -> Option<usize> {
        loop {
            let seen = self.free_bell.generation();
            if let Some(s) = self.free.dequeue() {
                return Some(s as usize);
            }
            if self.is_stopped() {
                return None;
            }
            self.free_bell.wait(seen, SLEEP);
        }
    }

    fn part_done(&self, slot: usize) {
        if self.remaining[slot].fetch_sub(1, AcqRel) == 1 {
            self.transition(slot, SlotState::Filling, SlotState::Ready);
            push(&self.ready, slot);
            self.ready_bell.ring();
        }
    }

    fn release(&self, slot: usize) {
        self.transition(slot, SlotState::InUse, SlotState::Free);
        push(&self.free, slot);
        self.free_bell.ring();
    }
}

// heapless deprecates its MPMC queue because an operation can fail transiently while another
// thread is pre-empted inside one. That is harmless here: a queue never holds more than the
// ring's slots (≤ its capacity), so a failed push is always transient and is retried, and every
// pop sits in a loop that retries.
#[expect(deprecated)]
fn new_queue() -> Queue<u8, MAX_SLOTS> {
    Queue::new()
}

fn push(queue: &Queue<u8, MAX_SLOTS>, slot: usize) {
    while queue.enqueue(slot as u8).is_err() {
        std::thread::yield_now();
    }
}

/// The single consumer's side: takes batches strictly in order.
pub struct Consumer {
    next_batch: u64,
    /// Ready slots that arrived ahead of their turn: `parked[slot]` holds their batch.
    parked: [u64; MAX_SLOTS],
}

/// A Ready batch, borrowed from the ring until dropped (which frees the slot).
pub struct ReadyBatch<'r> {
    ring: &'r Ring,
    pub batch: u64,
    pub slot: usize,
    /// Time the consumer waited for this batch.
    pub waited: Duration,
}

impl ReadyBatch<'_> {
    /// The batch's records, `record_size` bytes each.
    pub fn records(&self) -> &[u8] {
        let bytes = self.ring.shape.slot_bytes();
        // SAFETY: the slot is InUse and owned by this value until drop; loaders write a slot
        // only while it is Filling, so no mutable view of these bytes is alive.
        unsafe {
            std::slice::from_raw_parts(
                self.ring.memory.base().as_ptr().add(self.slot * bytes),
                bytes,
            )
        }
    }

    /// [`ReadyBatch::records`] with the slot's identity: where it lies in memory a device
    /// imported, if the ring's memory is such.
    pub fn slot_bytes(&self) -> SlotBytes<'_> {
        SlotBytes::in_slot(
            &*self.ring.memory,
            self.records(),
            self.slot * self.ring.shape.slot_bytes(),
        )
    }

    /// Mutable access for in-place work by the consumer (e.g. normalising on the host).
    pub fn records_mut(&mut self) -> &mut [u8] {
        let bytes = self.ring.shape.slot_bytes();
        // SAFETY: as in `records`, and `&mut self` makes this the only view.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ring.memory.base().as_ptr().add(self.slot * bytes),
                bytes,
            )
        }
    }
}

impl Drop for ReadyBatch<'_> {
    fn drop(&mut self) {
        self.ring.release(self.slot);
    }
}

impl Default for Consumer {
    fn default() -> Self {
        Consumer {
            next_batch: 0,
            parked: [u64::MAX; MAX_SLOTS],
        }
    }
}

impl Consumer {
    /// The next batch in order; `Ok(None)` after the last; `Err` with the loaders' failure.
    pub fn next<'r>(&mut self, ring: &'r Ring) -> Result<Option<ReadyBatch<'r>>, Failure> {
        if self.next_batch >= ring.total_batches {
            return Ok(None);
        }
        let started = Instant::now();
        let want = self.next_batch;
        loop {
            if let Some(slot) = self.parked.iter().position(|&b| b == want) {
                self.parked[slot] = u64::MAX;
                ring.transition(slot, SlotState::Ready, SlotState::InUse);
                self.next_batch += 1;
                return Ok(Some(ReadyBatch {
                    ring,
                    batch: want,
                    slot,
                    waited: started.elapsed(),
                }));
            }
            let seen = ring.ready_bell.generation();
            if let Some(slot) = ring.ready.dequeue() {
                let slot = slot as usize;
                self.parked[slot] = ring.slot_batch[slot].load(Relaxed);
                continue;
            }
            if ring.is_stopped() {
                return match ring.take_failure() {
                    Some(f) => Err(f),
                    None => Err("the loaders were stopped".into()),
                };
            }
            ring.ready_bell.wait(seen, SLEEP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn shape(slots: usize, batch: usize, part: usize) -> RingShape {
        RingShape {
            slots,
            batch,
            record_size: 4096,
            part_records: part,
        }
    }

    /// Loaders stamp every record with (batch, index); the consumer checks order and content.
    fn run(slots: usize, batch: usize, part: usize, loaders: usize, batches: u64) {
        let ring = Arc::new(Ring::new(shape(slots, batch, part), batches).unwrap());
        let threads: Vec<_> = (0..loaders)
            .map(|_| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    while let Some(c) = ring.claim() {
                        for (j, rec) in c.records.chunks_exact_mut(4096).enumerate() {
                            rec[..8].copy_from_slice(&c.batch.to_le_bytes());
                            rec[8..16].copy_from_slice(&((c.first + j) as u64).to_le_bytes());
                        }
                        c.complete();
                    }
                })
            })
            .collect();
        let mut consumer = Consumer::default();
        let mut seen = 0;
        while let Some(b) = consumer.next(&ring).unwrap() {
            assert_eq!(b.batch, seen);
            for (j, rec) in b.records().chunks_exact(4096).enumerate() {
                assert_eq!(u64::from_le_bytes(rec[..8].try_into().unwrap()), seen);
                assert_eq!(u64::from_le_bytes(rec[8..16].try_into().unwrap()), j as u64);
            }
            seen += 1;
        }
        assert_eq!(seen, batches);
        for t in threads {
            t.join().unwrap();
        }
        assert!((0..slots).all(|s| ring.state(s) == SlotState::Free));
    }

    #[test]
    fn delivers_every_batch_in_order_with_cooperating_loaders() {
        run(4, 8, 3, 3, 200);
        run(1, 5, 5, 2, 50);
        run(2, 7, 1, 4, 100);
        run(64, 2, 1, 8, 500);
    }

    #[test]
    fn stop_with_failure_reaches_the_consumer_without_hanging() {
        let ring = Arc::new(Ring::new(shape(2, 4, 2), 1_000).unwrap());
        let r = ring.clone();
        let loader = std::thread::spawn(move || {
            let c = r.claim().unwrap();
            r.stop(Some("shard-00000.fsh: record 3: checksum mismatch".into()));
            drop(c); // never completed: the batch stays Filling; the first failure is kept
            assert!(r.claim().is_none());
        });
        let err = Consumer::default().next(&ring).err().expect("failure");
        assert!(err.to_string().contains("record 3"));
        loader.join().unwrap();
    }

    #[test]
    fn an_abandoned_claim_stops_the_ring_instead_of_hanging_the_consumer() {
        let ring = Arc::new(Ring::new(shape(1, 4, 4), 10).unwrap());
        let r = ring.clone();
        let panicked = std::thread::spawn(move || {
            let _claim = r.claim().unwrap();
            panic!("loader bug");
        })
        .join();
        assert!(panicked.is_err());
        let err = Consumer::default().next(&ring).err().expect("failure");
        assert!(err.to_string().contains("batch 0"), "{err}");
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(matches!(
            Ring::new(shape(0, 4, 1), 1),
            Err(Error::Slots { .. })
        ));
        assert!(matches!(
            Ring::new(shape(65, 4, 1), 1),
            Err(Error::Slots { .. })
        ));
        assert!(matches!(
            Ring::new(shape(2, 0, 1), 1),
            Err(Error::EmptyShape)
        ));
        let small = HostMemory::zeroed(4096).unwrap();
        assert!(matches!(
            Ring::with_memory(shape(2, 4, 1), 1, Box::new(small)),
            Err(Error::MemoryTooSmall { .. })
        ));
    }
}
