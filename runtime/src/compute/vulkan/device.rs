//! The logical device and everything that must outlive the objects made from it: its
//! queues, its allocator, the report of its live buffers, its live host-memory imports and
//! the instance. Shared as `Arc<Device>`; see the module docs of [`super`] for why this makes
//! the destruction order structural.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationSizes, AllocatorDebugSettings};

use super::allocation::Registry;
use super::context::{pick_device, DeviceInfo, DeviceType, Instance};
use super::import_registry::HostImport;
use super::options::Options;
use super::{Error, Result};

/// A queue and its family. `vkQueueSubmit` needs the queue externally synchronised: the Mutex.
pub(crate) struct Queue {
    pub(crate) family: u32,
    pub(crate) raw: Mutex<vk::Queue>,
}

impl Queue {
    pub(crate) fn lock(&self) -> MutexGuard<'_, vk::Queue> {
        self.raw.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The logical device with everything that must outlive the objects made from it. Shared as
/// `Arc<Device>` by every buffer, pipeline, cache and engine; see the module docs of
/// [`super`] for why this makes the destruction order structural.
pub(crate) struct Device {
    /// Dropped by hand in `Drop` before `vkDestroyDevice`.
    allocator: ManuallyDrop<Mutex<Allocator>>,
    pub(crate) raw: ash::Device,
    pub(crate) info: DeviceInfo,
    pub(crate) compute: Queue,
    /// A separate transfer-only queue, where the device has one.
    pub(crate) transfer: Option<Queue>,
    /// `VK_EXT_pipeline_creation_feedback` (or 1.3) is enabled: pipelines report cache hits.
    pub(crate) feedback: bool,
    pub(crate) registry: Mutex<Registry>,
    pub(crate) fence_timeout: std::time::Duration,
    /// `vkQueueSubmit` calls so far ([`super::Engine::submissions`]).
    pub(crate) submissions: std::sync::atomic::AtomicU64,
    /// `shaderFloat16` is enabled: the fp16 kernel variants may be used.
    pub(crate) fp16: bool,
    /// The direct kernel variants are used ([`Options::direct`]).
    pub(crate) direct: bool,
    /// The subgroup kernel variants are used ([`Options::subgroups`]).
    pub(crate) subgroups: bool,
    /// Kernels that allow it are compiled per shape ([`Options::specialise`]).
    pub(crate) specialise: bool,
    /// The tile every tiled GEMM dispatch is given ([`Options::gemm_tile`]).
    pub(crate) gemm_tile: Option<[u32; 2]>,
    /// `VK_EXT_external_memory_host` is enabled: host memory can be imported, and the
    /// imports live now.
    pub(crate) host_import: Option<HostImport>,
    /// The property flags of each memory type.
    pub(crate) memory_types: Vec<vk::MemoryPropertyFlags>,
    /// Destroyed after the device (field order, after `Drop::drop`).
    pub(crate) instance: Instance,
}

impl Device {
    /// Loads Vulkan, picks the device per `options`, creates the logical device, its queues
    /// and allocator.
    pub(crate) fn new(options: &Options) -> Result<Arc<Device>> {
        let subgroups_asked = options.subgroups_asked()?;
        let direct_asked = options.direct_asked()?;
        let gemm_tile = options.gemm_tile_asked()?;
        let instance = Instance::new(options)?;
        let devices = instance.devices()?;
        let infos: Vec<DeviceInfo> = devices.iter().map(|(_, d)| d.clone()).collect();
        let index = pick_device(&infos, options.device)?;
        let (physical, info) = devices
            .into_iter()
            .find(|(_, d)| d.index == index)
            .expect("pick_device returns an index from the list");
        let compute_family = info
            .compute_family()
            .expect("pick_device only picks devices with a compute family");
        let transfer_family = info.transfer_family();

        let priorities = [1.0f32];
        let mut queue_infos = vec![vk::DeviceQueueCreateInfo::default()
            .queue_family_index(compute_family)
            .queue_priorities(&priorities)];
        if let Some(t) = transfer_family {
            queue_infos.push(
                vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(t)
                    .queue_priorities(&priorities),
            );
        }
        let effective = info.api_version_raw.min(instance.api_version);
        let feedback = info.pipeline_creation_feedback;
        let mut extensions = Vec::new();
        if feedback && effective < vk::API_VERSION_1_3 {
            extensions.push(ash::ext::pipeline_creation_feedback::NAME.as_ptr());
        }
        let fp16 = options.fp16 && info.shader_float16;
        if options.fp16 && !fp16 {
            log::info!(
                "Vulkan: {} has no shaderFloat16: fp32 kernels only",
                info.label()
            );
        }
        if fp16 && effective < vk::API_VERSION_1_2 {
            extensions.push(ash::khr::shader_float16_int8::NAME.as_ptr());
        }
        // External memory itself is core in 1.1, which every usable device has.
        let host_import_alignment = info
            .host_import_alignment
            .filter(|_| effective >= vk::API_VERSION_1_1);
        if host_import_alignment.is_some() {
            extensions.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        let mut f16_features =
            vk::PhysicalDeviceShaderFloat16Int8Features::default().shader_float16(true);
        let mut create_info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .enabled_extension_names(&extensions);
        if fp16 {
            // Core in 1.2, else from the extension enabled above (the probe found one of them).
            create_info = create_info.push_next(&mut f16_features);
        }
        // SAFETY: `physical` comes from this instance; the create info and what it points to
        // live across the call; the families exist and have at least one queue each.
        let raw = unsafe { instance.raw.create_device(physical, &create_info, None) }
            .map_err(Error::vk("vkCreateDevice"))?;
        // SAFETY: queue 0 of each family was requested above.
        let compute_queue = unsafe { raw.get_device_queue(compute_family, 0) };
        let transfer = transfer_family.map(|family| Queue {
            family,
            // SAFETY: as above.
            raw: Mutex::new(unsafe { raw.get_device_queue(family, 0) }),
        });

        let host_import = host_import_alignment.map(|alignment| {
            HostImport::new(
                ash::ext::external_memory_host::Device::new(&instance.raw, &raw),
                alignment,
            )
        });
        // SAFETY: `physical` comes from this live instance.
        let memory = unsafe { instance.raw.get_physical_device_memory_properties(physical) };
        let memory_types = memory
            .memory_types_as_slice()
            .iter()
            .map(|t| t.property_flags)
            .collect();

        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.raw.clone(),
            device: raw.clone(),
            physical_device: physical,
            debug_settings: AllocatorDebugSettings::default(),
            buffer_device_address: false,
            // Small blocks: boards have little memory; bigger buffers get their own block.
            allocation_sizes: AllocationSizes::new(64 << 20, 16 << 20),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: nothing was created from the device yet.
                unsafe { raw.destroy_device(None) };
                return Err(Error::Allocator(e));
            }
        };
        log::info!(
            "Vulkan: device {} {} (Vulkan {}, {}){}",
            info.index,
            info.label(),
            info.api_version,
            info.driver_summary(),
            if transfer_family.is_some() {
                ", with a transfer queue"
            } else {
                ""
            }
        );
        let direct = direct_asked.unwrap_or(info.device_type == DeviceType::Cpu);
        if subgroups_asked == Some(true) && !info.subgroup_arithmetic {
            log::info!(
                "Vulkan: {} has no subgroup arithmetic in compute shaders: plain kernels only",
                info.label()
            );
        }
        let subgroups = subgroups_asked.unwrap_or(true) && info.subgroup_arithmetic;
        Ok(Arc::new(Device {
            allocator: ManuallyDrop::new(Mutex::new(allocator)),
            raw,
            info,
            compute: Queue {
                family: compute_family,
                raw: Mutex::new(compute_queue),
            },
            transfer,
            feedback,
            registry: Mutex::new(Registry::default()),
            fence_timeout: options.fence_timeout,
            submissions: std::sync::atomic::AtomicU64::new(0),
            fp16,
            direct,
            subgroups,
            specialise: options.specialise,
            gemm_tile,
            host_import,
            memory_types,
            instance,
        }))
    }

