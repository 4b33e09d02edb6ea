//! [`Engine`]: the device, its pipeline cache and command pools; buffers and pipelines made
//! from it; dispatches recorded into one command buffer, submitted, waited for and timed.
//!
//! Two ways to run work:
//!
//! - [`Engine::run`]: a list of [`Dispatch`]es borrowing their pipelines and buffers, recorded,
//!   submitted and waited for in one call (tests, one-off work).
//! - [`super::Program`]: dispatches over buffers the program owns, recorded once into a command
//!   buffer and replayed every step (the training and inference steps).
//!
//! Both record the same way (`record_dispatches`): a barrier first, so the commands see what
//! earlier submissions, uploads and fills wrote (a replayed command buffer runs after them),
//! then bind, push constants, dispatch, with a compute→compute memory barrier before each
//! dispatch that reads or writes what an earlier one wrote, or writes what an earlier one read
//! ([`super::barriers`]: independent dispatches overlap on the GPU), and at the end a
//! compute→host/transfer barrier so the host
//! (or a download's copy) reads finished results. Timestamps (when asked and
//! when the queue has them) are written before the first dispatch and after each one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;

use super::allocation::{AllocationReport, Location};
use super::buffer::Buffer;
use super::cache::{CacheLoad, PipelineCache};
use super::context::{DeviceInfo, ValidationLog};
use super::device::{Device, Queue};
use super::kernels::{Kernel, TexelFormat};
use super::lower::Variants;
use super::options::Options;
use super::pipeline::{Pipeline, SpecConstant};
use super::{Error, Result};
use crate::base::SlotBytes;

/// Which GPU timestamps to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Timestamps {
    /// None.
    Off,
    /// Around the whole submission.
    #[default]
    Step,
    /// Around the whole submission and after every dispatch.
    PerDispatch,
}

/// How long a submission took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timing {
    /// GPU time from before the first dispatch to after the last, from timestamps (`None`:
    /// not asked for, or the queue has no timestamps).
    pub gpu: Option<Duration>,
    /// GPU time of each dispatch (with [`Timestamps::PerDispatch`]); dispatch `i` is the time
    /// from the end of dispatch `i − 1` (or the start) to its end, barriers included.
    pub per_dispatch: Vec<Duration>,
    /// Host time from `vkQueueSubmit` to the fence signalled and the timestamps read: the GPU
    /// time plus submission, scheduling and wake-up overhead.
    pub wall: Duration,
}

impl Timing {
    /// `wall − gpu`: what the submission cost beyond the kernels (`None` without timestamps).
    pub fn overhead(&self) -> Option<Duration> {
        self.gpu.map(|g| self.wall.saturating_sub(g))
    }
}

/// One dispatch for [`Engine::run`]: a pipeline, its buffers (binding `i` is `buffers[i]`),
/// its push-constant bytes (exactly the kernel's size) and the workgroup counts.
#[derive(Debug, Clone, Copy)]
pub struct Dispatch<'a> {
    pub pipeline: &'a Pipeline,
    pub buffers: &'a [&'a Buffer],
    pub push: &'a [u8],
    pub groups: [u32; 3],
}

/// The raw form of a dispatch, checked, as `record_dispatches` takes it.
#[derive(Debug, Clone)]
pub(crate) struct RawDispatch {
    pub kernel: Kernel,
    pub pipeline: vk::Pipeline,
    pub layout: vk::PipelineLayout,
    pub set_layout: vk::DescriptorSetLayout,
    pub buffers: Vec<(vk::Buffer, u64)>,
    pub push: Vec<u8>,
    pub groups: [u32; 3],
}

impl RawDispatch {
    /// Checks `pipeline`, `buffers`, `push` and `groups` against the kernel and the device.
    pub(crate) fn new(
        device: &Arc<Device>,
        index: usize,
        pipeline: &Pipeline,
        buffers: &[&Buffer],
        push: &[u8],
        groups: [u32; 3],
    ) -> Result<RawDispatch> {
        let kernel = pipeline.kernel();
        let info = kernel.info();
        let fail = |detail: String| Error::Dispatch {
            index,
            kernel: info.name,
            detail,
        };
        if !Arc::ptr_eq(&pipeline.device, device) {
            return Err(fail("the pipeline was made by another engine".into()));
        }
        if buffers.len() != info.bindings as usize {
            return Err(fail(format!(
                "{} buffer(s) given; the kernel binds {}",
                buffers.len(),
                info.bindings
            )));
        }
        if let Some(b) = buffers.iter().find(|b| !b.same_device(device)) {
            return Err(fail(format!(
                "buffer {:?} was made by another engine",
                b.name()
            )));
        }
        check_push_and_groups(device, index, kernel, push, groups)?;
        Ok(RawDispatch {
            kernel,
            pipeline: pipeline.raw(),
            layout: pipeline.layout(),
            set_layout: pipeline.set_layout(),
            buffers: buffers.iter().map(|b| (b.raw(), b.size())).collect(),
            push: push.to_vec(),
            groups,
        })
    }
}

