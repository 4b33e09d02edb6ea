//! [`Program`]: buffers, pipelines and one or more *entries* (lists of dispatches over those
//! buffers), each recorded once into its own command buffer and replayed by [`Program::run`].
//!
//! The program owns its buffers and pipelines, so nothing a recorded command buffer refers to
//! can be freed while the program lives, and host access ([`Program::buffer_mut`]) needs
//! `&mut self`, which [`Program::run`] also takes and only gives back after the GPU is done:
//! the borrow checker rules out the host touching memory the GPU is using. Several entries
//! share the buffers: a training step and an inference pass over the same weights, say.
//!
//! Copies into the program's buffers from outside it (a batch from its ring slot) are recorded
//! ahead of an entry and go in the same submission (`Program::run_after_copies`): a step is
//! one `vkQueueSubmit` and one fence.

use std::sync::Arc;

use ash::vk;

use super::buffer::Buffer;
use super::device::Device;
use super::engine::{
    record_dispatches, Barriers, Commands, DescriptorSets, Engine, QueryPool, RawDispatch,
    Timestamps, Timing,
};
use super::kernels::Kernel;
use super::pipeline::Pipeline;
use super::{Error, Result};

/// One dispatch of a program entry, by index into the program's pipelines and buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramDispatch {
    pub pipeline: usize,
    /// Binding `i` is `buffers[i]`.
    pub buffers: Vec<usize>,
    pub push: Vec<u8>,
    pub groups: [u32; 3],
}

/// One recorded entry.
struct Entry {
    // Dropped before the program's buffers and pipelines (field order of Program).
    commands: Commands,
    _sets: DescriptorSets,
    queries: Option<QueryPool>,
    timestamps: Timestamps,
    kernels: Vec<Kernel>,
}

/// A copy into one of the program's buffers from a buffer outside it, recorded ahead of an
/// entry ([`Program::run_after_copies`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyIn {
    /// Made with `TRANSFER_SRC` usage, kept alive by the caller until the run returns.
    pub(crate) src: vk::Buffer,
    /// The program's buffer, by index.
    pub(crate) dst: usize,
    pub(crate) region: vk::BufferCopy,
}

/// See the module docs.
pub struct Program {
    entries: Vec<Entry>,
    /// Re-recorded for every run with copies; submitted ahead of the entry's.
    copies: Commands,
    pipelines: Vec<Pipeline>,
    buffers: Vec<Buffer>,
    device: Arc<Device>,
}

impl Program {
    /// Records every entry of `entries` (each a list of dispatches) over `buffers` and
    /// `pipelines`, all made by `engine`.
    pub fn new(
        engine: &Engine,
        buffers: Vec<Buffer>,
        pipelines: Vec<Pipeline>,
        entries: &[&[ProgramDispatch]],
        timestamps: Timestamps,
    ) -> Result<Program> {
        let device = Arc::clone(engine.device());
        let mut program = Program {
            entries: Vec::with_capacity(entries.len()),
            copies: Commands::new(&device, device.compute.family)?,
            pipelines,
            buffers,
            device,
        };
        for dispatches in entries {
            let entry = program.record(dispatches, timestamps)?;
            program.entries.push(entry);
        }
        Ok(program)
    }

