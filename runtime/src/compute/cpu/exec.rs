//! The CPU engine's executor: a [`Recording`]'s tensors as host memory, its steps run by the
//! Rust kernels of this module, in order.
//!
//! Every tensor and all working memory are allocated in [`CpuExec::new`]; [`CpuExec::run`]
//! allocates nothing (a step's output tensors are moved out of their slot and back, which
//! moves pointers, not data). Convolutions split their batch over the engine's thread pool.
//! Some steps run as one kernel (the module `compute::cpu::fusion` says which): a residual
//! add inside the conv that feeds it, a depthwise conv with the pointwise conv that reads it,
//! an upsampling with the pointwise conv after it.

use std::time::{Duration, Instant};

use super::arena::{Arena, TensorMut};
use super::band_copies::{self, BandCopies, BandedKernel, PartCopies};
use super::conv;
use super::decode::Candidate;
use super::fusion::{self, GradStore, ResidualAdd};
use super::image_major::{self, Layers};
use super::kernels::{self, KernelSet};
use super::schedule::{banded_kernel, schedule, Kernel};
use super::scratch::Scratch;
use super::{banded, separable, stem, upsampled};
use crate::base::MemoryPlan;
use crate::compute::ops::Conv2d;
use crate::compute::recording::{AccessError, Elem, Recording, RecordingError, Step, TensorId};
use crate::compute::storage::ArenaPlan;

/// What one run took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuTiming {
    pub wall: Duration,
    /// Per step, when per-step timing is on.
    pub per_step: Vec<Duration>,
}

/// See the module docs.
#[derive(Debug)]
pub struct CpuExec {
    recording: Recording,
    /// Where each `f32` tensor sits in `arena`.
    layout: ArenaPlan,
    arena: Arena,
    /// Byte tensors (records, detections), each its own; empty for `f32` tensors.
    byte_tensors: Vec<Vec<u8>>,
    scratch: Scratch,
    decode_scratch: Vec<Candidate>,
    per_step: bool,
    timings: Vec<Duration>,
    /// Per entry and step: whether a forward conv splits each image over the threads (a
    /// pointwise conv its pixels, others their channels) rather than its batch (chosen by
    /// measurement, see `CpuExec::choose_splits`).
    thread_split: Vec<Vec<bool>>,
    /// Per entry: the kernels a run runs, in order: steps, and steps run as one (see
    /// [`super::fusion`]). Made once, after the splits are chosen.
    schedule: Vec<Vec<Kernel>>,
    /// An upsampled pointwise conv's output at the small size ([`upsampled`]).
    upsampled_low: Vec<f32>,
    /// Whether steps may run as one (see [`CpuExec::set_fusion`]).
    fusion: bool,
    /// Per entry and kernel of its schedule: the kernel as one that reads and writes
    /// tensors in bands, where it runs so.
    in_bands: Vec<Vec<Option<BandedKernel>>>,
    /// Per entry and tensor: whether each part of the banded kernels keeps its band of it
    /// in a copy of its own ([`band_copies`]); the copies.
    banded: Vec<Vec<bool>>,
    band_copies: BandCopies,
    /// Per entry: its forward layers that run image by image, if any
    /// ([`image_major::every_entry`]), and which of `batch_one` runs them.
    image_major: Vec<Option<(Layers, usize)>>,
    /// The batch-1 executors of those layers, one per distinct recording (the inference and
    /// evaluation entries share one); each is out of its slot while it runs.
    batch_one: Vec<Option<Box<CpuExec>>>,
}

/// A byte tensor's contents given to a run in place of the tensor's own
/// ([`CpuExec::run_reading`]).
pub(crate) type Input<'a> = (TensorId, &'a [u8]);

/// The CPU engine's memory besides the tensors, sized from the recording before anything is
/// allocated: the kernels' per-thread scratch (packed GEMM panels, depthwise bands), the
/// decoder's candidates and an upsampled conv's small output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WorkingMemory {
    threads: usize,
    /// Floats of scratch per thread.
    scratch_per_thread: usize,
    decode_candidates: usize,
    upsampled_low: usize,
    /// The longest entry (per-step timings).
    steps: usize,
}

impl WorkingMemory {
    fn of(recording: &Recording, threads: usize) -> WorkingMemory {
        let mut scratch = 0;
        let mut decode = 0;
        let mut steps = 0;
        for entry in &recording.entries {
            steps = steps.max(entry.steps.len());
            for step in &entry.steps {
                match step {
                    Step::ConvForward { op, .. } => {
                        scratch = scratch.max(conv::conv2d_forward_scratch_len(op))
                    }
                    Step::ConvBackward { op, .. } => {
                        scratch = scratch.max(conv::conv2d_backward_scratch_len(op))
                    }
                    Step::Decode { op, .. } => decode = decode.max(super::decode::scratch_len(op)),
                    _ => {}
                }
            }
        }
        // A batch-1 pair's depthwise band, an upsampled conv's small output (see
        // `CpuExec::plan`).
        let mut low = 0;
        for e in 0..recording.entries.len() {
            let steps = &recording.entries[e].steps;
            let upsampled = fusion::upsampled_pairs(recording, e);
            for (i, _) in upsampled.iter().enumerate().filter(|(_, &u)| u) {
                if let (Step::UpsampleForward { op: up, .. }, Step::ConvForward { op: pw, .. }) =
                    (&steps[i], &steps[i + 1])
                {
                    low = low.max(upsampled::low_len(up, pw));
                    scratch = scratch.max(upsampled::scratch_len(up, pw));
                }
            }
            let pairs = fusion::separable_pairs(recording, e);
            for (step, pair) in recording.entries[e].steps.iter().zip(pairs) {
                if let (Step::ConvForward { op, .. }, Some(_)) = (step, pair) {
                    scratch = scratch.max(separable::bands_scratch_len(op, threads));
                }
            }
        }
        WorkingMemory {
            threads: Scratch::threads_for(threads),
            scratch_per_thread: scratch,
            decode_candidates: decode,
            upsampled_low: low,
            steps,
        }
    }

    /// [`WorkingMemory::of`], the scratch enough for the batch-1 executors of `layers` too:
    /// they run inside this executor's runs, on its scratch.
    fn with_layers(recording: &Recording, threads: usize, layers: &[Option<Layers>]) -> Self {
        let mut working = Self::of(recording, threads);
        for l in layers.iter().flatten() {
            let one = Self::of(&l.recording, threads).scratch_per_thread;
            working.scratch_per_thread = working.scratch_per_thread.max(one);
        }
        working
    }

    /// Adds its lines to `plan`; the kernel scratch's only where the executor holds its own.
    fn add_to(&self, own_scratch: bool, plan: &mut MemoryPlan) {
        if own_scratch {
            plan.add(
                format!("cpu engine: kernel scratch ({} threads)", self.threads),
                self.threads as u64,
                4 * self.scratch_per_thread as u64,
            );
        }
        plan.add(
            "cpu engine: decoder candidates and upsampling",
            1,
            (self.decode_candidates * std::mem::size_of::<Candidate>()) as u64
                + 4 * self.upsampled_low as u64,
        );
    }
}

/// Which forward convolutions of an entry split each image over the threads (see
/// [`crate::compute::cpu::conv2d_forward_split`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SplitChoice {
    /// Layers with fewer images than threads, where the choice was made.
    pub measured: usize,
    /// Those that split, named by shape.
    pub split: Vec<String>,
}

/// Split choices measured in this process ([`CpuExec::choose_splits`]), by layer and thread
/// count, the latest last. A layer set up again (a daemon's reload, a fine-tune's swap, the
/// batch-1 executor of a fine-tune's frozen layers, which are the serving model's) takes its
/// choice from here instead of being timed again: timing every layer took about a second of
/// both cores for det-l, and beside a serving engine it measures the contention more than
/// the layers. A layer's time alone depends on its shape alone.
static MEASURED_SPLITS: std::sync::Mutex<Vec<MeasuredSplit>> = std::sync::Mutex::new(Vec::new());

