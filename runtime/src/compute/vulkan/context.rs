//! The loader, the instance and the devices (the logical device is in the `device` module).
//!
//! [`list_devices`] describes every device as a plain [`DeviceInfo`] (what `fulcrum devices`
//! prints); [`pick_device`] is the choice the engine makes, a pure function of that list:
//! the explicit index if one is given, otherwise the first usable device of the best type,
//! discrete > integrated > virtual > CPU > other. A device is usable when it has Vulkan 1.1
//! and a compute queue family ([`DeviceInfo::unusable`] says why not).

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;
use serde::Serialize;

use super::options::Options;
use super::{version_string, Error, Result};

const DEFAULT_LOADER: &str = "libvulkan.so.1";
const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Every validation warning and error since the instance was created (shared: clones see the
/// same list). Tests assert it is empty; the engine also logs each message as it comes.
#[derive(Debug, Clone, Default)]
pub struct ValidationLog(Arc<Mutex<Vec<String>>>);

impl ValidationLog {
    fn lock(&self) -> MutexGuard<'_, Vec<String>> {
        // A panic while holding the lock cannot leave the Vec half-changed: keep going.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The messages so far.
    pub fn messages(&self) -> Vec<String> {
        self.lock().clone()
    }

    /// The messages so far, leaving the log empty.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.lock())
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// The debug-utils callback: records warnings and errors in the [`ValidationLog`] whose
/// `Mutex` `user_data` points at, and logs them.
///
/// # Safety
///
/// Called by the Vulkan loader/layers only: `data` is null or points to a valid callback-data
/// struct for the duration of the call, and `user_data` is the `Arc::as_ptr` of the
/// [`ValidationLog`] that the [`Instance`] keeps alive until after the messenger and the
/// instance are destroyed.
unsafe extern "system" fn debug_callback(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user_data: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: per this function's contract `data` is null or valid for this call.
    let data = unsafe { data.as_ref() };
    let text = data
        // SAFETY: `p_message` of a valid callback-data struct is null or a NUL-terminated string.
        .and_then(|d| unsafe { d.message_as_c_str() })
        .map(|m| m.to_string_lossy().into_owned())
        .unwrap_or_else(|| "(no message)".to_owned());
    let kind = if types.contains(vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION) {
        "validation"
    } else if types.contains(vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE) {
        "performance"
    } else {
        "general"
    };
    let error = severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR);
    let line = format!(
        "Vulkan {kind} {}: {text}",
        if error { "error" } else { "warning" }
    );
    if error {
        log::error!("{line}");
    } else {
        log::warn!("{line}");
    }
    // SAFETY: per this function's contract `user_data` is null or points to the live Mutex
    // inside the instance's ValidationLog.
    if let Some(list) = unsafe { (user_data as *const Mutex<Vec<String>>).as_ref() } {
        list.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    vk::FALSE
}

/// The loader, an instance and (with validation) its debug messenger. Dropping it destroys the
/// messenger, then the instance, then unloads the loader (field order after `Drop::drop`).
pub(crate) struct Instance {
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    pub(crate) raw: ash::Instance,
    /// The API version the instance was created with (1.1 … 1.3).
    pub(crate) api_version: u32,
    /// The loader's instance version.
    pub(crate) loader_version: u32,
    pub(crate) validation: ValidationLog,
    /// The Khronos validation layer is enabled.
    pub(crate) validation_on: bool,
    /// Keeps the loader library loaded while the instance lives; dropped last.
    _entry: ash::Entry,
}

impl Instance {
    pub(crate) fn new(options: &Options) -> Result<Instance> {
        let path = options.loader_path();
        let loaded = match &path {
            // SAFETY: loading a library runs its initialisers; the library is the Vulkan loader
            // the user pointed at, which is what ash expects to load. The Entry (and so the
            // library) is kept in the Instance until everything made from it is destroyed.
            Some(p) => unsafe { ash::Entry::load_from(p) },
            // SAFETY: as above, for the system's libvulkan.so.1.
            None => unsafe { ash::Entry::load() },
        };
        let entry = loaded.map_err(|e| Error::NoLoader {
            path: path.map_or_else(|| DEFAULT_LOADER.to_owned(), |p| p.display().to_string()),
            detail: e.to_string(),
        })?;

        // SAFETY: a global command of a successfully loaded Entry.
        let loader_version = unsafe { entry.try_enumerate_instance_version() }
            .map_err(Error::vk("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        if loader_version < vk::API_VERSION_1_1 {
            return Err(Error::LoaderTooOld {
                version: version_string(loader_version),
            });
        }
        // Ask for the newest version we know (1.3), or the loader's if older: the effective
        // version of each device is the smaller of this and the device's own.
        let api_version = if loader_version >= vk::API_VERSION_1_3 {
            vk::API_VERSION_1_3
        } else {
            vk::make_api_version(
                0,
                vk::api_version_major(loader_version),
                vk::api_version_minor(loader_version),
                0,
            )
        };

        let validation = options.validation_enabled();
        let mut sync_validation = false;
        let log = ValidationLog::default();
        let mut layers = Vec::new();
        let mut extensions = Vec::new();
        if validation {
            // SAFETY: a global command of a loaded Entry.
            let available = unsafe { entry.enumerate_instance_layer_properties() }
                .map_err(Error::vk("vkEnumerateInstanceLayerProperties"))?;
            if !available
                .iter()
                .any(|l| l.layer_name_as_c_str() == Ok(VALIDATION_LAYER))
            {
                return Err(Error::ValidationUnavailable {
                    what: "VK_LAYER_KHRONOS_validation",
                });
            }
            let has_extension = |layer: Option<&CStr>, name: &CStr| {
                // SAFETY: a global command of a loaded Entry; `layer` is a valid layer name.
                unsafe { entry.enumerate_instance_extension_properties(layer) }
                    .unwrap_or_default()
                    .iter()
                    .any(|e| e.extension_name_as_c_str() == Ok(name))
            };
            let debug_utils = ash::ext::debug_utils::NAME;
            if !has_extension(None, debug_utils)
                && !has_extension(Some(VALIDATION_LAYER), debug_utils)
            {
                return Err(Error::ValidationUnavailable {
                    what: "VK_EXT_debug_utils",
                });
            }
            layers.push(VALIDATION_LAYER.as_ptr());
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
            // The layer's synchronization validation reports every missing barrier between
            // two accesses of a buffer (the engine leaves out barriers between independent
            // dispatches, so this is what checks it), where the layer offers it.
            sync_validation =
                has_extension(Some(VALIDATION_LAYER), ash::ext::validation_features::NAME);
            if sync_validation {
                extensions.push(ash::ext::validation_features::NAME.as_ptr());
            }
        }

        let app = vk::ApplicationInfo::default()
            .application_name(c"fulcrum")
            .application_version(0)
            .engine_name(c"fulcrum")
            .engine_version(0)
            .api_version(api_version);
        let mut messenger_info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                    | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                    | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
            )
            .pfn_user_callback(Some(debug_callback))
            .user_data(Arc::as_ptr(&log.0) as *mut c_void);
        let mut create_info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
        let enables = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
        let mut features =
            vk::ValidationFeaturesEXT::default().enabled_validation_features(&enables);
        if validation {
            // Also reports problems of vkCreateInstance / vkDestroyInstance themselves.
            create_info = create_info.push_next(&mut messenger_info);
        }
        if sync_validation {
            create_info = create_info.push_next(&mut features);
        }
        // SAFETY: `create_info` and everything it points to (names, app info, messenger info)
        // live until the call returns; the callback's user data (the log's Mutex) is kept alive
        // by the Instance built below until after vkDestroyInstance.
        let raw = unsafe { entry.create_instance(&create_info, None) }.map_err(|r| match r {
            // The loader's answer when it finds no driver at all.
            vk::Result::ERROR_INCOMPATIBLE_DRIVER => Error::NoDevice,
            vk::Result::ERROR_LAYER_NOT_PRESENT => Error::ValidationUnavailable {
                what: "VK_LAYER_KHRONOS_validation",
            },
            vk::Result::ERROR_EXTENSION_NOT_PRESENT => Error::ValidationUnavailable {
                what: "VK_EXT_debug_utils",
            },
            result => Error::Vk {
                what: "vkCreateInstance",
                result,
            },
        })?;
        let mut instance = Instance {
            debug: None,
            raw,
            api_version,
            loader_version,
            validation: log,
            validation_on: validation,
            _entry: entry,
        };
        if validation {
            let debug = ash::ext::debug_utils::Instance::new(&instance._entry, &instance.raw);
            // SAFETY: the instance was created with VK_EXT_debug_utils enabled; the info's user
            // data outlives the messenger (see above). On error `instance` drops and cleans up.
            let messenger = unsafe { debug.create_debug_utils_messenger(&messenger_info, None) }
                .map_err(Error::vk("vkCreateDebugUtilsMessengerEXT"))?;
            instance.debug = Some((debug, messenger));
        }
        Ok(instance)
    }

    /// Every physical device with its description, in the loader's order.
    pub(crate) fn devices(&self) -> Result<Vec<(vk::PhysicalDevice, DeviceInfo)>> {
        // SAFETY: a valid instance.
        let physical = unsafe { self.raw.enumerate_physical_devices() }
            .map_err(Error::vk("vkEnumeratePhysicalDevices"))?;
        Ok(physical
            .into_iter()
            .enumerate()
            .map(|(index, p)| (p, self.describe(index, p)))
            .collect())
    }

    /// The plain description of one physical device.
    fn describe(&self, index: usize, physical: vk::PhysicalDevice) -> DeviceInfo {
        let raw = &self.raw;
        // SAFETY (for the queries in this function): `physical` was enumerated from this
        // live instance; every output struct (and its pNext chain) lives across the call.
        let props = unsafe { raw.get_physical_device_properties(physical) };
        let effective = props.api_version.min(self.api_version);
        let device_11 = effective >= vk::API_VERSION_1_1;
        let device_12 = effective >= vk::API_VERSION_1_2;
        // SAFETY: see above.
        let extensions =
            unsafe { raw.enumerate_device_extension_properties(physical) }.unwrap_or_default();
        let has_ext = |name: &CStr| {
            extensions
                .iter()
                .any(|e| e.extension_name_as_c_str() == Ok(name))
        };
        let driver_query = device_12 || has_ext(ash::khr::driver_properties::NAME);
        let f16_query = device_12 || has_ext(ash::khr::shader_float16_int8::NAME);
        let feedback =
            effective >= vk::API_VERSION_1_3 || has_ext(ash::ext::pipeline_creation_feedback::NAME);

        let host_import_query = device_11
            && has_ext(ash::ext::external_memory_host::NAME)
            && host_buffers_importable(raw, physical);

        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut host_import = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        if device_11 {
            let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
            if driver_query {
                props2 = props2.push_next(&mut driver);
            }
            if host_import_query {
                props2 = props2.push_next(&mut host_import);
            }
            // SAFETY: see above; core 1.1, and each chained struct is core in the effective
            // version or its extension is supported by the device.
            unsafe { raw.get_physical_device_properties2(physical, &mut props2) };
        }
        let mut shader_float16 = false;
        if device_11 && f16_query {
            let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
            let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut f16);
            // SAFETY: see above.
            unsafe { raw.get_physical_device_features2(physical, &mut features) };
            shader_float16 = f16.shader_float16 == vk::TRUE;
        }

        // SAFETY: see above.
        let families = unsafe { raw.get_physical_device_queue_family_properties(physical) };
        let queue_families: Vec<QueueFamilyInfo> = families
            .iter()
            .enumerate()
            .map(|(i, f)| QueueFamilyInfo {
                index: i as u32,
                queues: f.queue_count,
                graphics: f.queue_flags.contains(vk::QueueFlags::GRAPHICS),
                compute: f.queue_flags.contains(vk::QueueFlags::COMPUTE),
                transfer: f.queue_flags.contains(vk::QueueFlags::TRANSFER),
                timestamp_valid_bits: f.timestamp_valid_bits,
            })
            .collect();

        // SAFETY: see above.
        let memory = unsafe { raw.get_physical_device_memory_properties(physical) };
        let types = memory.memory_types_as_slice();
        let memory_heaps: Vec<MemoryHeapInfo> = memory
            .memory_heaps_as_slice()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let on_heap = || types.iter().filter(|t| t.heap_index == i as u32);
                MemoryHeapInfo {
                    index: i as u32,
                    bytes: h.size,
                    device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
                    host_visible: on_heap().any(|t| {
                        t.property_flags
                            .contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
                    }),
                    device_local_host_visible: on_heap().any(|t| {
                        t.property_flags.contains(
                            vk::MemoryPropertyFlags::DEVICE_LOCAL
                                | vk::MemoryPropertyFlags::HOST_VISIBLE,
                        )
                    }),
                }
            })
            .collect();
        let device_type = DeviceType::from_vk(props.device_type);
        let unified_memory = device_type != DeviceType::Discrete
            && memory_heaps
                .iter()
                .any(|h| h.device_local && h.device_local_host_visible);

        let compute_family = pick_compute_family(&queue_families);
        let limits = &props.limits;
        let unusable = if props.api_version < vk::API_VERSION_1_1 {
            Some(format!(
                "Vulkan {} device; fulcrum needs 1.1",
                version_string(props.api_version)
            ))
        } else if compute_family.is_none() {
            Some("no queue family with compute".to_owned())
        } else {
            None
        };
        let name = props
            .device_name_as_c_str()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("device {index}"));
        let c_text = |s: std::result::Result<&CStr, _>| {
            s.ok()
                .map(|s: &CStr| s.to_string_lossy().into_owned())
                .filter(|s| !s.is_empty())
        };
        let (driver_name, driver_info) = if driver_query {
            (
                c_text(driver.driver_name_as_c_str()),
                c_text(driver.driver_info_as_c_str()),
            )
        } else {
            (None, None)
        };
        let timestamp_valid_bits =
            compute_family.map_or(0, |f| queue_families[f as usize].timestamp_valid_bits);
        DeviceInfo {
            index,
            name,
            device_type,
            api_version: version_string(props.api_version),
            api_version_raw: props.api_version,
            driver_name,
            driver_info,
            driver_version: driver_version_string(props.vendor_id, props.driver_version),
            driver_version_raw: props.driver_version,
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            pipeline_cache_uuid: props.pipeline_cache_uuid,
            queue_families,
            memory_heaps,
            unified_memory,
            limits: Limits {
                max_compute_shared_memory_size: limits.max_compute_shared_memory_size,
                max_compute_work_group_invocations: limits.max_compute_work_group_invocations,
                max_compute_work_group_size: limits.max_compute_work_group_size,
                max_compute_work_group_count: limits.max_compute_work_group_count,
                max_push_constants_size: limits.max_push_constants_size,
                max_storage_buffer_range: limits.max_storage_buffer_range,
                max_texel_buffer_elements: limits.max_texel_buffer_elements,
                timestamp_period_ns: limits.timestamp_period,
                timestamp_valid_bits,
            },
            subgroup_size: (device_11 && subgroup.subgroup_size > 0)
                .then_some(subgroup.subgroup_size),
            subgroup_arithmetic: device_11
                && subgroup
                    .supported_stages
                    .contains(vk::ShaderStageFlags::COMPUTE)
                && subgroup.supported_operations.contains(
                    vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC,
                ),
            shader_float16,
            host_import_alignment: (host_import_query
                && host_import.min_imported_host_pointer_alignment > 0)
                .then_some(host_import.min_imported_host_pointer_alignment),
            pipeline_creation_feedback: feedback,
            unusable,
        }
    }
}