    fn record(&self, dispatches: &[ProgramDispatch], timestamps: Timestamps) -> Result<Entry> {
        let raw: Vec<RawDispatch> = dispatches
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let pipeline = self
                    .pipelines
                    .get(d.pipeline)
                    .ok_or_else(|| Error::Dispatch {
                        index: i,
                        kernel: "?",
                        detail: format!(
                            "pipeline {} of a program with {}",
                            d.pipeline,
                            self.pipelines.len()
                        ),
                    })?;
                let buffers = d
                    .buffers
                    .iter()
                    .map(|&b| {
                        self.buffers.get(b).ok_or_else(|| Error::Dispatch {
                            index: i,
                            kernel: pipeline.kernel().name(),
                            detail: format!("buffer {b} of a program with {}", self.buffers.len()),
                        })
                    })
                    .collect::<Result<Vec<&Buffer>>>()?;
                RawDispatch::new(&self.device, i, pipeline, &buffers, &d.push, d.groups)
            })
            .collect::<Result<_>>()?;
        let sets = DescriptorSets::new(&self.device, &raw)?;
        let queries = QueryPool::for_dispatches(&self.device, timestamps, raw.len())?;
        let commands = Commands::new(&self.device, self.device.compute.family)?;
        let cmd = commands.begin(false)?;
        // SAFETY: `cmd` is recording; every pipeline and buffer it refers to is owned by this
        // program, and the sets and queries by the entry, which the program drops before its
        // pipelines and buffers; every submission is waited for.
        unsafe {
            record_dispatches(
                &self.device,
                cmd,
                &raw,
                &sets.sets,
                queries.as_ref().map(|q| (q, timestamps)),
                Barriers::AsNeeded,
            )
        };
        commands.end()?;
        Ok(Entry {
            commands,
            _sets: sets,
            queries,
            timestamps,
            kernels: raw.iter().map(|d| d.kernel).collect(),
        })
    }

    /// Submits entry `entry`, waits for it and returns its timing.
    pub fn run(&mut self, entry: usize) -> Result<Timing> {
        self.run_after_copies(entry, &[])
    }

    /// Records `copies` and submits them with entry `entry` as one submission; waits for it and
    /// returns the entry's timing (the GPU time is the entry's; the copies' is in the wall
    /// time). Every copy is checked against its destination before anything is recorded. The
    /// entry's command buffer begins with a barrier from earlier transfer writes
    /// (`record_dispatches`), which makes the copies' writes visible to its shaders: they come
    /// before it in submission order.
    pub(crate) fn run_after_copies(&mut self, entry: usize, copies: &[CopyIn]) -> Result<Timing> {
        self.entry(entry)?;
        for c in copies {
            let dst = self.buffers.get(c.dst).ok_or_else(|| Error::Dispatch {
                index: c.dst,
                kernel: "copy",
                detail: format!("buffer {} of a program with {}", c.dst, self.buffers.len()),
            })?;
            dst.range(c.region.dst_offset, c.region.size as usize)?;
        }
        let before = if copies.is_empty() {
            None
        } else {
            self.record_copies(copies)?;
            Some(&self.copies)
        };
        submit_entry(&self.device, self.entry(entry)?, before)
    }

    /// Submits `before` (recorded and ended by the caller, from a pool of the compute family)
    /// and entry `entry` as one submission; waits for it and returns the entry's timing. The
    /// entry's opening barrier makes what `before` wrote, by shader or transfer, visible to it.
    pub(crate) fn run_after(&mut self, entry: usize, before: &Commands) -> Result<Timing> {
        submit_entry(&self.device, self.entry(entry)?, Some(before))
    }

    fn entry(&self, entry: usize) -> Result<&Entry> {
        self.entries.get(entry).ok_or_else(|| Error::Dispatch {
            index: entry,
            kernel: "?",
            detail: format!("entry {entry} of a program with {}", self.entries.len()),
        })
    }

    fn record_copies(&self, copies: &[CopyIn]) -> Result<()> {
        let cmd = self.copies.begin(true)?;
        for c in copies {
            // SAFETY: `cmd` is recording; the destination is the program's (alive while it
            // is, made with TRANSFER_DST usage) and its region was checked; the source is kept
            // alive by the caller until the submission is waited for.
            unsafe {
                self.device
                    .raw
                    .cmd_copy_buffer(cmd, c.src, self.buffers[c.dst].raw(), &[c.region])
            };
        }
        self.copies.end()
    }

    /// The kernels of entry `entry`, in dispatch order (to label per-dispatch timings).
    pub fn kernels(&self, entry: usize) -> &[Kernel] {
        &self.entries[entry].kernels
    }

    /// The pipelines the entries' dispatches use.
    pub fn pipelines(&self) -> &[Pipeline] {
        &self.pipelines
    }

    pub fn buffer(&self, index: usize) -> &Buffer {
        &self.buffers[index]
    }

    /// Host access to a buffer between runs.
    pub fn buffer_mut(&mut self, index: usize) -> &mut Buffer {
        &mut self.buffers[index]
    }

    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }
}

