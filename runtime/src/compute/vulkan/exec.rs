//! [`VulkanExec`]: a [`Recording`] on the Vulkan engine. Every tensor gets a buffer, sized
//! and checked against the memory budget before anything is allocated; every entry is
//! lowered ([`super::lower`]) and recorded once into its own command buffer, which
//! [`VulkanExec::run`] replays.
//!
//! Memory: inputs (records, `hyper`) live in [`Location::CpuToGpu`] memory (written by the
//! host every step), outputs (loss, detections) in [`Location::GpuToCpu`], everything else in
//! [`Location::GpuOnly`]. On unified-memory devices gpu-allocator hands out host-visible
//! memory for all of them, and host reads and writes go straight to it; elsewhere they go
//! through a staging copy. Every buffer starts zeroed, as the CPU engine's tensors do (the
//! optimizer state must start at 0).

use std::collections::HashMap;

use super::allocation::Location;
use super::buffer::Buffer;
use super::engine::{Engine, Timestamps, Timing};
use super::frames::{FrameJob, FrameStage, FrameTiming};
use super::lower::{joined_steps, lower_with, LowerError, Slot, Variants};
use super::pipeline::Pipeline;
use super::program::{CopyIn, Program, ProgramDispatch};
use crate::base::MemoryPlan;
use crate::base::SlotBytes;
use crate::compute::recording::{AccessError, Elem, Recording, Role, Step, TensorId};
use crate::compute::storage::StoragePlan;

/// A recording set up on the Vulkan engine: see the module docs.
pub struct VulkanExec {
    program: Program,
    engine: Engine,
    recording: Recording,
    /// `(kernel name, step index)` of every dispatch, per entry.
    kernels: Vec<Vec<(&'static str, usize)>>,
    bytes: u64,
    /// Which buffer of the program holds each tensor.
    storage: StoragePlan,
    /// `f32` tensors as little-endian bytes on their way in or out, kept between calls.
    f32_bytes: Vec<u8>,
    /// The frame pass on the GPU, once asked for ([`VulkanExec::run_frame`]).
    frames: Option<FrameStage>,
}

/// Why a [`VulkanExec`] could not be set up for a recording.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Lower(#[from] LowerError),
    #[error(
        "the Vulkan engine needs {needed} bytes ({tensors} of tensors, {scratch} of scratch), \
         over the memory budget of {budget} bytes; the largest tensors: {largest}; {fits}"
    )]
    OverBudget {
        needed: u64,
        budget: u64,
        tensors: u64,
        scratch: u64,
        /// The five largest tensors, named with their bytes.
        largest: String,
        /// What would fit: a smaller batch, or none.
        fits: String,
    },
    #[error(
        "buffer {name:?} takes {bytes} bytes, more than the {max_range} this device binds as \
         one storage buffer; lower the batch"
    )]
    BufferTooLarge {
        name: String,
        bytes: u64,
        max_range: u64,
    },
    #[error(transparent)]
    Vulkan(#[from] super::Error),
}

/// What the buffers of a recording take: tensors and scratch.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sizes {
    tensors: u64,
    conv_partial: u64,
    loss_partial: u64,
}

impl Sizes {
    /// The tensors of `storage` and the scratch of `recording` lowered to whichever kernel
    /// variants need more of it (tiled or direct: how a sum is split depends on them), so
    /// that the plan made before a device is chosen is what any device allocates.
    fn of(storage: &StoragePlan, recording: &Recording) -> Result<Sizes, LowerError> {
        let (mut conv, mut loss) = (1, 1);
        for direct in [false, true] {
            let l = lower_with(
                recording,
                Variants {
                    direct,
                    ..Variants::default()
                },
            )?;
            conv = conv.max(l.conv_partial_floats);
            loss = loss.max(l.loss_partial_floats);
        }
        // Scratch buffers are bound even where unused (a binding needs a buffer).
        Ok(Sizes {
            tensors: storage.bytes(),
            conv_partial: 4 * conv as u64,
            loss_partial: 4 * loss as u64,
        })
    }