/// Whether a transfer-source buffer can be bound to imported host memory on `physical`
/// (`VK_EXT_external_memory_host` alone does not promise it for buffers). Vulkan 1.1 only.
fn host_buffers_importable(raw: &ash::Instance, physical: vk::PhysicalDevice) -> bool {
    let info = vk::PhysicalDeviceExternalBufferInfo::default()
        .usage(vk::BufferUsageFlags::TRANSFER_SRC)
        .handle_type(vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT);
    let mut props = vk::ExternalBufferProperties::default();
    // SAFETY: `physical` comes from this live instance, whose effective version is 1.1 or
    // newer (the caller checks); both structs live across the call.
    unsafe { raw.get_physical_device_external_buffer_properties(physical, &info, &mut props) };
    let memory = props.external_memory_properties;
    memory
        .external_memory_features
        .contains(vk::ExternalMemoryFeatureFlags::IMPORTABLE)
        && memory
            .compatible_handle_types
            .contains(vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT)
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some((debug, messenger)) = self.debug.take() {
            // SAFETY: the messenger was created from this instance and is destroyed once.
            unsafe { debug.destroy_debug_utils_messenger(messenger, None) };
        }
        // SAFETY: every child object (devices, messenger) is gone: a Device holds its
        // Instance and destroys itself first; the messenger was destroyed just above.
        unsafe { self.raw.destroy_instance(None) };
    }
}

