//! A kernel's compute pipeline: shader module from the embedded SPIR-V, a descriptor-set
//! layout of `bindings` storage buffers, a pipeline layout with the kernel's push constants,
//! specialised by [`SpecConstant`]s and created through the engine's pipeline cache.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;

use super::device::Device;
use super::kernels::{Kernel, MAX_INVOCATIONS};
use super::{Error, Result};

/// A specialisation constant: `constant_id` and its 32 bits (every GLSL scalar spec
/// constant — `uint`, `int`, `float`, `bool` — is 4 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecConstant {
    pub id: u32,
    pub bits: u32,
}

impl SpecConstant {
    pub fn u32(id: u32, value: u32) -> SpecConstant {
        SpecConstant { id, bits: value }
    }

    pub fn i32(id: u32, value: i32) -> SpecConstant {
        SpecConstant {
            id,
            bits: value as u32,
        }
    }

    pub fn f32(id: u32, value: f32) -> SpecConstant {
        SpecConstant {
            id,
            bits: value.to_bits(),
        }
    }

    pub fn bool(id: u32, value: bool) -> SpecConstant {
        SpecConstant {
            id,
            bits: value as u32,
        }
    }
}

/// A compute pipeline of one kernel with one set of specialisation constants.
pub struct Pipeline {
    raw: vk::Pipeline,
    layout: vk::PipelineLayout,
    set_layout: vk::DescriptorSetLayout,
    kernel: Kernel,
    local_size: [u32; 3],
    spec: Vec<SpecConstant>,
    cache_hit: Option<bool>,
    created_in: Duration,
    pub(crate) device: Arc<Device>,
}