/// Checks that `push` is `kernel`'s push-constant block and `groups` a grid the device runs
/// (dispatch `index` in errors): what every dispatch recorded needs, whether made once
/// ([`RawDispatch::new`]) or per frame (the frame pass's).
pub(crate) fn check_push_and_groups(
    device: &Device,
    index: usize,
    kernel: Kernel,
    push: &[u8],
    groups: [u32; 3],
) -> Result<()> {
    let info = kernel.info();
    let fail = |detail: String| Error::Dispatch {
        index,
        kernel: info.name,
        detail,
    };
    if push.len() != info.push_bytes as usize {
        return Err(fail(format!(
            "{} push-constant bytes given; the kernel takes {}",
            push.len(),
            info.push_bytes
        )));
    }
    let max = device.info.limits.max_compute_work_group_count;
    if groups.contains(&0) || (0..3).any(|d| groups[d] > max[d]) {
        return Err(fail(format!(
            "workgroup counts {groups:?}: each must be at least 1 and at most {max:?}"
        )));
    }
    Ok(())
}

/// Descriptor sets for a list of dispatches: one pool, one set per dispatch, written once,
/// and the buffer views of the kernels' texel bindings ([`super::KernelInfo::texels`]).
pub(crate) struct DescriptorSets {
    pool: vk::DescriptorPool,
    pub(crate) sets: Vec<vk::DescriptorSet>,
    views: Vec<vk::BufferView>,
    device: Arc<Device>,
}

