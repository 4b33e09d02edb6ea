//! The frame pass on the GPU: a camera frame copied into a host-visible buffer, its filter
//! windows into another, and one dispatch of [`Kernel::FramePass`] that writes the letterboxed
//! image at the start of the records tensor, submitted ahead of the entry that reads it (one
//! submission, one fence). What the kernel computes is planned by `crate::pixels::gpu`; this
//! module only moves bytes and records the dispatch.
//!
//! The stage lives inside its [`super::VulkanExec`] (the records buffer it writes is the
//! program's), and its buffers grow to the largest frame seen, or to what
//! [`super::VulkanExec::reserve_frames`] asked for up front: after that, a frame allocates
//! nothing.

use std::sync::Arc;

use ash::vk;

use super::allocation::Location;
use super::buffer::Buffer;
use super::device::Device;
use super::engine::{
    check_push_and_groups, Commands, DescriptorSets, Engine, QueryPool, RawDispatch, Timestamps,
    Timing,
};
use super::kernels::Kernel;
use super::pipeline::Pipeline;
use super::Result;
use crate::compute::recording::TensorId;

/// One frame for [`super::VulkanExec::run_frame`]: what `crate::pixels::gpu` planned.
#[derive(Debug, Clone, Copy)]
pub struct FrameJob<'a> {
    /// The byte tensor (the records) whose first `out_bytes` the kernel writes.
    pub target: TensorId,
    pub out_bytes: usize,
    /// The frame's bytes, from its first row's first byte.
    pub frame: &'a [u8],
    /// The window tables (`shaders/frame_pass.comp` says their layout).
    pub windows: &'a [u32],
    /// [`super::kernels::FRAME_PUSH_BYTES`] of push constants.
    pub push: &'a [u8],
    pub groups: [u32; 3],
    /// Bytes the host writes at `tail_offset` of the target before the kernel runs (the
    /// record's metadata, after the image the kernel writes).
    pub tail: &'a [u8],
    pub tail_offset: usize,
}

/// What [`super::VulkanExec::run_frame`] measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrameTiming {
    /// GPU time of the frame kernel (`None` where the queue has no timestamps).
    pub frame_gpu: Option<std::time::Duration>,
    /// The entry submitted after it, where there was one.
    pub entry: Option<Timing>,
    /// Host time from submission to the fence.
    pub wall: std::time::Duration,
}

/// The stage's pipeline, buffers and command buffer; see the module docs.
pub(super) struct FrameStage {
    // Dropped before the buffers they name (field order).
    sets: Option<DescriptorSets>,
    commands: Commands,
    /// Timestamps around the dispatch (`None` where the queue has none).
    queries: Option<QueryPool>,
    frame: Buffer,
    windows: Buffer,
    pipeline: Pipeline,
    /// The program buffer the sets bind as the output.
    target: usize,
    device: Arc<Device>,
}

/// Bytes of a stage buffer holding `len` bytes: whole words, never empty.
fn buffer_bytes(len: usize) -> u64 {
    (len.max(4).div_ceil(4) * 4) as u64
}

const FRAME_BUFFER: &str = "frame pass: frame";
const WINDOWS_BUFFER: &str = "frame pass: windows";

/// A host-visible stage buffer named `name` for `len` bytes.
fn stage_buffer(engine: &Engine, name: &str, len: usize) -> Result<Buffer> {
    engine.buffer(name, buffer_bytes(len), Location::CpuToGpu)
}

impl FrameStage {
    /// A stage with buffers for frames of `frame_bytes` and windows of `window_words`, writing
    /// into program buffer `target`.
    pub(super) fn new(
        engine: &Engine,
        target: usize,
        frame_bytes: usize,
        window_words: usize,
    ) -> Result<FrameStage> {
        let device = Arc::clone(engine.device());
        Ok(FrameStage {
            sets: None,
            commands: Commands::new(&device, device.compute.family)?,
            queries: QueryPool::for_dispatches(&device, Timestamps::Step, 1)?,
            frame: stage_buffer(engine, FRAME_BUFFER, frame_bytes)?,
            windows: stage_buffer(engine, WINDOWS_BUFFER, window_words * 4)?,
            pipeline: engine.pipeline(Kernel::FramePass, &[])?,
            target,
            device,
        })
    }