/// The kind of device, in the engine's order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    Discrete,
    Integrated,
    Virtual,
    Cpu,
    #[default]
    Other,
}

impl DeviceType {
    fn from_vk(t: vk::PhysicalDeviceType) -> DeviceType {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
            _ => DeviceType::Other,
        }
    }

    /// 0 is best: discrete, integrated, virtual, CPU, other.
    pub fn rank(self) -> u8 {
        match self {
            DeviceType::Discrete => 0,
            DeviceType::Integrated => 1,
            DeviceType::Virtual => 2,
            DeviceType::Cpu => 3,
            DeviceType::Other => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceType::Discrete => "discrete",
            DeviceType::Integrated => "integrated",
            DeviceType::Virtual => "virtual",
            DeviceType::Cpu => "cpu",
            DeviceType::Other => "other",
        }
    }
}

impl std::fmt::Display for DeviceType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One queue family.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct QueueFamilyInfo {
    pub index: u32,
    pub queues: u32,
    pub graphics: bool,
    pub compute: bool,
    /// Reported transfer support (graphics and compute families can always transfer, whether
    /// or not they report it).
    pub transfer: bool,
    /// 0: no timestamps on this family.
    pub timestamp_valid_bits: u32,
}

impl QueueFamilyInfo {
    /// Transfer only: neither graphics nor compute (a DMA engine).
    pub fn transfer_only(&self) -> bool {
        self.transfer && !self.graphics && !self.compute
    }
}