/// A layer, the threads it was measured on, and whether it splits.
type MeasuredSplit = (Conv2d, usize, bool);

/// Layers [`MEASURED_SPLITS`] keeps (a few models' worth).
const MEASURED_KEPT: usize = 512;

fn measured_split(op: &Conv2d, threads: usize) -> Option<bool> {
    let known = MEASURED_SPLITS.lock().unwrap_or_else(|e| e.into_inner());
    known
        .iter()
        .find(|(o, t, _)| *t == threads && o == op)
        .map(|&(.., split)| split)
}

fn remember_split(op: &Conv2d, threads: usize, split: bool) {
    let mut known = MEASURED_SPLITS.lock().unwrap_or_else(|e| e.into_inner());
    known.retain(|(o, t, _)| !(*t == threads && o == op));
    if known.len() >= MEASURED_KEPT {
        known.remove(0);
    }
    known.push((*op, threads, split));
}

/// Why [`CpuExec::new`] refused a recording.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error(transparent)]
    Kernels(#[from] kernels::ChoiceError),
}

impl CpuExec {
    /// Allocates every tensor (zeroed; intermediate ones sharing memory where their
    /// lifetimes allow, [`ArenaPlan::shared`]) and the kernels' working memory for `threads`
    /// threads. A `FULCRUM_CPU_KERNELS` this CPU cannot honour is an error here, before any
    /// kernel runs. The forward layers of a batch that no entry trains run image by image
    /// (the module `compute::cpu::image_major`), their activations one image's worth in an
    /// executor of their own.
    pub fn new(recording: &Recording, threads: usize) -> Result<CpuExec, SetupError> {
        let layers = image_major::every_entry(recording, Scratch::threads_for(threads));
        let layout = Self::layout(recording, &layers);
        Self::with_layout(recording, Scratch::new(threads), false, layout, layers)
    }

    /// As [`CpuExec::new`], every kernel over the whole batch (no layers image by image):
    /// for comparisons.
    pub fn batch_major(recording: &Recording, threads: usize) -> Result<CpuExec, SetupError> {
        let layers = vec![None; recording.entries.len()];
        let layout = Self::layout(recording, &layers);
        Self::with_layout(recording, Scratch::new(threads), false, layout, layers)
    }

    /// As [`CpuExec::batch_major`], on the threads of `scratch` (its pool, shared) and with
    /// no kernel scratch of its own: for an executor that runs only inside another's run, on
    /// that one's scratch ([`image_major`]).
    fn sharing_threads(recording: &Recording, scratch: &Scratch) -> Result<CpuExec, SetupError> {
        let layers = vec![None; recording.entries.len()];
        let layout = Self::layout(recording, &layers);
        let scratch = Scratch::sharing_threads(scratch);
        Self::with_layout(recording, scratch, true, layout, layers)
    }

    /// Intermediate tensors share memory, kept apart wherever this engine may run their
    /// steps as one kernel; those that live only inside `layers` (per entry) get none.
    fn layout(recording: &Recording, layers: &[Option<Layers>]) -> ArenaPlan {
        let placed = image_major::placed(recording, layers);
        ArenaPlan::shared_among(
            recording,
            &|e| image_major::joined(recording, e, layers[e].as_ref()),
            &|t| placed[t.index()],
        )
    }

    /// As [`CpuExec::batch_major`], every tensor in its own memory: for comparisons that
    /// read intermediate activations after a run.
    pub fn separate(recording: &Recording, threads: usize) -> Result<CpuExec, SetupError> {
        let layers = vec![None; recording.entries.len()];
        let layout = ArenaPlan::separate(recording);
        Self::with_layout(recording, Scratch::new(threads), false, layout, layers)
    }

    /// The executor, with `scratch`'s threads and, unless it `shares_scratch` (borrowed per
    /// run from the executor it runs inside), its memory.
    fn with_layout(
        recording: &Recording,
        mut scratch: Scratch,
        shares_scratch: bool,
        layout: ArenaPlan,
        layers: Vec<Option<Layers>>,
    ) -> Result<CpuExec, SetupError> {
        let threads = scratch.threads();
        recording.validate()?;
        kernels::chosen()?;
        let arena = Arena::zeroed(layout.len);
        let byte_tensors = recording
            .tensors
            .iter()
            .map(|t| match t.elem {
                Elem::Bytes => vec![0; t.len],
                Elem::F32 => Vec::new(),
            })
            .collect();
        let working = WorkingMemory::with_layers(recording, threads, &layers);
        // (One that shares it holds its own only while it times its layers, below.)
        scratch.reserve(working.scratch_per_thread);
        let mut exec = CpuExec {
            recording: recording.clone(),
            layout,
            arena,
            byte_tensors,
            scratch,
            decode_scratch: Vec::with_capacity(working.decode_candidates),
            per_step: false,
            timings: Vec::with_capacity(working.steps),
            thread_split: recording
                .entries
                .iter()
                .map(|e| vec![false; e.steps.len()])
                .collect(),
            schedule: Vec::new(),
            upsampled_low: vec![0.0; working.upsampled_low],
            fusion: true,
            in_bands: Vec::new(),
            banded: Vec::new(),
            band_copies: Self::band_copies(recording, threads),
            image_major: Vec::new(),
            batch_one: Vec::new(),
        };
        exec.choose_splits();
        if shares_scratch {
            exec.scratch = Scratch::sharing_threads(&exec.scratch);
        }
        for layers in layers {
            let layers = layers.map(|l| {
                let known = exec
                    .batch_one
                    .iter()
                    .flatten()
                    .position(|one| *one.recording() == l.recording);
                let one = match known {
                    Some(i) => i,
                    None => {
                        let one = CpuExec::sharing_threads(&l.recording, &exec.scratch)?;
                        exec.batch_one.push(Some(Box::new(one)));
                        exec.batch_one.len() - 1
                    }
                };
                Ok::<_, SetupError>((l, one))
            });
            exec.image_major.push(layers.transpose()?);
        }
        exec.set_fusion(true);
        Ok(exec)
    }

    /// With `false`, every step runs on its own and writes every tensor it records, as for a
    /// comparison that reads intermediate activations (a fused kernel may leave a tensor
    /// that nothing else reads unwritten), but for layers run image by image, whose
    /// activations this executor does not hold ([`CpuExec::batch_major`] makes one without
    /// them). On by default; the outputs are the same either way.
    pub fn set_fusion(&mut self, on: bool) {
        self.fusion = on;
        let entries = 0..self.recording.entries.len();
        self.schedule = entries.clone().map(|e| self.plan(e)).collect();
        let threads = self.threads();
        self.in_bands = entries
            .clone()
            .map(|e| {
                let split = &self.thread_split[e];
                let kernels = self.schedule[e].iter();
                kernels
                    .map(|&k| banded_kernel(&self.recording, e, k, threads, split))
                    .collect()
            })
            .collect();
        self.banded = entries
            .map(|e| {
                let kernels: Vec<BandedKernel> =
                    self.in_bands[e].iter().flatten().cloned().collect();
                band_copies::banded_tensors(&self.recording, e, &kernels)
            })
            .collect();
    }

    /// The copies for every tensor that could be banded ([`band_copies`]): those banded
    /// were every batch-1 layer to split (the splits are chosen later, by timing).
    fn band_copies(recording: &Recording, threads: usize) -> BandCopies {
        let threads = Scratch::threads_for(threads);
        let rows = Self::could_be_banded(recording, threads);
        BandCopies::new(
            recording,
            &|e| fusion::joined_steps(recording, e),
            &rows,
            threads,
        )
    }