impl Pipeline {
    pub(crate) fn new(
        device: &Arc<Device>,
        cache: vk::PipelineCache,
        kernel: Kernel,
        spec: &[SpecConstant],
    ) -> Result<Pipeline> {
        let info = kernel.info();
        let fail = |detail: String| Error::Pipeline {
            kernel: info.name,
            detail,
        };
        if info.fp16 && !device.fp16 {
            return Err(fail(
                "an fp16 variant, and shaderFloat16 is not enabled on this device".into(),
            ));
        }
        if info.subgroups && !device.subgroups {
            return Err(fail(
                "a subgroup variant, and subgroup variants are not used on this device (no \
                 subgroup arithmetic in compute shaders, or turned off)"
                    .into(),
            ));
        }
        for (i, s) in spec.iter().enumerate() {
            if spec[..i].iter().any(|t| t.id == s.id) {
                return Err(fail(format!(
                    "specialisation constant {} given twice",
                    s.id
                )));
            }
        }
        let mut local_size = info.local_size;
        for (dim, id) in info.local_size_ids.iter().enumerate() {
            if let Some(s) = id.and_then(|id| spec.iter().find(|s| s.id == id)) {
                local_size[dim] = s.bits;
            }
        }
        let limits = &device.info.limits;
        let invocations = local_size.iter().map(|&n| u64::from(n)).product::<u64>();
        if local_size.contains(&0)
            || invocations > u64::from(MAX_INVOCATIONS)
            || invocations > u64::from(limits.max_compute_work_group_invocations)
            || (0..3).any(|d| local_size[d] > limits.max_compute_work_group_size[d])
        {
            return Err(fail(format!(
                "workgroup size {local_size:?} is outside the limits: at most {} invocations \
                 (fulcrum's weakest target: {MAX_INVOCATIONS}; this device: {}) and {:?} per \
                 dimension",
                MAX_INVOCATIONS.min(limits.max_compute_work_group_invocations),
                limits.max_compute_work_group_invocations,
                limits.max_compute_work_group_size
            )));
        }
        if info.push_bytes > limits.max_push_constants_size {
            return Err(fail(format!(
                "{} bytes of push constants; the device allows {}",
                info.push_bytes, limits.max_push_constants_size
            )));
        }
        if info.shared_bytes > limits.max_compute_shared_memory_size {
            return Err(fail(format!(
                "{} bytes of shared memory; the device allows {}",
                info.shared_bytes, limits.max_compute_shared_memory_size
            )));
        }

        let words = ash::util::read_spv(&mut std::io::Cursor::new(info.spirv))
            .map_err(|e| fail(format!("embedded SPIR-V: {e}")))?;
        let raw_device = &device.raw;
        let started = Instant::now();

        let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..info.bindings)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(info.descriptor_type(b))
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        // The objects made below are destroyed by `Pipeline`'s Drop; until it exists, a
        // partial set is cleaned up by this guard.
        let mut made = Pipeline {
            raw: vk::Pipeline::null(),
            layout: vk::PipelineLayout::null(),
            set_layout: vk::DescriptorSetLayout::null(),
            kernel,
            local_size,
            spec: spec.to_vec(),
            cache_hit: None,
            created_in: Duration::ZERO,
            device: Arc::clone(device),
        };
        // SAFETY: valid device; the create info points at `bindings`, alive across the call.
        made.set_layout = unsafe {
            raw_device.create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                None,
            )
        }
        .map_err(Error::vk("vkCreateDescriptorSetLayout"))?;
        let push_ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(info.push_bytes)];
        let set_layouts = [made.set_layout];
        let mut layout_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts);
        if info.push_bytes > 0 {
            layout_info = layout_info.push_constant_ranges(&push_ranges);
        }
        // SAFETY: valid device; the set layout was made from it; arrays alive across the call.
        made.layout = unsafe { raw_device.create_pipeline_layout(&layout_info, None) }
            .map_err(Error::vk("vkCreatePipelineLayout"))?;

        // SAFETY: `words` is whole SPIR-V words (read_spv checked the magic and length).
        let module = unsafe {
            raw_device
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
        }
        .map_err(Error::vk("vkCreateShaderModule"))?;

        let entries: Vec<vk::SpecializationMapEntry> = spec
            .iter()
            .enumerate()
            .map(|(i, s)| vk::SpecializationMapEntry {
                constant_id: s.id,
                offset: (i * 4) as u32,
                size: 4,
            })
            .collect();
        let data: Vec<u8> = spec.iter().flat_map(|s| s.bits.to_ne_bytes()).collect();
        let spec_info = vk::SpecializationInfo::default()
            .map_entries(&entries)
            .data(&data);
        let mut stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        if !spec.is_empty() {
            stage = stage.specialization_info(&spec_info);
        }
        let mut feedback = vk::PipelineCreationFeedback::default();
        let mut stage_feedback = [vk::PipelineCreationFeedback::default()];
        let mut feedback_info = vk::PipelineCreationFeedbackCreateInfo::default()
            .pipeline_creation_feedback(&mut feedback)
            .pipeline_stage_creation_feedbacks(&mut stage_feedback);
        let mut create_info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(made.layout);
        if device.feedback {
            create_info = create_info.push_next(&mut feedback_info);
        }
        // SAFETY: valid device, cache, module and layout, all from this device; every array
        // and struct the create info points at lives across the call.
        let created = unsafe {
            raw_device.create_compute_pipelines(cache, std::slice::from_ref(&create_info), None)
        };
        // SAFETY: the module is only needed during pipeline creation.
        unsafe { raw_device.destroy_shader_module(module, None) };
        made.raw = created.map_err(|(_, result)| Error::Vk {
            what: "vkCreateComputePipelines",
            result,
        })?[0];
        made.created_in = started.elapsed();
        if device.feedback
            && feedback
                .flags
                .contains(vk::PipelineCreationFeedbackFlags::VALID)
        {
            made.cache_hit = Some(
                feedback
                    .flags
                    .contains(vk::PipelineCreationFeedbackFlags::APPLICATION_PIPELINE_CACHE_HIT),
            );
        }
        log::debug!(
            "Vulkan: pipeline {} {:?} created in {:.1} ms{}",
            info.name,
            local_size,
            made.created_in.as_secs_f64() * 1e3,
            match made.cache_hit {
                Some(true) => " (pipeline cache hit)",
                Some(false) => " (pipeline cache miss)",
                None => "",
            }
        );
        Ok(made)
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// The workgroup size after specialisation.
    pub fn local_size(&self) -> [u32; 3] {
        self.local_size
    }

    pub fn spec_constants(&self) -> &[SpecConstant] {
        &self.spec
    }

    /// Whether the driver found the pipeline in the pipeline cache (`None`: it did not say).
    pub fn cache_hit(&self) -> Option<bool> {
        self.cache_hit
    }

    /// How long `vkCreateComputePipelines` (and the layouts) took.
    pub fn created_in(&self) -> Duration {
        self.created_in
    }

    /// Workgroups needed along x to cover `n` items, one item an invocation.
    pub fn groups_for(&self, n: u64) -> u32 {
        let per = u64::from(self.local_size[0]);
        n.div_ceil(per).min(u64::from(u32::MAX)) as u32
    }

    pub(crate) fn raw(&self) -> vk::Pipeline {
        self.raw
    }

    pub(crate) fn layout(&self) -> vk::PipelineLayout {
        self.layout
    }

    pub(crate) fn set_layout(&self) -> vk::DescriptorSetLayout {
        self.set_layout
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("kernel", &self.kernel)
            .field("local_size", &self.local_size)
            .field("spec", &self.spec)
            .finish()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: the objects were made from this device (alive: we hold an Arc) and are
        // destroyed once; null handles are ignored by Vulkan; no GPU work uses the pipeline
        // (runs wait for their fence and borrow their pipelines).
        unsafe {
            self.device.raw.destroy_pipeline(self.raw, None);
            self.device.raw.destroy_pipeline_layout(self.layout, None);
            self.device
                .raw
                .destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}