impl DescriptorSets {
    pub(crate) fn new(device: &Arc<Device>, dispatches: &[RawDispatch]) -> Result<DescriptorSets> {
        let texels: u32 = dispatches
            .iter()
            .map(|d| d.kernel.info().texels.count_ones())
            .sum();
        let descriptors: u32 = dispatches.iter().map(|d| d.buffers.len() as u32).sum();
        let sizes = [
            vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: (descriptors - texels).max(1),
            },
            vk::DescriptorPoolSize {
                ty: vk::DescriptorType::UNIFORM_TEXEL_BUFFER,
                descriptor_count: texels.max(1),
            },
        ];
        let info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(dispatches.len().max(1) as u32)
            .pool_sizes(&sizes);
        // SAFETY: a valid device and create info.
        let pool = unsafe { device.raw.create_descriptor_pool(&info, None) }
            .map_err(Error::vk("vkCreateDescriptorPool"))?;
        let mut made = DescriptorSets {
            pool,
            sets: Vec::new(),
            views: Vec::new(),
            device: Arc::clone(device),
        };
        if dispatches.is_empty() {
            return Ok(made);
        }
        let layouts: Vec<_> = dispatches.iter().map(|d| d.set_layout).collect();
        let alloc = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: the pool was sized for exactly these sets and descriptors; the layouts come
        // from live pipelines of this device.
        made.sets = unsafe { device.raw.allocate_descriptor_sets(&alloc) }
            .map_err(Error::vk("vkAllocateDescriptorSets"))?;
        // One entry per binding: a whole-buffer range, or the view of a texel binding.
        let mut infos: Vec<Vec<vk::DescriptorBufferInfo>> = Vec::with_capacity(dispatches.len());
        let mut views: Vec<Vec<vk::BufferView>> = Vec::with_capacity(dispatches.len());
        for (index, d) in dispatches.iter().enumerate() {
            let info = d.kernel.info();
            let mut buffer_infos = Vec::with_capacity(d.buffers.len());
            let mut texel_views = Vec::with_capacity(d.buffers.len());
            for (b, &(buffer, size)) in d.buffers.iter().enumerate() {
                buffer_infos.push(vk::DescriptorBufferInfo {
                    buffer,
                    offset: 0,
                    range: vk::WHOLE_SIZE,
                });
                texel_views.push(match info.texel_format(b as u32) {
                    Some(format) => made.texel_view(buffer, size, format, (index, info.name, b))?,
                    None => vk::BufferView::null(),
                });
            }
            infos.push(buffer_infos);
            views.push(texel_views);
        }
        let writes: Vec<vk::WriteDescriptorSet> = made
            .sets
            .iter()
            .zip(dispatches)
            .zip(infos.iter().zip(&views))
            .flat_map(|((&set, d), (infos, views))| {
                let kernel = d.kernel.info();
                infos
                    .iter()
                    .zip(views)
                    .enumerate()
                    .map(move |(b, (info, view))| {
                        // The type the pipeline's set layout declared for the binding.
                        let ty = kernel.descriptor_type(b as u32);
                        let write = vk::WriteDescriptorSet::default()
                            .dst_set(set)
                            .dst_binding(b as u32)
                            .descriptor_type(ty);
                        if ty == vk::DescriptorType::UNIFORM_TEXEL_BUFFER {
                            write.texel_buffer_view(std::slice::from_ref(view))
                        } else {
                            write.buffer_info(std::slice::from_ref(info))
                        }
                    })
            })
            .collect();
        // SAFETY: the sets were just allocated and are not in use; every buffer is alive (the
        // caller holds it) and was made with STORAGE_BUFFER and UNIFORM_TEXEL_BUFFER usage;
        // every view is alive (held by `made`).
        unsafe { device.raw.update_descriptor_sets(&writes, &[]) };
        Ok(made)
    }

    /// A view of the whole texels of `buffer` (its trailing bytes short of a texel are out of
    /// the view's reach: the kernels that read through views never need them), kept until
    /// the sets are dropped.
    fn texel_view(
        &mut self,
        buffer: vk::Buffer,
        size: u64,
        format: TexelFormat,
        (index, kernel, binding): (usize, &'static str, usize),
    ) -> Result<vk::BufferView> {
        let texel = format.bytes();
        let limit = u64::from(self.device.info.limits.max_texel_buffer_elements);
        let texels = size / texel;
        if texels == 0 || texels > limit {
            return Err(Error::Dispatch {
                index,
                kernel,
                detail: format!(
                    "binding {binding}: {size} bytes as {texel}-byte texels, where a texel view \
                     on this device holds 1 to {limit}: the tensor is too large for the \
                     CPU-type device's kernels; use --engine cpu"
                ),
            });
        }
        let info = vk::BufferViewCreateInfo::default()
            .buffer(buffer)
            .format(format.vk())
            .offset(0)
            .range(texels * texel);
        // SAFETY: a live buffer of this device made with UNIFORM_TEXEL_BUFFER usage; the
        // range lies within it and within the device's texel limit; the format is one every
        // Vulkan device supports for uniform texel buffers.
        let view = unsafe { self.device.raw.create_buffer_view(&info, None) }
            .map_err(Error::vk("vkCreateBufferView"))?;
        self.views.push(view);
        Ok(view)
    }
}

impl Drop for DescriptorSets {
    fn drop(&mut self) {
        // SAFETY: made from this device; no command buffer using the sets or views is pending
        // (every submission is waited for); destroying the pool frees its sets.
        unsafe {
            for &view in &self.views {
                self.device.raw.destroy_buffer_view(view, None);
            }
            self.device.raw.destroy_descriptor_pool(self.pool, None);
        }
    }
}

/// A timestamp query pool for `count` queries.
pub(crate) struct QueryPool {
    pub(crate) raw: vk::QueryPool,
    pub(crate) count: u32,
    device: Arc<Device>,
}