    fn total(&self) -> u64 {
        self.tensors + self.conv_partial + self.loss_partial
    }
}

/// The refusal of a recording over the budget: how much it needs, the largest tensors, and
/// the batch that would fit (the tensors other than parameters and optimizer state scale with
/// the batch).
fn over_budget(recording: &Recording, sizes: &Sizes, budget: u64) -> ExecError {
    let needed = sizes.total();
    let mut largest: Vec<_> = recording.tensors.iter().collect();
    largest.sort_by_key(|t| std::cmp::Reverse(t.bytes()));
    let list: Vec<String> = largest
        .iter()
        .take(5)
        .map(|t| format!("{} ({} bytes)", t.name, t.bytes()))
        .collect();
    let fixed: u64 = recording
        .tensors
        .iter()
        .filter(|t| matches!(t.role, Role::Param | Role::State))
        .map(|t| t.bytes())
        .sum();
    let batch = recording
        .entries
        .iter()
        .flat_map(|e| &e.steps)
        .map(Step::batch)
        .max()
        .unwrap_or(1)
        .max(1);
    let fits = if budget <= fixed {
        format!(
            "the parameters and optimizer state alone take {fixed} bytes: no batch fits; raise \
             --mem-budget"
        )
    } else {
        let per_sample = (needed - fixed).div_ceil(u64::from(batch)).max(1);
        let most = (budget - fixed) / per_sample;
        if most == 0 {
            format!(
                "not even a batch of 1 fits (about {} bytes); raise --mem-budget",
                fixed + per_sample
            )
        } else {
            format!("a batch of at most about {most} would fit (it is {batch}); lower --batch")
        }
    };
    ExecError::OverBudget {
        needed,
        budget,
        tensors: sizes.tensors,
        scratch: sizes.conv_partial + sizes.loss_partial,
        largest: list.join(", "),
        fits,
    }
}

fn location(role: Role) -> Location {
    match role {
        Role::Input => Location::CpuToGpu,
        Role::Output => Location::GpuToCpu,
        Role::Param | Role::State | Role::Activation => Location::GpuOnly,
    }
}

impl VulkanExec {
    /// Sets `recording` up on `engine`: lowers it, refuses it when its buffers need more than
    /// `mem_budget` bytes (before allocating anything), allocates and zeroes every buffer,
    /// makes the pipelines and records each entry. With `timestamps`, each run reports the
    /// GPU time of every dispatch; without, only of the whole step (where the queue has
    /// timestamps at all).
    ///
    /// Intermediate tensors share buffers where their lifetimes allow ([`StoragePlan`]: a
    /// barrier separates every two dispatches, so one step's reads come before the next
    /// step's writes of the same memory).
    pub fn new(
        engine: Engine,
        recording: &Recording,
        timestamps: bool,
        mem_budget: Option<u64>,
    ) -> Result<VulkanExec, ExecError> {
        let storage = Self::storage_plan(recording);
        Self::with_storage(engine, recording, timestamps, mem_budget, storage)
    }

    /// As [`VulkanExec::new`], every tensor in its own buffer: for comparisons that read
    /// intermediate activations after a run.
    pub fn separate(
        engine: Engine,
        recording: &Recording,
        timestamps: bool,
    ) -> Result<VulkanExec, ExecError> {
        let storage = StoragePlan::separate(recording);
        Self::with_storage(engine, recording, timestamps, None, storage)
    }

    fn storage_plan(recording: &Recording) -> StoragePlan {
        // A pointwise conv's dispatch that does the add after it spans both steps.
        StoragePlan::shared(recording, &|e| joined_steps(recording, e))
    }