/// Submits `e` after `before` (one submission), waits, and reads its timestamps.
fn submit_entry(device: &Device, e: &Entry, before: Option<&Commands>) -> Result<Timing> {
    let mut timing = Timing {
        wall: e.commands.submit_after_and_wait(&device.compute, before)?,
        ..Timing::default()
    };
    if let Some(q) = &e.queries {
        q.read(e.timestamps, &mut timing)?;
    }
    Ok(timing)
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("buffers", &self.buffers.len())
            .field("pipelines", &self.pipelines.len())
            .field("entries", &self.entries.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_clean, engine};
    use super::super::{Dispatch, Location, SpecConstant, Timestamps};
    use super::*;

    fn push(n: u32, a: f32) -> Vec<u8> {
        [n.to_le_bytes(), a.to_le_bytes()].concat()
    }

    /// A program of one entry: `y += 2·x` over `n` floats.
    fn saxpy_program(engine: &Engine, x: Buffer, y: Buffer, saxpy: Pipeline, n: u32) -> Program {
        let d = ProgramDispatch {
            pipeline: 0,
            buffers: vec![0, 1],
            push: push(n, 2.0),
            groups: [saxpy.groups_for(u64::from(n)), 1, 1],
        };
        Program::new(engine, vec![x, y], vec![saxpy], &[&[d]], Timestamps::Step).unwrap()
    }

    #[test]
    fn saxpy_runs_once_and_replays() {
        let Some(mut engine) = engine("saxpy_runs_once_and_replays") else {
            return;
        };
        let n = 1000usize;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let y0: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
        let mut bx = engine
            .buffer("x", 4 * n as u64, Location::CpuToGpu)
            .unwrap();
        let mut by = engine
            .buffer("y", 4 * n as u64, Location::CpuToGpu)
            .unwrap();
        bx.write_f32(0, &x).unwrap();
        by.write_f32(0, &y0).unwrap();
        let pipeline = engine
            .pipeline(Kernel::Saxpy, &[SpecConstant::u32(0, 32)])
            .unwrap();
        assert_eq!(pipeline.local_size(), [32, 1, 1]);
        // A grid smaller than n / 32: the kernel's grid-stride loop covers the rest.
        let timing = engine
            .run(
                &[Dispatch {
                    pipeline: &pipeline,
                    buffers: &[&bx, &by],
                    push: &push(n as u32, 2.0),
                    groups: [7, 1, 1],
                }],
                Timestamps::PerDispatch,
            )
            .unwrap();
        let mut y = vec![0f32; n];
        by.read_f32(0, &mut y).unwrap();
        for i in 0..n {
            assert_eq!(y[i], 2.0 * x[i] + y0[i], "element {i}");
        }
        assert_eq!(timing.per_dispatch.len(), 1);
        assert!(timing.gpu.unwrap() <= timing.wall);

        // The same as a program entry, replayed three times: y = y0 + 3·(2x).
        by.write_f32(0, &y0).unwrap();
        let mut program = saxpy_program(&engine, bx, by, pipeline, n as u32);
        for _ in 0..3 {
            program.run(0).unwrap();
        }
        program.buffer_mut(1).read_f32(0, &mut y).unwrap();
        for i in 0..n {
            assert_eq!(y[i], 6.0 * x[i] + y0[i], "element {i}");
        }
        assert_eq!(program.kernels(0), &[Kernel::Saxpy]);
        assert!(program.run(1).is_err());
        drop(program);
        assert_clean(&engine);
    }

    /// Copies from a buffer outside the program go ahead of the entry in its submission: each
    /// run reads the bytes the host put in the source just before it, one submission a run,
    /// and validation stays quiet. (The layer CI installs, 1.3.239, checks hazards within a
    /// command buffer only: leaving out the entry's leading barrier, which orders the copies
    /// before its shaders, is not caught here.)
    #[test]
    fn copies_go_ahead_of_the_entry_in_one_submission() {
        let Some(engine) = engine("copies_go_ahead_of_the_entry_in_one_submission") else {
            return;
        };
        let n = 256usize;
        let bytes = 4 * n as u64;
        let mut source = engine.buffer("source", bytes, Location::CpuToGpu).unwrap();
        let bx = engine.buffer("x", bytes, Location::GpuOnly).unwrap();
        let mut by = engine.buffer("y", bytes, Location::CpuToGpu).unwrap();
        by.write_f32(0, &vec![1.0; n]).unwrap();
        let pipeline = engine.pipeline(Kernel::Saxpy, &[]).unwrap();
        let mut program = saxpy_program(&engine, bx, by, pipeline, n as u32);
        let src = source.raw();
        let copy = |size| CopyIn {
            src,
            dst: 0,
            region: vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size,
            },
        };
        engine.validation().take();
        let before = engine.submissions();
        // y = 1 + 2·(x₁ + x₂ + x₃) with x_k = k·i.
        for k in 1..=3 {
            let x: Vec<f32> = (0..n).map(|i| (k * i) as f32).collect();
            source.write_f32(0, &x).unwrap();
            program.run_after_copies(0, &[copy(bytes)]).unwrap();
        }
        assert_eq!(engine.submissions() - before, 3, "one submission a run");
        let mut y = vec![0f32; n];
        program.buffer_mut(1).read_f32(0, &mut y).unwrap();
        for (i, v) in y.iter().enumerate() {
            assert_eq!(*v, 1.0 + 2.0 * (6 * i) as f32, "element {i}");
        }
        // Past the destination's end: refused before anything is submitted, naming it.
        let e = program.run_after_copies(0, &[copy(bytes + 4)]).unwrap_err();
        assert!(e.to_string().contains("\"x\""), "{e}");
        assert_eq!(engine.submissions() - before, 3);
        drop(program);
        assert_clean(&engine);
    }

    #[test]
    fn wrong_dispatches_are_refused_before_the_gpu_sees_them() {
        let Some(mut engine) = engine("wrong_dispatches_are_refused") else {
            return;
        };
        let bx = engine.buffer("x", 64, Location::CpuToGpu).unwrap();
        let pipeline = engine.pipeline(Kernel::Saxpy, &[]).unwrap();
        let run = |engine: &mut Engine, buffers: &[&Buffer], push: &[u8], groups| {
            engine
                .run(
                    &[Dispatch {
                        pipeline: &pipeline,
                        buffers,
                        push,
                        groups,
                    }],
                    Timestamps::Off,
                )
                .unwrap_err()
                .to_string()
        };
        let e = run(&mut engine, &[&bx], &push(16, 1.0), [1, 1, 1]);
        assert!(e.contains("1 buffer(s) given; the kernel binds 2"), "{e}");
        let e = run(&mut engine, &[&bx, &bx], &[0; 4], [1, 1, 1]);
        assert!(e.contains("4 push-constant bytes"), "{e}");
        let e = run(&mut engine, &[&bx, &bx], &push(16, 1.0), [0, 1, 1]);
        assert!(e.contains("workgroup counts"), "{e}");
        let e = engine
            .pipeline(Kernel::Saxpy, &[SpecConstant::u32(0, 4096)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("workgroup size"), "{e}");
        assert_clean(&engine);
    }

    #[test]
    fn gpu_only_buffers_go_through_staging_and_are_reported_by_name() {
        let Some(mut engine) = engine("gpu_only_buffers_go_through_staging") else {
            return;
        };
        let mut b = engine.buffer("weights", 4096, Location::GpuOnly).unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        engine.upload(&mut b, 0, &data).unwrap();
        let mut back = vec![0u8; 1000];
        engine.download(&mut b, 96, &mut back).unwrap();
        assert_eq!(back, data[96..1096]);
        assert!(engine.upload(&mut b, 4000, &data[..100]).is_err());
        let report = engine.allocation_report();
        let rec = report.get("weights").unwrap();
        assert_eq!((rec.bytes, rec.location), (4096, Location::GpuOnly));
        assert!(report.get("staging-upload").is_none(), "staging is freed");
        assert!(report.to_string().contains("weights"));
        drop(b);
        assert!(engine.allocation_report().get("weights").is_none());
        assert_clean(&engine);
    }

    #[test]
    fn pipeline_cache_is_written_reused_and_survives_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let cache = super::super::CacheDir::At(dir.path().to_path_buf());
        let Some(engine) = super::super::testing::engine_with("pipeline_cache", cache.clone())
        else {
            return;
        };
        assert_eq!(
            engine.pipeline_cache().status,
            super::super::CacheStatus::Missing
        );
        let path = engine.pipeline_cache().path.clone().unwrap();
        engine.pipeline(Kernel::Saxpy, &[]).unwrap();
        drop(engine);
        assert!(path.exists(), "saved on drop");

        let engine = super::super::testing::engine_with("pipeline_cache", cache.clone()).unwrap();
        assert!(
            matches!(
                engine.pipeline_cache().status,
                super::super::CacheStatus::Loaded { .. }
            ),
            "{:?}",
            engine.pipeline_cache().status
        );
        drop(engine);

        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let engine = super::super::testing::engine_with("pipeline_cache", cache).unwrap();
        match &engine.pipeline_cache().status {
            super::super::CacheStatus::Rejected { reason } => {
                assert!(reason.contains("checksum"), "{reason}")
            }
            other => panic!("corrupt cache was not rejected: {other:?}"),
        }
        engine.pipeline(Kernel::Saxpy, &[]).unwrap();
        assert_clean(&engine);
    }
}