impl QueryPool {
    /// `None` when the compute queue has no timestamps or none are asked for.
    pub(crate) fn for_dispatches(
        device: &Arc<Device>,
        timestamps: Timestamps,
        dispatches: usize,
    ) -> Result<Option<QueryPool>> {
        let count = match timestamps {
            Timestamps::Off => return Ok(None),
            Timestamps::Step => 2,
            Timestamps::PerDispatch => dispatches as u32 + 1,
        };
        if device.info.limits.timestamp_valid_bits == 0 {
            return Ok(None);
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(count);
        // SAFETY: a valid device and create info.
        let raw = unsafe { device.raw.create_query_pool(&info, None) }
            .map_err(Error::vk("vkCreateQueryPool"))?;
        Ok(Some(QueryPool {
            raw,
            count,
            device: Arc::clone(device),
        }))
    }

    /// Reads the timestamps of a finished submission into `timing`.
    pub(crate) fn read(&self, timestamps: Timestamps, timing: &mut Timing) -> Result<()> {
        // Two timestamps (a step) on the stack: a training step allocates nothing.
        let mut pair = [0u64; 2];
        let mut many = Vec::new();
        let ticks: &mut [u64] = if self.count as usize == pair.len() {
            &mut pair
        } else {
            many.resize(self.count as usize, 0);
            &mut many
        };
        // SAFETY: the pool belongs to this device; the submission that wrote every query has
        // finished (its fence was waited for); `ticks` has room for `count` u64 results.
        unsafe {
            self.device.raw.get_query_pool_results(
                self.raw,
                0,
                ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(Error::vk("vkGetQueryPoolResults"))?;
        let limits = &self.device.info.limits;
        let mask = if limits.timestamp_valid_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << limits.timestamp_valid_bits) - 1
        };
        let period = f64::from(limits.timestamp_period_ns);
        let span = |a: u64, b: u64| {
            Duration::from_nanos(((b & mask).wrapping_sub(a & mask) & mask) as f64 as u64)
                .mul_f64(period)
        };
        timing.gpu = Some(span(ticks[0], ticks[ticks.len() - 1]));
        if timestamps == Timestamps::PerDispatch {
            timing.per_dispatch = ticks.windows(2).map(|w| span(w[0], w[1])).collect();
        }
        Ok(())
    }
}

impl Drop for QueryPool {
    fn drop(&mut self) {
        // SAFETY: made from this device; no pending submission writes it.
        unsafe { self.device.raw.destroy_query_pool(self.raw, None) };
    }
}

/// Which compute→compute barriers [`record_dispatches`] puts between dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Barriers {
    /// Where an access follows a conflicting one ([`super::barriers::needed`]).
    AsNeeded,
    /// None: only for the test that shows the validation layer reports the hazards.
    #[cfg(test)]
    Omitted,
}

/// Records `dispatches` (with their `sets`) into `cmd`, which must be in the recording state;
/// with `queries`, timestamps per [`QueryPool::for_dispatches`].
///
/// # Safety
///
/// `cmd` is a command buffer of `device` in the recording state, allocated from a pool of the
/// compute family; every handle in `dispatches` and `sets` is alive and stays alive until the
/// last submission of `cmd` has finished.
pub(crate) unsafe fn record_dispatches(
    device: &Device,
    cmd: vk::CommandBuffer,
    dispatches: &[RawDispatch],
    sets: &[vk::DescriptorSet],
    queries: Option<(&QueryPool, Timestamps)>,
    barriers: Barriers,
) {
    let raw = &device.raw;
    let accesses: Vec<(Vec<vk::Buffer>, u32)> = dispatches
        .iter()
        .map(|d| {
            let buffers = d.buffers.iter().map(|&(b, _)| b).collect();
            (buffers, super::barriers::written_bindings(d.kernel))
        })
        .collect();
    let barrier_before = match barriers {
        Barriers::AsNeeded => super::barriers::needed(&accesses),
        #[cfg(test)]
        Barriers::Omitted => vec![false; dispatches.len()],
    };
    let compute_to_compute = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
    // SAFETY (for every command below): the caller guarantees `cmd` is recording and every
    // handle is alive; push-constant sizes and binding counts were checked by RawDispatch.
    unsafe {
        if let Some((pool, _)) = queries {
            raw.cmd_reset_query_pool(cmd, pool.raw, 0, pool.count);
            raw.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, pool.raw, 0);
        }
        // A replayed command buffer reads what the previous submission's shaders, an upload's
        // copy or a zero fill wrote: submission order alone orders execution, not memory.
        let from_before = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
        raw.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::COMPUTE_SHADER,
            vk::DependencyFlags::empty(),
            &from_before,
            &[],
            &[],
        );
        let mut bound = vk::Pipeline::null();
        for (i, (d, &set)) in dispatches.iter().zip(sets).enumerate() {
            if barrier_before[i] {
                raw.cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::DependencyFlags::empty(),
                    &compute_to_compute,
                    &[],
                    &[],
                );
            }
            if d.pipeline != bound {
                raw.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, d.pipeline);
                bound = d.pipeline;
            }
            raw.cmd_bind_descriptor_sets(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                d.layout,
                0,
                &[set],
                &[],
            );
            if !d.push.is_empty() {
                raw.cmd_push_constants(cmd, d.layout, vk::ShaderStageFlags::COMPUTE, 0, &d.push);
            }
            raw.cmd_dispatch(cmd, d.groups[0], d.groups[1], d.groups[2]);
            if let Some((pool, Timestamps::PerDispatch)) = queries {
                raw.cmd_write_timestamp(
                    cmd,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    pool.raw,
                    i as u32 + 1,
                );
            }
        }
        if let Some((pool, Timestamps::Step)) = queries {
            raw.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, pool.raw, 1);
        }
        // Results are read by the host directly or through a download's copy.
        let to_host = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ | vk::AccessFlags::TRANSFER_READ)];
        raw.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::HOST | vk::PipelineStageFlags::TRANSFER,
            vk::DependencyFlags::empty(),
            &to_host,
            &[],
            &[],
        );
    }
}