/// One memory heap.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct MemoryHeapInfo {
    pub index: u32,
    pub bytes: u64,
    pub device_local: bool,
    /// Some memory type on this heap is host-visible.
    pub host_visible: bool,
    /// Some memory type on this heap is both device-local and host-visible.
    pub device_local_host_visible: bool,
}

/// The limits that matter for compute.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Limits {
    pub max_compute_shared_memory_size: u32,
    pub max_compute_work_group_invocations: u32,
    pub max_compute_work_group_size: [u32; 3],
    pub max_compute_work_group_count: [u32; 3],
    pub max_push_constants_size: u32,
    pub max_storage_buffer_range: u32,
    /// Texels a uniform texel buffer's view may cover.
    pub max_texel_buffer_elements: u32,
    /// Nanoseconds per timestamp tick.
    pub timestamp_period_ns: f32,
    /// Valid timestamp bits of the compute family the engine would use (0: no timestamps).
    pub timestamp_valid_bits: u32,
}

/// A physical device as plain data: what `fulcrum devices` prints and what [`pick_device`]
/// chooses from.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceInfo {
    /// Position in the loader's list (what `--device N` names).
    pub index: usize,
    pub name: String,
    pub device_type: DeviceType,
    /// `major.minor.patch`.
    pub api_version: String,
    #[serde(skip)]
    pub api_version_raw: u32,
    /// From `VkPhysicalDeviceDriverProperties` (Vulkan 1.2 or `VK_KHR_driver_properties`).
    pub driver_name: Option<String>,
    pub driver_info: Option<String>,
    /// The driver version decoded by the vendor's convention (NVIDIA's differs).
    pub driver_version: String,
    pub driver_version_raw: u32,
    pub vendor_id: u32,
    pub device_id: u32,
    #[serde(serialize_with = "serialize_uuid")]
    pub pipeline_cache_uuid: [u8; 16],
    pub queue_families: Vec<QueueFamilyInfo>,
    pub memory_heaps: Vec<MemoryHeapInfo>,
    /// Not a discrete GPU, and a device-local heap is host-visible: buffers the GPU reads can
    /// be written by the CPU (and by the disk) in place, with no staging copy.
    pub unified_memory: bool,
    pub limits: Limits,
    /// Vulkan 1.1 subgroup size.
    pub subgroup_size: Option<u32>,
    /// Subgroups have the basic and arithmetic operations in compute shaders: the subgroup
    /// kernel variants may run.
    pub subgroup_arithmetic: bool,
    /// `shaderFloat16`: fp16 arithmetic in shaders (kernels must not require it).
    pub shader_float16: bool,
    /// `VK_EXT_external_memory_host` with buffers importable from host allocations: the
    /// alignment of host memory the device can import. `Some`: ring slots can be imported, and
    /// the GPU copies each batch straight from them (no CPU copy). (The import also needs a
    /// host-coherent memory type for the pointer, known only when importing.)
    pub host_import_alignment: Option<u64>,
    /// The driver can report pipeline-cache hits (`VK_EXT_pipeline_creation_feedback`).
    pub pipeline_creation_feedback: bool,
    /// Why fulcrum cannot use this device; `None`: usable.
    pub unusable: Option<String>,
}