    /// Per tensor, the rows of its planes where it could be banded on `threads` threads: were
    /// every batch-1 layer to split (the splits are chosen later, by timing).
    fn could_be_banded(recording: &Recording, threads: usize) -> Vec<Option<usize>> {
        let mut could = vec![None; recording.tensors.len()];
        for (e, entry) in recording.entries.iter().enumerate() {
            let every_split = vec![true; entry.steps.len()];
            let schedule = schedule(recording, e, threads, true, &every_split);
            let kernels: Vec<BandedKernel> = schedule
                .iter()
                .filter_map(|&k| banded_kernel(recording, e, k, threads, &every_split))
                .collect();
            let banded = band_copies::banded_tensors(recording, e, &kernels);
            for k in kernels.iter().filter(|k| banded[k.writes.index()]) {
                could[k.writes.index()] = Some(k.rows);
            }
        }
        could
    }

    /// Time every step of a run (for per-kernel figures).
    pub fn set_per_step_timing(&mut self, on: bool) {
        self.per_step = on;
    }

    /// The engine's thread pool (none on one thread).
    pub fn pool(&self) -> Option<std::sync::Arc<super::pool::Pool>> {
        self.scratch.pool()
    }

    pub fn threads(&self) -> usize {
        self.scratch.threads()
    }

    /// The kernel set the steps run with (one per process).
    pub fn kernels(&self) -> KernelSet {
        kernels::active().set
    }

    /// Whether a forward conv leaves threads idle when split over its batch and could split
    /// its channels instead: the layers [`CpuExec::choose_splits`] times.
    fn split_candidate(&self, op: &Conv2d) -> bool {
        (op.n as usize) < self.threads() && conv::splits_by_channels(op)
    }

    /// Everything [`CpuExec::new`] allocates for `recording` on `threads` threads, item by
    /// item, without allocating it.
    pub fn memory_plan(recording: &Recording, threads: usize) -> MemoryPlan {
        Self::plan_of(recording, threads, true)
    }

    /// [`CpuExec::memory_plan`], the kernel scratch left out unless `own_scratch`.
    pub(super) fn plan_of(recording: &Recording, threads: usize, own_scratch: bool) -> MemoryPlan {
        let mut plan = MemoryPlan::default();
        let layers = image_major::every_entry(recording, Scratch::threads_for(threads));
        Self::layout(recording, &layers).add_to(recording, &mut plan);
        WorkingMemory::with_layers(recording, threads, &layers).add_to(own_scratch, &mut plan);
        let threads = Scratch::threads_for(threads);
        let rows = Self::could_be_banded(recording, threads);
        let joined = |e| fusion::joined_steps(recording, e);
        BandCopies::add_planned(recording, &joined, &rows, threads, &mut plan);
        Layers::add_planned(&layers, threads, &mut plan);
        plan
    }

    /// Bytes this executor holds: tensors and working memory.
    pub fn bytes(&self) -> u64 {
        self.layout.bytes()
            + self
                .byte_tensors
                .iter()
                .map(|b| b.len() as u64)
                .sum::<u64>()
            + self.band_copies.bytes()
            + 4 * (self.scratch.len() + self.upsampled_low.capacity()) as u64
            + (self.decode_scratch.capacity() * std::mem::size_of::<Candidate>()) as u64
            + self
                .batch_one
                .iter()
                .flatten()
                .map(|one| one.bytes())
                .sum::<u64>()
    }

    pub fn recording(&self) -> &Recording {
        &self.recording
    }

    pub(crate) fn f32s(&self, id: TensorId) -> &[f32] {
        let len = self.recording.get(id).len;
        self.arena.slice(self.layout.offset(id), len)
    }

    /// Byte tensor `id`, or the run's input where it stands in for it
    /// ([`CpuExec::run_reading`]).
    pub(crate) fn bytes_of<'a>(&'a self, id: TensorId, input: Option<Input<'a>>) -> &'a [u8] {
        match input {
            Some((tensor, bytes)) if tensor == id => bytes,
            _ => &self.byte_tensors[id.index()],
        }
    }

    /// An f32 tensor's memory, to write; [`CpuExec::put`] ends that. Only the step that
    /// writes it takes it, once.
    pub(crate) fn take(&mut self, id: TensorId) -> TensorMut {
        let len = self.recording.get(id).len;
        // SAFETY: the layout places every two tensors that are live at once — every two one
        // step (or one fused kernel) touches among them — at disjoint offsets, so while a
        // step writes this tensor no view it makes of another covers its floats; the view
        // ends (`put`) before the step does, and the arena outlives it (both are `self`'s).
        unsafe { self.arena.slice_mut(self.layout.offset(id), len) }
    }

    pub(crate) fn take_bytes(&mut self, id: TensorId) -> Vec<u8> {
        std::mem::take(&mut self.byte_tensors[id.index()])
    }

    /// Ends a step's writing of `id` (see [`CpuExec::take`]).
    pub(crate) fn put(&mut self, _id: TensorId, _written: TensorMut) {}

    pub(crate) fn put_bytes(&mut self, id: TensorId, v: Vec<u8>) {
        self.byte_tensors[id.index()] = v;
    }

    /// The kernels' scratch, to lend a kernel; [`CpuExec::put_scratch`] gives it back.
    pub(crate) fn take_scratch(&mut self) -> Scratch {
        std::mem::take(&mut self.scratch)
    }

    pub(crate) fn put_scratch(&mut self, scratch: Scratch) {
        self.scratch = scratch;
    }

    /// The decoder's candidates, to lend it; [`CpuExec::put_decode_scratch`] gives them back.
    pub(crate) fn take_decode_scratch(&mut self) -> Vec<Candidate> {
        std::mem::take(&mut self.decode_scratch)
    }

    pub(crate) fn put_decode_scratch(&mut self, scratch: Vec<Candidate>) {
        self.decode_scratch = scratch;
    }

    /// The kernels of entry `entry` (see [`schedule`]), with the splits chosen.
    fn plan(&self, entry: usize) -> Vec<Kernel> {
        let kernels = schedule(
            &self.recording,
            entry,
            self.threads(),
            self.fusion,
            &self.thread_split[entry],
        );
        // The layers that run image by image, as one kernel in place of theirs, fused or
        // not: their activations have no place in this executor's memory.
        let Some((layers, _)) = self.image_major[entry].as_ref() else {
            return kernels;
        };
        let r = layers.steps.clone();
        let mut plan = Vec::with_capacity(kernels.len());
        for k in kernels {
            let s = k.steps();
            if s.end <= r.start || s.start >= r.end {
                plan.push(k);
            } else {
                assert!(
                    s.start >= r.start && s.end <= r.end,
                    "image_major: kernel {k:?} straddles steps {r:?}"
                );
                if s.start == r.start {
                    plan.push(Kernel::ImageMajor {
                        first: r.start,
                        end: r.end,
                    });
                }
            }
        }
        plan
    }

    /// A name for each kernel a run of entry `entry` runs, in order (what
    /// [`CpuTiming::per_step`] times): its steps', those run as one joined by `+`.
    pub fn kernel_names(&self, entry: usize) -> Vec<String> {
        let steps = &self.recording.entries[entry].steps;
        let name = |i: usize| steps[i].name();
        self.schedule[entry]
            .iter()
            .map(|k| match *k {
                Kernel::Step(i) => name(i).to_owned(),
                Kernel::ConvAdd(i, _) | Kernel::UpsampleAdd(i, _) => format!("{}+add", name(i)),
                Kernel::NormalizedStem(i) => format!("{}+{}", name(i), name(i + 1)),
                Kernel::Backward { i, store, .. } => match store.and_then(|s| s.add) {
                    Some(_) => format!("{}+add-assign", name(i)),
                    None => name(i).to_owned(),
                },
                Kernel::Separable { i, add, .. } | Kernel::Upsampled { i, add } => {
                    let add = if add.is_some() { "+add" } else { "" };
                    format!("{}+{}{add}", name(i), name(i + 1))
                }
                Kernel::ImageMajor { first, end } => {
                    format!("{} layers image by image", end - first)
                }
            })
            .collect()
    }