    fn with_storage(
        mut engine: Engine,
        recording: &Recording,
        timestamps: bool,
        mem_budget: Option<u64>,
        storage: StoragePlan,
    ) -> Result<VulkanExec, ExecError> {
        let lowered = lower_with(recording, engine.variants())?;
        let sizes = Sizes::of(&storage, recording)?;
        if let Some(budget) = mem_budget {
            if sizes.total() > budget {
                return Err(over_budget(recording, &sizes, budget));
            }
        }
        let max_range = u64::from(engine.info().limits.max_storage_buffer_range);
        let scratch = [
            ("scratch.conv-partial", sizes.conv_partial),
            ("scratch.loss-partial", sizes.loss_partial),
        ];
        let mut all = storage
            .buffers
            .iter()
            .map(|b| (recording.get(b.tensors[0]).name.as_str(), b.bytes()))
            .chain(scratch);
        if let Some((name, bytes)) = all.find(|&(_, b)| b > max_range) {
            return Err(ExecError::BufferTooLarge {
                name: name.to_owned(),
                bytes,
                max_range,
            });
        }

        let mut buffers = Vec::with_capacity(storage.buffers.len() + 2);
        for b in &storage.buffers {
            // Named by its first tenant (the allocation report's label).
            let t = recording.get(b.tensors[0]);
            buffers.push(engine.buffer(&t.name, b.bytes(), location(t.role))?);
        }
        let conv_partial = buffers.len();
        let loss_partial = conv_partial + 1;
        for (name, bytes) in scratch {
            buffers.push(engine.buffer(name, bytes, Location::GpuOnly)?);
        }
        engine.fill_zero(&buffers.iter().collect::<Vec<&Buffer>>())?;

        // One pipeline per kernel and specialisation (per shape where the lowering
        // specialises one, else per kernel: the shapes are push constants), shared by every
        // dispatch of it.
        let mut pipelines: Vec<Pipeline> = Vec::new();
        let mut pipeline_of = HashMap::new();
        let mut entries = Vec::with_capacity(lowered.entries.len());
        let mut kernels = Vec::with_capacity(lowered.entries.len());
        for dispatches in &lowered.entries {
            let mut program_dispatches = Vec::with_capacity(dispatches.len());
            for d in dispatches {
                let pipeline = match pipeline_of.get(&(d.kernel, &d.spec)) {
                    Some(&i) => i,
                    None => {
                        pipelines.push(engine.pipeline(d.kernel, &d.spec)?);
                        pipeline_of.insert((d.kernel, &d.spec), pipelines.len() - 1);
                        pipelines.len() - 1
                    }
                };
                program_dispatches.push(ProgramDispatch {
                    pipeline,
                    buffers: d
                        .bindings
                        .iter()
                        .map(|s| match *s {
                            Slot::Tensor(t) => storage.buffer_of(t),
                            Slot::ConvPartial => conv_partial,
                            Slot::LossPartial => loss_partial,
                        })
                        .collect(),
                    push: d.push.clone(),
                    groups: d.groups,
                });
            }
            kernels.push(
                dispatches
                    .iter()
                    .map(|d| (d.kernel.name(), d.step))
                    .collect(),
            );
            entries.push(program_dispatches);
        }
        let entry_refs: Vec<&[ProgramDispatch]> = entries.iter().map(Vec::as_slice).collect();
        let program = Program::new(
            &engine,
            buffers,
            pipelines,
            &entry_refs,
            if timestamps {
                Timestamps::PerDispatch
            } else {
                Timestamps::Step
            },
        )?;
        Ok(VulkanExec {
            program,
            engine,
            recording: recording.clone(),
            kernels,
            bytes: sizes.total(),
            storage,
            f32_bytes: Vec::new(),
            frames: None,
        })
    }

    /// Bytes of device buffers [`VulkanExec::new`] would allocate for `recording`: its
    /// tensors and the scratch of split reductions (what the memory budget is checked
    /// against).
    pub fn needed_bytes(recording: &Recording) -> Result<u64, LowerError> {
        Ok(Sizes::of(&Self::storage_plan(recording), recording)?.total())
    }

    /// [`VulkanExec::needed_bytes`] item by item: the tensor buffers and the reduction
    /// scratch.
    pub fn memory_plan(recording: &Recording) -> Result<MemoryPlan, LowerError> {
        let storage = Self::storage_plan(recording);
        let sizes = Sizes::of(&storage, recording)?;
        let mut plan = MemoryPlan::default();
        storage.add_to(recording, &mut plan);
        plan.add(
            "vulkan engine: split-reduction scratch",
            1,
            sizes.conv_partial + sizes.loss_partial,
        );
        debug_assert_eq!(plan.total(), sizes.total());
        Ok(plan)
    }