#[cfg(test)]
mod validation_tests {
    use ash::vk;

    use super::super::testing::engine;

    /// The harness would be worthless if the layer were silently off: provoke one message.
    #[test]
    fn the_validation_layer_is_really_listening() {
        let Some(engine) = engine("the_validation_layer_is_really_listening") else {
            return;
        };
        assert!(engine.validation_enabled());
        let device = &engine.device().raw;
        // A buffer with no usage flags breaks VUID-VkBufferCreateInfo-usage-requiredbitmask.
        let info = vk::BufferCreateInfo::default()
            .size(64)
            .usage(vk::BufferUsageFlags::empty());
        // SAFETY: an invalid create info on purpose, but harmless to the driver (a buffer with
        // no usage); whatever it returns is destroyed at once.
        if let Ok(b) = unsafe { device.create_buffer(&info, None) } {
            // SAFETY: made just above, unused.
            unsafe { device.destroy_buffer(b, None) };
        }
        let messages = engine.validation().take();
        assert!(
            messages.iter().any(|m| m.contains("usage")),
            "no validation message for a buffer with no usage: {messages:?}"
        );
    }

    /// The engine leaves out barriers between independent dispatches; synchronization
    /// validation is what would catch one left out wrongly. Show that it is on: a dispatch
    /// reading what the one before wrote is a hazard without a barrier and fine with the
    /// engine's own choice (which puts none before a third, independent one).
    #[test]
    fn synchronization_validation_reports_a_missing_barrier() {
        use super::super::{Dispatch, Location, SpecConstant};
        use crate::compute::vulkan::kernels::Kernel;
        let Some(mut engine) = engine("synchronization_validation_reports_a_missing_barrier")
        else {
            return;
        };
        let buffer = |name| engine.buffer(name, 4 * 64, Location::GpuOnly).unwrap();
        let (x, y, z, w) = (buffer("x"), buffer("y"), buffer("z"), buffer("w"));
        let pipeline = engine
            .pipeline(Kernel::Saxpy, &[SpecConstant::u32(0, 64)])
            .unwrap();
        let push: Vec<u8> = [64u32.to_le_bytes(), 2f32.to_le_bytes()].concat();
        // saxpy reads binding 0 and updates binding 1: y is written, then read.
        let buffers = [[&x, &y], [&y, &z], [&x, &w]];
        let dispatches: Vec<Dispatch> = buffers
            .iter()
            .map(|b| Dispatch {
                pipeline: &pipeline,
                buffers: b,
                push: &push,
                groups: [1, 1, 1],
            })
            .collect();
        engine.validation().take();
        engine.run(&dispatches, super::Timestamps::Off).unwrap();
        let messages = engine.validation().take();
        assert!(
            messages.is_empty(),
            "with the engine's barriers: {messages:?}"
        );
        engine.run_unsynchronized(&dispatches).unwrap();
        let messages = engine.validation().take();
        assert!(
            messages.iter().any(|m| m.contains("SYNC-HAZARD")),
            "no synchronization hazard reported without barriers: {messages:?}"
        );
    }
}