    /// Runs entry `entry`.
    pub fn run(&mut self, entry: usize) -> Result<CpuTiming, AccessError> {
        self.run_with(entry, None)
    }

    /// Runs entry `entry` reading `bytes` as the start of byte tensor `id`, as
    /// [`CpuExec::write_bytes`] then [`CpuExec::run`] would: in place when they fill the
    /// tensor (a whole batch in its ring slot: no copy), else written first. The tensor
    /// itself is left as it was when read in place.
    pub fn run_reading(
        &mut self,
        entry: usize,
        id: TensorId,
        bytes: &[u8],
    ) -> Result<CpuTiming, AccessError> {
        self.host_access(id, Elem::Bytes, bytes.len())?;
        if bytes.len() == self.byte_tensors[id.index()].len() {
            self.run_with(entry, Some((id, bytes)))
        } else {
            self.write_bytes(id, bytes)?;
            self.run(entry)
        }
    }

    pub(super) fn run_with(
        &mut self,
        entry: usize,
        input: Option<Input<'_>>,
    ) -> Result<CpuTiming, AccessError> {
        self.recording.check_entry(entry)?;
        let started = Instant::now();
        self.timings.clear();
        // Small jobs one after another (see `choose_splits`): keep the pool's threads awake.
        let spin = self.thread_split[entry].iter().any(|&s| s);
        if let Some(pool) = self.scratch.pool() {
            pool.set_spinning(spin);
        }
        // Steps are cloned one at a time (plain data, no heap) so `self` can be borrowed.
        for k in 0..self.schedule[entry].len() {
            let t0 = Instant::now();
            let in_bands = self.in_bands[entry][k].is_some();
            match self.schedule[entry][k] {
                Kernel::Step(i) if in_bands => self.pointwise_bands(entry, i, None),
                Kernel::ConvAdd(i, add) if in_bands => self.pointwise_bands(entry, i, Some(add)),
                Kernel::UpsampleAdd(i, add) if in_bands => self.upsample_add_bands(entry, i, add),
                Kernel::NormalizedStem(i) if in_bands => self.stem_bands(entry, i, input),
                Kernel::Step(i) => {
                    let step = self.recording.entries[entry].steps[i].clone();
                    self.step(&step, self.thread_split[entry][i], input);
                }
                Kernel::ConvAdd(i, add) => {
                    let step = self.recording.entries[entry].steps[i].clone();
                    self.conv_add(&step, add, self.thread_split[entry][i]);
                }
                Kernel::UpsampleAdd(i, add) => {
                    let Step::UpsampleForward { op, x, .. } =
                        self.recording.entries[entry].steps[i]
                    else {
                        unreachable!("fusion: an upsampling with its add");
                    };
                    let mut out = self.take(add.out);
                    let (x, residual) = (self.f32s(x), self.f32s(add.residual));
                    let pool = self.scratch.pool();
                    upsampled::upsample_add_split(pool.as_deref(), &op, x, residual, &mut out);
                    self.put(add.out, out);
                }
                Kernel::Separable { i, add, bands } => {
                    let steps = &self.recording.entries[entry].steps;
                    let pair = [steps[i].clone(), steps[i + 1].clone()];
                    self.separable(entry, pair, add, bands);
                }
                Kernel::Upsampled { i, add } => {
                    let steps = &self.recording.entries[entry].steps;
                    let pair = [steps[i].clone(), steps[i + 1].clone()];
                    self.upsampled(pair, add, self.thread_split[entry][i + 1]);
                }
                Kernel::NormalizedStem(i) => {
                    let steps = &self.recording.entries[entry].steps;
                    let pair = [steps[i].clone(), steps[i + 1].clone()];
                    self.normalized_stem(pair, self.thread_split[entry][i + 1], input);
                }
                Kernel::Backward {
                    i,
                    store,
                    gy_masked,
                } => {
                    let step = self.recording.entries[entry].steps[i].clone();
                    self.conv_backward(&step, store.unwrap_or_default(), gy_masked);
                }
                Kernel::ImageMajor { .. } => {
                    self.image_major(entry, input)?;
                    if let Some(pool) = self.scratch.pool() {
                        pool.set_spinning(spin);
                    }
                }
            }
            if self.per_step {
                self.timings.push(t0.elapsed());
            }
        }
        Ok(CpuTiming {
            wall: started.elapsed(),
            per_step: if self.per_step {
                self.timings.clone()
            } else {
                Vec::new()
            },
        })
    }

    /// Entry `entry`'s layers that run image by image, on their batch-1 executor (each out
    /// of its slot while it runs: moved, not copied).
    fn image_major(&mut self, entry: usize, input: Option<Input<'_>>) -> Result<(), AccessError> {
        let (layers, i) = self.image_major[entry]
            .take()
            .expect("planned with its layers");
        let mut one = self.batch_one[i]
            .take()
            .expect("a batch-1 executor per recording");
        one.put_scratch(self.take_scratch());
        let done = layers.run(&mut one, self, input);
        self.put_scratch(one.take_scratch());
        self.batch_one[i] = Some(one);
        self.image_major[entry] = Some((layers, i));
        done
    }

    /// A forward conv with fewer images than threads leaves threads idle when split over its
    /// batch; split within each image instead, it pays a wake-up of the pool that a small
    /// layer does not earn back. So each such layer is timed both ways here, alternating
    /// (the tensors hold zeros; the timing does not depend on values), and keeps the faster.
    /// Both ways give identical outputs.
    fn choose_splits(&mut self) {
        let Some(pool) = self.scratch.pool() else {
            return;
        };
        let threads = pool.threads();
        // Each layer shape to time: the entry and step of its first, and the fastest time of
        // each way; every step of a shape then takes the same choice.
        let mut layers: Vec<(usize, usize, Conv2d, Duration, Duration)> = Vec::new();
        let mut unknown = Vec::new();
        for (e, entry) in self.recording.entries.iter().enumerate() {
            let stems = fusion::normalized_stems(&self.recording, e);
            for (i, step) in entry.steps.iter().enumerate() {
                if let Step::ConvForward { op, .. } = step {
                    if !self.split_candidate(op) {
                        continue;
                    }
                    // A stem that runs fused with its normalisation splits its output rows
                    // (`stem::forward_split_rows`: each thread reads only its band's input
                    // rows), which the conv timed alone here cannot show: alone it splits
                    // its channels, every thread splitting every input row, and often lost
                    // by that. The stem is det-s's largest layer, and whether it split
                    // changed from one process to the next (alone, at 2 threads: 64 against
                    // 116 µs, one thread 111). Its row split does no work twice: always.
                    if self.fusion && i > 0 && stems[i - 1] {
                        self.thread_split[e][i] = true;
                        continue;
                    }
                    if let Some(split) = measured_split(op, threads) {
                        self.thread_split[e][i] = split;
                        continue;
                    }
                    unknown.push((e, i, *op));
                    if !layers.iter().any(|(.., shape, _, _)| shape == op) {
                        layers.push((e, i, *op, Duration::MAX, Duration::MAX));
                    }
                }
            }
        }
        if layers.is_empty() {
            return;
        }
        pool.set_spinning(true);
        // Rounds over every layer, so that a layer's timings are spread over the whole
        // set-up, not one stretch of it that a busy moment of the host can cover; and the
        // fastest of each way, as time taken from this process (another one running, a VM's
        // core lent elsewhere) only ever adds. Medians of one stretch per layer had flipped
        // the choice from one run to the next (3 to 9 of det-s's 19 layers at 2 threads on
        // a shared VM, forward 0.24–0.30 ms where every layer split gives 0.19).
        for _ in 0..7 {
            for (e, i, _, whole, split) in layers.iter_mut() {
                let step = self.recording.entries[*e].steps[*i].clone();
                for (best, how) in [(whole, false), (split, true)] {
                    let t = Instant::now();
                    for _ in 0..3 {
                        self.step(&step, how, None);
                    }
                    *best = (*best).min(t.elapsed());
                }
            }
        }
        // The split must win clearly, as it costs the other threads' time.
        for (.., op, whole, split) in layers {
            let wins = split.as_secs_f64() < 0.9 * whole.as_secs_f64();
            remember_split(&op, threads, wins);
        }
        for (e, i, op) in unknown {
            self.thread_split[e][i] = measured_split(&op, threads).unwrap_or(false);
        }
    }