/// A command pool of one queue family with one reusable command buffer and a fence.
pub(crate) struct Commands {
    pool: vk::CommandPool,
    pub(crate) cmd: vk::CommandBuffer,
    fence: vk::Fence,
    device: Arc<Device>,
}

impl Commands {
    pub(crate) fn new(device: &Arc<Device>, family: u32) -> Result<Commands> {
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: a valid device; the family exists (a queue was created from it).
        let pool = unsafe { device.raw.create_command_pool(&info, None) }
            .map_err(Error::vk("vkCreateCommandPool"))?;
        let mut made = Commands {
            pool,
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            device: Arc::clone(device),
        };
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool was just made from this device.
        made.cmd = unsafe { device.raw.allocate_command_buffers(&alloc) }
            .map_err(Error::vk("vkAllocateCommandBuffers"))?[0];
        // SAFETY: a valid device.
        made.fence = unsafe {
            device
                .raw
                .create_fence(&vk::FenceCreateInfo::default(), None)
        }
        .map_err(Error::vk("vkCreateFence"))?;
        Ok(made)
    }

    /// Resets the command buffer and begins recording.
    pub(crate) fn begin(&self, one_time: bool) -> Result<vk::CommandBuffer> {
        let flags = if one_time {
            vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT
        } else {
            vk::CommandBufferUsageFlags::empty()
        };
        // SAFETY: the command buffer is not pending (every submit is waited for before the
        // call that made it returns); its pool allows resetting single buffers.
        unsafe {
            self.device
                .raw
                .reset_command_buffer(self.cmd, vk::CommandBufferResetFlags::empty())
                .map_err(Error::vk("vkResetCommandBuffer"))?;
            self.device
                .raw
                .begin_command_buffer(
                    self.cmd,
                    &vk::CommandBufferBeginInfo::default().flags(flags),
                )
                .map_err(Error::vk("vkBeginCommandBuffer"))?;
        }
        Ok(self.cmd)
    }

    pub(crate) fn end(&self) -> Result<()> {
        // SAFETY: the command buffer is recording (after `begin`).
        unsafe { self.device.raw.end_command_buffer(self.cmd) }
            .map_err(Error::vk("vkEndCommandBuffer"))
    }

    /// Submits the recorded command buffer on `queue` and waits for it; returns the wall time
    /// from submit to the fence.
    pub(crate) fn submit_and_wait(&self, queue: &Queue) -> Result<Duration> {
        self.submit_after_and_wait(queue, None)
    }

    /// As [`Commands::submit_and_wait`], with `before` (recorded and ended, from a pool of the
    /// same queue family) ahead of this command buffer in the same submission: one
    /// `vkQueueSubmit`, one fence.
    pub(crate) fn submit_after_and_wait(
        &self,
        queue: &Queue,
        before: Option<&Commands>,
    ) -> Result<Duration> {
        let cmds: &[vk::CommandBuffer] = match before {
            Some(b) => &[b.cmd, self.cmd],
            None => &[self.cmd],
        };
        let submit = vk::SubmitInfo::default().command_buffers(cmds);
        self.device.submissions.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        {
            let q = queue.lock();
            // SAFETY: the command buffers are executable (recorded and ended) and not pending
            // (`before`'s owner waits with this fence too); the fence is unsignalled (reset
            // after each wait) and from this device; the queue is externally synchronised by
            // its Mutex.
            unsafe { self.device.raw.queue_submit(*q, &[submit], self.fence) }
                .map_err(Error::vk("vkQueueSubmit"))?;
        }
        let waited = self.device.wait(self.fence);
        let wall = started.elapsed();
        if waited.is_err() {
            // A timed-out submission may still run: wait for the device to go idle before
            // anything it uses can be freed.
            // SAFETY: a valid device.
            let _ = unsafe { self.device.raw.device_wait_idle() };
        }
        waited?;
        // SAFETY: the fence is signalled and no longer used by a pending submission.
        unsafe { self.device.raw.reset_fences(&[self.fence]) }
            .map_err(Error::vk("vkResetFences"))?;
        Ok(wall)
    }
}