    pub(crate) fn allocator(&self) -> MutexGuard<'_, Allocator> {
        self.allocator.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue families buffers are shared between (compute, and transfer if separate).
    pub(crate) fn families(&self) -> Vec<u32> {
        let mut f = vec![self.compute.family];
        if let Some(t) = &self.transfer {
            f.push(t.family);
        }
        f
    }

    /// Fence wait with the configured timeout.
    pub(crate) fn wait(&self, fence: vk::Fence) -> Result<()> {
        let timeout = self.fence_timeout.as_nanos().min(u64::MAX as u128) as u64;
        // SAFETY: `fence` belongs to this device.
        match unsafe { self.raw.wait_for_fences(&[fence], true, timeout) } {
            Ok(()) => Ok(()),
            Err(vk::Result::TIMEOUT) => Err(Error::Timeout {
                seconds: self.fence_timeout.as_secs(),
            }),
            Err(result) => Err(Error::Vk {
                what: "vkWaitForFences",
                result,
            }),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every object made from this device holds an Arc<Device>, so when this runs
        // none is left: no buffer, pipeline, pool or cache, and no pending work (every call
        // waits for its fence). The allocator is dropped here and never used again; it frees
        // its memory blocks while the device still exists. The instance field is dropped
        // after this function, so after vkDestroyDevice.
        unsafe {
            let _ = self.raw.device_wait_idle();
            ManuallyDrop::drop(&mut self.allocator);
            self.raw.destroy_device(None);
        }
    }
}