    /// Which batch-1 forward convs of entry `entry` split over the threads (timed both ways per
    /// layer when the executor was made; a stem fused with its normalisation always splits).
    pub fn split_choice(&self, entry: usize) -> SplitChoice {
        let mut choice = SplitChoice {
            measured: 0,
            split: Vec::new(),
        };
        let Some(e) = self.recording.entries.get(entry) else {
            return choice;
        };
        for (step, &split) in e.steps.iter().zip(&self.thread_split[entry]) {
            if let Step::ConvForward { op, .. } = step {
                if self.split_candidate(op) {
                    choice.measured += 1;
                    if split {
                        choice.split.push(format!(
                            "{:?} {}→{} at {}×{}",
                            op.kind(),
                            op.c_in,
                            op.c_out,
                            op.h,
                            op.w
                        ));
                    }
                }
            }
        }
        choice
    }

    /// A depthwise and a pointwise [`Step::ConvForward`] run as one, with the residual add
    /// after them in the store where given (see [`Kernel::Separable`]).
    fn separable(
        &mut self,
        entry: usize,
        [dw, pw]: [Step; 2],
        add: Option<ResidualAdd>,
        bands: bool,
    ) {
        let (
            Step::ConvForward {
                op: dw_op,
                x,
                w: dw_w,
                b: dw_b,
                y: d,
            },
            Step::ConvForward {
                op: pw_op,
                w: pw_w,
                b: pw_b,
                y,
                ..
            },
        ) = (dw, pw)
        else {
            unreachable!("fusion: a pair is two convs");
        };
        let out_id = add.map_or(y, |a| a.out);
        // Where not banded, the pair writes the depthwise output too.
        let mut taken = (!bands).then(|| (self.take(out_id), self.take(d)));
        let mut scratch = std::mem::take(&mut self.scratch);
        let pair = separable::Pair {
            dw: &dw_op,
            dw_weight: self.f32s(dw_w),
            dw_bias: self.f32s(dw_b),
            pw: &pw_op,
            pw_weight: self.f32s(pw_w),
            pw_bias: self.f32s(pw_b),
        };
        if bands {
            let x = self.part_copies(entry, x);
            let residual = add.map(|a| self.part_copies(entry, a.residual));
            let out = self.part_copies(entry, out_id);
            // SAFETY: the three are tensors of the pair's shapes in the arena (and their
            // copies), placed apart by the layouts (one kernel touches them together), and
            // nothing else runs while the kernel does; a banded one was written by a banded
            // kernel before (`banded_tensors`: a banded kernel writes it, only banded ones
            // read it, and nothing else touches it).
            let done = unsafe { separable::forward_bands(&pair, x, residual, out, &mut scratch) };
            assert!(
                done,
                "a banded pair is planned only with a pool and a fused GEMM"
            );
        } else {
            let (out, d_v) = taken.as_mut().expect("taken where not banded");
            let residual = add.map(|a| self.f32s(a.residual));
            let x = self.f32s(x);
            let pool = scratch.pool();
            separable::forward_images(&pair, x, d_v, residual, out, pool.as_deref());
        }
        self.scratch = scratch;
        if let Some((out, d_v)) = taken {
            self.put(d, d_v);
            self.put(out_id, out);
        }
    }

    /// Pointwise conv `i` of entry `entry` (with the add after it where given) split in bands
    /// of rows ([`banded::pointwise`]).
    fn pointwise_bands(&mut self, entry: usize, i: usize, add: Option<ResidualAdd>) {
        let Step::ConvForward { op, x, w, b, y } = self.recording.entries[entry].steps[i].clone()
        else {
            unreachable!("a banded pointwise kernel runs a conv");
        };
        let out = self.part_copies(entry, add.map_or(y, |a| a.out));
        let x = self.part_copies(entry, x);
        let residual = add.map(|a| self.part_copies(entry, a.residual));
        let pool = self.scratch.pool().expect("banded only with a pool");
        let (w, b) = (self.f32s(w), self.f32s(b));
        // SAFETY: tensors of the conv's shapes in the arena (and their copies), placed apart
        // by the layouts (one kernel touches them together); nothing else runs meanwhile; a
        // banded one was written by a banded kernel before (`banded_tensors`).
        let done = unsafe { banded::pointwise(&op, x, w, b, residual, out, &pool) };
        assert!(done, "banded only with a fused GEMM");
    }

    /// Upsampling `i` of entry `entry` and the add after it split in bands of rows
    /// ([`banded::upsample_add`]).
    fn upsample_add_bands(&mut self, entry: usize, i: usize, add: ResidualAdd) {
        let Step::UpsampleForward { op, x, .. } = self.recording.entries[entry].steps[i].clone()
        else {
            unreachable!("fusion: an upsampling with its add");
        };
        let x = self.part_copies(entry, x);
        let residual = self.part_copies(entry, add.residual);
        let out = self.part_copies(entry, add.out);
        let pool = self.scratch.pool().expect("banded only with a pool");
        // SAFETY: as in `pointwise_bands`.
        unsafe { banded::upsample_add(&pool, &op, x, residual, out) };
    }

    /// Normalisation `i` of entry `entry` and the stem after it, the stem's output rows split
    /// in bands ([`stem::forward_normalized_rows`]).
    fn stem_bands(&mut self, entry: usize, i: usize, input: Option<Input<'_>>) {
        let steps = &self.recording.entries[entry].steps;
        let (
            Step::Normalize {
                op: norm, records, ..
            },
            Step::ConvForward { op, w, b, y, .. },
        ) = (steps[i].clone(), steps[i + 1].clone())
        else {
            unreachable!("fusion: a normalisation and a conv");
        };
        let out = self.part_copies(entry, y);
        let pool = self.scratch.pool().expect("banded only with a pool");
        let (w, b) = (self.f32s(w), self.f32s(b));
        let records = self.bytes_of(records, input);
        // SAFETY: the output is a tensor of the stem's shape in the arena (and its copies)
        // that nothing else touches while the kernel runs.
        unsafe { stem::forward_normalized_rows(&norm, &op, records, w, b, out, &pool) };
    }

    /// Tensor `id` as the parts of entry `entry`'s banded kernels see it: banded or not
    /// ([`band_copies`]).
    fn part_copies(&self, entry: usize, id: TensorId) -> PartCopies {
        let len = self.recording.get(id).len;
        let main = self.arena.at(self.layout.offset(id), len);
        let banded = self.banded[entry][id.index()];
        self.band_copies.view(main, id, len, banded)
    }

    /// An upsampling and the pointwise conv that reads it run as one, with the residual add
    /// after them where given (see [`Kernel::Upsampled`]).
    fn upsampled(&mut self, [up, pw]: [Step; 2], add: Option<ResidualAdd>, split: bool) {
        let (
            Step::UpsampleForward { op: up, x, .. },
            Step::ConvForward {
                op: pw, w, b, y, ..
            },
        ) = (up, pw)
        else {
            unreachable!("fusion: an upsampling and a conv");
        };
        let out_id = add.map_or(y, |a| a.out);
        let mut out = self.take(out_id);
        let mut low = std::mem::take(&mut self.upsampled_low);
        let mut scratch = std::mem::take(&mut self.scratch);
        let residual = add.map(|a| self.f32s(a.residual));
        let params = (self.f32s(w), self.f32s(b));
        let x = self.f32s(x);
        upsampled::forward(
            &up,
            &pw,
            x,
            params,
            residual,
            &mut out,
            &mut low,
            &mut scratch,
            split,
        );
        self.scratch = scratch;
        self.upsampled_low = low;
        self.put(out_id, out);
    }