    /// Runs entry `entry` (one submission of its recorded command buffer) and waits for it.
    /// The timing has the GPU time of the step (and of each dispatch with timestamps on),
    /// the wall time, and their difference, the submission overhead
    /// ([`Timing::overhead`]).
    pub fn run(&mut self, entry: usize) -> Result<Timing, super::Error> {
        self.recording.check_entry(entry)?;
        self.program.run(entry)
    }

    /// Runs entry `entry` with `input` as the start of byte tensor `id` (as
    /// [`VulkanExec::write_bytes`] then [`VulkanExec::run`]). Bytes in a ring slot this device
    /// imported are copied on the GPU by commands submitted with the entry's, so the step is
    /// one submission and one fence; other bytes are written by the host first.
    pub fn run_reading(
        &mut self,
        entry: usize,
        id: TensorId,
        input: SlotBytes<'_>,
    ) -> Result<Timing, super::Error> {
        self.recording.check_entry(entry)?;
        let index = self.check(id, Elem::Bytes, input.len(), true)?;
        let device = std::sync::Arc::clone(self.engine.device());
        let Some(found) = device.host_import.as_ref().and_then(|i| i.find(input)) else {
            self.upload(index, input.bytes())?;
            return self.run(entry);
        };
        let copy = CopyIn {
            src: found.buffer,
            dst: index,
            region: ash::vk::BufferCopy {
                src_offset: found.offset,
                dst_offset: 0,
                size: input.len() as u64,
            },
        };
        // `found` keeps the import alive until the submission has been waited for.
        let timing = self.program.run_after_copies(entry, &[copy]);
        drop(found);
        let timing = timing?;
        self.engine.count_imported_upload();
        Ok(timing)
    }

    /// Sizes the GPU frame pass's buffers for frames up to `frame_bytes` and window tables up
    /// to `window_words`, writing byte tensor `target` (the records), so that
    /// [`VulkanExec::run_frame`] on them allocates nothing.
    pub fn reserve_frames(
        &mut self,
        target: TensorId,
        frame_bytes: usize,
        window_words: usize,
    ) -> Result<(), super::Error> {
        let index = self.check(target, Elem::Bytes, 0, true)?;
        match &mut self.frames {
            Some(stage) if stage.target() == index => {
                stage.reserve(&self.engine, frame_bytes, window_words)
            }
            _ => {
                self.frames = Some(FrameStage::new(
                    &self.engine,
                    index,
                    frame_bytes,
                    window_words,
                )?);
                Ok(())
            }
        }
    }

    /// Bytes the GPU frame pass's buffers hold (0 before it is used).
    pub fn frame_bytes(&self) -> u64 {
        self.frames.as_ref().map_or(0, FrameStage::bytes)
    }

    /// Runs the frame pass on the GPU: writes `job.tail` into the target, copies the frame and
    /// windows into the stage's host-visible buffers, and submits the frame kernel, followed in
    /// the same submission by entry `then` where given (which reads the record it wrote).
    pub fn run_frame(
        &mut self,
        job: &FrameJob<'_>,
        then: Option<usize>,
    ) -> Result<FrameTiming, super::Error> {
        if let Some(entry) = then {
            self.recording.check_entry(entry)?;
        }
        let written = job.out_bytes.max(job.tail_offset + job.tail.len());
        let index = self.check(job.target, Elem::Bytes, written, true)?;
        self.reserve_frames(job.target, job.frame.len(), job.windows.len())?;
        let buffer = self.program.buffer_mut(index);
        self.engine
            .upload(buffer, job.tail_offset as u64, job.tail)?;
        let stage = self.frames.as_mut().expect("reserved above");
        stage.record(job, self.program.buffer(index))?;
        let (entry, wall) = match then {
            Some(entry) => {
                let t = self.program.run_after(entry, stage.commands())?;
                let wall = t.wall;
                (Some(t), wall)
            }
            None => (
                None,
                stage
                    .commands()
                    .submit_and_wait(&self.engine.device().compute)?,
            ),
        };
        Ok(FrameTiming {
            frame_gpu: stage.gpu_time()?,
            entry,
            wall,
        })
    }