impl Drop for Commands {
    fn drop(&mut self) {
        // SAFETY: made from this device; nothing pending (every submit is waited for);
        // destroying the pool frees its command buffer; null handles are ignored.
        unsafe {
            self.device.raw.destroy_fence(self.fence, None);
            self.device.raw.destroy_command_pool(self.pool, None);
        }
    }
}

/// The Vulkan engine: see the module docs.
pub struct Engine {
    // Field order: everything holding an `Arc<Device>` is dropped before `device`, which is
    // only a handle here (the Arc keeps the device alive regardless).
    compute: Commands,
    /// See [`Engine::driver_bytes`].
    driver_bytes: Option<u64>,
    transfer: Option<Commands>,
    cache: PipelineCache,
    /// Uploads done as GPU copies from imported host memory (see [`Engine::upload`]).
    imported_uploads: u64,
    pub(crate) device: Arc<Device>,
}

impl Engine {
    /// Loads Vulkan and sets up the device chosen per `options` (see [`super::pick_device`]).
    /// Errors for which [`Error::is_unavailable`] holds mean "use the CPU engine".
    pub fn new(options: &Options) -> Result<Engine> {
        let before = crate::base::resident();
        let device = Device::new(options)?;
        let cache = PipelineCache::open(&device, &options.pipeline_cache)?;
        let compute = Commands::new(&device, device.compute.family)?;
        let transfer = match &device.transfer {
            Some(q) => Some(Commands::new(&device, q.family)?),
            None => None,
        };
        let driver_bytes = match (before, crate::base::resident()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        Ok(Engine {
            compute,
            transfer,
            cache,
            imported_uploads: 0,
            driver_bytes,
            device,
        })
    }

    /// What loading the Vulkan loader and driver and making the device added to this process's
    /// resident memory (their code, libraries and own allocations), measured as they loaded;
    /// `None` where resident memory cannot be read. Memory plans list it as a line of its own.
    pub fn driver_bytes(&self) -> Option<u64> {
        self.driver_bytes
    }

    /// The fp16 kernel variants are enabled (asked for, and the device has `shaderFloat16`).
    pub fn fp16(&self) -> bool {
        self.device.fp16
    }

    /// The kernel variants recordings are lowered to on this engine: fp16 where enabled,
    /// direct ones per [`Options::direct`] (by default on CPU-type devices), subgroup ones
    /// per [`Options::subgroups`] (by default where the device has them), the kernels that
    /// allow it compiled per shape per [`Options::specialise`], the tiled GEMMs' tiles forced
    /// per [`Options::gemm_tile`].
    pub fn variants(&self) -> Variants {
        Variants {
            fp16: self.device.fp16,
            direct: self.device.direct,
            subgroups: self.device.subgroups,
            shapes: self.device.specialise,
            gemm_tile: self.device.gemm_tile,
        }
    }

    /// The device in use.
    pub fn info(&self) -> &DeviceInfo {
        &self.device.info
    }

    /// The validation messages (empty unless validation is on and something was reported).
    pub fn validation(&self) -> ValidationLog {
        self.device.instance.validation.clone()
    }

    /// Whether the Khronos validation layer is on for this engine.
    pub fn validation_enabled(&self) -> bool {
        self.device.instance.validation_on
    }

    /// What loading the pipeline cache gave at start.
    pub fn pipeline_cache(&self) -> &CacheLoad {
        self.cache.load()
    }

    /// Writes the pipeline cache file now (also done when the engine is dropped). Returns the
    /// bytes written, or `None` when persisting is off.
    pub fn save_pipeline_cache(&self) -> Result<Option<usize>> {
        self.cache.save()
    }

    /// Every live buffer of this engine, by name, with totals.
    pub fn allocation_report(&self) -> AllocationReport {
        let held = self
            .device
            .allocator()
            .generate_report()
            .blocks
            .iter()
            .map(|b| b.size)
            .sum();
        self.device.registry().report(held)
    }

    /// A named storage buffer of `size` bytes.
    pub fn buffer(&self, name: &str, size: u64, location: Location) -> Result<Buffer> {
        Buffer::new(&self.device, name, size, location)
    }

    /// The compute pipeline of `kernel` with specialisation constants `spec`, through the
    /// pipeline cache.
    pub fn pipeline(&self, kernel: Kernel, spec: &[SpecConstant]) -> Result<Pipeline> {
        Pipeline::new(&self.device, self.cache.raw, kernel, spec)
    }

    /// Records `dispatches` into one command buffer, submits it, waits, and returns its timing.
    pub fn run(&mut self, dispatches: &[Dispatch<'_>], timestamps: Timestamps) -> Result<Timing> {
        self.run_with(dispatches, timestamps, Barriers::AsNeeded)
    }

    /// [`Engine::run`] with no barriers between the dispatches, whatever they access.
    #[cfg(test)]
    pub(crate) fn run_unsynchronized(&mut self, dispatches: &[Dispatch<'_>]) -> Result<Timing> {
        self.run_with(dispatches, Timestamps::Off, Barriers::Omitted)
    }

    fn run_with(
        &mut self,
        dispatches: &[Dispatch<'_>],
        timestamps: Timestamps,
        barriers: Barriers,
    ) -> Result<Timing> {
        let raw: Vec<RawDispatch> = dispatches
            .iter()
            .enumerate()
            .map(|(i, d)| {
                RawDispatch::new(&self.device, i, d.pipeline, d.buffers, d.push, d.groups)
            })
            .collect::<Result<_>>()?;
        let sets = DescriptorSets::new(&self.device, &raw)?;
        let queries = QueryPool::for_dispatches(&self.device, timestamps, raw.len())?;
        let cmd = self.compute.begin(true)?;
        // SAFETY: `cmd` is recording; the pipelines and buffers are borrowed by `dispatches`
        // for this whole call and the sets and queries live until its end, after the wait.
        unsafe {
            record_dispatches(
                &self.device,
                cmd,
                &raw,
                &sets.sets,
                queries.as_ref().map(|q| (q, timestamps)),
                barriers,
            )
        };
        self.compute.end()?;
        let mut timing = Timing {
            wall: self.compute.submit_and_wait(&self.device.compute)?,
            ..Timing::default()
        };
        if let Some(q) = &queries {
            q.read(timestamps, &mut timing)?;
        }
        Ok(timing)
    }

    /// Copies `data` into `buffer` at `offset`: bytes in host memory this device imported
    /// (ring slots, see [`Engine::slot_allocator`]) by the GPU, in a submission of their own,
    /// the CPU touching none of them; others as [`Engine::upload`] does.
    pub fn upload_slot(
        &mut self,
        buffer: &mut Buffer,
        offset: u64,
        data: SlotBytes<'_>,
    ) -> Result<()> {
        let device = Arc::clone(&self.device);
        let Some(found) = device.host_import.as_ref().and_then(|i| i.find(data)) else {
            return self.upload(buffer, offset, data.bytes());
        };
        buffer.range(offset, data.len())?;
        self.check_ours(buffer)?;
        let region = vk::BufferCopy {
            src_offset: found.offset,
            dst_offset: offset,
            size: data.len() as u64,
        };
        // `found` holds the import alive until the copy has finished.
        self.copy_for_shaders(found.buffer, buffer.raw(), region)?;
        self.imported_uploads += 1;
        Ok(())
    }

    /// Counts an upload the GPU copied from imported host memory as part of a recorded step
    /// ([`super::exec::VulkanExec::run_reading`]).
    pub(crate) fn count_imported_upload(&mut self) {
        self.imported_uploads += 1;
    }

    /// Copies `data` into `buffer` at `offset`: directly where the buffer is host-visible, else
    /// through a staging buffer and a copy on the transfer queue (or the compute queue).
    pub fn upload(&mut self, buffer: &mut Buffer, offset: u64, data: &[u8]) -> Result<()> {
        if buffer.is_host_visible() {
            return buffer.write(offset, data);
        }
        buffer.range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let mut staging = self.buffer("staging-upload", data.len() as u64, Location::CpuToGpu)?;
        staging.write(0, data)?;
        self.copy(&staging, 0, buffer, offset, data.len() as u64)
    }

    /// Copies from `buffer` at `offset` into `out` (see [`Engine::upload`]).
    pub fn download(&mut self, buffer: &mut Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        if buffer.is_host_visible() {
            return buffer.read(offset, out);
        }
        buffer.range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let mut staging = self.buffer("staging-download", out.len() as u64, Location::GpuToCpu)?;
        self.copy(buffer, offset, &staging, 0, out.len() as u64)?;
        staging.read(0, out)
    }

    /// Sets every byte of `buffers` to zero (`vkCmdFillBuffer`, one submission, waited for),
    /// visible to later dispatches and host reads.
    pub fn fill_zero(&mut self, buffers: &[&Buffer]) -> Result<()> {
        for b in buffers {
            self.check_ours(b)?;
        }
        if buffers.is_empty() {
            return Ok(());
        }
        self.transfer_then_visible(|raw, cmd| {
            for b in buffers {
                // SAFETY: `cmd` is recording; the buffers are borrowed for this call, belong to
                // this device (checked) and were made with TRANSFER_DST usage; WHOLE_SIZE fills
                // whole 4-byte words of each (buffer sizes here are multiples of 4 or the tail
                // is left).
                unsafe { raw.cmd_fill_buffer(cmd, b.raw(), 0, vk::WHOLE_SIZE, 0) };
            }
        })
    }

    /// An error unless `buffer` was made on this engine's device.
    fn check_ours(&self, buffer: &Buffer) -> Result<()> {
        if buffer.same_device(&self.device) {
            Ok(())
        } else {
            Err(Error::Buffer {
                name: buffer.name().to_owned(),
                detail: "made by another engine".to_owned(),
            })
        }
    }

    /// Records transfer commands with `record` into a compute-queue command buffer, then a
    /// barrier that makes their writes visible to later dispatches, transfers and host reads;
    /// submits it and waits.
    fn transfer_then_visible(
        &mut self,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<()> {
        let cmd = self.compute.begin(true)?;
        record(&self.device.raw, cmd);
        let after = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE
                    | vk::AccessFlags::HOST_READ,
            )];
        // SAFETY: `cmd` is recording (after `begin`); the barrier names no resources.
        unsafe {
            self.device.raw.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::COMPUTE_SHADER
                    | vk::PipelineStageFlags::TRANSFER
                    | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &after,
                &[],
                &[],
            );
        }
        self.compute.end()?;
        self.compute.submit_and_wait(&self.device.compute)?;
        Ok(())
    }

    /// `vkCmdCopyBuffer` of `region` on the compute queue, waited for, and visible to later
    /// dispatches, transfers and host reads (as [`Engine::fill_zero`]).
    fn copy_for_shaders(
        &mut self,
        src: vk::Buffer,
        dst: vk::Buffer,
        region: vk::BufferCopy,
    ) -> Result<()> {
        if region.size == 0 {
            return Ok(());
        }
        self.transfer_then_visible(|raw, cmd| {
            // SAFETY: `cmd` is recording; the caller keeps both buffers alive until this
            // returns (after the wait); `src` has TRANSFER_SRC and `dst` TRANSFER_DST usage,
            // and the region was checked against both.
            unsafe { raw.cmd_copy_buffer(cmd, src, dst, &[region]) };
        })
    }

    /// Memory for the loader's ring that this device reads directly: host memory it imports
    /// (`VK_EXT_external_memory_host`), so that [`Engine::upload`] from a slot is a GPU copy.
    /// `None` where the device cannot import host memory.
    pub fn slot_allocator(&self) -> Option<super::host_import::HostImporter> {
        super::host_import::HostImporter::new(&self.device)
    }

    /// How many uploads so far were GPU copies from imported host memory.
    pub fn imported_uploads(&self) -> u64 {
        self.imported_uploads
    }

    /// How many command-buffer submissions this engine's device has had (each waited for with
    /// one fence): a recorded training step is one.
    pub fn submissions(&self) -> u64 {
        self.device.submissions.load(Ordering::Relaxed)
    }

    /// How many host-memory imports of this device are alive.
    pub fn live_imports(&self) -> usize {
        self.device.host_import.as_ref().map_or(0, |i| i.live())
    }

    /// `vkCmdCopyBuffer` of `bytes` from `src` to `dst`, waited for.
    fn copy(
        &mut self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        let (commands, queue) = match (&self.transfer, &self.device.transfer) {
            (Some(c), Some(q)) => (c, q),
            _ => (&self.compute, &self.device.compute),
        };
        let cmd = commands.begin(true)?;
        let region = vk::BufferCopy {
            src_offset,
            dst_offset,
            size: bytes,
        };
        let to_host = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ)];
        // SAFETY: `cmd` is recording; both buffers are alive for this call (borrowed), were
        // made with TRANSFER usage, and the regions were checked against their sizes.
        unsafe {
            self.device
                .raw
                .cmd_copy_buffer(cmd, src.raw(), dst.raw(), &[region]);
            self.device.raw.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &to_host,
                &[],
                &[],
            );
        }
        commands.end()?;
        commands.submit_and_wait(queue)?;
        Ok(())
    }

    pub(crate) fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(e) = self.cache.save() {
            log::warn!("Vulkan: could not save the pipeline cache: {e}");
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.device.info.label())
            .finish()
    }
}