    /// A normalisation and the stem that reads it run as one (see [`Kernel::NormalizedStem`]).
    fn normalized_stem(&mut self, [norm, conv]: [Step; 2], split: bool, input: Option<Input<'_>>) {
        let (
            Step::Normalize {
                op: norm, records, ..
            },
            Step::ConvForward { op, w, b, y, .. },
        ) = (norm, conv)
        else {
            unreachable!("fusion: a normalisation and a conv");
        };
        let mut out = self.take(y);
        let pool = self.scratch.pool();
        let (weight, bias) = (self.f32s(w), self.f32s(b));
        let records = self.bytes_of(records, input);
        stem::forward_normalized(
            &norm,
            &op,
            records,
            weight,
            bias,
            &mut out,
            pool.as_deref(),
            split,
        );
        self.put(y, out);
    }

    /// A pointwise [`Step::ConvForward`] with the residual add after it folded into its store.
    fn conv_add(&mut self, step: &Step, add: ResidualAdd, split: bool) {
        let Step::ConvForward { op, x, w, b, .. } = *step else {
            unreachable!("fusion: only a conv takes an add");
        };
        let mut out = self.take(add.out);
        let mut scratch = std::mem::take(&mut self.scratch);
        conv::pointwise_forward_add(
            &op,
            self.f32s(x),
            self.f32s(w),
            self.f32s(b),
            self.f32s(add.residual),
            &mut out,
            &mut scratch,
            split,
        );
        self.scratch = scratch;
        self.put(add.out, out);
    }

    /// A conv's backward pass, with `store` in its input gradient's store and its output
    /// gradient masked already where `gy_masked` (see [`Kernel::Backward`]).
    fn conv_backward(&mut self, step: &Step, store: GradStore, gy_masked: bool) {
        step.conv_backward()
            .expect("a conv backward kernel runs a conv backward step")
            .run_cpu_with(self, store, gy_masked);
    }

    /// Runs one step, with its thread split (see [`schedule`]); the op's own module has its
    /// CPU twin (`compute::steps`).
    fn step(&mut self, step: &Step, thread_split: bool, input: Option<Input<'_>>) {
        step.with_op(|op| op.run_cpu(self, thread_split, input));
    }

    /// Checks that the host may read or write `given` of `id`'s `elem`s (all of an `f32`
    /// tensor, at most all of a byte tensor): a tensor that shares its memory holds another
    /// tensor's values between steps.
    fn host_access(&self, id: TensorId, elem: Elem, given: usize) -> Result<(), AccessError> {
        let t = self
            .recording
            .host_access(id, elem, given, elem == Elem::Bytes)?;
        if elem == Elem::F32 && !self.layout.holds(id) {
            return Err(AccessError::NotHeld {
                name: t.name.clone(),
            });
        }
        if elem == Elem::F32 && self.layout.is_shared(id) {
            return Err(AccessError::Shared {
                name: t.name.clone(),
            });
        }
        Ok(())
    }

    pub fn write_f32(&mut self, id: TensorId, data: &[f32]) -> Result<(), AccessError> {
        self.host_access(id, Elem::F32, data.len())?;
        self.take(id).copy_from_slice(data);
        Ok(())
    }

    pub fn read_f32(&mut self, id: TensorId, out: &mut [f32]) -> Result<(), AccessError> {
        self.host_access(id, Elem::F32, out.len())?;
        out.copy_from_slice(self.f32s(id));
        Ok(())
    }