    /// The `(kernel name, step index)` of every dispatch of entry `entry`, in order: labels
    /// for [`Timing::per_dispatch`].
    /// Empty for an entry the recording does not have.
    pub fn kernels(&self, entry: usize) -> Vec<(&'static str, usize)> {
        self.kernels.get(entry).cloned().unwrap_or_default()
    }

    /// The pipelines its entries run: one per kernel, or per kernel and shape for the
    /// kernels the engine compiles per shape ([`super::Options::specialise`]).
    pub fn pipelines(&self) -> &[Pipeline] {
        self.program.pipelines()
    }

    /// The engine (device, validation messages, allocation report).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Bytes of device buffers this executor holds: the tensors and the scratch.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn recording(&self) -> &Recording {
        &self.recording
    }

    /// The buffer index of `id`, checked to hold `elem`s and `given` of them (exactly, or
    /// at most with `prefix`: byte tensors may be written and read in part).
    fn check(
        &self,
        id: TensorId,
        elem: Elem,
        given: usize,
        prefix: bool,
    ) -> Result<usize, AccessError> {
        let t = self.recording.host_access(id, elem, given, prefix)?;
        if self.storage.is_shared(id) {
            return Err(AccessError::Shared {
                name: t.name.clone(),
            });
        }
        Ok(self.storage.buffer_of(id))
    }

    fn upload(&mut self, index: usize, data: &[u8]) -> Result<(), super::Error> {
        let buffer = self.program.buffer_mut(index);
        self.engine.upload(buffer, 0, data)
    }

    fn download(&mut self, index: usize, out: &mut [u8]) -> Result<(), super::Error> {
        let buffer = self.program.buffer_mut(index);
        self.engine.download(buffer, 0, out)
    }

    /// Writes the whole of an `f32` tensor.
    pub fn write_f32(&mut self, id: TensorId, data: &[f32]) -> Result<(), super::Error> {
        let index = self.check(id, Elem::F32, data.len(), false)?;
        // Through the kept byte buffer: after the first steps, no allocation per step.
        let mut bytes = std::mem::take(&mut self.f32_bytes);
        bytes.clear();
        bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
        let done = self.upload(index, &bytes);
        self.keep_f32_bytes(bytes);
        done
    }

    /// Keeps `bytes` for the next call unless it grew past what a step's tensors need (a
    /// parameter at start, a checkpoint): those bytes are not held for the whole run.
    fn keep_f32_bytes(&mut self, bytes: Vec<u8>) {
        const KEEP: usize = 64 << 10;
        if bytes.capacity() <= KEEP {
            self.f32_bytes = bytes;
        }
    }

    /// Reads the whole of an `f32` tensor.
    pub fn read_f32(&mut self, id: TensorId, out: &mut [f32]) -> Result<(), super::Error> {
        let index = self.check(id, Elem::F32, out.len(), false)?;
        let mut bytes = std::mem::take(&mut self.f32_bytes);
        bytes.clear();
        bytes.resize(4 * out.len(), 0);
        let done = self.download(index, &mut bytes);
        if done.is_ok() {
            for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        self.keep_f32_bytes(bytes);
        done
    }

    /// Writes `data` at the start of a byte tensor (it may be shorter than the tensor).
    pub fn write_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<(), super::Error> {
        let index = self.check(id, Elem::Bytes, data.len(), true)?;
        self.upload(index, data)
    }

    /// Reads the start of a byte tensor into `out` (it may be shorter than the tensor).
    pub fn read_bytes(&mut self, id: TensorId, out: &mut [u8]) -> Result<(), super::Error> {
        let index = self.check(id, Elem::Bytes, out.len(), true)?;
        self.download(index, out)
    }
}

impl std::fmt::Debug for VulkanExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanExec")
            .field("device", &self.engine.info().label())
            .field("tensors", &self.recording.tensors.len())
            .field("entries", &self.recording.entries.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}