impl DeviceInfo {
    /// The pipelineCacheUUID as 32 hex digits in 8-4-4-4-12 groups.
    pub fn pipeline_cache_uuid_string(&self) -> String {
        uuid_string(&self.pipeline_cache_uuid)
    }

    /// `name (type)`.
    pub fn label(&self) -> String {
        format!("{} ({})", self.name, self.device_type)
    }

    /// The driver as one line: name, info and version, whichever are known.
    pub fn driver_summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = &self.driver_name {
            parts.push(n.clone());
        }
        if let Some(i) = &self.driver_info {
            parts.push(i.clone());
        }
        parts.push(format!("version {}", self.driver_version));
        parts.join(", ")
    }

    /// The compute queue family the engine would use.
    pub fn compute_family(&self) -> Option<u32> {
        pick_compute_family(&self.queue_families)
    }

    /// A transfer-only family, if the device has one (the engine's transfer queue).
    pub fn transfer_family(&self) -> Option<u32> {
        self.queue_families
            .iter()
            .find(|f| f.transfer_only() && f.queues > 0)
            .map(|f| f.index)
    }

    /// Total bytes of the device-local heaps.
    pub fn device_local_bytes(&self) -> u64 {
        self.memory_heaps
            .iter()
            .filter(|h| h.device_local)
            .map(|h| h.bytes)
            .sum()
    }
}