    /// Writes `data` at the start of a byte tensor (it may be shorter than the tensor).
    pub fn write_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<(), AccessError> {
        self.host_access(id, Elem::Bytes, data.len())?;
        self.byte_tensors[id.index()][..data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Reads the start of a byte tensor into `out`.
    pub fn read_bytes(&mut self, id: TensorId, out: &mut [u8]) -> Result<(), AccessError> {
        self.host_access(id, Elem::Bytes, out.len())?;
        out.copy_from_slice(&self.byte_tensors[id.index()][..out.len()]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::SplitMix64;
    use crate::format::RecordLayout;
    use crate::model::{
        init, Arch, GraphOptions, ModelConfig, ModelGraph, ENTRY_INFER, ENTRY_TRAIN,
    };

    /// det-s for three classes, and its records' layout (eight boxes).
    fn det_s() -> (Arch, RecordLayout) {
        let model = ModelConfig::named("det-s", 3).expect("det-s");
        let layout = RecordLayout::new(model.input, model.input, 3, 8).expect("layout");
        (Arch::new(&model), layout)
    }

    /// `n` records of `layout` filled with random bytes from `seed`.
    fn random_records(layout: &RecordLayout, n: usize, seed: u64) -> Vec<u8> {
        let mut rng = SplitMix64::new(seed);
        (0..n * layout.record_size)
            .map(|_| rng.next_u64() as u8)
            .collect()
    }

    /// At batch 1 on two threads the stem, fused with its normalisation, always splits (its
    /// rows, which the channel split timed alone cannot show), whatever the timings say.
    #[test]
    fn a_fused_stem_always_splits_at_batch_1() {
        if kernels::active().dense3x3_half.is_none() {
            // No fused stem in this set (the portable one): nothing to split.
            return;
        }
        let (arch, layout) = det_s();
        let graph = ModelGraph::build(&arch, 1, &layout, &GraphOptions::default()).expect("graph");
        let infer = graph.entry(ENTRY_INFER);
        let stem = |choice: &SplitChoice| choice.split.iter().any(|s| s.starts_with("Dense 3→16"));
        for _ in 0..3 {
            let exec = CpuExec::new(&graph.recording, 2).expect("executor");
            let choice = exec.split_choice(infer);
            assert_eq!(choice.measured, 19, "det-s's batch-1 convs: {choice:?}");
            assert!(stem(&choice), "the stem did not split: {choice:?}");
        }
    }

    /// A layer set up again on as many threads takes the choice measured the first time (a
    /// reload must not time every layer again beside the serving engine), in the same
    /// recording or another (a fine-tune's frozen layers are the serving model's); another
    /// thread count is measured anew.
    #[test]
    fn split_choices_are_measured_once_per_layer_and_thread_count() {
        let (arch, _) = det_s();
        // A size no other test uses, so that this test's first set-up is the first.
        let layout = RecordLayout::new(160, 160, 3, 1).unwrap();
        let config = ModelConfig {
            input: 160,
            ..arch.config.clone()
        };
        let arch = Arch::new(&config);
        let graph = ModelGraph::build(&arch, 1, &layout, &GraphOptions::default()).expect("graph");
        let infer = graph.entry(ENTRY_INFER);
        let steps = &graph.recording.entries[infer].steps;
        let known = |threads: usize| -> Vec<Option<bool>> {
            let convs = steps.iter().filter_map(|s| match s {
                Step::ConvForward { op, .. } if conv::splits_by_channels(op) => Some(op),
                _ => None,
            });
            convs.map(|op| measured_split(op, threads)).collect()
        };
        assert!(known(2).iter().all(Option::is_none));
        let first = CpuExec::new(&graph.recording, 2).expect("executor");
        assert!(known(2).iter().all(Option::is_some), "{:?}", known(2));
        let again = CpuExec::new(&graph.recording, 2).expect("executor");
        assert_eq!(again.thread_split, first.thread_split);
        assert_eq!(
            again.split_choice(infer).split,
            first.split_choice(infer).split
        );
        // The same layers in another recording (one without the decoder's step).
        let mut other = graph.recording.clone();
        other.entries[infer].steps.pop();
        let other = CpuExec::new(&other, 2).expect("executor");
        assert_eq!(
            other.split_choice(infer).split,
            first.split_choice(infer).split
        );
        assert!(known(3).iter().all(Option::is_none));
    }

    /// A batch read in place predicts what the same batch written into the records tensor
    /// does, and leaves the tensor alone; a part of a batch is written first, as
    /// `write_bytes` would; a float tensor is refused.
    #[test]
    fn a_batch_read_in_place_predicts_what_a_written_one_does() {
        let (arch, layout) = det_s();
        let graph = ModelGraph::build(&arch, 2, &layout, &GraphOptions::default()).expect("graph");
        let infer = graph.entry(ENTRY_INFER);
        let records = random_records(&layout, 2, 5);
        let setup = || {
            let mut exec = CpuExec::new(&graph.recording, 1).expect("executor");
            for (p, v) in graph.params.iter().zip(init::init_params(&arch, 1)) {
                exec.write_f32(p.value, &v).expect("params");
            }
            exec
        };
        let predict = |exec: &mut CpuExec| {
            let mut pred = vec![0f32; graph.recording.get(graph.pred).len];
            exec.read_f32(graph.pred, &mut pred).expect("pred");
            pred
        };
        let (mut written, mut read) = (setup(), setup());
        written.write_bytes(graph.records, &records).unwrap();
        written.run(infer).unwrap();
        read.run_reading(infer, graph.records, &records).unwrap();
        let whole = predict(&mut written);
        assert!(whole == predict(&mut read), "in place: other predictions");
        let mut tensor = vec![1u8; records.len()];
        read.read_bytes(graph.records, &mut tensor).unwrap();
        assert!(tensor.iter().all(|&b| b == 0), "read in place, not copied");

        // One record of two: written into the tensor, whose second record stays (zeros).
        let first = &records[..layout.record_size];
        read.run_reading(infer, graph.records, first).unwrap();
        read.read_bytes(graph.records, &mut tensor).unwrap();
        assert!(tensor[..first.len()] == *first && tensor[first.len()..].iter().all(|&b| b == 0));
        let part = predict(&mut read);
        let half = part.len() / 2;
        assert!(
            part[..half] == whole[..half],
            "the first image's predictions"
        );

        let e = read.run_reading(infer, graph.pred, first).unwrap_err();
        assert!(
            matches!(
                e,
                AccessError::WrongElem {
                    held: Elem::F32,
                    asked: Elem::Bytes,
                    ..
                }
            ) && e.to_string().contains("holds floats, not bytes"),
            "{e}"
        );
    }

    /// det-s's inference pass runs its normalisation and stem, its depthwise-separable pairs,
    /// its neck (an upsampling and a pointwise conv) and its five residual adds as fused kernels and predicts exactly what the separate steps do: over the batch, and
    /// at batch 1 with each image split over two threads (forced here, where the executor
    /// would choose by timing), the pairs in bands. Training keeps every add (its backward
    /// pass reads the conv outputs). A batch runs its layers image by image (each as at
    /// batch 1) unless told not to, predicting the same again.
    #[test]
    fn fused_kernels_predict_what_the_separate_steps_do() {
        let (arch, layout) = det_s();
        let options = GraphOptions {
            train: true,
            ..GraphOptions::default()
        };
        let image = random_records(&layout, 1, 3);
        let set = kernels::active();
        let in_place = set.dw3x3_same.is_some() && set.gemm_fused.is_some();
        let mut predictions = Vec::new();
        for (batch, threads, split, fused, by_image) in [
            (1, 1, false, false, false),
            (1, 1, false, true, false),
            (1, 2, true, true, false),
            // Bands of uneven heights, and at 12 threads none at all for some parts of the
            // 8 × 8 planes: rows at a band's edge pass between non-neighbouring threads.
            (1, 3, true, true, false),
            (1, 12, true, true, false),
            (1, 2, false, true, false),
            (2, 2, false, true, false),
            (2, 2, false, false, false),
            (3, 2, false, true, true),
            (2, 1, false, true, true),
        ] {
            // Layers no entry trains run image by image: an inference graph's.
            let options = GraphOptions {
                train: !by_image,
                ..options
            };
            let graph = ModelGraph::build(&arch, batch, &layout, &options).expect("graph");
            let infer = graph.entry(ENTRY_INFER);
            let mut exec = match by_image {
                true => CpuExec::new(&graph.recording, threads),
                false => CpuExec::batch_major(&graph.recording, threads),
            }
            .expect("executor");
            let steps = &graph.recording.entries[infer].steps;
            for (s, step) in exec.thread_split[infer].iter_mut().zip(steps) {
                *s = split && matches!(step, Step::ConvForward { .. });
            }
            let image_major = |k: &Kernel| matches!(k, Kernel::ImageMajor { .. });
            let by_images = exec.schedule[infer]
                .iter()
                .filter(|k| image_major(k))
                .count();
            // Everything up to the predictions' gather, as one kernel.
            assert_eq!(by_images, usize::from(by_image));
            if by_image {
                assert_eq!(
                    exec.kernel_names(infer).len(),
                    2,
                    "{:?}",
                    exec.kernel_names(infer)
                );
            }
            exec.set_fusion(true);
            // The batch's own kernels.
            if !by_image {
                let train = graph.entry(ENTRY_TRAIN);
                let banded = exec.banded[infer].iter().filter(|&&b| b).count();
                // Every activation from the stem's output to the head's last conv's input (the
                // stem, the seven blocks', the neck's two and the head pair's), each part's band
                // in its own copy; not the predictions, which the decoder reads whole.
                assert_eq!(
                    banded,
                    if (batch as usize) < threads && split && in_place {
                        11
                    } else {
                        0
                    }
                );
                let count = |e: usize, f: &dyn Fn(&Kernel) -> bool| {
                    exec.schedule[e].iter().filter(|k| f(k)).count()
                };
                let adds = |k: &Kernel| {
                    matches!(
                        k,
                        Kernel::ConvAdd(..)
                            | Kernel::UpsampleAdd(..)
                            | Kernel::Separable { add: Some(_), .. }
                            | Kernel::Upsampled { add: Some(_), .. }
                    )
                };
                let pairs = |k: &Kernel| matches!(k, Kernel::Separable { .. });
                let bands = |k: &Kernel| matches!(k, Kernel::Separable { bands: true, .. });
                // The four residual blocks' adds and the neck's (in its upsampling's copy);
                // training keeps the blocks' (their backward reads the conv outputs for the ReLU
                // mask) but not the neck's upsampled tensor, which its gradient does not need.
                assert_eq!((count(infer, &adds), count(train, &adds)), (5, 1));
                // The model runs its neck conv before the upsampling itself: nothing to fuse.
                let up = |k: &Kernel| matches!(k, Kernel::Upsampled { .. });
                assert_eq!((count(infer, &up), count(train, &up)), (0, 0));
                // The stem reads the records in both (training normalises again for its backward
                // pass), where the kernel set has the in-place stem.
                let stems = |k: &Kernel| matches!(k, Kernel::NormalizedStem(_));
                let stem = usize::from(kernels::active().dense3x3_half.is_some());
                assert_eq!((count(infer, &stems), count(train, &stems)), (stem, stem));
                // Seven blocks and the head: eight pairs, over the batch, or in bands where an
                // image is split; none where one image of two threads is not split.
                // (None where the kernel set has no depthwise planes read in place, or no fused
                // GEMM: the portable set.)
                let (fewer, pairs_want) = (
                    (batch as usize) < threads,
                    if (batch as usize) < threads && !split || !in_place {
                        0
                    } else {
                        8
                    },
                );
                assert_eq!(count(infer, &pairs), pairs_want);
                assert_eq!(count(infer, &bands), if fewer { pairs_want } else { 0 });
            }
            if !fused {
                exec.set_fusion(false);
                assert_eq!(exec.kernel_names(infer).len(), steps.len());
            }
            for (p, v) in graph.params.iter().zip(init::init_params(&arch, 1)) {
                exec.write_f32(p.value, &v).expect("params");
            }
            let records = image.repeat(batch as usize);
            exec.write_bytes(graph.records, &records).expect("records");
            exec.run(infer).expect("run");
            let mut pred = vec![0f32; graph.recording.get(graph.pred).len];
            exec.read_f32(graph.pred, &mut pred).expect("pred");
            // The first image's predictions: every batch holds it first.
            pred.truncate(pred.len() / batch as usize);
            predictions.push(pred.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
        assert!(predictions.iter().all(|p| *p == predictions[0]));
    }

    /// det-s's training step runs its input gradients' stores fused (five residual
    /// gradients added and 13 ReLU masks applied there, each mask then skipped by the
    /// layer's own backward pass) and ends with the same weights and loss, bit for bit, as
    /// the separate steps.
    #[test]
    fn a_training_step_with_fused_gradient_stores_is_the_separate_steps_bit_for_bit() {
        let (arch, layout) = det_s();
        let options = GraphOptions {
            train: true,
            ..GraphOptions::default()
        };
        let graph = ModelGraph::build(&arch, 2, &layout, &options).expect("graph");
        let train = graph.entry(ENTRY_TRAIN);
        let stores = fusion::grad_stores(&graph.recording, train);
        let adds = stores.store.iter().flatten().filter(|s| s.add.is_some());
        let masks = stores.store.iter().flatten().filter(|s| s.relu_of_input);
        let masked = stores.gy_masked.iter().flatten().count();
        assert_eq!((adds.count(), masks.count(), masked), (5, 13, 13));
        let records = random_records(&layout, 2, 5);
        let hyper = crate::compute::ops::AdamW {
            len: 1,
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step: 1,
        }
        .hyper();
        let mut ends = Vec::new();
        for fused in [true, false] {
            let mut exec = CpuExec::new(&graph.recording, 2).expect("executor");
            let backward = |k: &Kernel| matches!(k, Kernel::Backward { .. });
            let planned = exec.schedule[train].iter().filter(|k| backward(k)).count();
            // Of the 19 backward passes, all but the head's last conv (no ReLU before it,
            // its output gradient from the loss) store more or take a masked gradient.
            assert_eq!(planned, 18);
            if !fused {
                exec.set_fusion(false);
            }
            for (p, v) in graph.params.iter().zip(init::init_params(&arch, 1)) {
                for t in [Some(p.value), p.ema].into_iter().flatten() {
                    exec.write_f32(t, &v).expect("params");
                }
            }
            exec.write_bytes(graph.records, &records).expect("records");
            exec.write_f32(graph.hyper, &hyper).expect("hyper");
            exec.run(train).expect("run");
            let mut end: Vec<u32> = Vec::new();
            for t in graph.params.iter().map(|p| p.value).chain([graph.loss]) {
                let mut v = vec![0f32; graph.recording.get(t).len];
                exec.read_f32(t, &mut v).expect("read");
                end.extend(v.iter().map(|x| x.to_bits()));
            }
            ends.push(end);
        }
        assert!(ends[0] == ends[1], "the fused step differs");
    }

    /// A fine-tune's frozen layers run image by image: everything before the first layer
    /// that trains (the heads with the backbone and neck frozen, the neck with the backbone),
    /// nothing where every layer trains. Two training steps and an evaluation end with the
    /// same weights, loss and predictions, bit for bit, as the batch's own kernels make,
    /// from records written or read in place; the memory plan lists the batch-1 executor,
    /// and the batch's own memory holds none of those layers' activations.
    #[test]
    fn frozen_layers_run_image_by_image_and_train_the_same() {
        use crate::model::{Freeze, ENTRY_EVAL};
        let (arch, layout) = det_s();
        let records = random_records(&layout, 3, 9);
        let hyper = GraphOptions::default().hyper(1e-2, 1);
        for (freeze, by_image) in [
            (Freeze::None, false),
            (Freeze::Backbone, true),
            (Freeze::BackboneNeck, true),
        ] {
            let options = GraphOptions {
                train: true,
                freeze,
                ..GraphOptions::default()
            };
            let graph = ModelGraph::build(&arch, 3, &layout, &options).expect("graph");
            let (train, eval) = (graph.entry(ENTRY_TRAIN), graph.entry(ENTRY_EVAL));
            let plan = CpuExec::memory_plan(&graph.recording, 2).table();
            // One batch-1 executor, for the training step's frozen layers and the same
            // layers of evaluation and inference; none where every layer trains.
            assert_eq!(
                plan.matches("image by image").count(),
                usize::from(by_image),
                "{plan}"
            );
            let (mut ends, mut arenas) = (Vec::new(), Vec::new());
            for on in [true, false] {
                let mut exec = match on {
                    true => CpuExec::new(&graph.recording, 2),
                    false => CpuExec::batch_major(&graph.recording, 2),
                }
                .expect("executor");
                let first_trained = graph.recording.entries[train]
                    .steps
                    .iter()
                    .position(|s| match s {
                        Step::ConvForward { w, .. } => {
                            graph.params.iter().any(|p| p.value == *w && !p.frozen)
                        }
                        _ => false,
                    })
                    .expect("a layer trains");
                let by_images: Vec<_> = exec.schedule[train]
                    .iter()
                    .filter_map(|k| match *k {
                        Kernel::ImageMajor { first, end } => Some((first, end)),
                        _ => None,
                    })
                    .collect();
                if on && by_image {
                    // From the normalisation (after the targets) to the first trained layer.
                    assert_eq!(by_images, [(1, first_trained)], "{freeze}");
                    let eval_by_images = exec.schedule[eval]
                        .iter()
                        .filter(|k| matches!(k, Kernel::ImageMajor { .. }))
                        .count();
                    assert_eq!(eval_by_images, 1, "{freeze}");
                } else {
                    assert!(by_images.is_empty(), "{freeze}");
                }
                for (p, v) in graph.params.iter().zip(init::init_params(&arch, 1)) {
                    for t in [Some(p.value), p.ema].into_iter().flatten() {
                        exec.write_f32(t, &v).expect("params");
                    }
                }
                exec.write_f32(graph.hyper, &hyper).expect("hyper");
                exec.write_bytes(graph.records, &records).expect("records");
                exec.run(train).expect("step 1");
                exec.run_reading(train, graph.records, &records)
                    .expect("step 2");
                exec.run(eval).expect("eval");
                let mut end: Vec<u32> = Vec::new();
                let tensors = graph.params.iter().map(|p| p.value);
                for t in tensors.chain([graph.loss, graph.pred]) {
                    let mut v = vec![0f32; graph.recording.get(t).len];
                    exec.read_f32(t, &mut v).expect("read");
                    end.extend(v.iter().map(|x| x.to_bits()));
                }
                ends.push(end);
                arenas.push(exec.layout.len);
            }
            assert!(ends[0] == ends[1], "{freeze}: image by image, another end");
            // The stem's output lives in the batch-1 executor alone: refused, not a panic.
            if by_image {
                let mut exec = CpuExec::new(&graph.recording, 2).expect("executor");
                let stem = graph.recording.find("stem").expect("the stem's output");
                let mut v = vec![0f32; graph.recording.get(stem).len];
                let e = exec.read_f32(stem, &mut v);
                assert!(matches!(e, Err(AccessError::NotHeld { .. })), "{e:?}");
            }
            assert_eq!(arenas[0] < arenas[1], by_image, "{freeze}: {arenas:?}");
        }
    }
}