    /// Bytes of the stage's buffers.
    pub(super) fn bytes(&self) -> u64 {
        self.frame.size() + self.windows.size()
    }

    /// Grows the buffers to hold `frame_bytes` and `window_words` (new buffers, so the
    /// descriptor set is made again).
    pub(super) fn reserve(
        &mut self,
        engine: &Engine,
        frame_bytes: usize,
        window_words: usize,
    ) -> Result<()> {
        if buffer_bytes(frame_bytes) > self.frame.size() {
            log::debug!("frame pass: frame buffer grows to {frame_bytes} bytes");
            self.sets = None;
            self.frame = stage_buffer(engine, FRAME_BUFFER, frame_bytes)?;
        }
        if buffer_bytes(window_words * 4) > self.windows.size() {
            self.sets = None;
            self.windows = stage_buffer(engine, WINDOWS_BUFFER, window_words * 4)?;
        }
        Ok(())
    }

    /// Copies the job's frame and windows into the stage's buffers and records its dispatch
    /// into the stage's command buffer, writing `target` (the program's buffer `self.target`).
    /// The job was checked by the caller against the target's size.
    pub(super) fn record(&mut self, job: &FrameJob<'_>, target: &Buffer) -> Result<()> {
        self.frame.write(0, job.frame)?;
        let words = self
            .windows
            .mapped_mut()
            .ok_or_else(|| super::Error::Buffer {
                name: WINDOWS_BUFFER.into(),
                detail: "not host-visible".into(),
            })?;
        for (out, w) in words.chunks_exact_mut(4).zip(job.windows) {
            out.copy_from_slice(&w.to_le_bytes());
        }
        if self.sets.is_none() {
            let raw = RawDispatch::new(
                &self.device,
                0,
                &self.pipeline,
                &[&self.frame, &self.windows, target],
                job.push,
                job.groups,
            )?;
            self.sets = Some(DescriptorSets::new(&self.device, &[raw])?);
        }
        let set = self.sets.as_ref().expect("made above").sets[0];
        check_push_and_groups(&self.device, 0, Kernel::FramePass, job.push, job.groups)?;
        let cmd = self.commands.begin(true)?;
        let raw = &self.device.raw;
        let layout = self.pipeline.layout();
        let after = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::HOST_READ,
            )];
        // SAFETY: `cmd` is recording (after `begin`); the pipeline, its layout and the set (which
        // names the stage's buffers and the program's target buffer, all alive while the exec
        // that holds this stage is) belong to this device; the push block is the kernel's size
        // and the grid within the device's limits (both checked above). The submission is waited for
        // before the buffers can change.
        unsafe {
            if let Some(q) = &self.queries {
                raw.cmd_reset_query_pool(cmd, q.raw, 0, q.count);
                raw.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, q.raw, 0);
            }
            raw.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, self.pipeline.raw());
            raw.cmd_bind_descriptor_sets(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                layout,
                0,
                &[set],
                &[],
            );
            raw.cmd_push_constants(cmd, layout, vk::ShaderStageFlags::COMPUTE, 0, job.push);
            raw.cmd_dispatch(cmd, job.groups[0], job.groups[1], job.groups[2]);
            if let Some(q) = &self.queries {
                raw.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q.raw, 1);
            }
            // The image is read by the entry's shaders next, or by the host (tests).
            raw.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::PipelineStageFlags::COMPUTE_SHADER
                    | vk::PipelineStageFlags::TRANSFER
                    | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &after,
                &[],
                &[],
            );
        }
        self.commands.end()
    }

    /// The GPU time of the last recorded dispatch, once its submission has finished (`None`
    /// where the queue has no timestamps).
    pub(super) fn gpu_time(&self) -> Result<Option<std::time::Duration>> {
        let Some(q) = &self.queries else {
            return Ok(None);
        };
        let mut timing = Timing::default();
        q.read(Timestamps::Step, &mut timing)?;
        Ok(timing.gpu)
    }

    /// The recorded command buffer.
    pub(super) fn commands(&self) -> &Commands {
        &self.commands
    }

    /// The program buffer it writes.
    pub(super) fn target(&self) -> usize {
        self.target
    }
}