fn uuid_string(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn serialize_uuid<S: serde::Serializer>(
    u: &[u8; 16],
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&uuid_string(u))
}

/// The driver version as its vendor writes it: NVIDIA packs 10.8.8.6 bits; most others
/// (Mesa, ARM, Broadcom, Qualcomm…) use the Vulkan version packing.
fn driver_version_string(vendor_id: u32, v: u32) -> String {
    const NVIDIA: u32 = 0x10de;
    if vendor_id == NVIDIA {
        format!(
            "{}.{}.{}.{}",
            v >> 22,
            (v >> 14) & 0xff,
            (v >> 6) & 0xff,
            v & 0x3f
        )
    } else {
        version_string(v)
    }
}

/// The compute family: one with compute and timestamps if there is one, else any with compute;
/// the first such in the list.
fn pick_compute_family(families: &[QueueFamilyInfo]) -> Option<u32> {
    let compute = || families.iter().filter(|f| f.compute && f.queues > 0);
    compute()
        .find(|f| f.timestamp_valid_bits > 0)
        .or_else(|| compute().next())
        .map(|f| f.index)
}

/// The device the engine uses, by [`DeviceInfo::index`]: `explicit` if given (it must exist
/// and be usable), else the first usable device of the best type (discrete > integrated >
/// virtual > CPU > other). A pure function of the list, so it is testable without a device.
pub fn pick_device(devices: &[DeviceInfo], explicit: Option<usize>) -> Result<usize> {
    if devices.is_empty() {
        return Err(Error::NoDevice);
    }
    if let Some(index) = explicit {
        let Some(d) = devices.iter().find(|d| d.index == index) else {
            return Err(Error::DeviceIndex {
                index,
                list: device_list(devices),
            });
        };
        if let Some(reason) = &d.unusable {
            return Err(Error::DeviceUnusable {
                index,
                name: d.name.clone(),
                reason: reason.clone(),
            });
        }
        return Ok(index);
    }
    devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.unusable.is_none())
        .min_by_key(|(position, d)| (d.device_type.rank(), *position))
        .map(|(_, d)| d.index)
        .ok_or_else(|| Error::NoUsableDevice {
            detail: devices
                .iter()
                .map(|d| {
                    format!(
                        "{} {}: {}",
                        d.index,
                        d.label(),
                        d.unusable.as_deref().unwrap_or("usable")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        })
}

/// `0 llvmpipe (cpu), 1 …` for error messages.
fn device_list(devices: &[DeviceInfo]) -> String {
    devices
        .iter()
        .map(|d| format!("{} {}", d.index, d.label()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What [`list_devices`] found.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceList {
    /// The loader's Vulkan version.
    pub loader_version: String,
    pub devices: Vec<DeviceInfo>,
}

/// Every Vulkan device of this machine. Errors: no loader, no driver ([`Error::is_unavailable`]),
/// or a failing loader.
pub fn list_devices(options: &Options) -> Result<DeviceList> {
    let instance = Instance::new(options)?;
    let devices = instance.devices()?.into_iter().map(|(_, d)| d).collect();
    Ok(DeviceList {
        loader_version: version_string(instance.loader_version),
        devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(index: usize, device_type: DeviceType) -> DeviceInfo {
        DeviceInfo {
            index,
            name: format!("dev{index}"),
            device_type,
            queue_families: vec![QueueFamilyInfo {
                index: 0,
                queues: 1,
                compute: true,
                transfer: true,
                timestamp_valid_bits: 64,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn picks_by_type_then_order() {
        use DeviceType::*;
        let list = [
            dev(0, Cpu),
            dev(1, Integrated),
            dev(2, Discrete),
            dev(3, Discrete),
        ];
        assert_eq!(pick_device(&list, None).unwrap(), 2);
        let list = [dev(0, Cpu), dev(1, Virtual), dev(2, Other)];
        assert_eq!(pick_device(&list, None).unwrap(), 1);
        let list = [dev(0, Other), dev(1, Cpu)];
        assert_eq!(pick_device(&list, None).unwrap(), 1);
        let list = [dev(0, Integrated), dev(1, Cpu)];
        assert_eq!(pick_device(&list, None).unwrap(), 0);
    }

    #[test]
    fn explicit_index_wins_and_is_checked() {
        use DeviceType::*;
        let list = [dev(0, Cpu), dev(1, Discrete)];
        assert_eq!(pick_device(&list, Some(0)).unwrap(), 0);
        let e = pick_device(&list, Some(5)).unwrap_err();
        assert!(matches!(e, Error::DeviceIndex { index: 5, .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("0 dev0 (cpu)") && text.contains("1 dev1 (discrete)"),
            "{text}"
        );
    }

    #[test]
    fn unusable_devices_are_skipped_or_refused() {
        use DeviceType::*;
        let mut no_compute = dev(0, Discrete);
        no_compute.queue_families[0].compute = false;
        no_compute.unusable = Some("no queue family with compute".into());
        let list = [no_compute.clone(), dev(1, Cpu)];
        assert_eq!(pick_device(&list, None).unwrap(), 1);
        assert!(matches!(
            pick_device(&list, Some(0)),
            Err(Error::DeviceUnusable { index: 0, .. })
        ));
        let e = pick_device(&[no_compute], None).unwrap_err();
        assert!(
            e.is_unavailable() && e.to_string().contains("no queue family"),
            "{e}"
        );
        assert!(matches!(pick_device(&[], None), Err(Error::NoDevice)));
    }

    #[test]
    fn compute_family_prefers_timestamps() {
        let fam = |index, compute, bits| QueueFamilyInfo {
            index,
            queues: 1,
            compute,
            timestamp_valid_bits: bits,
            ..Default::default()
        };
        assert_eq!(
            pick_compute_family(&[fam(0, false, 64), fam(1, true, 0)]),
            Some(1)
        );
        assert_eq!(
            pick_compute_family(&[fam(0, true, 0), fam(1, true, 36)]),
            Some(1)
        );
        assert_eq!(pick_compute_family(&[fam(0, false, 64)]), None);
    }

    #[test]
    fn driver_versions() {
        assert_eq!(
            driver_version_string(0x10005, vk::make_api_version(0, 0, 0, 1)),
            "0.0.1"
        );
        // NVIDIA 535.104.5.0
        let nv = (535 << 22) | (104 << 14) | (5 << 6);
        assert_eq!(driver_version_string(0x10de, nv), "535.104.5.0");
        assert_eq!(
            uuid_string(&[
                0x6d, 0x65, 0x73, 0x61, 0x32, 0x32, 0x2e, 0x33, 0x2e, 0x36, 0, 0, 0, 0, 0, 1
            ]),
            "6d657361-3232-2e33-2e36-000000000001"
        );
    }
}
